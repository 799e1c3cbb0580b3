"""The split-KV decode preset's FlashDecoding task, with and without a spec change, side by side.

``configs/presets/mha_incdec_split_kv.toml``'s search (the program at its search shapes, its ``[search]``
limits) has one subtree that holds FlashDecoding: K's transpose, then a looped custom kernel reading Q, Kᵀ
and V (path ``(4, 22)``, the 4th task of 170 in ``fused_first`` order; with ``parallel_first``, which the
preset sets, it is split into 40 tasks ordered by their grids). This runs that subtree's tasks (``run_task``,
one process, in the spec's order, stopped by a wall-clock budget) for the preset as it is and for the preset
with ``--set`` fields changed, alternating ``--rounds`` times so both see the same load, and records per run:
complete, states, candidates, how many have stable FlashDecoding's structure (``tests/test_rediscovery.py``'s
predicate) and when the first of them was found, the best predicted times, wall time and the load average
(``os.getloadavg``) at start and end.

Usage::

    python -m benchmarks.split_kv_task --budget 300 --set parallel_first=false  # the preset vs. walk order
    python -m benchmarks.split_kv_task --whole --budget 1800                  # the whole preset search

``--whole`` runs the preset's whole search instead (with ``--set``'s changes, one worker) and records what it
returns: tasks done, candidates, the ranks of those with FlashDecoding's structure, the best predicted times.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from benchmarks.common import machine_info, progress, result_path, write_json  # noqa: E402
from gensorage.exhaustive import SearchSpec, Stats, enumerate_tasks, run_search, run_task  # noqa: E402
from gensorage.exhaustive.walk.search_context import SearchContext  # noqa: E402
from gensorage.exhaustive.walk.subtree_memo import Memo  # noqa: E402
from gensorage.superopt import load_preset  # noqa: E402
from gensorage.superopt.sources import resolve_program, search_program  # noqa: E402

NAME = "split_kv_task"
PATH = (4, 22)


def preset_spec(name: str, changes: dict[str, Any]) -> SearchSpec:
    """The preset's search spec at its search shapes, with ``changes`` applied to its ``[search]`` fields."""
    preset = load_preset(name)
    small = search_program(resolve_program(preset.program), preset, True, [])
    return SearchSpec(program=small, **{**preset.search, **changes})


def run_fd_task(spec: SearchSpec, budget_s: float) -> dict[str, Any]:
    """The FlashDecoding task's subtree (``PATH``) under ``budget_s``: one task, or with ``parallel_first`` the
    tasks it is split into, in the spec's order, one after another in this process (one subtree memo and
    context, as ``search_serial``); when the first candidate of FlashDecoding's structure was found."""
    from test_rediscovery import _stable_split_kv_and_combine

    all_tasks = enumerate_tasks(spec)
    tasks = [t for t in all_tasks if tuple(t.path[: len(PATH)]) == PATH]
    memo, context = Memo(), SearchContext(spec)
    load0 = os.getloadavg()
    t0 = time.monotonic()
    cands: list[Any] = []
    stats = Stats()
    done = 0
    first_fd: float | None = None
    for task in tasks:
        r = run_task(
            spec, task, should_stop=lambda: time.monotonic() - t0 > budget_s, memo=memo, context=context
        )
        cands.extend(r.candidates)
        stats = stats + r.stats
        if first_fd is None and any(_stable_split_kv_and_combine(c.ugraph) for c in r.candidates):
            first_fd = time.monotonic() - t0  # at the end of the task that found it
        if not r.complete:
            break
        done += 1
    wall = time.monotonic() - t0
    fd = [c for c in cands if _stable_split_kv_and_combine(c.ugraph)]
    times = [c.predicted_time_s for c in cands]
    return {
        "task": tasks[0].index,
        "tasks": len(all_tasks),
        "subtree_tasks": len(tasks),
        "subtree_tasks_done": done,
        "complete": done == len(tasks),
        "states": stats.states,
        "verified": stats.verified,
        "candidates": len(cands),
        "flash_decoding_candidates": len(fd),
        "first_flash_decoding_s": None if first_fd is None else round(first_fd, 1),
        "best_predicted_time_s": min(times, default=None),
        "best_flash_decoding_time_s": min((c.predicted_time_s for c in fd), default=None),
        "wall_s": round(wall, 1),
        "load_average": [round(load0[0], 2), round(os.getloadavg()[0], 2)],
    }


def run_whole(spec: SearchSpec, budget_s: float) -> dict[str, Any]:
    """The preset's whole search (one worker, a fresh checkpoint) under ``budget_s``: what it returns."""
    from test_rediscovery import _stable_split_kv_and_combine

    load0 = os.getloadavg()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as d:
        sr = run_search(
            spec, checkpoint=Path(d) / "ckpt.sqlite", workers=1, time_budget_s=budget_s, progress=False
        )
    fd = [i for i, c in enumerate(sr.candidates) if _stable_split_kv_and_combine(c.ugraph)]
    return {
        "complete": sr.complete,
        "tasks_done": sr.tasks_done,
        "tasks_total": sr.tasks_total,
        "candidates": len(sr.candidates),
        "flash_decoding_ranks": fd,
        "best_predicted_time_s": sr.candidates[0].predicted_time_s if sr.candidates else None,
        "best_flash_decoding_time_s": sr.candidates[fd[0]].predicted_time_s if fd else None,
        "wall_s": round(time.monotonic() - t0, 1),
        "load_average": [round(load0[0], 2), round(os.getloadavg()[0], 2)],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="mha_incdec_split_kv")
    ap.add_argument("--budget", type=float, default=300.0, help="per run (s)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--set", nargs="*", default=[], help="FIELD=JSON changes of the other side")
    ap.add_argument(
        "--whole", action="store_true", help="run the preset's whole search (the changed spec) instead"
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    machine = machine_info()  # at the start: the code that runs
    changes = {k: json.loads(v) for k, v in (kv.split("=", 1) for kv in args.set)}
    if args.whole:
        path = args.out or result_path(f"{NAME}-whole")
        whole = run_whole(preset_spec(args.preset, changes), args.budget)
        progress(f"whole search: {whole}")
        write_json(
            path,
            {
                "benchmark": f"{NAME}-whole",
                "machine": machine,
                "preset": args.preset,
                "budget_s": args.budget,
                "changed": changes,
                "search": whole,
            },
        )
        progress(f"wrote {path}")
        return 0
    sides = {"preset": preset_spec(args.preset, {}), "changed": preset_spec(args.preset, changes)}
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in sides}
    for i in range(args.rounds):
        order = list(sides) if i % 2 == 0 else list(reversed(sides))
        for side in order:
            runs[side].append(run_fd_task(sides[side], args.budget))
            progress(f"round {i + 1} {side}: {runs[side][-1]}")
    path = args.out or result_path(NAME)
    write_json(
        path,
        {
            "benchmark": NAME,
            "machine": machine,
            "preset": args.preset,
            "path": list(PATH),
            "budget_s": args.budget,
            "changed": changes,
            "runs": runs,
        },
    )
    progress(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Every bundled preset's exhaustive search under one time budget: what it finds at its search shapes.

For each preset (``configs/presets/``, the ``default`` one aside, which names another program's), the search
full mode runs — the program at the preset's search shapes, the preset's ``[search]`` limits — is run with
``run_search`` under ``--budget`` seconds (default 20) and ``--workers`` (default 1), without the choice at the
requested shapes. Recorded per preset: whether the search completed, tasks done, candidates, the best
candidate's predicted time and kernel count, its structure key, and the wall time. Run it on two versions of the
code with the same budget to see whether a change to the search (task order, limits) changed what a preset's
search finds. Writes ``benchmarks/results/preset_searches-<date>.json`` (or ``--out``) with machine, date and git
commit. Usage: ``python -m benchmarks.preset_searches [--budget S] [--presets rmsnorm mlp]``
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine_info, progress, result_path, write_json  # noqa: E402
from gensorage.exhaustive import SearchSpec, run_search  # noqa: E402
from gensorage.superopt import list_presets, load_preset  # noqa: E402
from gensorage.superopt.sources import resolve_program, search_program  # noqa: E402

NAME = "preset_searches"


def run_preset(name: str, budget_s: float, workers: int) -> dict[str, Any]:
    preset = load_preset(name)
    src = resolve_program(preset.program)
    small = search_program(src, preset, True, [])
    spec = SearchSpec(program=small, **preset.search)
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        sr = run_search(
            spec, checkpoint=Path(d) / "ckpt.sqlite", workers=workers, time_budget_s=budget_s, progress=False
        )
        wall = time.perf_counter() - t0
    best = sr.candidates[0] if sr.candidates else None
    return {
        "preset": name,
        "search_params": dict(small.params),
        "complete": sr.complete,
        "tasks_done": sr.tasks_done,
        "tasks_total": sr.tasks_total,
        "candidates": len(sr.candidates),
        "best_predicted_time_s": None if best is None else best.predicted_time_s,
        "best_kernels": None if best is None else len(best.ugraph.ops),
        "best_structure": None if best is None else best.structure_key(),
        "wall_s": wall,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="*", default=None)
    ap.add_argument("--budget", type=float, default=20.0, help="search time budget per preset (s)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    names = args.presets or [n for n in list_presets() if n != "default"]
    load_before = os.getloadavg()
    runs = []
    for name in names:
        runs.append(run_preset(name, args.budget, args.workers))
        r = runs[-1]
        progress(
            f"{name}: {r['tasks_done']}/{r['tasks_total']} tasks, {r['candidates']} candidates, "
            f"best {r['best_predicted_time_s']}, {r['wall_s']:.1f} s"
        )
    data = {
        "benchmark": NAME,
        "machine": machine_info(),
        "budget_s": args.budget,
        "workers": args.workers,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "runs": runs,
    }
    out = args.out or result_path(NAME)
    write_json(out, data)
    progress(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

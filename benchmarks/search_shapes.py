"""Full mode on small user programs without a preset: searched at shapes derived from their own.

For each program: the derived search shapes (:mod:`gensorage.superopt.search_shapes`), then
``superoptimize(mode="full")`` with the search limits derived from the program
(:mod:`gensorage.exhaustive.derived_limits`) and no time budget — unless ``--cap-s`` is given,
in which case the harness passes it as the budget so that a search that would run for hours still reports
(the JSON then says ``complete: false`` and ``stopped_by: "budget"``). Also the derived shapes of every bundled
program next to its preset's hand-made ones. Writes ``benchmarks/results/search_shapes-<date>.json`` (or
``--out``). Usage: ``python -m benchmarks.search_shapes [--programs two_matmul rms_matmul] [--cap-s S]``
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine_info, progress, result_path, write_json  # noqa: E402
from gensorage.exhaustive.derived_limits import derive_limits  # noqa: E402
from gensorage.program import Program, list_configs, load_config  # noqa: E402
from gensorage.superopt import load_preset, superoptimize  # noqa: E402
from gensorage.superopt.search_shapes import derive_search_shapes  # noqa: E402

NAME = "search_shapes"


def two_matmul() -> Program:
    """The issue's example: two chained 8x32 matmuls (over ten minutes at its own shapes before)."""
    p = Program(name="two_matmul")
    x, w1, w2 = p.input("X", (8, 32)), p.input("W1", (32, 32)), p.input("W2", (32, 32))
    p.output(p.matmul(p.matmul(x, w1), w2))
    return p


def rms_matmul() -> Program:
    """RMSNorm (with eps and its weight) followed by a projection."""
    p = Program(name="rms_matmul")
    x, g, w = p.input("X", (8, 64)), p.input("G", (64,)), p.input("W", (64, 128))
    p.output(p.matmul(p.mul(p.rms_norm(x), g), w))
    return p


def user_rmsnorm() -> Program:
    """configs/programs/rmsnorm.gsp (Mirage's Fig. 3) written with the builder: no preset is found for it."""
    p = Program(name="user_rmsnorm")
    x = p.input("X", (16, 1024), "float16")
    g, w = p.input("G", (1024,), "float16"), p.input("W", (1024, 4096), "float16")
    r = p.sqrt(p.scale(p.sum(p.mul(x, x), dim=1), 1 / 1024))
    p.output(p.matmul(p.div(p.mul(x, g), r), w))
    return p


PROGRAMS: dict[str, Callable[[], Program]] = {
    "two_matmul": two_matmul,
    "rms_matmul": rms_matmul,
    "user_rmsnorm": user_rmsnorm,
}


def bundled_comparison() -> list[dict[str, Any]]:
    rows = []
    for path in list_configs():
        p = load_config(path.stem)
        s = derive_search_shapes(p)
        rows.append(
            {
                "program": path.stem,
                "params": dict(p.params),
                "derived": {k: s.sizes[v] for k, v in p.params.items()},
                "preset": load_preset(path.stem).search_params,
                "note": s.note,
            }
        )
    return rows


def run_full(name: str, cap_s: float | None, workers: int | None) -> dict[str, Any]:
    p = PROGRAMS[name]()
    s = derive_search_shapes(p)
    progress(f"{name}: {s.note}")
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        r = superoptimize(
            p,
            mode="full",
            time_budget_s=cap_s,
            use_store=False,
            progress=True,
            workers=workers,
            checkpoint=Path(d) / "ckpt.sqlite",
        )
        wall = time.perf_counter() - t0
    stats = r.search_stats or {}
    return {
        "program": name,
        "inputs": {t.name: list(t.shape) for t in p.inputs},
        "search_inputs": {t.name: list(t.shape) for t in s.program.inputs},
        "derivation": s.note,
        "limits": derive_limits(s.program).note,
        "harness_cap_s": cap_s,
        "wall_s": wall,
        "timings_s": r.timings,
        "complete": r.complete,
        "stopped_by": r.stopped_by,
        "tasks_done": stats.get("tasks_done"),
        "tasks_total": stats.get("tasks_total"),
        "candidates": stats.get("candidates"),
        "origin": r.origin,
        "kernels": r.num_kernels,
        "naive_kernels": r.naive_num_kernels,
        "predicted_speedup": r.speedup,
        "verification": str(r.equivalence).splitlines()[0],
        "notes": r.notes,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", nargs="*", default=list(PROGRAMS), choices=list(PROGRAMS))
    ap.add_argument("--cap-s", type=float, default=None, help="harness cap, passed as the time budget")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    load_before = os.getloadavg()
    runs = [run_full(n, args.cap_s, args.workers) for n in args.programs]
    data = {
        "benchmark": NAME,
        "machine": machine_info(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "runs": runs,
        "bundled": bundled_comparison(),
    }
    out = args.out or result_path(NAME)
    write_json(out, data)
    progress(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

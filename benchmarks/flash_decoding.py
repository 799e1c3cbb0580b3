"""The whole two-kernel FlashDecoding search, timed: does the search find FlashDecoding (Fig. 4b) unaided?

``tests/test_rediscovery.py`` walks only the subtree of the split-KV first kernel (a slow test must finish in
minutes). This benchmark runs the whole search that subtree belongs to: ``mha_incdec_papers`` (Mirage's form
of attention) at the search shapes
``h=2 n=6 d=5``, two kernel operators of up to four block operators each, two grid dims, two block outputs,
Mirage's attention maps, every task, ``--workers`` processes, a fresh checkpoint. It records the wall time, the
statistics, the candidates, how many of them have FlashDecoding's structure (the test's own predicate,
``_split_kv_then_combine``, imported so the two cannot drift apart) and whether the best one does.

``--stable`` runs the stable program instead (``softmax(Q Kᵀ/√d) V`` at decode with K as models keep it and the
scale in the program, the test's ``_stable_decode``, at the same shapes): three kernel operators (K's transpose,
the split-KV kernel, the combine) of up to six block operators each, three block inputs and outputs, the test's
op set, and counts the candidates of stable FlashDecoding's structure (``_stable_split_kv_and_combine``).

Usage::

    python benchmarks/flash_decoding.py                 # 2 workers, 1800 s budget
    python benchmarks/flash_decoding.py --budget 600
    python benchmarks/flash_decoding.py --stable --workers 1 --budget 1200
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from benchmarks.common import machine_info, progress, result_path, write_json  # noqa: E402

NAME = "flash_decoding"
PARAMS = {"h": 2, "n": 6, "d": 5}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--budget", type=float, default=1800.0, help="time budget in seconds")
    ap.add_argument(
        "--out", type=Path, help="result JSON (default benchmarks/results/flash_decoding-<date>.json)"
    )
    ap.add_argument("--stable", action="store_true", help="the stable program with the scale (three kernels)")
    args = ap.parse_args(argv)

    from test_rediscovery import _split_kv_then_combine, _stable_split_kv_and_combine, stable_decode_spec

    from gensorage.exhaustive.dim_strategy import load_dim_strategy
    from gensorage.exhaustive.run import run_search, stats_to_dict
    from gensorage.exhaustive.spec import SearchSpec
    from gensorage.program import load_config

    if args.stable:
        is_fd = _stable_split_kv_and_combine
        spec = stable_decode_spec(True, load_dim_strategy("attention"))
    else:
        is_fd = _split_kv_then_combine
        spec = SearchSpec(
            program=load_config("mha_incdec_papers", PARAMS),
            max_kernel_ops=2,
            max_block_ops=4,
            max_grid_dims=2,
            max_block_outputs=2,
            dims=load_dim_strategy("attention"),
        )
    name = f"{NAME}-stable" if args.stable else NAME
    path = args.out or result_path(name)
    tmp = Path(tempfile.mkdtemp(prefix="gensorage-fd-"))
    try:
        t0 = time.perf_counter()
        r = run_search(
            spec,
            checkpoint=tmp / "ckpt.sqlite",
            workers=args.workers,
            time_budget_s=args.budget,
            progress=True,
        )
        wall = time.perf_counter() - t0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    found = [c for c in r.candidates if is_fd(c.ugraph)]
    doc: dict[str, Any] = {
        "benchmark": name,
        "machine": machine_info(),
        "settings": {
            "program": "stable_decode (scaled)" if args.stable else "mha_incdec_papers",
            "params": PARAMS,
            "workers": args.workers,
            "budget_s": args.budget,
            "spec": {k: v for k, v in spec.to_json().items() if k != "program"},
        },
        "complete": r.complete,
        "wall_s": round(wall, 3),
        "tasks_done": r.tasks_done,
        "tasks_total": r.tasks_total,
        "stats": stats_to_dict(r.stats) if r.complete else r.run_stats,
        "candidates": len(r.candidates),
        "flash_decoding_candidates": len(found),
        "best_is_flash_decoding": bool(r.candidates) and is_fd(r.candidates[0].ugraph),
        "best_predicted_time_s": r.best.predicted_time_s if r.best is not None else None,
        "first_flash_decoding": found[0].ugraph.to_text() if found else None,
    }
    write_json(path, doc)
    progress(
        f"{'complete' if r.complete else 'stopped'} in {wall:.1f} s: {len(r.candidates)} candidates, "
        f"{len(found)} with FlashDecoding's structure; wrote {path}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

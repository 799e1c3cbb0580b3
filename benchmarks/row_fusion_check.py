"""The row-fused option's check for a program too large to check at its own shapes: LLaMA-3-8B's decoder layer
(issues 24/26).

For each sequence length: the layer's Program as gensorage.torch captures it (bfloat16; no kernels built), its
derived search shapes (:mod:`gensorage.superopt.search_shapes`), the first tier's collision term there per
function symbol (Theorem 1 of docs/verification.md: ``C(m_f, 2)·d_f / p``), the cost model's prices of the
direct and the row-fused µGraph at the real shapes, and the wall and CPU time of the check
(:func:`gensorage.superopt.row_fusion.small_shape_report`: the equivalence check and the float check at the
search shapes), which runs once per program structure, at its first shape. Records the load average before and
after each check. Writes ``benchmarks/results/row_fusion_check-<date>.json`` (or ``--out``).
Usage: ``python benchmarks/row_fusion_check.py [--tokens 128 512] [--hw h200]``
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import torch  # noqa: E402
from test_torch_row_fused_decoder import captured_program  # noqa: E402

from benchmarks.common import machine_info, progress, result_path, write_json  # noqa: E402
from gensorage.hw import load_profile  # noqa: E402
from gensorage.superopt.choice import cost_fn, elements  # noqa: E402
from gensorage.superopt.row_fusion import fused_direct, small_shape_report  # noqa: E402
from gensorage.superopt.search_shapes import derive_search_shapes  # noqa: E402
from gensorage.ugraph import from_program  # noqa: E402
from gensorage.verify import mersenne  # noqa: E402
from gensorage.verify.bounds import BoundsArith  # noqa: E402
from gensorage.verify.equivalent import plan  # noqa: E402

NAME = "row_fusion_check"
LLAMA3_8B = dict(hidden=4096, heads=32, kv_heads=8, ffn=14336)


def collision_terms(small: Any, graph: Any) -> dict[str, dict[str, float]]:
    """Per symbol: applications in both sides, d_f, and its share of the collision term."""
    arith = BoundsArith(uninterpreted=True)
    for side in (small, graph):
        side.evaluate(arith, [arith.variable(t.shape) for t in small.inputs])
    return {
        f: {
            "applications": a.count,
            "d_f": a.difference_degree,
            "C": float(Fraction(a.count * (a.count - 1), 2) * a.difference_degree / mersenne.M61),
        }
        for f, a in arith.applications.items()
    }


def measure(tokens: int, hw_name: str) -> dict[str, Any]:
    p = captured_program(LLAMA3_8B, tokens, torch.bfloat16)
    hw = load_profile(hw_name)
    cost = cost_fn(hw)
    shapes = derive_search_shapes(p)
    small = shapes.program
    fused_small = fused_direct(small, "storage", hw)
    fused = fused_direct(p, "storage", hw)
    assert fused is not None and fused_small is not None
    first = plan(small, fused_small, 1e-9)
    row: dict[str, Any] = {
        "tokens": tokens,
        "nodes": len(p.nodes),
        "elements": elements(p),
        "search_shapes": shapes.note,
        "search_elements": elements(small),
        "collision": collision_terms(small, fused_small),
        "first_tier": {"required": first.required, "per_trial": first.per_trial},
        "predicted_direct_us": cost(from_program(p, "storage")) * 1e6,
        "predicted_fused_us": cost(fused) * 1e6,
        "loadavg_before": os.getloadavg(),
    }
    t0, c0 = time.perf_counter(), time.process_time()
    row["report"] = small_shape_report(p, "storage", hw, 1e-9, seed=0)
    row["check_wall_s"], row["check_cpu_s"] = time.perf_counter() - t0, time.process_time() - c0
    row["loadavg_after"] = os.getloadavg()
    progress(f"{tokens} tokens: {row['report']} in {row['check_wall_s']:.1f} s")
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", nargs="+", type=int, default=[128, 512])
    ap.add_argument("--hw", default="h200")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    rows = [measure(t, args.hw) for t in args.tokens]
    out = args.out or result_path(NAME)
    write_json(out, {"machine": machine_info(), "hw": args.hw, "rows": rows})
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

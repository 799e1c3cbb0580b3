"""The two verification tiers: how long equivalent() takes on softmax / attention pairs, before and after.

*Before* is the second tier alone (the homomorphic ``ω^x`` test, which was the only test): its trial count from
the Lax theorems and its measured time per trial, extrapolated to the count when that is out of reach. *After* is
``equivalent()`` as it runs now (the first tier decides these pairs). Cases:

* ``reorder@2x8x16``: ``exp(S)V / Σexp(S)`` against ``(exp(S)/Σexp(S))V`` with 2 heads, 8 queries, 16 keys;
* the paper µGraphs with softmax at search shapes (``benchmarks/verify.py``'s ``SEARCH_CASES``);
* 4,096 keys: decode attention (one query) with 32 heads of dim 128, with 8 KV heads (GQA, LLaMA-3-8B) and 32,
  and one prefill head (512 queries).

Writes ``benchmarks/results/verify_tiers-<date>.json`` (or ``--out``). Usage:
``python -m benchmarks.verify_tiers [--repeats 5] [--out FILE]``
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine_info, progress, result_path, write_json  # noqa: E402
from benchmarks.verify import SEARCH_CASES  # noqa: E402
from gensorage.program import Program  # noqa: E402
from gensorage.verify import FieldArith, equivalent, plan  # noqa: E402
from gensorage.verify.trials import format_count  # noqa: E402

NAME = "verify_tiers"
DELTA = 1e-9


def attention(heads: int, queries: int, keys: int, dim: int, *, reorder: bool, kv_heads: int = 0) -> Program:
    """Attention with the papers' softmax; ``reorder`` divides before multiplying by V."""
    kv = kv_heads or heads
    p = Program("attention")
    q = p.input("Q", (heads, queries, dim))
    k = p.input("K", (kv, dim, keys))
    v = p.input("V", (kv, keys, dim))
    if kv != heads:
        k, v = p.repeat(k, 0, heads // kv), p.repeat(v, 0, heads // kv)
    e = p.exp(p.scale(p.matmul(q, k), 1.0 / math.sqrt(dim)))
    s = p.sum(e, dim=2)
    p.output(p.matmul(p.div(e, s), v) if reorder else p.div(p.matmul(e, v), s))
    return p


def _second_tier_per_trial_s(a: Any, b: Any, trials: int) -> float:
    """Wall seconds per trial of the second tier's evaluation (inputs, both sides, comparison)."""
    import numpy as np

    rng = np.random.default_rng(0)
    start = time.perf_counter()
    arith = FieldArith(trials, rng)
    inputs = [arith.random_input(tuple(t.shape)) for t in a.inputs]
    for x, y in zip(a.evaluate(arith, inputs), b.evaluate(arith, inputs), strict=True):
        arith.equal(x, y)
    return (time.perf_counter() - start) / trials


def _case(a: Any, b: Any, repeats: int, before: bool) -> dict[str, Any]:
    walls = []
    r = None
    for seed in range(repeats):
        start = time.perf_counter()
        r = equivalent(a, b, DELTA, seed=seed)
        walls.append(time.perf_counter() - start)
    assert r is not None
    out: dict[str, Any] = {
        "after": {
            "equivalent": bool(r),
            "tier": r.tier,
            "method": r.method,
            "trials": r.trials,
            "required_trials": r.required_trials,
            "achieved_delta": r.achieved_delta,
            "notes": list(r.notes),
            "wall_ms_median": statistics.median(walls) * 1e3,
            "wall_ms_min": min(walls) * 1e3,
            "repeats": repeats,
        }
    }
    if before:
        tp = plan(a, b, DELTA, tier=2)
        per = _second_tier_per_trial_s(a, b, 8)
        out["before"] = {
            "method": tp.method,
            "k": format_count(tp.k),
            "required_trials": format_count(tp.required),
            "wall_s_per_trial": per,
            "wall_s_extrapolated": per * tp.required,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--out", type=Path, help="results file (default benchmarks/results/verify_tiers-<date>.json)"
    )
    args = ap.parse_args(argv)
    out: dict[str, Any] = {
        "benchmark": NAME,
        "machine": machine_info(),
        "delta": DELTA,
        "load_average_start": os.getloadavg(),
        "cases": {},
    }
    cases: dict[str, tuple[Any, Any, int, bool]] = {
        "reorder@2x8x16": (
            attention(2, 8, 16, 16, reorder=False),
            attention(2, 8, 16, 16, reorder=True),
            args.repeats,
            True,
        ),
    }
    for name in ("flash_attention@search", "flash_decoding@search", "gqa@search", "qknorm_attention@search"):
        prog, graph = SEARCH_CASES[name]()
        cases[name] = (prog, graph, args.repeats, True)
    real = {
        "decode@32h-4096k-d128": dict(heads=32, queries=1, keys=4096, dim=128),
        "decode-gqa@32h-8kv-4096k-d128": dict(heads=32, queries=1, keys=4096, dim=128, kv_heads=8),
        "prefill@1h-512q-4096k-d128": dict(heads=1, queries=512, keys=4096, dim=128),
    }
    for name, kw in real.items():
        cases[name] = (attention(**kw, reorder=False), attention(**kw, reorder=True), args.repeats, False)  # type: ignore[arg-type]
    for name, (a, b, repeats, before) in cases.items():
        progress(f"{name} ...")
        out["cases"][name] = res = _case(a, b, repeats, before)
        after = res["after"]
        progress(
            f"{name}: tier {after['tier']}, {after['trials']} trial(s), δ ≤ {after['achieved_delta']:.2g}, "
            f"{after['wall_ms_median']:.1f} ms median"
            + (f"; before: {res['before']['required_trials']} trials" if before else "")
        )
    out["load_average_end"] = os.getloadavg()
    path = args.out or result_path(NAME)
    write_json(path, out)
    progress(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Cost of the probabilistic equivalence check, and how reliably it rejects near misses.

Three parts, all written to ``benchmarks/results/verify-<date>.json``:

* ``search_shapes``: the paper µGraphs of :mod:`gensorage.ugraph.examples` against their programs, at the
  examples' default shapes (dims 1-24) and at search shapes with dims 8-64. Per case: the trial plan (method,
  k, both theorems' counts, the required count at δ = 1e-9), the time of a one-trial check (what Mirage's
  search does), the time of the full theorem-count check when it fits the time budget (otherwise the measured
  time per trial and the extrapolated total), and the median time to reject a mutant.
* ``paper_shapes``: every bundled program config at its default (paper) shapes against its direct µGraph
  (:func:`gensorage.ugraph.from_program`): the plan, and, where one trial fits the memory limit, the measured
  time per trial and the full check (Schwartz–Zippel programs need 1-2 trials) or the extrapolated time.
* ``mutants``: at least ``--mutants`` distinct valid mutants (:mod:`gensorage.verify.mutate`) of the example
  µGraphs; those computing a different float64 function must all be rejected. Rejection rate, trials needed
  to reject, time per rejection, by mutation kind.

Usage: ``python -m benchmarks.verify [--quick] [--mutants 1200] [--budget-s 30] [--max-elements 6e7]``
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine_info, progress, result_path, write_json  # noqa: E402
from gensorage.errors import GensorageError, NotLaxError  # noqa: E402
from gensorage.program import Program, list_configs, load_config  # noqa: E402
from gensorage.ugraph import KernelGraph, from_program  # noqa: E402
from gensorage.ugraph import examples as ex  # noqa: E402
from gensorage.verify import equivalent, plan  # noqa: E402
from gensorage.verify.bounds import BoundsArith  # noqa: E402
from gensorage.verify.mutate import MUTATIONS, differs_numerically, mutate  # noqa: E402
from gensorage.verify.trials import TrialPlan, format_count  # noqa: E402

NAME = "verify"
DELTA = 1e-9
Case = Callable[[], tuple[Program, KernelGraph]]

# Search shapes: dims 8-64 (partitions chosen to divide them).
SEARCH_CASES: dict[str, Case] = {
    "rmsnorm_matmul@search": lambda: ex.rmsnorm_matmul(batch=8, hidden=64, out=64, blocks=4, forloop=4),
    "lora@search": lambda: ex.lora(m=16, k=64, n=64, rank=8, n_blocks=4, m_blocks=2),
    "gated_mlp@search": lambda: ex.gated_mlp(m=8, k=64, n=64, blocks=4, forloop=4),
    "flash_attention@search": lambda: ex.flash_attention(
        heads=2, q_len=16, kv_len=32, head_dim=16, q_blocks=2, forloop=2
    ),
    "flash_decoding@search": lambda: ex.flash_decoding(heads=4, kv_len=64, head_dim=16, splits=4, forloop=2),
    "gqa@search": lambda: ex.gqa(
        kv_heads=2, group=4, q_len=1, kv_len=64, head_dim=16, kv_splits=4, forloop=2, out_splits=2
    ),
    "qknorm_attention@search": lambda: ex.qknorm_attention(
        heads=2, q_len=16, kv_len=32, head_dim=16, q_blocks=2, forloop=2
    ),
}


def layout_case() -> tuple[Program, KernelGraph]:
    """A direct µGraph whose concat dim and repeat factor can change without breaking shapes."""
    p = Program("layout")
    x, y = p.input("X", (4, 4)), p.input("Y", (4, 4))
    w = p.input("W", (8, 3))
    z = p.reshape(p.concat([x, y], 0), (4, 8))
    p.output(p.add(p.matmul(z, w), p.sum(p.repeat(x, 1, 2), dim=1)))
    return p, from_program(p)


MUTANT_CASES: dict[str, Case] = {
    **{f"{name}@default": f for name, f in ex.EXAMPLES.items()},
    "flash_attention_loop2@default": lambda: ex.flash_attention(forloop=2),
    "flash_decoding_gqa@default": lambda: ex.flash_decoding(group=2),
    "layout": layout_case,
    # other partitions of the same examples: different grids / loops give different mutants
    "rmsnorm_matmul@b2f2": lambda: ex.rmsnorm_matmul(blocks=2, forloop=2),
    "rmsnorm_matmul@b4f8": lambda: ex.rmsnorm_matmul(batch=8, hidden=32, out=16, blocks=4, forloop=8),
    "gqa@s4f3": lambda: ex.gqa(kv_splits=4, forloop=3, out_splits=4),
    "lora@n2m4": lambda: ex.lora(n_blocks=2, m_blocks=4),
    "gated_mlp@b2f2": lambda: ex.gated_mlp(blocks=2, forloop=2),
    "flash_attention@q4f2": lambda: ex.flash_attention(q_blocks=4, forloop=2),
    "flash_decoding@s2f3": lambda: ex.flash_decoding(splits=2, forloop=3),
    "flash_decoding_gqa4@default": lambda: ex.flash_decoding(group=4),
    "qknorm_attention@q1f2": lambda: ex.qknorm_attention(q_blocks=1, forloop=2),
    **SEARCH_CASES,
}


def _timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """(result, wall seconds, CPU seconds of this process)."""
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def _plan_json(tp: TrialPlan) -> dict[str, Any]:
    def num(x: int | None) -> int | str | None:
        return x if x is None or x < 1 << 63 else format_count(x)

    return {
        "method": tp.method,
        "k": num(tp.k),
        "degree": tp.degree,
        "required_trials": num(tp.required),
        "trials_first_paper": num(tp.trials_first_paper),
        "trials_later_paper": num(tp.trials_later_paper),
        "per_trial_bound": tp.per_trial,
        "notes": list(tp.notes),
    }


def _one_trial(prog: Any, graph: Any, seed: int) -> Any:
    return equivalent(prog, graph, DELTA, seed=seed, max_trials=1)


def _median_ms(fn: Callable[[int], Any], repeats: int) -> dict[str, float]:
    walls, cpus = [], []
    for i in range(repeats):
        _, w, c = _timed(partial(fn, i))
        walls.append(w * 1e3)
        cpus.append(c * 1e3)
    return {
        "wall_ms_median": statistics.median(walls),
        "cpu_ms_median": statistics.median(cpus),
        "wall_ms_min": min(walls),
        "repeats": repeats,
    }


def _full_or_extrapolated(prog: Any, graph: Any, tp: TrialPlan, budget_s: float) -> dict[str, Any]:
    """Run the full theorem count if it fits ``budget_s``; else measure a sample and extrapolate."""
    sample = min(tp.required, 512)
    r, w, c = _timed(partial(equivalent, prog, graph, DELTA, seed=1, max_trials=sample))
    per_trial_ms = w * 1e3 / max(r.trials, 1)
    predicted_s = per_trial_ms * tp.required / 1e3
    out: dict[str, Any] = {
        "sample_trials": r.trials,
        "sample_wall_ms": w * 1e3,
        "sample_cpu_ms": c * 1e3,
        "ms_per_trial": per_trial_ms,
        "sample_equivalent": r.equivalent,
    }
    if tp.required <= sample:
        out.update(
            full_run=True,
            full_wall_ms=w * 1e3,
            full_cpu_ms=c * 1e3,
            full_equivalent=r.equivalent,
            achieved_delta=r.achieved_delta,
        )
    elif predicted_s <= budget_s:
        r, w, c = _timed(partial(equivalent, prog, graph, DELTA, seed=2))
        out.update(
            full_run=True,
            full_wall_ms=w * 1e3,
            full_cpu_ms=c * 1e3,
            full_equivalent=r.equivalent,
            full_trials=r.trials,
            achieved_delta=r.achieved_delta,
        )
    else:
        out.update(
            full_run=False,
            extrapolated_full_s=predicted_s,
            extrapolated_full_years=predicted_s / (365.25 * 86400),
        )
    return out


def _reject_times(prog: Any, graph: KernelGraph, count: int) -> dict[str, Any]:
    rng = random.Random(7)
    times: list[float] = []
    tries = 0
    while len(times) < count and tries < 50 * count:
        tries += 1
        m = mutate(graph, rng)
        if m is None or not differs_numerically(graph, m.graph):
            continue
        try:
            r, w, _ = _timed(partial(equivalent, prog, m.graph, DELTA, seed=3, max_trials=4096))
        except NotLaxError:
            continue
        if not r.equivalent:
            times.append(w * 1e3)
    return {"mutants_timed": len(times), "reject_wall_ms_median": statistics.median(times) if times else None}


def search_shapes(quick: bool, budget_s: float) -> list[dict[str, Any]]:
    cases: dict[str, Case] = {f"{n}@default": f for n, f in ex.EXAMPLES.items()}
    cases.update(SEARCH_CASES)
    rows = []
    for name, make in cases.items():
        progress(f"[search] {name}")
        try:
            prog, graph = make()
            graph.validate()
            tp = plan(prog, graph, DELTA)
        except GensorageError as exc:
            rows.append({"case": name, "error": str(exc)})
            continue
        dims = sorted({d for t in prog.inputs for d in t.shape})
        row: dict[str, Any] = {
            "case": name,
            "input_shapes": [list(t.shape) for t in prog.inputs],
            "dims": [dims[0], dims[-1]],
            "plan": _plan_json(tp),
        }
        row["one_trial_check"] = _median_ms(partial(_one_trial, prog, graph), 3 if quick else 7)
        row["theorem_count_check"] = _full_or_extrapolated(prog, graph, tp, budget_s / (4 if quick else 1))
        row["mutant_rejection"] = _reject_times(prog, graph, 3 if quick else 8)
        rows.append(row)
    return rows


def paper_shapes(max_elements: float, quick: bool) -> list[dict[str, Any]]:
    rows = []
    for path in list_configs():
        name = path.stem
        progress(f"[paper] {name}")
        prog = load_config(name)
        graph = from_program(prog)
        arith = BoundsArith()
        prog.evaluate(arith, [arith.variable(t.shape) for t in prog.inputs])
        tp = plan(prog, graph, DELTA)
        row: dict[str, Any] = {
            "config": name,
            "params": dict(prog.params),
            "input_shapes": [list(t.shape) for t in prog.inputs],
            "elements_per_trial_per_side": arith.total_numel,
            "plan": _plan_json(tp),
        }
        if arith.total_numel > max_elements or (quick and arith.total_numel > max_elements / 8):
            row["run"] = (
                f"not run: {arith.total_numel:.3g} elements per trial and side exceed the benchmark's "
                f"limit of {max_elements:.3g}"
            )
            rows.append(row)
            continue
        r, w, c = _timed(partial(equivalent, prog, graph, DELTA, seed=0, max_trials=1, batch=1))
        row.update(one_trial_wall_ms=w * 1e3, one_trial_cpu_ms=c * 1e3, one_trial_equivalent=r.equivalent)
        if tp.required <= 2:
            r, w, c = _timed(partial(equivalent, prog, graph, DELTA, seed=1, batch=1))
            row.update(
                full_run=True,
                full_trials=r.trials,
                full_wall_ms=w * 1e3,
                full_cpu_ms=c * 1e3,
                full_equivalent=r.equivalent,
                achieved_delta=r.achieved_delta,
            )
        else:
            seconds = row["one_trial_wall_ms"] / 1e3 * tp.required
            row.update(
                full_run=False, extrapolated_full_s=seconds, extrapolated_full_years=seconds / 31557600
            )
        rows.append(row)
    return rows


def mutant_study(target: int, seed: int, attempts_per_kind: int = 150) -> dict[str, Any]:
    rng = random.Random(seed)
    made = {name: make() for name, make in MUTANT_CASES.items()}
    seen: set[KernelGraph] = set()
    pool: list[tuple[str, str, KernelGraph]] = []
    attempts = 0
    for case in sorted(made):
        for kind in sorted(MUTATIONS):
            for _ in range(attempts_per_kind):
                attempts += 1
                m = mutate(made[case][1], rng, kind)
                if m is None or m.graph in seen:
                    continue
                seen.add(m.graph)
                pool.append((case, m.kind, m.graph))
        if len(pool) >= target:
            break
    progress(f"[mutants] {len(pool)} distinct valid mutants from {attempts} attempts")
    by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    reject_trials: Counter[int] = Counter()
    times: list[float] = []
    accepted: list[dict[str, str]] = []
    for i, (case, kind, graph) in enumerate(pool):
        prog, original = made[case]
        if not differs_numerically(original, graph):
            by_kind[kind]["same_function_excluded"] += 1
            continue
        try:
            r, w, _ = _timed(partial(equivalent, prog, graph, DELTA, seed=i, max_trials=4096))
        except NotLaxError:
            by_kind[kind]["refused_not_lax"] += 1
            continue
        if r.equivalent:
            by_kind[kind]["ACCEPTED"] += 1
            accepted.append({"case": case, "kind": kind})
        else:
            by_kind[kind]["rejected"] += 1
            reject_trials[r.trials] += 1
            times.append(w * 1e3)
    different = sum(c["rejected"] + c["ACCEPTED"] + c["refused_not_lax"] for c in by_kind.values())
    by_shape = reject_trials.get(0, 0)
    refused = sum(c["rejected"] + c["refused_not_lax"] for c in by_kind.values())
    return {
        "distinct_valid_mutants": len(pool),
        "generation_attempts": attempts,
        "numerically_different": different,
        "same_function_excluded": sum(c["same_function_excluded"] for c in by_kind.values()),
        "rejected_or_refused": refused,
        "rejection_rate": refused / different if different else None,
        "accepted": accepted,
        "rejected_by_output_shape": by_shape,
        "rejected_by_a_trial": refused - by_shape - sum(c["refused_not_lax"] for c in by_kind.values()),
        "trials_to_reject": {str(k): v for k, v in sorted(reject_trials.items())},
        "reject_wall_ms_median": statistics.median(times) if times else None,
        "reject_wall_ms_p95": sorted(times)[int(0.95 * (len(times) - 1))] if times else None,
        "by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
        "max_trials_cap": 4096,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats, smaller budgets (smoke run)")
    ap.add_argument(
        "--mutants", type=int, default=1200, help="distinct valid mutants to generate (default 1200)"
    )
    ap.add_argument(
        "--budget-s", type=float, default=30.0, help="longest full theorem-count check to run (s)"
    )
    ap.add_argument(
        "--max-elements",
        type=float,
        default=6e7,
        help="paper shapes: skip configs holding more elements per trial and side",
    )
    ap.add_argument("--skip-paper", action="store_true", help="skip the paper-shape part")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    started = time.perf_counter()
    out: dict[str, Any] = {
        "benchmark": NAME,
        "machine": machine_info(),
        "delta": DELTA,
        "args": vars(args),
        "load_average_start": list(os.getloadavg()),
    }
    out["search_shapes"] = search_shapes(args.quick, args.budget_s)
    out["mutants"] = mutant_study(args.mutants if not args.quick else min(args.mutants, 200), args.seed)
    out["paper_shapes"] = [] if args.skip_paper else paper_shapes(args.max_elements, args.quick)
    out["load_average_end"] = list(os.getloadavg())
    one_trial = [
        r["one_trial_check"]["wall_ms_median"] for r in out["search_shapes"] if "one_trial_check" in r
    ]
    one_cpu = [r["one_trial_check"]["cpu_ms_median"] for r in out["search_shapes"] if "one_trial_check" in r]
    full = [
        r["theorem_count_check"].get("full_wall_ms")
        for r in out["search_shapes"]
        if "theorem_count_check" in r
    ]
    mut = out["mutants"]
    out["summary"] = {
        "search_one_trial_ms_max": max(one_trial) if one_trial else None,
        "search_one_trial_ms_median": statistics.median(one_trial) if one_trial else None,
        "search_full_count_ms": {
            r["case"]: r["theorem_count_check"].get("full_wall_ms")
            for r in out["search_shapes"]
            if "theorem_count_check" in r
        },
        "search_full_count_runs": sum(1 for f in full if f is not None),
        "search_one_trial_cpu_ms_max": max(one_cpu) if one_cpu else None,
        "search_one_trial_cpu_ms_median": statistics.median(one_cpu) if one_cpu else None,
        "goal_10ms_one_trial_met_wall": bool(one_trial) and max(one_trial) <= 10.0,
        "goal_10ms_one_trial_met_cpu": bool(one_cpu) and max(one_cpu) <= 10.0,
        "mutant_rejection_rate": mut["rejection_rate"],
        "mutants_numerically_different": mut["numerically_different"],
        "goal_mutants_met": mut["numerically_different"] >= 1000 and mut["rejection_rate"] == 1.0,
        "benchmark_wall_s": time.perf_counter() - started,
    }
    path = result_path(NAME)
    write_json(path, out)
    progress(f"wrote {path}")
    s = out["summary"]
    print(
        f"one-trial check at search shapes: median {s['search_one_trial_ms_median']:.2f} ms wall "
        f"({s['search_one_trial_cpu_ms_median']:.2f} ms CPU), max {s['search_one_trial_ms_max']:.2f} ms wall "
        f"({s['search_one_trial_cpu_ms_max']:.2f} ms CPU); load average {out['load_average_end']}"
    )
    print(
        f"mutants: {mut['rejected_or_refused']}/{mut['numerically_different']} different mutants rejected "
        f"({mut['same_function_excluded']} same-function excluded), median {mut['reject_wall_ms_median']:.2f} ms"
    )
    for r in out["search_shapes"]:
        if "plan" in r:
            tc = r["theorem_count_check"]
            full_text = (
                f"full {tc['full_wall_ms']:.1f} ms"
                if tc.get("full_run")
                else f"extrapolated {tc['extrapolated_full_s']:.3g} s"
            )
            one = r["one_trial_check"]
            print(
                f"  {r['case']:<28} {r['plan']['method']:<16} required {r['plan']['required_trials']}: "
                f"1-trial {one['wall_ms_median']:.2f} ms ({one['cpu_ms_median']:.2f} CPU), "
                f"{tc['ms_per_trial']:.3f} ms/trial, {full_text}"
            )
    for r in out["paper_shapes"]:
        if "one_trial_wall_ms" in r:
            extra = (
                f"full {r['full_wall_ms'] / 1e3:.2f} s"
                if r.get("full_run")
                else f"extrapolated {r['extrapolated_full_s']:.3g} s"
            )
            print(
                f"  paper {r['config']:<12} required {r['plan']['required_trials']}: "
                f"1 trial {r['one_trial_wall_ms'] / 1e3:.2f} s ({r['one_trial_cpu_ms'] / 1e3:.2f} s CPU), {extra}"
            )
        else:
            print(f"  paper {r['config']:<12} required {r['plan']['required_trials']}: {r.get('run')}")
    return 0 if math.isfinite(s["benchmark_wall_s"]) else 1


if __name__ == "__main__":
    sys.exit(main())

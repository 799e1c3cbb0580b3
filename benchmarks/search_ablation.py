"""Table-5-style search-time ablation for GQA: block-op limit × abstract-expression pruning × canonical form.

Mirage (paper 000, §7.4, Table 5) reports the time to search GQA's µGraphs as the maximum number of operators in
a block graph grows from 4 to 7, for Mirage, without abstract-expression pruning, and without canonical form
as well (the columns disable the techniques incrementally). This benchmark runs the same grid with gensorage's
exhaustive search (:func:`gensorage.exhaustive.run.runner.run_search`, a fresh checkpoint per run, ``--workers``
processes) and records for each configuration the wall time, the states visited and pruned, the solver queries
and cache hits, the candidates found, and the ratio to Mirage's time. A configuration that does not finish
within ``--cap`` seconds is recorded as "timeout after X s" with the work done so far, and larger limits of the
same variant are skipped (recorded as skipped, never estimated).

Counting block operators: Mirage's limit (``MAX_NUM_THREADBLOCK_GRAPH_OP``, "outputs not counted") counts a
block graph's input iterators, compute operators and for-loop accumulators. ``--count nodes`` (the default)
counts the same way (``SearchSpec.max_block_nodes``), so a row of this benchmark searches the space of the same
row of Table 5; ``--count ops`` limits compute operators only (``max_block_ops``), a much larger space.

The goal the issue sets: the full search (pruning + canonical form) takes at most 1/10 of Mirage's Table 5 time
(9 s, 2.3 min, 20 min, 76 min at 4/5/6/7 block ops) on a 2-core machine.

The space: Mirage does not search every map. Its generator explores fixed lists of imaps, omaps and fmaps,
and its "attention" lists are the space of Table 5's GQA searches. ``--dims attention`` (the default) restricts
the search to those lists (``configs/dims/attention.toml``, :mod:`gensorage.exhaustive.dim_strategy`), so the
rows compare the same space; ``--dims none`` searches every map (a much larger space; its results are written
to ``search_ablation-<date>.json``, the others to ``search_ablation-<dims>-<date>.json``).

Search shapes: the search runs on a *search-size* instance of the bundled ``gqa_incdec_papers`` program,
Mirage's form of GQA (Mirage too
searches and verifies on small instances; a µGraph found there is re-instantiated at full size). The default
``--param`` values below keep GQA's structure — repeat of K and V to the query heads, QKᵀ, exp, sum, div, ·V —
with small dims: ``b=1 kv=2 g=2 s=1 n=16 d=8``. ``kv=2`` is the program's own value (one GPU's share of
LLaMA-2-70B's key/value heads, Mirage §7.3); with ``kv=1`` the key/value head axis has size 1, the space is far smaller and the search finds no candidate at 4 to 7 block nodes.
Larger dims give more divisors, hence more grid and for-loop choices per block graph.

The space can be narrowed with ``--no-replicated-writes`` (``SearchSpec(replicated_writes=False)``): no block
graph but the last writes copies it has not lined up with an input axis. That is not exact (it drops some
correct µGraphs; ``docs/search.md``, "Restrictions of the space"), so the JSON records the setting and the two
spaces are reported apart.

Usage::

    python benchmarks/search_ablation.py                       # defaults: limits 4..7, cap 600 s, 2 workers
    python benchmarks/search_ablation.py --max-block-ops-list 4,5 --cap 120
    python benchmarks/search_ablation.py --no-replicated-writes --out benchmarks/results/narrow.json
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine_info, progress, result_path, write_json  # noqa: E402

NAME = "search_ablation"
DEFAULT_PARAMS = {"b": 1, "kv": 2, "g": 2, "s": 1, "n": 16, "d": 8}

# Mirage Table 5 (GQA search time): (seconds, relation, the paper's text); relation "=" a measured time,
# "<" / ">" a bound.
MIRAGE_TABLE5: dict[int, dict[str, tuple[float, str, str]]] = {
    4: {
        "mirage": (9.0, "=", "9 sec"),
        "no_expr": (1.0, "<", "<1 sec"),
        "no_expr_no_canonical": (1.0, "<", "<1 sec"),
    },
    5: {
        "mirage": (2.3 * 60, "=", "2.3 min"),
        "no_expr": (249 * 60.0, "=", "249 min"),
        "no_expr_no_canonical": (12 * 3600.0, ">", "> 12h"),
    },
    6: {
        "mirage": (20 * 60.0, "=", "20 min"),
        "no_expr": (12 * 3600.0, ">", "> 12h"),
        "no_expr_no_canonical": (12 * 3600.0, ">", "> 12h"),
    },
    7: {
        "mirage": (76 * 60.0, "=", "76 min"),
        "no_expr": (12 * 3600.0, ">", "> 12h"),
        "no_expr_no_canonical": (12 * 3600.0, ">", "> 12h"),
    },
}
# Variant name -> (prune, canonical). The first three are Table 5's columns; the last is the missing corner.
VARIANTS: dict[str, tuple[bool, bool]] = {
    "mirage": (True, True),
    "no_expr": (False, True),
    "no_expr_no_canonical": (False, False),
    "no_canonical": (True, False),
}
GOAL_FRACTION = 0.1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--program", default="gqa_incdec_papers", help="bundled program config or .gsp file")
    ap.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help=f"program param override (default {DEFAULT_PARAMS})",
    )
    ap.add_argument("--hw", default="h100")
    ap.add_argument("--max-block-ops-list", default="4,5,6,7", help="comma-separated block-op limits")
    ap.add_argument(
        "--count",
        choices=("nodes", "ops"),
        default="nodes",
        help="what the limit counts: iterators + operators + accumulators as Mirage does (nodes, "
        "default) or compute operators only (ops)",
    )
    ap.add_argument("--max-kernel-ops", type=int, help="kernel-op limit (default: the spec's default)")
    ap.add_argument(
        "--dims",
        default="attention",
        help="dim strategy (configs/dims/), 'none' for every map (default attention: Mirage's "
        "attention config, the space of its Table 5)",
    )
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"subset of {','.join(VARIANTS)}")
    ap.add_argument("--schedule", default="markov", choices=("markov", "enumerate"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2, help="worker processes (default 2: the goal's machine)")
    ap.add_argument("--cap", type=float, default=600.0, help="per-configuration time cap in seconds")
    ap.add_argument(
        "--out", type=Path, help="result JSON (default benchmarks/results/search_ablation-<date>.json)"
    )
    ap.add_argument("--progress", action="store_true", help="live search progress on stderr")
    ap.add_argument(
        "--no-replicated-writes",
        action="store_true",
        help="SearchSpec(replicated_writes=False): a narrower space, not exact (docs/search.md)",
    )
    return ap.parse_args(argv)


def reference(limit: int, variant: str) -> dict[str, Any] | None:
    """Mirage's Table 5 entry for this block-op limit and variant (None where the table has none)."""
    ref = MIRAGE_TABLE5.get(limit, {}).get(variant)
    if ref is None:
        return None
    seconds, rel, text = ref
    return {"seconds": seconds, "relation": rel, "text": text}


def run_one(spec: Any, cap: float, workers: int, show_progress: bool) -> dict[str, Any]:
    """One search from scratch (fresh checkpoint in a temp dir) under the time cap."""
    from gensorage.exhaustive.run import run_search, stats_to_dict

    tmp = Path(tempfile.mkdtemp(prefix="gensorage-ablation-"))
    try:
        t0 = time.perf_counter()
        r = run_search(
            spec, checkpoint=tmp / "ckpt.sqlite", workers=workers, time_budget_s=cap, progress=show_progress
        )
        wall = time.perf_counter() - t0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out: dict[str, Any] = {
        "complete": r.complete,
        "wall_s": round(wall, 3),
        "enumerate_s": round(r.enumerate_s, 3),  # part of wall_s: splitting the search into tasks
        "tasks_done": r.tasks_done,
        "tasks_total": r.tasks_total,
        # The work this run did, finished tasks and (on a timeout) the stopped ones up to the cap.
        "stats": r.run_stats if not r.complete else stats_to_dict(r.stats),
        "candidates": len(r.candidates),
        "best_predicted_time_s": r.best.predicted_time_s if r.best is not None else None,
    }
    if not r.complete:
        out["status"] = f"timeout after {cap:g} s"
    else:
        out["status"] = "complete"
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from gensorage.cli.program import load_source, parse_params
    from gensorage.exhaustive.dim_strategy import load_dim_strategy
    from gensorage.exhaustive.spec import SearchSpec

    params = (
        {**DEFAULT_PARAMS, **parse_params(args.param)}
        if args.program == "gqa_incdec_papers"
        else parse_params(args.param)
    )
    program = load_source(args.program, params)
    limits = [int(x) for x in args.max_block_ops_list.split(",") if x.strip()]
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; known: {list(VARIANTS)}")
    dims = None if args.dims == "none" else load_dim_strategy(args.dims)
    path = args.out or result_path(NAME if args.dims == "none" else f"{NAME}-{args.dims}")
    doc: dict[str, Any] = {
        "benchmark": NAME,
        "machine": machine_info(),
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "settings": {
            "program": args.program,
            "params": params,
            "hw": args.hw,
            "max_block_ops": limits,
            "count": args.count,
            "max_kernel_ops": args.max_kernel_ops,
            "dims": args.dims,
            "schedule": args.schedule,
            "seed": args.seed,
            "replicated_writes": not args.no_replicated_writes,
            "workers": args.workers,
            "cap_s": args.cap,
            "variants": {v: dict(zip(("prune", "canonical"), VARIANTS[v], strict=True)) for v in variants},
        },
        "mirage_table5": {str(k): {v: reference(k, v) for v in MIRAGE_TABLE5[k]} for k in MIRAGE_TABLE5},
        "goal": f"full search time <= {GOAL_FRACTION:g} x Mirage Table 5 on a 2-core machine",
        "runs": [],
    }
    write_json(path, doc)
    timed_out: dict[str, int] = {}
    for limit in limits:
        for variant in variants:
            prune, canonical = VARIANTS[variant]
            row: dict[str, Any] = {
                "max_block_ops": limit,
                "variant": variant,
                "prune": prune,
                "canonical": canonical,
                "mirage": reference(limit, variant),
            }
            if variant in timed_out:
                row["status"] = (
                    f"skipped: timed out at max_block_ops={timed_out[variant]} within {args.cap:g} s"
                )
            else:
                extra: dict[str, Any] = {"max_kernel_ops": args.max_kernel_ops} if args.max_kernel_ops else {}
                if args.count == "nodes":
                    extra["max_block_nodes"] = limit
                spec = SearchSpec(
                    program=program,
                    hw=args.hw,
                    max_block_ops=limit,
                    prune=prune,
                    canonical=canonical,
                    schedule=args.schedule,
                    seed=args.seed,
                    dims=dims,
                    replicated_writes=not args.no_replicated_writes,
                    **extra,
                )
                row["spec_key"] = spec.key()
                row["spec"] = {k: v for k, v in spec.to_json().items() if k != "program"}
                row.update(run_one(spec, args.cap, args.workers, args.progress))
                if not row["complete"]:
                    timed_out[variant] = limit
                _compare(row)
            doc["runs"].append(row)
            doc["goal_summary"] = _goal_summary(doc["runs"])
            write_json(path, doc)
            progress(_summary_line(row))
    progress(f"wrote {path}")
    return 0


def _compare(row: dict[str, Any]) -> None:
    """Ratio to Mirage's time where Mirage's is a measured number, and the goal verdict for the full search."""
    ref = row.get("mirage")
    if ref is None or ref["relation"] != "=":
        return
    if row["complete"]:
        row["ratio_to_mirage"] = round(row["wall_s"] / ref["seconds"], 5)
    if row["variant"] == "mirage":
        goal = GOAL_FRACTION * ref["seconds"]
        row["goal_s"] = goal
        if row["complete"]:
            row["goal_met"] = row["wall_s"] <= goal
        else:
            # A timeout under a cap below the goal says nothing about the goal.
            row["goal_met"] = False if row["wall_s"] >= goal else None


def _goal_summary(runs: list[dict[str, Any]]) -> dict[str, str]:
    """Per block-op limit, the goal verdict of the full search in words."""
    out: dict[str, str] = {}
    for row in runs:
        if row["variant"] != "mirage" or row.get("mirage") is None:
            continue
        goal = GOAL_FRACTION * row["mirage"]["seconds"]
        if "wall_s" not in row:
            verdict = f"not run ({row['status']})"
        elif row["complete"]:
            verdict = (
                f"{'met' if row['wall_s'] <= goal else 'not met'}: {row['wall_s']:.3g} s against a goal of "
                f"{goal:.3g} s (Mirage {row['mirage']['text']})"
            )
        elif row["wall_s"] >= goal:
            verdict = f"not met: {row['status']} (goal {goal:.3g} s, Mirage {row['mirage']['text']})"
        else:
            verdict = f"unknown: {row['status']}, below the goal of {goal:.3g} s"
        out[str(row["max_block_ops"])] = verdict
    return out


def _summary_line(row: dict[str, Any]) -> str:
    head = f"max_block_ops={row['max_block_ops']} {row['variant']:<22}"
    if "wall_s" not in row:
        return f"{head} {row['status']}"
    st = row.get("stats", {})
    pruned = sum(int(st.get(k, 0)) for k in ("pruned_expr", "pruned_shape", "pruned_memory"))
    ratio = f" ratio {row['ratio_to_mirage']:.4g}" if "ratio_to_mirage" in row else ""
    ref = f" (Mirage {row['mirage']['text']})" if row.get("mirage") else ""
    return (
        f"{head} {row['status']:<22} {row['wall_s']:9.2f} s{ref}{ratio}  states {st.get('states', 0)} "
        f"pruned {pruned} solver {st.get('solver_queries', 0)} hits {st.get('cache_hits', 0)} "
        f"candidates {row['candidates']}"
    )


if __name__ == "__main__":
    sys.exit(main())

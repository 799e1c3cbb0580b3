"""``gensorage search``: exhaustive µGraph search for a tensor program, resumable, on all local cores.

Examples::

    gensorage search gqa_incdec --param n=64 --param d=16 --max-block-ops 5
    gensorage search my_prog.gsp --hw a100 --workers 2 --time-budget 3600 --checkpoint run.sqlite
    gensorage search rmsnorm --no-prune --no-canonical --json --top 3

The best µGraph (text form) and a summary go to stdout, live progress to stderr. Work is committed to a
checkpoint after every finished task; running the same command again resumes it. Exit codes: 0 found (search
complete), 1 nothing found or the time budget ran out first, 130 interrupted, other codes for bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gensorage.cli.argtypes import seed
from gensorage.errors import ConfigError

EXIT_NOT_FOUND = 1
EXIT_INTERRUPTED = 130
SCHEDULES = ("markov", "enumerate")
# Optional arguments passed to SearchSpec under the same name when given (the spec's defaults otherwise).
LIMIT_ARGS = (
    "max_kernel_ops",
    "min_kernel_ops",
    "max_block_ops",
    "max_block_nodes",
    "max_block_graphs",
    "max_block_inputs",
    "max_block_outputs",
    "max_grid_dims",
    "delta",
    "max_trials",
)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "search",
        help="exhaustive µGraph search for a program (resumable, uses all cores)",
        description="Search the µGraphs equivalent to a program (Mirage's exhaustive generator with abstract-"
        "expression pruning and canonical forms), verify them and rank them by predicted time. "
        "Every finished task is saved in a checkpoint; running the same command again resumes.",
    )
    p.add_argument("program", metavar="PROGRAM", help="a .gsp file, or the name of a bundled program config")
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override an integer 'param' of the program (repeatable)",
    )
    p.add_argument("--hw", default="h100", help="hardware profile name, configs/hw/NAME.toml (default h100)")
    d = _spec_defaults()
    p.add_argument(
        "--max-kernel-ops",
        type=int,
        metavar="N",
        help=f"most operators in the kernel graph (default {d['max_kernel_ops']})",
    )
    p.add_argument(
        "--max-block-ops",
        type=int,
        metavar="N",
        help=f"most compute operators in one block graph (default {d['max_block_ops']})",
    )
    p.add_argument(
        "--max-block-nodes",
        type=int,
        metavar="N",
        help="most iterators + operators + accumulators in one block graph, Mirage's count (default: "
        "no such limit)",
    )
    p.add_argument(
        "--min-kernel-ops",
        type=int,
        metavar="N",
        help="fewest kernel operators in a complete µGraph (default 1)",
    )
    p.add_argument(
        "--max-block-graphs",
        type=int,
        metavar="N",
        help="most graph-defined (custom) kernels in one µGraph, Mirage's max_num_threadblock_graphs "
        "(default: no such limit)",
    )
    p.add_argument(
        "--max-block-inputs",
        type=int,
        metavar="N",
        help=f"most inputs of one block graph (default {d['max_block_inputs']})",
    )
    p.add_argument(
        "--max-block-outputs",
        type=int,
        metavar="N",
        help=f"most outputs of one block graph (default {d['max_block_outputs']})",
    )
    p.add_argument(
        "--max-grid-dims",
        type=int,
        metavar="N",
        help=f"most grid dims of one block graph, 1-3 (default {d['max_grid_dims']})",
    )
    p.add_argument(
        "--ops",
        metavar="OP[,OP...]",
        help="operator types the search may use (default: derived from the program)",
    )
    p.add_argument(
        "--dims",
        metavar="NAME|FILE.toml",
        help="only the imaps, omaps and fmaps of this dim strategy (configs/dims/: attention, mlp, "
        "lora, Mirage's lists; default: every map)",
    )
    p.add_argument(
        "--delta",
        type=float,
        help=f"target false-accept probability of verification (default {d['delta']:g})",
    )
    p.add_argument(
        "--max-trials",
        type=int,
        metavar="N",
        help=f"cap on verification trials per candidate (default {d['max_trials']})",
    )
    p.add_argument(
        "--verify-all",
        action="store_true",
        help="verify every complete µGraph, not only those whose expression matches the program's",
    )
    p.add_argument("--no-prune", action="store_true", help="disable abstract-expression pruning")
    p.add_argument("--no-canonical", action="store_true", help="disable the canonical-form restriction")
    p.add_argument(
        "--no-replicated-writes",
        action="store_true",
        help="narrow the space: no block graph but the last writes copies it has not lined up with an "
        "input axis (not exact; see docs/search.md)",
    )
    p.add_argument(
        "--graph-defined-last",
        action="store_true",
        help="a graph-defined (custom) kernel only as the last kernel operator, pre-defined ones feeding it",
    )
    p.add_argument(
        "--fused-first",
        action="store_true",
        help="run first the tasks whose custom kernel reads every program input (order only)",
    )
    p.add_argument(
        "--parallel-first",
        action="store_true",
        help="with --fused-first: split the looped fusing tasks, most thread blocks first (order only)",
    )
    p.add_argument(
        "--program-ops-first",
        action="store_true",
        help="with --fused-first: tasks below the program's own pre-defined operators first (order only)",
    )
    p.add_argument(
        "--schedule",
        choices=SCHEDULES,
        default="markov",
        help="how kernels' schedules are chosen: Markov construction or enumeration (default markov)",
    )
    p.add_argument("--seed", type=seed, default=0, help="seed of the search (default 0)")
    p.add_argument("--workers", type=int, metavar="N", help="worker processes (default: all usable cores)")
    p.add_argument(
        "--cluster",
        metavar="ADDRESS",
        help="run the tasks on a Dask cluster: tcp://HOST:8786, or local:N worker processes "
        "(needs gensorage[distributed]; docs/distributed.md)",
    )
    p.add_argument("--time-budget", type=float, metavar="SECONDS", help="stop after this many seconds")
    p.add_argument(
        "--checkpoint",
        metavar="PATH",
        help="checkpoint file (default $GENSORAGE_HOME/checkpoints/<spec key>.sqlite)",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON (no progress)")
    p.add_argument("--top", type=int, default=1, metavar="K", help="show the K best µGraphs (default 1)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_search)


def _spec_defaults() -> dict[str, Any]:
    """SearchSpec's field defaults, so the help shows the values a search really uses."""
    import dataclasses

    from gensorage.exhaustive.spec import SearchSpec

    return {f.name: f.default for f in dataclasses.fields(SearchSpec)}


def build_spec(args: argparse.Namespace) -> Any:
    """The ``SearchSpec`` the arguments describe (program loaded, hw profile checked, limits set)."""
    from gensorage.cli.program import load_source, parse_params
    from gensorage.exhaustive.spec import SearchSpec
    from gensorage.hw import load_profile

    program = load_source(args.program, parse_params(args.param))
    load_profile(args.hw)  # an unknown profile fails here, naming the profiles that exist
    kwargs: dict[str, Any] = {
        name: getattr(args, name) for name in LIMIT_ARGS if getattr(args, name) is not None
    }
    if args.ops:
        kwargs["ops"] = tuple(o.strip() for o in args.ops.split(",") if o.strip())
    if args.dims:
        from gensorage.exhaustive.dim_strategy import load_dim_strategy

        kwargs["dims"] = load_dim_strategy(args.dims)
    return SearchSpec(
        program=program,
        hw=args.hw,
        prune=not args.no_prune,
        canonical=not args.no_canonical,
        schedule=args.schedule,
        seed=args.seed,
        expr_filter=not args.verify_all,
        replicated_writes=not args.no_replicated_writes,
        graph_defined_last=args.graph_defined_last,
        fused_first=args.fused_first,
        parallel_first=args.parallel_first,
        program_ops_first=args.program_ops_first,
        **kwargs,
    )


def cmd_search(args: argparse.Namespace) -> int:
    from gensorage.exhaustive.run.runner import SearchInterrupted, run_search

    if args.top < 1:
        raise ConfigError(f"--top must be at least 1 (got {args.top})")
    spec = build_spec(args)
    try:
        result = run_search(
            spec,
            checkpoint=args.checkpoint,
            workers=args.workers,
            time_budget_s=args.time_budget,
            progress=not (args.json or args.quiet),
            cluster=args.cluster,
        )
    except SearchInterrupted as exc:
        r = exc.result
        if args.json:  # a script gets what was found so far (complete: false), as on a budget stop
            print(json.dumps(result_json(spec, r, args.top), indent=2))
        print(
            f"gensorage: interrupted: {r.tasks_done}/{r.tasks_total} tasks done, saved in {r.checkpoint_path}; "
            f"run the same command again to resume",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    if args.json:
        print(json.dumps(result_json(spec, result, args.top), indent=2))
    else:
        print(result_text(result, args.top))
    if not result.complete:
        print(
            f"gensorage: search incomplete: the time budget ran out with {result.tasks_done}/"
            f"{result.tasks_total} tasks done; run the same command again to continue from "
            f"{result.checkpoint_path}",
            file=sys.stderr,
        )
        return EXIT_NOT_FOUND
    if result.best is None:
        print("gensorage: the search found no µGraph within these limits", file=sys.stderr)
        return EXIT_NOT_FOUND
    return 0


def _stats_json(stats: Any) -> dict[str, Any]:
    from gensorage.exhaustive.run.conversions import stats_to_dict

    return stats_to_dict(stats)


def _candidate_json(c: Any) -> dict[str, Any]:
    return {
        "predicted_time_s": c.predicted_time_s,
        "found_in_task": c.found_in_task,
        "equivalence": c.equivalence,
        "ugraph": c.ugraph.to_json(),
        "text": c.ugraph.to_text(),
    }


def result_json(spec: Any, result: Any, top: int) -> dict[str, Any]:
    return {
        "spec": spec.to_json(),
        "spec_key": spec.key(),
        "complete": result.complete,
        "tasks_done": result.tasks_done,
        "tasks_total": result.tasks_total,
        "elapsed_s": result.elapsed_s,
        "checkpoint": str(result.checkpoint_path),
        "stats": _stats_json(result.stats),
        "num_candidates": len(result.candidates),
        "best": _candidate_json(result.best) if result.best is not None else None,
        "top": [_candidate_json(c) for c in result.candidates[:top]],
    }


# The equivalence record's entries worth a glance in the text form (--json has all of them).
_EQUIVALENCE_SUMMARY = ("equivalent", "method", "trials", "achieved_delta")


def _equivalence_text(eq: dict[str, Any]) -> str:
    parts = [
        f"{k} {eq[k]:.3g}" if isinstance(eq[k], float) else f"{k} {eq[k]}"
        for k in _EQUIVALENCE_SUMMARY
        if k in eq
    ]
    return "equivalence: " + (", ".join(parts) if parts else json.dumps(eq, sort_keys=True))


def result_text(result: Any, top: int) -> str:
    from gensorage.exhaustive.run.progress import format_count, format_seconds, format_time

    lines: list[str] = []
    for rank, c in enumerate(result.candidates[:top], start=1):
        lines.append(
            f"# µGraph #{rank}: predicted {format_time(c.predicted_time_s)} (found in task "
            f"{c.found_in_task}; {_equivalence_text(c.equivalence)})"
        )
        lines.append(c.ugraph.to_text().rstrip("\n"))
        lines.append("")
    if not result.candidates:
        lines.append("# no µGraph found")
    st = _stats_json(result.stats)

    def g(name: str) -> str:
        return format_count(st.get(name, 0) or 0)

    lines.append(
        f"# {len(result.candidates)} candidates; tasks {result.tasks_done}/{result.tasks_total}"
        f"{'' if result.complete else ' (incomplete)'}; states {g('states')} ({g('states_reused')} reused); pruned by expression "
        f"{g('pruned_expr')}, shape {g('pruned_shape')}, memory {g('pruned_memory')}; solver queries "
        f"{g('solver_queries')}, cache hits {g('cache_hits')}, timeouts {g('solver_timeouts')}; verified "
        f"{g('verified')}, rejected {g('rejected')}, unstable {g('unstable')}; this run "
        f"{format_seconds(result.elapsed_s)}; checkpoint {result.checkpoint_path}"
    )
    if not result.complete and result.run_stats:
        lines.append(
            f"# this run visited {format_count(result.run_stats.get('states', 0))} states, counting tasks "
            "stopped before they finished (they run again on resume)"
        )
    return "\n".join(lines)

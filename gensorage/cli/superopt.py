"""``gensorage superopt``: superoptimise a program (full or fast mode) and print or emit the result.

Exit codes: 0 a verified µGraph better than the direct one (one kernel per op) was found and the search was
complete; 1 nothing better than the direct µGraph (or the search stopped early, by its time budget); 130
interrupted (the search's checkpoint keeps what was found; what was found so far is printed); otherwise the
exit code of the error class (bad program 3, bad config / option 6, store 7, ...), with a one-line message;
also when the chosen µGraph's kernels cannot be built (a tensor larger than the device's memory: 5), after the
summary.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from gensorage.cli.argtypes import seed
from gensorage.errors import ConfigError
from gensorage.precision import DEFAULT_PRECISION, PRECISIONS

EXIT_OK = 0
EXIT_NOT_IMPROVED = 1
EXIT_INTERRUPTED = 130
EMIT_KINDS = ("cuda", "tir", "dot")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "superopt",
        help="superoptimise a tensor program: exhaustive µGraph search or stored-structure reuse",
        description="Superoptimise PROGRAM (a .gsp file or a bundled config name) for a GPU. Full mode runs "
        "the exhaustive µGraph search (checkpointed; Ctrl-C keeps what was found); fast mode "
        "re-uses the structure a full run stored for the same program at other shapes. Without "
        "PROGRAM, runs the 'default' preset (a tiny MLP, fast then full mode).",
        epilog="exit codes: 0 better µGraph found, 1 nothing better than one kernel per op (or search "
        "incomplete), 130 interrupted, 2-10 errors (see gensorage.errors)",
    )
    parser.add_argument(
        "program",
        nargs="?",
        metavar="PROGRAM",
        help="a .gsp file or bundled program name (default: the 'default' preset's program)",
    )
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override an integer 'param' of the program (repeatable)",
    )
    parser.add_argument("--hw", default="h100", help="hardware profile name or .toml path (default h100)")
    parser.add_argument(
        "--mode",
        choices=("full", "fast"),
        default=None,
        help="full: exhaustive search; fast: re-use a stored structure (default full, or the "
        "preset's modes without PROGRAM)",
    )
    parser.add_argument(
        "--time-budget",
        type=float,
        default=None,
        metavar="S",
        help="search time budget in seconds (default: the preset's, else none)",
    )
    parser.add_argument(
        "--checkpoint",
        default=None,
        metavar="PATH",
        help="search checkpoint file (resumed if it exists; default: one per search)",
    )
    parser.add_argument("--workers", type=int, default=None, metavar="N", help="search worker processes")
    parser.add_argument(
        "--cluster",
        metavar="ADDRESS",
        help="run the search on a Dask cluster: tcp://HOST:8786, or local:N worker processes "
        "(needs gensorage[distributed]; docs/distributed.md)",
    )
    parser.add_argument("--seed", type=seed, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--preset",
        default=None,
        metavar="NAME",
        help="search preset name or .toml path (default: the one named like the program)",
    )
    parser.add_argument(
        "--delta",
        type=float,
        default=None,
        help="false-accept probability of the equivalence checks (default: the preset's)",
    )
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default=DEFAULT_PRECISION,
        help="how intermediates are stored: float32 where the program's dtype could overflow (default), "
        "or the program's dtype everywhere ('storage')",
    )
    parser.add_argument(
        "--store",
        default=None,
        metavar="PATH",
        help="structure store file (default $GENSORAGE_HOME/store.sqlite)",
    )
    parser.add_argument("--no-store", action="store_true", help="neither read nor write stored structures")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--emit",
        choices=EMIT_KINDS,
        default=None,
        help="also produce the best µGraph's CUDA C, TIR or Graphviz dot",
    )
    parser.add_argument(
        "--out",
        default=None,
        metavar="FILE",
        help="write --emit's output to FILE (default: stdout, the summary then goes to stderr)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.set_defaults(func=cmd_superopt)


def _check_args(args: argparse.Namespace) -> None:
    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {args.workers}")
    if args.time_budget is not None and not (args.time_budget > 0 and math.isfinite(args.time_budget)):
        raise ConfigError(f"--time-budget must be a positive number of seconds, got {args.time_budget}")
    if args.delta is not None and not 0 < args.delta < 1:
        raise ConfigError(f"--delta must be in (0, 1), got {args.delta}")
    if args.out is not None and args.emit is None:
        raise ConfigError("--out needs --emit (what to write)")


def _emit(result: Any, kind: str) -> str:
    if kind == "cuda":
        return str(result.cuda_source())
    if kind == "tir":
        return str(result.tir())
    return str(result.to_dot())


def _exit_code(result: Any) -> int:
    return EXIT_OK if (not result.is_direct and result.complete and result.equivalence) else EXIT_NOT_IMPROVED


def cmd_superopt(args: argparse.Namespace) -> int:
    from gensorage.cli.program import parse_params
    from gensorage.superopt import DEFAULT_PRESET, SuperoptInterrupted, load_preset, superoptimize

    _check_args(args)
    params = parse_params(args.param)
    preset = args.preset
    program = args.program
    modes: tuple[str, ...] = (args.mode,) if args.mode else ("full",)
    if program is None:
        chosen = load_preset(preset or DEFAULT_PRESET)
        program, preset = chosen.program, chosen
        params = {**chosen.run_params, **params}
        modes = (args.mode,) if args.mode else chosen.modes
    earlier: list[dict[str, Any]] = []
    result: Any = None
    interrupted = False
    for mode in modes:
        try:
            result = superoptimize(
                program,
                hw=args.hw,
                mode=mode,
                time_budget_s=args.time_budget,
                checkpoint=args.checkpoint,
                params=params or None,
                seed=args.seed,
                workers=args.workers,
                cluster=args.cluster,
                preset=preset,
                store=args.store,
                use_store=not args.no_store,
                progress=not args.quiet,
                delta=args.delta,
                precision=args.precision,
            )
        except SuperoptInterrupted as exc:
            result, interrupted = exc.result, True
        if mode != modes[-1] and not interrupted:
            earlier.append(result.to_json())
            if not args.quiet:
                print(result.summary(), file=sys.stderr)
        if interrupted:
            break
    assert result is not None
    _report(args, result, earlier)
    if interrupted:
        print(
            "gensorage: interrupted; the search checkpoint keeps what was found (run again to resume)",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    if result.compile_error is not None:  # nothing to run: an error, not a result that did not improve
        print(f"gensorage: error: no kernels: {result.compile_error}", file=sys.stderr)
        return result.compile_error.exit_code
    return _exit_code(result)


def _report(args: argparse.Namespace, result: Any, earlier: list[dict[str, Any]]) -> None:
    artifact = _emit(result, args.emit) if args.emit else None
    if artifact is not None and args.out is not None:
        path = Path(args.out)
        try:
            path.write_text(artifact, encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"--out {path}: cannot write: {exc}") from None
    summary_stream = sys.stderr if artifact is not None and args.out is None else sys.stdout
    if args.json:
        data = result.to_json()
        if earlier:
            data["earlier_runs"] = [{k: v for k, v in e.items() if k != "ugraph"} for e in earlier]
        if artifact is not None and args.out is None:
            data[args.emit] = artifact
        print(json.dumps(data, indent=2, default=str), file=sys.stdout)
        return
    print(str(result), file=summary_stream)
    if artifact is not None and args.out is None:
        sys.stdout.write(artifact if artifact.endswith("\n") else artifact + "\n")
    elif args.out is not None:
        print(f"wrote {args.emit} to {args.out}", file=summary_stream)

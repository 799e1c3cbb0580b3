"""``gensorage verify A B``: probabilistic equivalence of two programs / µGraphs over finite fields.

Exit status: 0 equivalent, 1 not equivalent, the error's code otherwise (e.g. 4 for a program outside the Lax
fragment, 9 for inputs that do not correspond).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from gensorage.cli.argtypes import positive_int, seed
from gensorage.cli.program import DEFAULT_MAX_ELEMENTS
from gensorage.errors import ConfigError, UGraphError, VerificationError

#: Above this many required trials (and without --max-trials) the command warns on stderr before it starts.
LONG_RUN_TRIALS = 100_000


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="check that two programs or µGraphs compute the same function (random tests over finite fields)",
        description="Probabilistic equivalence check (Mirage §5): both sides are evaluated on random inputs in "
        "Z_p x Z_q; a pass bounds the false-accept probability by --delta. Exit 0 if equivalent, 1 if not.",
    )
    parser.add_argument(
        "a", metavar="A", help="a program (.gsp file or bundled config name) or a µGraph (.json)"
    )
    parser.add_argument("b", metavar="B", help="the other side, same inputs by position")
    parser.add_argument(
        "--delta", type=float, default=1e-9, help="false-accept probability bound (default 1e-9)"
    )
    parser.add_argument("--seed", type=seed, default=None, help="random seed (default: fresh, reported)")
    parser.add_argument(
        "--max-trials",
        type=int,
        default=None,
        metavar="N",
        help="stop after N passing trials; the report then gives the δ actually reached",
    )
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override an integer 'param' of the .gsp programs (repeatable)",
    )
    parser.add_argument(
        "--float-check",
        action="store_true",
        help="also run the float numerical-stability test of B against A",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--max-elements",
        type=positive_int,
        default=DEFAULT_MAX_ELEMENTS,
        metavar="N",
        help=f"refuse sides with a tensor of more elements (default {DEFAULT_MAX_ELEMENTS}): each "
        "trial evaluates both at their shapes",
    )
    parser.set_defaults(func=cmd_verify)


def check_size(side: Any, name: str, limit: int) -> None:
    """Each trial evaluates a side at its shapes: a tensor too large to hold is refused before any trial."""
    from gensorage.program import Program

    if isinstance(side, Program):
        tensors = [(n.name, n.shape) for n in side.nodes]
    else:
        tensors = [(t.name, t.shape) for t in side.inputs]
    for tname, shape in tensors:
        size = math.prod(shape)
        if size > limit:
            raise ConfigError(
                f"{name}: tensor '{tname}' has {size:,} elements, more than --max-elements {limit:,} "
                "(pass smaller --param values or raise --max-elements)"
            )


def load_side(file: str, params: dict[str, int]) -> Any:
    """A µGraph from a ``.json`` file, else a program (``.gsp`` path or bundled config name)."""
    if file.endswith(".json"):
        from gensorage.ugraph import KernelGraph

        try:
            data = json.loads(Path(file).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"{file}: cannot read µGraph file: {exc}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{file}: not valid JSON: {exc}") from None
        try:
            return KernelGraph.from_json(data)
        except UGraphError as exc:
            raise UGraphError(f"{file}: not a gensorage µGraph: {exc}") from None
    from gensorage.cli.program import load_source

    return load_source(file, params)


def cmd_verify(args: argparse.Namespace) -> int:
    from gensorage.cli.program import parse_params
    from gensorage.verify import TrialPlan, equivalent, float_check
    from gensorage.verify.trials import format_count

    if not 0.0 < args.delta < 1.0:
        raise VerificationError(f"--delta must lie strictly between 0 and 1, got {args.delta}")
    params = parse_params(args.param)
    a, b = load_side(args.a, params), load_side(args.b, params)
    check_size(a, args.a, args.max_elements)
    check_size(b, args.b, args.max_elements)

    def warn(trial_plan: TrialPlan) -> None:
        if args.max_trials is None and trial_plan.required > LONG_RUN_TRIALS:
            print(
                f"gensorage verify: the first tier found a difference that may need exp's law; the second tier "
                f"needs {format_count(trial_plan.required)} trials for δ={args.delta:g} "
                f"(k={format_count(trial_plan.k)}); this can take very long. Pass --max-trials N to cap the run "
                "(the report then gives the δ actually reached).",
                file=sys.stderr,
            )

    result = equivalent(a, b, args.delta, seed=args.seed, max_trials=args.max_trials, on_second_tier=warn)
    check = float_check(a, b) if args.float_check and result.equivalent else None
    if args.json:
        doc = result.to_json()
        if check is not None:
            doc["float_check"] = {f: getattr(check, f) for f in check.__slots__}  # type: ignore[attr-defined]
        json.dump(doc, sys.stdout, indent=2)
        print()
    else:
        print(result)  # its first line names the tier that decided
        if check is not None:
            verdict = "ok" if check.ok else "UNSTABLE"
            print(
                f"float check ({check.dtype}): {verdict}, max relative error {check.max_rel_error:.3g} "
                f"(reference in {check.dtype}: {check.reference_rel_error:.3g}, rtol {check.rtol:g})"
            )
    return 0 if result.equivalent else 1


__all__ = ["cmd_verify", "load_side", "register"]

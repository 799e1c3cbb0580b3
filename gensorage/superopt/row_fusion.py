"""Row fusion (:mod:`gensorage.ugraph.optimize.fuse_rows`), after epilogue fusion
(:mod:`gensorage.ugraph.optimize.fuse_epilogues`), where users get kernels: the fused direct µGraph
(the direct µGraph, one kernel per op, after row fusion) as an option competing with the others, and the
pre-defined ops a search candidate leaves (its element-wise ops and reductions around matmuls), each checked
like the candidates are.

Row fusion is a rewrite by rule, so its result is verified as a search candidate is: by the equivalence check at
the requested shapes when the program is small enough to check there, otherwise at the program's derived search
shapes (:mod:`.search_shapes`), where the same rule fuses the same groups; that check is the option's search
report. A graph the rule leaves unchanged is no option (it is the direct µGraph). A candidate is replaced by its fused
form only when the cost model prices that faster; when the program is too large to check at its own shapes, the
fused form is checked at the search shapes too (the candidate's search report covers the candidate, not the
rewrite).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from gensorage.errors import GensorageError
from gensorage.hw.profile import HwProfile
from gensorage.program import Program
from gensorage.superopt.choice import Option, elements
from gensorage.superopt.presets import DEFAULT_VERIFY_MAX_ELEMENTS, DEFAULT_VERIFY_MAX_TRIALS
from gensorage.ugraph import KernelGraph, from_program
from gensorage.ugraph.optimize.fuse_epilogues import fuse_epilogues
from gensorage.ugraph.optimize.fuse_rows import fuse_rows as _fuse_rows

if TYPE_CHECKING:
    from gensorage.superopt.presets import Preset

#: The origin of the fused direct µGraph among the options.
FUSED = "fused"


def fuse_rows(g: KernelGraph, hw: HwProfile | None) -> KernelGraph:
    """``g`` with its matmuls' element-wise chains as their epilogues
    (:mod:`gensorage.ugraph.optimize.fuse_epilogues`), then its row groups fused (epilogue fusion first: row
    fusion would take the element-wise ops into row kernels it cannot reach)."""
    return _fuse_rows(fuse_epilogues(g, hw), hw)


def fused_direct(program: Program, precision: str, hw: HwProfile | None) -> KernelGraph | None:
    """The direct µGraph of ``program`` with its row groups fused, or None when nothing fuses."""
    direct = from_program(program, precision)
    fused = fuse_rows(direct, hw)
    return None if fused == direct else fused


def fused_option(
    program: Program,
    precision: str,
    hw: HwProfile,
    cost: Callable[[KernelGraph], float],
    delta: float,
    seed: int,
    preset: Preset | None = None,
) -> Option | None:
    """The fused direct µGraph as an :class:`~gensorage.superopt.choice.Option` (origin :data:`FUSED`), with the
    equivalence check at the derived search shapes as its search report when the program is too large to check
    at its own; None when nothing fuses or, like a search candidate, it fails the float check
    (:func:`~gensorage.verify.float_check`: a matmul's epilogue keeps its steps in float32, so the rewrite
    changes the rounding)."""
    from gensorage.verify import float_check

    fused = fused_direct(program, precision, hw)
    if fused is None:
        return None
    limit = preset.verify_max_elements if preset is not None else DEFAULT_VERIFY_MAX_ELEMENTS
    report = None
    if elements(program) <= limit and not float_check(program, fused, seed=seed):
        return None
    if elements(program) > limit:
        try:
            report = small_shape_report(program, precision, hw, delta, seed, fused)
        except GensorageError:
            # The check cannot run there (e.g. too many function applications to bound its error): no option,
            # the direct µGraph stands.
            return None
    return Option(fused, cost(fused), FUSED, search_report=report)


def small_shape_report(
    program: Program,
    precision: str,
    hw: HwProfile | None,
    delta: float,
    seed: int,
    fused: KernelGraph | None = None,
) -> dict[str, object]:
    """The equivalence check and the float check of the fusion on ``program`` at its derived search shapes (as a
    search report); ``fused``: ``program``'s own row-fused direct µGraph, when the caller has it."""
    from gensorage.superopt.search_shapes import derive_search_shapes
    from gensorage.verify import float_check
    from gensorage.verify.equivalent import equivalent

    small = derive_search_shapes(program).program
    graph = fuse_rows(from_program(small, precision), hw)
    method = "row fusion checked at the derived search shapes"
    at_own = fused if fused is not None else fuse_rows(from_program(program, precision), hw)
    if kernel_kinds(graph) != kernel_kinds(at_own):
        # the rule formed other kernels there (a row that fits shared memory only when small): the check
        # would not witness the rewrite at the program's own shapes
        why = "row fusion forms other kernels at the search shapes than at the program's own"
        return {"equivalent": False, "float_check": None, "method": method, "reason": why}
    report = equivalent(small, graph, delta, seed=seed, max_trials=DEFAULT_VERIFY_MAX_TRIALS)
    stable = bool(float_check(small, graph, seed=seed))
    return {"equivalent": bool(report) and stable, "float_check": stable, "method": method}


def kernel_kinds(g: KernelGraph) -> list[str]:
    """What each kernel of ``g`` runs, without sizes or positions: its op, or its block graph's node kinds and
    thread ops (and a matmul's epilogue steps), sorted."""

    def names(x: object) -> list[str]:
        if isinstance(x, dict):
            own = [str(x[k]) for k in ("kind", "op") if isinstance(x.get(k), str)]
            return own + [n for k, v in sorted(x.items()) if k not in ("kind", "op") for n in names(v)]
        if isinstance(x, list):
            return [n for v in x for n in names(v)]
        return []

    return sorted(" ".join(names(op)) for op in g.to_json()["ops"])


def fused_candidate(opt: Option, hw: HwProfile, cost: Callable[[KernelGraph], float]) -> Option:
    """``opt`` with its row groups fused when the cost model prices that faster (else ``opt`` itself); a fused
    option keeps its search graph (:func:`check_fused_candidate` checks the rewrite there)."""
    fused = fuse_rows(opt.graph, hw)
    if fused == opt.graph:
        return opt
    t = cost(fused)
    return dataclasses.replace(opt, graph=fused, predicted_time_s=t) if t < opt.predicted_time_s else opt


def check_fused_candidate(opt: Option, at: Program, hw: HwProfile, delta: float, seed: int) -> Option:
    """``opt`` (from :func:`fused_candidate`) with the rewrite of its search graph (a µGraph of ``at``) checked
    at the search shapes: its search report says equivalent only when the candidate and its fused form are."""
    from gensorage.verify.equivalent import equivalent

    if opt.search_graph is None:
        return opt
    small = fuse_rows(opt.search_graph, hw)
    if small == opt.search_graph:
        return opt
    try:
        checked = bool(equivalent(at, small, delta, seed=seed, max_trials=DEFAULT_VERIFY_MAX_TRIALS))
    except GensorageError:  # the check cannot run: the rewrite is not shown equivalent
        checked = False
    before = opt.search_report
    ok = bool(before and before.get("equivalent", True)) and checked
    return dataclasses.replace(opt, search_report={**(before or {}), "equivalent": ok, "row_fusion": checked})


__all__ = [
    "FUSED",
    "check_fused_candidate",
    "fused_candidate",
    "fused_direct",
    "fuse_rows",
    "fused_option",
    "kernel_kinds",
    "small_shape_report",
]

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

The rule comes in two forms (:data:`FUSED_ORIGINS`): epilogue fusion then row fusion (:data:`FUSED`), and row fusion
alone (:data:`FUSED_ROWS`), offered too where its µGraph differs from the other's and the direct one. Neither is
faster everywhere: an epilogue saves a round trip of the matmul's product, but a wgmma kernel with one stores each
element on its own (a ``float2`` store per lane's column pair without), which on the H200 made QKᵀ with its scale
as an epilogue slower than QKᵀ followed by a row kernel that applies it (gqa_prefill, LLaMA-3 attention); the cost
model prices both, and the options compete.
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

#: The origin of the fused direct µGraph among the options (epilogue fusion, then row fusion).
FUSED = "fused"
#: The origin of the direct µGraph after row fusion alone (no matmul epilogues).
FUSED_ROWS = "fused without epilogues"
#: The rule-made options' origins, each with whether its rule fuses epilogues first (the first wins ties).
FUSED_ORIGINS: dict[str, bool] = {FUSED: True, FUSED_ROWS: False}


def fuse_rows(g: KernelGraph, hw: HwProfile | None, epilogues: bool = True) -> KernelGraph:
    """``g`` with its matmuls' element-wise chains as their epilogues
    (:mod:`gensorage.ugraph.optimize.fuse_epilogues`) unless ``epilogues`` is false, then its row groups fused
    (epilogue fusion first: row fusion would take the element-wise ops into row kernels it cannot reach)."""
    return _fuse_rows(fuse_epilogues(g, hw) if epilogues else g, hw)


def fused_direct(
    program: Program, precision: str, hw: HwProfile | None, epilogues: bool = True
) -> KernelGraph | None:
    """The direct µGraph of ``program`` with its row groups fused (after epilogue fusion unless ``epilogues`` is
    false), or None when nothing fuses."""
    direct = from_program(program, precision)
    fused = fuse_rows(direct, hw, epilogues)
    return None if fused == direct else fused


def fused_option(
    program: Program,
    precision: str,
    hw: HwProfile,
    cost: Callable[[KernelGraph], float],
    delta: float,
    seed: int,
    preset: Preset | None = None,
    epilogues: bool = True,
) -> Option | None:
    """The fused direct µGraph as an :class:`~gensorage.superopt.choice.Option` (origin :data:`FUSED`, or
    :data:`FUSED_ROWS` without ``epilogues``), with the equivalence check at the derived search shapes as its
    search report when the program is too large to check at its own; None when nothing fuses or, like a search
    candidate, it fails the float check (:func:`~gensorage.verify.float_check`: a matmul's epilogue keeps its
    steps in float32, so the rewrite changes the rounding)."""
    fused = fused_direct(program, precision, hw, epilogues)
    if fused is None:
        return None
    return _checked(program, precision, hw, cost, delta, seed, preset, fused, epilogues)


def fused_options(
    program: Program,
    precision: str,
    hw: HwProfile,
    cost: Callable[[KernelGraph], float],
    delta: float,
    seed: int,
    preset: Preset | None = None,
) -> list[Option]:
    """The rule-made options (:data:`FUSED_ORIGINS`, each as :func:`fused_option` makes and checks it), a form
    whose µGraph another form before it already gives left out."""
    options: list[Option] = []
    seen: list[KernelGraph] = []
    for epilogues in FUSED_ORIGINS.values():
        fused = fused_direct(program, precision, hw, epilogues)
        if fused is None or fused in seen:
            continue
        seen.append(fused)
        opt = _checked(program, precision, hw, cost, delta, seed, preset, fused, epilogues)
        options += [opt] if opt is not None else []
    return options


def _checked(
    program: Program,
    precision: str,
    hw: HwProfile,
    cost: Callable[[KernelGraph], float],
    delta: float,
    seed: int,
    preset: Preset | None,
    fused: KernelGraph,
    epilogues: bool,
) -> Option | None:
    from gensorage.verify import float_check

    limit = preset.verify_max_elements if preset is not None else DEFAULT_VERIFY_MAX_ELEMENTS
    report = None
    if elements(program) <= limit and not float_check(program, fused, seed=seed):
        return None
    if elements(program) > limit:
        try:
            report = small_shape_report(program, precision, hw, delta, seed, fused, epilogues)
        except GensorageError:
            # The check cannot run there (e.g. too many function applications to bound its error): no option,
            # the direct µGraph stands.
            return None
    return Option(fused, cost(fused), fused_origin(epilogues), search_report=report)


def fused_origin(epilogues: bool) -> str:
    """The origin of the rule-made option whose rule fuses epilogues first when ``epilogues`` is true."""
    return next(o for o, e in FUSED_ORIGINS.items() if e == epilogues)


def small_shape_report(
    program: Program,
    precision: str,
    hw: HwProfile | None,
    delta: float,
    seed: int,
    fused: KernelGraph | None = None,
    epilogues: bool = True,
) -> dict[str, object]:
    """The equivalence check and the float check of the fusion (after epilogue fusion unless ``epilogues`` is
    false) on ``program`` at its derived search shapes (as a search report); ``fused``: ``program``'s own
    row-fused direct µGraph, when the caller has it."""
    from gensorage.superopt.search_shapes import derive_search_shapes
    from gensorage.verify import float_check
    from gensorage.verify.equivalent import equivalent

    small = derive_search_shapes(program).program
    graph = fuse_rows(from_program(small, precision), hw, epilogues)
    method = "row fusion checked at the derived search shapes"
    at_own = fused if fused is not None else fuse_rows(from_program(program, precision), hw, epilogues)
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


def fused_candidate(
    opt: Option, hw: HwProfile, cost: Callable[[KernelGraph], float], epilogues: bool = True
) -> Option:
    """``opt`` with its row groups fused (after epilogue fusion unless ``epilogues`` is false) when the cost
    model prices that faster (else ``opt`` itself); a fused option keeps its search graph
    (:func:`check_fused_candidate` checks the rewrite there, by the same rule)."""
    fused = fuse_rows(opt.graph, hw, epilogues)
    if fused == opt.graph:
        return opt
    t = cost(fused)
    return dataclasses.replace(opt, graph=fused, predicted_time_s=t) if t < opt.predicted_time_s else opt


def check_fused_candidate(
    opt: Option, at: Program, hw: HwProfile, delta: float, seed: int, epilogues: bool = True
) -> Option:
    """``opt`` (from :func:`fused_candidate` with the same ``epilogues``) with the rewrite of its search graph (a
    µGraph of ``at``) checked at the search shapes: its search report says equivalent only when the candidate
    and its fused form are."""
    from gensorage.verify.equivalent import equivalent

    if opt.search_graph is None:
        return opt
    small = fuse_rows(opt.search_graph, hw, epilogues)
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
    "FUSED_ORIGINS",
    "FUSED_ROWS",
    "check_fused_candidate",
    "fused_candidate",
    "fused_direct",
    "fuse_rows",
    "fused_option",
    "fused_options",
    "fused_origin",
    "kernel_kinds",
    "small_shape_report",
]

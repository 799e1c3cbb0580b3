"""The µGraphs competing for the answer at the requested shapes, and how one is checked and built."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gensorage.errors import GensorageError, ProgramError, ScheduleError, UGraphError, UnsupportedOpError
from gensorage.program import Program
from gensorage.superopt.presets import DEFAULT_VERIFY_MAX_ELEMENTS, DEFAULT_VERIFY_MAX_TRIALS, Preset
from gensorage.superopt.result import Verification
from gensorage.ugraph import KernelGraph

if TYPE_CHECKING:
    from gensorage.codegen.module import CompiledUGraph
    from gensorage.hw.profile import HwProfile


class Progress:
    """``superopt:`` lines on stderr (or ``stream``) when enabled."""

    def __init__(self, enabled: bool, stream: Any = None) -> None:
        self.enabled = enabled
        self.stream = stream

    def __call__(self, msg: str) -> None:
        if self.enabled:
            print(f"superopt: {msg}", file=self.stream or sys.stderr, flush=True)


def cost_fn(hw: HwProfile) -> Callable[[KernelGraph], float]:
    from gensorage.ugraph.cost import predict_ugraph_time

    return lambda g: float(predict_ugraph_time(g, hw))


def elements(p: Program) -> int:
    """Elements of every tensor of the program (what one verification trial holds, roughly, per side)."""
    return sum(math.prod(n.shape) for n in p.nodes)


@dataclass(slots=True)
class Option:
    """One µGraph competing for the answer at the requested shapes."""

    graph: KernelGraph
    predicted_time_s: float
    origin: str  # "direct", "fused", "fused without epilogues" (.row_fusion), "search #i", "stored #i"
    search_graph: KernelGraph | None = None  # the same structure at the search / stored shapes
    search_report: dict[str, Any] | None = None
    measured_s: float | None = None


def rank(options: list[Option]) -> list[Option]:
    """Best first: measured time when there is one, else predicted; the direct µGraph wins ties."""
    return sorted(
        options,
        key=lambda o: (
            o.measured_s if o.measured_s is not None else math.inf,
            o.predicted_time_s,
            o.origin != "direct",
        ),
    )


def verify_option(
    p: Program,
    opt: Option,
    delta: float,
    preset: Preset | None,
    seed: int,
    should_stop: Callable[[], bool] | None = None,
) -> Verification:
    from gensorage.verify.equivalent import equivalent

    if opt.origin == "direct":
        return Verification(True, "direct µGraph")
    max_trials = preset.verify_max_trials if preset is not None else DEFAULT_VERIFY_MAX_TRIALS
    limit = preset.verify_max_elements if preset is not None else DEFAULT_VERIFY_MAX_ELEMENTS
    n = elements(p)
    if n > limit:
        ok = bool(opt.search_report and opt.search_report.get("equivalent", True))
        return Verification(
            ok,
            "search shapes",
            search_report=opt.search_report,
            note=f"the program holds {n} elements at these shapes (limit {limit}): the µGraph "
            "was checked at the search shapes only",
        )
    report = equivalent(p, opt.graph, delta, seed=seed, max_trials=max_trials, should_stop=should_stop)
    note = None
    if report.capped:
        note = (
            f"verification capped at {report.trials} trials (δ reached {report.achieved_delta:.3g}, "
            f"not {delta:g})"
        )
    return Verification(
        bool(report), "equivalence check", report=report, search_report=opt.search_report, note=note
    )


def try_compile(
    g: KernelGraph, hw: HwProfile, seed: int
) -> tuple[CompiledUGraph | None, GensorageError | None]:
    from gensorage.codegen.module import compile_ugraph

    try:
        return compile_ugraph(g, hw, "cuda", seed=seed), None
    except (UnsupportedOpError, ScheduleError, UGraphError, ProgramError) as exc:
        return None, exc


__all__ = ["Option", "Progress", "cost_fn", "elements", "rank", "try_compile", "verify_option"]

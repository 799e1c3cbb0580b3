"""What :func:`gensorage.superoptimize` returns: the chosen µGraph, how it was checked and chosen, its kernels."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gensorage.errors import GensorageError
from gensorage.program import Program
from gensorage.ugraph import KernelGraph, from_program

if TYPE_CHECKING:
    from gensorage.codegen.module import CompiledUGraph
    from gensorage.hw.profile import HwProfile
    from gensorage.verify.equivalent import EquivalenceResult


@dataclass(frozen=True, slots=True)
class Verification:
    """How the returned µGraph was checked against the program; truthy when it was.

    ``method``: ``"equivalence check"`` (:func:`gensorage.verify.equivalent` at the requested shapes, ``report``
    holds its result), ``"direct µGraph"`` (the program's own µGraph: one kernel per op, equal by construction)
    or ``"search shapes"`` (too large to check at the requested shapes: the search's check at its shapes,
    ``search_report``, is all there is; ``note`` says so).
    """

    verified: bool
    method: str
    report: EquivalenceResult | None = None
    search_report: dict[str, Any] | None = None
    note: str | None = None

    def __bool__(self) -> bool:
        return self.verified

    def __str__(self) -> str:
        if self.report is not None:
            text = str(self.report)
        elif self.method == "direct µGraph":
            text = "direct µGraph of the program (one kernel per op): equivalent by construction"
        else:
            text = f"{'verified' if self.verified else 'NOT verified'} ({self.method})"
        return text + (f"\n  note: {self.note}" if self.note else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "verified": self.verified,
            "method": self.method,
            "report": None if self.report is None else self.report.to_json(),
            "search_report": self.search_report,
            "note": self.note,
        }


@dataclass(slots=True)
class SuperoptResult:
    """What :func:`superoptimize` found for one program on one GPU.

    Attributes
    ----------
    program : Program
        The program, at the requested shapes.
    hw : HwProfile
        The GPU profile.
    mode : {"full", "fast"}
    best : KernelGraph
        The chosen µGraph (print it, ``.to_json()``, ``.to_dot()``).
    predicted_time_s, naive_predicted_time_s : float
        Cost-model times of ``best`` and of the direct µGraph (one kernel per op).
    equivalence : Verification
        How ``best`` was checked (truthy when verified).
    from_store : bool
        Fast mode re-used a stored structure.
    search_time_s : float
        Wall time of the whole call (search or re-instantiation, verification, code generation).
    search_stats : dict or None
        The exhaustive search's statistics and task counts (full mode).
    complete : bool
        Every search task finished (always True in fast mode).
    stopped_by : str or None
        ``"time budget"`` or ``"interrupt"`` when the search stopped early.
    selection : str
        How ``best`` was chosen: by the cost model, or measured on a GPU.
    fallback_reason : str or None
        Why fast mode used the direct µGraph instead of a stored structure.
    search_params : dict or None
        The program params the search ran at (full mode), or the stored structure's (fast mode).
    timings : dict
        Seconds per phase.
    notes : list of str
        Everything else worth knowing (skipped candidates, unavailable GPU, ...).
    measured : dict or None
        GPU timings of the profiled candidates (median seconds), when a GPU was used.
    seed : int
        The seed the call used.
    origin : str
        Where ``best`` came from: ``"direct"``, ``"search #i"`` (the search's i-th ranked candidate) or
        ``"stored #i"`` (the i-th µGraph of the stored structure).
    candidates : tuple of (str, KernelGraph, float)
        Every µGraph the choice was among, at the requested shapes, best ranked first: (origin, µGraph,
        predicted seconds); the direct µGraph is one of them.
    """

    program: Program
    hw: HwProfile
    mode: str
    best: KernelGraph
    predicted_time_s: float
    naive_predicted_time_s: float
    equivalence: Verification
    from_store: bool = False
    search_time_s: float = 0.0
    search_stats: dict[str, Any] | None = None
    complete: bool = True
    stopped_by: str | None = None
    selection: str = "cost model"
    fallback_reason: str | None = None
    search_params: dict[str, int] | None = None
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    measured: dict[str, float] | None = None
    seed: int = 0
    origin: str = "direct"
    candidates: tuple[tuple[str, KernelGraph, float], ...] = ()
    _compiled: CompiledUGraph | None = field(default=None, repr=False)
    _compile_error: GensorageError | None = field(default=None, repr=False)

    @property
    def num_kernels(self) -> int:
        """Kernel launches of ``best`` (one per kernel op)."""
        return len(self.best.ops)

    @property
    def naive_num_kernels(self) -> int:
        return len(from_program(self.program).ops)

    @property
    def is_direct(self) -> bool:
        """``best`` is the direct µGraph (nothing better than one kernel per op was found or carried over)."""
        return self.best == from_program(self.program)

    @property
    def speedup(self) -> float:
        """Predicted time of the direct µGraph over that of ``best``."""
        return self.naive_predicted_time_s / self.predicted_time_s if self.predicted_time_s > 0 else math.nan

    @property
    def compile_error(self) -> GensorageError | None:
        """Why the code generator could not build ``best``'s kernels during the call (a tensor larger than the
        device's memory, a block graph it cannot lower); None when it built them or was not asked to."""
        return self._compile_error

    def compiled(self) -> CompiledUGraph:
        """The code generator's kernels of ``best`` (built during the call; raises what the build raised)."""
        if self._compiled is None:
            if self._compile_error is not None:
                raise self._compile_error
            from gensorage.codegen.module import compile_ugraph

            self._compiled = compile_ugraph(self.best, self.hw, "cuda", seed=self.seed)
        return self._compiled

    def cuda_source(self) -> str:
        """CUDA C of every kernel of ``best`` for the GPU's architecture (no GPU needed)."""
        return self.compiled().cuda_source()

    def tir(self) -> str:
        """TVMScript (TIR) of every kernel of ``best``."""
        return self.compiled().tir()

    def to_dot(self) -> str:
        """Graphviz picture of ``best``."""
        return self.best.to_dot()

    def run(self, *arrays: Any, target: str = "cpu") -> list[Any]:
        """Run ``best``'s kernels: one array per program input, outputs returned in order.

        ``target="cpu"`` runs the llvm build on numpy arrays; ``target="cuda"`` runs on the GPU (numpy or
        DLPack tensors such as torch's) and raises :class:`~gensorage.errors.DeviceError` without one.
        """
        return self.compiled().run(*arrays, target=target)

    def to_json(self) -> dict[str, Any]:
        p = self.program
        return {
            "program": p.name,
            "params": dict(p.params),
            "program_key": p.key(),
            "structure_key": p.structure_key(),
            "hw": self.hw.name,
            "mode": self.mode,
            "num_kernels": self.num_kernels,
            "naive_num_kernels": self.naive_num_kernels,
            "predicted_time_s": self.predicted_time_s,
            "naive_predicted_time_s": self.naive_predicted_time_s,
            "speedup": self.speedup,
            "direct": self.is_direct,
            "verified": bool(self.equivalence),
            "equivalence": self.equivalence.to_json(),
            "from_store": self.from_store,
            "fallback_reason": self.fallback_reason,
            "selection": self.selection,
            "search_time_s": self.search_time_s,
            "timings": dict(self.timings),
            "complete": self.complete,
            "stopped_by": self.stopped_by,
            "search_params": self.search_params,
            "search_stats": self.search_stats,
            "measured": self.measured,
            "notes": list(self.notes),
            "seed": self.seed,
            "origin": self.origin,
            "ugraph": self.best.to_json(),
        }

    def summary(self) -> str:
        """A few lines for people: what was found, how fast, how it was checked."""
        p = self.program
        params = ", ".join(f"{k}={v}" for k, v in p.params.items())
        lines = [
            f"program {p.name}"
            + (f" ({params})" if params else "")
            + f" on {self.hw.name}, {self.mode} mode",
            f"  best µGraph: {self.num_kernels} kernel(s) (direct: {self.naive_num_kernels}); predicted "
            f"{format_time(self.predicted_time_s)} vs {format_time(self.naive_predicted_time_s)} direct "
            f"({self.speedup:.2f}x); chosen by {self.selection}",
            "  " + str(self.equivalence).replace("\n", "\n  "),
        ]
        if self.from_store:
            lines.append(f"  re-used the stored structure found at {self.search_params}")
        if self.fallback_reason:
            from gensorage.superopt.row_fusion import FUSED_ORIGINS  # not at the top: it imports this module

            kind = "direct µGraph (row-fused)" if self.origin in FUSED_ORIGINS else "direct µGraph"
            lines.append(f"  {kind} used: {self.fallback_reason}")
        if not self.complete:
            lines.append(f"  search incomplete (stopped by {self.stopped_by})")
        lines.append(f"  took {self.search_time_s:.2f} s")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary() + "\n" + self.best.to_text()


class SuperoptInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped the search of a full-mode run; ``result`` is the best of what was found (and saved)."""

    def __init__(self, result: SuperoptResult) -> None:
        super().__init__("superoptimization interrupted; the search's checkpoint keeps what was found")
        self.result = result


def format_time(t: float) -> str:
    """``t`` seconds for people: ``2.48 µs``, ``16.6 ms``, ``inf``."""
    if not math.isfinite(t):
        return "inf"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if t >= scale:
            return f"{t / scale:.3g} {unit}"
    return f"{t * 1e9:.3g} ns"


__all__ = ["SuperoptInterrupted", "SuperoptResult", "Verification", "format_time"]

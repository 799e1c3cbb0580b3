"""``superoptimize``: exhaustive µGraph search (full mode) or stored-structure reuse (fast mode) for one program.

Full mode
    1. The exhaustive search (:func:`gensorage.exhaustive.run.runner.run_search`: checkpointed, resumable, within
       the time budget; Ctrl-C keeps what was found) runs at the preset's small *search shapes* for a bundled
       benchmark program, else at the program's own shapes.
    2. Its top candidates are re-instantiated at the requested shapes (:mod:`.reshape_structure`: grids and
       loops constructed again) and ranked by the µGraph cost model together with the direct µGraph (one
       kernel per op), so the answer is never worse than the naive program by that model. On a machine with
       a GPU the leading candidates and the direct µGraph are timed on the device instead and the fastest
       measured wins.
    3. The winner is re-verified against the program at the requested δ (:func:`gensorage.verify.equivalent`)
       and lowered by the code generator; a candidate failing either is skipped for the next.
    4. The search's candidates are stored as the program's *structure* (:mod:`.structure_store`), keyed by
       (structure key, GPU, gensorage version).

Fast mode
    The stored structure of the program is re-instantiated at the requested shapes, verified and lowered, in
    seconds, chosen by the cost model (nothing is timed on the device); without a stored structure (or if none
    of its graphs carries over) the direct µGraph is used and the code generator constructs its kernels'
    schedules. The result says which happened and why.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from gensorage.errors import (
    ConfigError,
    GensorageError,
    ProgramError,
    ScheduleError,
    UGraphError,
    UnsupportedOpError,
)
from gensorage.interrupts import StopRequests, stop_requests
from gensorage.program import Program, config_dir, dump_program, parse_program
from gensorage.superopt.gpu import gpu_name, gpu_unavailable_reason, measure_ugraph
from gensorage.superopt.presets import (
    DEFAULT_DELTA,
    DEFAULT_TOP_K,
    DEFAULT_VERIFY_MAX_ELEMENTS,
    DEFAULT_VERIFY_MAX_TRIALS,
    Preset,
    find_preset,
    load_preset,
)
from gensorage.superopt.reshape_structure import ReshapeFailed, reinstantiate, structure_signature
from gensorage.superopt.structure_store import StructureRecord, StructureStore
from gensorage.ugraph import KernelGraph, from_program
from gensorage.verify.equivalent import VerificationStopped

if TYPE_CHECKING:
    from gensorage.codegen.module import CompiledUGraph
    from gensorage.hw.profile import HwProfile
    from gensorage.store import Store
    from gensorage.verify.equivalent import EquivalenceResult

Mode = Literal["full", "fast"]
MODES: tuple[str, ...] = ("full", "fast")
#: GPU profiling of full mode: how many of the best-predicted candidates are timed, and how often each.
PROFILE_TOP = 3
PROFILE_WARMUP = 5
PROFILE_REPEATS = 50
PROFILE_BUDGET_S = 2.0  # per candidate: a slow one is timed on fewer samples (see gpu.median_time)
#: Search candidates (distinct structures) that carry over to the requested shapes are kept up to MAX_CARRY;
#: up to MAX_TRIED are tried, and kept in the store. What is best at the small search shapes often does not fit
#: at large ones (attention without a loop over the keys: at 7 keys the whole K tile fits, at 4096 it outgrows
#: shared memory), so trying stops at the first MAX_CARRY that fit, not at the first MAX_CARRY tried.
MAX_CARRY = 32
MAX_TRIED = 256


# ============================================================================================ the result


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
        return {"verified": self.verified, "method": self.method,
                "report": None if self.report is None else self.report.to_json(),
                "search_report": self.search_report, "note": self.note}


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
            "program": p.name, "params": dict(p.params), "program_key": p.key(),
            "structure_key": p.structure_key(), "hw": self.hw.name, "mode": self.mode,
            "num_kernels": self.num_kernels, "naive_num_kernels": self.naive_num_kernels,
            "predicted_time_s": self.predicted_time_s, "naive_predicted_time_s": self.naive_predicted_time_s,
            "speedup": self.speedup, "direct": self.is_direct, "verified": bool(self.equivalence),
            "equivalence": self.equivalence.to_json(), "from_store": self.from_store,
            "fallback_reason": self.fallback_reason, "selection": self.selection,
            "search_time_s": self.search_time_s, "timings": dict(self.timings), "complete": self.complete,
            "stopped_by": self.stopped_by, "search_params": self.search_params,
            "search_stats": self.search_stats, "measured": self.measured, "notes": list(self.notes),
            "seed": self.seed, "origin": self.origin, "ugraph": self.best.to_json(),
        }

    def summary(self) -> str:
        """A few lines for people: what was found, how fast, how it was checked."""
        p = self.program
        params = ", ".join(f"{k}={v}" for k, v in p.params.items())
        lines = [
            f"program {p.name}" + (f" ({params})" if params else "") + f" on {self.hw.name}, {self.mode} mode",
            f"  best µGraph: {self.num_kernels} kernel(s) (direct: {self.naive_num_kernels}); predicted "
            f"{_fmt_time(self.predicted_time_s)} vs {_fmt_time(self.naive_predicted_time_s)} direct "
            f"({self.speedup:.2f}x); chosen by {self.selection}",
            "  " + str(self.equivalence).replace("\n", "\n  "),
        ]
        if self.from_store:
            lines.append(f"  re-used the stored structure found at {self.search_params}")
        if self.fallback_reason:
            lines.append(f"  direct µGraph used: {self.fallback_reason}")
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


# ======================================================================================= program sources


@dataclass(frozen=True, slots=True)
class ProgramSource:
    """A program at the requested shapes, with the text it came from (to instantiate it at other shapes)."""

    program: Program
    text: str | None
    name: str


def resolve_program(program: Program | str | os.PathLike[str], params: Mapping[str, int] | None = None
                    ) -> ProgramSource:
    """``program`` as a :class:`ProgramSource`: a Program, a ``.gsp`` path, or a bundled config name."""
    if isinstance(program, Program):
        if params:
            raise ConfigError("params apply to a program file or config name, not to a built Program")
        return ProgramSource(program, _config_text_for(program), program.name)
    text_name = os.fspath(program)
    path = Path(text_name).expanduser()
    if not path.is_file():
        if path.is_dir():
            raise ConfigError(f"{text_name}: is a directory, not a program file")
        if path.suffix or os.sep in text_name:
            raise ConfigError(f"{text_name}: no such program file")
        path = config_dir() / f"{text_name}.gsp"
        if not path.is_file():
            from gensorage.program import list_configs

            known = ", ".join(p.stem for p in list_configs()) or "none"
            raise ConfigError(f"no program file or bundled config named '{text_name}' (configs: {known})")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read program file: {exc}") from None
    p = parse_program(text, params=params, source=str(path), default_name=path.stem)
    return ProgramSource(p, text, path.stem)


def _config_text_for(p: Program) -> str | None:
    """The bundled config a built Program was instantiated from (same name, same key at its params), if any."""
    path = config_dir() / f"{p.name}.gsp"
    if not p.params or not path.is_file():
        return None
    try:
        text = path.read_text(encoding="utf-8")
        if parse_program(text, params=p.params, source=str(path)).key() == p.key():
            return text
    except (OSError, GensorageError):
        return None
    return None


def _resolve_preset(preset: Preset | str | None, src: ProgramSource) -> tuple[Preset | None, bool]:
    """(the preset, whether the caller named it); an automatic one is the preset named like the program."""
    if isinstance(preset, Preset):
        return preset, True
    if isinstance(preset, str):
        return load_preset(preset), True
    if find_preset(src.name) is None:
        return None, False
    auto = load_preset(src.name)
    return (auto, False) if auto.program == src.name else (None, False)


def _search_program(src: ProgramSource, preset: Preset | None, explicit: bool, notes: list[str]) -> Program:
    """The program at the preset's search shapes (or the program itself when there are none)."""
    p = src.program
    if preset is None or not preset.search_params:
        return p
    if src.text is None:
        notes.append(f"preset '{preset.name}' has search shapes, but the program has no source text to "
                     "instantiate at them: searching at its own shapes")
        return p
    try:
        small = parse_program(src.text, params=preset.search_params, source=f"preset {preset.name}",
                              default_name=src.name)
    except GensorageError as exc:
        if explicit:
            raise ConfigError(f"preset '{preset.name}': its search_params do not fit the program: {exc}") from None
        notes.append(f"preset '{preset.name}' does not fit this program ({exc}); searching at its own shapes")
        return p
    if small.structure_key() != p.structure_key():
        if explicit:
            raise ConfigError(f"preset '{preset.name}': the program at its search shapes has another structure")
        notes.append(f"preset '{preset.name}' changes the program's structure; searching at its own shapes")
        return p
    return small


# ============================================================================================= helpers


class _Progress:
    def __init__(self, enabled: bool, stream: Any = None) -> None:
        self.enabled = enabled
        self.stream = stream

    def __call__(self, msg: str) -> None:
        if self.enabled:
            print(f"superopt: {msg}", file=self.stream or sys.stderr, flush=True)


def _fmt_time(t: float) -> str:
    if not math.isfinite(t):
        return "inf"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if t >= scale:
            return f"{t / scale:.3g} {unit}"
    return f"{t * 1e9:.3g} ns"


def _cost_fn(hw: HwProfile) -> Callable[[KernelGraph], float]:
    from gensorage.ugraph.cost import predict_time

    return lambda g: float(predict_time(g, hw))


def _load_hw(hw: str | HwProfile) -> HwProfile:
    from gensorage.hw import HwProfile as Profile
    from gensorage.hw import load_profile

    return hw if isinstance(hw, Profile) else load_profile(hw)


def _elements(p: Program) -> int:
    """Elements of every tensor of the program (what one verification trial holds, roughly, per side)."""
    return sum(math.prod(n.shape) for n in p.nodes)


@dataclass(slots=True)
class _Option:
    """One µGraph competing for the answer at the requested shapes."""

    graph: KernelGraph
    predicted_time_s: float
    origin: str  # "direct", "search #i", "stored #i"
    search_graph: KernelGraph | None = None  # the same structure at the search / stored shapes
    search_report: dict[str, Any] | None = None
    measured_s: float | None = None


def _rank(options: list[_Option]) -> list[_Option]:
    """Best first: measured time when there is one, else predicted; the direct µGraph wins ties."""
    return sorted(options, key=lambda o: (o.measured_s if o.measured_s is not None else math.inf,
                                          o.predicted_time_s, o.origin != "direct"))


def _verify(p: Program, opt: _Option, delta: float, preset: Preset | None, seed: int,
            should_stop: Callable[[], bool] | None = None) -> Verification:
    from gensorage.verify.equivalent import equivalent

    if opt.origin == "direct":
        return Verification(True, "direct µGraph")
    max_trials = preset.verify_max_trials if preset is not None else DEFAULT_VERIFY_MAX_TRIALS
    limit = preset.verify_max_elements if preset is not None else DEFAULT_VERIFY_MAX_ELEMENTS
    n = _elements(p)
    if n > limit:
        ok = bool(opt.search_report and opt.search_report.get("equivalent", True))
        return Verification(ok, "search shapes", search_report=opt.search_report,
                            note=f"the program holds {n} elements at these shapes (limit {limit}): the µGraph "
                                 "was checked at the search shapes only")
    report = equivalent(p, opt.graph, delta, seed=seed, max_trials=max_trials, should_stop=should_stop)
    note = None
    if report.capped:
        note = (f"verification capped at {report.trials} trials (δ reached {report.achieved_delta:.3g}, "
                f"not {delta:g})")
    return Verification(bool(report), "equivalence check", report=report, search_report=opt.search_report,
                        note=note)


def _try_compile(g: KernelGraph, hw: HwProfile, seed: int) -> tuple[CompiledUGraph | None, GensorageError | None]:
    from gensorage.codegen.module import compile_ugraph

    try:
        return compile_ugraph(g, hw, "cuda", seed=seed), None
    except (UnsupportedOpError, ScheduleError, UGraphError, ProgramError) as exc:
        return None, exc


# ============================================================================================ the API


def superoptimize(
    program: Program | str | os.PathLike[str],
    hw: str | HwProfile = "h100",
    mode: str = "full",
    time_budget_s: float | None = None,
    checkpoint: str | os.PathLike[str] | None = None,
    *,
    params: Mapping[str, int] | None = None,
    seed: int = 0,
    workers: int | None = None,
    preset: Preset | str | None = None,
    store: Store | str | os.PathLike[str] | None = None,
    use_store: bool = True,
    progress: bool = True,
    delta: float | None = None,
) -> SuperoptResult:
    """Superoptimise ``program`` for the GPU ``hw``.

    Parameters
    ----------
    program : Program, path or str
        A :class:`~gensorage.program.Program`, a ``.gsp`` file, or the name of a bundled benchmark program
        (``configs/programs/<name>.gsp``).
    hw : str or HwProfile
        Hardware profile name (``configs/hw/<hw>.toml``) or a loaded profile.
    mode : {"full", "fast"}
        ``"full"``: exhaustive search (see the module docstring). ``"fast"``: re-use the structure a full run
        stored for this program and GPU, at the new shapes; without one, the direct µGraph.
    time_budget_s : float, optional
        Wall-time budget of the search (full mode); default: the preset's, else none. The search stops
        dispatching work when it is spent and the best of what was found is returned.
    checkpoint : path, optional
        The search's SQLite checkpoint (default: one per search spec under ``$GENSORAGE_HOME``); an existing
        one for the same search is resumed.
    params : mapping, optional
        Program params (for a file or config name).
    seed : int
        Seeds the search's construction and verification, the grid construction and the final check.
    workers : int, optional
        Search worker processes (default: the usable cores).
    preset : Preset or str, optional
        Search shapes and limits (default: ``configs/presets/<program name>.toml`` when it exists).
    store : Store or path, optional
        The result store holding structures (default ``$GENSORAGE_HOME/store.sqlite``).
    use_store : bool
        Read (fast mode) and write (full mode) structures in the store.
    progress : bool
        Report progress on stderr.
    delta : float, optional
        False-accept probability of the equivalence checks (default: the preset's, else 1e-9).

    Returns
    -------
    SuperoptResult

    Raises
    ------
    SuperoptInterrupted
        Ctrl-C during the search; ``.result`` is the best of what was found.
    ConfigError, ProgramError, StoreError
        Bad program, preset, profile, budget or store.
    """
    start = time.perf_counter()
    if mode not in MODES:
        raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if time_budget_s is not None and not (time_budget_s > 0 and math.isfinite(time_budget_s)):
        raise ConfigError(f"time budget must be a positive number of seconds, got {time_budget_s!r}")
    say = _Progress(progress)
    notes: list[str] = []
    profile = _load_hw(hw)
    src = resolve_program(program, params)
    chosen_preset, explicit = _resolve_preset(preset, src)
    d = delta if delta is not None else (chosen_preset.delta if chosen_preset else DEFAULT_DELTA)
    if not 0 < d < 1:
        raise ConfigError(f"delta must be in (0, 1), got {d!r}")
    run = _Run(src, profile, chosen_preset, d, seed, say, notes, start, store, use_store)
    with stop_requests() as run.stops:
        if mode == "fast":
            return run.fast()
        return run.full(explicit, time_budget_s, checkpoint, workers, progress,
                        hw if isinstance(hw, str) else profile.name)


@dataclass(slots=True)
class _Run:
    src: ProgramSource
    hw: HwProfile
    preset: Preset | None
    delta: float
    seed: int
    say: _Progress
    notes: list[str]
    start: float
    store: Any
    use_store: bool
    timings: dict[str, float] = field(default_factory=dict)
    _cost: Callable[[KernelGraph], float] | None = None
    stops: StopRequests = field(default_factory=StopRequests)
    _presses: int = 0  # Ctrl-C presses before the current phase (see begin_choosing)

    @property
    def program(self) -> Program:
        return self.src.program

    def cost(self, g: KernelGraph) -> float:
        if self._cost is None:
            self._cost = _cost_fn(self.hw)
        return self._cost(g)

    @property
    def top_k(self) -> int:
        return self.preset.top_k if self.preset else DEFAULT_TOP_K

    def direct(self) -> _Option:
        g = from_program(self.program)
        return _Option(g, self.cost(g), "direct")

    def _tick(self, phase: str, t0: float) -> None:
        self.timings[phase] = self.timings.get(phase, 0.0) + time.perf_counter() - t0

    def begin_choosing(self) -> None:
        """From here a Ctrl-C (even after one that stopped the search) ends the choice with the direct µGraph."""
        self._presses = self.stops.grace()

    def stop_requested(self) -> bool:
        return self.stops.count > self._presses

    def interrupted(self) -> bool:
        """Ctrl-C was pressed during the call (the result is then raised in :class:`SuperoptInterrupted`)."""
        return self.stops.count > 0

    # --------------------------------------------------------------------------------------- choosing
    def carry_over(self, graphs: Sequence[tuple[KernelGraph, dict[str, Any] | None]], at: Program,
                   label: str, keep: int) -> list[_Option]:
        """The graphs (µGraphs of ``at``) rebuilt at the requested shapes, the ``keep`` predicted fastest.

        Graphs of one structure (same :func:`structure_signature`) are tried once, in order, until
        :data:`MAX_CARRY` carried over or :data:`MAX_TRIED` were tried. Those that do not carry over are noted.
        """
        t0 = time.perf_counter()
        same = at.key() == self.program.key()
        options: list[_Option] = []
        seen: set[str] = set()
        failed = 0
        for i, (g, report) in enumerate(graphs):
            sig = structure_signature(g)
            if sig in seen:
                continue
            if len(options) >= MAX_CARRY or len(seen) >= MAX_TRIED:
                break
            if self.stop_requested():
                self.notes.append(f"interrupted: {len(seen)} of the {label} structures were tried")
                break
            seen.add(sig)
            try:
                new = g if same else reinstantiate(g, at, self.program, self.hw, self.cost, seed=self.seed)
                options.append(_Option(new, self.cost(new), f"{label} #{i}", g, report))
            except (ReshapeFailed, GensorageError) as exc:
                failed += 1
                if failed <= 3:
                    self.notes.append(f"{label} candidate #{i} does not carry over to these shapes: {exc}")
        if failed > 3:
            self.notes.append(f"... {failed} of {len(seen)} {label} structures tried do not carry over")
        self._tick("reinstantiate", t0)
        return sorted(options, key=lambda o: o.predicted_time_s)[:keep]

    def choose(self, options: list[_Option], measure: bool
               ) -> tuple[_Option, Verification, Any, GensorageError | None, str]:
        """Rank, measure on the GPU if asked and there is one, then take the first that verifies and lowers."""
        selection = "cost model"
        gpu = gpu_unavailable_reason() if measure else "fast mode does not measure"
        ranked = _rank(options)
        if gpu is None:  # the direct µGraph is timed too: a candidate the cost model overrates must not beat it
            top = ranked[:PROFILE_TOP]
            selection = self.profile_on_gpu(top + [o for o in ranked if o.origin == "direct" and o not in top])
            ranked = _rank(options)
        elif len(options) > 1 and measure:
            self.notes.append(f"chosen by the cost model, not measured: {gpu}")
        for opt in ranked:
            if self.stop_requested():
                return self.direct_on_interrupt(options, selection)
            t0 = time.perf_counter()
            self.say(f"verifying {opt.origin} ({opt.predicted_time_s:.3g} s predicted)")
            try:
                ver = _verify(self.program, opt, self.delta, self.preset, self.seed, self.stop_requested)
            except VerificationStopped:
                self._tick("verify", t0)
                return self.direct_on_interrupt(options, selection)
            except GensorageError as exc:
                self.notes.append(f"{opt.origin}: verification failed to run: {exc}")
                self._tick("verify", t0)
                continue
            self._tick("verify", t0)
            if not ver:
                self.notes.append(f"{opt.origin}: rejected by the equivalence check ({ver})")
                continue
            t0 = time.perf_counter()
            self.say(f"lowering {opt.origin} to kernels")
            compiled, error = _try_compile(opt.graph, self.hw, self.seed)
            self._tick("codegen", t0)
            if compiled is None and opt.origin != "direct":
                self.notes.append(f"{opt.origin}: the code generator cannot lower it: {error}")
                continue
            if error is not None:
                self.notes.append(f"the code generator cannot lower the direct µGraph: {error}")
            return opt, ver, compiled, error, selection
        raise AssertionError("the direct µGraph is always among the options and always verifies")

    def direct_on_interrupt(self, options: list[_Option], selection: str
                            ) -> tuple[_Option, Verification, Any, GensorageError | None, str]:
        """Ctrl-C while choosing: the direct µGraph (equal by construction; its kernels are built on demand)."""
        self.notes.append("interrupted while checking the candidates at these shapes: the direct µGraph is "
                          "reported (a rerun resumes from the search's checkpoint)")
        direct = next(o for o in options if o.origin == "direct")
        return direct, Verification(True, "direct µGraph"), None, None, selection

    def profile_on_gpu(self, options: list[_Option]) -> str:
        t0 = time.perf_counter()
        for opt in options:
            if self.stop_requested():
                break
            compiled, error = _try_compile(opt.graph, self.hw, self.seed)
            if compiled is None:
                self.notes.append(f"{opt.origin}: not profiled, the code generator cannot lower it: {error}")
                continue
            try:
                opt.measured_s = measure_ugraph(compiled, self.program, seed=self.seed, warmup=PROFILE_WARMUP,
                                                repeats=PROFILE_REPEATS, budget_s=PROFILE_BUDGET_S).median_s
            except GensorageError as exc:
                self.notes.append(f"{opt.origin}: profiling failed: {exc}")
            self.say(f"measured {opt.origin}: {opt.measured_s}")
        self._tick("profile", t0)
        return f"median of up to {PROFILE_REPEATS} samples on {gpu_name()}"

    def result(self, mode: str, options: list[_Option], **extra: Any) -> SuperoptResult:
        direct = next(o for o in options if o.origin == "direct")
        opt, ver, compiled, error, selection = self.choose(options, measure=mode == "full")
        measured = {o.origin: o.measured_s for o in options if o.measured_s is not None} or None
        return SuperoptResult(
            program=self.program, hw=self.hw, mode=mode, best=opt.graph, predicted_time_s=opt.predicted_time_s,
            naive_predicted_time_s=direct.predicted_time_s, equivalence=ver,
            search_time_s=time.perf_counter() - self.start, selection=selection, timings=self.timings,
            notes=self.notes, measured=measured, seed=self.seed, origin=opt.origin, _compiled=compiled,
            _compile_error=error, **extra)

    # ------------------------------------------------------------------------------------------ fast
    def fast(self) -> SuperoptResult:
        self.begin_choosing()
        result = self._fast()
        if self.interrupted():
            result.stopped_by = "interrupt"
            raise SuperoptInterrupted(result)
        return result

    def _fast(self) -> SuperoptResult:
        direct = self.direct()
        record: StructureRecord | None = None
        if self.use_store:
            t0 = time.perf_counter()
            with StructureStore(self.store) as st:
                record = st.get(self.program.structure_key(), self.hw.name)
            self._tick("store", t0)
        if record is None:
            reason = ("no structure stored for this program and GPU (run full mode once)" if self.use_store
                      else "the store is not used")
            self.say(f"{reason}; using the direct µGraph")
            return self.result("fast", [direct], fallback_reason=reason)
        self.say(f"re-instantiating the stored structure (found at {record.params or 'its shapes'})")
        stored = record.program()
        options = self.carry_over([(g, record.report(i)) for i, g in enumerate(record.ugraphs)], stored, "stored",
                                  self.top_k)
        if not options:
            reason = "no stored µGraph carries over to these shapes (see notes)"
            return self.result("fast", [direct], fallback_reason=reason, search_params=record.params)
        result = self.result("fast", [direct, *options], search_params=record.params)
        # A stored direct µGraph means the search found nothing better: the direct answer then comes from the store.
        stored_direct = record.ugraphs[0] == from_program(stored)
        result.from_store = result.origin.startswith("stored") or stored_direct
        if not result.from_store:
            result.fallback_reason = "no stored µGraph is faster at these shapes by the cost model (or verifies)"
        return result

    # ------------------------------------------------------------------------------------------ full
    def full(self, explicit: bool, time_budget_s: float | None, checkpoint: Any, workers: int | None,
             progress: bool, hw_name: str) -> SuperoptResult:
        from gensorage.exhaustive.run.runner import SearchInterrupted, run_search
        from gensorage.exhaustive.spec import SearchSpec

        small = _search_program(self.src, self.preset, explicit, self.notes)
        budget = time_budget_s if time_budget_s is not None else (self.preset.time_budget_s if self.preset else None)
        limits = dict(self.preset.search) if self.preset else {}
        spec = SearchSpec(program=small, hw=hw_name, seed=self.seed, delta=self.delta, **limits)
        if small is not self.program:
            self.say(f"searching at {small.params} (preset '{self.preset.name if self.preset else ''}')")
        t0 = time.perf_counter()
        interrupted = False
        try:
            sr = run_search(spec, checkpoint=checkpoint, workers=workers, time_budget_s=budget, progress=progress)
        except SearchInterrupted as exc:
            sr, interrupted = exc.result, True
        self._tick("search", t0)
        self.begin_choosing()
        found = [(c.ugraph, dict(c.equivalence)) for c in sr.candidates]
        self.say(f"search: {len(sr.candidates)} verified candidate(s); {sr.tasks_done}/{sr.tasks_total} tasks")
        options = [self.direct(), *self.carry_over(found, small, "search", self.top_k)]
        best = sr.candidates[0] if sr.candidates else None
        stats = {"stats": _stats_json(sr.stats), "tasks_done": sr.tasks_done, "tasks_total": sr.tasks_total,
                 "tasks_resumed": sr.tasks_resumed, "candidates": len(sr.candidates),
                 "search_elapsed_s": sr.elapsed_s, "checkpoint": str(sr.checkpoint_path),
                 # What the search found at its own shapes (before re-instantiation at the requested ones).
                 "at_search_shapes": {
                     "best_predicted_time_s": None if best is None else best.predicted_time_s,
                     "best_kernels": None if best is None else len(best.ugraph.ops),
                     "naive_predicted_time_s": self.cost(from_program(small)),
                     "naive_kernels": len(from_program(small).ops)}}
        result = self.result("full", options, search_stats=stats, complete=sr.complete,
                             stopped_by=sr.stopped_by, search_params=dict(small.params))
        if self.use_store:
            with self.stops.critical():
                self.save(small, found, sr, result)
        if interrupted or self.interrupted():
            result.stopped_by = result.stopped_by or "interrupt"
            raise SuperoptInterrupted(result)
        return result

    def save(self, small: Program, found: list[tuple[KernelGraph, Any]], sr: Any, result: SuperoptResult) -> None:
        """Store the search's verified candidates as this program's structure (the one chosen at the requested
        shapes first; the direct µGraph when a complete search found none). An incomplete search does not
        replace what a complete one stored."""
        if not found and not sr.complete:
            return  # an unfinished search that found nothing has learnt nothing worth storing
        t0 = time.perf_counter()
        entries = _distinct(found)[:MAX_TRIED] or [(from_program(small), None)]
        if result.origin.startswith("search #"):
            chosen = found[int(result.origin.split("#")[1])]
            entries = [chosen, *(e for e in entries if e[0] != chosen[0])]
        with StructureStore(self.store) as st:
            old = st.get(self.program.structure_key(), self.hw.name)
            if old is not None and old.search.get("complete") and not sr.complete:
                self.notes.append("an earlier complete search's structure is kept in the store")
                self._tick("store", t0)
                return
            st.put(StructureRecord(
                structure_key=self.program.structure_key(), hw=self.hw.name, version=_version(),
                program_text=dump_program(small), params=dict(small.params),
                ugraphs=tuple(g for g, _ in entries), reports=tuple(r for _, r in entries),
                predicted_time_s=self.cost(entries[0][0]), naive_predicted_time_s=self.cost(from_program(small)),
                search={"complete": sr.complete, "candidates": len(sr.candidates), "tasks_done": sr.tasks_done,
                        "tasks_total": sr.tasks_total}))
        self._tick("store", t0)


def _distinct(found: list[tuple[KernelGraph, Any]]) -> list[tuple[KernelGraph, Any]]:
    """One graph per structure signature, in the given order."""
    seen: set[str] = set()
    out = []
    for g, report in found:
        sig = structure_signature(g)
        if sig not in seen:
            seen.add(sig)
            out.append((g, report))
    return out


def _stats_json(stats: Any) -> dict[str, Any]:
    to_json = getattr(stats, "to_json", None)
    return dict(to_json()) if callable(to_json) else {}


def _version() -> str:
    from gensorage import __version__

    return __version__


__all__ = ["MODES", "ProgramSource", "SuperoptInterrupted", "SuperoptResult", "Verification", "resolve_program",
           "superoptimize"]

"""The per-shape dispatch cache: compiled CPU kernels by program shape, structures by program structure.

A model runs one program at many shapes (sequence lengths, batch sizes). :class:`Dispatcher` keeps

* per *shape* (the program's :meth:`~gensorage.program.Program.key`): the built llvm kernels with a prepared
  launch sequence (:class:`~gensorage.codegen.runner.KernelRunner`), or the CUDA kernels for a caller whose
  tensors are on a GPU (``target="cuda"``: no llvm build then), so a repeated shape costs a dictionary
  look-up — or nothing, for a caller that holds the entry — plus the launches;
* per *structure* (:meth:`~gensorage.program.Program.structure_key`): the µGraph chosen at the first shape
  seen, by :func:`~gensorage.superopt.superoptimize` (fast mode: a stored structure, else the direct µGraph;
  full mode: the search). A new shape of a known structure does not call ``superoptimize`` again: the chosen
  µGraph is re-instantiated at the new shape (:func:`.reinstantiate`), checked there, lowered for the one
  target asked for and built. Its lowering constructs each matmul's schedule from the one built at the nearest
  shape seen (:func:`gensorage.construction.warm_starts`): a descent from a good state instead of a whole
  construction. The direct µGraph needs no re-instantiation and no check (it is the program, op by op); a
  re-instantiated one is checked by :func:`gensorage.verify.equivalent` at the new shape (what full mode does),
  and one that does not carry over, verify or, for CUDA kernels, launch on the GPU
  (:func:`gensorage.codegen.kernel_fit.launch_problem`; re-instantiation itself takes grids that launch) gives
  way to the direct µGraph, with the reason in ``notes``.

The llvm kernels come from compiled *variants* (:mod:`gensorage.codegen.symbolic_kernels`): kernels built at
earlier shapes with their length-dependent literals as parameters, so a new shape builds only the kernels no
variant covers, and none where every kernel is covered (``symbolic=False``: every new shape builds its kernels).
Those builds are tiered (``tiered=True``, the default): the kernels are first built without LLVM's optimisation,
which serves the shape in about half the build time, and rebuilt at the full level in a background thread; the
rebuilt functions replace the first tier's in every prepared runner that calls them (:meth:`Dispatcher.relink`),
so a shape's steady state runs the fully optimised kernels. :meth:`Dispatcher.wait_rebuilds` waits for the
rebuilds (a benchmark does before it times the steady state). With tiers the llvm variants are generic at first
sight, as the CUDA ones below (text kernels' literals parameters, tensor-core matmuls' and row kernels' rows TIR
variables), and a shape's own kernels are built in the background and replace them.

The CUDA kernels come from compiled variants too, generic from the first shape on (every length-dependent
literal a parameter, tensor-core matmuls lowered with their length-dependent extents as TIR variables,
:mod:`gensorage.codegen.generic_matmul`, row kernels with the first shape's rows a block and the rows TIR
variables, :mod:`gensorage.codegen.generic_rows`), so a new shape whose kernels keep their skeletons makes no
compiler call; the shape's own kernels are built in the background and replace them. One token too: the choices
the lowering and row fusion make by value where a dim is 1 are the first shape's where exact
(:mod:`gensorage.folds`), so its kernels keep their skeletons.

Counters (:class:`DispatchStats`) say what each request cost: a hit, a new shape of a known structure, or a new
structure.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gensorage.codegen.generic_matmul import generic_matmuls
from gensorage.codegen.script_templates import deferred_templates
from gensorage.codegen.ugraph_tir import Target
from gensorage.construction import warm_starts
from gensorage.errors import GensorageError, ScheduleError, UnsupportedOpError
from gensorage.folds import same_folds, scope
from gensorage.precision import DEFAULT_PRECISION
from gensorage.program import Program
from gensorage.superopt.presets import (
    DEFAULT_DELTA,
    DEFAULT_VERIFY_MAX_ELEMENTS,
    DEFAULT_VERIFY_MAX_TRIALS,
    Preset,
)
from gensorage.superopt.result import Verification
from gensorage.ugraph import KernelGraph, from_program

if TYPE_CHECKING:
    from gensorage.codegen.module import CompiledUGraph
    from gensorage.codegen.runner import KernelRunner
    from gensorage.codegen.symbolic_kernels import SymbolicKernels
    from gensorage.hw.profile import HwProfile

DIRECT = "direct µGraph"


@dataclass(slots=True)
class DispatchStats:
    """What the requests to one :class:`Dispatcher` cost (``builds``: ``tvm.compile`` calls)."""

    hits: int = 0  # shape seen before: nothing built
    new_shapes: int = 0  # new shape of a known structure: re-instantiated (or direct) and built
    new_structures: int = 0  # first shape of a structure: superoptimize ran
    direct_fallbacks: int = 0  # a chosen µGraph that did not carry over or verify at a new shape
    builds: int = 0  # tvm.compile calls: a new shape whose kernels all have compiled variants makes none


@dataclass(frozen=True, slots=True)
class ShapeKernels:
    """The built kernels of one program at one shape, and how their µGraph was obtained and checked."""

    program: Program
    graph: KernelGraph
    origin: str  # superoptimize's origin at the first shape ("direct", "stored #0", "search #3")
    equivalence: Verification
    compiled: CompiledUGraph  # lowered for ``target`` and built
    runner: KernelRunner | None  # llvm only; None: the µGraph returns an input or a view (``run`` serves it)
    reused: bool  # a known structure instantiated at this shape (no superoptimize call)
    ready_s: float  # wall time from the request to built kernels
    timings: dict[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    target: Target = "llvm"

    @property
    def num_kernels(self) -> int:
        return len(self.graph.ops)

    def run(self, *arrays: Any, target: str = "cpu") -> list[Any]:
        """The kernels on numpy arrays (the general path of :meth:`CompiledUGraph.run`)."""
        return list(self.compiled.run(*arrays, target=target))


@dataclass(frozen=True, slots=True)
class _Structure:
    program: Program  # the shape the µGraph was chosen at
    graph: KernelGraph
    origin: str


class Dispatcher:
    """Per-shape cache of built kernels over per-structure chosen µGraphs (see the module docstring).

    Parameters
    ----------
    hw : str or HwProfile
        The GPU profile the µGraphs are chosen and constructed for.
    mode : {"fast", "full"}
        How :func:`~gensorage.superopt.superoptimize` chooses a structure's µGraph at its first shape.
    time_budget_s : float, optional
        Full mode's search budget.
    store, use_store
        The structure store ``superoptimize`` reads (fast) and writes (full).
    seed, delta, precision, preset, workers
        As for :func:`~gensorage.superopt.superoptimize`; ``delta`` also bounds the check at new shapes.
    symbolic : bool
        Serve kernels from compiled variants (:mod:`gensorage.codegen.symbolic_kernels`; default; on CUDA
        generic ones) rather than building every kernel at every new shape.
    tiered : bool
        Build the variants a shape misses without LLVM's optimisation first and at the full level in the
        background (default; with ``symbolic`` only), rather than at the full level before serving the shape.
        On CUDA: build each shape's own kernels in the background to replace the generic variants, and serve a
        structure's first shape from its own kernels while its generic variants are built in the background
        (default), rather than serve every shape from the generic variants, built in the foreground.
    """

    def __init__(
        self,
        hw: str | HwProfile = "h100",
        mode: str = "fast",
        time_budget_s: float | None = None,
        *,
        store: Any = None,
        use_store: bool = True,
        seed: int = 0,
        delta: float = DEFAULT_DELTA,
        precision: str = DEFAULT_PRECISION,
        preset: Preset | str | None = None,
        workers: int | None = None,
        symbolic: bool = True,
        tiered: bool = True,
    ) -> None:
        from gensorage.superopt.api import _load_hw

        self.hw = _load_hw(hw)
        self.mode = mode
        self.time_budget_s = time_budget_s
        self.store = store
        self.use_store = use_store
        self.seed = seed
        self.delta = delta
        self.precision = precision
        self.preset = preset
        self.workers = workers
        self.symbolic = symbolic
        self.tiered = tiered
        self._variants: dict[Target, SymbolicKernels] = {}
        self.stats = DispatchStats()
        self._shapes: dict[tuple[str, Target], ShapeKernels] = {}
        self._structures: dict[str, _Structure] = {}
        self._row_folds: dict[Hashable, tuple[str, ...]] = {}  # row fusion's choices at first shapes (_fused)

    def kernels(self, program: Program, target: Target = "llvm") -> ShapeKernels:
        """The built kernels of ``program`` at its shapes for ``target`` (cached by its key and the target).

        ``"llvm"`` builds CPU kernels with a prepared runner; ``"cuda"`` builds the CUDA kernels for the
        dispatcher's profile (no GPU needed to build; :mod:`gensorage.torch.device` runs them).

        Raises
        ------
        GensorageError
            The program cannot be superoptimised, verified or built (nothing is cached then).
        """
        key = (program.key(), target)
        entry = self._shapes.get(key)
        if entry is not None:
            self.stats.hits += 1
            return entry
        variants = self._symbolic(target)
        rebuilds = variants.rebuilds if variants is not None else 0
        entry = self._build(program, target)
        self._shapes[key] = entry
        if variants is not None:
            if variants.rebuilds != rebuilds and entry.runner is not None:
                # a rebuild swapped in during this build may have told the runners before this one was listed
                entry.runner.relink(entry.compiled.executable(target))
            variants.start_rebuilds()  # now that the shape is served (see SymbolicKernels.start_rebuilds)
        return entry

    def wait_rebuilds(self, timeout: float | None = None) -> None:
        """Wait for the background rebuilds of first-tier kernels started so far (``tiered``)."""
        for variants in list(self._variants.values()):
            variants.wait_rebuilds(timeout)

    def relink(self) -> None:
        """Every prepared llvm runner looks its functions up again (after a rebuild of first-tier kernels)."""
        for entry in list(self._shapes.values()):
            if entry.target == "llvm" and entry.runner is not None:
                entry.runner.relink(entry.compiled.executable("llvm"))

    def __len__(self) -> int:
        return len(self._shapes)

    # ------------------------------------------------------------------------------------------ misses
    def _build(self, p: Program, target: Target) -> ShapeKernels:
        start = time.perf_counter()
        timings: dict[str, float] = {}
        notes: list[str] = []
        known = self._structures.get(p.structure_key())
        if known is None:
            graph, ver, origin = self._superoptimize(p)
            self.stats.new_structures += 1
        else:
            graph, ver = self._carry(known, p, timings, notes, target)
            origin = known.origin if ver.method != DIRECT or known.origin == "direct" else "direct"
            self.stats.new_shapes += 1
        symbolic = self._symbolic(target)
        if known is None:
            compiled, runner, builds = _build_kernels(
                graph, self.hw, self.seed, timings, target, symbolic, notes, first=True
            )
        else:  # constructions start from the nearest shape built before (gensorage.construction.warm_starts);
            # a new skeleton's template waits until the skeleton recurs (script_templates.deferred_templates)
            with warm_starts(), deferred_templates():
                compiled, runner, builds = _build_kernels(
                    graph, self.hw, self.seed, timings, target, symbolic, notes
                )
        self.stats.builds += builds
        if known is None:
            self._structures[p.structure_key()] = _Structure(p, graph, origin)
        return ShapeKernels(
            p,
            graph,
            origin,
            ver,
            compiled,
            runner,
            known is not None,
            time.perf_counter() - start,
            timings,
            tuple(notes),
            target,
        )

    def _symbolic(self, target: Target) -> SymbolicKernels | None:
        """The compiled variants by skeleton for ``target`` (llvm only; None when switched off)."""
        if not self.symbolic:
            return None
        if target not in self._variants:
            from gensorage.codegen.symbolic_kernels import SymbolicKernels

            variants = SymbolicKernels(target, self.hw, tiered=self.tiered)
            variants.on_rebuild(self.relink)
            self._variants[target] = variants
        return self._variants[target]

    def _superoptimize(self, p: Program) -> tuple[KernelGraph, Verification, str]:
        from gensorage.superopt.api import superoptimize

        res = superoptimize(
            p,
            hw=self.hw,
            mode=self.mode,
            time_budget_s=self.time_budget_s,
            progress=False,
            store=self.store,
            use_store=self.use_store,
            seed=self.seed,
            delta=self.delta,
            precision=self.precision,
            preset=self.preset,
            workers=self.workers,
        )
        if not res.equivalence:
            raise GensorageError(f"µGraph not verified: {res.equivalence.method}")
        return res.best, res.equivalence, res.origin

    def _carry(
        self, known: _Structure, p: Program, timings: dict[str, float], notes: list[str], target: Target
    ) -> tuple[KernelGraph, Verification]:
        """The structure's µGraph at ``p``'s shapes, checked; the direct µGraph where it does not carry over (or,
        for CUDA kernels, does not launch: the llvm kernels launch at any size, and checking a fused row kernel
        costs an emission of it, a tenth of a second or more, per new shape)."""
        direct = from_program(p, self.precision)
        if known.origin == "direct":
            return direct, Verification(True, DIRECT)
        from gensorage.codegen.kernel_fit import launch_problem
        from gensorage.superopt.choice import cost_fn, elements
        from gensorage.superopt.reshape_structure import reinstantiate
        from gensorage.superopt.row_fusion import FUSED_ORIGINS, kernel_kinds
        from gensorage.verify.equivalent import equivalent

        t0 = time.perf_counter()
        try:
            if (
                known.origin in FUSED_ORIGINS
            ):  # row fusion is a rule: the same one applied afresh at these shapes
                graph = self._fused(known, p, FUSED_ORIGINS[known.origin], target) or direct
            else:
                with warm_starts():
                    graph = reinstantiate(
                        known.graph, known.program, p, self.hw, cost_fn(self.hw), seed=self.seed
                    )
        except GensorageError as exc:
            return self._direct(direct, f"the chosen µGraph does not carry over: {exc}", notes)
        finally:
            timings["reinstantiate"] = time.perf_counter() - t0
        if graph == direct:
            return direct, Verification(True, DIRECT)
        why = launch_problem(graph, self.hw, self.seed) if target == "cuda" else None
        if why is not None:
            return self._direct(direct, f"the chosen µGraph does not launch at these shapes: {why}", notes)
        if elements(p) > DEFAULT_VERIFY_MAX_ELEMENTS:
            if known.origin in FUSED_ORIGINS and kernel_kinds(graph) != kernel_kinds(known.graph):
                # the check at the first shape witnessed other kernels (rows that no longer fit a block)
                why = "row fusion forms other kernels here than at the checked shape, too large to check here"
                return self._direct(direct, why, notes)
            note = "too large to check at this shape: the µGraph was checked at its first shape"
            return graph, Verification(True, "search shapes", note=note)
        t0 = time.perf_counter()
        try:
            report = equivalent(p, graph, self.delta, seed=self.seed, max_trials=DEFAULT_VERIFY_MAX_TRIALS)
        except GensorageError as exc:  # the check cannot run at this shape (e.g. its error cannot be bounded)
            return self._direct(direct, f"the re-instantiated µGraph cannot be checked here: {exc}", notes)
        finally:
            timings["verify"] = time.perf_counter() - t0
        if not report:
            return self._direct(direct, f"the re-instantiated µGraph does not verify ({report})", notes)
        return graph, Verification(True, "equivalence check", report=report)

    def _fused(self, known: _Structure, p: Program, epilogues: bool, target: Target) -> KernelGraph | None:
        """Row fusion's rule at ``p``; for CUDA kernels with the grid dims and row maps of the structure's first
        shape where they are exact here (:mod:`gensorage.folds`: at one token a length dim of 1 is otherwise no
        grid dim, so the row kernels' generic forms of the first shape would not match)."""
        from gensorage.superopt.row_fusion import fused_direct

        if target != "cuda" or not self.symbolic:
            return fused_direct(p, self.precision, self.hw, epilogues)
        key = (known.program.structure_key(), epilogues)
        with scope(self._row_folds):
            if key not in self._row_folds:  # the rule's choices at the first shape (it is deterministic)
                same_folds(key, lambda: fused_direct(known.program, self.precision, self.hw, epilogues))
            return same_folds(key, lambda: fused_direct(p, self.precision, self.hw, epilogues))

    def _direct(self, direct: KernelGraph, why: str, notes: list[str]) -> tuple[KernelGraph, Verification]:
        self.stats.direct_fallbacks += 1
        notes.append(why)
        return direct, Verification(True, DIRECT)


def _build_kernels(
    graph: KernelGraph,
    hw: HwProfile,
    seed: int,
    timings: dict[str, float],
    target: Target,
    symbolic: SymbolicKernels | None = None,
    notes: list[str] | None = None,
    first: bool = False,
) -> tuple[CompiledUGraph, KernelRunner | None, int]:
    """The ``target`` kernels of ``graph`` (the other target is not lowered), for llvm their prepared runner,
    and how many builds that took (0 or 1); ``timings`` gets the time of the lowering to TIR and of the build
    (TVM's compile and the code generation). With ``symbolic``, the kernels come from its compiled variants
    (:mod:`gensorage.codegen.symbolic_kernels`: built only for those it lacks). On CUDA with tiered variants,
    a structure's ``first`` shape builds its own kernels (the generic forms cost more to lower and compile, and
    run slower), and ``symbolic`` lowers and compiles the generic ones in the background."""
    from gensorage.codegen.module import compile_kernels, compile_ugraph
    from gensorage.codegen.runner import KernelRunner

    t0 = time.perf_counter()
    ahead = target == "cuda" and symbolic is not None and symbolic.tiered and first
    if ahead:
        assert symbolic is not None
        store = symbolic.folds
        symbolic.prepare(lambda: _generic_cuda_kernels(graph, hw, seed, store))
        symbolic = None  # this shape's own kernels, as without variants
    elif symbolic is not None and target == "cuda":
        symbolic.wait_prepared()  # the generic forms a first shape fixes, before this shape is lowered
    # compiled variants on CUDA and llvm's first tier: matmuls whose rows are the length get one kernel for
    # every length (on llvm the twin of CUDA's schedule; each length's own kernels follow in the background)
    generic = symbolic is not None and (target == "cuda" or symbolic.tiered)
    # on CUDA a copy's index folds are its first length's (gensorage.folds: at one token too)
    folds = scope(symbolic.folds) if symbolic is not None and target == "cuda" else contextlib.nullcontext()
    with generic_matmuls() if generic else contextlib.nullcontext(), folds:
        compiled = compile_ugraph(graph, hw, target, seed=seed)
    t1 = time.perf_counter()
    timings["lower"] = t1 - t0
    builds = 1
    if symbolic is not None:
        builds = _from_variants(compiled, symbolic, target, notes if notes is not None else [])
    if target == "cuda":
        if ahead and notes is not None:
            notes.append("first shape: its own kernels; the generic variants are built in the background")
        if symbolic is None:
            # kernels of the same code (k and v projections, gate and up) compiled once: the CUDA compiler's
            # call on the whole module is most of a new length's build on a GPU (compile_kernels)
            ex = compile_kernels(compiled.kernels("cuda"), "cuda", compiled.hw, share_same=True)
            compiled.use_executable("cuda", ex)
        timings["build"] = time.perf_counter() - t1
        return compiled, None, builds
    try:
        runner: KernelRunner | None = KernelRunner(
            compiled
        )  # builds, and looks the kernels up (LLVM's codegen)
    except UnsupportedOpError:
        compiled.executable("llvm")
        runner = None
    timings["build"] = time.perf_counter() - t1
    return compiled, runner, builds


def _generic_cuda_kernels(
    graph: KernelGraph, hw: HwProfile, seed: int, folds: dict[Hashable, tuple[str, ...]]
) -> list[Any]:
    """``graph``'s CUDA kernels in their generic forms (the compiled variants' first sight; its copies' index
    folds recorded in ``folds``), with a softmax over the keys' forms for rows of the other capacities (a later
    length's keys may need a longer row)."""
    from gensorage.codegen.generic_rows import wider
    from gensorage.codegen.module import compile_ugraph

    with generic_matmuls(), wider() as capacities, scope(folds):
        kernels = compile_ugraph(graph, hw, "cuda", seed=seed).kernels("cuda")
    return [*kernels, *capacities]


def _from_variants(
    compiled: CompiledUGraph, symbolic: SymbolicKernels, target: Target, notes: list[str]
) -> int:
    """Give ``compiled`` its ``target`` functions from ``symbolic``'s variants (one build of those it lacks);
    returns the builds made. A failed build of variants leaves ``compiled`` to build its own kernels (one
    build), with the reason in ``notes``."""
    before, built = symbolic.builds, symbolic.compiled
    try:
        compiled.use_executable(target, symbolic.executable(compiled.kernels(target)))
    except ScheduleError as exc:
        notes.append(f"compiled variants failed, the kernels are built at this shape: {exc}")
        if target == "cuda":  # as without variants (the llvm runner builds its own)
            from gensorage.codegen.module import compile_kernels

            ex = compile_kernels(compiled.kernels(target), target, compiled.hw, share_same=True)
            compiled.use_executable(target, ex)
        return 1
    if symbolic.builds == before:
        notes.append("no build: every kernel from compiled variants")
    elif symbolic.tiered:
        how = "generic or as written" if target == "cuda" else "unoptimised"
        notes.append(
            f"first tier: {symbolic.compiled - built} kernel(s) built {how}, rebuilt in the background"
        )
    return symbolic.builds - before


__all__ = ["DispatchStats", "Dispatcher", "ShapeKernels"]

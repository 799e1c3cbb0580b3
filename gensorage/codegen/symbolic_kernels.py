"""Kernels compiled once over their length-dependent literals, called at every length without a build.

A µGraph at a new sequence length lowers to kernels whose TVMScript differs from the last length's in some
integer literals (extents, strides, bounds) and, where the length crosses a tiling boundary, in structure (a
bounds guard, another matmul schedule). :mod:`gensorage.codegen.script_templates` already splits a text into its
*skeleton* (the literals made ``T.int32`` parameters ``c<i>_``) and the literals' values. This module keeps, per
skeleton, compiled *variants*: the skeleton's template with the literals that stayed the same specialised
(constants, as before) and the literals that changed between two lengths left as parameters, so the compiled
function takes them as leading scalar arguments. A kernel at a new length whose skeleton has a variant with
equal fixed literals calls it with its own values of the others: no parsing, no build.

The bucket of a variant is every length whose kernel has that skeleton and those fixed values; a length outside
every bucket (a new skeleton: a guard appears, a schedule changes; or a fixed literal changes) builds the kernels
it misses, all in one ``tvm.compile``: a skeleton seen for the first time is built as it is (no parameter: the
fastest code, and nothing yet says which literals vary), a skeleton seen again with other values gets a variant
widened from the nearest one by the literals that differ. Scheduled matmuls are first taken through TVM's own
block lowering (:func:`_block_free`), so their literals are the tiling's and the length's. Divisors, unrolled
extents and a matmul's tile shapes stay constants (:func:`_constant_extents`): variables there cost speed.

Exactness: a variant is the template, whose specialisation at its first values was checked structurally equal
to the emitter's own PrimFunc (:func:`~gensorage.codegen.script_templates.template_of`), and a template equal at
one set of values is equal at every other (the parser types literals by context, not value). Leaving a literal
as a parameter and passing its value at the call computes what the specialised kernel computes. So the code run
at a new length is the code the emitter wrote for that length, compiled once: the tiling decisions (splits,
guards, grid sizes) are the emitter's at that length, and a length whose decisions change the code's structure
simply lands in another bucket. A skeleton without a template (a literal the parser needs as a Python value) is
built per length, as before.

CUDA (``target="cuda"``) takes the first tier further: a kernel is compiled *generic* at first sight, so that
every later length whose kernels have the same skeletons makes no compiler call (on a GPU the CUDA compiler's
call is most of a new length's build). A text kernel's generic skeleton (:func:`_generic_skeleton`) keeps as
constants only what the CUDA code needs constant or what does not follow the length (:func:`_cuda_constants`:
a block's threads and the tests of the thread index, on-chip buffers' shapes and subscripts, intrinsics'
arguments, unrolled and vectorised extents); every other literal (grid extents, tensor shapes, bounds, offsets,
divisors too: speed is secondary in this tier) is a parameter, passed at the call. Its template is checked as
every template is (structurally equal to the emitter's kernel at its first values; the tests check the variant a
length calls, bound at that length's values, against the emitter's kernel there, at 1, primes and lengths no
tile divides). Matmuls come from :mod:`~gensorage.codegen.generic_matmul` (the rows, or attention's rows,
columns and reduction, TIR variables: the same PrimFunc at every length, its variant the same) and row kernels
from :mod:`~gensorage.codegen.generic_rows` (the first length's rows a block, the rows TIR variables) or,
where that does not apply, are compiled per length as written. Once the length is served, a background thread builds the
length's own kernels (every literal a constant, a generic matmul as the construction there gives it) in one module and
the length's :class:`BoundExecutable` serves them from then on (``generation`` counts the swaps; a prepared CUDA
runner looks its functions up again, :func:`gensorage.torch.device.cuda_runner`). With tiers, a structure's first
length is served by its own kernels (the dispatcher builds them) and its generic forms are compiled in the
background (:meth:`SymbolicKernels.prepare`); a later length waits for them (:meth:`SymbolicKernels.wait_prepared`).

Tiers (``tiered=True``): the variants a length misses are first built without LLVM's optimisation
(:data:`~gensorage.codegen.module.QUICK_TARGET`: about half the build time; its matmuls and row kernels run up to
about 3 times slower, its copies as fast), so the length is served at once; a background thread then builds them
again at the full level (:meth:`SymbolicKernels.start_rebuilds`, once the caller has served the length) and swaps
the new functions in (:meth:`SymbolicKernels.wait_rebuilds` waits for it), telling the listeners
(:meth:`SymbolicKernels.on_rebuild`: the dispatcher, whose prepared runners look their functions up again). Both
tiers compile the same TIR (the same operations; the tests check both against float64); TVM's compile releases the
GIL, so the rebuild runs beside the caller. A rebuild that fails leaves the first tier's functions (correct,
slower).

With tiers, the llvm first tier is generic at first sight too, as CUDA's: a one-thread-per-element kernel
(copies, element-wise ops) keeps its bounds guard at every length (:func:`gensorage.codegen.predefined.
emit_predefined`) and its generic skeleton keeps as constants only the literals :func:`_llvm_constants` names
(unrolled and vectorised extents, allocations' shapes), and a matmul on tensor-core tiles is the llvm twin of
CUDA's generic matmul (its rows a TIR variable, the same PrimFunc at every length;
:mod:`~gensorage.codegen.generic_matmul`); both are marked by ``Kernel.own``. A later length whose kernels keep
their skeletons makes no build. The first length builds its variants at the first tier (the quick
build, rebuilt at the full level), and every length served by a generic form gets its own kernels built in the
background and swapped in (:meth:`BoundExecutable.use_exact`; the dispatcher relinks its runners), so its steady
state is the untiered one. Row kernels come from :mod:`~gensorage.codegen.generic_rows` on llvm too (the first
length's rows a block, the rows TIR variables, the blocks' loops over them; a softmax over the keys at a capacity):
the same text at every length, so the same variant with no parameter (a generic skeleton's literals as
parameters would cost TVM's passes up to 0.5 s on one, and none of them changes). Untiered (``tiered=False``),
llvm variants are widened as described first.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import re
import threading
import weakref
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gensorage.codegen import library
from gensorage.codegen.background import BackgroundBuilds
from gensorage.codegen.generic_matmul import concrete
from gensorage.codegen.kernel_text import Target
from gensorage.codegen.module import Kernel, compile_kernels
from gensorage.codegen.script_templates import SKELETON_NAME, skeleton, template_of
from gensorage.hw.profile import HwProfile

_CONSTANT_EXTENT = re.compile(r"T\.(?:unroll|vectorized)\(c(\d+)_\)")
_ALLOCATION = re.compile(
    r"T\.(?:alloc_buffer|decl_buffer|sblock_alloc_buffer|alloc_local|alloc_shared|allocate)\("
    r"(\([^)]*\)|\[[^\]]*\]|c\d+_)"
)
_DIVISOR = re.compile(r"(?://|%)\s*c(\d+)_")
_LITERAL = re.compile(r"\bc(\d+)_")
_ON_CHIP = re.compile(r"(\w+) = T\.(?:alloc_buffer|decl_buffer)\(")  # a kernel's shared or local buffers
_CUDA_CONSTANT_LINE = re.compile(
    r"threadIdx|vthread|alloc|decl_buffer|T\.ptx|shuffle|T\.unroll|T\.vectorized|T\.tvm_|T\.call_|^\s*if tx\b"
)

log = logging.getLogger("gensorage.codegen")

#: Held by a variant's first look-up of its function and by a rebuild's swap of rebuilt functions.
_SWAP = threading.Lock()

#: Failures of background builds kept in ``SymbolicKernels.rebuild_errors`` (a server's every length may fail).
MAX_ERRORS = 64

#: Variants kept per skeleton: beyond, a kernel of that skeleton is built per length (never wrong, only slower).
MAX_VARIANTS = 8


@dataclass(slots=True)
class _Variant:
    symbol: str  # its function's name in ``executable``
    dynamic: tuple[int, ...]  # literal positions passed at the call
    fixed: tuple[tuple[int, int], ...]  # (position, value) of every other literal
    executable: Any
    function: Any = None  # looked up on first use (the JIT runs then)
    # built at the first tier (module.QUICK_TARGET), its rebuild at the full level pending
    quick: bool = False
    func: Any = None  # the PrimFunc compiled (its dynamic literals its leading parameters)

    def matches(self, values: Sequence[int]) -> bool:
        return all(values[i] == v for i, v in self.fixed)

    def call(self, values: Sequence[int]) -> Any:
        if self.function is None:
            with _SWAP:  # a rebuild swapping its function in meanwhile must not be overwritten
                if self.function is None:
                    self.function = self.executable[self.symbol]
        if not self.dynamic:
            return self.function
        return functools.partial(self.function, *(values[i] for i in self.dynamic))


@dataclass(slots=True)
class _Skeleton:
    first: tuple[int, ...]  # the values it was first seen with
    variants: list[_Variant] = field(default_factory=list)


class BoundExecutable:
    """The functions of one µGraph's kernels at one length, looked up by kernel name like an Executable
    (each one the variant's compiled function with this length's dynamic literals bound)."""

    def __init__(
        self, calls: dict[str, tuple[_Variant, tuple[int, ...]]], exact: Callable[[], Any] | None = None
    ) -> None:
        self._calls = calls
        self._build_exact = exact  # a generic first tier's: builds the length's own kernels
        self._exact: Any = None  # the length's own kernels, built in the background (``generation`` 1)
        self.generation = 0  # bumped when the functions change: a prepared runner looks them up again

    def __getitem__(self, name: str) -> Any:
        if self._exact is not None:
            return self._exact[name]
        variant, values = self._calls[name]
        return variant.call(values)

    @property
    def mod(self) -> Any:
        """The module of the length's own kernels (its CUDA source: the variants span several modules); built
        now where the background build has not finished."""
        if self._exact is None and self._build_exact is None:
            raise AttributeError("mod")
        return (self._exact if self._exact is not None else self._build_exact()).mod  # type: ignore[misc]

    def use_exact(self, executable: Any) -> None:
        """From now on, every kernel's function from ``executable`` (the kernels as the emitter wrote them)."""
        self._exact = executable
        self.generation += 1

    @property
    def calls(self) -> dict[str, tuple[_Variant, tuple[int, ...]]]:
        """Per kernel name: its variant and this length's values of the variant's literals."""
        return self._calls

    def variant_of(self, name: str) -> tuple[str, tuple[int, ...]]:
        """Kernel ``name``'s variant: its symbol and the literal positions passed at the call."""
        variant, _ = self._calls[name]
        return variant.symbol, variant.dynamic


class SymbolicKernels:
    """Compiled variants by skeleton for one ``target`` (see the module docstring); shared by every µGraph of a
    dispatcher, so kernels of equal skeletons in other programs (a slice, a residual add) share them too.

    ``builds`` counts the ``tvm.compile`` calls made here (one per length that misses a variant), ``compiled``
    the variants they compiled; with ``tiered`` (llvm only), ``rebuilds`` the background rebuilds at the full
    level that were swapped in (not counted in ``builds``).
    """

    def __init__(self, target: Target, hw: HwProfile, tiered: bool = False) -> None:
        self.target: Target = target
        self.hw = hw
        self.tiered = tiered
        self.builds = 0
        self.compiled = 0
        self.rebuilds = 0
        self.rebuild_errors: list[str] = []
        self.dropped = 0  # rebuilds of lengths dropped from the caches before their turn
        self.missed: list[str] = []  # the kernels no variant covered at the last call of executable()
        self.last_build: Any = None  # that call's build (the module of the variants it compiled), if any
        self._skeletons: dict[str, _Skeleton] = {}
        self._symbols = itertools.count()
        self._lock = threading.Lock()  # dispatchers of several threads; a build runs inside it
        self._rebuild_lock = threading.Lock()  # one background rebuild at a time (they share the cores)
        self._worker = BackgroundBuilds("gensorage-rebuild")  # the rebuilds, one thread (codegen.background)
        self._pending: list[tuple[list[Kernel], list[_Variant]]] = []  # first-tier builds not rebuilt yet
        self._exact_pending: list[tuple[list[Kernel], BoundExecutable]] = []  # CUDA lengths served generic
        self._prepared: list[Callable[[], list[Kernel]]] = []  # CUDA: generic kernels to build, not started
        self._preparing: list[threading.Thread] = []
        self._listeners: list[Callable[[], None]] = []
        #: CUDA copies' index folds at their first sight, replayed at later lengths (gensorage.folds)
        self.folds: dict[Hashable, tuple[str, ...]] = {}

    def on_rebuild(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` (from the rebuilding thread) after each swap of rebuilt functions."""
        self._listeners.append(listener)

    def wait_rebuilds(self, timeout: float | None = None) -> None:
        """Start the pending rebuilds and wait for them (each up to ``timeout`` seconds)."""
        self.start_rebuilds()
        for thread in list(self._preparing):
            thread.join(timeout)
        self._preparing = [t for t in self._preparing if t.is_alive()]
        self._worker.join(timeout)

    def prepare(self, lower: Callable[[], list[Kernel]]) -> None:
        """CUDA: build the variants of ``lower()``'s kernels (a structure's first shape, lowered generic) in the
        background (:meth:`start_rebuilds` starts it); until it is done, :meth:`executable` and :meth:`wait_prepared` wait for it. Its
        build is not counted in ``builds`` (the caller built that shape's own kernels)."""
        with self._lock:
            self._prepared.append(lower)

    def _prepare(self, lower: Callable[[], list[Kernel]]) -> None:
        try:
            self._executable(lower(), serve=False)
        except Exception as exc:  # the next shape builds what it lacks
            self._failed(exc)

    def wait_prepared(self) -> None:
        """Wait for the prepared builds in flight; run those not started yet (a later shape's lowering must see
        the generic forms the first shape's fixed: its matmuls' tiles, its row kernels' rows a block)."""
        for thread in list(self._preparing):
            thread.join()
        with self._lock:
            self._preparing = [t for t in self._preparing if t.is_alive()]
            pending, self._prepared = self._prepared, []
        for lower in pending:
            self._prepare(lower)

    def executable(self, kernels: Sequence[Kernel]) -> BoundExecutable:
        """The kernels' functions: from the variants that cover them, after one build of those that none does
        (when ``tiered``, at the first tier: :meth:`start_rebuilds` then rebuilds them at the full level).

        Raises
        ------
        ScheduleError
            The build of the missing variants failed (:func:`~gensorage.codegen.module.compile_kernels`).
        """
        self.wait_prepared()
        return self._executable(kernels)

    def _executable(self, kernels: Sequence[Kernel], serve: bool = True) -> BoundExecutable:
        with self._lock:
            calls: dict[str, tuple[_Variant, tuple[int, ...]]] = {}
            missing: list[tuple[Kernel, str, _Variant]] = []
            self.last_build = None
            bodies: list[str] = []
            try:
                for kern in kernels if self.target == "cuda" else map(_block_free, kernels):
                    # generic at first sight: CUDA's text kernels; with tiers, llvm's copies and element-wise ones
                    # (their generic forms, Kernel.own; generic row kernels have no grid: one text at every length)
                    generic = kern.grid is not None and (
                        self.target == "cuda" or (self.tiered and kern.own is not None)
                    )
                    body, raw = (
                        _generic_skeleton(kern.script, kern.name, self.target)
                        if generic
                        else skeleton(kern.script, kern.name)
                    )
                    values = tuple(raw)
                    bodies.append(body)
                    known = self._skeletons.setdefault(body, _Skeleton(values))
                    variant = next((v for v in known.variants if v.matches(values)), None)
                    if variant is None:
                        variant, func = self._new_variant(kern, body, values, known, generic)
                        script = kern.script.replace(kern.name, variant.symbol)
                        renamed = dataclasses.replace(kern, name=variant.symbol, func=func, script=script)
                        missing.append((renamed, body, variant))
                    calls[kern.name] = (variant, values)
                new = {id(v) for _, _, v in missing}
                if serve:
                    self.missed = [k.name for k in kernels if id(calls[k.name][0]) in new]
                if missing:
                    self._build(missing, serve)
            except BaseException:  # an error or Ctrl-C before the build: no variant left without functions
                for body in bodies:
                    variants = self._skeletons[body].variants
                    variants[:] = [v for v in variants if v.executable is not None]
                raise
        # a generic first tier (CUDA's; llvm's where a variant takes literals or a kernel is a generic form, Kernel.own):
        # the length's own kernels follow
        generic = self.target == "cuda" or (
            self.tiered
            and (any(v.dynamic for v, _ in calls.values()) or any(k.own is not None for k in kernels))
        )
        exact = functools.partial(self._exact_build, list(kernels)) if generic else None
        bound = BoundExecutable(calls, exact)
        if not serve:
            return bound
        if self.tiered and generic:
            self._exact_pending.append((list(kernels), bound))
        if self.tiered and missing and self.target == "llvm":
            self._pending.append(([k for k, _, _ in missing], [v for _, _, v in missing]))
        return bound

    def _build(self, missing: list[tuple[Kernel, str, _Variant]], serve: bool = True) -> None:
        """One build of the ``missing`` variants (at the first tier when tiered; on failure the caller drops them).
        ``serve``: for a shape being served (counted in ``builds``, its ``last_build``), else prepared ahead."""
        kernels = [k for k, _, _ in missing]
        if self.target == "cuda":  # one variant per code (llvm builds share theirs by default)
            ex = compile_kernels(kernels, self.target, self.hw, share_same=True)
        else:
            ex = compile_kernels(kernels, self.target, self.hw, quick=self.tiered)
        if serve:
            self.builds += 1
            self.compiled += len(missing)
            self.last_build = ex
        for _, _, variant in missing:
            variant.executable = ex
            variant.quick = self.tiered

    def start_rebuilds(self) -> None:
        """Start the background rebuilds of the first-tier builds made so far. The caller starts them once the
        kernels are served (their functions looked up, the runner prepared): a rebuild beside that work would
        take the cores it needs."""
        with self._lock:
            pending, self._pending = self._pending, []
            exact, self._exact_pending = self._exact_pending, []
            prepared, self._prepared = self._prepared, []
        for lower in prepared:
            thread = threading.Thread(target=self._prepare, args=(lower,), name="gensorage-generic")
            self._preparing.append(thread)
            thread.start()
        # one worker runs them in order; a length dropped from its caches meanwhile is not built (weakref)
        self._worker.submit(
            [
                *(functools.partial(self._exact, kernels, weakref.ref(bound)) for kernels, bound in exact),
                *(functools.partial(self._rebuild, kernels, variants) for kernels, variants in pending),
            ]
        )

    def _rebuild(self, kernels: list[Kernel], variants: list[_Variant]) -> None:
        """Build ``variants`` at the full level, look their functions up (LLVM's JIT runs here, not at a call)
        and swap them in; then tell the listeners."""
        with self._rebuild_lock:
            try:
                ex = library.served(compile_kernels(kernels, self.target, self.hw), self.target)
                functions = [ex[v.symbol] for v in variants]
            except Exception as exc:  # the first tier's functions stay: correct, slower
                self._failed(exc)
                return
            with self._lock, _SWAP:
                for variant, function in zip(variants, functions, strict=True):
                    variant.executable, variant.function, variant.quick = ex, function, False
                self.rebuilds += 1
            for listener in list(self._listeners):
                listener()

    def _exact(self, kernels: list[Kernel], ref: weakref.ref[BoundExecutable]) -> None:
        """Build one length's kernels as the emitter wrote them (constant divisors and extents) and serve
        them from its executable instead of the generic variants; then tell the listeners. Nothing when the
        executable is gone (its length no longer cached: nobody would call them)."""
        if ref() is None:
            self.dropped += 1
            return
        with self._rebuild_lock:
            bound = ref()
            if bound is None:
                self.dropped += 1
                return
            try:
                ex = self._exact_build(kernels)
            except Exception as exc:  # the generic variants stay: correct, slower
                self._failed(exc)
                return
            with self._lock, _SWAP:
                bound.use_exact(ex)
                self.rebuilds += 1
            for listener in list(self._listeners):
                listener()

    def _failed(self, exc: Exception) -> None:
        """A background build failed (its kernels keep the tier they have: correct, slower): the first failure
        is logged, one line; each is kept in ``rebuild_errors`` (the first :data:`MAX_ERRORS`)."""
        if not self.rebuild_errors:
            log.warning(
                "a background kernel build failed, the first-tier kernels stay: %s: %s",
                type(exc).__name__,
                exc,
            )
        if len(self.rebuild_errors) < MAX_ERRORS:
            self.rebuild_errors.append(f"{type(exc).__name__}: {exc}")

    def _exact_build(self, kernels: list[Kernel]) -> Any:
        """One length's kernels as the emitter wrote them, in one module (kernels of one code once), each
        generic matmul as :func:`_own` gives it."""
        # kept for the length's lifetime: from a shared library, not LLVM's JIT (~5 MB a length; codegen.library)
        return library.served(
            compile_kernels(list(map(_own, kernels)), self.target, self.hw, share_same=True), self.target
        )

    def _new_variant(
        self, kern: Kernel, body: str, values: tuple[int, ...], known: _Skeleton, generic: bool
    ) -> tuple[_Variant, Any]:
        """A variant covering ``values`` and its PrimFunc (kept in ``known`` while there is room)."""
        # Named after the kernel: under names that sort otherwise in the module (``sym<n>_kernel<k>``) the same
        # PrimFuncs compiled to slower code (a matmul's body inlined into its wrapper, 1.5x its time).
        symbol = f"{kern.name}_v{next(self._symbols)}"
        if generic:  # every literal of a generic skeleton (module docstring)
            dynamic = list(range(len(values)))
        elif self.target == "cuda":  # scheduled kernels exact
            dynamic = []
        else:
            dynamic = sorted(_widened(known, values) - _constant_extents(body, kern.grid is None))
        template = template_of(body, list(values), kern.name, kern.func) if dynamic else None
        if template is None:  # first sight, or no template: the kernel as the emitter wrote it
            dynamic = []
            func = kern.func.with_attr("global_symbol", symbol)
        else:
            params = list(template.params)
            static = {params[i]: v for i, v in enumerate(values) if i not in dynamic}
            func = template.specialize(static).with_attr("global_symbol", symbol)
        fixed = tuple((i, v) for i, v in enumerate(values) if i not in dynamic)
        variant = _Variant(symbol, tuple(dynamic), fixed, None, func=func)
        if len(known.variants) < MAX_VARIANTS:
            known.variants.append(variant)
        return variant, func


def _block_free(kern: Kernel) -> Kernel:
    """``kern`` with a scheduled PrimFunc (a matmul: TVM's blocks over whole-matrix buffers) taken through the
    build's own block lowering (:data:`BLOCK_LOWERING`): loops over tile-sized allocations, whose literals are
    the tiling's and the length's; other kernels as they are."""
    if kern.grid is not None:
        return kern
    return _lowered(kern.name, kern.script, kern)


#: Block-lowered PrimFuncs and their text by kernel name and script. Keyed by the script, not the PrimFunc (a
#: PrimFunc hashes by identity): a scheduled kernel's script is its PrimFunc printed, and a generic matmul, the
#: same text at every length but a new PrimFunc at each, was lowered anew at each (0.03-0.05 s a kernel).
_LOWERED: dict[tuple[str, str], tuple[Any, str]] = {}


def _lowered(name: str, script: str, kern: Kernel) -> Kernel:
    got = _LOWERED.get((name, script))
    if got is None:
        import tvm

        with tvm.target.Target("llvm"):
            mod = tvm.ir.transform.Sequential(_block_lowering())(tvm.IRModule({name: kern.func}))
        got = mod[name], mod[name].script()
        if len(_LOWERED) >= 1024:
            _LOWERED.clear()
        _LOWERED[name, script] = got
    return dataclasses.replace(kern, func=got[0], script=got[1])


def _block_lowering() -> list[Any]:
    """The first passes of TVM's s_tir pipeline (``tvm.s_tir.pipeline``), up to the blocks' removal: the build
    runs them again (a no-op on block-free TIR), then the rest."""
    from tvm import s_tir

    t = s_tir.transform
    return [
        t.CanonicalizeLoop(),
        t.LowerCrossThreadReduction(),
        t.LowerInitBlock(),
        t.PlanAndUpdateBufferAllocationLocation(),
        t.ConvertBlocksToOpaque(),
        t.LiftThreadBinding(),
        t.ManifestSharedMemoryLocalStage(),
        t.CompactBufferAllocation(),
        t.LowerAutoCopy(),
        t.UnifyThreadBinding(),
        t.LowerMatchBuffer(),
        t.StmtSimplify(),
        t.InjectPermutedLayout(),
        t.AnnotateIrregularLoop(),
        t.InjectSoftwarePipeline(),
        t.TransformMmaBufferLayout(),
        t.LowerOpaqueBlock(),
    ]


def _cuda_constants(body: str) -> set[int]:
    """Literal positions of a CUDA kernel's skeleton kept constant in its generic variant: those on a line that
    binds threads (a block's thread count: launch bounds, warp arithmetic), tests the thread index alone (which
    threads of a block work: a variable there gives TVM's buffer compaction a variable tile size), allocates or
    declares a buffer (shared and local memory are sized at compile time), calls a PTX or warp intrinsic (byte
    counts, lane masks) or unrolls or vectorises a loop, and the subscripts of the kernel's own shared and local
    buffers (a tile's or a register's element: variables there put register arrays on the stack, which the CUDA
    code generator refuses). Every other literal (grid extents, tensor shapes, bounds, offsets, divisors) is a
    parameter."""
    on_chip = "|".join(_ON_CHIP.findall(body))
    subscripts = re.findall(rf"\b(?:{on_chip})\[([^\[\]]*)\]", body) if on_chip else []
    keep = {int(m) for sub in subscripts for m in _LITERAL.findall(sub)}
    for line in body.splitlines():
        if _CUDA_CONSTANT_LINE.search(line):
            keep |= {int(m) for m in _LITERAL.findall(line)}
    return keep


def _own(kern: Kernel) -> Kernel:
    """A generic matmul's kernel as its construction at this length gives it (another tiling or instruction,
    wgmma say, where that is one kernel with the same parameters), else with this length's extents as
    constants; other kernels as they are."""
    got = kern.own() if kern.own is not None else None
    if got is None:
        return concrete(kern)
    func, rule = got
    return dataclasses.replace(kern, func=func, script=func.script(), rule=rule, own=None)


def _generic_skeleton(text: str, name: str, target: Target) -> tuple[str, list[int]]:
    """A kernel's generic skeleton: :func:`~gensorage.codegen.script_templates.skeleton`'s, with the literals
    ``target`` needs constant (:func:`_cuda_constants`, :func:`_llvm_constants`) written back in place (part of
    the skeleton, so a kernel matches a variant only where they are equal) and the others, renumbered, its
    parameters."""
    body, values = skeleton(text, name)
    keep = _cuda_constants(body) if target == "cuda" else _llvm_constants(body)
    if not keep:
        return body, values
    new = {i: j for j, i in enumerate(i for i in range(len(values)) if i not in keep)}
    head, sep, rest = body.partition(f"def {SKELETON_NAME}(")
    rest = rest.split(", ", len(values))[-1]  # the old parameters dropped
    params = "".join(f"c{j}_: T.int32, " for j in range(len(new)))

    def put(m: re.Match[str]) -> str:
        i = int(m.group(1))
        return str(values[i]) if i in keep else f"c{new[i]}_"

    return head + sep + params + _LITERAL.sub(put, rest), [v for i, v in enumerate(values) if i not in keep]


def _llvm_constants(body: str) -> set[int]:
    """Literal positions of an llvm kernel's skeleton kept constant in its generic variant: unrolled and
    vectorised loops' extents (TVM needs them) and allocations' shapes (a matmul's tiles: buffers sized at
    compile time). Every other literal (shapes, bounds, offsets, divisors: speed is secondary in this tier, the
    length's own kernels follow) is a parameter."""
    keep = {int(m) for m in _CONSTANT_EXTENT.findall(body)}
    for shape in _ALLOCATION.findall(body):
        keep |= {int(m) for m in _LITERAL.findall(shape)}
    return keep


def _widened(known: _Skeleton, values: tuple[int, ...]) -> set[int]:
    """The literal positions a new variant for ``values`` leaves as parameters: those of the nearest variant (the
    fewest fixed literals that differ; other programs' kernels of one skeleton have variants too) and those
    that differ from it; with no variant, those that differ from the values first seen."""
    if not known.variants:
        return {i for i, (a, b) in enumerate(zip(known.first, values, strict=True)) if a != b}

    def differing(v: _Variant) -> set[int]:
        return {i for i, a in v.fixed if values[i] != a}

    nearest = min(known.variants, key=lambda v: len(differing(v)))
    return set(nearest.dynamic) | differing(nearest)


def _constant_extents(body: str, scheduled: bool) -> set[int]:
    """Literal positions of a skeleton kept constant: unrolled and vectorised loops' extents (TVM needs them) and
    divisors: a division by a variable is a division per element (a constant one is a multiply and shift), and
    variants with divisors as parameters ran up to 3.7 times slower (a repeat's or a concat's flat index split by
    the length; matmuls' tiles 1.6 times). In a scheduled kernel (a matmul) also the allocations' shapes, its
    tiles. Another tiling, or another divisor, is another variant, built as written."""
    keep = {int(m) for m in _CONSTANT_EXTENT.findall(body)}
    keep |= {int(m) for m in _DIVISOR.findall(body)}
    if scheduled:
        for shape in _ALLOCATION.findall(body):
            keep |= {int(m) for m in _LITERAL.findall(shape)}
    return keep


__all__ = ["MAX_VARIANTS", "BoundExecutable", "SymbolicKernels"]

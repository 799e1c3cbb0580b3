"""A CUDA tensor-core matmul scheduled once with its row count a variable: one kernel for every length (on llvm,
the twin of the same schedule: the tiered llvm first tier, :mod:`~gensorage.codegen.symbolic_kernels`).

A layer's projections (``x @ W`` with the tokens as rows) are lowered again at each new sequence length, and
both their construction's tiles and TVM's simplification of the schedule at that length (a bounds guard that
folds where the length divides a tile, not elsewhere) change the kernel's code, so a new length compiled them
anew: on a GPU, the CUDA compiler's time on the matmuls is most of a new length's build. Within
:func:`generic_matmuls` (the dispatcher's CUDA builds), a float matmul on tensor cores is instead scheduled once
per key with its length-dependent extents as TIR variables: a 2-D matmul's rows (the weight's dims stay
constants; the key: the operand shapes with the rows left out, dtypes, epilogue with its extra operands' row dims
left out), a batched one's rows, columns and reduction (attention's scores and P·V, any of which may be the
length; its epilogue's extra operands' dims by broadcasting), with the profile and the construction's seed. The
tiles are those the construction chose at the key's first length (``mma.sync`` ones where it chose wgmma); at
every later length the same PrimFunc is used, so its code is the same and the compiled kernel is reused
(:mod:`~gensorage.codegen.symbolic_kernels`): no construction, no schedule, no compiler call. TVM's build binds
the variables from the operands' shapes at each call, and the grid is computed from them.

Exactness: TVM's schedule primitives preserve a function's meaning for every value of its variables; the
extents are padded to multiples of the tiles (``pad_einsum``: the padded loads read zeros, the padded outputs are
never written, the guards are in the code at every length). So at every length the kernel computes the matmul
with the same tiles, the same reduction order and so the same floating-point results as the same schedule at
that length. The tests run the llvm twin of the same symbolic schedules (the same splits, padding and layouts,
each MMA tile by its scalar semantics) against float64 at many lengths, 1 and primes among them, and build the
CUDA kernels with nvcc. The dims are found by position, never by value.

The length's own build (in the background, :mod:`~gensorage.codegen.symbolic_kernels`) takes each generic matmul
as the construction at that length gives it (``ScheduledKernel.own``: its tiles, wgmma included) where that is
one kernel with the same parameters (or those and the generic kernel's split-k scratch, taken unused), else the
generic one with the length's extents as constants (:func:`concrete`). A split-k choice (a 2-D matmul: two
kernels and a scratch of float32 partials) is generic with the key's first split count; its scratch, a
parameter the caller allocates at each length, has the rows padded to the block's. A projection of so few rows
that its kernel at its length is the cooperative matrix-vector product runs the key's generic matmul too
(:func:`generic_matvec`), its own build taking the matrix-vector kernel back.

A float32 matmul (no MMA dtype: CUDA cores, or llvm's first tier) is generic the same way (``cuda_core``: one
key, cache and own build, a switch rather than a copy): its tiles are the construction tuner's schedule at the
key's first length, lowered (:func:`~gensorage.codegen.lower_schedule.lower`) with the same variables. Exactness
is the same argument: the schedule's splits of a variable extent keep their bounds predicates at every value, so
every length computes the matmul with the first length's tiles and reduction order (the tests: the llvm kernel
against float64 at 1, 2, primes and lengths past the first, a projection and attention's two matmuls). The
length's own build constructs within :func:`~gensorage.construction.warm_starts`, as the dispatcher's lowering
does (a background thread does not inherit it; the cold construction's projections ran up to 4 times slower).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from collections.abc import Hashable, Iterator
from typing import TYPE_CHECKING, Any

from gensorage.errors import ScheduleError
from gensorage.folds import decide, same_folds

if TYPE_CHECKING:
    from gensorage.codegen.epilogue_expr import KernelEpilogue
    from gensorage.codegen.kernel_text import KernelParam, KernelText, ScheduledKernel, Target
    from gensorage.codegen.module import Kernel
    from gensorage.codegen.predefined_matmul import _MatmulShape
    from gensorage.codegen.scalar import Scalar
    from gensorage.hw.profile import HwProfile
    from gensorage.ugraph.ir import KernelGraph
    from gensorage.ugraph.shapes import GraphInfo

_ACTIVE: contextvars.ContextVar[bool] = contextvars.ContextVar("generic_matmuls", default=False)
#: Symbolic schedules by key: (tiles, PrimFunc; a cuda-core key's tiles: (workload, schedule)), or None where the key
#: keeps the construction per length.
_KERNELS: dict[Hashable, tuple[Any, Any] | None] = {}
_MAX_KEYS = 1024
_MISSING = object()


@contextlib.contextmanager
def generic_matmuls(on: bool = True) -> Iterator[None]:
    """Within it, CUDA tensor-core matmuls are lowered generic in their length-dependent extents (``on``), and
    row kernels generic in their rows (:mod:`gensorage.codegen.generic_rows`)."""
    token = _ACTIVE.set(on)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active() -> bool:
    return _ACTIVE.get()


def generic_kernel(
    ms: _MatmulShape,
    dtypes: tuple[str, str, str],
    cast: str | None,
    epi: KernelEpilogue | None,
    hw: HwProfile,
    seed: int,
    tiles_of: Any,
    target: Target = "cuda",
    cuda_core: bool = False,
) -> tuple[Any, Any] | None:
    """The tiles and the PrimFunc (rows a variable) of the float matmul ``ms`` (``dtypes``: A, B, out), or None
    where it keeps the construction per length; ``tiles_of()`` gives the construction's tiles at this length
    (called at a key's first length only); on llvm, the twin of the same schedule (no tensorization).
    ``cuda_core``: a matmul of no MMA dtype (float32), whose tiles are the construction tuner's schedule
    (:class:`~gensorage.markov.schedule.Schedule`), lowered with the same variables; its entry's tiles are the
    key's first workload and that schedule."""
    from tvm import tirx

    from gensorage.codegen.matmul_rows import _epi_with_rows, _with_rows
    from gensorage.codegen.predefined_matmul import _matmul_build
    from gensorage.codegen.tensor_core import TensorCoreTiles, schedule_tensor_core

    rows = ms.out[-2]
    extra = epi.extra if epi is not None else ()
    if any(len(shape) > 2 for shape, _ in extra):
        return None
    if ms.batch:  # attention's: the rows, the columns and the reduction all variables (any may be the length)
        # which extra dims are the output's: those of the first length seen, where exact here (gensorage.folds:
        # at one token a mask's dims of 1 are otherwise taken as broadcast)
        shapes = tuple((len(shape), dt) for shape, dt in extra)
        what = (_with_dims(ms, 0, 0, 0), dtypes, cast, epi and epi.steps, shapes, hw, seed, target, cuda_core)
        outs = same_folds(("extra dims", what), lambda: _extra_dims(epi, ms.out[-2:]))
        key: Hashable = (*what, outs)
    else:  # a projection's: the rows (the weight's dims stay constants)
        key = (_with_rows(ms, 0), dtypes, cast, _epi_with_rows(epi, rows, 0), hw, seed, target, cuda_core)
    entry = _KERNELS.get(key, _MISSING)
    if entry is not _MISSING:
        return entry  # type: ignore[return-value]
    var = tirx.Var("rows", "int32")
    if ms.batch:
        cols = tirx.Var("cols", "int32")
        sym, sym_epi = (
            _with_dims(ms, var, cols, tirx.Var("depth", "int32")),
            _epi_with_dims(epi, var, cols, outs),
        )
    else:
        sym, sym_epi = _with_rows(ms, var), _epi_with_rows(epi, rows, var)
    a, b, out = dtypes
    tiles = tiles_of()
    entry = None
    if cuda_core:
        entry = None if tiles is None else _cuda_core_kernel(ms, sym, dtypes, sym_epi, tiles, target)
        tiles = None
    if tiles is not None and not isinstance(tiles, TensorCoreTiles):
        # wgmma's: the generic kernel is mma.sync (the length's own build takes the wgmma kernel back)
        from gensorage.construction.tensor_core import construct_tensor_core

        try:
            tiles = construct_tensor_core(ms.dims, hw, cast or dtypes[0], seed, layout=ms.layout)[0]
        except ScheduleError:
            tiles = None
    # A split-k tiling (2-D only) is generic with its split count: its partials' scratch has the rows padded to
    # the block's, a parameter whose shape follows the rows (predefined_matmul._scratch).
    if isinstance(tiles, TensorCoreTiles) and (tiles.split_k == 1 or not ms.batch):
        llvm = target == "llvm"  # the llvm twin casts by bits, as tensor_core_kernels' llvm kernels do
        build = _matmul_build(sym, a, out, None, tiles.split_k, tiles.block_m, b, cast, sym_epi, llvm)
        try:
            func = schedule_tensor_core(build(), tiles, gpu=not llvm, convert=cast is not None).mod["main"]
            entry = (tiles, func)
        except (ScheduleError, TypeError, ValueError, RuntimeError):  # a step needs the rows' value
            entry = None
    if len(_KERNELS) >= _MAX_KEYS:
        _KERNELS.clear()
    _KERNELS[key] = entry
    return entry


def _cuda_core_kernel(
    ms: _MatmulShape,
    sym: _MatmulShape,
    dtypes: tuple[str, str, str],
    sym_epi: KernelEpilogue | None,
    schedule: Any,
    target: Target,
) -> tuple[Any, Any] | None:
    """The workload of ``ms`` with ``schedule`` (the construction tuner's there; its outermost tiles are that
    workload's extents) and the PrimFunc of ``sym`` (``ms`` with its length-dependent extents variables,
    ``sym_epi`` its epilogue) lowered with it; None where a step needs a variable's value."""
    from gensorage.codegen.lower_schedule import lower
    from gensorage.codegen.predefined_matmul import _matmul_build
    from gensorage.construction import matmul_workload

    a, b, out = dtypes
    wl = matmul_workload(*ms.dims, a)
    build = _matmul_build(sym, a, out, None, b_dtype=b, epi=sym_epi)
    try:  # no GPU limits here: they read extents as numbers (Kernel checks them on concrete() at each length)
        return (wl, schedule), lower(dataclasses.replace(wl, build=build), schedule, target)["main"]
    except (ScheduleError, TypeError, ValueError, RuntimeError):
        return None


def _with_dims(ms: _MatmulShape, m: Any, n: Any, k: Any) -> _MatmulShape:
    """``ms`` with its rows, columns and reduction replaced (its batch dims kept)."""
    a, b, out = ms.a[:-2] + (m, k), ms.b[:-2] + (k, n), ms.out[:-2] + (m, n)
    return dataclasses.replace(ms, a=a, b=b, out=out)


def _extra_dims(epi: KernelEpilogue | None, out: tuple[int, ...]) -> tuple[tuple[bool, ...], ...]:
    """Per extra operand of ``epi`` (at most 2 dims, broadcast against the output's last two, ``out``), per dim:
    whether it is the output's (not 1: broadcasting makes it so; 1 where the output's is 1 too: either reads
    index 0, so a recorded choice decides, :mod:`gensorage.folds`)."""
    if epi is None:
        return ()

    def mine(d: int, o: int) -> bool:
        return decide(("out",) if d != 1 else ("broadcast", "out") if o == 1 else ("broadcast",)) == "out"

    return tuple(
        tuple(mine(d, o) for d, o in zip(shape, out[2 - len(shape) :], strict=True)) for shape, _ in epi.extra
    )


def _epi_with_dims(
    epi: KernelEpilogue | None, rows: Any, cols: Any, outs: tuple[tuple[bool, ...], ...]
) -> KernelEpilogue | None:
    """``epi`` with its extra operands' dims (at most 2, broadcast against the output's last two) replaced by
    ``rows`` and ``cols`` where they are the output's (``outs``, :func:`_extra_dims`)."""
    if epi is None:
        return None

    def dims(shape: tuple[int, ...], mine: tuple[bool, ...]) -> tuple[Any, ...]:
        vs = (rows, cols)[2 - len(shape) :]
        return tuple(v if m else d for d, v, m in zip(shape, vs, mine, strict=True))

    extra = tuple((dims(shape, mine), dt) for (shape, dt), mine in zip(epi.extra, outs, strict=True))
    return dataclasses.replace(epi, extra=extra)


def concrete(kern: Kernel) -> Kernel:
    """``kern`` with its PrimFunc's variables bound to the shapes of its parameters at this length (a generic
    matmul; other kernels as they are): for the checks that read extents as numbers (the GPU limits), and for
    the background build of a length's own kernels (the same tiles, the length's extents constants)."""
    from tvm import tirx

    func = kern.func
    for i, kp in enumerate(kern.params):
        if i >= len(func.params):
            break
        param = func.params[i]  # bound one at a time: a variable A declares is B's (or D's) too
        shape = getattr(param, "shape", None)  # a buffer parameter
        if shape is not None and not all(isinstance(d, tirx.IntImm) for d in shape):
            func = func.specialize({param: tirx.decl_buffer(kp.shape, param.dtype, param.name)})
    # the script too: kernels of the same script are compiled once (module.compile_kernels)
    return kern if func is kern.func else dataclasses.replace(kern, func=func, script=func.script())


def generic_matvec(
    g: KernelGraph,
    k: int,
    info: GraphInfo,
    hw: HwProfile,
    target: Target,
    scalar: Scalar,
    name: str,
    seed: int,
    matvec: KernelText,
) -> ScheduledKernel | None:
    """Within :func:`generic_matmuls` on CUDA, matmul ``k`` of few rows, whose kernel at this length is the
    matrix-vector product ``matvec`` (:func:`~gensorage.codegen.predefined._cooperative_matvec`), as its key's
    generic matmul (the rows a variable: the kernel every other length runs), with ``matvec`` as its own kernel
    (``own``: the length's own build) where their parameters agree (the generic kernel's split-k scratch taken
    unused); None elsewhere (the product is then compiled at its length)."""
    from gensorage.codegen.predefined_matmul import matmul_kernels, tensor_core_kernels

    if target != "cuda" or not active():
        return None
    kernels = tensor_core_kernels(g, k, info, hw, target, scalar, name, seed) or matmul_kernels(
        g, k, info, hw, target, scalar, name, seed
    )
    if len(kernels) != 1 or not kernels[0].rule.endswith("generic in the rows"):
        return None
    (kern,) = kernels
    scratch = kern.params[-1] if kern.params[-1].role == "scratch" else None
    mine = kern.params[:-1] if scratch is not None else kern.params
    if [_passed(p) for p in mine] != [_passed(p) for p in matvec.params]:  # called with the same arrays
        return None
    return dataclasses.replace(kern, own=functools.partial(own_text, matvec, scratch))


def _passed(p: KernelParam) -> tuple[Any, ...]:
    """What a kernel is passed for its parameter ``p`` (not its name)."""
    return p.role, p.ref, p.shape, p.dtype


def own_text(kt: KernelText, scratch: KernelParam | None = None) -> tuple[Any, str]:
    """``Kernel.own`` of a generic kernel whose own kernel at this length is the emitted text ``kt``: its PrimFunc
    and rule (with ``scratch``, the generic kernel's split-k scratch, as a parameter it does not use)."""
    from gensorage.codegen.module import _parse

    func = _parse(kt.text, kt.name)
    if scratch is None:
        return func, kt.rule
    return unused_param(func, scratch), kt.rule + "; the generic kernel's scratch unused"


def own_kernel(
    g: KernelGraph,
    k: int,
    info: GraphInfo,
    hw: HwProfile,
    scalar: Scalar,
    name: str,
    seed: int,
    params: tuple[KernelParam, ...],
    target: Target = "cuda",
    kernels_of: Any = None,
) -> tuple[Any, str] | None:
    """The PrimFunc and rule of matmul ``k``'s ``target`` kernel as its construction at these shapes gives it (not the
    generic one), where that is one kernel with ``params``, or with ``params`` but the generic kernel's split-k
    scratch (taken as a parameter it does not use: the caller allocates it for the generic kernel).
    ``kernels_of``: the lowering (:func:`~gensorage.codegen.predefined_matmul.tensor_core_kernels` unless given: ``matmul_kernels``)."""
    from gensorage.codegen.predefined_matmul import tensor_core_kernels
    from gensorage.construction import warm_starts

    # warm starts: the construction the dispatcher's lowering of a length makes (superopt.dispatch), which a
    # background thread does not inherit; the cold one differed (4x slower float32 projections at 100 tokens)
    with generic_matmuls(False), warm_starts():
        kernels = (kernels_of or tensor_core_kernels)(g, k, info, hw, target, scalar, name, seed)
    if len(kernels) != 1:
        return None
    (kern,) = kernels
    if kern.params == params:
        return kern.func, kern.rule
    if params[-1].role == "scratch" and kern.params == params[:-1]:
        return unused_param(kern.func, params[-1]), kern.rule + "; the generic kernel's scratch unused"
    return None


def unused_param(func: Any, param: KernelParam) -> Any:
    """``func`` with one more buffer parameter, ``param``, that its body does not read."""
    from tvm import tirx

    buf = tirx.decl_buffer(param.shape, param.dtype, param.name)
    return tirx.PrimFunc([*func.params, buf], func.body, func.ret_type, func.attrs)


__all__ = [
    "active",
    "concrete",
    "generic_kernel",
    "generic_matmuls",
    "generic_matvec",
    "own_kernel",
    "own_text",
    "unused_param",
]

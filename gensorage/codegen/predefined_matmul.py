"""The pre-defined ``matmul`` kernel op (2-D or batched, numpy broadcasting over batch dims).

- float16 and bfloat16 operands: the tensor-core kernel of :mod:`gensorage.codegen.tensor_core`, with the tiles
  :func:`gensorage.construction.tensor_core.construct_tensor_core` picks;
- otherwise the construction tuner's CUDA-core kernel: the tile workload
  (:func:`gensorage.construction.block_threads.matmul_workload`: ``gemm`` or ``batch_matmul`` with the batch dims
  flattened) is scheduled by :func:`gensorage.markov.construct`, and the schedule is applied by
  :func:`gensorage.codegen.lower_schedule.lower`.

Either way the PrimFunc has the matmul's axes, loads that follow the broadcast, and a write-back that casts to
the tensor's dtype (16-bit inputs accumulate in float32). In field mode the same schedule is applied to an int64
reduction of ``truncmod(a * b, m)`` with a ``mod m`` epilogue, once per modulus (component). When neither
construction finds a kernel that fits, the caller emits one thread per output element.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from gensorage.codegen import generic_matmul
from gensorage.codegen.epilogue_expr import KernelEpilogue
from gensorage.codegen.kernel_text import KernelParam, ScheduledKernel, Target
from gensorage.codegen.operand_views import graph_views, layout_name, matmul_operands
from gensorage.codegen.scalar import FieldScalar, Scalar
from gensorage.construction import construct_schedule, matmul_workload
from gensorage.errors import ScheduleError, UnsupportedOpError
from gensorage.hw.profile import HwProfile
from gensorage.opset import epilogue
from gensorage.precision import promote
from gensorage.ugraph.ir import KernelGraph, KernelOp, Ref
from gensorage.ugraph.shapes import GraphInfo, TensorInfo

if TYPE_CHECKING:
    from gensorage.codegen.tensor_core import TensorCoreTiles
    from gensorage.markov.schedule import Schedule


@dataclass(frozen=True, slots=True)
class _MatmulShape:
    """A matmul's logical operand shapes; ``ta`` / ``tb``: that operand is stored with its last two dims swapped
    (a transposed view, :mod:`gensorage.codegen.operand_views`): A as ``[.., k, m]``, B as ``[.., n, k]``."""

    a: tuple[int, ...]
    b: tuple[int, ...]
    out: tuple[int, ...]
    ta: bool = False
    tb: bool = False

    @property
    def stored_a(self) -> tuple[int, ...]:
        return _swapped(self.a) if self.ta else self.a

    @property
    def stored_b(self) -> tuple[int, ...]:
        return _swapped(self.b) if self.tb else self.b

    @property
    def layout(self) -> str:
        """``nn``, ``nt``, ``tn`` or ``tt``: whether A, then B, is stored transposed."""
        return layout_name(self.ta, self.tb)

    @property
    def batch(self) -> tuple[int, ...]:
        return self.out[:-2]

    @property
    def dims(self) -> tuple[int, int, int, int]:
        return math.prod(self.batch), self.out[-2], self.out[-1], self.a[-1]

    def flat(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The kernel's view of an operand: batch dims flattened into one (none for 2-D matmuls)."""
        return shape if not self.batch or len(shape) == 2 else (math.prod(shape[:-2]), *shape[-2:])


def _swapped(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (*shape[:-2], shape[-1], shape[-2])


def _at(flag: bool, row: Any, col: Any) -> tuple[Any, Any]:
    """Index (row, col) of a logical operand in its storage (swapped when it is stored transposed)."""
    return (col, row) if flag else (row, col)


def _batch_index(b: Any, batch: tuple[int, ...], operand: tuple[int, ...]) -> Any:
    """Flat batch index into ``operand``'s batch dims (numpy-broadcast against ``batch``) for output batch ``b``."""
    from tvm import tirx

    if operand == batch:
        return b
    lead = len(batch) - len(operand)
    flat: Any = tirx.const(0, "int32")
    stride = 1
    for d in reversed(range(len(operand))):
        if operand[d] != 1:
            inner = math.prod(batch[lead + d + 1 :])
            flat = flat + tirx.floormod(tirx.floordiv(b, inner), batch[lead + d]) * stride
        stride *= operand[d]
    return flat


def _matmul_build(
    ms: _MatmulShape,
    dtype: str,
    out_dtype: str,
    modulus: int | None,
    split_k: int = 1,
    rows_to: int = 1,
    b_dtype: str | None = None,
    cast_to: str | None = None,
    epi: KernelEpilogue | None = None,
    cast_by_bits: bool = False,
) -> Any:
    """Build function of the lowered workload: broadcast loads, reduction, cast (float) or mod (field) epilogue.

    ``epi``: the matmul's own epilogue steps (:mod:`gensorage.codegen.epilogue_expr`), applied in ``D`` to the
    accumulated value before the cast; its extra operands are parameters after ``B``.

    With ``split_k > 1`` (2-D matmuls): ``C[s, i, j]`` sums the ``s``-th slice of the reduction, ``C`` is a
    fourth parameter (the partials' scratch buffer) and ``D`` adds the slices before its epilogue. Its rows
    are padded to a multiple of ``rows_to`` by a zero-filling producer of A (the slice index is not an
    einsum, so the schedule's ``pad_einsum`` cannot do it). ``B`` has ``b_dtype`` when it differs from A's (a
    float32 intermediate times a float16 weight); the product accumulates in the wider of float32 and both.
    ``cast_to`` converts both operands first (the tensor-core MMA dtype of mixed operands, see
    :func:`~gensorage.codegen.tensor_core.mma_dtype`), in producers the schedule inlines into its shared copies;
    ``cast_by_bits`` (the llvm twin) rounds to bfloat16 by the bits as the GPU's conversion does, since TVM's
    llvm build drops a float32 -> bfloat16 -> float32 cast (:func:`~gensorage.codegen.mma_bfloat16.bfloat16_rounded`).
    """
    from tvm import te, tirx

    b_type = b_dtype or dtype

    def build() -> Any:
        field = modulus is not None
        a = te.placeholder(ms.flat(ms.stored_a), "int64" if field else dtype, name="A")
        bt = te.placeholder(ms.flat(ms.stored_b), "int64" if field else b_type, name="B")
        _, m, n, kdim = ms.dims
        k = te.reduce_axis((0, kdim), name="k")
        acc = "int64" if field else promote([dtype, b_type, "float32"])
        extra = [
            te.placeholder(shape, "int64" if field else dt, name=f"E{i}")
            for i, (shape, dt) in enumerate(epi.extra if epi else ())
        ]

        def finish(v: Any, ix: tuple[Any, ...]) -> Any:
            """The stored value of output element ``ix`` from its accumulated ``v``."""
            if modulus is not None:
                v = tirx.truncmod(v, tirx.const(modulus, "int64"))
            if epi is not None:
                v = epi.value(v, extra, ix, modulus)
            return v if modulus is not None or acc == out_dtype else v.astype(out_dtype)

        if cast_to is not None and not field:
            a = _cast(a, cast_to, "A_mma", cast_by_bits)
            bt = _cast(bt, cast_to, "B_mma", cast_by_bits)

        def term(x: Any, y: Any) -> Any:
            if modulus is not None:
                return tirx.truncmod(x * y, tirx.const(modulus, "int64"))
            return x.astype(acc) * y.astype(acc)

        if split_k > 1:
            return _split_k_func(a, bt, ms, split_k, rows_to, term, finish, extra)
        if ms.batch:

            def body(b: Any, i: Any, j: Any) -> Any:
                ai: tuple[Any, ...] = _at(ms.ta, i, k)
                bi: tuple[Any, ...] = _at(ms.tb, k, j)
                ai = (_batch_index(b, ms.batch, ms.a[:-2]), *ai) if len(ms.a) > 2 else ai
                bi = (_batch_index(b, ms.batch, ms.b[:-2]), *bi) if len(ms.b) > 2 else bi
                return te.sum(term(a[ai], bt[bi]), axis=k)

            c = te.compute((math.prod(ms.batch), m, n), body, name="C")
        else:
            c = te.compute(
                (m, n),
                lambda i, j: te.sum(term(a[_at(ms.ta, i, k)], bt[_at(ms.tb, k, j)]), axis=k),
                name="C",
            )
        d = (
            c
            if modulus is None and epi is None and out_dtype == acc
            else te.compute(c.shape, lambda *ix: finish(c[ix], ix), name="D")
        )
        return te.create_prim_func([_param(a), _param(bt), *extra, d])

    return build


def _param(t: Any) -> Any:
    """The placeholder (function parameter) under an operand's producers (a cast, the rows' padding)."""
    from tvm import te

    while not isinstance(t.op, te.PlaceholderOp):
        t = t.op.input_tensors[0]
    return t


def _cast(x: Any, dtype: str, name: str, by_bits: bool = False) -> Any:
    from tvm import te

    from gensorage.codegen.mma_bfloat16 import bfloat16_rounded

    if str(x.dtype) == dtype:
        return x
    if by_bits and dtype == "bfloat16":
        return te.compute(
            x.shape, lambda *i: bfloat16_rounded(x[i].astype("float32")).astype(dtype), name=name
        )
    return te.compute(x.shape, lambda *i: x[i].astype(dtype), name=name)


def _split_k_func(
    a: Any,
    bt: Any,
    ms: _MatmulShape,
    split_k: int,
    rows_to: int,
    term: Any,
    finish: Any,
    extra: list[Any],
) -> Any:
    from tvm import te, tirx

    _, m, n, kdim = ms.dims
    kc = kdim // split_k
    mp = -(-m // rows_to) * rows_to if isinstance(m, int) else (m + rows_to - 1) // rows_to * rows_to
    # rows padded in A's own layout (a transposed A pads its columns); rows that are a variable (the generic
    # kernel, codegen.generic_matmul) are padded at every value: the guard is in the code at every length
    if not isinstance(m, int) or mp != m:
        zero = tirx.const(0, a.dtype)
        a = te.compute(
            _at(ms.ta, mp, kdim),
            lambda *ix: tirx.if_then_else(_at(ms.ta, *ix)[0] < m, a[ix], zero),
            name="A_pad",
        )
    kk = te.reduce_axis((0, kc), name="k")
    c = te.compute(
        (split_k, mp, n),
        lambda s, i, j: te.sum(term(a[_at(ms.ta, i, s * kc + kk)], bt[_at(ms.tb, s * kc + kk, j)]), axis=kk),
        name="C",
    )

    def total(i: Any, j: Any) -> Any:
        v = c[0, i, j]
        for s in range(1, split_k):  # a few slices: an unrolled sum keeps D elementwise
            v = v + c[s, i, j]
        return finish(v, (i, j))

    d = te.compute((m, n), total, name="D")
    return te.create_prim_func([_param(a), _param(bt), *extra, d, c])


def matmul_prim_func(
    a: tuple[int, ...],
    b: tuple[int, ...],
    out: tuple[int, ...],
    dtype: str,
    out_dtype: str,
    split_k: int = 1,
    rows_to: int = 1,
    layout: str = "nn",
) -> Any:
    """The PrimFunc a matmul kernel op of these (logical) shapes is scheduled from (float arithmetic); ``layout``
    says which operand is stored transposed (``nt``: B as ``[.., n, k]``, the layout of ``x @ W.T``)."""
    ms = _MatmulShape(a, b, out, layout[0] == "t", layout[1] == "t")
    return _matmul_build(ms, dtype, out_dtype, None, split_k, rows_to)()


@dataclass(frozen=True, slots=True)
class _Operands:
    """A matmul kernel op's tensors and shapes, as both kernel builders see them."""

    op: KernelOp
    a: TensorInfo
    b: TensorInfo
    out: TensorInfo
    shape: _MatmulShape
    out_ref: Ref
    sources: tuple[Ref, Ref]  # the tensors A and B are read from (a transposed view's input)
    extra: tuple[TensorInfo, ...] = ()  # an epilogue's extra operands

    def params(self, modulus: int | None) -> tuple[KernelParam, ...]:
        """A, B (as stored), C as the kernel declares them (int64 residues in field mode)."""
        dt = "int64" if modulus is not None else None
        ms = self.shape
        extra = tuple(
            KernelParam(f"E{i}", "input", r, t.shape, dt or t.dtype)
            for i, (r, t) in enumerate(zip(self.op.inputs[2:], self.extra, strict=True))
        )
        return (
            KernelParam("A", "input", self.sources[0], ms.flat(ms.stored_a), dt or self.a.dtype),
            KernelParam("B", "input", self.sources[1], ms.flat(ms.stored_b), dt or self.b.dtype),
            *extra,
            KernelParam("C", "output", self.out_ref, ms.flat(self.out.shape), dt or self.out.dtype),
        )

    @property
    def epilogue(self) -> KernelEpilogue | None:
        steps = epilogue(self.op.attrs)
        extra = tuple((t.shape, t.dtype) for t in self.extra)
        return KernelEpilogue(steps, extra, self.shape.batch) if steps else None


def _operands(g: KernelGraph, k: int, info: GraphInfo) -> _Operands:
    op = g.ops[k]
    assert isinstance(op, KernelOp)
    ta, tb = (info.of(r) for r in op.inputs[:2])
    out = info.nodes[len(g.inputs) + k][0]
    va, vb = matmul_operands(g, k, graph_views(g, info))
    ms = _MatmulShape(ta.shape, tb.shape, out.shape, va.transposed, vb.transposed)
    extra = tuple(info.of(r) for r in op.inputs[2:])
    return _Operands(op, ta, tb, out, ms, Ref(len(g.inputs) + k), (va.ref, vb.ref), extra)


def _moduli(scalar: Scalar) -> list[int | None]:
    """One kernel per modulus in field mode (each computes one residue), one float kernel otherwise."""
    return list(scalar.mods) if isinstance(scalar, FieldScalar) else [None]


def tensor_core_kernels(
    g: KernelGraph,
    k: int,
    info: GraphInfo,
    hw: HwProfile,
    target: Target,
    scalar: Scalar,
    name: str,
    seed: int,
) -> list[ScheduledKernel]:
    """The matmul on tensor cores when :func:`~gensorage.codegen.tensor_core.mma_dtype` gives its operands an
    MMA dtype (two equal 16-bit dtypes, or a float32 operand with a 16-bit one, converted to bfloat16); none
    otherwise.

    The field twin and the llvm twin run the same tiling without tensorization (see
    :mod:`gensorage.codegen.tensor_core`).
    """
    from gensorage.codegen.tensor_core import RULE, TensorCoreTiles, mma_dtype, schedule_tensor_core
    from gensorage.construction.tensor_core import construct_predefined_matmul

    ops = _operands(g, k, info)
    mma = mma_dtype(ops.a.dtype, ops.b.dtype)
    ms = ops.shape

    def construct() -> Any:
        return construct_predefined_matmul(ms.a, ms.b, ms.out, ops.a.dtype, ops.b.dtype, hw, seed, ms.layout)

    if (
        target in ("cuda", "llvm")  # llvm: the twin of the same schedule (the compiled variants' first tier)
        and mma is not None
        and generic_matmul.active()
        and not isinstance(scalar, FieldScalar)
    ):
        cast = None if mma == ops.a.dtype == ops.b.dtype else mma
        dtypes = (ops.a.dtype, ops.b.dtype, ops.out.dtype)
        fixed = generic_matmul.generic_kernel(
            ms, dtypes, cast, ops.epilogue, hw, seed, lambda: (construct() or (None,))[0], target
        )
        if fixed is not None:  # the rows a variable, the tiles of the key's first length
            rule = f"{RULE} construct on matmul {list(ms.dims)}: {fixed[0].describe()}; generic in the rows"
            f = fixed[1].with_attr("global_symbol", name)
            params = ops.params(None) + _scratch(ops, fixed[0], None)
            own = functools.partial(
                generic_matmul.own_kernel, g, k, info, hw, scalar, name, seed, params, target
            )
            return [ScheduledKernel(name, k, f, params, fixed[0].threads, rule, None, own)]
    got = construct()
    if mma is None or got is None:
        return []
    tiles = got[0]
    if not isinstance(tiles, TensorCoreTiles):
        return _wgmma_kernels(ops, k, tiles, target, scalar, name)
    cast = None if mma == ops.a.dtype == ops.b.dtype else mma
    rule = f"{RULE} construct on matmul {list(ms.dims)}: {tiles.describe()}"
    kernels = []
    for c, m in enumerate(_moduli(scalar)):
        build = _matmul_build(
            ms,
            ops.a.dtype,
            ops.out.dtype,
            m,
            tiles.split_k,
            tiles.block_m,
            ops.b.dtype,
            cast,
            ops.epilogue,
            cast_by_bits=target == "llvm",
        )
        try:
            # A converting copy is not a byte copy: shorter vectors, not cp.async.
            sch = schedule_tensor_core(build(), tiles, gpu=target == "cuda", convert=cast is not None)
        except ScheduleError as exc:
            raise UnsupportedOpError(f"kernel op %{len(g.inputs) + k} (matmul): {exc}") from exc
        kname = name if m is None else f"{name}_c{c}"
        params = ops.params(m) + _scratch(ops, tiles, m)
        f = sch.mod["main"].with_attr("global_symbol", kname)
        kernels.append(ScheduledKernel(kname, k, f, params, tiles.threads, rule, None if m is None else c))
    return kernels


def _scratch(ops: _Operands, tiles: TensorCoreTiles, modulus: int | None) -> tuple[KernelParam, ...]:
    """Split-k's partials (float32, int64 residues in field mode), written then added: a parameter the caller
    allocates at these shapes (its rows padded to the block's); none without split-k."""
    if tiles.split_k == 1:
        return ()
    rows = -(-ops.out.shape[0] // tiles.block_m) * tiles.block_m
    shape = (tiles.split_k, rows, ops.out.shape[1])
    return (KernelParam("P", "scratch", None, shape, "int64" if modulus is not None else "float32"),)


def _wgmma_kernels(
    ops: _Operands, k: int, tiles: Any, target: Target, scalar: Scalar, name: str
) -> list[ScheduledKernel]:
    """The matmul as a Hopper wgmma kernel (:mod:`gensorage.codegen.wgmma`); on llvm its twin, per modulus in
    field mode."""
    from gensorage.codegen.tensor_core import mma_dtype
    from gensorage.codegen.wgmma import RULE, wgmma_matmul
    from gensorage.codegen.wgmma_twin import wgmma_twin

    ms = ops.shape
    assert ms.layout in ("nn", "nt")  # the construction keeps a transposed A on mma.sync
    a, b, out = ms.flat(ms.a), ms.flat(ms.stored_b), ms.flat(ms.out)
    rule = f"{RULE} construct on matmul {list(ms.dims)}: {tiles.describe()}"
    a_type, b_type = ops.a.dtype, ops.b.dtype
    if a_type != b_type:  # converted by the threads' copies; TMA, which copies bytes, is not constructed
        rule += f"; {a_type} x {b_type} operands converted to {mma_dtype(a_type, b_type)} in the copies"
    kernels = []
    for c, m in enumerate(_moduli(scalar)):
        try:
            epi, kb = ops.epilogue, ms.tb
            if target == "cuda":
                func = wgmma_matmul(
                    a, b, out, a_type, ops.out.dtype, tiles, k_major_b=kb, epi=epi, b_dtype=b_type
                )
            elif m is None:
                func = wgmma_twin(
                    a, b, out, a_type, ops.out.dtype, tiles, k_major_b=kb, epi=epi, b_dtype=b_type
                )
            else:
                func = wgmma_twin(a, b, out, "int64", "int64", tiles, modulus=m, k_major_b=ms.tb, epi=epi)
        except ScheduleError as exc:
            raise UnsupportedOpError(f"kernel op %{ops.out_ref.node} (matmul): {exc}") from exc
        kname = name if m is None else f"{name}_c{c}"
        f = func.with_attr("global_symbol", kname)
        component = None if m is None else c
        kernels.append(ScheduledKernel(kname, k, f, ops.params(m), tiles.threads, rule, component))
    return kernels


@lru_cache(maxsize=1024)
def _scheduled(
    ms: _MatmulShape,
    dtypes: tuple[str, str, str],
    m: int | None,
    schedule: Schedule,
    target: Target,
    hw: HwProfile | None,
    epi: KernelEpilogue | None = None,
) -> Any:
    """The PrimFunc of a matmul of shapes ``ms`` and ``dtypes`` (A, B, output) lowered with ``schedule``, its
    epilogue ``epi`` folded into the write-back: the
    same for every op of that shape, layout and schedule (a layer's gate and up projections, its k and v
    projections, every layer of a model), so TVM's schedule primitives run once for them (they are most of a
    matmul's lowering time)."""
    from gensorage.codegen import matmul_rows
    from gensorage.codegen.lower_schedule import lower

    a_dtype, b_dtype, out_dtype = dtypes
    # the rows (a new length's tokens) bound into a symbolic schedule (matmul_rows; off by default)
    if target == "llvm" and m is None and matmul_rows.ENABLED:
        func = matmul_rows.specialised(
            ms,
            dtypes,
            schedule,
            epi,
            lambda s, e: _matmul_build(s, a_dtype, out_dtype, m, b_dtype=b_dtype, epi=e),
        )
        if func is not None:
            return func
    build = _matmul_build(ms, a_dtype, out_dtype, m, b_dtype=b_dtype, epi=epi)
    wl = dataclasses.replace(matmul_workload(*ms.dims, a_dtype), build=build)
    return lower(wl, schedule, target, hw=hw)["main"]


def matmul_kernels(
    g: KernelGraph,
    k: int,
    info: GraphInfo,
    hw: HwProfile,
    target: Target,
    scalar: Scalar,
    name: str,
    seed: int,
) -> list[ScheduledKernel]:
    from gensorage.codegen.lower_schedule import threads_per_block

    ops = _operands(g, k, info)
    ms = ops.shape
    base = matmul_workload(*ms.dims, ops.a.dtype)

    def construct() -> Schedule | None:
        try:
            return construct_schedule(base, hw, seed)
        except ScheduleError:
            return None

    def rule_of(schedule: Schedule, wl: Any = base) -> str:
        return (
            f"markov construct on {wl.key()}: T0={list(schedule.tiles[0])}, T1={list(schedule.tiles[1])}, "
            f"vthreads={list(schedule.vthreads)}"
        )

    if target in ("cuda", "llvm") and generic_matmul.active() and not isinstance(scalar, FieldScalar):
        # the float32 projections as the tensor-core ones: the rows a variable, the key's first schedule
        dtypes = (ops.a.dtype, ops.b.dtype, ops.out.dtype)
        fixed = generic_matmul.generic_kernel(
            ms, dtypes, None, ops.epilogue, hw, seed, construct, target, True
        )
        if fixed is not None:
            params = ops.params(None)
            f = fixed[1].with_attr("global_symbol", name)
            own = functools.partial(
                generic_matmul.own_kernel, g, k, info, hw, scalar, name, seed, params, target, matmul_kernels
            )
            wl, schedule = fixed[
                0
            ]  # the key's first workload (the schedule's outermost tiles are its extents)
            threads = threads_per_block(wl, schedule)
            rule = f"{rule_of(schedule, wl)}; generic in the rows"
            return [ScheduledKernel(name, k, f, params, threads, rule, None, own)]
    schedule = construct()
    if schedule is None:
        return []  # no schedule fits: the caller emits the one-thread-per-element kernel
    rule = rule_of(schedule)
    threads = threads_per_block(base, schedule)
    kernels = []
    for c, m in enumerate(_moduli(scalar)):
        dtypes = (ops.a.dtype, ops.b.dtype, ops.out.dtype)
        try:
            main = _scheduled(ms, dtypes, m, schedule, target, hw if target == "cuda" else None, ops.epilogue)
        except ScheduleError as exc:
            raise UnsupportedOpError(f"kernel op %{len(g.inputs) + k} (matmul): {exc}") from exc
        kname = name if m is None else f"{name}_c{c}"
        func = main.with_attr("global_symbol", kname)
        kernels.append(
            ScheduledKernel(kname, k, func, ops.params(m), threads, rule, None if m is None else c)
        )
    return kernels


def takes_epilogue(g: KernelGraph, k: int, info: GraphInfo, field: bool) -> bool:
    """Whether the kernel family emitted for matmul op ``k`` runs its epilogue itself: the one-thread-per-row
    matrix-vector kernel and the one-element-per-thread kernel (every step, float and field); the mma.sync and
    wgmma (cp.async and TMA) tensor-core kernels and the CUDA-core construction's kernel take every step in
    float, and in their field twins (one residue per kernel) the residue expressions of
    :data:`~gensorage.codegen.epilogue_expr.FIELD_STEPS` only: activations and exp mix both residues, so there
    that matmul keeps its separate element-wise kernels."""
    from gensorage.codegen.epilogue_expr import field_steps_only
    from gensorage.codegen.predefined import MAX_COOPERATIVE_ROWS, MIN_COOPERATIVE_INNER

    ops = _operands(g, k, info)
    ms = ops.shape
    if ms.out[-2] <= MAX_COOPERATIVE_ROWS and ms.a[-1] >= MIN_COOPERATIVE_INNER:
        return True  # the cooperative matrix-vector kernel (or its one-element fallback): text kernels
    # mma.sync, wgmma and the CUDA-core construction alike: a TE write-back block, one residue per field kernel
    return not field or field_steps_only(epilogue(ops.op.attrs))


def gemm_epilogues(g: KernelGraph, field: bool) -> tuple[KernelGraph, list[int]]:
    """``g`` with the epilogues its GEMM kernels do not take (:func:`takes_epilogue`) as separate element-wise
    ops again, and where each op index went; ``g`` itself when every epilogue is taken."""
    from gensorage.ugraph.optimize.fuse_epilogues import has_epilogue, split_epilogues
    from gensorage.ugraph.validate import validate

    if not any(has_epilogue(op) for op in g.ops):
        return g, list(range(len(g.ops)))
    info = validate(g)
    refused = {k for k, op in enumerate(g.ops) if has_epilogue(op) and not takes_epilogue(g, k, info, field)}
    if not refused:
        return g, list(range(len(g.ops)))
    return split_epilogues(g, lambda k: k not in refused)

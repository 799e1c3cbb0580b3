"""Pre-defined kernel ops of a µGraph lowered to TVM PrimFuncs.

- ``matmul``: :mod:`gensorage.codegen.predefined_matmul` (tensor cores for 16-bit operands, the construction
  tuner's CUDA-core kernel otherwise); a matrix-vector product of a few rows gets the cooperative kernel below;
  a matmul no construction fits falls back to one thread per output element (the rule of the next item).
- elementwise ops (``add_scalar`` too), ``sum`` (full or grouped), ``max``, ``repeat``, ``transpose`` (a copy,
  unless its matmuls read it in place: :mod:`gensorage.codegen.operand_views`) and ``concat``: one thread per output element, ``threads`` from the fallback rule of
  :mod:`gensorage.construction.block_threads`, blocks along x. A ``sum`` or ``max`` over at least
  :data:`MIN_COOPERATIVE_SUM` consecutive elements (a row) gets the cooperative row reduction instead: lanes
  combine partial results pairwise in shared memory (``max`` starts from the dtype's lowest value).
- ``reshape``: no kernel: the output is a view of the input (row-major, contiguous).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from gensorage.codegen import generic_matmul
from gensorage.codegen.generic_matmul import generic_matvec
from gensorage.codegen.gpu_limits import MAX_GRID
from gensorage.codegen.kernel_text import KernelParam, KernelText, ScheduledKernel, Target
from gensorage.codegen.operand_views import graph_views, matmul_operands
from gensorage.codegen.predefined_matmul import matmul_kernels, tensor_core_kernels
from gensorage.codegen.scalar import FIELD_PARAMS, Scalar, combined, reduction_kind
from gensorage.codegen.tir_text import (
    Ix,
    Writer,
    broadcast_index,
    index_text,
    shape_text,
    summed_index,
    unravel,
)
from gensorage.construction import fallback_threads
from gensorage.errors import UnsupportedOpError
from gensorage.folds import same_folds
from gensorage.hw.profile import HwProfile
from gensorage.opset import BINARY_ELEMENTWISE, REDUCTIONS, UNARY_ELEMENTWISE, Op, attr, epilogue, transposed
from gensorage.ugraph.ir import KernelGraph, KernelOp, Ref
from gensorage.ugraph.shapes import GraphInfo

# Every thread of an elementwise kernel handles one element; blocks go along x.
_MAX_BLOCKS_X = MAX_GRID[0]
_SIMPLE = ", one output element each"


def is_alias(op: KernelOp) -> bool:
    """Ops that need no kernel (their output is a view of their input)."""
    return op.op is Op.RESHAPE


# ------------------------------------------------------------------------------------------- simple kernels


def _simple(
    g: KernelGraph,
    k: int,
    info: GraphInfo,
    hw: HwProfile,
    target: Target,
    scalar: Scalar,
    name: str,
    threads: int | None = None,
    guard: bool = False,
) -> KernelText:
    """One thread per output element: ``out[unravel(bx * threads + tx)] = f(inputs)`` (``threads``: a block's,
    default one per element up to the block limit; ``guard``: the bounds guard even where the grid covers the
    elements exactly, as on a GPU)."""
    op = g.ops[k]
    assert isinstance(op, KernelOp)
    out = info.nodes[len(g.inputs) + k][0]
    n = math.prod(out.shape)
    nt = threads or fallback_threads(n, hw)
    blocks = -(-n // nt)
    if blocks > _MAX_BLOCKS_X:
        raise UnsupportedOpError(f"kernel op %{len(g.inputs) + k} ({op.op.value}) needs {blocks} blocks")
    gpu = target == "cuda"
    w = Writer(1)
    bloop = f'T.thread_binding({blocks}, thread="blockIdx.x")' if gpu else f"T.parallel({blocks})"
    tloop = f'T.thread_binding({nt}, thread="threadIdx.x")' if gpu else f"T.serial({nt})"
    with w.block(f"for bx in {bloop}:"), w.block(f"for tx in {tloop}:"):
        w.line(f"f = {Ix.var('bx') * nt + Ix.var('tx')}")
        # A GPU kernel keeps its bounds guard where the grid covers the elements exactly (a length that is a
        # multiple of the block): one kernel text at every length, so a new length binds the template of the
        # first one (script_templates) instead of parsing a guarded form. One compare per thread of a
        # memory-bound kernel.
        with w.block(f"if f < {n}:") if gpu or guard or blocks * nt > n else nullcontext():
            idx = unravel(Ix.var("f"), out.shape)
            views = _matmul_at(g, k, info) if op.op is Op.MATMUL else (False, False)
            _element(w, op, [info.of(r) for r in op.inputs], out, idx, scalar, views)
    params, text = _function(g, k, info, scalar, name, w)
    why = "no construction schedule fits" if op.op is Op.MATMUL else f"pre-defined {op.op.value}"
    rule = f"fallback ({why}): {nt} threads{_SIMPLE}"
    return KernelText(name, k, text, tuple(params), (blocks,), nt, rule)


def _function(
    g: KernelGraph, k: int, info: GraphInfo, scalar: Scalar, name: str, w: Writer
) -> tuple[tuple[KernelParam, ...], str]:
    """The parameters (inputs, the output, the field constants) and the PrimFunc text around body ``w``."""
    op = g.ops[k]
    assert isinstance(op, KernelOp)
    out = info.nodes[len(g.inputs) + k][0]
    params = [
        KernelParam(f"in{i}", "input", r, scalar.buf_shape(shape), scalar.buf_dtype(info.of(r).dtype))
        for i, (r, shape) in enumerate(_stored_inputs(g, k, info))
    ]
    params.append(
        KernelParam(
            "out0", "output", Ref(len(g.inputs) + k), scalar.buf_shape(out.shape), scalar.buf_dtype(out.dtype)
        )
    )
    if scalar.field:
        params.append(KernelParam("F", "field", None, (FIELD_PARAMS,), "int64"))
    sig = ", ".join(f'{p.name}: T.Buffer({shape_text(p.shape)}, "{p.dtype}")' for p in params)
    text = (
        f"@T.prim_func\ndef {name}({sig}):\n"
        f'    T.func_attr({{"global_symbol": "{name}", "tir.noalias": True}})\n' + w.text()
    )
    return tuple(params), text


def _stored_inputs(g: KernelGraph, k: int, info: GraphInfo) -> list[tuple[Ref, tuple[int, ...]]]:
    """(tensor, shape as stored) of each input of op ``k``: a matmul reads a transposed view's input."""
    op = g.ops[k]
    assert isinstance(op, KernelOp)
    if op.op is not Op.MATMUL:
        return [(r, info.of(r).shape) for r in op.inputs]
    operands = [(o.ref, info.of(o.ref).shape) for o in matmul_operands(g, k, graph_views(g, info))]
    return operands + [(r, info.of(r).shape) for r in op.inputs[2:]]  # an epilogue's extra operands


def _epilogue(w: Writer, op: KernelOp, ins: list[Any], idx: list[Ix], sc: Scalar, product: Any) -> Any:
    """A matmul's epilogue (:func:`gensorage.opset.epilogue`) on its ``product`` (a register value) at output
    element ``idx``: its extra operands (``in2``, ...) loaded there with broadcasting, each step applied in order."""
    values = [product]
    for i in range(2, len(ins)):
        at = index_text(broadcast_index(idx, ins[i].shape))
        values.append(sc.load(f"in{i}", at, sc.buf_dtype(ins[i].dtype)))
    for name, args, attrs in epilogue(op.attrs):
        values.append(sc.op(w, Op(name), attrs, [values[a] for a in args]))
    return values[-1]


def _matmul_at(g: KernelGraph, k: int, info: GraphInfo) -> tuple[bool, bool]:
    """Whether matmul op ``k``'s A and B are read through a transposed view (their indices swapped)."""
    a, b = matmul_operands(g, k, graph_views(g, info))
    return a.transposed, b.transposed


def _stored(flag: bool, row: Ix, col: Ix) -> list[Ix]:
    return [col, row] if flag else [row, col]


# ------------------------------------------------------------------------------------ row reductions

#: A sum over at least this many consecutive elements gets a cooperative kernel (lanes per output).
MIN_COOPERATIVE_SUM = 64
#: Threads of one cooperative block, and the most lanes one output gets.
_REDUCE_THREADS = 256
#: Each lane adds at least about this many elements before the lanes combine.
_PER_LANE = 16


def sum_layout(op: KernelOp, shape: tuple[int, ...]) -> tuple[int, int, bool, bool] | None:
    """(dim, count, full, keep) of a sum or max whose reduced elements are consecutive in memory, else None.

    Consecutive means every dim after the reduced one has extent 1 (a row reduction, or groups along the last
    dim).
    """
    dim = int(attr(op.attrs, "dim")) % len(shape)
    group = attr(op.attrs, "group")
    full = group is None or group == shape[dim]
    count = shape[dim] if full else int(group)
    if any(s != 1 for s in shape[dim + 1 :]) or count < MIN_COOPERATIVE_SUM:
        return None
    return dim, count, full, _keepdim(op)


def _keepdim(op: KernelOp) -> bool:
    """A reduction's keepdim (the ops' defaults differ: sum keeps the dim, max drops it, like torch)."""
    return bool(attr(op.attrs, "keepdim", op.op is Op.SUM))


def _threads(nt: int, gpu: bool) -> str:
    return f'T.thread_binding({nt}, thread="threadIdx.x")' if gpu else f"T.serial({nt})"


def _blocks(blocks: int, gpu: bool) -> str:
    return f'T.thread_binding({blocks}, thread="blockIdx.x")' if gpu else f"T.parallel({blocks})"


def _partials_buffer(w: Writer, sc: Scalar, nt: int, gpu: bool) -> None:
    """``red``: one partial sum per thread of the block (shared memory; on the CPU, per block iteration)."""
    w.line(
        f'red = T.alloc_buffer({shape_text(sc.buf_shape((nt,)))}, "{sc.acc_dtype}", '
        f'scope="{"shared" if gpu else "global"}")'
    )


def _zero_acc(w: Writer, sc: Scalar, kind: str = "sum") -> None:
    """``acc``: one accumulator in registers, set to the identity of ``kind`` (0, or the lowest value)."""
    w.line(f'acc = T.alloc_buffer({shape_text(sc.buf_shape((1,)))}, "{sc.acc_dtype}", scope="local")')
    for c, e in enumerate(sc.initial(kind).comps):
        w.line(f"{sc.at('acc', c, '0')} = {e}")


def _keep_partial(w: Writer, sc: Scalar) -> None:
    """Inside a thread loop: the thread's ``acc`` into ``red[tx]``."""
    for c in range(len(sc.zero().comps)):
        w.line(f"{sc.at('red', c, 'tx')} = {sc.at('acc', c, '0')}")


def _add_lanes(
    w: Writer,
    sc: Scalar,
    threads: str,
    gpu: bool,
    lanes: int,
    stride: int,
    below: Callable[[int], str],
    kind: str = "sum",
) -> None:
    """Add the ``lanes`` partial sums of each output pairwise: consecutive lanes sit ``stride`` threads apart,
    ``below(step)`` says (in ``tx``) that a thread's lane is below ``step``, and after log2(lanes) steps lane 0
    holds the sum. A barrier precedes each step (the steps are separate thread loops, so on the CPU they run
    one after another) and follows the last."""
    step = lanes // 2
    while step >= 1:
        if gpu:
            w.line('T.tvm_storage_sync("shared")')
        with w.block(f"for tx in {threads}:"), w.block(f"if {below(step)}:"):
            both = combined(
                sc,
                kind,
                sc.load("red", "tx", sc.acc_dtype),
                sc.load("red", f"tx + {step * stride}", sc.acc_dtype),
            )
            for c, v in enumerate(both.comps):
                w.line(f"{sc.at('red', c, 'tx')} = {v}")
        step //= 2
    if gpu:
        w.line('T.tvm_storage_sync("shared")')


def _cooperative_sum(
    g: KernelGraph, k: int, info: GraphInfo, hw: HwProfile, target: Target, scalar: Scalar, name: str
) -> KernelText | None:
    """A row sum with ``lanes`` threads per output: lane l adds elements l, l + lanes, ... (so a warp reads
    consecutive addresses), then the lanes' partial sums are added pairwise in shared memory (log2(lanes)
    steps, a barrier after each). None when the sum is not over consecutive elements or is short."""
    op = g.ops[k]
    assert isinstance(op, KernelOp)
    x = info.of(op.inputs[0])
    layout = sum_layout(op, x.shape) if op.op in REDUCTIONS else None
    if layout is None:
        return None
    dim, count, full, keep = layout
    kind = reduction_kind(op.op)
    out = info.nodes[len(g.inputs) + k][0]
    n = math.prod(out.shape)
    lanes = hw.warp_size
    while lanes < _REDUCE_THREADS and lanes * _PER_LANE < count:
        lanes *= 2
    per_block = max(1, _REDUCE_THREADS // lanes)
    nt, blocks = lanes * per_block, -(-n // per_block)
    if blocks > _MAX_BLOCKS_X or nt > hw.max_threads_per_block:
        return None
    gpu, sc = target == "cuda", scalar
    w = Writer(1)
    threads = _threads(nt, gpu)
    with w.block(f"for bx in {_blocks(blocks, gpu)}:"):
        _partials_buffer(w, sc, nt, gpu)
        with w.block(f"for tx in {threads}:"):
            w.line(f"f = bx * {per_block} + tx // {lanes}")
            _zero_acc(w, sc, kind)
            with w.block(f"if f < {n}:") if blocks * per_block > n else nullcontext():
                with w.loop("st", -(-count // lanes)) as st:
                    w.line(f"e = {st * lanes} + tx % {lanes}")
                    with w.block(f"if e < {count}:") if count % lanes else nullcontext():
                        src = summed_index(
                            unravel(Ix.var("f"), out.shape), dim, Ix.var("e"), count, full, keep
                        )
                        x_e = sc.load("in0", index_text(src), sc.buf_dtype(x.dtype))
                        for c, v in enumerate(
                            combined(sc, kind, sc.load("acc", "0", sc.acc_dtype), x_e).comps
                        ):
                            w.line(f"{sc.at('acc', c, '0')} = {v}")
            _keep_partial(w, sc)
        _add_lanes(w, sc, threads, gpu, lanes, 1, lambda step: f"tx % {lanes} < {step}", kind)
        with w.block(f"for tx in {threads}:"):
            w.line(f"f = bx * {per_block} + tx // {lanes}")
            with w.block(f"if tx % {lanes} == 0 and f < {n}:"):
                for c, v in enumerate(
                    sc.store(sc.reduced(sc.load("red", "tx", sc.acc_dtype)), sc.buf_dtype(out.dtype))
                ):
                    w.line(f"{sc.at('out0', c, index_text(unravel(Ix.var('f'), out.shape)))} = {v}")
    params, text = _function(g, k, info, scalar, name, w)
    rule = (
        f"cooperative {op.op.value}: {lanes} threads per output over {count} consecutive elements, {per_block} "
        f"output(s) per block, partial results combined pairwise in shared memory"
    )
    return KernelText(name, k, text, params, (blocks,), nt, rule)


#: A matmul with at most this many rows (a matrix-vector product, as in decoding) and an inner dim of at
#: least MIN_COOPERATIVE_INNER gets a cooperative kernel instead of a construction-tuned one.
MAX_COOPERATIVE_ROWS = 4
MIN_COOPERATIVE_INNER = 1024
_MATVEC_THREADS = 1024


def _cooperative_matvec(
    g: KernelGraph, k: int, info: GraphInfo, hw: HwProfile, target: Target, scalar: Scalar, name: str
) -> KernelText | None:
    """A (batched) matrix-vector product ``A[.., m, :] @ B[.., :, n]`` with the inner dim split over lanes.

    A block owns one row ``m`` of one batch and ``cols`` consecutive columns. Thread ``tx`` is lane
    ``tx // cols`` of column ``tx % cols``; lane ``l`` adds the terms ``l, l + lanes, ...``. So a warp reads a
    contiguous run of B's row, and A's element is the same for the whole warp. When B is read through a
    transposed view (stored ``[n, k]``, a decoding step's ``x @ W.T``) the roles swap: thread ``tx`` is lane
    ``tx % lanes`` of column ``tx // lanes``, so a warp reads a contiguous run of one column's k. The lanes'
    partial sums are then added pairwise in shared memory. The construction space has one thread per output
    and a serial inner loop, which leaves a decoding step's 4096-term products with few threads (an H100 run:
    47 µs for 32 MB of V, against 11 µs to read it). None when the product is not that shape.
    """
    op = g.ops[k]
    assert isinstance(op, KernelOp)
    ta, tb = (info.of(r) for r in op.inputs[:2])
    out = info.nodes[len(g.inputs) + k][0]
    rows_, inner, n_cols = out.shape[-2], ta.shape[-1], out.shape[-1]
    if rows_ > MAX_COOPERATIVE_ROWS or inner < MIN_COOPERATIVE_INNER:
        return None
    at_a, at_b = _matmul_at(g, k, info)
    cols = min(hw.warp_size, n_cols)
    lanes = 1
    while lanes * 2 * cols <= min(_MATVEC_THREADS, hw.max_threads_per_block) and lanes * 2 * 8 <= inner:
        lanes *= 2
    nt, tiles = lanes * cols, -(-n_cols // cols)
    blocks = math.prod(out.shape[:-1]) * tiles
    if blocks > _MAX_BLOCKS_X or lanes < 2:
        return None
    gpu, sc = target == "cuda", scalar
    w = Writer(1)
    threads = _threads(nt, gpu)
    # (column, lane) of thread tx: lanes consecutive in k-major B, columns consecutive otherwise
    col_of, lane_of = (f"tx // {lanes}", f"tx % {lanes}") if at_b else (f"tx % {cols}", f"tx // {cols}")

    def col_index() -> list[Ix]:
        w.line(f"n = bx % {tiles} * {cols} + {col_of}")
        return [*unravel(Ix.var("r"), out.shape[:-1]), Ix.var("n")]

    with w.block(f"for bx in {_blocks(blocks, gpu)}:"):
        w.line(f"r = bx // {tiles}")
        _partials_buffer(w, sc, nt, gpu)
        with w.block(f"for tx in {threads}:"):
            idx = col_index()
            _zero_acc(w, sc)
            with w.block(f"if n < {n_cols}:") if tiles * cols > n_cols else nullcontext():
                with w.loop("st", -(-inner // lanes)) as st:
                    w.line(f"kk = {st * lanes} + {lane_of}")
                    with w.block(f"if kk < {inner}:") if inner % lanes else nullcontext():
                        kk = Ix.var("kk")
                        av = sc.load(
                            "in0",
                            index_text(broadcast_index(idx[:-2], ta.shape[:-2]) + _stored(at_a, idx[-2], kk)),
                            sc.buf_dtype(ta.dtype),
                        )
                        bv = sc.load(
                            "in1",
                            index_text(broadcast_index(idx[:-2], tb.shape[:-2]) + _stored(at_b, kk, idx[-1])),
                            sc.buf_dtype(tb.dtype),
                        )
                        for c, v in enumerate(
                            sc.plus(sc.load("acc", "0", sc.acc_dtype), sc.product(av, bv)).comps
                        ):
                            w.line(f"{sc.at('acc', c, '0')} = {v}")
            _keep_partial(w, sc)
        if at_b:
            _add_lanes(w, sc, threads, gpu, lanes, 1, lambda step: f"tx % {lanes} < {step}")
        else:
            _add_lanes(w, sc, threads, gpu, lanes, cols, lambda step: f"tx < {step * cols}")
        first_lane = f"tx % {lanes} == 0" if at_b else f"tx < {cols}"
        with w.block(f"for tx in {threads}:"), w.block(f"if {first_lane}:"):
            idx = col_index()
            with w.block(f"if n < {n_cols}:") if tiles * cols > n_cols else nullcontext():
                ins = [info.of(r) for r in op.inputs]
                product = sc.reduced(sc.load("red", "tx", sc.acc_dtype))
                for c, v in enumerate(
                    sc.store(_epilogue(w, op, ins, idx, sc, product), sc.buf_dtype(out.dtype))
                ):
                    w.line(f"{sc.at('out0', c, index_text(idx))} = {v}")
    params, text = _function(g, k, info, scalar, name, w)
    rule = (
        f"cooperative matrix-vector product: {lanes} lanes split the {inner}-term inner dim for each of "
        f"{cols} columns per block, partial sums added pairwise in shared memory"
        + (" (B read k-major in place)" if at_b else "")
    )
    return KernelText(name, k, text, params, (blocks,), nt, rule)


def _element(
    w: Writer,
    op: KernelOp,
    ins: list[Any],
    out: Any,
    idx: list[Ix],
    sc: Scalar,
    views: tuple[bool, bool] = (False, False),
) -> None:
    """Statements computing output element ``idx`` of kernel op ``op`` into ``out0`` (``views``: a matmul's
    operands read through transposed views)."""

    def load(i: int, at: list[Ix]) -> Any:
        return sc.load(f"in{i}", index_text(at), sc.buf_dtype(ins[i].dtype))

    def store(v: Any) -> None:
        for c, e in enumerate(sc.store(v, sc.buf_dtype(out.dtype))):
            w.line(f"{sc.at('out0', c, index_text(idx))} = {e}")

    if op.op in BINARY_ELEMENTWISE or op.op in UNARY_ELEMENTWISE:
        args = [load(i, broadcast_index(idx, t.shape, out.shape)) for i, t in enumerate(ins)]
        store(sc.op(w, op.op, op.attrs, args))
    elif op.op in REDUCTIONS:
        _sum_element(w, op, ins[0].shape, idx, sc, load, store)
    elif op.op is Op.TRANSPOSE:
        nd = len(out.shape)
        store(
            load(
                0,
                list(
                    transposed(tuple(idx), int(attr(op.attrs, "dim0")) % nd, int(attr(op.attrs, "dim1")) % nd)
                ),
            )
        )
    elif op.op is Op.SLICE:  # a copy from the window's start along dim
        dim = int(attr(op.attrs, "dim")) % len(out.shape)
        start = slice(int(attr(op.attrs, "start")), int(attr(op.attrs, "stop"))).indices(ins[0].shape[dim])[0]
        src = list(idx)
        src[dim] = idx[dim] + start
        store(load(0, src))
    elif op.op is Op.REPEAT:
        dim = int(attr(op.attrs, "dim")) % len(out.shape)
        src = list(idx)
        src[dim] = idx[dim].floordiv(int(attr(op.attrs, "times")), out.shape[dim])
        store(load(0, src))
    elif op.op is Op.CONCAT:
        _concat_element(w, op, ins, idx, load, store)
    elif op.op is Op.MATMUL:
        _matmul_element(w, ins, idx, sc, load, lambda v: store(_epilogue(w, op, ins, idx, sc, v)), views)
    else:
        raise UnsupportedOpError(f"pre-defined kernel op '{op.op.value}' has no code generator")


def _sum_element(
    w: Writer, op: KernelOp, shape: tuple[int, ...], idx: list[Ix], sc: Scalar, load: Any, store: Any
) -> None:
    dim = int(attr(op.attrs, "dim")) % len(shape)
    keep = _keepdim(op)
    group = attr(op.attrs, "group")
    full = group is None or group == shape[dim]
    count = shape[dim] if full else int(group)
    kind = reduction_kind(op.op)
    _zero_acc(w, sc, kind)
    with w.loop("g", count) as gi:
        nxt = combined(
            sc,
            kind,
            sc.load("acc", "0", sc.acc_dtype),
            load(0, summed_index(idx, dim, gi, count, full, keep)),
        )
        for c, e in enumerate(nxt.comps):
            w.line(f"{sc.at('acc', c, '0')} = {e}")
    store(sc.reduced(sc.load("acc", "0", sc.acc_dtype)))


def _matmul_element(
    w: Writer, ins: list[Any], idx: list[Ix], sc: Scalar, load: Any, store: Any, views: tuple[bool, bool]
) -> None:
    """One output element of a (broadcast, batched) matmul: the whole inner dim in one register."""
    _zero_acc(w, sc)
    a, b = ins[0].shape, ins[1].shape
    with w.loop("k", a[-1]) as kk:
        av = load(0, broadcast_index(idx[:-2], a[:-2]) + _stored(views[0], idx[-2], kk))
        bv = load(1, broadcast_index(idx[:-2], b[:-2]) + _stored(views[1], kk, idx[-1]))
        nxt = sc.plus(sc.load("acc", "0", sc.acc_dtype), sc.product(av, bv))
        for c, e in enumerate(nxt.comps):
            w.line(f"{sc.at('acc', c, '0')} = {e}")
    store(sc.reduced(sc.load("acc", "0", sc.acc_dtype)))


def _concat_element(w: Writer, op: KernelOp, ins: list[Any], idx: list[Ix], load: Any, store: Any) -> None:
    dim = int(attr(op.attrs, "dim")) % len(ins[0].shape)
    starts = [sum(t.shape[dim] for t in ins[:i]) for i in range(len(ins))]

    def parts(lo: int, hi: int) -> None:
        """The element from parts ``lo`` to ``hi − 1``, by halves: a chain of one ``if`` per part nested past
        Python's 100 levels of indentation at ~95 parts (the TVMScript did not parse)."""
        if hi - lo == 1:
            src = list(idx)
            src[dim] = Ix(tuple(idx[dim].terms), idx[dim].const - starts[lo])
            store(load(lo, src))
            return
        mid = (lo + hi) // 2
        with w.block(f"if {idx[dim]} < {starts[mid]}:"):
            parts(lo, mid)
        with w.block("else:"):
            parts(mid, hi)

    parts(0, len(ins))


# ------------------------------------------------------------------------------------------- entry point


def emit_predefined(
    g: KernelGraph,
    k: int,
    info: GraphInfo,
    hw: HwProfile,
    *,
    target: Target,
    scalar: Scalar,
    name: str,
    seed: int = 0,
) -> list[KernelText | ScheduledKernel]:
    """The kernels computing pre-defined kernel op ``k`` (none for a reshape; two for a field-mode matmul).

    Raises
    ------
    UnsupportedOpError
        An op without a generator, or a matmul the scheduled lowering rejects.
    """
    op = g.ops[k]
    assert isinstance(op, KernelOp)
    if is_alias(op) or k in graph_views(g, info):
        return []  # a reshape's view, or a transpose its matmuls read in place
    if op.op is Op.MATMUL:
        if scalar.field and target != "llvm":
            raise UnsupportedOpError("the finite-field twin runs on the CPU only (target 'llvm')")
        matvec = _cooperative_matvec(g, k, info, hw, target, scalar, name)
        if matvec is not None:
            return [generic_matvec(g, k, info, hw, target, scalar, name, seed, matvec) or matvec]
        scheduled = tensor_core_kernels(g, k, info, hw, target, scalar, name, seed) or matmul_kernels(
            g, k, info, hw, target, scalar, name, seed
        )
        if scheduled:
            return list(scheduled)
    kt = _cooperative_sum(g, k, info, hw, target, scalar, name)
    full = fallback_threads(hw.max_threads_per_block, hw)
    if kt is None and target == "cuda" and generic_matmul.active():
        # The CUDA first tier: a copy of fewer elements than a block's threads gets a whole block (its guard
        # skips the threads past its elements), and its index folds are its first length's (folds.same_folds:
        # a dim of 1 at one token keeps its terms), so every length runs the code of one compiled kernel; the
        # length's own build takes the emitter's kernel back (Kernel.own, emitted then).
        out = info.nodes[len(g.inputs) + k][0]
        ranks = tuple((len(info.of(r).shape), info.of(r).dtype) for r in op.inputs)
        key = (name, op.op, op.attrs, ranks, scalar.buf_dtype(out.dtype), hw.name)
        replayed: list[bool] = []
        wide = same_folds(key, lambda: _simple(g, k, info, hw, target, scalar, name, threads=full), replayed)
        if not replayed[0] and fallback_threads(math.prod(out.shape), hw) == full:
            return [wide]  # the emitter's own kernel
        args = (g, k, info, hw, target, scalar, name)
        return [dataclasses.replace(wide, own=lambda: generic_matmul.own_text(_simple(*args)))]
    kt = kt or _simple(g, k, info, hw, target, scalar, name)
    if target == "llvm" and generic_matmul.active() and kt.rule.endswith(_SIMPLE):
        # llvm's first tier: the guard at every length, as on a GPU (one text, one compiled variant, whether
        # the grid covers the elements exactly or not), compiled generic (Kernel.own marks the generic forms);
        # the length's own build takes the emitter's kernel back.
        guarded = _simple(g, k, info, hw, target, scalar, name, guard=True)
        return [dataclasses.replace(guarded, own=functools.partial(generic_matmul.own_text, kt))]
    return [kt]


__all__ = ["emit_predefined", "is_alias"]

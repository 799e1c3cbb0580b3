"""A graph-defined kernel op of a µGraph lowered to one TVM PrimFunc (emitted as TVMScript text).

Structure of the emitted kernel (``target="cuda"``)::

    for bx in T.thread_binding(grid_x, thread="blockIdx.x"):      # (by, bz for 2-3 grid dims)
        s3 = T.alloc_buffer(tile, dtype, scope="shared")          # one per materialised block tensor, or
        smem = T.alloc_buffer((n,), dtype, scope="shared.dyn")    # one arena with a view per tile when the
        s3 = T.decl_buffer(tile, dtype, data=smem.data, ...)       # memory plan lets tiles share bytes
        a7 = T.alloc_buffer((slots,), "float32", scope="local")   # per-thread part of a loop accumulator
        <phases of loop-invariant input iterators>
        <copies of the first stages>                               # when pipelined (codegen.block_loads)
        for it in T.serial(forloop):                               # the block graph's for-loop
            <copies of iteration it + S - 1> <wait> <barrier>      # when pipelined
            <phase> <phase> T.tvm_storage_sync("shared") ...       # loop body, by depth
        <flush of the accumulators> <post-loop phases>

A *phase* is one ``for tx in T.thread_binding(threads, thread="threadIdx.x")`` loop in which the block's
threads share one node's work: loading an iterator's tile (cooperatively, element ``e * threads + tx``),
one block op on shared tiles, or a whole thread graph (each thread runs the fused chain for its elements in
``scope="local"`` temporaries, with no shared-memory round trip between the chain's ops). Phases run by depth
(:mod:`gensorage.ugraph.optimize.phase_order`); tiles are laid out by the memory plan
(:mod:`gensorage.ugraph.optimize.memory_plan`: tiles whose lives do not overlap share bytes), each with the
layout (padded or XOR-swizzled rows) that avoids bank conflicts for its accesses (:mod:`gensorage.ugraph.optimize.layouts`). A barrier
precedes a phase exactly when it reads bytes written since the last barrier or writes bytes read or written
since then, and ends every loop iteration in which shared memory was touched (the next one overwrites the
tiles). How the dominant matmul is tiled over the threads (and how many threads there are)
comes from the Markov construction: see :mod:`gensorage.construction.block_threads`; a block matmul whose tiles
fit ``mma.m16n8k16`` runs on tensor cores on some of those warps, each with a warp tile of MMA tiles
(:mod:`gensorage.codegen.block_mma`; how many threads and warps: :mod:`gensorage.codegen.mma_threads`).

Semantics (:mod:`gensorage.ugraph.ir`, reproduced by :mod:`gensorage.ugraph.evaluate`):

- iterator tile offset along data dim ``d``: each grid dim ``g`` with ``imap[g] = d`` splits what the previous
  splits left (x, y, z in order), then the for-loop splits along ``fmap``;
- reshape and repeat are index arithmetic on their source (views), never copies; concat copies its parts;
- a ``sum``/``max`` accumulator (``fmap=None``) combines in registers: the phase that updates it deals the same
  elements to the same thread every iteration, so each thread keeps its elements in a ``local`` array
  (``it == 0`` stores, later iterations combine) and one flush after the loop writes them to the
  accumulator's shared tile (with the same element-to-thread map). Combining in shared memory instead would be
  a read-modify-write in a loop, which TVM's barrier insertion answers with a barrier inside that loop. A
  concatenating accumulator (``fmap=d``) writes each iteration's tile to shared memory at offset ``it * tile``;
- an online-softmax accumulator (``softmax_sum``, ``softmax_matmul``) has a phase of its own after the loop
  body, reading the score (and value) tiles from shared memory: each thread keeps, per element of the result,
  the row's running maximum and the rescaled sum in registers, flushed like a ``sum`` accumulator's (see
  :mod:`gensorage.codegen.block_accumulators`). Its field twin is refused in one line (:class:`NotLaxError`):
  the rescale needs ``exp(a + b) = exp(a)·exp(b)``, which only the second verification tier models;
- accumulators and output savers of a value computed by a block op, a thread graph or an iterator are
  written from that producer's phase (no intermediate tile); an output saver writes element ``i`` of its tile
  to ``out[..., b_g * tile_d + i_d, ...]`` for ``omap[g] = d``.

``target="llvm"`` emits the same text with the bindings turned into loops (``T.parallel`` over blockIdx.x,
serial loops otherwise), shared buffers in global scope and no barriers; accumulator registers, which must
outlive one thread loop, get a row per thread (``a7[tx, slot]``). Every other index expression is literally
the same, so running it on the CPU checks the GPU kernel's index arithmetic (not races or barriers).
"""

from __future__ import annotations

import math

from gensorage.codegen.block_emitter import BlockEmitter
from gensorage.codegen.block_matmul import matmul_dims
from gensorage.codegen.block_mma import MmaTiling, block_mma_tilings
from gensorage.codegen.kernel_text import TARGETS, KernelParam, KernelText, Target
from gensorage.codegen.mma_threads import mma_block_layout
from gensorage.codegen.scalar import FLOAT_DTYPES, Scalar
from gensorage.construction.block_threads import (
    ROW_KERNEL_THREADS,
    ThreadChoice,
    fallback_threads,
    matmul_tiling,
    row_kernel_threads,
)
from gensorage.construction.pipeline_stages import choose_stages
from gensorage.errors import ScheduleError, UnsupportedOpError
from gensorage.hw.profile import HwProfile
from gensorage.opset import Op
from gensorage.ugraph.ir import (
    BlockOp,
    GraphDefinedOp,
    KernelGraph,
)
from gensorage.ugraph.optimize.layouts import Layout
from gensorage.ugraph.shapes import BlockInfo, GraphInfo

# Index arithmetic is int32 (TVM's default): every tensor must stay below 2^31 elements.
MAX_ELEMENTS = (1 << 31) - 1


def compute_dtype(g: KernelGraph, info: GraphInfo) -> str:
    """float64 when the graph holds any float64 tensor, else float32; non-float tensors are unsupported."""
    dtypes = {t.dtype for outs in info.nodes for t in outs}
    bad = sorted(d for d in dtypes if d not in FLOAT_DTYPES)
    if bad:
        raise UnsupportedOpError(f"code generation supports float tensors only (got dtype {', '.join(bad)})")
    big = [t.shape for outs in info.nodes for t in outs if math.prod(t.shape) > MAX_ELEMENTS]
    if big:
        raise UnsupportedOpError(f"tensor of shape {list(big[0])} has 2^31 or more elements (int32 indexing)")
    return "float64" if "float64" in dtypes else "float32"


# ---------------------------------------------------------------------------------------------- planning


def largest_tile(binfo: BlockInfo) -> int:
    sizes = [math.prod(t.shape) for outs in binfo.nodes for t in outs]
    sizes += [math.prod(t.shape) for local in binfo.threads for t in local]
    return max(sizes, default=1)


def dominant_matmul(op: GraphDefinedOp, binfo: BlockInfo) -> tuple[int, tuple[int, int, int, int]] | None:
    """The block's largest matmul (most multiply-adds, first on ties) and its (batch, m, n, k), or None."""
    best: tuple[int, int, tuple[int, int, int, int]] | None = None
    for j, node in enumerate(op.block.nodes):
        if isinstance(node, BlockOp) and node.op is Op.MATMUL:
            dims = matmul_dims(binfo, node, j)
            if best is None or math.prod(dims) > best[0]:
                best = (math.prod(dims), j, dims)
    return None if best is None else (best[1], best[2])


def plan_threads(g: KernelGraph, k: int, info: GraphInfo, hw: HwProfile, seed: int = 0) -> ThreadChoice:
    """Threads per block of graph-defined op ``k``: chosen with the tensor-core warps by the block cost model
    when the dominant matmul runs on tensor cores (:mod:`gensorage.codegen.mma_threads`), else by the Markov
    construction (:mod:`gensorage.construction.block_threads`); then the stages of its loop's tiles
    (:mod:`gensorage.construction.pipeline_stages`)."""
    return choose_stages(g, k, info, hw, _threads(g, k, info, hw, seed))


def _threads(g: KernelGraph, k: int, info: GraphInfo, hw: HwProfile, seed: int) -> ThreadChoice:
    op = g.ops[k]
    binfo = info.blocks[k]
    assert isinstance(op, GraphDefinedOp) and binfo is not None
    layout = mma_block_layout(g, k, info, hw)
    if layout is not None:
        return layout
    dominant = dominant_matmul(op, binfo)
    why = "no matmul in the block graph"
    if dominant is not None:
        j, (b, m, n, kk) = dominant
        try:
            tiling = matmul_tiling(b, m, n, kk, binfo.nodes[j][0].dtype, hw, seed, math.prod(op.block.grid))
        except ScheduleError as exc:
            why = f"the construction found no schedule for the matmul tile: {exc}"
        else:
            return ThreadChoice(tiling.threads, j, tiling, tiling.describe())
    if dominant is None:
        nt = row_kernel_threads(largest_tile(binfo), hw)
        rule = f"at most {ROW_KERNEL_THREADS}"
    else:
        nt, rule = fallback_threads(largest_tile(binfo), hw), "at most the block limit"
    return ThreadChoice(
        nt,
        None,
        None,
        f"fallback ({why}): {nt} threads, one per element of the largest tile "
        f"({largest_tile(binfo)}) rounded to the warp size, {rule}",
    )


def planned_mma_tilings(
    g: KernelGraph, k: int, info: GraphInfo, hw: HwProfile, seed: int = 0
) -> dict[int, MmaTiling]:
    """The warp layout of graph-defined op ``k``'s tensor-core block matmuls as the code generator emits them
    (block matmul -> :class:`~gensorage.codegen.block_mma.MmaTiling`; for cost models)."""
    binfo = info.blocks[k]
    op = g.ops[k]
    assert isinstance(op, GraphDefinedOp) and binfo is not None
    plan = plan_threads(g, k, info, hw, seed)
    return block_mma_tilings(info, binfo, op.block.nodes, plan.threads, dict(plan.mma_warps))


def emit_graph_defined(
    g: KernelGraph,
    k: int,
    info: GraphInfo,
    choice: ThreadChoice,
    *,
    target: Target,
    scalar: Scalar,
    name: str,
) -> KernelText:
    """TVMScript text of graph-defined op ``k`` of ``g`` (see the module docstring).

    Parameters
    ----------
    g, k, info
        The µGraph, the kernel op index and the validated shapes (:func:`gensorage.ugraph.validate`).
    choice
        Threads per block and the matmul tiling (:func:`plan_threads`).
    target
        ``"cuda"`` (thread-bound, shared memory, barriers) or ``"llvm"`` (the same loops, runnable on the CPU).
    scalar
        :class:`~gensorage.codegen.scalar.FloatScalar` or :class:`~gensorage.codegen.scalar.FieldScalar`.
    name
        The PrimFunc's name (a Python identifier).

    Raises
    ------
    UnsupportedOpError
        A dtype, op or grid the generator cannot emit correctly.
    """
    first = BlockEmitter(g, k, info, choice, target, scalar, name)
    text = first.emit()
    # Layouts against bank conflicts: the first emission records every tile's accesses (as element indices,
    # which no layout changes); a second emission with the chosen layouts is the kernel.
    layouts = first.chosen_layouts()
    if all(lay == Layout() for lay in layouts.values()):
        return text
    return BlockEmitter(g, k, info, choice, target, scalar, name, layouts).emit()


__all__ = [
    "MAX_ELEMENTS",
    "TARGETS",
    "KernelParam",
    "KernelText",
    "Target",
    "compute_dtype",
    "dominant_matmul",
    "emit_graph_defined",
    "largest_tile",
    "plan_threads",
    "planned_mma_tilings",
]

"""Analytic cost of a µGraph on a hardware profile: the exhaustive search ranks verified µGraphs by it.

Per kernel operator (they run one after another, so times add up):

*Graph-defined* (a custom kernel with ``B = prod(grid)`` blocks and ``F`` loop iterations): the kernel the code
generator emits, priced by :mod:`gensorage.ugraph.block_cost` (threads, occupancy, waves, per iteration: loads,
barriers, tensor-core MMAs at the emitted warp layout, element-wise work; the epilogue). DRAM sees each input once
when all the operator's inputs fit in half of L2, otherwise once per wave that needs it (replicas running in the
same wave hit in L2), at most once per replica; plus the outputs. time = launch overhead + max(the waves' time,
the DRAM reads and writes streamed: :func:`stream_s`); infinite for a kernel the generator refuses (a grid beyond
CUDA's limits, a non-float tensor), so that it is never chosen.

*Pre-defined* (a library kernel): a roofline, launch overhead + max(bytes moved / (DRAM bandwidth x
``predefined_dram_fraction``), FLOPs / peak); a pre-defined 16-bit matmul is the tensor-core kernel
:mod:`gensorage.construction.tensor_core` constructs, priced by that construction's model, at least its bytes in
their dtypes streamed (:func:`stream_s`; an epilogue's wgmma kernel writes at half the rate, one element a
store), plus the wait of a converting kernel's synchronous copies (a float32 operand); a matmul of a few rows
is the cooperative matrix-vector kernel, priced as its stream; ``reshape`` is a view
of a contiguous tensor (no kernel, no time), and so is a transpose its matmuls read in place
(:mod:`gensorage.codegen.operand_views`): those matmuls are priced in the layout they read (the weight of
``x @ W.T`` read once, by the kernel that multiplies).

``LAUNCH_OVERHEAD_S`` is the constant of the schedule cost model (:mod:`gensorage.markov.cost_model`), 2 µs of
launch and tail per kernel, so the two models agree on what a kernel boundary costs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gensorage import opset
from gensorage.codegen.operand_views import graph_views, layout_name, matmul_operands
from gensorage.dtypes import dtype_bytes
from gensorage.errors import UnsupportedOpError
from gensorage.hw.profile import HwProfile
from gensorage.markov.cost_model import LAUNCH_OVERHEAD_S
from gensorage.opset import Op, Shape
from gensorage.ugraph.block_cost import block_cycles, plan_block
from gensorage.ugraph.ir import (
    ONLINE_SOFTMAX_KINDS,
    Accumulator,
    BlockOp,
    GraphDefinedOp,
    InputIterator,
    KernelGraph,
    KernelOp,
    ThreadGraph,
)
from gensorage.ugraph.shapes import BlockInfo, GraphInfo, TensorInfo
from gensorage.ugraph.validate import loop_phases, tensor_bytes, validate

if TYPE_CHECKING:
    from gensorage.construction.block_threads import ThreadChoice


@dataclass(frozen=True, slots=True)
class KernelCost:
    """The terms of one kernel's predicted time (seconds, bytes, FLOPs)."""

    kind: str  # "graph-defined", the pre-defined op's name, or "view"
    time_s: float
    dram_bytes: int
    l2_bytes: int
    flops: int
    shared_bytes: int
    blocks: int
    waves: int


def stream_s(hw: HwProfile, read: int, written: int) -> float:
    """The least time a kernel takes to read ``read`` and write ``written`` bytes of DRAM: each at the share of
    the DRAM bandwidth a stream of it reaches (``read_fraction``, ``write_fraction``), one after the other (the
    bus carries one direction at a time)."""
    bw, cal = hw.level("dram").bandwidth_Bps, hw.calibration
    return read / (bw * cal.read_fraction) + written / (bw * cal.write_fraction)


def _numel(shape: Shape) -> int:
    return math.prod(shape)


def _peak(hw: HwProfile, dtype: str, tensor_cores: bool) -> float:
    try:
        return hw.flops(dtype, tensor_cores)
    except KeyError:
        return hw.flops("float32", tensor_cores)


def _predefined_cost(
    hw: HwProfile, node: KernelOp, ins: list[TensorInfo], out: TensorInfo, layout: str = "nn"
) -> KernelCost:
    if node.op is Op.RESHAPE:
        return KernelCost("view", 0.0, 0, 0, 0, 0, 0, 0)
    read = sum(tensor_bytes(t) for t in ins)
    if node.op is Op.SLICE:  # the copy reads its window only
        read = read * _numel(out.shape) // _numel(ins[0].shape)
    moved = read + tensor_bytes(out)
    work = opset.flops(node.op, [t.shape for t in ins], out.shape)
    work += len(opset.epilogue(node.attrs)) * _numel(out.shape)  # a matmul's epilogue: one op per step
    if _matvec(node, ins, out):  # the cooperative kernel: B streamed in contiguous runs by the block's lanes
        time = LAUNCH_OVERHEAD_S + max(
            stream_s(hw, read, tensor_bytes(out)), work / _peak(hw, out.dtype, False)
        )
        return KernelCost(node.op.value, time, moved, moved, work, 0, 0, 0)
    got = _tensor_core_matmul(hw, node, ins, out, layout)
    if got is not None:  # the kernel the code generator emits, priced by the model that constructed it
        tiles, mma = got
        from gensorage.codegen.wgmma import WgmmaTiles
        from gensorage.construction.tensor_core import epilogue_s

        # An epilogue's extra operands and steps, priced by the construction's model (no launch, no round
        # trip of the product: what the fusion saves).
        steps = len(opset.epilogue(node.attrs))
        extra = epilogue_s(sum(tensor_bytes(t) for t in ins[2:]), _numel(out.shape), steps, hw)
        # The construction's model counts 16-bit operands and product; the kernel moves them in their dtypes
        # (a float32 product, as attention's scores are, is twice the bytes), no faster than DRAM streams them.
        # A wgmma kernel with an epilogue stores each accumulator element on its own (codegen/wgmma.py; without
        # one, a lane's two adjacent columns in one store): each store fills half of every 32-byte sector it
        # touches, so its writes stream at half the rate.
        halves = 2 if steps and isinstance(tiles, WgmmaTiles) else 1
        time = max(mma.total_s + extra, LAUNCH_OVERHEAD_S + stream_s(hw, read, halves * tensor_bytes(out)))
        time += _converting_copies_s(hw, tiles, ins, out, mma.waves)
        return KernelCost(node.op.value, time, moved, moved, work, 0, mma.blocks, mma.waves)
    compute = work / _peak(hw, out.dtype, False)
    # One output element per thread (the generator's fallback) reaches a fraction of the DRAM bandwidth.
    dram_bps = hw.level("dram").bandwidth_Bps * hw.calibration.predefined_dram_fraction
    time = LAUNCH_OVERHEAD_S + max(moved / dram_bps, compute)
    return KernelCost(node.op.value, time, moved, moved, work, 0, 0, 0)


def _matvec(node: KernelOp, ins: list[TensorInfo], out: TensorInfo) -> bool:
    """Whether the generator emits this pre-defined matmul as its cooperative matrix-vector product (a few rows,
    a long inner dim: :func:`gensorage.codegen.predefined.emit_predefined`)."""
    from gensorage.codegen.predefined import MAX_COOPERATIVE_ROWS, MIN_COOPERATIVE_INNER

    return (
        node.op is Op.MATMUL
        and out.shape[-2] <= MAX_COOPERATIVE_ROWS
        and ins[0].shape[-1] >= MIN_COOPERATIVE_INNER
    )


def _tensor_core_matmul(
    hw: HwProfile, node: KernelOp, ins: list[TensorInfo], out: TensorInfo, layout: str
) -> Any:
    """The construction's cost of the tensor-core kernel a pre-defined matmul lowers to, its operands stored as
    ``layout`` says (None: no such kernel)."""
    # Imported here: gensorage.construction imports the µGraph modules this one belongs to.
    from gensorage.construction.tensor_core import construct_predefined_matmul

    if node.op is not Op.MATMUL:
        return None
    a, b = ins[:2]
    return construct_predefined_matmul(a.shape, b.shape, out.shape, a.dtype, b.dtype, hw, 0, layout)


def _converting_copies_s(
    hw: HwProfile, tiles: Any, ins: list[TensorInfo], out: TensorInfo, waves: int
) -> float:
    """What a tensor-core matmul with an operand converted to the MMA dtype on its way to shared memory (a
    float32 operand with a 16-bit one) spends waiting for its copies: they are not asynchronous
    (:func:`gensorage.codegen.tensor_core.schedule_tensor_core`), so every reduction step of a block waits for
    its tiles, a loaded DRAM round trip (``wgmma_latency_cycles``) per ``convert_flight_bytes`` that one thread
    converts in that step: every operand not stored in the MMA dtype (with a float32 one the MMA runs in
    bfloat16, so a float16 operand beside it converts too). The construction's model prices the kernel as if
    all its copies were in flight."""
    from gensorage.codegen.tensor_core import mma_dtype

    a, b = ins[:2]
    mma = mma_dtype(a.dtype, b.dtype)
    if mma is None or a.dtype == b.dtype == mma or hw.calibration.convert_flight_bytes <= 0:
        return 0.0
    k = a.shape[-1] // getattr(tiles, "split_k", 1)  # split-k: each block reduces its share of k
    steps = -(-k // tiles.block_k)
    a_bytes, b_bytes = (dtype_bytes(t.dtype) if t.dtype != mma else 0 for t in (a, b))
    # Rows and columns past the matrix are not loaded: a block moves only the rows it has.
    rows, cols = min(tiles.block_m, out.shape[-2]), min(tiles.block_n, out.shape[-1])
    step_bytes = tiles.block_k * (rows * a_bytes + cols * b_bytes)
    trips = step_bytes / tiles.threads / hw.calibration.convert_flight_bytes
    return waves * steps * trips * hw.calibration.wgmma_latency_cycles / hw.clock_hz


def _block_cost(
    hw: HwProfile,
    g: KernelGraph,
    k: int,
    info: GraphInfo,
    ins: list[TensorInfo],
    binfo: BlockInfo,
    mma: bool,
    choice: ThreadChoice | None = None,
) -> KernelCost:
    node = g.ops[k]
    assert isinstance(node, GraphDefinedOp)
    block = node.block
    blocks = math.prod(block.grid)
    try:
        plan = plan_block(g, k, info, hw, mma, choice)
    except (
        UnsupportedOpError
    ):  # the generator refuses it (a grid beyond CUDA's, an integer tensor): never chosen
        return KernelCost("graph-defined", math.inf, 0, 0, 0, 0, blocks, 0)
    cycles, waves = block_cycles(plan, hw, blocks, block.forloop)
    out_bytes = sum(tensor_bytes(t) for t in binfo.outputs)
    l2_bytes = (plan.load_bytes * block.forloop + plan.hoisted_bytes) * blocks + out_bytes
    iterators = [n for n in block.nodes if isinstance(n, InputIterator)]
    read = _dram_input_bytes(hw, block.grid, iterators, ins, waves)
    dram = read + out_bytes
    time = LAUNCH_OVERHEAD_S + max(cycles / hw.clock_hz, stream_s(hw, read, out_bytes))
    return KernelCost(
        "graph-defined", time, dram, l2_bytes, _block_flops(block, binfo) * blocks, 0, blocks, waves
    )


def _block_flops(block: object, info: BlockInfo) -> int:
    """One block's FLOPs (body operators once per loop iteration)."""
    from gensorage.ugraph.ir import BlockGraph

    assert isinstance(block, BlockGraph)
    phases = loop_phases(block)
    work = 0
    for j, n in enumerate(block.nodes):
        times = block.forloop if phases[j] == "body" else 1
        outs = info.nodes[j]
        if isinstance(n, BlockOp):
            args = [info.nodes[r.node][r.out] for r in n.inputs]
            work += times * opset.flops(n.op, [a.shape for a in args], outs[0].shape)
        elif isinstance(n, Accumulator) and n.kind in ONLINE_SOFTMAX_KINDS:
            args = [info.nodes[r.node][r.out] for r in n.reads]
            work += times * online_flops(args[0].shape, outs[0].shape, n.kind)
        elif isinstance(n, ThreadGraph):
            local = info.threads[j]
            work += times * sum(
                opset.flops(t.op, [], local[len(n.inputs) + i].shape) for i, t in enumerate(n.ops)
            )
    return work


def _dram_input_bytes(
    hw: HwProfile, grid: tuple[int, ...], iterators: list[InputIterator], ins: list[TensorInfo], waves: int
) -> int:
    """DRAM bytes the iterators' loads cost: each input once when all fit in half of L2; otherwise an input
    replicated over ``R`` blocks is fetched once per wave it is needed in (its replicas in one wave hit in L2),
    at most ``R`` times."""
    unique = sum(tensor_bytes(ins[it.input]) for it in {it.input: it for it in iterators}.values())
    if unique <= hw.l2_bytes // 2:
        return unique
    total = 0
    for it in iterators:
        distinct = math.prod(n for n, d in zip(grid, it.imap, strict=True) if d is not None)
        replicas = math.prod(grid) // distinct
        total += tensor_bytes(ins[it.input]) * min(replicas, waves)
    return total


def online_flops(scores: tuple[int, ...], out: tuple[int, ...], kind: str) -> int:
    """One online-softmax step: row max, subtract, exp (counted as 4) and the sum or matmul over the keys, and
    the rescale of the running result (exp per row, multiply-add per element)."""
    work = 7 * math.prod(scores) + 2 * math.prod(out) + 4 * math.prod(scores[:-1])
    if kind == "softmax_matmul":
        work += 2 * math.prod(scores) * out[-1]
    return work


def _inputs(n: object) -> tuple:  # type: ignore[type-arg]
    if isinstance(n, BlockOp | ThreadGraph):
        return n.inputs
    if isinstance(n, Accumulator):
        return n.reads
    return ()


def kernel_costs(
    g: KernelGraph,
    hw: HwProfile,
    info: GraphInfo | None = None,
    *,
    block_mma: bool = True,
    plans: Mapping[int, ThreadChoice] | None = None,
) -> list[KernelCost]:
    """The cost terms of every kernel operator of ``g``, in order (``g`` must be valid); ``block_mma=False``
    prices block matmuls on CUDA cores (kernels emitted before tensor-core block graphs, for calibration);
    ``plans``: thread plans of graph-defined ops (op index -> plan) instead of the generator's own, as
    ``compile_ugraph(..., plans=)`` takes them (a measured variant's layout, for calibration)."""
    info = info if info is not None else validate(g)
    out: list[KernelCost] = []
    n_in = len(g.inputs)
    views = graph_views(g, info)
    for k, node in enumerate(g.ops):
        ins = [info.of(r) for r in node.inputs]
        if k in views:  # a transpose its matmuls read in place: no kernel
            out.append(KernelCost("view", 0.0, 0, 0, 0, 0, 0, 0))
        elif isinstance(node, KernelOp):
            layout = "nn"
            if node.op is Op.MATMUL:
                a, b = matmul_operands(g, k, views)
                layout = layout_name(a.transposed, b.transposed)
            out.append(_predefined_cost(hw, node, ins, info.nodes[n_in + k][0], layout))
        else:
            binfo = info.blocks[k]
            assert binfo is not None
            choice = None if plans is None else plans.get(k)
            out.append(_block_cost(hw, g, k, info, ins, binfo, block_mma, choice))
    return out


def predict_ugraph_time(ugraph: KernelGraph, hw: HwProfile) -> float:
    """Predicted execution time of ``ugraph`` on ``hw`` in seconds (kernels run one after another).

    Parameters
    ----------
    ugraph : KernelGraph
        A valid µGraph (checked with :func:`gensorage.ugraph.validate.validate`, without memory limits).
    hw : HwProfile
        The GPU.

    Returns
    -------
    float
        Seconds; the sum of :func:`kernel_costs`.
    """
    return sum(c.time_s for c in kernel_costs(ugraph, hw))


__all__ = ["LAUNCH_OVERHEAD_S", "KernelCost", "kernel_costs", "predict_ugraph_time"]

"""Analytic cost of a µGraph on a hardware profile: the exhaustive search ranks verified µGraphs by it.

Per kernel operator (they run one after another, so times add up):

*Graph-defined* (a custom kernel with ``B = prod(grid)`` blocks and ``F`` loop iterations):

- global loads: every block loads each iterator's tile once (no fmap) or ``F`` times (fmap), so an input
  replicated across ``k`` blocks (imap replica) is loaded ``k`` times; outputs are written once. Loads are served
  by L2 (``l2`` bandwidth); DRAM sees each input once when all the operator's inputs fit in half of L2, otherwise
  once per wave that needs it (replicas running in the same wave hit in L2), at most once per replica; plus the
  outputs;
- compute: every block operator's FLOPs (body operators ``F`` times) at the CUDA-core peak, except block
  matmuls whose tiles fit ``mma.m16n8k16`` (:func:`gensorage.codegen.block_mma.fits_mma`), at the tensor-core
  peak of their MMA dtype (the code generator puts them on tensor cores when the block is whole warps); a
  pre-defined float16 matmul is the tensor-core kernel :mod:`gensorage.construction.tensor_core` constructs,
  priced by that construction's model;
- shared memory: every block operator reads its operands from and writes its result to shared memory (a thread
  graph only its inputs and outputs: its intermediates stay in registers); iterators write their tiles,
  accumulators read and write theirs;
- occupancy and waves: resident blocks per SM from the shared memory one block needs (all its tiles, as
  :mod:`gensorage.ugraph.validate` counts them) and the per-SM block limit; ``waves = ceil(B / (SMs *
  resident))``; a wave lasts as long as its most loaded SM's blocks need for compute, shared-memory and L2
  traffic (whichever is slowest) or, at least, one global round trip per loop iteration;
- time = launch overhead + max(waves x wave time, DRAM bytes / DRAM bandwidth).

*Pre-defined* (a library kernel): a roofline, launch overhead + max(bytes moved / DRAM bandwidth, FLOPs / peak);
``reshape`` is a view of a contiguous tensor (no kernel, no time).

``LAUNCH_OVERHEAD_S`` is the constant of the schedule cost model (:mod:`gensorage.markov.cost_model`), 2 µs of
launch and tail per kernel, so the two models agree on what a kernel boundary costs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gensorage import opset
from gensorage.hw.profile import HwProfile
from gensorage.markov.cost_model import LAUNCH_OVERHEAD_S
from gensorage.opset import Op, Shape
from gensorage.ugraph.ir import (
    ONLINE_SOFTMAX_KINDS,
    Accumulator,
    BlockOp,
    GraphDefinedOp,
    InputIterator,
    KernelGraph,
    KernelOp,
    OutputSaver,
    ThreadGraph,
)
from gensorage.ugraph.optimize.memory_plan import shared_footprint
from gensorage.ugraph.shapes import BlockInfo, GraphInfo, TensorInfo
from gensorage.ugraph.validate import loop_phases, tensor_bytes, validate

SHARED_RESERVED_PER_BLOCK = 1024  # bytes the CUDA runtime reserves per resident block (sm_80+)


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


def _numel(shape: Shape) -> int:
    return math.prod(shape)


def _peak(hw: HwProfile, dtype: str, tensor_cores: bool) -> float:
    try:
        return hw.flops(dtype, tensor_cores)
    except KeyError:
        return hw.flops("float32", tensor_cores)


def _block_peak(hw: HwProfile, n: BlockOp, args: list[TensorInfo], out: TensorInfo) -> float:
    """Peak FLOP rate of a block op: tensor cores for a matmul whose tiles fit m16n8k16, else CUDA cores."""
    from gensorage.codegen.block_mma import fits_mma

    mma = fits_mma(args[0], args[1], out.shape) if n.op is Op.MATMUL else None
    return _peak(hw, mma, True) if mma is not None else _peak(hw, out.dtype, False)


def _predefined_cost(hw: HwProfile, node: KernelOp, ins: list[TensorInfo], out: TensorInfo) -> KernelCost:
    if node.op is Op.RESHAPE:
        return KernelCost("view", 0.0, 0, 0, 0, 0, 0, 0)
    read = sum(tensor_bytes(t) for t in ins)
    if node.op is Op.SLICE:  # the copy reads its window only
        read = read * _numel(out.shape) // _numel(ins[0].shape)
    moved = read + tensor_bytes(out)
    work = opset.flops(node.op, [t.shape for t in ins], out.shape)
    mma = _tensor_core_matmul(hw, node, ins, out)
    if mma is not None:  # the kernel the code generator emits, priced by the model that constructed it
        return KernelCost(node.op.value, mma.total_s, moved, moved, work, 0, mma.blocks, mma.waves)
    compute = work / _peak(hw, out.dtype, False)
    time = LAUNCH_OVERHEAD_S + max(moved / hw.level("dram").bandwidth_Bps, compute)
    return KernelCost(node.op.value, time, moved, moved, work, 0, 0, 0)


def _tensor_core_matmul(hw: HwProfile, node: KernelOp, ins: list[TensorInfo], out: TensorInfo) -> Any:
    """The construction's cost of the tensor-core kernel a pre-defined matmul lowers to (None: no such kernel)."""
    # Imported here: gensorage.construction imports the µGraph modules this one belongs to.
    from gensorage.construction.tensor_core import construct_predefined_matmul

    if node.op is not Op.MATMUL:
        return None
    a, b = ins
    got = construct_predefined_matmul(a.shape, b.shape, out.shape, a.dtype, b.dtype, hw)
    return None if got is None else got[1]


def _block_cost(hw: HwProfile, node: GraphDefinedOp, ins: list[TensorInfo], info: BlockInfo) -> KernelCost:
    block = node.block
    blocks = math.prod(block.grid)
    loops = block.forloop
    phases = loop_phases(block)
    loads = 0  # global-memory bytes one block loads
    shared = 0  # shared-memory bytes one block reads and writes
    work = 0  # FLOPs of one block
    compute_s = 0.0  # one block's compute time at the whole GPU's peak
    for j, n in enumerate(block.nodes):
        times = loops if phases[j] == "body" else 1
        outs = info.nodes[j]
        if isinstance(n, InputIterator):
            tile = tensor_bytes(outs[0]) * (loops if n.fmap is not None else 1)
            loads += tile
            shared += tile
            continue
        if isinstance(n, OutputSaver):
            continue
        args = [info.nodes[r.node][r.out] for r in _inputs(n)]
        shared += times * (sum(tensor_bytes(a) for a in args) + sum(tensor_bytes(o) for o in outs))
        if isinstance(n, BlockOp):
            w = opset.flops(n.op, [a.shape for a in args], outs[0].shape)
            work += times * w
            compute_s += times * w / _block_peak(hw, n, args, outs[0])
        elif isinstance(n, Accumulator) and n.kind in ONLINE_SOFTMAX_KINDS:
            w = online_flops(args[0].shape, outs[0].shape, n.kind)
            work += times * w
            compute_s += times * w / _peak(hw, outs[0].dtype, False)
        elif isinstance(n, ThreadGraph):
            local = info.threads[j]
            for k, t in enumerate(n.ops):
                w = opset.flops(t.op, [], local[len(n.inputs) + k].shape)
                work += times * w
                compute_s += times * w / _peak(hw, local[0].dtype, False)
    footprint = shared_footprint(block, info)  # tiles share bytes by liveness (as the kernel lays them out)
    per_sm = hw.shared_mem_per_sm // (footprint + SHARED_RESERVED_PER_BLOCK)
    resident_limit = max(1, min(hw.max_blocks_per_sm, per_sm))
    waves = -(-blocks // (hw.sm_count * resident_limit))
    resident = min(resident_limit, -(-blocks // hw.sm_count))
    sm = hw.sm_count
    per_block = max(
        compute_s * sm,
        shared / (hw.level("shared").bandwidth_Bps / sm),
        loads / (hw.level("l2").bandwidth_Bps / sm),
    )
    round_trip = (loops + 1) * hw.level("dram").latency_cycles / hw.clock_hz
    wave_s = max(resident * per_block, round_trip)
    out_bytes = sum(tensor_bytes(t) for t in info.outputs)
    l2_bytes = loads * blocks + out_bytes
    dram = (
        _dram_input_bytes(
            hw, block.grid, [n for n in block.nodes if isinstance(n, InputIterator)], ins, waves
        )
        + out_bytes
    )
    time = LAUNCH_OVERHEAD_S + max(waves * wave_s, dram / hw.level("dram").bandwidth_Bps)
    return KernelCost("graph-defined", time, dram, l2_bytes, work * blocks, shared * blocks, blocks, waves)


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


def kernel_costs(g: KernelGraph, hw: HwProfile, info: GraphInfo | None = None) -> list[KernelCost]:
    """The cost terms of every kernel operator of ``g``, in order (``g`` must be valid)."""
    info = info if info is not None else validate(g)
    out: list[KernelCost] = []
    n_in = len(g.inputs)
    for k, node in enumerate(g.ops):
        ins = [info.of(r) for r in node.inputs]
        if isinstance(node, KernelOp):
            out.append(_predefined_cost(hw, node, ins, info.nodes[n_in + k][0]))
        else:
            binfo = info.blocks[k]
            assert binfo is not None
            out.append(_block_cost(hw, node, ins, binfo))
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

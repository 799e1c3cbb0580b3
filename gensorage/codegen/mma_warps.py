"""How many warps compute each tensor-core block matmul of a graph-defined kernel: a small exact choice from the
hardware profile.

The block's thread count serves all of its phases (loads, element-wise ops, CUDA-core reductions and online
accumulators; :mod:`gensorage.construction.block_threads`), often 512-1024 threads for a 64 x 64 tile. A
tensor-core matmul on all of those warps gives each warp one or two 16 x 8 MMA tiles: per 16-wide k chunk every
warp loads its own A and B fragments from shared memory for one or two MMAs, so the fragment loads, not the
tensor cores, bound the phase. So each tensor-core block matmul runs on ``W`` of the block's warps (the others
skip its phase and wait at the next barrier), with larger warp tiles (:func:`~.block_mma.mma_tiling` picks the
warp tile for ``W``). ``W`` minimises a cycle model of one k chunk on one SM, the most of:

- the tensor cores: the SM's 4 sub-partitions each run their warps' MMAs one after another,
  ``ceil(W / 4) * steps * warp_m * warp_n`` MMAs at the profile's ``mma.sync`` rate (tensor peak times
  ``calibration.mma_sync_fraction``);
- the shared-memory pipe, which every warp's fragment loads share: per fragment, its load instructions (one
  instruction per cycle: a 2-byte element per lane each, or one ``ldmatrix`` per A fragment and per two B
  fragments where the operand is a tile of its own in the MMA dtype, :func:`~.block_mma.row_operand`) or its
  bytes at the shared bandwidth per cycle, whichever is more;
- one warp's chain: it waits for its fragments (the shared-memory latency), then issues its MMAs in turn, for
  each of its steps.

Only warp counts whose accumulators fit the registers (:func:`~.block_mma.acc_budget`) compete; all of the
block's warps (the most registers per MMA tile) always do. Ties go to fewer shared-memory cycles, then to more
warps. Every matmul is chosen on its own (each has its own
phase). The choice is recorded in the thread plan (:class:`~gensorage.construction.block_threads.ThreadChoice`,
``mma_warps``), and the layout it gives is read from :func:`~.block_mma.block_mma_tilings`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gensorage.codegen.block_mma import (
    A_ELEMS,
    B_ELEMS,
    MMA_K,
    MMA_M,
    MMA_N,
    WARP,
    MmaTiling,
    acc_budget,
    block_mma_tilings,
    mma_tiling,
    row_operand,
)
from gensorage.dtypes import dtype_bytes
from gensorage.hw.profile import HwProfile
from gensorage.ugraph.ir import BlockNode, BlockOp
from gensorage.ugraph.shapes import BlockInfo, GraphInfo

SUBPARTITIONS = 4  # warp schedulers (and tensor cores) per SM, Volta to Hopper


@dataclass(frozen=True, slots=True)
class MmaCosts:
    """Per-SM rates of the cycle model (see the module docstring), in cycles and bytes per cycle."""

    mma_cycles: float  # one m16n8k16 on one sub-partition
    shared_bytes_per_cycle: float
    shared_latency: float

    @staticmethod
    def of(hw: HwProfile, dtype: str) -> MmaCosts:
        per_sm_cycle = hw.sm_count * hw.clock_hz
        rate = hw.flops(dtype, True) * hw.calibration.mma_sync_fraction / per_sm_cycle / SUBPARTITIONS
        shared = hw.level("shared")
        return MmaCosts(
            2 * MMA_M * MMA_N * MMA_K / rate, shared.bandwidth_Bps / per_sm_cycle, shared.latency_cycles
        )


def fragment_cycles(instructions: float, nbytes: int, costs: MmaCosts) -> float:
    """Shared-pipe cycles of one fragment load by one warp: ``instructions`` instructions, ``nbytes`` bytes."""
    return max(float(instructions), nbytes / costs.shared_bytes_per_cycle)


def shared_cycles(t: MmaTiling, costs: MmaCosts, rows: tuple[bool, bool] = (False, False)) -> float:
    """Shared-pipe cycles of the fragment loads of one k chunk of ``t``, over all its warps; ``rows`` says
    which operands ``ldmatrix`` loads (one instruction per A fragment, one per two B fragments)."""
    el = dtype_bytes(t.dtype)
    a = fragment_cycles(1 if rows[0] else A_ELEMS, WARP * A_ELEMS * el, costs)
    b = fragment_cycles(0.5 if rows[1] else B_ELEMS, WARP * B_ELEMS * el, costs)
    return t.warps * t.steps * (t.warp_m * a + t.warp_n * b)


def chunk_cycles(t: MmaTiling, costs: MmaCosts, rows: tuple[bool, bool] = (False, False)) -> float:
    """Cycles of one 16-wide k chunk of ``t`` on one SM (the module docstring's model)."""
    tiles = t.steps * t.warp_m * t.warp_n
    tensor = math.ceil(t.warps / SUBPARTITIONS) * tiles * costs.mma_cycles
    chain = t.steps * costs.shared_latency + tiles * costs.mma_cycles
    return max(tensor, shared_cycles(t, costs, rows), chain)


def choose_mma_warps(
    info: GraphInfo, binfo: BlockInfo, nodes: tuple[BlockNode, ...], threads: int, hw: HwProfile
) -> tuple[tuple[int, int], ...]:
    """(block matmul, warps) for every block matmul of the graph that runs on tensor cores (module docstring)."""
    chosen = []
    for j, t in block_mma_tilings(info, binfo, nodes, threads, {}).items():
        node = nodes[j]
        assert isinstance(node, BlockOp)
        costs = MmaCosts.of(hw, t.dtype)
        a, b = node.inputs
        rows = (row_operand(binfo, nodes, a, t) and not t.padded, row_operand(binfo, nodes, b, t))
        best: tuple[tuple[float, float, int], int] | None = None
        for w in range(1, threads // WARP + 1):
            tw = mma_tiling(binfo, node, j, threads, w)
            assert tw is not None
            if tw.steps * w - tw.warp_tiles >= tw.steps:
                continue  # a warp with nothing to do: fewer warps give the same steps
            if tw.slots > acc_budget(threads) and w < threads // WARP:
                continue  # its accumulators would spill
            key = (chunk_cycles(tw, costs, rows), shared_cycles(tw, costs, rows), -w)
            if best is None or key < best[0]:
                best = (key, w)
        assert best is not None
        chosen.append((j, best[1]))
    return tuple(chosen)


__all__ = ["MmaCosts", "choose_mma_warps", "chunk_cycles", "fragment_cycles", "shared_cycles"]

"""How many shared-memory stages a graph-defined kernel's for-loop gives its ``cp.async`` tiles (software
pipelining, :mod:`gensorage.codegen.block_loads`), chosen per block graph by the block cost model.

One stage waits, every iteration, for the DRAM round trip of its own copies before it computes; ``S`` stages
issue the copies ``S - 1`` iterations ahead, so the round trip overlaps with compute, at the price of ``S``
copies of every staged tile in shared memory (fewer resident blocks, or no fit at all) and a little work per
iteration (:func:`gensorage.ugraph.block_cost.block_cycles` prices all three). The construction plans the kernel
at every stage count from 1 to the profile's ``block_max_stages`` (at most the loop's iterations) whose stages
fit the profile's shared memory per block, and keeps the one with the fewest predicted cycles for the whole
grid; ties go to fewer stages. A kernel with tensor-core block matmuls has its threads and warps chosen at their
best stages (:mod:`gensorage.codegen.mma_threads` prices every layout by :func:`priced_stages`), so a layout that
pipelines well can win over one that does not. A kernel with nothing to stage (no loop, or no tile copied with ``cp.async``)
keeps one. The code generator (:func:`gensorage.codegen.ugraph_tir.plan_threads`) and the cost model
(:func:`gensorage.ugraph.block_cost.block_threads`) both call :func:`choose_stages` on their thread plan, so the
kernel priced is the kernel emitted.
"""

from __future__ import annotations

import dataclasses
import math

from gensorage.construction.block_threads import ThreadChoice
from gensorage.hw.profile import HwProfile
from gensorage.ugraph.ir import GraphDefinedOp, KernelGraph
from gensorage.ugraph.shapes import GraphInfo


def choose_stages(
    g: KernelGraph, k: int, info: GraphInfo, hw: HwProfile, choice: ThreadChoice
) -> ThreadChoice:
    """``choice`` with the stages of graph-defined op ``k``'s loop tiles chosen (module docstring)."""
    key = (g.ops[k], tuple(info.of(r) for r in g.ops[k].inputs), hw, choice)
    cached = _CHOSEN.get(key)
    if cached is not None:
        return cached
    priced = priced_stages(g, k, info, hw, choice)
    cycles, stages = min(priced)
    chosen = choice
    if stages > 1:
        one = next(c for c, s in priced if s == 1)
        # (No " of " in it: readers of the rules take "W of T warps" for a matmul's warps.)
        rule = (
            f"{choice.rule}; cp.async loop tiles in {stages} stages by the block cost model "
            f"({one / cycles:.2f}x fewer cycles than in 1)"
        )
        # The GPU's limit travels with the plan: the emitter, which places the tiles as they are (accumulators
        # in the compute dtype, padded rows), keeps one stage where that exceeds it.
        chosen = dataclasses.replace(choice, stages=stages, rule=rule, shared_limit=hw.shared_mem_per_block)
    if len(_CHOSEN) >= _MAX_CHOSEN:
        _CHOSEN.clear()
    _CHOSEN[key] = chosen
    return chosen


def priced_stages(
    g: KernelGraph, k: int, info: GraphInfo, hw: HwProfile, choice: ThreadChoice
) -> list[tuple[float, int]]:
    """(predicted cycles of the whole grid, stages) of graph-defined op ``k`` under ``choice`` at every stage
    count the construction considers (module docstring); one stage first, and only it when nothing is staged."""
    # Imported here: the cost model imports the code generator's modules, which import this package.
    from gensorage.ugraph.block_cost import block_cycles, plan_block

    op = g.ops[k]
    assert isinstance(op, GraphDefinedOp)
    blocks = math.prod(op.block.grid)
    most = min(int(hw.calibration.block_max_stages), op.block.forloop)
    priced: list[tuple[float, int]] = []
    for stages in range(1, most + 1):
        staged = dataclasses.replace(choice, stages=stages, shared_limit=hw.shared_mem_per_block)
        plan = plan_block(g, k, info, hw, True, staged)
        if stages == 1 and not plan.stageable:
            return [(block_cycles(plan, hw, blocks, op.block.forloop)[0], 1)]
        if stages > 1 and (plan.stages != stages or plan.shared_bytes > hw.shared_mem_per_block):
            continue  # the stages do not fit this GPU (or the code generator falls back to one)
        priced.append((block_cycles(plan, hw, blocks, op.block.forloop)[0], stages))
    return priced


_CHOSEN: dict[object, ThreadChoice] = {}
_MAX_CHOSEN = 1024


__all__ = ["choose_stages", "priced_stages"]

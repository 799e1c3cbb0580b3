"""Barriers between the phases of one body level of a graph-defined kernel, as the code generator places them.

The block cost model (:mod:`gensorage.ugraph.block_cost`) counts a barrier per depth level of a loop body: a
level's phases read the previous levels' tiles. Within a level the phases are independent, yet where the memory
plan (:mod:`gensorage.ugraph.optimize.memory_plan`) lets tiles whose lives do not overlap share bytes, the
emitter's barrier placement (:class:`gensorage.codegen.barriers.BarrierPlacement`) may fence two of them apart:
:func:`level_fences` runs that placement on the level's phases.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gensorage.ugraph.ir import InputIterator
from gensorage.ugraph.optimize.phase_order import depth_order, depths

if TYPE_CHECKING:
    from gensorage.codegen.block_emitter import BlockEmitter


def level_fences(e: BlockEmitter, staged: tuple[int, ...], stages: int, mma: bool) -> int:
    """Barriers between phases of one loop-body level of the kernel ``e`` sets up (not run), its loop's
    ``staged`` iterators in ``stages`` stages: the emitter's placement run on each phase's tiles, what it reads
    and what it writes (e.g. a second row sum whose result takes the bytes of the first one's operand)."""
    # Imported here: the code generator imports the µGraph modules this one belongs to.
    from gensorage.codegen.barriers import BarrierPlacement, tiles_clash
    from gensorage.codegen.block_buffers import _plan

    level = depths(e.block)
    body, _ = depth_order(e.block)
    read = {r.node for r in e.consumers}
    phases = [
        j
        for j in body
        if j in read and not isinstance(e.block.nodes[j], InputIterator) and not (mma and j in e.fused_into)
    ]
    if len({level[j] for j in phases}) == len(phases):
        return 0  # one phase per level: nothing to fence within one
    e.staged, e.stages = (
        staged,
        stages,
    )  # the emitter is the model's own, set up and never run: plan its tiles
    _plan(e)
    if e.memory.bytes >= e.memory.unshared_bytes:
        return 0  # tiles never share bytes: phases of one level touch disjoint tiles
    placement = BarrierPlacement(lambda r, o: tiles_clash(e.memory, r, o))
    fences, current = 0, None
    for j in phases:  # (a thread graph fused into a matmul is computed in the matmul's phase)
        if level[j] != current:  # a new level: the level's barrier (counted per level) clears what is pending
            current = level[j]
            placement.clear()
        node = e.block.nodes[j]
        placement.begin()
        placement.reads.update(r for r in getattr(node, "inputs", ()) if r in e.buffers)
        placement.writes.update(r for r in e.buffers if r.node == j)
        fences += placement.end()
    return fences


__all__ = ["level_fences"]

"""Shared-memory planning by liveness (the later Mirage paper's memory planning): tiles whose live intervals
do not overlap share bytes of one arena.

Placing tiles with fixed lifetimes in the fewest bytes is dynamic storage allocation (NP-hard in general);
the plan is first-fit by decreasing size: tiles in order of size (largest first, then by start step and node),
each at the lowest aligned offset where it overlaps, in bytes, no tile already placed whose interval overlaps
its own. For tiles of one size this is interval-graph colouring, which is optimal. Tiles of mixed alignments
can fragment first fit past the unshared layout (every tile its own bytes, in node order); the plan is then
the unshared layout, so it is never larger. A tile starts at a multiple of the largest power of two that divides its bytes, at most
``align`` (16 bytes: the widest vector access): a vector access never spans more than the tile, so its width
divides the tile's bytes, and a scalar tile does not pad the arena to 16 bytes. The arena's size is a multiple
of ``align``.

Guarantee (tested over random block graphs): two tiles live at one step never share a byte.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from gensorage.ugraph.ir import BlockGraph, OutputSaver, Ref
from gensorage.ugraph.optimize.liveness import Fused, Interval, live_intervals
from gensorage.ugraph.optimize.views import is_view
from gensorage.ugraph.shapes import BlockInfo
from gensorage.ugraph.validate import tensor_bytes

#: Alignment of every tile in the arena: 16 bytes, the widest vector access (float4).
ARENA_ALIGN = 16


@dataclass(frozen=True, slots=True)
class Placement:
    """Tile ``ref`` at bytes ``offset .. offset + size`` of the arena, live during ``interval``."""

    ref: Ref
    offset: int
    size: int
    interval: Interval

    def shares_bytes(self, other: Placement) -> bool:
        return self.offset < other.offset + other.size and other.offset < self.offset + self.size


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """Where every planned tile lies in the arena (in node order), the arena's bytes, and the bytes of the
    unshared layout (every tile its own bytes, in node order, aligned the same way) for comparison."""

    placements: tuple[Placement, ...]
    bytes: int
    unshared_bytes: int

    def placement(self, r: Ref) -> Placement:
        for p in self.placements:
            if p.ref == r:
                return p
        raise KeyError(r)

    def offset(self, r: Ref) -> int:
        return self.placement(r).offset


def _aligned(n: int, align: int) -> int:
    return -(-n // align) * align


def tile_align(size: int, align: int) -> int:
    """A tile's alignment: the largest power of two dividing its bytes, at most ``align``."""
    return min(align, size & -size) if size else align


def _first_fit(size: int, busy: list[Placement], align: int) -> int:
    """The lowest aligned offset where ``size`` bytes miss every placement in ``busy``."""
    offset = 0
    for p in sorted(busy, key=lambda p: p.offset):
        if offset + size <= p.offset:
            return offset
        offset = max(offset, _aligned(p.offset + p.size, align))
    return offset


def plan_memory(
    block: BlockGraph,
    sizes: Mapping[Ref, int],
    align: int = ARENA_ALIGN,
    fused: Fused = (),
    staged: tuple[int, ...] = (),
) -> MemoryPlan:
    """Arena offsets for the tiles in ``sizes`` (tile ref to bytes; views and savers have no tile).

    Parameters
    ----------
    block : BlockGraph
        A verified block graph; its tiles' lifetimes come from
        :func:`gensorage.ugraph.optimize.liveness.live_intervals`.
    sizes : Mapping[Ref, int]
        The tiles to place and their bytes (the code generator passes the tiles it materialises).
    align : int
        Every offset is a multiple of this.
    fused : tuple of (int, int)
        Pairs of nodes run in one step (see :data:`gensorage.ugraph.optimize.liveness.Fused`).
    staged : tuple of int
        Iterator nodes whose tiles are pipelined: ``sizes`` holds all their stages' bytes, and they live
        across the loop (:func:`gensorage.ugraph.optimize.liveness.live_intervals`).

    Returns
    -------
    MemoryPlan
        The placements; tiles live at one step never share a byte.
    """
    live = live_intervals(block, fused, staged)
    order = sorted(sizes, key=lambda r: (-sizes[r], live.of(r).start, r.node, r.out))
    placed: list[Placement] = []
    for r in order:
        interval = live.of(r)
        busy = [p for p in placed if p.interval.overlaps(interval)]
        size = sizes[r]
        placed.append(Placement(r, _first_fit(size, busy, tile_align(size, align)), size, interval))
    placements = tuple(sorted(placed, key=lambda p: (p.ref.node, p.ref.out)))
    total = _aligned(max((p.offset + p.size for p in placements), default=0), align)
    unshared: list[Placement] = []
    end = 0
    for p in placements:  # the same tiles, each after the last, in node order
        unshared.append(Placement(p.ref, _aligned(end, tile_align(p.size, align)), p.size, p.interval))
        end = unshared[-1].offset + p.size
    end = _aligned(end, align)
    # First fit can fragment (tiles of mixed alignments); then the unshared layout is the plan.
    return MemoryPlan(placements, total, end) if total <= end else MemoryPlan(tuple(unshared), end, end)


@lru_cache(maxsize=4096)  # the cost model prices the same block graphs over and over
def shared_footprint(
    block: BlockGraph, info: BlockInfo, staged: tuple[int, ...] = (), stages: int = 1
) -> int:
    """Shared-memory bytes of ``block`` with every tile (views aside) in its stored dtype, planned by liveness:
    what validity and the cost model charge a block (the code generator places only the tiles it
    materialises, and keeps accumulators in the compute dtype); the iterators ``staged`` hold ``stages``
    copies of their tile each (software pipelining)."""
    sizes = {
        Ref(j, o): tensor_bytes(t) * (stages if j in staged else 1)
        for j, (node, outs) in enumerate(zip(block.nodes, info.nodes, strict=True))
        if not is_view(node) and not isinstance(node, OutputSaver)
        for o, t in enumerate(outs)
    }
    return plan_memory(block, sizes, staged=staged if stages > 1 else ()).bytes


__all__ = ["ARENA_ALIGN", "MemoryPlan", "Placement", "plan_memory", "shared_footprint", "tile_align"]

"""A Roller-like tree constructor (Zhu et al., OSDI'22), the construction baseline of the Gensor paper.

Greedy and single-objective, as the Gensor paper characterizes it: level by level from the registers outwards,
the tile grows along the axis whose growth most raises the level's compute-to-memory-traffic ratio
(``flops / Q_level``), never shrinks (no inverse tiling), and stops when no growth raises the ratio or fits.
Tiles are aligned to the hardware: sizes step through power-of-two multiples of the level below, a block's
reduction chunk starts at one full memory transaction of every input it is contiguous in, a block keeps the
grid at least one block per SM where the workload allows, and the block is grown to whole warps at the end.
No virtual threads. The cost model scores only the final schedule.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from gensorage.errors import ScheduleError
from gensorage.hw.profile import HwProfile
from gensorage.markov.cost_model import space_time
from gensorage.markov.outcome import SearchOutcome
from gensorage.markov.schedule import Schedule
from gensorage.markov.space import ScheduleSpace, space_for
from gensorage.ops.workload import Workload


def _next_aligned(space: ScheduleSpace, axis: int, current: int, base: int) -> int | None:
    """The next legal size above ``current`` that is ``base`` times a power of two (or the extent)."""
    ext = space.extents[axis]
    for c in space.candidates[axis]:
        if c > current and (c == ext or (c % base == 0 and (c // base) & (c // base - 1) == 0)):
            return c
    return None


def _grow(space: ScheduleSpace, s: Schedule, level: int, ok: Callable[[Schedule], bool]) -> Schedule:
    """Greedy growth of the level-``level`` tile by the compute-to-traffic ratio."""
    flops = space.workload.flops
    ratio = flops / space.traffic(s, level)
    while True:
        best: tuple[float, Schedule] | None = None
        for a in range(len(space.axes)):
            t = list(s.tiles[level])
            base = s.tiles[0][a] if level == 1 else 1
            nxt = _next_aligned(space, a, t[a], base)
            if nxt is None:
                continue
            t[a] = nxt
            t1 = tuple(t) if level == 1 else tuple(max(x, y) for x, y in zip(t, s.tiles[1], strict=True))
            t0 = tuple(t) if level == 0 else s.tiles[0]
            cand = space.make(t0, t1, s.vthreads, level)
            if not ok(cand):
                continue
            r = flops / space.traffic(cand, level)
            if r > ratio and (best is None or r > best[0]):
                best = (r, cand)
        if best is None:
            return s
        ratio, s = best


def _align_reduce(space: ScheduleSpace, s: Schedule) -> Schedule:
    """Start each reduction axis's block chunk at one memory transaction of the inputs contiguous in it."""
    t1 = list(s.tiles[1])
    for a in space.reduce:
        for t in space.inputs:
            last = t.dims[-1] if t.dims else ()
            if any(ax == a for ax, _ in last):
                need = -(-space.hw.transaction_bytes // t.elem_bytes)
                fitting = [c for c in space.candidates[a] if c >= max(need, t1[a]) and c % s.tiles[0][a] == 0]
                if fitting:
                    t1[a] = max(t1[a], fitting[0])
    aligned = space.make(s.tiles[0], tuple(t1), s.vthreads, 1)
    return aligned if space.fits(aligned) else s


def _align_warps(space: ScheduleSpace, s: Schedule) -> Schedule:
    """Grow the block (fastest spatial axis first) until it holds whole warps, while it fits."""
    warp = space.hw.warp_size
    while space.threads(s) % warp:
        for a in reversed(space.spatial):
            nxt = _next_aligned(space, a, s.tiles[1][a], s.tiles[0][a])
            if nxt is None:
                continue
            t1 = s.tiles[1][:a] + (nxt,) + s.tiles[1][a + 1:]
            cand = space.make(s.tiles[0], t1, s.vthreads, 1)
            if space.fits(cand):
                s = cand
                break
        else:
            return s
    return s


def construct(workload: Workload, hw: HwProfile, seed: int = 0, **opts: object) -> SearchOutcome:
    """Build a schedule greedily, Roller style.

    Parameters
    ----------
    workload, hw
        The loop nest and the GPU profile.
    seed
        Accepted for a uniform signature; the construction is deterministic.
    **opts
        None are accepted.

    Returns
    -------
    SearchOutcome
        ``method="roller"``, ``evaluated=1`` (only the final schedule is scored).

    Raises
    ------
    ScheduleError
        On an unknown option, or when even the smallest tiling does not fit the hardware.
    """
    del seed  # deterministic by construction
    if opts:
        raise ScheduleError(f"roller: unknown option(s) {', '.join(sorted(opts))}")
    start = time.perf_counter()
    space = space_for(workload, hw)
    s = space.initial()
    if not space.fits(s):
        raise ScheduleError(f"{workload.key()}: the smallest tiling does not fit {hw.name}")
    s = _grow(space, s, 0, space.fits)
    s = _align_reduce(space, Schedule(axes=s.axes, tiles=s.tiles, vthreads=s.vthreads, level=1))

    def enough_blocks(cand: Schedule) -> bool:
        blocks = math.prod(space.tile_counts(cand, 1)[a] for a in space.spatial)
        current = math.prod(space.tile_counts(s, 1)[a] for a in space.spatial)
        return space.fits(cand) and (blocks >= hw.sm_count or blocks >= current)

    s = _grow(space, s, 1, enough_blocks)
    s = _align_warps(space, s)
    s = Schedule(axes=s.axes, tiles=s.tiles, vthreads=s.vthreads, level=len(s.tiles) - 1)
    value = space_time(space, s)
    if not math.isfinite(value):
        raise ScheduleError(f"{workload.key()}: the Roller construction found no schedule that fits {hw.name}")
    elapsed = time.perf_counter() - start
    return SearchOutcome(schedule=s, predicted_time_s=value, method="roller", evaluated=1, elapsed_s=elapsed,
                         trace=((elapsed, value),))

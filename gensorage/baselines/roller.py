"""A Roller-like tree constructor (Zhu et al., OSDI'22), the construction baseline of the Gensor paper.

Greedy and single-objective, as the Gensor paper characterizes it: level by level from the registers outwards,
the tile grows along the axis whose growth most raises the level's compute-to-memory-traffic ratio
(``flops / Q_level``), never shrinks (no inverse tiling), and stops when no growth raises the ratio or fits,
or when the ratio reaches the hardware's FLOP/byte balance point for the level (Roller's saturation rule).
Tiles are aligned to the hardware: sizes step through power-of-two multiples of the level below, a block's
tile starts at one full memory transaction along every input's contiguous dimension, growth keeps at
least four warps per SM and one block per SM where the workload allows (scale-out), and the block is grown to
whole warps at the end. No virtual threads. The cost model scores only the final schedule.
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
from gensorage.workloads.workload import Workload


def _next_aligned(space: ScheduleSpace, axis: int, current: int, base: int) -> int | None:
    """The next legal size above ``current`` that is ``base`` times a power of two (or the extent)."""
    ext = space.extents[axis]
    for c in space.candidates[axis]:
        if c > current and (c == ext or (c % base == 0 and (c // base) & (c // base - 1) == 0)):
            return c
    return None


def _grow(
    space: ScheduleSpace, s: Schedule, level: int, ok: Callable[[Schedule], bool], saturation: float
) -> Schedule:
    """Greedy growth of the level-``level`` tile by the compute-to-traffic ratio.

    Stops when no aligned growth fits and raises the ratio, or once the ratio reaches ``saturation`` (the
    FLOP/byte balance point of the hardware for this level: more reuse cannot make it faster).
    """
    flops = space.workload.flops
    ratio = flops / space.traffic(s, level)
    while ratio < saturation:
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
    return s


def _parallel_units(space: ScheduleSpace, s: Schedule, level: int) -> int:
    """Threads (level 0) or blocks (level 1) the schedule launches."""
    counts = space.tile_counts(s, level)
    return math.prod(counts[a] for a in space.spatial)


def _keeps_parallelism(
    space: ScheduleSpace, start: Schedule, level: int, floor: int
) -> Callable[[Schedule], bool]:
    """Roller's scale-out rule: growth may not drop the parallel units below ``floor`` (unless already below)."""
    need = min(floor, _parallel_units(space, start, level))
    return lambda cand: space.fits(cand) and _parallel_units(space, cand, level) >= need


def _align_transactions(space: ScheduleSpace, s: Schedule) -> Schedule:
    """Grow the block tile until every input's contiguous run covers one memory transaction, where it fits.

    For each input, the axes indexing its last dimension grow (reduction axes first: that costs no
    parallelism) through aligned sizes until the run spans ``transaction_bytes`` or the axes are exhausted.
    """
    for t in space.inputs:
        if not t.dims or not t.dims[-1]:
            continue
        need = -(-space.hw.transaction_bytes // t.elem_bytes)
        order = sorted(t.dims[-1], key=lambda ac: not space.is_reduce[ac[0]])
        for a, _ in order:
            while space.tensor_elems_dim(t, -1, s.tiles[1]) < need:
                nxt = _next_aligned(space, a, s.tiles[1][a], s.tiles[0][a])
                if nxt is None:
                    break
                cand = space.make(s.tiles[0], s.tiles[1][:a] + (nxt,) + s.tiles[1][a + 1 :], s.vthreads, 1)
                if not space.fits(cand):
                    break
                s = cand
    return s


def _align_warps(space: ScheduleSpace, s: Schedule) -> Schedule:
    """Grow the block (fastest spatial axis first) to whole warps, while it fits and keeps the grid wide."""
    warp = space.hw.warp_size
    keep = _keeps_parallelism(space, s, 1, space.hw.sm_count)
    while space.threads(s) % warp:
        for a in reversed(space.spatial):
            nxt = _next_aligned(space, a, s.tiles[1][a], s.tiles[0][a])
            if nxt is None:
                continue
            t1 = s.tiles[1][:a] + (nxt,) + s.tiles[1][a + 1 :]
            cand = space.make(s.tiles[0], t1, s.vthreads, 1)
            if keep(cand):
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
    peak = hw.flops(workload.dtype, tensor_cores=True)
    # Registers: keep at least one warp per scheduler on every SM; saturate at the shared-memory balance.
    warps = 4 * hw.warp_size * hw.sm_count
    s = _grow(space, s, 0, _keeps_parallelism(space, s, 0, warps), peak / hw.level("shared").bandwidth_Bps)
    s = _align_transactions(space, Schedule(axes=s.axes, tiles=s.tiles, vthreads=s.vthreads, level=1))
    # Blocks: keep at least one block per SM; saturate at the DRAM balance.
    s = _grow(
        space, s, 1, _keeps_parallelism(space, s, 1, hw.sm_count), peak / hw.level("dram").bandwidth_Bps
    )
    s = _align_warps(space, s)
    s = Schedule(axes=s.axes, tiles=s.tiles, vthreads=s.vthreads, level=len(s.tiles) - 1)
    value = space_time(space, s)
    if not math.isfinite(value):
        raise ScheduleError(
            f"{workload.key()}: the Roller construction found no schedule that fits {hw.name}"
        )
    elapsed = time.perf_counter() - start
    return SearchOutcome(
        schedule=s,
        predicted_time_s=value,
        method="roller",
        evaluated=1,
        elapsed_s=elapsed,
        trace=((elapsed, value),),
    )

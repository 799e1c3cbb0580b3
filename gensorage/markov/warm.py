"""The construction at a new shape started from a known shape's schedule (Gensor's answer for dynamic shapes).

A model runs one loop nest at many sizes of one axis (sequence length, batch). The construction at a new size
need not walk from the unscheduled state again: the schedule built for the nearest known size of the same nest
is carried to the new extents (:func:`carry_schedule`: each tile moved to the nearest legal size, the virtual
threads kept where they still divide), then improved by steepest descent (:func:`descend`): every state one
step away on one axis (its register tile, block tile and virtual threads each one legal size up, down or kept)
is priced, and the best that improves becomes the next, until none does. The answer is never worse under the
cost model than the carried state itself, and tests/test_warm_starts.py bounds it against a cold construction's
at drawn shapes.

Why a descent and not Algorithm 1's walks (which this module ran before, with a smaller budget): on 40 drawn
matmuls, each carried from a shape up to 4x away, the descent's modelled cost was 0.995x of a cold
construction's (geometric mean; worst 1.34x, 3 above 1.2x) against 1.011x for the walks (worst 1.45x, 3 above
1.2x), in 22 ms median (91 ms at most, 48 states priced) against about 0.6 s for the walks: a new shape's
kernels are then ready within the fast mode's one second.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from bisect import bisect_right
from collections.abc import Iterator

from gensorage.hw.profile import HwProfile
from gensorage.markov.cost_model import space_time
from gensorage.markov.outcome import SearchOutcome
from gensorage.markov.schedule import Schedule
from gensorage.markov.space import LAST, ScheduleSpace, space_for
from gensorage.workloads.workload import Workload

#: The most states one descent prices (a descent from a carried state stops after about 50).
MAX_EVALUATIONS = 2000


def _at_most(cands: tuple[int, ...], x: int) -> int:
    """The largest legal size <= ``x`` (candidates always hold 1)."""
    return cands[max(0, bisect_right(cands, x) - 1)]


def carry_schedule(known: Schedule, space: ScheduleSpace) -> Schedule | None:
    """``known`` (a schedule of the same loop nest at other extents) at ``space``'s extents, or None when the
    axes differ or the carried state does not fit the hardware.

    Per axis: a block tile that covered the whole old extent covers the whole new one (as far as the legal
    sizes allow), any other is kept, capped by the extent; the register tile is kept, capped by the block
    tile; the virtual threads are halved until they divide the register tile.
    """
    if known.axes != space.axes:
        return None
    t0s: list[int] = []
    t1s: list[int] = []
    vs: list[int] = []
    for a, ext in enumerate(space.extents):
        cands = space.candidates[a]
        old_t0, old_t1, old_ext = known.tiles[0][a], known.tiles[1][a], known.tiles[LAST][a]
        t1 = _at_most(cands, ext if old_t1 == old_ext else min(old_t1, ext))
        t0 = _at_most(cands, min(old_t0, t1))
        v = known.vthreads[a]
        while v > 1 and (t0 % v or v > space.max_vthread(t0)):
            v //= 2
        t0s.append(t0)
        t1s.append(t1)
        vs.append(v)
    carried = space.make(tuple(t0s), tuple(t1s), tuple(vs), level=LAST)
    return carried if space.fits(carried) else None


def descend(
    space: ScheduleSpace, start: Schedule, max_evaluations: int = MAX_EVALUATIONS
) -> tuple[float, Schedule, int]:
    """Steepest descent under the cost model from ``start`` (a state that fits): the modelled time of the
    state it ends at, that state, and how many states it priced.

    A step changes one axis: its block tile and register tile each one legal size up, down or kept, and its
    virtual threads doubled, halved or kept; every such state that is well formed and fits is priced once.
    """
    best, best_time = start, space_time(space, start)
    seen = {(start.tiles, start.vthreads)}
    evaluations = 1
    while evaluations < max_evaluations:
        step: tuple[float, Schedule] | None = None
        for cand in _one_axis_moves(space, best):
            if (cand.tiles, cand.vthreads) in seen:
                continue
            seen.add((cand.tiles, cand.vthreads))
            if not (space.well_formed(cand) and space.fits(cand)):
                continue
            t = space_time(space, cand)
            evaluations += 1
            if t < best_time and (step is None or t < step[0]):
                step = (t, cand)
        if step is None:
            break
        best_time, best = step
    return best_time, best, evaluations


def _one_axis_moves(space: ScheduleSpace, s: Schedule) -> Iterator[Schedule]:
    t0s, t1s, vs = s.tiles[0], s.tiles[1], s.vthreads
    for a, cands in enumerate(space.candidates):
        i0, i1 = cands.index(t0s[a]), cands.index(t1s[a])
        for d1, d0, v in itertools.product((-1, 0, 1), (-1, 0, 1), (vs[a], vs[a] * 2, vs[a] // 2)):
            j0, j1 = i0 + d0, i1 + d1
            if (d0, d1, v) == (0, 0, vs[a]) or v < 1 or not (0 <= j0 <= j1 < len(cands)):
                continue
            yield space.make(_with(t0s, a, cands[j0]), _with(t1s, a, cands[j1]), _with(vs, a, v), level=LAST)


def _with(t: tuple[int, ...], a: int, x: int) -> tuple[int, ...]:
    return (*t[:a], x, *t[a + 1 :])


def construct_from(
    workload: Workload, hw: HwProfile, known: Schedule, max_evaluations: int = MAX_EVALUATIONS
) -> SearchOutcome | None:
    """Gensor's construction of ``workload`` on ``hw`` started from ``known`` carried to its extents.

    Parameters
    ----------
    workload, hw
        The loop nest at the new extents and the GPU profile.
    known
        A schedule of the same loop nest at other extents (e.g. the construction's answer there).
    max_evaluations
        The most states the descent prices.

    Returns
    -------
    SearchOutcome or None
        ``method="markov-warm"``; None when ``known`` does not carry over (other axes, or the carried state
        does not fit ``hw``): construct from scratch then.
    """
    start = time.perf_counter()
    space = space_for(workload, hw)
    carried = carry_schedule(known, space)
    if carried is None:
        return None
    value, best, evaluated = descend(space, carried, max_evaluations)
    return SearchOutcome(
        schedule=dataclasses.replace(best, level=LAST),
        predicted_time_s=value,
        method="markov-warm",
        evaluated=evaluated,
        elapsed_s=time.perf_counter() - start,
        trace=(),
    )


__all__ = ["MAX_EVALUATIONS", "carry_schedule", "construct_from", "descend"]

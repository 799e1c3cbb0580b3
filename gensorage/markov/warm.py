"""The construction at a new shape started from a known shape's schedule (Gensor's answer for dynamic shapes).

A model runs one loop nest at many sizes of one axis (sequence length, batch). The construction at a new size
need not walk from the unscheduled state again: the schedule built for the nearest known size of the same nest
is carried to the new extents (:func:`carry_schedule`: each tile moved to the nearest legal size, the virtual
threads kept where they still divide) and the Markov chain walks a few rounds from there
(:func:`construct_from`), with a few walks from the unscheduled state beside them. The walks are Algorithm 1's,
with a smaller budget (``WARM_DEFAULTS``): the start is already a good state, so they only refine it. The answer is never worse under the cost model than the carried
state itself, and tests/test_warm_starts.py bounds it against a cold construction's at drawn shapes.
"""

from __future__ import annotations

import dataclasses
import time
from bisect import bisect_right
from typing import Any

from gensorage.errors import ScheduleError
from gensorage.hw.profile import HwProfile
from gensorage.markov.anneal import anneal
from gensorage.markov.cost_model import space_time
from gensorage.markov.outcome import SearchOutcome
from gensorage.markov.schedule import Schedule
from gensorage.markov.space import LAST, ScheduleSpace, space_for
from gensorage.workloads.workload import Workload

# 4 walks from each of the 8 best distinct register tiles per round, at most 4 rounds, stopping after 2 rounds
# that find nothing better, and at most 1500 transitions (a cold construction: 12 starts, 12 rounds, patience 3,
# 6000 transitions). Measured on 80 drawn matmuls, each warm-started from a shape up to 4x away, against cold
# constructions: about 1/5 of their time, modelled cost geometric mean 1.03x, worst 1.39x, 9 above 1.2x; half
# this budget (4 starts, 3 rounds, patience 1, 600 transitions) took 1/3 of that time but gave 1.07x, worst
# 1.63x, 18 above 1.2x. Cold constructions with seeds 1 and 2 differ from seed 0's by 0.75-1.31x.
WARM_DEFAULTS: dict[str, int] = {
    "walks": 4,
    "population": 8,
    "rounds": 4,
    "patience": 2,
    "top_k": 10,
    "iterations": 50,
    "max_steps": 1500,
}


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


def construct_from(
    workload: Workload, hw: HwProfile, known: Schedule, seed: int = 0, **opts: int
) -> SearchOutcome | None:
    """Gensor's construction of ``workload`` on ``hw`` walked from ``known`` carried to its extents.

    Parameters
    ----------
    workload, hw
        The loop nest at the new extents and the GPU profile.
    known
        A schedule of the same loop nest at other extents (e.g. the construction's answer there).
    seed
        Seeds the walks, as for :func:`gensorage.markov.construct`.
    **opts
        Overrides of ``WARM_DEFAULTS`` (the options of :func:`gensorage.markov.construct`).

    Returns
    -------
    SearchOutcome or None
        ``method="markov-warm"``; None when ``known`` does not carry over (other axes, or the carried state
        does not fit ``hw``): construct from scratch then.
    """
    params: dict[str, Any] = {k: int(opts.pop(k, v)) for k, v in WARM_DEFAULTS.items()}
    if opts:
        raise ScheduleError(f"construct_from: unknown option(s) {', '.join(sorted(opts))}")
    start = time.perf_counter()
    space = space_for(workload, hw)
    carried = carry_schedule(known, space)
    if carried is None:
        return None
    # The unscheduled state starts walks too: where the carried state sits in a basin that was good at the old
    # extents only, those walks find the new one (measured: 2.5x -> 1.24x of the cold cost for a 7x shrink).
    starts = (carried, space.initial())
    result = anneal(space, lambda s: space_time(space, s), seed=seed, starts=starts, **params)
    if not result.ranked:
        return None
    value, best = result.ranked[0]
    return SearchOutcome(
        schedule=dataclasses.replace(best, level=LAST),
        predicted_time_s=value,
        method="markov-warm",
        evaluated=result.evaluated,
        elapsed_s=time.perf_counter() - start,
        trace=result.trace,
    )


__all__ = ["WARM_DEFAULTS", "carry_schedule", "construct_from"]

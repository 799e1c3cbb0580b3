"""Transition benefits (Gensor §IV-B, formulas (1)-(3)) and the annealing weights of §IV-C.

The benefit of an action is a speed-up ratio (> 1: the successor is better by that measure). Algorithm 2
normalizes the benefits of all actions at a state into transition probabilities; an action that does not
apply, or whose successor does not fit the hardware (threads, registers, shared memory), has benefit 0.

Where the paper leaves a quantity open, the choice made here and why:

- Formula (1) is printed as ``Q(T)/Q(T') = Q(T)F(T')/(Q(T')F(T))``: the first form lost its denominator in
  typesetting; the text calls ``Q(T)/Q(T')`` the numerator and ``F(T)/F(T')`` the denominator, which is the
  second form. We use that second form exactly. ``Q`` is the traffic into the tiled level over the whole
  kernel and ``F`` the footprint of one tile at that level (:meth:`ScheduleSpace.traffic` / ``footprint``),
  both in bytes. Growing a tile that cuts traffic scores ``> 1``; the memory check bounds the growth.
- Formula (2) is the access time of the memory the cache action moves data access *from* over that of the
  memory it moves it *to* (in the paper, from a slower "low" level to a faster "high" one). This construction
  runs in the other direction (registers first, as it starts from the all-1 register tile): leaving level 0
  moves from registers to shared memory, leaving level 1 from shared to global memory (DRAM). So the ratio is
  ``(L_cur + S/B_cur) / (L_next + S/B_next)``, below 1, and the cache probability is driven up by the
  annealing multiplier and by tile actions running out of room, as §IV-C describes. (Taken the other way
  round, the ratio is about 10 on every GPU, several times any tile step's benefit, and a walk would leave
  each level after one or two steps whatever its tiles.) ``S_data``, "the size of data exchanged", is the
  traffic ``Q`` of the current tiling at that level; latencies are converted from cycles to seconds with the
  SM clock so both terms are seconds.
- Formula (3): ``x`` is the width in bytes one warp sweeps in parallel along the axis (lanes of the warp along
  it times ``T_0``), ``W`` the width of one row of banks (banks x bank width), ``V`` the virtual threads after the
  action. When the axis already has ``v`` virtual threads the ratio is taken against ``v`` (not 1), so the
  formula measures this action's change.
- The cache multiplier ``3 / (1 + exp(-ln5/10 * (t - 10)))`` must grow "as the temperature falls"; with ``t`` the
  iteration count it does (0.5 at t = 0, 1.5 at t = 10, -> 3), so ``t`` is the iteration count,
  ``t = log2(T_start / T)``.
- The probability of keeping a state among the top results, ``1 - 1/(1 + exp(-0.5(-log T - 10)))``, uses the
  natural logarithm of the temperature.
"""

from __future__ import annotations

import math

from gensorage.markov.actions import Action, apply
from gensorage.markov.schedule import Schedule
from gensorage.markov.space import LAST, LEVEL_MEMORY, ScheduleSpace

_CACHE_SLOPE = math.log(5) / 10


def tiling_benefit(space: ScheduleSpace, before: Schedule, after: Schedule, level: int) -> float:
    """Formula (1): ``Q(T) F(T') / (Q(T') F(T))`` at ``level``."""
    q, q2 = space.traffic(before, level), space.traffic(after, level)
    f, f2 = space.footprint(before, level), space.footprint(after, level)
    return (q * f2) / (q2 * f)


def caching_benefit(space: ScheduleSpace, s: Schedule) -> float:
    """Formula (2) for leaving level ``s.level``: access time of its memory over that of the next level's."""
    hw = space.hw
    cur = hw.level(LEVEL_MEMORY[s.level])
    nxt = hw.level(LEVEL_MEMORY[s.level + 1])
    data = space.traffic(s, s.level)
    t_cur = cur.latency_cycles / hw.clock_hz + data / cur.bandwidth_Bps
    t_next = nxt.latency_cycles / hw.clock_hz + data / nxt.bandwidth_Bps
    return t_cur / t_next


def vthread_benefit(space: ScheduleSpace, s: Schedule, axis: int, vthreads: int) -> float:
    """Formula (3): ``ceil(x / (v W)) / ceil(x / (V W))`` for ``v -> V`` virtual threads on ``axis``."""
    hw = space.hw
    elem = max(t.elem_bytes for t in space.inputs) if space.inputs else space.output.elem_bytes
    x = space.warp_lanes(s)[axis] * s.tiles[0][axis] * elem
    w = hw.shared_banks * hw.bank_width_bytes
    return math.ceil(x / (s.vthreads[axis] * w)) / math.ceil(x / (vthreads * w))


def cache_weight(t: int) -> float:
    """The multiplier on the cache action's probability at iteration ``t`` (§IV-C)."""
    return 3.0 / (1.0 + math.exp(-_CACHE_SLOPE * (t - 10)))


def keep_probability(temperature: float) -> float:
    """Probability that Algorithm 1 appends the new state to its top results at ``temperature``."""
    return 1.0 - 1.0 / (1.0 + math.exp(-0.5 * (-math.log(temperature) - 10)))


def benefit(space: ScheduleSpace, s: Schedule, action: Action, t: int) -> tuple[float, Schedule | None]:
    """Algorithm 2's ``getBenefit``: the (unnormalized) weight of ``action`` at ``s`` and its successor.

    The weight is 0 (and the successor ``None``) when the action does not apply or the successor does not fit.
    """
    nxt = apply(space, s, action)
    if nxt is None:
        return 0.0, None
    if action.kind == "cache":
        # Leaving the last tunable level finishes the construction: the state itself must fit.
        if nxt.level == LAST and not space.fits_hardware(s):
            return 0.0, None
        return caching_benefit(space, s) * cache_weight(t), nxt
    if not space.fits_hardware(nxt):  # actions only build well-formed states; check the hardware limits
        return 0.0, None
    if action.kind == "vthread":
        return vthread_benefit(space, s, action.axis, nxt.vthreads[action.axis]), nxt
    return tiling_benefit(space, s, nxt, s.level), nxt

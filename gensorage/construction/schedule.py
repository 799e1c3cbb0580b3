"""The one call into Gensor's construction for a loop nest, memoised for the process.

Every route that sizes a kernel from the hardware profile comes here: the search sizing a verified block graph
(:mod:`.block_sizes`), re-instantiation at new shapes (:mod:`.kernel_sizes`) and the code generator tiling a
block's matmul over its threads or a pre-defined kernel over its blocks (:mod:`.block_threads`). Construction
is a pure function of (workload, profile, seed), so the memo changes no result, only the time: a search sizes
thousands of block graphs whose loop nests repeat. The tuner's front door (:func:`gensorage.tune`, with its
store and its baselines) is for users tuning one operator; nothing inside the pipeline goes through it.
"""

from __future__ import annotations

from gensorage.hw.profile import HwProfile
from gensorage.markov import construct
from gensorage.markov.schedule import Schedule
from gensorage.workloads.workload import Workload

_CACHE: dict[tuple[object, ...], Schedule] = {}
_CACHE_LIMIT = 1024  # schedules kept before the memo starts afresh (bounds memory on long runs)


def construct_schedule(workload: Workload, hw: HwProfile, seed: int = 0) -> Schedule:
    """Gensor's Markov construction of ``workload`` on ``hw`` (:func:`gensorage.markov.construct`), memoised per
    workload, profile and seed in this process.

    Raises
    ------
    ScheduleError
        No schedule the construction reaches fits ``hw``.
    """
    # The key names the whole loop nest: a block graph's nests share a name and axes but not their accesses.
    key = (workload.key(), workload.flops, workload.accesses, hw, seed)
    hit = _CACHE.get(key)
    if hit is None:
        if len(_CACHE) >= _CACHE_LIMIT:
            _CACHE.clear()
        hit = _CACHE[key] = construct(workload, hw, seed=seed).schedule
    return hit


__all__ = ["construct_schedule"]

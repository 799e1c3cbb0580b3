"""The one call into Gensor's construction for a loop nest, memoised for the process.

Every route that sizes a kernel from the hardware profile comes here: the search sizing a verified block graph
(:mod:`.block_sizes`), re-instantiation at new shapes (:mod:`.kernel_sizes`) and the code generator tiling a
block's matmul over its threads or a pre-defined kernel over its blocks (:mod:`.block_threads`). Construction
is a pure function of (workload, profile, seed), so the memo changes no result, only the time: a search sizes
thousands of block graphs whose loop nests repeat. The tuner's front door (:func:`gensorage.tune`, with its
store and its baselines) is for users tuning one operator; nothing inside the pipeline goes through it.

Inside :func:`warm_starts` (the dispatch cache lowering a known structure at a new shape), a loop nest not
constructed yet is walked from the schedule of the nearest constructed nest of its *shape class* (the same nest
at other extents, each within a factor ``MAX_CARRY_FACTOR``: :func:`shape_class`) by
:func:`gensorage.markov.warm.construct_from` (the carried schedule, improved by steepest descent) instead of a
whole construction. Those answers depend on what was constructed before in the process, so they are kept in
a memo of their own: outside :func:`warm_starts` the answer is always the cold construction's.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from gensorage.hw.profile import HwProfile
from gensorage.markov import construct
from gensorage.markov.schedule import Schedule
from gensorage.markov.warm import construct_from
from gensorage.workloads.workload import Workload

_Key = tuple[object, ...]
_CACHE: dict[_Key, Schedule] = {}  # cold constructions
_WARM: dict[_Key, Schedule] = {}  # warm-started constructions (inside warm_starts only)
_CLASSES: dict[_Key, dict[tuple[int, ...], Schedule]] = {}  # shape class -> extents -> schedule (both memos)
_CACHE_LIMIT = 1024  # schedules kept before the memos start afresh (bounds memory on long runs)
MAX_CARRY_FACTOR = 4  # a known shape warm-starts a new one whose extents are within this factor of its own
_WARM_STARTS: ContextVar[bool] = ContextVar("gensorage_warm_starts", default=False)


def construct_schedule(workload: Workload, hw: HwProfile, seed: int = 0) -> Schedule:
    """Gensor's Markov construction of ``workload`` on ``hw`` (:func:`gensorage.markov.construct`), memoised per
    workload, profile and seed in this process; inside :func:`warm_starts`, walked from the nearest constructed
    shape of the same nest where there is one.

    Raises
    ------
    ScheduleError
        No schedule the construction reaches fits ``hw``.
    """
    # The key names the whole loop nest: a block graph's nests share a name and axes but not their accesses.
    key = (workload.key(), workload.flops, workload.accesses, hw, seed)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    if _WARM_STARTS.get():
        hit = _WARM.get(key) or _warm(workload, hw, seed, key)
        if hit is not None:
            return hit
    if len(_CACHE) >= _CACHE_LIMIT:
        _clear()
    hit = _CACHE[key] = construct(workload, hw, seed=seed).schedule
    _index(workload, hw, seed, hit)
    return hit


@contextmanager
def warm_starts() -> Iterator[None]:
    """Within this context, :func:`construct_schedule` walks a new loop nest from the nearest constructed shape
    of its shape class (the cold construction where there is none, or where it does not carry over)."""
    token = _WARM_STARTS.set(True)
    try:
        yield
    finally:
        _WARM_STARTS.reset(token)


def warm_starts_active() -> bool:
    """Whether the caller is inside :func:`warm_starts`."""
    return _WARM_STARTS.get()


def shape_class(workload: Workload) -> tuple[object, ...]:
    """The loop nest without its extents: op, parameter names, axes, accesses' indexing and dtypes."""
    accesses = tuple(
        (a.tensor, len(a.shape), a.dtype, a.index, a.offset, a.is_output, a.elem_bytes)
        for a in workload.accesses
    )
    axes = tuple((a.name, a.kind) for a in workload.axes)
    return (workload.name, tuple(k for k, _ in workload.params), axes, accesses, workload.dtype)


def _extents(workload: Workload) -> tuple[int, ...]:
    return tuple(a.extent for a in workload.axes)


def _index(workload: Workload, hw: HwProfile, seed: int, schedule: Schedule) -> None:
    _CLASSES.setdefault((shape_class(workload), hw, seed), {})[_extents(workload)] = schedule


def _warm(workload: Workload, hw: HwProfile, seed: int, key: _Key) -> Schedule | None:
    known = _CLASSES.get((shape_class(workload), hw, seed))
    if not known:
        return None
    ext = _extents(workload)
    # Nearest on a log scale: 16 -> 24 is nearer than 16 -> 4.
    nearest = min(known, key=lambda e: sum(abs(math.log(a / b)) for a, b in zip(ext, e, strict=True)))
    if any(max(a, b) > MAX_CARRY_FACTOR * min(a, b) for a, b in zip(ext, nearest, strict=True)):
        return None  # too far for a few steps to adapt the state (measured up to 1.6x the cold cost)
    outcome = construct_from(workload, hw, known[nearest])
    if outcome is None:
        return None
    if len(_WARM) >= _CACHE_LIMIT:
        _clear()
    _WARM[key] = outcome.schedule
    _index(workload, hw, seed, outcome.schedule)
    return outcome.schedule


def _clear() -> None:
    _CACHE.clear()
    _WARM.clear()
    _CLASSES.clear()


__all__ = ["construct_schedule", "shape_class", "warm_starts", "warm_starts_active"]

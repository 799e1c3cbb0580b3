"""Transition actions of the construction graph (Gensor §IV-A, the edges): tile, inverse tile, cache, vThread.

Each action maps a state (a :class:`Schedule`) to its successor, or to ``None`` where it does not apply (a tile
already at its largest/smallest legal size, a virtual-thread count that would not divide the register tile,
caching out of the last level). Whether the successor fits the hardware is the benefit's business
(probability 0), not the action's.

- ``tile`` / ``inv_tile`` on axis ``a`` move ``T_level[a]`` to the next larger / smaller legal size (powers of two
  and divisors of the extent, :attr:`ScheduleSpace.candidates`), keeping ``T_0 <= T_1 <= extent``: growing
  ``T_0`` past ``T_1`` drags ``T_1`` along (from the unscheduled start, where ``T_1 = T_0 = 1``, the block tile
  follows the register tile), and ``T_1`` never shrinks below ``T_0``. Shrinking ``T_0`` to a size the axis's
  virtual threads do not divide lowers them to the largest power of two that does.
- ``cache`` moves the construction to the next memory level (registers -> shared memory -> done).
- ``vthread`` on a spatial axis doubles its virtual threads (``setVThread``).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from gensorage.markov.schedule import Schedule
from gensorage.markov.space import LAST, ScheduleSpace

ActionKind = Literal["tile", "inv_tile", "cache", "vthread"]
ACTION_KINDS: tuple[ActionKind, ...] = ("tile", "inv_tile", "cache", "vthread")


@dataclass(frozen=True, slots=True)
class Action:
    kind: ActionKind
    axis: int  # axis position; -1 for ``cache``


def actions(space: ScheduleSpace, state: Schedule) -> tuple[Action, ...]:
    """Every action Algorithm 2 scores at ``state``: per action kind, per dimension (cache once).

    The set is the same at every state of a space (:func:`apply` tells which apply), hence memoized.
    """
    del state
    return _all_actions(len(space.axes), space.spatial)


@lru_cache(maxsize=64)
def _all_actions(n: int, spatial: tuple[int, ...]) -> tuple[Action, ...]:
    out: list[Action] = []
    out += [Action("tile", a) for a in range(n)]
    out += [Action("inv_tile", a) for a in range(n)]
    out.append(Action("cache", -1))
    out += [Action("vthread", a) for a in spatial]
    return tuple(out)


def _set(t: tuple[int, ...], a: int, value: int) -> tuple[int, ...]:
    return t[:a] + (value,) + t[a + 1 :]


def _retile(s: Schedule, a: int, new: int) -> Schedule:
    t0, t1 = s.tiles[0], s.tiles[1]
    v = s.vthreads
    if s.level == 0:
        t0, t1 = _set(t0, a, new), _set(t1, a, max(new, t1[a]))
        if new % v[a]:
            v = _set(v, a, min(v[a], new & -new))  # both powers of two: the largest legal count left
    else:
        t1 = _set(t1, a, new)
    return Schedule(axes=s.axes, tiles=(t0, t1, s.tiles[LAST]), vthreads=v, level=s.level)


def apply(space: ScheduleSpace, s: Schedule, action: Action) -> Schedule | None:
    """The successor of ``s`` under ``action``, or ``None`` where the action does not apply."""
    if s.level >= LAST:
        return None
    if action.kind == "cache":
        return Schedule(axes=s.axes, tiles=s.tiles, vthreads=s.vthreads, level=s.level + 1)
    a = action.axis
    cands = space.candidates[a]
    cur = s.tiles[s.level][a]
    if action.kind == "tile":
        i = bisect_right(cands, cur)
        return _retile(s, a, cands[i]) if i < len(cands) else None
    if action.kind == "inv_tile":
        i = bisect_left(cands, cur) - 1
        floor = s.tiles[0][a] if s.level == 1 else 1
        if i < 0 or cands[i] < floor:
            return None
        return _retile(s, a, cands[i])
    if action.kind == "vthread":
        v = s.vthreads[a] * 2
        if space.is_reduce[a] or v > space.max_vthread(s.tiles[0][a]):
            return None
        return Schedule(axes=s.axes, tiles=s.tiles, vthreads=_set(s.vthreads, a, v), level=s.level)
    raise ValueError(f"unknown action kind {action.kind!r}")

"""A task run in pieces: a stopped run continued later (:func:`join`), or a long task split into smaller tasks
that idle workers run apart (:func:`merge`, the core's ``split_task``). Either way the driver ends with one
:class:`~.conversions.Outcome` per task, the same as one uninterrupted run would have returned."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from gensorage.exhaustive.run.conversions import Outcome, add_stats


@dataclass(slots=True)
class Part:
    """One piece of a task, in walk order: ``task`` to run (the core's), ``before`` what earlier runs of this
    piece found (it was stopped and continues), ``done`` its whole result once it finished."""

    task: Any
    before: Outcome | None = None
    done: Outcome | None = None
    splittable: bool = True


def join(before: Outcome | None, after: Outcome) -> Outcome:
    """``after`` (a run continuing where ``before`` stopped) counted from ``before``'s start: candidates
    appended, statistics and seconds summed; ``after``'s resume point and sized structures (a continued run
    starts with the sized structures of the one it continues)."""
    if before is None:
        return after
    shift = len(before.rows)
    rows = before.rows + [dataclasses.replace(r, position=shift + r.position) for r in after.rows]
    return Outcome(
        after.index,
        after.complete,
        add_stats(before.stats, after.stats),
        rows,
        before.elapsed_s + after.elapsed_s,
        after.resume,
        after.sized,
        _keys(before) + _keys(after),
    )


def merge(index: int, parts: list[Outcome]) -> Outcome:
    """The finished pieces of task ``index`` (in walk order) as one complete outcome.

    A structure is a candidate once per task (the first time the walk sizes it); pieces run apart each sized
    their own, so a candidate whose structure an earlier piece sized is dropped: what is left is what one walk
    would have kept.
    """
    seen: set[str] = set()
    rows: list[Any] = []
    keys: list[str | None] = []
    stats: dict[str, Any] = {}
    elapsed = 0.0
    for part in parts:
        for row, key in zip(part.rows, _keys(part), strict=True):
            if key is not None and key in seen:
                continue
            rows.append(dataclasses.replace(row, position=len(rows)))
            keys.append(key)
        seen.update(part.sized)
        stats = add_stats(stats, part.stats)
        elapsed += part.elapsed_s
    return Outcome(index, True, stats, rows, elapsed, None, tuple(sorted(seen)), tuple(keys))


def _keys(out: Outcome) -> tuple[str | None, ...]:
    """One structure key per row (None where the core gave none)."""
    return out.keys if len(out.keys) == len(out.rows) else (None,) * len(out.rows)


__all__ = ["Part", "join", "merge"]

"""The search core the runner drives: the contract between :mod:`.runner` and a search (by default
:mod:`gensorage.exhaustive`'s own task API)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class SearchCore:
    """The search core the runner drives (by default :mod:`gensorage.exhaustive`).

    Every member must be picklable by reference (module-level functions and classes), since worker processes
    receive it.
    """

    enumerate_tasks: Callable[[Any], Sequence[Any]]
    run_task: Callable[..., Any]
    rank_candidates: Callable[[Sequence[Any]], list[Any]]
    candidate_type: Callable[..., Any]
    stats_type: Callable[..., Any]
    # (task, resume JSON) -> the task continuing a stopped run; a stopped result says where in ``.resume``
    # (with ``to_json()``). None: stopped tasks start afresh.
    resume_task: Callable[[Any, Any], Any] | None = None
    # (spec, task, resume JSON of a stopped run of it) -> what is left of it as smaller tasks of the same index,
    # in walk order ([]: nothing to split); results of several are merged by :func:`.pieces.merge`. None: tasks
    # are never split.
    split_task: Callable[[Any, Any, Any], Sequence[Any]] | None = None


def default_core() -> SearchCore:
    """The real exhaustive-search core of :mod:`gensorage.exhaustive`."""
    from gensorage.exhaustive import results
    from gensorage.exhaustive.walk import tasks

    return SearchCore(
        enumerate_tasks=tasks.enumerate_tasks,
        run_task=tasks.run_task_shared,
        rank_candidates=results.rank_candidates,
        candidate_type=results.Candidate,
        stats_type=results.Stats,
        resume_task=tasks.resume_task,
        split_task=tasks.split_task,
    )


__all__ = ["SearchCore", "default_core"]

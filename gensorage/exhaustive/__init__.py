"""Mirage-style exhaustive µGraph search (Algorithm 1 with abstract expressions), split into tasks and run
resumably.

The package is in pipeline order:

- :mod:`.spec` (what to search: :class:`SearchSpec`), :mod:`.dim_strategy` (the imaps, omaps and fmaps a
  search may use), :mod:`.opcatalog` (the operator variants it enumerates) and :mod:`.results` (tasks,
  candidates, statistics, their ranking and the result of a search);
- :mod:`.expr`: the abstraction the search prunes with: abstract expressions, their normal forms, the
  ``A_eq``/``A_sub`` axioms, the subexpression oracle, and index ties;
- :mod:`.rules`: the pruning rules, each a value with one interface, in the order the walk applies them;
- :mod:`.walk`: the depth-first walk of the search tree (kernel and block level), its state, and the task API
  (:func:`enumerate_tasks`, :func:`run_task`, :func:`search_serial`);
- :mod:`.run`: the runner (:func:`run_search`): tasks on worker processes, a checkpoint, progress, Ctrl-C.

The names below are imported on first use, so importing the package (and the runner's worker processes that
import it) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gensorage.exhaustive.dim_strategy import DimStrategy, list_dim_strategies, load_dim_strategy
    from gensorage.exhaustive.results import (
        Candidate,
        Resume,
        SearchResult,
        Stats,
        Task,
        TaskResult,
        rank_candidates,
    )
    from gensorage.exhaustive.run.core import SearchCore, default_core
    from gensorage.exhaustive.run.runner import SearchInterrupted, run_search
    from gensorage.exhaustive.spec import SearchSpec
    from gensorage.exhaustive.walk.tasks import (
        enumerate_tasks,
        resume_task,
        run_task,
        run_task_shared,
        search_serial,
    )

_EXPORTS: dict[str, str] = {
    "SearchSpec": "gensorage.exhaustive.spec",
    "DimStrategy": "gensorage.exhaustive.dim_strategy",
    "list_dim_strategies": "gensorage.exhaustive.dim_strategy",
    "load_dim_strategy": "gensorage.exhaustive.dim_strategy",
    "Candidate": "gensorage.exhaustive.results",
    "Resume": "gensorage.exhaustive.results",
    "SearchResult": "gensorage.exhaustive.results",
    "Stats": "gensorage.exhaustive.results",
    "Task": "gensorage.exhaustive.results",
    "TaskResult": "gensorage.exhaustive.results",
    "rank_candidates": "gensorage.exhaustive.results",
    "enumerate_tasks": "gensorage.exhaustive.walk.tasks",
    "resume_task": "gensorage.exhaustive.walk.tasks",
    "run_task": "gensorage.exhaustive.walk.tasks",
    "run_task_shared": "gensorage.exhaustive.walk.tasks",
    "search_serial": "gensorage.exhaustive.walk.tasks",
    "SearchCore": "gensorage.exhaustive.run.core",
    "default_core": "gensorage.exhaustive.run.core",
    "SearchInterrupted": "gensorage.exhaustive.run.runner",
    "run_search": "gensorage.exhaustive.run.runner",
}

__all__ = [
    "Candidate",
    "DimStrategy",
    "Resume",
    "SearchCore",
    "SearchInterrupted",
    "SearchResult",
    "SearchSpec",
    "Stats",
    "Task",
    "TaskResult",
    "default_core",
    "enumerate_tasks",
    "list_dim_strategies",
    "load_dim_strategy",
    "rank_candidates",
    "resume_task",
    "run_search",
    "run_task",
    "run_task_shared",
    "search_serial",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gensorage.exhaustive' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})

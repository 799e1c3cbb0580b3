"""Mirage-style exhaustive µGraph search (Algorithm 1 with abstract expressions), split into tasks and run
resumably.

The package is in pipeline order:

- :mod:`.spec` (what to search: :class:`SearchSpec`), :mod:`.dim_strategy` (the imaps, omaps and fmaps a
  search may use) and :mod:`.results` (tasks, candidates, statistics and the result of a search);
- :mod:`.expr`: the abstraction the search prunes with: abstract expressions, the ``A_eq``/``A_sub`` axioms, the
  subexpression oracle, and index ties;
- :mod:`.rules`: the pruning rules, each a value with one interface, in the ordered lists the walk applies;
- :mod:`.walk`: the depth-first walk of the search tree (kernel and block level), its state, and the task API
  (:func:`enumerate_tasks`, :func:`run_task`);
- :mod:`.run`: running a search: :func:`search_serial` in this process, :func:`run_search` on worker processes
  with a checkpoint, progress and Ctrl-C handling.
"""

from __future__ import annotations

from gensorage.exhaustive.dim_strategy import DimStrategy, list_dim_strategies, load_dim_strategy
from gensorage.exhaustive.results import Candidate, Resume, SearchResult, Stats, Task, TaskResult
from gensorage.exhaustive.run.runner import SearchCore, SearchInterrupted, run_search
from gensorage.exhaustive.spec import SearchSpec
from gensorage.exhaustive.walk.generator import (
    enumerate_tasks,
    rank_candidates,
    resume_task,
    run_task,
    run_task_shared,
    search_serial,
)

__all__ = [
    "Candidate", "DimStrategy", "Resume", "SearchCore", "SearchInterrupted", "SearchResult", "SearchSpec", "Stats",
    "Task", "TaskResult", "enumerate_tasks", "list_dim_strategies", "load_dim_strategy", "rank_candidates",
    "resume_task", "run_search", "run_task", "run_task_shared", "search_serial",
]

"""The depth-first walk of the search tree and the task API.

- :mod:`.walk`: :class:`Walk`, one walk of (part of) the tree: the node it is at, its counters, its candidates;
- :mod:`.tasks`: the tree split into tasks (:func:`enumerate_tasks`), one task walked (:func:`run_task`), every
  task in this process (:func:`search_serial`);
- :mod:`.search_context`: what a search precomputes from its spec (facts, rules, memos), shared by its tasks;
- :mod:`.search_state`: the µGraph prefix, changed in place and undone on the way back up;
- the children of a node: :mod:`.kernel_level` (kernel operators and block-graph headers), :mod:`.block_level`
  (the block graph in progress: :mod:`.bindings`, :mod:`.operators`, :mod:`.accumulators`, :mod:`.finishing`),
  in canonical rank order (:mod:`.rank`), with the split-reduction rule of :mod:`.provenance`;
- :mod:`.subtree_memo`: kernel-level subtrees walked once per process;
- from a complete µGraph to a candidate: :mod:`.finalize` (:mod:`.thread_fusion`, verification,
  :mod:`.probe_sizes`, :mod:`gensorage.construction.block_sizes`, cost).
"""

from __future__ import annotations

from gensorage.exhaustive.walk.search_context import SearchContext, process_context
from gensorage.exhaustive.walk.search_state import SearchState
from gensorage.exhaustive.walk.tasks import (
    enumerate_tasks,
    resume_task,
    run_task,
    run_task_shared,
    search_serial,
)
from gensorage.exhaustive.walk.walk import Walk

__all__ = [
    "SearchContext",
    "SearchState",
    "Walk",
    "enumerate_tasks",
    "process_context",
    "resume_task",
    "run_task",
    "run_task_shared",
    "search_serial",
]

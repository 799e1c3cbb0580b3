"""The search's result types: tasks, candidates, statistics (the runner's contract, all JSON-able), the ranking
of candidates, and the result of a whole search."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gensorage.ugraph.ir import KernelGraph


@dataclass(frozen=True, slots=True)
class Stats:
    """Counters of a search (or of one task); ``a + b`` adds them field by field.

    ``states``: search-tree nodes visited; ``pruned_expr``/``pruned_shape``/``pruned_memory``: operators
    rejected by the abstract-expression test, by shape inference, by a memory limit; ``solver_queries``,
    ``cache_hits``, ``solver_timeouts``: the subexpression oracle's counters; ``verified``: complete µGraphs
    that passed the equivalence check, ``rejected``: ones that failed it, ``unstable``: verified ones the float
    test rejected; ``states_reused``: the part of ``states`` replayed from an identical kernel-level subtree
    already walked in the same process instead of walked again (see :mod:`.walk.subtree_memo`).

    The counters in ``WORK_COUNTERS`` measure work done, which depends on the tasks that ran earlier in the same
    process (shared subtree memo and oracle, see :mod:`.walk.search_context`); the others are the same however
    the tasks are spread over processes, stopped and resumed.
    """

    states: int = 0
    pruned_expr: int = 0
    pruned_shape: int = 0
    pruned_memory: int = 0
    solver_queries: int = 0
    cache_hits: int = 0
    solver_timeouts: int = 0
    verified: int = 0
    rejected: int = 0
    unstable: int = 0
    states_reused: int = 0

    def __add__(self, other: Stats) -> Stats:
        if not isinstance(other, Stats):
            return NotImplemented
        return Stats(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(Stats)))

    def to_json(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(Stats)}

    @staticmethod
    def from_json(data: dict[str, Any]) -> Stats:
        names = {f.name for f in fields(Stats)}
        return Stats(**{k: int(v) for k, v in data.items() if k in names})

    def logical(self) -> Stats:
        """These counters with the work counters zeroed: what every way of running the search reports alike."""
        return dataclasses.replace(self, **{k: 0 for k in WORK_COUNTERS})


WORK_COUNTERS = ("states_reused", "solver_queries", "cache_hits", "solver_timeouts")


@dataclass(frozen=True, slots=True)
class Resume:
    """Where a stopped task continues: the node it stopped at (``cursor``, child ordinals from the root; the
    walk is depth-first, so every node before it was finished) and the structures it had already sized (so a
    resumed walk does not return them twice)."""

    cursor: tuple[int, ...]
    sized: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"cursor": list(self.cursor), "sized": list(self.sized)}

    @staticmethod
    def from_json(data: dict[str, Any]) -> Resume:
        return Resume(tuple(int(i) for i in data["cursor"]), tuple(str(k) for k in data.get("sized", ())))


@dataclass(frozen=True, slots=True)
class Task:
    """One independent subtree of the search: the node reached by ``path`` (child ordinals from the root).

    ``subtree`` False means only that node itself (a complete µGraph above the split depth); True means the node
    and everything below it. ``resume``: continue a stopped run of this task instead of starting it afresh.
    """

    index: int
    path: tuple[int, ...]
    subtree: bool = True
    resume: Resume | None = None

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"index": self.index, "path": list(self.path), "subtree": self.subtree}
        if self.resume is not None:  # absent otherwise: the stored task list (and its digest) never has it
            d["resume"] = self.resume.to_json()
        return d

    @staticmethod
    def from_json(data: dict[str, Any]) -> Task:
        resume = Resume.from_json(data["resume"]) if data.get("resume") is not None else None
        return Task(
            int(data["index"]), tuple(int(i) for i in data["path"]), bool(data.get("subtree", True)), resume
        )


@dataclass(frozen=True, slots=True)
class Candidate:
    """A verified µGraph with its predicted time on the spec's GPU and its equivalence-check summary."""

    ugraph: KernelGraph
    predicted_time_s: float
    equivalence: dict[str, Any]
    found_in_task: int

    def structure_key(self) -> str:
        """A stable hash of the µGraph's JSON (ties in the ranking are broken by it)."""
        return ugraph_key(self.ugraph)


@dataclass(frozen=True, slots=True)
class TaskResult:
    """What :func:`~gensorage.exhaustive.walk.tasks.run_task` returns; ``complete`` False if it was stopped, and
    then ``resume`` says where to continue (``candidates`` and ``stats`` cover the part walked).

    ``sized`` lists the structures the walk sized (a structure is a candidate once per task), ``keys`` each
    candidate's structure (None where the schedule sizes none): a runner that split the task's subtree into
    pieces run apart merges them in walk order, dropping what an earlier piece had sized."""

    task_index: int
    candidates: tuple[Candidate, ...]
    stats: Stats
    complete: bool
    resume: Resume | None = None
    sized: tuple[str, ...] = ()
    keys: tuple[str | None, ...] = ()


@dataclass(frozen=True, slots=True)
class SearchResult:
    """What a search found: :func:`~gensorage.exhaustive.walk.tasks.search_serial` in one process, or
    :func:`~gensorage.exhaustive.run.runner.run_search` (all of it, when resumed: done tasks of earlier runs
    count too).

    ``candidates`` are ranked best first (:func:`rank_candidates`, or the runner's core's own ranking);
    ``stats`` sums the statistics of the done tasks; ``tasks_done`` of ``tasks_total`` are done, and
    ``complete`` says all of them; ``elapsed_s`` is this run's wall time, ``enumerate_s`` the part of it spent
    splitting the search into tasks; ``checkpoint_path`` is where the runner keeps the done tasks (None: no
    checkpoint); ``tasks_resumed`` the tasks that were already done when this run started; ``stopped_by`` is
    ``"time budget"``, ``"interrupt"``, ``"error"`` or None; ``run_stats`` sums (as a dict) the statistics of
    every task this run ran, finished or stopped, so it says how much work a budget-limited run did;
    ``tasks_split`` how many times this run split a long task's remaining subtree among idle workers.
    """

    candidates: tuple[Any, ...]
    stats: Any
    tasks_done: int
    tasks_total: int
    complete: bool
    elapsed_s: float
    checkpoint_path: Path | None = None
    tasks_resumed: int = 0
    stopped_by: str | None = None
    run_stats: dict[str, Any] = field(default_factory=dict)
    enumerate_s: float = 0.0
    tasks_split: int = 0

    @property
    def best(self) -> Any | None:
        """The best candidate (None: none found)."""
        return self.candidates[0] if self.candidates else None


def rank_candidates(cands: Sequence[Candidate]) -> list[Candidate]:
    """Candidates best first: by predicted time, then by the µGraph's structural key; duplicates dropped.

    Two candidates with the same µGraph (found in different tasks) are one; the one from the lowest task stays.
    """
    keyed = sorted(((ugraph_key(c.ugraph), c) for c in cands), key=lambda kc: (kc[0], kc[1].found_in_task))
    unique: dict[str, Candidate] = {}
    for key, c in keyed:
        unique.setdefault(key, c)
    return [
        c
        for _, c in sorted(
            ((k, c) for k, c in unique.items()), key=lambda kc: (kc[1].predicted_time_s, kc[0])
        )
    ]


def ugraph_key(g: KernelGraph) -> str:
    """sha256 of the canonical JSON of ``g`` (stable across processes and runs)."""
    blob = json.dumps(g.to_json(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


__all__ = [
    "WORK_COUNTERS",
    "Candidate",
    "Resume",
    "SearchResult",
    "Stats",
    "Task",
    "TaskResult",
    "rank_candidates",
    "ugraph_key",
]

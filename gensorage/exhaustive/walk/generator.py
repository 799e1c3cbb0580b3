"""Mirage's expression-guided µGraph generator (Algorithm 1) as independent, replayable tasks.

The search is a depth-first walk of a tree whose nodes are µGraph prefixes: kernel-level nodes (a kernel graph;
children from :mod:`.kernel_level`) and block-level nodes (a kernel graph plus the block graph of a
graph-defined operator in progress; children from :mod:`.block_level`). Children are generated in a fixed order,
so a node is named by its *path*, the ordinals of the children taken from the root. That makes the search
splittable: :func:`enumerate_tasks` expands the tree to a small depth and names every node there (plus complete
µGraphs above it) as a :class:`~.results.Task`; :func:`run_task` replays a task's path and walks its subtree.
A task's result (its candidates and logical counters) depends only on the spec and the task, whichever process
runs it and whichever tasks ran there before (what they share, :mod:`.search_context`, is pure), so the runner
may run tasks in parallel, stop, and resume. Kernel-level subtrees identical to one already walked in the same
process are replayed instead of walked (:mod:`.subtree_memo`); that changes only the work counters
(``results.WORK_COUNTERS``).

Every complete kernel graph (its unconsumed tensors have the program's output shapes) goes through
:func:`.finalize.finalize`: thread-graph fusion, verification, sizes, float test, cost.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

from gensorage.exhaustive.expr.abstract_expr import Term
from gensorage.exhaustive.results import Candidate, Resume, SearchResult, Stats, Task, TaskResult, ugraph_key
from gensorage.exhaustive.rules.occurrences import Counts
from gensorage.exhaustive.spec import SearchSpec
from gensorage.exhaustive.walk.block_level import block_children, split_origins
from gensorage.exhaustive.walk.finalize import finalize
from gensorage.exhaustive.walk.kernel_level import complete_outputs, kernel_children
from gensorage.exhaustive.walk.opcatalog import OpVariant, out_shape
from gensorage.exhaustive.walk.search_context import SearchContext, process_context
from gensorage.exhaustive.walk.search_state import BlockBuild, SearchState
from gensorage.exhaustive.walk.subtree_memo import Entry, Memo, Recording, process_memo, subtree_key
from gensorage.opset import Shape
from gensorage.ugraph.ir import KernelGraph, KernelNode, Ref
from gensorage.verify.equivalent import VerificationStopped

# enumerate_tasks splits deeper until it has at least this many tasks ... A task replays its path by generating
# the siblings before it at every level, about 5 ms a task at depth 2 of the kv=2 GQA search: with 2 workers its
# 6-node search took 192 s as 1,174 depth-2 tasks and 130 s as 48 depth-1 tasks (back to back). Tasks save resume
# points while they run, so a big task loses no work. Since a block graph's grid rank is no longer a header choice
# (see block_level), depth 1 of that search has 20 nodes (the largest took 31 % of the 5-node search's time).
TARGET_TASKS = 16
MAX_SPLIT_DEPTH = 3  # ... or reaches this depth
POLL_EVERY = 128  # states between should_stop / progress checks
PROGRESS_EVERY_S = 0.5


@dataclass(slots=True)
class Counters:
    """The search's own counters (the oracle keeps its own)."""

    states: int = 0
    pruned_expr: int = 0
    pruned_shape: int = 0
    pruned_memory: int = 0
    verified: int = 0
    rejected: int = 0
    unstable: int = 0
    states_reused: int = 0


@dataclass(frozen=True, slots=True)
class _Mark:
    """A kernel-level node's candidates, counters and sized structures before its checks."""

    candidates: int
    counters: Counters
    sized: int


class _Stopped(Exception):
    """``should_stop`` asked the walk to end."""


class Search:
    """One walk of (part of) the search tree of ``spec``; see the module docstring."""

    def __init__(self, spec: SearchSpec, context: SearchContext | None = None) -> None:
        ctx = context if context is not None else SearchContext(spec)
        self.spec = spec
        self.context = ctx
        self.hw = ctx.hw
        self.targets = ctx.targets
        self.oracle = ctx.oracle
        self.target_nfs = ctx.target_nfs
        self.exp_consts = ctx.exp_consts
        self.needed = ctx.needed
        self.ties = ctx.ties
        self.state = SearchState(spec.program, self.hw, ties=self.ties is not None)
        self.variants = ctx.variants
        self.reductions = ctx.reductions
        self.unary, self.binary = ctx.unary, ctx.binary
        self.binary_ordered, self.binary_self = ctx.binary_ordered, ctx.binary_self
        self.out_shape = out_shape
        self.output_shapes = ctx.output_shapes
        self.output_splits = ctx.output_splits
        self.required_inputs = ctx.required_inputs
        self.occurrences = ctx.occurrences
        self.element_caps = ctx.element_caps
        self.counters = Counters()
        self.split_rule = ctx.split_rule
        self.budget: dict[int, int] = dict(ctx.budget)  # uses left of each budgeted variant (see search_context)
        self.construct_cache = ctx.construct_cache
        self._valid_memo = ctx.valid_memo
        # The oracle's counters at the start: a shared oracle reports this task's queries as the difference.
        o = self.oracle
        self._oracle_start = (o.queries, o.cache_hits, o.timeouts)
        self.sized_structures: dict[str, None] = {}  # insertion-ordered, so a stopped node's are undone
        self.candidates: list[Candidate] = []
        self.task_index = -1
        self.path: tuple[int, ...] = ()
        self.subtree = True
        self.resume: tuple[int, ...] | None = None  # continue a stopped walk at this node (see visit)
        self.at: list[int] = []  # the current node's path from the root
        self.stopped_at: tuple[int, ...] | None = None
        self.should_stop: Callable[[], bool] = lambda: False
        self.on_progress: Callable[[Stats], None] | None = None
        self._next_progress = 0.0
        self.on_save: Callable[[TaskResult], None] | None = None
        self.save_every_s = 60.0
        self._next_save = 0.0
        self._split_memo = ctx.split_memo
        self.plan_memo = ctx.plan_memo
        self.admit_memo = ctx.admit_memo
        self.expr_memo = ctx.expr_memo
        # Kernel-level subtrees already walked (this task's, or the process's: run_task(memo=...)); see subtree_memo.
        self.reuse_subtrees = True
        self.subtrees = Memo()
        self.recordings: list[Recording] = []
        self._walked = 0  # nodes this run has walked (see may_stop_checks)

    # ------------------------------------------------------------------ the tree

    def split_origins(self, b: BlockBuild) -> frozenset[tuple[int, int]]:
        """:func:`.block_level.split_origins`, memoised on the imaps."""
        key = tuple(b.imap)
        got = self._split_memo.get(key)
        if got is None:
            got = self._split_memo[key] = split_origins(b)
        return got

    def valid_variants(self, variants: list[OpVariant], shapes: tuple[Shape, ...]) -> list[OpVariant]:
        """The variants whose shape rules accept operands of ``shapes`` (memoized per task)."""
        key = (tuple(v.code for v in variants), shapes)
        got = self._valid_memo.get(key)
        if got is None:
            got = self._valid_memo[key] = [v for v in variants if out_shape(v, list(shapes)) is not None]
        return got

    def allowed(self, v: OpVariant) -> bool:
        """Whether the constant-attribute budget has a use of ``v`` left (always, for other operators)."""
        return self.budget.get(v.code, 1) > 0

    def spend(self, v: OpVariant, n: int) -> None:
        """Spend (``n`` = 1) or give back (-1) one use of ``v`` when it is budgeted."""
        if v.code in self.budget:
            self.budget[v.code] -= n

    def reads_checker(self) -> Callable[[Sequence[Term]], bool]:
        """The occurrence-budget check for the children of the current node (see :mod:`.occurrences`): whether an
        operator that reads the tensors of terms ``again`` a further time (already consumed, or read twice) stays
        within the budget; counted as pruned if not. The pending counts are the node's, computed on first need
        (children are generated with the node's state restored between them)."""
        occ = self.occurrences
        pending: list[Counts] = []

        def ok(again: Sequence[Term]) -> bool:
            if occ is None or not again:
                return True
            if not pending:
                pending.append(occ.pending(self.state, self.required_inputs))
            if occ.fits(pending[0], again):
                return True
            self.counters.pruned_expr += 1
            return False

        return ok

    def children(self) -> Generator[None, None, None]:
        """The current node's children; each is applied to the state while the generator is suspended on it."""
        return kernel_children(self) if self.state.block is None else block_children(self)

    def expr_equal(self, tensors: Sequence[int]) -> bool:
        """Whether the tensors' expressions equal the program outputs' under ``A_eq`` (equal normal forms)."""
        canon = self.oracle.canon
        return all(canon.nf(self.state.val[t].term) is nf for t, nf in zip(tensors, self.target_nfs, strict=True))

    def stats(self) -> Stats:
        c, o = self.counters, self.oracle
        q0, h0, t0 = self._oracle_start
        return Stats(states=c.states, pruned_expr=c.pruned_expr, pruned_shape=c.pruned_shape,
                     pruned_memory=c.pruned_memory, solver_queries=o.queries - q0, cache_hits=o.cache_hits - h0,
                     solver_timeouts=o.timeouts - t0, verified=c.verified, rejected=c.rejected, unstable=c.unstable,
                     states_reused=c.states_reused)

    # ------------------------------------------------------------------ walking

    def visit(self, depth: int = 0, spine: bool = True) -> None:
        """Walk the subtree of the current node; nodes on the replayed path above the task are not counted.

        With ``resume`` (a node inside the task, where an earlier walk stopped), the walk is depth first, so the
        nodes before it in pre-order are done: on the *spine* (the path to it) the nodes above it are only
        replayed and their children before the spine skipped; the walk goes on from the resume node itself.
        """
        path = self.path
        resume = self.resume if spine else None
        replayed = depth < len(path) or (resume is not None and depth < len(resume))
        recording = None
        if not replayed:
            if resume is not None:  # the resume node: the stopped walk counted it before stopping
                self.counters.states -= 1
            self._tick()
            if self.state.block is None:
                mark = self._mark()
                try:
                    self._emit()
                    if depth == len(path) and not self.subtree:
                        return
                    # Not on a resumed walk's spine (its children are partial); block-level nodes have no key.
                    if resume is None and self.reuse_subtrees:
                        key = subtree_key(self.state, self.spec.max_kernel_ops, tuple(self.budget.values()))
                        if key is not None:
                            entry = self.subtrees.get(key)
                            if entry is not None:
                                self._replay(entry)
                                return
                            if not self.subtrees.full():
                                recording = Recording(key, len(self.state.ops), self._logical())
                except VerificationStopped:
                    # Verifying a large candidate takes seconds: a stop lands between (or inside) the checks of
                    # the node's complete µGraphs or of a replayed subtree's leaves. The node is then undone to
                    # where a stop at its tick leaves it (counted, not emitted), so a resume does it whole.
                    self._undo(mark)
                    self.stopped_at = tuple(self.at)
                    raise _Stopped from None
            elif depth == len(path) and not self.subtree:
                return
        if recording is not None:
            self.recordings.append(recording)
            try:
                self._walk_children(depth, path, resume, spine)
            finally:
                self.recordings.pop()
            self._store(recording)
        else:
            self._walk_children(depth, path, resume, spine)

    def _walk_children(self, depth: int, path: tuple[int, ...], resume: tuple[int, ...] | None,
                       spine: bool) -> None:
        # A resumed walk replays the stopped walk's spine; the pruning it did there up to each spine child was
        # counted by the stopped walk, so it is not counted again.
        pruned = self._pruned() if resume is not None and depth < len(resume) else None
        children = self.children()
        try:
            for i, _ in enumerate(children):
                if depth < len(path):
                    if i == path[depth]:
                        if pruned is not None:
                            self._set_pruned(pruned)
                        self._descend(i, depth, spine)
                        return
                    continue
                if resume is not None and depth < len(resume):
                    if i < resume[depth]:
                        continue
                    if pruned is not None and i == resume[depth]:
                        self._set_pruned(pruned)
                    self._descend(i, depth, i == resume[depth])
                else:
                    self._descend(i, depth, False)
        finally:
            children.close()

    def _pruned(self) -> tuple[int, int, int]:
        c = self.counters
        return (c.pruned_expr, c.pruned_shape, c.pruned_memory)

    def _set_pruned(self, pruned: tuple[int, int, int]) -> None:
        c = self.counters
        c.pruned_expr, c.pruned_shape, c.pruned_memory = pruned

    def _logical(self) -> tuple[int, int, int, int]:
        c = self.counters
        return (c.states, c.pruned_expr, c.pruned_shape, c.pruned_memory)

    def _store(self, rec: Recording) -> None:
        now = self._logical()
        d = [a - b for a, b in zip(now, rec.start, strict=True)]
        self.subtrees.put(rec.key, Entry(d[0], d[1], d[2], d[3], tuple(rec.leaves)))

    def _replay(self, entry: Entry) -> None:
        """Add a recorded subtree's counters and finalize its leaves below the current node (see subtree_memo)."""
        c = self.counters
        c.states += entry.states
        c.states_reused += entry.states
        c.pruned_expr += entry.pruned_expr
        c.pruned_shape += entry.pruned_shape
        c.pruned_memory += entry.pruned_memory
        ops = tuple(self.state.ops)
        for below, outputs in entry.leaves:
            if self.may_stop_checks():
                raise VerificationStopped
            self._finalize(ops + below, outputs)

    def _mark(self) -> _Mark:
        """What a kernel-level node's checks may change, before them (see :meth:`_undo`)."""
        return _Mark(len(self.candidates), dataclasses.replace(self.counters), len(self.sized_structures))

    def _undo(self, mark: _Mark) -> None:
        """Back to ``mark``: the candidates, counters and sized structures the node's checks added are dropped."""
        del self.candidates[mark.candidates:]
        for f in dataclasses.fields(Counters):
            setattr(self.counters, f.name, getattr(mark.counters, f.name))
        for key in list(self.sized_structures)[mark.sized:]:
            del self.sized_structures[key]

    def _descend(self, i: int, depth: int, spine: bool) -> None:
        self.at.append(i)
        try:
            self.visit(depth + 1, spine)
        finally:
            self.at.pop()

    def _tick(self) -> None:
        c = self.counters
        c.states += 1
        self._walked += 1
        if c.states % POLL_EVERY:
            return
        if self._walked > 1 and self.should_stop():  # a run walks one node at least: reruns make progress
            self.stopped_at = tuple(self.at)
            raise _Stopped
        if self.on_progress is None and self.on_save is None:
            return
        now = time.monotonic()
        if self.on_progress is not None and now >= self._next_progress:
            self._next_progress = now + PROGRESS_EVERY_S
            self.on_progress(self.stats())
        if self.on_save is not None and now >= self._next_save:
            self._next_save = now + self.save_every_s
            # At a tick the walk is exactly where a stop would leave it: this node counted, not yet emitted.
            self.on_save(self.partial_result(tuple(self.at)))

    def partial_result(self, cursor: tuple[int, ...]) -> TaskResult:
        """The task so far, to continue at ``cursor``."""
        resume = Resume(cursor, tuple(sorted(self.sized_structures)))
        return TaskResult(self.task_index, tuple(self.candidates), self.stats(), False, resume)

    def _emit(self) -> None:
        """Finalize the node's complete µGraphs (a stop raises :class:`VerificationStopped`; see :meth:`visit`)."""
        for tensors in complete_outputs(self):
            if self.spec.expr_filter and not self.expr_equal(tensors):
                continue
            if self.may_stop_checks():
                raise VerificationStopped
            self._finalize(tuple(self.state.ops), tuple(self.state.ref[t] for t in tensors))

    def may_stop_checks(self) -> bool:
        """``should_stop`` for the checks of a node's complete µGraphs. Never at the first node a run walks (a
        resumed run's resume node): if one node's checks outlast a whole time budget, each run still finishes
        a node, so reruns make progress."""
        return self._walked > 1 and self.should_stop()

    def _finalize(self, ops: tuple[KernelNode, ...], outputs: tuple[Ref, ...]) -> None:
        """Record the complete kernel graph ``ops`` in the subtrees being recorded, then finalize it."""
        for rec in self.recordings:
            rec.leaves.append((ops[rec.base:], outputs))
        cand = finalize(self, KernelGraph(self.state.specs, ops, outputs), self.task_index)
        if cand is not None:
            self.candidates.append(cand)

    def collect(self, depth: int, split: int, prefix: list[int], out: list[tuple[tuple[int, ...], bool]],
                deeper: frozenset[tuple[int, ...]] = frozenset()) -> None:
        """Append the task paths of the subtree: nodes at depth ``split`` (those in ``deeper``: their children
        instead), complete µGraphs above them."""
        if depth == split + (tuple(prefix[:split]) in deeper):
            out.append((tuple(prefix), True))
            return
        if self.state.block is None and complete_outputs(self):
            out.append((tuple(prefix), False))
        children = self.children()
        try:
            for i, _ in enumerate(children):
                prefix.append(i)
                self.collect(depth + 1, split, prefix, out, deeper)
                prefix.pop()
        finally:
            children.close()


# ================================================================================================ the API


def enumerate_tasks(spec: SearchSpec) -> list[Task]:
    """The search split into independent tasks, deterministically (same spec, same list, in every process).

    The tree is expanded one level at a time until there are at least ``TARGET_TASKS`` nodes at the split depth
    or the depth reaches ``MAX_SPLIT_DEPTH``; each node there is a task covering its subtree, and each complete
    µGraph above it a task covering just itself. Together they cover the whole search exactly once. A node with
    more than ``1 / TARGET_TASKS`` of the next level's nodes is split one level further: subtrees are very
    uneven, and one task alone must not outlast the rest of the search.
    """
    paths: list[tuple[tuple[int, ...], bool]] = []
    context = SearchContext(spec)
    for split in range(1, MAX_SPLIT_DEPTH + 1):
        paths = []
        Search(spec, context).collect(0, split, [], paths)
        if sum(1 for _, sub in paths if sub) >= TARGET_TASKS:
            break
    else:
        return [Task(i, p, sub) for i, (p, sub) in enumerate(paths)]
    below: list[tuple[tuple[int, ...], bool]] = []
    Search(spec, context).collect(0, split + 1, [], below)
    children = Counter(p[:split] for p, sub in below if sub)
    big = frozenset(p for p, n in children.items() if n * TARGET_TASKS > len(below))
    if big:
        paths = []
        Search(spec, context).collect(0, split, [], paths, big)
    return [Task(i, p, sub) for i, (p, sub) in enumerate(paths)]


def run_task(spec: SearchSpec, task: Task, *, should_stop: Callable[[], bool] = lambda: False,
             on_progress: Callable[[Stats], None] | None = None,
             on_save: Callable[[TaskResult], None] | None = None, save_every_s: float = 60.0,
             reuse_subtrees: bool = True, memo: Memo | None = None,
             context: SearchContext | None = None) -> TaskResult:
    """Search the subtree of ``task`` and verify every complete µGraph in it.

    Parameters
    ----------
    spec : SearchSpec
        The search.
    task : Task
        One of ``enumerate_tasks(spec)``.
    should_stop : callable
        Polled every few states; when it returns True the walk ends and the result has ``complete=False``.
    on_progress : callable, optional
        Called with the task's statistics so far, at most every ``PROGRESS_EVERY_S`` seconds.
    on_save : callable, optional
        Called about every ``save_every_s`` seconds (first after that long) with the task so far as a stopped
        result (candidates, statistics, ``resume``), so a caller can keep it against the process being killed.
    reuse_subtrees : bool
        Replay kernel-level subtrees identical to one already walked in this task instead of walking them again
        (:mod:`.subtree_memo`); the result is the same either way.
    memo : Memo, optional
        Where recorded subtrees are kept; None: a fresh one for this task (see :func:`run_task_shared`).
    context : SearchContext, optional
        The spec's precomputed facts and memos, shared by tasks (:mod:`.search_context`); None: a fresh one.

    Returns
    -------
    TaskResult
        The candidates found (in discovery order), the statistics, and whether the subtree was finished. A
        function of ``(spec, task)`` only, when complete.
    """
    s = Search(spec, context)
    s.reuse_subtrees = reuse_subtrees
    if memo is not None:
        s.subtrees = memo
    s.task_index = task.index
    s.path = tuple(task.path)
    s.subtree = task.subtree
    s.should_stop = should_stop
    s.on_progress = on_progress
    s.on_save, s.save_every_s = on_save, save_every_s
    s._next_save = time.monotonic() + save_every_s
    if task.resume is not None:
        if tuple(task.resume.cursor[:len(task.path)]) != s.path:
            raise ValueError(f"task {task.index}: resume point {list(task.resume.cursor)} is not inside its "
                             f"subtree {list(task.path)}")
        s.resume = tuple(task.resume.cursor)
        s.sized_structures.update(dict.fromkeys(task.resume.sized))
    try:
        s.visit(0)
    except _Stopped:
        assert s.stopped_at is not None
        return s.partial_result(s.stopped_at)
    return TaskResult(task.index, tuple(s.candidates), s.stats(), True)


def run_task_shared(spec: SearchSpec, task: Task, **kwargs: Any) -> TaskResult:
    """:func:`run_task` with this process's subtree memo and context for ``spec``, shared by the tasks it runs:
    the same candidates and logical counters, less work (see :mod:`.subtree_memo` and :mod:`.search_context`)."""
    key = spec.key()
    return run_task(spec, task, memo=process_memo(key), context=process_context(spec, key), **kwargs)


def resume_task(task: Task, data: dict[str, Any]) -> Task:
    """``task`` continuing where a stopped run left it (``data``: that run's ``TaskResult.resume`` as JSON)."""
    return dataclasses.replace(task, resume=Resume.from_json(data))


def rank_candidates(cands: Sequence[Candidate]) -> list[Candidate]:
    """Candidates best first: by predicted time, then by the µGraph's structural key; duplicates dropped.

    Two candidates with the same µGraph (found in different tasks) are one; the one from the lowest task stays.
    """
    keyed = sorted(((ugraph_key(c.ugraph), c) for c in cands), key=lambda kc: (kc[0], kc[1].found_in_task))
    unique: dict[str, Candidate] = {}
    for key, c in keyed:
        unique.setdefault(key, c)
    return [c for _, c in sorted(((k, c) for k, c in unique.items()), key=lambda kc: (kc[1].predicted_time_s, kc[0]))]


def search_serial(spec: SearchSpec, time_budget_s: float | None = None) -> SearchResult:
    """Run every task of ``spec`` in this process (no checkpoint); for tests and small searches.

    With a time budget, the task running when it expires is stopped and the result has ``complete=False``.
    """
    start = time.monotonic()

    def out_of_time() -> bool:
        return time_budget_s is not None and time.monotonic() - start >= time_budget_s

    tasks = enumerate_tasks(spec)
    # Shared by this search's tasks only, so two calls report the same statistics.
    memo, context = Memo(), SearchContext(spec)
    cands: list[Candidate] = []
    stats = Stats()
    complete = True
    for task in tasks:
        if out_of_time():
            complete = False
            break
        res = run_task(spec, task, should_stop=out_of_time, memo=memo, context=context)
        cands.extend(res.candidates)
        stats = stats + res.stats
        if not res.complete:
            complete = False
            break
    return SearchResult(tuple(rank_candidates(cands)), stats, len(tasks), complete, time.monotonic() - start)


__all__ = [
    "Candidate", "SearchResult", "SearchSpec", "Stats", "Task", "TaskResult", "enumerate_tasks", "rank_candidates",
    "resume_task", "run_task", "run_task_shared", "search_serial",
]

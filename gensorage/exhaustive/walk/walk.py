"""Mirage's expression-guided µGraph generator (Algorithm 1): the depth-first walk of the search tree.

The search is a depth-first walk of a tree whose nodes are µGraph prefixes: kernel-level nodes (a kernel graph;
children from :mod:`.kernel_level`) and block-level nodes (a kernel graph plus the block graph of a
graph-defined operator in progress; children from :mod:`.block_level`). Children are generated in a fixed order,
so a node is named by its *path*, the ordinals of the children taken from the root; that is what makes the
search splittable into tasks (:mod:`.tasks`).

A :class:`Walk` holds the search's ``context`` (the spec's facts, rules and memos, built once and shared:
:mod:`.search_context`), the prefix it is at (``state``: :mod:`.search_state`, changed in place and undone on the
way back up), its logical counters and what it found. Kernel-level subtrees identical to one already walked in
the same process are replayed instead of walked (:mod:`.subtree_memo`); that changes only the work counters
(``results.WORK_COUNTERS``).

Every complete kernel graph (its unconsumed tensors have the program's output shapes) goes through
:func:`.finalize.finalize`: thread-graph fusion, verification, sizes, float test, cost.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass

from gensorage.exhaustive.expr.abstract_expr import Term
from gensorage.exhaustive.opcatalog import OpVariant
from gensorage.exhaustive.results import Candidate, Resume, Stats, Task, TaskResult
from gensorage.exhaustive.rules.occurrences import Counts
from gensorage.exhaustive.spec import SearchSpec
from gensorage.exhaustive.walk.block_level import block_children
from gensorage.exhaustive.walk.finalize import finalize, structure_key
from gensorage.exhaustive.walk.kernel_level import complete_outputs, kernel_children
from gensorage.exhaustive.walk.search_context import SearchContext
from gensorage.exhaustive.walk.search_state import SearchState
from gensorage.exhaustive.walk.subtree_memo import Entry, Memo, Recording, subtree_key
from gensorage.exhaustive.walk.thread_fusion import fuse
from gensorage.ugraph.ir import KernelGraph, KernelNode, Ref
from gensorage.verify.equivalent import VerificationStopped

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


@dataclass(slots=True)
class Hooks:
    """How the task a walk runs is stopped and observed (see :func:`.tasks.run_task`)."""

    should_stop: Callable[[], bool] = lambda: False
    on_progress: Callable[[Stats], None] | None = None
    on_save: Callable[[TaskResult], None] | None = None
    save_every_s: float = 60.0
    next_progress: float = 0.0
    next_save: float = 0.0


@dataclass(frozen=True, slots=True)
class _Mark:
    """A kernel-level node's candidates, counters and sized structures before its checks."""

    candidates: int
    counters: Counters
    sized: int


class Stopped(Exception):
    """``should_stop`` asked the walk to end; ``Walk.stopped_at`` says where."""


class Walk:
    """One walk of (part of) the search tree of ``spec``: the subtree of ``task`` (the whole tree by default).

    Parameters
    ----------
    spec : SearchSpec
        The search.
    context : SearchContext, optional
        The spec's facts, rules and memos (shared by the walks of one process); None: a fresh one.
    task : Task, optional
        The subtree to walk (its path, whether below it, and where a stopped walk of it continues).
    """

    def __init__(
        self, spec: SearchSpec, context: SearchContext | None = None, task: Task | None = None
    ) -> None:
        ctx = context if context is not None else SearchContext(spec)
        self.spec = spec
        self.context = ctx
        self.state = SearchState(spec.program, ctx.hw, ties=ctx.rules.ties is not None)
        self.counters = Counters()
        self.budget: dict[int, int] = dict(
            ctx.budget
        )  # uses left of each budgeted variant (see search_context)
        self.task = task if task is not None else Task(-1, ())
        # Continue a stopped walk at this node (see visit), with the structures it had sized.
        self.resume: tuple[int, ...] | None = None
        self.sized_structures: dict[str, None] = {}  # insertion-ordered, so a stopped node's are undone
        if self.task.resume is not None:
            self.resume = tuple(self.task.resume.cursor)
            self.sized_structures.update(dict.fromkeys(self.task.resume.sized))
        self.candidates: list[Candidate] = []
        # Each candidate's sizes-free structure (None: not sized by structure), so a runner that split this
        # task's subtree can drop what a later piece found again (see TaskResult.keys).
        self.candidate_keys: list[str | None] = []
        self.hooks = Hooks()
        # Kernel-level subtrees already walked (this task's, or the process's: run_task(memo=...)); see subtree_memo.
        # Not with own_predefined_only: which pre-defined operators follow a node then depends on how its tensors
        # were computed, which the memo's key does not say.
        self.reuse_subtrees = not spec.own_predefined_only
        self.subtrees = Memo()
        self.recordings: list[Recording] = []
        self.at: list[int] = []  # the current node's path from the root
        self.stopped_at: tuple[int, ...] | None = None
        self._walked = 0  # nodes this run has walked (see may_stop_checks)
        # The oracle's counters at the start: a shared oracle reports this task's queries as the difference.
        o = ctx.oracle
        self._oracle_start = (o.queries, o.cache_hits, o.timeouts)

    # ------------------------------------------------------------------ the tree

    def allowed(self, v: OpVariant) -> bool:
        """Whether the constant-attribute budget has a use of ``v`` left (always, for other operators)."""
        return self.budget.get(v.code, 1) > 0

    def shifted(self) -> bool:
        """Whether the µGraph so far applies an ``add_scalar`` (one of its budgeted uses is spent)."""
        budget, full = self.budget, self.context.budget
        return any(budget[c] < full[c] for c in self.context.shift_codes)

    def spend(self, v: OpVariant, n: int) -> None:
        """Spend (``n`` = 1) or give back (-1) one use of ``v`` when it is budgeted."""
        if v.code in self.budget:
            self.budget[v.code] -= n

    def reads_checker(self) -> Callable[[Sequence[Term]], bool]:
        """The occurrence-budget check for the children of the current node (see
        :mod:`gensorage.exhaustive.rules.occurrences`): whether an operator that reads the tensors of terms
        ``again`` a further time (already consumed, or read twice) stays within the budget; counted as pruned if
        not. The pending counts are the node's, computed on first need (children are generated with the node's
        state restored between them)."""
        occ = self.context.rules.occurrences
        pending: list[Counts] = []

        def ok(again: Sequence[Term]) -> bool:
            if occ is None or not again:
                return True
            if not pending:
                pending.append(occ.pending(self.state, self.context.required_inputs))
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
        canon = self.context.oracle.canon
        targets = self.context.target_nfs
        return all(canon.nf(self.state.val[t].term) is nf for t, nf in zip(tensors, targets, strict=True))

    def stats(self) -> Stats:
        c, o = self.counters, self.context.oracle
        q0, h0, t0 = self._oracle_start
        return Stats(
            states=c.states,
            pruned_expr=c.pruned_expr,
            pruned_shape=c.pruned_shape,
            pruned_memory=c.pruned_memory,
            solver_queries=o.queries - q0,
            cache_hits=o.cache_hits - h0,
            solver_timeouts=o.timeouts - t0,
            verified=c.verified,
            rejected=c.rejected,
            unstable=c.unstable,
            states_reused=c.states_reused,
        )

    # ------------------------------------------------------------------ walking

    def visit(self, depth: int = 0, spine: bool = True) -> None:
        """Walk the subtree of the current node; nodes on the replayed path above the task are not counted.

        With ``resume`` (a node inside the task, where an earlier walk stopped), the walk is depth first, so the
        nodes before it in pre-order are done: on the *spine* (the path to it) the nodes above it are only
        replayed and their children before the spine skipped; the walk goes on from the resume node itself.
        """
        path = self.task.path
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
                    if depth == len(path) and not self.task.subtree:
                        return
                    # Not on a resumed walk's spine (its children are partial); block-level nodes have no key.
                    if resume is None and self.reuse_subtrees:
                        key = subtree_key(
                            self.state,
                            self.spec.max_kernel_ops,
                            tuple(self.budget.values()),
                            self.spec.max_block_graphs is not None or self.spec.graph_defined_last,
                            self.spec.sub_stabilises_only or self.spec.exp_stabilised_only,
                        )
                        if key is not None:
                            entry = self.subtrees.get(key)
                            if entry is not None:
                                self._replay(entry)
                                return
                            if not self.subtrees.full():
                                recording = Recording(
                                    key, len(self.state.ops), self._logical(), tests=self._numeric_tests()
                                )
                except VerificationStopped:
                    # Verifying a large candidate takes seconds: a stop lands between (or inside) the checks of
                    # the node's complete µGraphs or of a replayed subtree's leaves. The node is then undone to
                    # where a stop at its tick leaves it (counted, not emitted), so a resume does it whole.
                    self._undo(mark)
                    self.stopped_at = tuple(self.at)
                    raise Stopped from None
            elif depth == len(path) and not self.task.subtree:
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

    def _walk_children(
        self, depth: int, path: tuple[int, ...], resume: tuple[int, ...] | None, spine: bool
    ) -> None:
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

    def _numeric_tests(self) -> int:
        """How many numeric tests the last kernel's reads rule has made in this process (see :meth:`_store`)."""
        test = self.context.last_reads
        return 0 if test is None else test.tested

    def _store(self, rec: Recording) -> None:
        # The key fixes abstract expressions, not the tensors' numeric functions, which the last-reads rule
        # tests: a subtree in which it tested anything is not kept (whether it tests depends on shapes only).
        if self._numeric_tests() != rec.tests:
            return
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
        del self.candidates[mark.candidates :]
        del self.candidate_keys[mark.candidates :]
        for f in dataclasses.fields(Counters):
            setattr(self.counters, f.name, getattr(mark.counters, f.name))
        for key in list(self.sized_structures)[mark.sized :]:
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
        hooks = self.hooks
        if self._walked > 1 and hooks.should_stop():  # a run walks one node at least: reruns make progress
            self.stopped_at = tuple(self.at)
            raise Stopped
        if hooks.on_progress is None and hooks.on_save is None:
            return
        now = time.monotonic()
        if hooks.on_progress is not None and now >= hooks.next_progress:
            hooks.next_progress = now + PROGRESS_EVERY_S
            hooks.on_progress(self.stats())
        if hooks.on_save is not None and now >= hooks.next_save:
            hooks.next_save = now + hooks.save_every_s
            # At a tick the walk is exactly where a stop would leave it: this node counted, not yet emitted.
            hooks.on_save(self.partial_result(tuple(self.at)))

    def partial_result(self, cursor: tuple[int, ...]) -> TaskResult:
        """The task so far, to continue at ``cursor``."""
        resume = Resume(cursor, tuple(sorted(self.sized_structures)))
        return dataclasses.replace(self.result(False), resume=resume)

    def result(self, complete: bool) -> TaskResult:
        """The task's result so far (``complete``: the whole subtree was walked)."""
        return TaskResult(
            self.task.index,
            tuple(self.candidates),
            self.stats(),
            complete,
            sized=tuple(self.sized_structures),
            keys=tuple(self.candidate_keys),
        )

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
        return self._walked > 1 and self.hooks.should_stop()

    def _finalize(self, ops: tuple[KernelNode, ...], outputs: tuple[Ref, ...]) -> None:
        """Record the complete kernel graph ``ops`` in the subtrees being recorded, then finalize it."""
        for rec in self.recordings:
            rec.leaves.append((ops[rec.base :], outputs))
        g = KernelGraph(self.state.specs, ops, outputs)
        cand = finalize(self, g, self.task.index)
        if cand is not None:
            self.candidates.append(cand)
            self.candidate_keys.append(structure_key(fuse(g)) if self.spec.schedule == "markov" else None)

    def collect(
        self,
        depth: int,
        split: int,
        prefix: list[int],
        out: list[tuple[tuple[int, ...], bool]],
        deeper: frozenset[tuple[int, ...]] = frozenset(),
    ) -> None:
        """Append the task paths of the subtree: nodes at depth ``split`` (those in ``deeper``, at any depth from
        ``split`` on: their children instead), complete µGraphs above them."""
        if depth >= split and tuple(prefix) not in deeper:
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


__all__ = ["POLL_EVERY", "PROGRESS_EVERY_S", "Counters", "Hooks", "Stopped", "Walk"]

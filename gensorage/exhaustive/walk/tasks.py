"""The search as independent, replayable tasks: :func:`enumerate_tasks` names them, :func:`run_task` walks one.

A node of the search tree is named by its path (see :mod:`.walk`), so :func:`enumerate_tasks` expands the tree
to a small depth and names every node there (plus complete µGraphs above it) as a
:class:`~gensorage.exhaustive.results.Task`; :func:`run_task` replays a task's path and walks its subtree. A
task's result (its candidates and logical counters) depends only on the spec and the task, whichever process
runs it and whichever tasks ran there before (what they share, :mod:`.search_context`, is pure), so a runner may
run tasks in parallel, stop, and resume them. :func:`search_serial` runs every task in this process, without a
checkpoint (the runner, :func:`gensorage.exhaustive.run.runner.run_search`, runs them on worker processes).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, NamedTuple

from gensorage.exhaustive.opcatalog import program_op_signatures
from gensorage.exhaustive.results import (
    Candidate,
    Resume,
    SearchResult,
    Stats,
    Task,
    TaskResult,
    rank_candidates,
)
from gensorage.exhaustive.spec import SearchSpec
from gensorage.exhaustive.walk.search_context import SearchContext, process_context
from gensorage.exhaustive.walk.subtree_memo import Memo, process_memo
from gensorage.exhaustive.walk.walk import Hooks, Stopped, Walk
from gensorage.ugraph.ir import GraphDefinedOp, Ref

# enumerate_tasks splits deeper until it has at least this many tasks, or reaches MAX_SPLIT_DEPTH. Few tasks,
# because a task replays its path by generating the siblings before it at every level (a few milliseconds a task
# at depth 2 of a GQA search, as much as a small task's walk): the runner's workers need enough tasks to balance,
# and tasks save resume points while they run, so a big task loses no work.
TARGET_TASKS = 16
MAX_SPLIT_DEPTH = 3
#: Above this many subtree tasks at the split depth, no node is split further (see :func:`enumerate_tasks`).
MAX_REFINED_TASKS = 64 * TARGET_TASKS


def enumerate_tasks(spec: SearchSpec) -> list[Task]:
    """The search split into independent tasks, deterministically (same spec, same list, in every process).

    The tree is expanded one level at a time until there are at least ``TARGET_TASKS`` nodes at the split depth
    or the depth reaches ``MAX_SPLIT_DEPTH`` (below the pre-defined operators every µGraph starts with, under
    ``own_predefined_only``); each node there is a task covering its subtree, and each complete
    µGraph above it a task covering just itself. Together they cover the whole search exactly once. A node with
    more than ``1 / TARGET_TASKS`` of the next level's nodes is split one level further: subtrees are very
    uneven, and one task alone must not outlast the rest of the search. That look at the next level is skipped
    where the split depth already has more than ``MAX_REFINED_TASKS`` subtrees: the tasks are fine enough, and
    the next level can be a hundred times larger (a 29-operator program: 18,222 nodes, then 3.3 million in 88 s,
    which no time budget interrupted).
    """
    paths: list[tuple[tuple[int, ...], bool]] = []
    context = SearchContext(spec)
    # With own_predefined_only the pre-defined operators a µGraph must start with form a chain of few nodes (the
    # program's own operators): the split depth is counted below them, or the whole search is one task.
    chain = spec.min_kernel_ops - 1 if spec.own_predefined_only and spec.graph_defined_last else 0
    for split in range(1, MAX_SPLIT_DEPTH + chain + 1):
        paths = []
        Walk(spec, context).collect(0, split, [], paths)
        if sum(1 for _, sub in paths if sub) >= TARGET_TASKS:
            break
    else:
        return _numbered(spec, context, paths)
    big: frozenset[tuple[int, ...]] = frozenset()
    if sum(1 for _, sub in paths if sub) <= MAX_REFINED_TASKS:
        below: list[tuple[tuple[int, ...], bool]] = []
        Walk(spec, context).collect(0, split + 1, [], below)
        children = Counter(p[:split] for p, sub in below if sub)
        big = frozenset(p for p, n in children.items() if n * TARGET_TASKS > len(below))
    if big:
        paths = []
        Walk(spec, context).collect(0, split, [], paths, big)
    if not (spec.parallel_first or spec.program_ops_first):
        return _numbered(spec, context, paths)
    deeper = big
    if spec.program_ops_first:
        # A task whose node holds pre-defined operators only has no kernel to class yet (K's transpose alone,
        # where a search splits at depth 1): its children, which open the first graph-defined kernel, become
        # tasks, so that the order below sees the fusing ones among them.
        subtrees = [p for p, sub in paths if sub]
        bare = frozenset(
            p for p, c in zip(subtrees, _classes(spec, context, subtrees), strict=True) if c.bare
        )
        paths, deeper = _split_further(spec, context, split, deeper, bare)
    fusing: frozenset[tuple[int, ...]] = frozenset()
    if spec.parallel_first:
        # The fusing tasks' children become tasks of their own, so that _numbered can order them by their grids.
        subtrees = [p for p, sub in paths if sub]
        classes = _classes(spec, context, subtrees)
        fusing = frozenset(p for p, c in zip(subtrees, classes, strict=True) if c.fusing == 0)
        paths, deeper = _split_further(spec, context, split, deeper, fusing)
        fusing &= deeper
    return _numbered(spec, context, paths, fusing)


def _split_further(
    spec: SearchSpec,
    context: SearchContext,
    split: int,
    deeper: frozenset[tuple[int, ...]],
    nodes: frozenset[tuple[int, ...]],
) -> tuple[list[tuple[tuple[int, ...], bool]], frozenset[tuple[int, ...]]]:
    """The task paths with ``nodes`` (subtree tasks) replaced by their children, and the nodes split so far. A
    node without children stays a task of its own (it still counts as a state)."""
    finer: list[tuple[tuple[int, ...], bool]] = []
    Walk(spec, context).collect(0, split, [], finer, deeper | nodes)
    parents = {p[:-1] for p, _ in finer}
    deeper |= frozenset(p for p in nodes if p in parents)
    finer = []
    Walk(spec, context).collect(0, split, [], finer, deeper)
    return finer, deeper


def _numbered(
    spec: SearchSpec,
    context: SearchContext,
    paths: list[tuple[tuple[int, ...], bool]],
    split: frozenset[tuple[int, ...]] = frozenset(),
) -> list[Task]:
    """The tasks in the order a runner starts them: walk order, or with ``spec.fused_first`` first those whose
    first graph-defined kernel reads every program input, directly or through the pre-defined operators before
    it (where one fused kernel for the whole program is found, FlashAttention's after ``K``'s transpose: a stop
    or a budget then keeps the most likely useful candidates), looped ones first, then the rest in walk order.
    With ``spec.program_ops_first``, within each of those classes the tasks whose pre-defined operators (before
    their first graph-defined kernel) are all the program's own run before the others. With
    ``spec.parallel_first``, the tasks split from one fusing task (``split``: those tasks' paths) stay together
    where it stood and are ordered by the thread blocks of that kernel's grid at their node, most first. The
    order is a pure function of the spec, so every process numbers the tasks alike."""
    if spec.fused_first:
        classes = _classes(spec, context, [p for p, _ in paths])
    else:
        classes = [_Class(0, 1, False, False)] * len(paths)
    own_first = spec.program_ops_first
    # Siblings split from one fusing task stay together, where the first of them stands in walk order.
    group: dict[tuple[int, ...], int] = {}
    for i, (p, _) in enumerate(paths):
        group.setdefault(p[:-1] if p[:-1] in split else p, i)

    def key(i: int) -> tuple[int, bool, int, int, int]:
        p, c = paths[i][0], classes[i]
        if p[:-1] in split:
            return c.fusing, own_first and c.foreign, group[p[:-1]], -c.blocks, i
        return c.fusing, own_first and c.foreign, group[p], 0, i

    order = sorted(range(len(paths)), key=key)
    return [Task(n, paths[i][0], paths[i][1]) for n, i in enumerate(order)]


class _Class(NamedTuple):
    """What orders a task (see :func:`_classes`)."""

    fusing: int
    blocks: int
    foreign: bool
    bare: bool


def _classes(spec: SearchSpec, context: SearchContext, paths: list[tuple[int, ...]]) -> list[_Class]:
    """For each task path: ``fusing`` 0 if the first graph-defined kernel on it (a finished operator or the block
    graph the path opens) reads every input the program reads and has a loop, 1 if it does without a loop, 2 if
    it reads fewer or the path holds none; ``blocks``, that kernel's thread blocks at the path's node (the
    product of the grid sizes chosen so far; 1 without one); ``foreign``, whether a pre-defined operator before
    that kernel is none the program applies (:func:`~gensorage.exhaustive.opcatalog.program_op_signatures`); ``bare``, whether the node holds pre-defined
    operators only (no graph-defined kernel, no block graph open). Which inputs a kernel tensor was computed
    from is the set of variables of its abstract expression."""
    w = Walk(spec, context)
    required = {spec.program.inputs[i].name for i in context.required_inputs}
    own = program_op_signatures(spec.program)
    n_in = len(spec.program.inputs)
    index = {p: i for i, p in enumerate(paths)}
    out = [_Class(2, 1, False, False)] * len(paths)

    def klass() -> _Class:
        st = w.state
        k = next((i for i, op in enumerate(st.ops) if isinstance(op, GraphDefinedOp)), len(st.ops))
        foreign = any(
            st.op_signature(Ref(n_in + j)) not in own for j in range(k)
        )  # the pre-defined operators before the first graph-defined kernel
        first = st.ops[k] if k < len(st.ops) else None
        if isinstance(first, GraphDefinedOp):
            inputs = [st.ref.index(r) for r in first.inputs]
            looped = first.block.forloop > 1
            grid: list[int | None] = list(first.block.grid)
        elif st.block is not None:
            inputs, looped, grid = list(st.block.inputs), st.block.looped, list(st.block.grid)
        else:
            return _Class(2, 1, foreign, True)
        n = math.prod(g for g in grid if g is not None)
        read = {t.name for i in inputs for t in st.val[i].term.subterms() if t.op == "var"}
        return _Class((0 if looped else 1) if required <= read else 2, n, foreign, False)

    inner = {p[:i] for p in paths for i in range(len(p))}  # the nodes some path goes below

    def down(prefix: tuple[int, ...]) -> None:
        if prefix in index:
            out[index[prefix]] = klass()
        if prefix not in inner:
            return
        children = w.children()
        try:
            for i, _ in enumerate(children):
                down((*prefix, i))
        finally:
            children.close()

    down(())
    return out


def run_task(
    spec: SearchSpec,
    task: Task,
    *,
    should_stop: Callable[[], bool] = lambda: False,
    on_progress: Callable[[Stats], None] | None = None,
    on_save: Callable[[TaskResult], None] | None = None,
    save_every_s: float = 60.0,
    reuse_subtrees: bool = True,
    memo: Memo | None = None,
    context: SearchContext | None = None,
) -> TaskResult:
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
    if task.resume is not None and tuple(task.resume.cursor[: len(task.path)]) != tuple(task.path):
        raise ValueError(
            f"task {task.index}: resume point {list(task.resume.cursor)} is not inside its "
            f"subtree {list(task.path)}"
        )
    w = Walk(spec, context, task)
    w.reuse_subtrees = reuse_subtrees and w.reuse_subtrees
    if memo is not None:
        w.subtrees = memo
    w.hooks = Hooks(
        should_stop, on_progress, on_save, save_every_s, next_save=time.monotonic() + save_every_s
    )
    try:
        w.visit(0)
    except Stopped:
        assert w.stopped_at is not None
        return w.partial_result(w.stopped_at)
    return w.result(True)


def run_task_shared(spec: SearchSpec, task: Task, **kwargs: Any) -> TaskResult:
    """:func:`run_task` with this process's subtree memo and context for ``spec``, shared by the tasks it runs:
    the same candidates and logical counters, less work (see :mod:`.subtree_memo` and :mod:`.search_context`)."""
    key = spec.key()
    return run_task(spec, task, memo=process_memo(key), context=process_context(spec, key), **kwargs)


def resume_task(task: Task, data: dict[str, Any]) -> Task:
    """``task`` continuing where a stopped run left it (``data``: that run's ``TaskResult.resume`` as JSON)."""
    return dataclasses.replace(task, resume=Resume.from_json(data))


def split_task(spec: SearchSpec, task: Task, data: dict[str, Any]) -> list[Task]:
    """What is left of ``task`` after a run of it stopped at ``data`` (its ``TaskResult.resume`` as JSON), as
    smaller tasks of the same index, in walk order: the stopped node itself, each of its children's subtrees,
    then the subtrees of the later siblings of every node on the path up to the task's own node.

    Together they cover exactly what a resumed run would walk, so a runner can hand them to idle workers and
    concatenate their results in this order (dropping a candidate whose structure an earlier piece sized, see
    :class:`~gensorage.exhaustive.results.TaskResult`). Each piece replays its path, so the logical counters of
    a split task can exceed those of one run by the pruning counted on the replayed paths. A task of one node
    (``subtree`` False) gives ``[]``: there is nothing to split.
    """
    resume = Resume.from_json(data)
    cursor = resume.cursor
    if not task.subtree or tuple(cursor[: len(task.path)]) != tuple(task.path):
        return []
    counts = _child_counts(spec, cursor)
    pieces = [Task(task.index, cursor, False, resume)]
    pieces += [Task(task.index, (*cursor, i)) for i in range(counts[len(cursor)])]
    for d in range(len(cursor) - 1, len(task.path) - 1, -1):
        pieces += [Task(task.index, (*cursor[:d], i)) for i in range(cursor[d] + 1, counts[d])]
    return pieces


def _child_counts(spec: SearchSpec, path: tuple[int, ...]) -> list[int]:
    """The number of children of every node on ``path`` (the root's first, ``path``'s own node last)."""
    w = Walk(spec, process_context(spec, spec.key()))
    counts = [0] * (len(path) + 1)

    def down(depth: int) -> None:
        children = w.children()
        try:
            for i, _ in enumerate(children):
                counts[depth] += 1
                if depth < len(path) and i == path[depth]:
                    down(depth + 1)
        finally:
            children.close()

    down(0)
    return counts


def search_serial(spec: SearchSpec, time_budget_s: float | None = None) -> SearchResult:
    """Run every task of ``spec`` in this process (no checkpoint); for tests and small searches.

    The result is the runner's (the same candidates and logical counters for the same spec: the tasks share one
    context and subtree memo, which changes only the work counters). With a time budget, the task running when
    it expires is stopped and the result has ``complete=False`` (``stopped_by="time budget"``); its candidates
    and statistics include what the stopped task found.
    """
    start = time.monotonic()

    def out_of_time() -> bool:
        return time_budget_s is not None and time.monotonic() - start >= time_budget_s

    tasks = enumerate_tasks(spec)
    enumerate_s = time.monotonic() - start
    # Shared by this search's tasks only, so two calls report the same statistics.
    memo, context = Memo(), SearchContext(spec)
    cands: list[Candidate] = []
    stats = Stats()
    done = 0
    for task in tasks:
        if out_of_time():
            break
        res = run_task(spec, task, should_stop=out_of_time, memo=memo, context=context)
        cands.extend(res.candidates)
        stats = stats + res.stats
        if not res.complete:
            break
        done += 1
    complete = done == len(tasks)
    return SearchResult(
        tuple(rank_candidates(cands)),
        stats,
        done,
        len(tasks),
        complete,
        time.monotonic() - start,
        stopped_by=None if complete else "time budget",
        run_stats=stats.to_json(),
        enumerate_s=enumerate_s,
    )


__all__ = [
    "MAX_SPLIT_DEPTH",
    "TARGET_TASKS",
    "enumerate_tasks",
    "resume_task",
    "run_task",
    "run_task_shared",
    "search_serial",
    "split_task",
]

"""Running an exhaustive µGraph search for hours: process pool, checkpoint, time budget, Ctrl-C, progress.

:func:`run_search` splits the search into the core's tasks (:func:`enumerate_tasks`), runs them on a pool of
worker processes in index order and commits each finished task to a SQLite :class:`~.checkpoint.Checkpoint`
as soon as it completes. Because a task's result (candidates, logical counters; not the work counters of
``results.WORK_COUNTERS``, which depend on the subtrees earlier tasks in the same process recorded) depends only
on ``(spec, task)``, and the final answer is
``rank_candidates`` over the candidates of all done tasks taken in (task, position) order *as read back from
the checkpoint*, the result is the same for 1 worker or N, and after any number of kills and resumes.

Stopping:

* a time budget stops dispatching new tasks and asks the running ones to stop (a shared event their
  ``should_stop`` polls); they return ``complete=False`` and are not marked done, so a later run redoes them;
* the first Ctrl-C (SIGINT) does the same and :func:`run_search` then raises :class:`SearchInterrupted`
  carrying the partial result; workers ignore SIGINT so only the parent decides. A second Ctrl-C aborts at
  once (running tasks are killed; everything already committed stays);
* ``kill -9`` of the parent loses only the running tasks; workers die with it (:mod:`.processes`).

A script that starts a search with several workers from its top level, without ``if __name__ == "__main__":``,
gets the search in its own process and a one-line note why (spawned workers would run the script again).
"""

from __future__ import annotations

import dataclasses
import functools
import multiprocessing
import operator
import os
import queue as queue_mod
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gensorage.errors import ConfigError
from gensorage.exhaustive.run.checkpoint import (
    CandidateRow,
    Checkpoint,
    PartialTask,
    StaleCheckpoint,
    default_checkpoint_path,
)
from gensorage.exhaustive.run.processes import die_with_parent, unguarded_main_script, watch_parent
from gensorage.exhaustive.run.progress import ProgressReporter, Snapshot, format_seconds
from gensorage.interrupts import StopRequests, stop_requests

# Parent loop tick: how often it wakes to drain progress, check the budget and redraw.
TICK_S = 0.2
# How often a worker's should_stop really looks at the shared stop event (the core may call should_stop
# every few states, and Event.is_set takes a lock).
STOP_POLL_S = 0.05
# How often a worker forwards its running task's statistics to the parent.
WORKER_PROGRESS_S = 0.5
# How often a running task of a core that can resume saves where it is (the most work a kill -9 loses).
SAVE_EVERY_S = 60.0
# With several workers, the parent first runs tasks itself for this long (from the call): a small search ends
# there without starting any process (starting and importing into two takes longer than many a whole search);
# a larger one stops its task in progress (it is saved and continued, like one stopped by a time budget) and
# hands the rest to the workers.
INLINE_S = 1.0
# After a stop request, how long running tasks get to return before they are killed.
STOP_GRACE_S = 30.0


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


def default_core() -> SearchCore:
    """The real exhaustive-search core of :mod:`gensorage.exhaustive`."""
    from gensorage.exhaustive import results
    from gensorage.exhaustive.walk import generator

    return SearchCore(enumerate_tasks=generator.enumerate_tasks, run_task=generator.run_task_shared,
                      rank_candidates=generator.rank_candidates, candidate_type=results.Candidate,
                      stats_type=results.Stats, resume_task=generator.resume_task)


@dataclass(frozen=True, slots=True)
class SearchResult:
    """What a search found (all of it, when resumed: done tasks of earlier runs count too).

    ``candidates`` are ranked best first by the core's ``rank_candidates``; ``stats`` sums the statistics of
    the done tasks; ``complete`` says every task is done; ``elapsed_s`` is this run's wall time;
    ``tasks_resumed`` the tasks that were already done when this run started; ``stopped_by`` is
    ``"time budget"``, ``"interrupt"``, ``"error"`` or None; ``run_stats`` sums (as a dict) the statistics of
    every task this run ran, finished or stopped, so it says how much work a budget-limited run did;
    ``enumerate_s`` is the part of ``elapsed_s`` spent splitting the search into tasks.
    """

    best: Any | None
    candidates: tuple[Any, ...]
    stats: Any
    tasks_done: int
    tasks_total: int
    complete: bool
    elapsed_s: float
    checkpoint_path: Path
    tasks_resumed: int = 0
    stopped_by: str | None = None
    run_stats: dict[str, Any] = field(default_factory=dict)
    enumerate_s: float = 0.0


class SearchInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped the search; ``result`` holds what was found and saved (resume by running it again)."""

    def __init__(self, result: SearchResult) -> None:
        super().__init__(
            f"search interrupted: {result.tasks_done}/{result.tasks_total} tasks done and saved in "
            f"{result.checkpoint_path}; run the same search again with this checkpoint to resume")
        self.result = result


def default_workers() -> int:
    """The cores this process may use (its CPU affinity where the OS tells it, else ``os.cpu_count()``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


# ================================================================================================ the API


def run_search(spec: Any, *, checkpoint: str | os.PathLike[str] | None = None, workers: int | None = None,
               time_budget_s: float | None = None, progress: bool = True, core: SearchCore | None = None,
               progress_stream: Any = None, save_every_s: float = SAVE_EVERY_S,
               inline_s: float = INLINE_S) -> SearchResult:
    """Run (or resume) the exhaustive search ``spec``, keeping every finished task in a checkpoint.

    Parameters
    ----------
    spec
        A ``SearchSpec`` (``key()``, ``to_json()``).
    checkpoint
        The SQLite checkpoint file; None means ``$GENSORAGE_HOME/checkpoints/<spec key>.sqlite``. An existing
        file for the same spec is resumed: only tasks not marked done run, and a task a time budget or Ctrl-C
        stopped continues where it stopped (with what it had found), when the core can resume tasks. A default
        file made by another gensorage version or task list (the search code changed) is renamed to
        ``<spec key>.stale-<n>.sqlite`` and the search starts afresh; a path the caller passes is refused instead.
    workers
        Worker processes (default: the usable cores). With 1 the tasks run in this process. With more, this
        process first runs tasks itself for ``inline_s`` seconds from the call: a search that ends within them
        starts no process, a longer one saves its task in progress and hands it and the rest to the workers.
    time_budget_s
        Stop after this many seconds of wall time (running tasks save where they stopped); None: no limit.
    progress
        Print a header and live progress to stderr (``progress_stream`` overrides the stream).
    core
        The search core (default :func:`default_core`); tests pass their own.
    save_every_s
        How often each running task saves its resume point and candidates (cores that can resume), so a
        ``kill -9`` loses at most about this much work per worker.

    Returns
    -------
    SearchResult
        ``complete`` is False when the time budget stopped the search before every task was done.

    Raises
    ------
    SearchInterrupted
        Ctrl-C; ``.result`` holds the partial result, everything finished is in the checkpoint.
    StoreError
        The checkpoint is corrupt, foreign, or belongs to a different search.
    ConfigError
        ``workers`` < 1 or a non-positive time budget.
    """
    start = time.monotonic()
    if workers is not None and workers < 1:
        raise ConfigError(f"workers must be at least 1 (got {workers})")
    if time_budget_s is not None and not time_budget_s > 0:
        raise ConfigError(f"time budget must be a positive number of seconds (got {time_budget_s})")
    if not save_every_s > 0:
        raise ConfigError(f"save interval must be a positive number of seconds (got {save_every_s})")
    if not inline_s >= 0:
        raise ConfigError(f"inline time must be a non-negative number of seconds (got {inline_s})")
    core = core if core is not None else default_core()
    n_workers = workers if workers is not None else default_workers()
    key = spec.key()
    path = Path(checkpoint).expanduser() if checkpoint is not None else default_checkpoint_path(key)
    reporter = ProgressReporter(enabled=progress, stream=progress_stream)

    reporter.message(f"gensorage search {key}: splitting the search into tasks")
    tasks = list(core.enumerate_tasks(spec))
    enumerate_s = time.monotonic() - start
    for i, t in enumerate(tasks):
        if getattr(t, "index", None) != i:
            raise RuntimeError(f"search core bug: task {i} of the enumeration has index {getattr(t, 'index', None)}")
    task_json = [_to_json(t) for t in tasks]
    try:
        ckpt = Checkpoint.open(path, spec_key=key, spec_json=spec.to_json(), tasks=task_json)
    except StaleCheckpoint:
        if checkpoint is not None:
            raise  # the user's own file: theirs to keep or delete
        # The default file of an older gensorage: keep it aside (nothing is deleted) and start afresh.
        aside = _set_aside(path)
        reporter.message(f"search: the default checkpoint {path.name} was made by another version of the search "
                         f"(another task list or gensorage version); kept it as {aside.name}, starting afresh")
        ckpt = Checkpoint.open(path, spec_key=key, spec_json=spec.to_json(), tasks=task_json)
    with ckpt:
        run = _Run(core, spec, tasks, ckpt, reporter, start, time_budget_s, save_every_s)
        pending = ckpt.pending_tasks()
        n_workers = min(n_workers, max(1, len(pending)))
        script = unguarded_main_script() if n_workers > 1 else None
        if script is not None:
            n_workers = 1
            print(f"gensorage: {script} starts the search outside `if __name__ == \"__main__\":`, which worker "
                  "processes would run again; searching in this process (add the guard to use several)",
                  file=progress_stream or sys.stderr, flush=True)
        reporter.message(_header(key, path, len(tasks), len(tasks) - len(pending), n_workers, time_budget_s,
                                 len(run.stopped)))
        with stop_requests() as interrupts:
            run.interrupts = interrupts
            try:
                if pending and n_workers == 1:
                    run.run_inline(pending)
                elif pending:
                    run.run_inline(pending, until=start + inline_s)
                    pending = ckpt.pending_tasks()
                    if pending and not run.stop_reason():
                        run.run_pool(pending, min(n_workers, len(pending)))
            except KeyboardInterrupt:
                # A second Ctrl-C: workers are gone, every committed task stays committed.
                run.stopped_by = "interrupt"
            finally:
                run.running = 0
        result = dataclasses.replace(run.result(), enumerate_s=enumerate_s)
        reporter.finish(run.snapshot())
        if result.stopped_by == "time budget":
            kept = f" ({len(run.stopped)} stopped mid-task, kept)" if run.stopped else ""
            reporter.message(f"search: time budget of {format_seconds(time_budget_s)} reached; "
                             f"{result.tasks_done}/{result.tasks_total} tasks done{kept}, saved in {path}")
    if result.stopped_by == "interrupt":
        raise SearchInterrupted(result)
    return result


def _set_aside(path: Path) -> Path:
    """Rename a checkpoint (with its SQLite side files) to a free ``<name>.stale-<n>.sqlite``; return the name."""
    n = 1
    while (aside := path.with_name(f"{path.stem}.stale-{n}{path.suffix}")).exists():
        n += 1
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            side.rename(aside.with_name(aside.name + suffix))
    path.rename(aside)
    return aside


def _header(key: str, path: Path, total: int, done: int, workers: int, budget: float | None,
            stopped: int = 0) -> str:
    parts = [f"gensorage search {key}: {total} tasks"]
    if done:
        parts.append(f"{done} already done (resuming)")
    if stopped:
        parts.append(f"{stopped} continuing where they stopped")
    parts.append(f"{workers} worker{'s' if workers != 1 else ''}")
    if budget is not None:
        parts.append(f"time budget {format_seconds(budget)}")
    return ", ".join(parts) + f"; checkpoint {path}"


# ============================================================================================ one run


@dataclass(slots=True)
class _Outcome:
    """A task's result as plain data, built where the task ran."""

    index: int
    complete: bool
    stats: dict[str, Any]
    rows: list[CandidateRow]
    elapsed_s: float
    resume: Any = None  # JSON: where a stopped task continues


@dataclass(slots=True)
class _Run:
    core: SearchCore
    spec: Any
    tasks: list[Any]
    ckpt: Checkpoint
    reporter: ProgressReporter
    start: float
    budget_s: float | None
    save_every_s: float
    interrupts: StopRequests | None = None
    stopped_by: str | None = None
    committed: dict[str, Any] = field(default_factory=dict)  # summed stats of done tasks
    run_stats: dict[str, Any] = field(default_factory=dict)  # summed stats of every task run here
    partial: dict[int, dict[str, Any]] = field(default_factory=dict)  # running tasks' stats so far
    discarded: dict[str, Any] = field(default_factory=dict)  # stats of tasks stopped before finishing
    stopped: dict[int, PartialTask] = field(default_factory=dict)  # pending tasks that saved where they stopped
    started_from: dict[int, PartialTask | None] = field(default_factory=dict)  # what each running task continues
    running: int = 0
    done: int = 0
    resumed: int = 0
    done_this_run: int = 0
    best_time: float | None = None

    def __post_init__(self) -> None:
        done = self.ckpt.done_tasks()
        for d in done.values():
            self.committed = _add(self.committed, d.stats)
        self.done = self.resumed = len(done)
        if self.core.resume_task is not None:
            self.stopped = self.ckpt.partial_tasks()
        times = [r.predicted_time_s for r in self.ckpt.candidates()]
        self.best_time = min(times) if times else None

    @property
    def resumable(self) -> bool:
        return self.core.resume_task is not None

    def task(self, idx: int) -> Any:
        """Task ``idx`` to run: continuing its stopped run if one was saved."""
        part = self.started_from[idx] = self.stopped.get(idx)
        if part is None or self.core.resume_task is None:
            return self.tasks[idx]
        return self.core.resume_task(self.tasks[idx], part.resume)

    # ------------------------------------------------------------------------------------ stopping
    def stop_reason(self) -> str | None:
        if self.stopped_by is None:
            if self.interrupts is not None and self.interrupts.count:
                self.stopped_by = "interrupt"
                kept = ("they save where they stopped" if self.core.resume_task is not None
                        else "finished ones are kept")
                self.reporter.message(f"search: stopping; running tasks are asked to stop, {kept} (Ctrl-C again "
                                      "aborts at once)")
            elif self.budget_s is not None and time.monotonic() - self.start >= self.budget_s:
                self.stopped_by = "time budget"
        return self.stopped_by

    # ------------------------------------------------------------------------------------- inline
    def run_inline(self, pending: Sequence[int], until: float | None = None) -> None:
        """Run the tasks one after another in this process (no process start-up cost); ``until``: stop there
        (monotonic time), the task in progress saved where it stopped."""
        def out_of_time() -> bool:
            return until is not None and time.monotonic() >= until

        should_stop = _Throttled(lambda: self.stop_reason() is not None or out_of_time())
        for idx in pending:
            if self.stop_reason() or out_of_time():
                return
            t0 = time.perf_counter()
            self.running = 1
            saving: dict[str, Any] = {}
            if self.resumable:
                t_start = time.perf_counter()
                saving = {"save_every_s": self.save_every_s, "on_save": lambda res, i=idx, t=t_start: self.save_point(
                    _encode(i, res, time.perf_counter() - t))}
            res = self.core.run_task(self.spec, self.task(idx), should_stop=should_stop,
                                     on_progress=functools.partial(self._inline_progress, idx), **saving)
            self.running = 0
            self.record(_encode(idx, res, time.perf_counter() - t0))
            self.reporter.update(self.snapshot())

    def _inline_progress(self, idx: int, stats: Any) -> None:
        self.partial[idx] = stats_to_dict(stats)
        self.reporter.update(self.snapshot())

    # --------------------------------------------------------------------------------------- pool
    def run_pool(self, pending: Sequence[int], n_workers: int) -> None:
        """Run the tasks on ``n_workers`` spawned processes, in index order.

        Up to two tasks per worker are submitted, so a worker that finishes one finds the next already queued
        instead of idling for a round trip to the parent (searches have thousands of millisecond tasks).
        """
        ctx = multiprocessing.get_context("spawn")
        stop_event = ctx.Event()
        progress_q: Any = ctx.Queue()
        todo = deque(pending)
        inflight: dict[Future[_Outcome], int] = {}
        stop_since: float | None = None
        error: Exception | None = None
        executor = ProcessPoolExecutor(max_workers=n_workers, mp_context=ctx, initializer=_init_worker,
                                       initargs=(stop_event, progress_q, os.getpid()))
        clean = False
        try:
            while True:
                if self.stop_reason() and stop_since is None:
                    stop_event.set()
                    stop_since = time.monotonic()
                while stop_since is None and todo and len(inflight) < 2 * n_workers:
                    idx = todo.popleft()
                    inflight[_submit(executor, _worker_run, self.core, self.spec, self.task(idx),
                                     self.save_every_s if self.resumable else None)] = idx
                if not inflight:
                    break
                finished, _ = wait(inflight, timeout=TICK_S, return_when=FIRST_COMPLETED)
                self._drain(progress_q, set(inflight.values()))
                for fut in sorted(finished, key=inflight.__getitem__):
                    del inflight[fut]
                    try:
                        self.record(fut.result())
                    except Exception as exc:
                        # Keep what the other running tasks finish (they are asked to stop), then raise.
                        error = error or exc
                        self.stopped_by = self.stopped_by or "error"
                if stop_since is not None and time.monotonic() - stop_since > STOP_GRACE_S:
                    break  # tasks that ignore should_stop are killed below
                self.running = min(len(inflight), n_workers)
                self.reporter.update(self.snapshot())
            clean = not inflight
            if error is not None:
                raise error
        finally:
            stop_event.set()
            if not clean:
                _terminate(executor)
            executor.shutdown(wait=True, cancel_futures=True)
            progress_q.close()
            progress_q.join_thread()

    def _drain(self, q: Any, running: set[int]) -> None:
        """Take the workers' progress messages and save points; late ones of tasks already returned are dropped."""
        while True:
            try:
                kind, idx, payload = q.get_nowait()
            except queue_mod.Empty:
                return
            except (OSError, ValueError, EOFError):
                return
            if idx not in running:
                continue
            if kind == "save":
                self.save_point(payload)
            else:
                self.partial[idx] = payload

    # ------------------------------------------------------------------------------------ results
    def record(self, out: _Outcome) -> None:
        """Commit a finished task (its candidates and done mark in one transaction); save where a stopped one
        continues (when the core can resume), else drop it."""
        self.partial.pop(out.index, None)
        self.run_stats = _add(self.run_stats, out.stats)
        if not out.complete and (out.resume is None or self.core.resume_task is None):
            self.discarded = _add(self.discarded, out.stats)
            return
        stats, rows, elapsed = self._totals(out)
        with self.interrupts.critical() if self.interrupts is not None else nullcontext():
            if out.complete:
                fresh = self.ckpt.commit_task(out.index, stats=stats, elapsed_s=elapsed, candidates=rows)
            else:
                fresh = self.ckpt.save_partial(out.index, resume=out.resume, stats=stats, elapsed_s=elapsed,
                                               candidates=rows)
        if not out.complete:
            self.discarded = _add(self.discarded, out.stats)
            if fresh:
                self.stopped[out.index] = PartialTask(out.index, out.resume, stats, elapsed, tuple(rows))
            return
        self.stopped.pop(out.index, None)
        if not fresh:
            return
        self.committed = _add(self.committed, stats)
        self.done += 1
        self.done_this_run += 1
        times = [r.predicted_time_s for r in out.rows]
        if times and (self.best_time is None or min(times) < self.best_time):
            self.best_time = min(times)

    def _totals(self, out: _Outcome) -> tuple[dict[str, Any], list[CandidateRow], float]:
        """The task's statistics, candidates and seconds so far: this run's part after the stopped run it
        continued, if any."""
        stats, rows, elapsed = out.stats, out.rows, out.elapsed_s
        before = self.started_from.get(out.index)
        if before is not None:
            stats, elapsed = _add(before.stats, stats), before.elapsed_s + elapsed
            rows = list(before.candidates) + [dataclasses.replace(r, position=len(before.candidates) + r.position)
                                              for r in rows]
        return stats, rows, elapsed

    def save_point(self, out: _Outcome) -> None:
        """Keep a running task's progress (its resume point and candidates so far) against a kill."""
        if out.resume is None:
            return
        stats, rows, elapsed = self._totals(out)
        with self.interrupts.critical() if self.interrupts is not None else nullcontext():
            if self.ckpt.save_partial(out.index, resume=out.resume, stats=stats, elapsed_s=elapsed, candidates=rows):
                self.stopped[out.index] = PartialTask(out.index, out.resume, stats, elapsed, tuple(rows))

    def snapshot(self) -> Snapshot:
        """For the progress line: all work so far, including running tasks and stopped ones (to be redone)."""
        live = functools.reduce(_add, self.partial.values(), _add(self.committed, self.discarded))
        return Snapshot(stats=live, tasks_done=self.done, tasks_total=len(self.tasks),
                        tasks_done_this_run=self.done_this_run, tasks_running=self.running,
                        best_time_s=self.best_time, elapsed_s=time.monotonic() - self.start)

    def result(self) -> SearchResult:
        """The result as read back from the checkpoint (so a fresh run and a resumed one are identical)."""
        core = self.core
        cands = [_decode_candidate(core, r) for r in self.ckpt.candidates()]
        ranked = tuple(core.rank_candidates(cands))
        done = self.ckpt.done_tasks()
        stats = functools.reduce(operator.add, (_decode_stats(core, done[i].stats) for i in sorted(done)),
                                 core.stats_type())
        return SearchResult(
            best=ranked[0] if ranked else None, candidates=ranked, stats=stats, tasks_done=len(done),
            tasks_total=len(self.tasks), complete=len(done) == len(self.tasks),
            elapsed_s=time.monotonic() - self.start, checkpoint_path=self.ckpt.path, tasks_resumed=self.resumed,
            stopped_by=self.stopped_by if len(done) < len(self.tasks) else None,
            run_stats=functools.reduce(_add, self.partial.values(), self.run_stats))


# ======================================================================================== the workers

_worker_stop: Any = None
_worker_progress: Any = None


def _init_worker(stop_event: Any, progress_q: Any, parent_pid: int) -> None:
    global _worker_stop, _worker_progress
    # Only the parent decides what Ctrl-C means; it reaches the whole process group, workers included.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _worker_stop, _worker_progress = stop_event, progress_q
    # Progress messages are disposable; never let a full pipe delay the worker's exit.
    progress_q.cancel_join_thread()
    die_with_parent(parent_pid)
    watch_parent(parent_pid)


def _worker_should_stop() -> bool:
    return bool(_worker_stop is not None and _worker_stop.is_set())


def _worker_run(core: SearchCore, spec: Any, task: Any, save_every_s: float | None) -> _Outcome:
    idx = int(task.index)
    last = [0.0]
    t0 = time.perf_counter()

    def send(message: tuple[str, int, Any]) -> None:
        if _worker_progress is not None:
            try:
                _worker_progress.put_nowait(message)
            except (OSError, ValueError, queue_mod.Full):
                pass  # best-effort: the task's result is what counts

    def on_progress(stats: Any) -> None:
        now = time.monotonic()
        if now - last[0] >= WORKER_PROGRESS_S:
            last[0] = now
            send(("progress", idx, stats_to_dict(stats)))

    saving: dict[str, Any] = {}
    if save_every_s is not None:
        saving = {"save_every_s": save_every_s,
                  "on_save": lambda res: send(("save", idx, _encode(idx, res, time.perf_counter() - t0)))}
    res = core.run_task(spec, task, should_stop=_Throttled(_worker_should_stop), on_progress=on_progress, **saving)
    return _encode(idx, res, time.perf_counter() - t0)


class _Throttled:
    """``should_stop`` for the core: consults ``check`` at most every :data:`STOP_POLL_S`; once True, stays."""

    __slots__ = ("_check", "_next", "_stopped")

    def __init__(self, check: Callable[[], bool]) -> None:
        self._check = check
        self._next = 0.0
        self._stopped = False

    def __call__(self) -> bool:
        if self._stopped:
            return True
        now = time.monotonic()
        if now >= self._next:
            self._next = now + STOP_POLL_S
            self._stopped = bool(self._check())
        return self._stopped


def _submit(executor: ProcessPoolExecutor, fn: Callable[..., _Outcome], *args: Any) -> Future[_Outcome]:
    """``executor.submit``, with SIGINT ignored meanwhile: submit may spawn a worker, and a child started
    while SIGINT is ignored ignores it from its first instruction (before its initializer could)."""
    if threading.current_thread() is not threading.main_thread():
        return executor.submit(fn, *args)
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return executor.submit(fn, *args)
    finally:
        signal.signal(signal.SIGINT, old)


def _terminate(executor: ProcessPoolExecutor) -> None:
    """Kill the pool's workers now (tasks that did not honour the stop request, or a forced abort)."""
    terminate = getattr(executor, "terminate_workers", None)  # Python >= 3.14
    if callable(terminate):
        terminate()
        return
    # Older Pythons have no public way; the pool's process table is the only handle on its workers.
    for proc in list((getattr(executor, "_processes", None) or {}).values()):
        if proc.is_alive():
            proc.terminate()


# ======================================================================================== conversions


def _to_json(obj: Any) -> Any:
    to_json = getattr(obj, "to_json", None)
    if callable(to_json):
        return to_json()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    raise TypeError(f"{type(obj).__name__} has no JSON form")


def stats_to_dict(stats: Any) -> dict[str, Any]:
    """A search core's ``Stats`` as a JSON object (its ``to_json()``, else its dataclass fields)."""
    value = _to_json(stats)
    if not isinstance(value, dict):
        raise TypeError(f"statistics {type(stats).__name__} do not convert to a JSON object")
    return value


def _decode_stats(core: SearchCore, d: dict[str, Any]) -> Any:
    from_json = getattr(core.stats_type, "from_json", None)
    return from_json(d) if callable(from_json) else core.stats_type(**d)


def _add(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Field-wise sum of two statistics dicts (numeric fields; others keep the first value seen)."""
    out = dict(a)
    for k, v in b.items():
        if k in out and isinstance(v, int | float) and isinstance(out[k], int | float):
            out[k] = out[k] + v
        elif k not in out:
            out[k] = v
    return out


def _encode(index: int, res: Any, elapsed_s: float) -> _Outcome:
    if res.task_index != index:
        raise RuntimeError(f"search core bug: task {index} returned the result of task {res.task_index}")
    rows = [CandidateRow(index, pos, c.ugraph.to_json(), float(c.predicted_time_s), dict(c.equivalence),
                         int(c.found_in_task)) for pos, c in enumerate(res.candidates)]
    resume = getattr(res, "resume", None)
    return _Outcome(index, bool(res.complete), stats_to_dict(res.stats), rows, float(elapsed_s),
                    None if res.complete or resume is None else _to_json(resume))


def _decode_candidate(core: SearchCore, row: CandidateRow) -> Any:
    from gensorage.ugraph import KernelGraph

    return core.candidate_type(ugraph=KernelGraph.from_json(row.ugraph), predicted_time_s=row.predicted_time_s,
                               equivalence=row.equivalence, found_in_task=row.found_in_task)


__all__ = ["SearchCore", "SearchInterrupted", "SearchResult", "default_core", "default_workers", "run_search",
           "stats_to_dict"]

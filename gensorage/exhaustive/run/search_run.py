"""One run of a search: the parent's loop over the pending tasks, inline or on a pool of worker processes,
committing each finished task to the checkpoint and reading the result back from it (see :mod:`.runner`)."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import operator
import time
from collections import deque
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from gensorage.exhaustive.results import SearchResult
from gensorage.exhaustive.run.checkpoint import CandidateRow, Checkpoint, PartialTask
from gensorage.exhaustive.run.conversions import (
    Outcome,
    add_stats,
    decode_candidate,
    decode_stats,
    encode,
    stats_to_dict,
)
from gensorage.exhaustive.run.core import SearchCore
from gensorage.exhaustive.run.engine import Engine, ProcessEngine
from gensorage.exhaustive.run.pieces import Part, join, merge
from gensorage.exhaustive.run.progress import ProgressReporter, Snapshot
from gensorage.exhaustive.run.workers import Throttled
from gensorage.interrupts import StopRequests

# Parent loop tick: how often it wakes to drain progress, check the budget and redraw.
TICK_S = 0.2
# After a stop request, how long running tasks get to return before they are killed.
STOP_GRACE_S = 30.0


@dataclass(slots=True)
class _Job:
    """A job on the engine: a part of task ``idx``, submitted at ``started`` (monotonic)."""

    idx: int
    part: Part
    started: float
    splitting: bool = False  # asked to stop so that what is left of it is split


@dataclass(slots=True)
class SearchRun:
    """The state of one run: the tasks, the checkpoint, what is running and what this run has done."""

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
    stopped: dict[int, PartialTask] = field(
        default_factory=dict
    )  # pending tasks that saved where they stopped
    started_from: dict[int, PartialTask | None] = field(
        default_factory=dict
    )  # what each running task continues
    parts: dict[int, list[Part]] = field(default_factory=dict)  # tasks running on an engine, in pieces
    # Candidates of stopped tasks that the checkpoint does not hold: of a core that cannot resume, and of the
    # pieces of a split task (the checkpoint keeps its split point). Verified like any; this run's result only.
    unsaved: list[CandidateRow] = field(default_factory=list)
    splits: int = 0  # long jobs split on demand this run
    running: int = 0
    done: int = 0
    resumed: int = 0
    done_this_run: int = 0
    best_time: float | None = None

    def __post_init__(self) -> None:
        done = self.ckpt.done_tasks()
        for d in done.values():
            self.committed = add_stats(self.committed, d.stats)
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
                kept = (
                    "they save where they stopped"
                    if self.core.resume_task is not None
                    else "finished ones are kept"
                )
                self.reporter.message(
                    f"search: stopping; running tasks are asked to stop, {kept} (Ctrl-C again aborts at once)"
                )
            elif self.budget_s is not None and time.monotonic() - self.start >= self.budget_s:
                self.stopped_by = "time budget"
        return self.stopped_by

    # ------------------------------------------------------------------------------------- inline
    def run_inline(self, pending: Sequence[int], until: float | None = None) -> None:
        """Run the tasks one after another in this process (no process start-up cost); ``until``: stop there
        (monotonic time), the task in progress saved where it stopped."""

        def out_of_time() -> bool:
            return until is not None and time.monotonic() >= until

        should_stop = Throttled(lambda: self.stop_reason() is not None or out_of_time())
        for idx in pending:
            if self.stop_reason() or out_of_time():
                return
            t0 = time.perf_counter()
            self.running = 1
            saving: dict[str, Any] = {}
            if self.resumable:
                t_start = time.perf_counter()
                saving = {
                    "save_every_s": self.save_every_s,
                    "on_save": lambda res, i=idx, t=t_start: self.save_point(
                        encode(i, res, time.perf_counter() - t)
                    ),
                }
            res = self.core.run_task(
                self.spec,
                self.task(idx),
                should_stop=should_stop,
                on_progress=functools.partial(self._inline_progress, idx),
                **saving,
            )
            self.running = 0
            self.record(encode(idx, res, time.perf_counter() - t0))
            self.reporter.update(self.snapshot())

    def _inline_progress(self, idx: int, stats: Any) -> None:
        self.partial[idx] = stats_to_dict(stats)
        self.reporter.update(self.snapshot())

    # ------------------------------------------------------------------------------------- engine
    def run_pool(self, pending: Sequence[int], n_workers: int) -> None:
        """Run the tasks on ``n_workers`` spawned processes of this machine (:class:`~.engine.ProcessEngine`)."""
        save_every = self.save_every_s if self.resumable else None
        self.run_engine(pending, ProcessEngine(self.core, self.spec, n_workers, save_every))

    def run_engine(self, pending: Sequence[int], engine: Engine, split_after_s: float | None = None) -> None:
        """Run the tasks as jobs on ``engine``, in index order, recording each task as it ends; closes the engine.

        Up to two jobs per worker are submitted, so a worker that finishes one finds the next already queued
        instead of idling for a round trip (searches have thousands of millisecond tasks). Once nothing is left
        to hand out and workers idle, a job running longer than ``split_after_s`` (engines that can stop one
        job, cores that can split a task) is stopped and what is left of it handed out as smaller tasks
        (:mod:`.pieces`); the task is recorded when all its pieces are done.
        """
        todo = deque(pending)
        ready: deque[tuple[int, Part]] = deque()  # pieces of started tasks, run before new tasks
        jobs: dict[int, _Job] = {}
        keys = itertools.count(len(self.tasks))  # apart from task indices (the progress of inline runs)
        stop_since: float | None = None
        error: BaseException | None = None
        clean = False
        try:
            while True:
                if self.stop_reason() and stop_since is None:
                    engine.stop(None)
                    stop_since = time.monotonic()
                while stop_since is None and (ready or todo) and len(jobs) < 2 * engine.workers:
                    if ready:
                        idx, part = ready.popleft()
                    else:
                        idx = todo.popleft()
                        part = Part(self.task(idx))
                        self.parts[idx] = [part]
                    key = next(keys)
                    jobs[key] = _Job(idx, part, time.monotonic())
                    engine.submit(key, part.task)
                if not jobs:
                    break
                for kind, key, payload in engine.events(TICK_S):
                    job = jobs.get(key)
                    if job is None:
                        continue  # a late message of a job that ended
                    if kind == "progress":
                        self.partial[key] = payload
                    elif kind == "resumed":
                        self.reporter.message(
                            f"search: task {job.idx} continues on another worker from its last save point"
                        )
                    elif kind == "save":
                        if len(self.parts[job.idx]) == 1:  # a split task continues from its split point
                            self.save_point(join(job.part.before, payload))
                    else:
                        del jobs[key]
                        self.partial.pop(key, None)
                        if kind == "error":
                            # Keep what the other running tasks finish (they are asked to stop), then raise.
                            error = error or payload
                            self.stopped_by = self.stopped_by or "error"
                        else:
                            self._ended(job, payload, ready, may_continue=stop_since is None)
                if stop_since is not None and time.monotonic() - stop_since > STOP_GRACE_S:
                    break  # tasks that ignore should_stop are killed below
                if split_after_s is not None and stop_since is None and not (todo or ready):
                    self._split_long_jobs(jobs, engine, split_after_s)
                self.running = min(len(jobs), engine.workers)
                self.reporter.update(self.snapshot())
            clean = not jobs
            if error is not None:
                raise error
        finally:
            engine.close(abort=not clean)

    def _split_long_jobs(self, jobs: dict[int, _Job], engine: Engine, after_s: float) -> None:
        """Ask the longest-running jobs to stop, one per idle worker, so what is left of them can be split."""
        idle = engine.workers - len(jobs)
        if idle <= 0 or self.core.split_task is None or not engine.can_stop_one:
            return
        now = time.monotonic()
        long = [
            (job.started, key)
            for key, job in jobs.items()
            if not job.splitting and job.part.splittable and now - job.started >= after_s
        ]
        for _, key in sorted(long)[:idle]:
            jobs[key].splitting = True
            engine.stop(key)

    def _ended(self, job: _Job, out: Outcome, ready: deque[tuple[int, Part]], may_continue: bool) -> None:
        """A job returned: its part is done (the task is recorded once all are), split, continued, or kept
        where a stop request stopped it."""
        part, parts = job.part, self.parts[job.idx]
        whole = join(part.before, out)
        if out.complete:
            part.done = whole
            if all(p.done is not None for p in parts):
                del self.parts[job.idx]
                done = [p.done for p in parts if p.done is not None]
                self.record(done[0] if len(done) == 1 else merge(job.idx, done))
            return
        if may_continue and out.resume is not None and self.core.resume_task is not None:
            pieces = self._pieces(part, out.resume) if job.splitting else []
            if len(pieces) > 1:
                if len(parts) == 1:
                    self.save_point(whole)  # a driver killed from here on resumes from the split point
                at = parts.index(part)
                parts[at : at + 1] = [Part(part.task, done=whole), *(Part(p) for p in pieces)]
                ready.extendleft(reversed([(job.idx, p) for p in parts[at + 1 : at + 1 + len(pieces)]]))
                self.splits += 1
                return
            # Nothing to split (or stopped for no stop request of ours): continue it where it stopped.
            part.before, part.splittable = whole, False
            part.task = self.core.resume_task(part.task, out.resume)
            ready.appendleft((job.idx, part))
            return
        if len(parts) == 1:
            self.record(whole)
        else:  # a split task stopped: the checkpoint keeps its split point
            self.unsaved.extend(whole.rows)
            self.run_stats = add_stats(self.run_stats, out.stats)
            self.discarded = add_stats(self.discarded, whole.stats)

    def _pieces(self, part: Part, resume: Any) -> list[Any]:
        split = self.core.split_task
        return list(split(self.spec, part.task, resume)) if split is not None else []

    # ------------------------------------------------------------------------------------ results
    def record(self, out: Outcome) -> None:
        """Commit a finished task (its candidates and done mark in one transaction); save where a stopped one
        continues (when the core can resume), else drop it."""
        self.partial.pop(out.index, None)
        self.run_stats = add_stats(self.run_stats, out.stats)
        if not out.complete and (out.resume is None or self.core.resume_task is None):
            self.unsaved.extend(out.rows)
            self.discarded = add_stats(self.discarded, out.stats)
            return
        stats, rows, elapsed = self._totals(out)
        with self.interrupts.critical() if self.interrupts is not None else nullcontext():
            if out.complete:
                fresh = self.ckpt.commit_task(out.index, stats=stats, elapsed_s=elapsed, candidates=rows)
            else:
                fresh = self.ckpt.save_partial(
                    out.index, resume=out.resume, stats=stats, elapsed_s=elapsed, candidates=rows
                )
        if not out.complete:
            self.discarded = add_stats(self.discarded, out.stats)
            if fresh:
                self.stopped[out.index] = PartialTask(out.index, out.resume, stats, elapsed, tuple(rows))
            return
        self.stopped.pop(out.index, None)
        if not fresh:
            return
        self.committed = add_stats(self.committed, stats)
        self.done += 1
        self.done_this_run += 1
        times = [r.predicted_time_s for r in out.rows]
        if times and (self.best_time is None or min(times) < self.best_time):
            self.best_time = min(times)

    def _totals(self, out: Outcome) -> tuple[dict[str, Any], list[CandidateRow], float]:
        """The task's statistics, candidates and seconds so far: this run's part after the stopped run it
        continued, if any."""
        stats, rows, elapsed = out.stats, out.rows, out.elapsed_s
        before = self.started_from.get(out.index)
        if before is not None:
            stats, elapsed = add_stats(before.stats, stats), before.elapsed_s + elapsed
            rows = list(before.candidates) + [
                dataclasses.replace(r, position=len(before.candidates) + r.position) for r in rows
            ]
        return stats, rows, elapsed

    def save_point(self, out: Outcome) -> None:
        """Keep a running task's progress (its resume point and candidates so far) against a kill."""
        if out.resume is None:
            return
        stats, rows, elapsed = self._totals(out)
        with self.interrupts.critical() if self.interrupts is not None else nullcontext():
            if self.ckpt.save_partial(
                out.index, resume=out.resume, stats=stats, elapsed_s=elapsed, candidates=rows
            ):
                self.stopped[out.index] = PartialTask(out.index, out.resume, stats, elapsed, tuple(rows))

    def snapshot(self) -> Snapshot:
        """For the progress line: all work so far, including running tasks and stopped ones (to be redone)."""
        live = functools.reduce(add_stats, self.partial.values(), add_stats(self.committed, self.discarded))
        return Snapshot(
            stats=live,
            tasks_done=self.done,
            tasks_total=len(self.tasks),
            tasks_done_this_run=self.done_this_run,
            tasks_running=self.running,
            best_time_s=self.best_time,
            elapsed_s=time.monotonic() - self.start,
        )

    def result(self) -> SearchResult:
        """The result as read back from the checkpoint (so a fresh run and a resumed one are identical).

        A search stopped before every task was done also returns what its stopped tasks had found (each
        candidate is verified when found): a budget shorter than one long task then still returns that task's
        candidates, and a resumed run that completes returns exactly the complete search's."""
        core = self.core
        done = self.ckpt.done_tasks()
        rows = self.ckpt.candidates()
        if len(done) < len(self.tasks):
            pieces = [
                r for parts in self.parts.values() for p in parts if p.done is not None for r in p.done.rows
            ]
            rows += self.ckpt.candidates("pending") + self.unsaved + pieces
        ranked = tuple(core.rank_candidates([decode_candidate(core, r) for r in rows]))
        stats = functools.reduce(
            operator.add, (decode_stats(core, done[i].stats) for i in sorted(done)), core.stats_type()
        )
        return SearchResult(
            candidates=ranked,
            stats=stats,
            tasks_done=len(done),
            tasks_total=len(self.tasks),
            complete=len(done) == len(self.tasks),
            elapsed_s=time.monotonic() - self.start,
            checkpoint_path=self.ckpt.path,
            tasks_resumed=self.resumed,
            stopped_by=self.stopped_by if len(done) < len(self.tasks) else None,
            run_stats=functools.reduce(add_stats, self.partial.values(), self.run_stats),
            tasks_split=self.splits,
        )


__all__ = ["STOP_GRACE_S", "TICK_S", "SearchRun"]

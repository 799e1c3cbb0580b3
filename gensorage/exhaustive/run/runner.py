"""Running an exhaustive µGraph search for hours: process pool, checkpoint, time budget, Ctrl-C, progress.

:func:`run_search` splits the search into the core's tasks (:func:`enumerate_tasks`), runs them on a pool of
worker processes in index order and commits each finished task to a SQLite :class:`~.checkpoint.Checkpoint`
as soon as it completes. Because a task's result (candidates, logical counters; not the work counters of
``results.WORK_COUNTERS``, which depend on the subtrees earlier tasks in the same process recorded) depends only
on ``(spec, task)``, and the final answer is
``rank_candidates`` over the candidates of all done tasks taken in (task, position) order *as read back from
the checkpoint*, the result is the same for 1 worker or N, and after any number of kills and resumes. A
search stopped before every task was done also returns what its stopped tasks found so far.

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
import os
import sys
import time
from pathlib import Path
from typing import Any

from gensorage.errors import ConfigError
from gensorage.exhaustive.results import SearchResult
from gensorage.exhaustive.run.checkpoint import Checkpoint, StaleCheckpoint, default_checkpoint_path
from gensorage.exhaustive.run.conversions import to_json
from gensorage.exhaustive.run.core import SearchCore, default_core
from gensorage.exhaustive.run.processes import unguarded_main_script
from gensorage.exhaustive.run.progress import ProgressReporter, format_seconds
from gensorage.exhaustive.run.search_run import SearchRun
from gensorage.interrupts import stop_requests

# How often a running task of a core that can resume saves where it is (the most work a kill -9 loses).
SAVE_EVERY_S = 60.0
# With several workers, the parent first runs tasks itself for this long (from the call): a small search ends
# there without starting any process (starting and importing into two takes longer than many a whole search);
# a larger one stops its task in progress (it is saved and continued, like one stopped by a time budget) and
# hands the rest to the workers.
INLINE_S = 1.0
# On a cluster, once workers would idle, a job running longer than this is split (see SearchRun.run_engine).
SPLIT_AFTER_S = 10.0


class SearchInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped the search; ``result`` holds what was found and saved (resume by running it again)."""

    def __init__(self, result: SearchResult) -> None:
        super().__init__(
            f"search interrupted: {result.tasks_done}/{result.tasks_total} tasks done and saved in "
            f"{result.checkpoint_path}; run the same search again with this checkpoint to resume"
        )
        self.result = result


def default_workers() -> int:
    """The cores this process may use (its CPU affinity where the OS tells it, else ``os.cpu_count()``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


# ================================================================================================ the API


def run_search(
    spec: Any,
    *,
    checkpoint: str | os.PathLike[str] | None = None,
    workers: int | None = None,
    time_budget_s: float | None = None,
    progress: bool = True,
    core: SearchCore | None = None,
    progress_stream: Any = None,
    save_every_s: float = SAVE_EVERY_S,
    inline_s: float = INLINE_S,
    cluster: str | None = None,
    split_after_s: float | None = SPLIT_AFTER_S,
) -> SearchResult:
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
    cluster
        Run the tasks on a Dask cluster instead of local processes (:mod:`.cluster`; needs the extra
        ``gensorage[distributed]``): a scheduler address (``tcp://HOST:8786``), or ``"local:N"`` for a cluster
        of N worker processes on this machine, started here and closed at the end. This process stays the
        only writer of the checkpoint. Excludes ``workers``.
    split_after_s
        On a cluster, when nothing is left to hand out and workers idle, a task running longer than this is
        split and its remaining subtree handed to them (None: never).

    Returns
    -------
    SearchResult
        ``complete`` is False when the time budget stopped the search before every task was done; its
        candidates are then those of the done tasks and what the stopped ones had found (all verified).

    Raises
    ------
    SearchInterrupted
        Ctrl-C; ``.result`` holds the partial result, everything finished is in the checkpoint.
    StoreError
        The checkpoint is corrupt, foreign, or belongs to a different search.
    ConfigError
        ``workers`` < 1, a non-positive time budget, or a bad, unreachable or mismatched cluster (or its
        extra missing).
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
    if cluster is not None:
        if workers is not None:
            raise ConfigError("give workers (local processes) or cluster, not both")
        from gensorage.exhaustive.run.cluster import require_engine

        require_engine(cluster)
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
            raise RuntimeError(
                f"search core bug: task {i} of the enumeration has index {getattr(t, 'index', None)}"
            )
    task_json = [to_json(t) for t in tasks]
    try:
        ckpt = Checkpoint.open(path, spec_key=key, spec_json=spec.to_json(), tasks=task_json)
    except StaleCheckpoint:
        if checkpoint is not None:
            raise  # the user's own file: theirs to keep or delete
        # The default file of an older gensorage: keep it aside (nothing is deleted) and start afresh.
        aside = _set_aside(path)
        reporter.message(
            f"search: the default checkpoint {path.name} was made by another version of the search "
            f"(another task list or gensorage version); kept it as {aside.name}, starting afresh"
        )
        ckpt = Checkpoint.open(path, spec_key=key, spec_json=spec.to_json(), tasks=task_json)
    with ckpt:
        run = SearchRun(core, spec, tasks, ckpt, reporter, start, time_budget_s, save_every_s)
        pending = ckpt.pending_tasks()
        n_workers = min(n_workers, max(1, len(pending)))
        local = cluster is None or cluster.startswith("local:")
        script = unguarded_main_script() if local and (n_workers > 1 or cluster) else None
        if script is not None:
            n_workers, cluster = 1, None
            print(
                f'gensorage: {script} starts the search outside `if __name__ == "__main__":`, which worker '
                "processes would run again; searching in this process (add the guard to use several)",
                file=progress_stream or sys.stderr,
                flush=True,
            )
        reporter.message(
            _header(
                key,
                path,
                len(tasks),
                len(tasks) - len(pending),
                n_workers,
                time_budget_s,
                len(run.stopped),
                cluster,
            )
        )
        with stop_requests() as interrupts:
            run.interrupts = interrupts
            try:
                if pending and n_workers == 1 and cluster is None:
                    run.run_inline(pending)
                elif pending:
                    run.run_inline(pending, until=start + inline_s)
                    pending = ckpt.pending_tasks()
                    if pending and not run.stop_reason() and cluster is not None:
                        from gensorage.exhaustive.run.cluster import connect

                        engine = connect(cluster, core, spec, save_every_s if run.resumable else None)
                        reporter.message(f"search: {engine.workers} workers on cluster {cluster}")
                        run.run_engine(pending, engine, split_after_s)
                    elif pending and not run.stop_reason():
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
            reporter.message(
                f"search: time budget of {format_seconds(time_budget_s)} reached; "
                f"{result.tasks_done}/{result.tasks_total} tasks done{kept}, saved in {path}"
            )
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


def _header(
    key: str,
    path: Path,
    total: int,
    done: int,
    workers: int,
    budget: float | None,
    stopped: int = 0,
    cluster: str | None = None,
) -> str:
    parts = [f"gensorage search {key}: {total} tasks"]
    if done:
        parts.append(f"{done} already done (resuming)")
    if stopped:
        parts.append(f"{stopped} continuing where they stopped")
    if cluster is not None:
        parts.append(f"cluster {cluster}")
    else:
        parts.append(f"{workers} worker{'s' if workers != 1 else ''}")
    if budget is not None:
        parts.append(f"time budget {format_seconds(budget)}")
    return ", ".join(parts) + f"; checkpoint {path}"


__all__ = ["INLINE_S", "SAVE_EVERY_S", "SPLIT_AFTER_S", "SearchInterrupted", "default_workers", "run_search"]

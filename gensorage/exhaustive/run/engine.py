"""Where a search's tasks run: the :class:`Engine` interface, and its value for one machine,
:class:`ProcessEngine` (a pool of spawned worker processes). :mod:`.cluster` is the other value (a Dask
cluster). :meth:`~.search_run.SearchRun.run_engine` is the one place that submits tasks to an engine and
records what comes back.

An engine runs *jobs*: a key (unique in one run) and a task of the search core. It reports, through
:meth:`Engine.events`, a job's progress (``"progress"``, the core's statistics as a dict), its periodic save
points (``"save"``, an :class:`~.conversions.Outcome` covering the job from its start), a rerun of it after
its worker died continuing from its last save point (``"resumed"``, that point), and its end
(``"done"`` with an Outcome, or ``"error"`` with the exception). A stopped job returns ``complete=False`` and
says where it stopped, so the driver can continue or split it.
"""

from __future__ import annotations

import multiprocessing
import os
import queue as queue_mod
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, Protocol

from gensorage.exhaustive.run.conversions import Outcome
from gensorage.exhaustive.run.core import SearchCore
from gensorage.exhaustive.run.workers import init_worker, submit, terminate, worker_run

# (kind, job key, payload): see the module docstring.
Event = tuple[str, int, Any]


class Engine(Protocol):
    """Runs jobs on workers (see the module docstring)."""

    workers: int  # how many jobs run at once
    can_stop_one: bool  # whether stop(key) stops one job (what splitting a running task needs)

    def submit(self, key: int, task: Any) -> None:
        """Start job ``key`` running ``task`` (queued if every worker is busy)."""

    def events(self, timeout: float) -> list[Event]:
        """What happened since the last call; waits up to ``timeout`` seconds for a job to end."""
        ...

    def stop(self, key: int | None = None) -> None:
        """Ask job ``key`` (None: every job) to stop and return where it is."""

    def close(self, abort: bool) -> None:
        """Release the workers; ``abort``: kill jobs still running."""


class ProcessEngine:
    """Jobs on ``workers`` spawned processes of this machine; a stop request reaches every job at once."""

    can_stop_one = False

    def __init__(self, core: SearchCore, spec: Any, workers: int, save_every_s: float | None) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.workers = workers
        self._core, self._spec, self._save_every_s = core, spec, save_every_s
        self._stop = ctx.Event()
        self._progress: Any = ctx.Queue()
        self._futures: dict[Future[Outcome], int] = {}
        self._executor = ProcessPoolExecutor(
            max_workers=workers,
            mp_context=ctx,
            initializer=init_worker,
            initargs=(self._stop, self._progress, os.getpid()),
        )

    def submit(self, key: int, task: Any) -> None:
        fut = submit(self._executor, worker_run, self._core, self._spec, task, key, self._save_every_s)
        self._futures[fut] = key

    def events(self, timeout: float) -> list[Event]:
        finished, _ = wait(self._futures, timeout=timeout, return_when=FIRST_COMPLETED)
        out: list[Event] = self._drain()  # before the results: a job's last save precedes its end
        for fut in sorted(finished, key=self._futures.__getitem__):
            key = self._futures.pop(fut)
            exc = fut.exception()
            out.append(("error", key, exc) if exc is not None else ("done", key, fut.result()))
        return out

    def _drain(self) -> list[Event]:
        out: list[Event] = []
        while True:
            try:
                out.append(self._progress.get_nowait())
            except (queue_mod.Empty, OSError, ValueError, EOFError):
                return out

    def stop(self, key: int | None = None) -> None:
        self._stop.set()

    def close(self, abort: bool) -> None:
        self._stop.set()
        if abort:
            terminate(self._executor)
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._progress.close()
        self._progress.join_thread()


__all__ = ["Engine", "Event", "ProcessEngine"]

"""The worker side of the runner's process pool: each worker runs tasks of the core, polls a shared stop event
(throttled), and sends its running task's progress and save points to the parent."""

from __future__ import annotations

import queue as queue_mod
import signal
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from gensorage.exhaustive.run.conversions import Outcome, encode, stats_to_dict
from gensorage.exhaustive.run.core import SearchCore
from gensorage.exhaustive.run.processes import die_with_parent, sigint_ignored, watch_parent

# How often a worker's should_stop really looks at the shared stop event (the core may call should_stop
# every few states, and Event.is_set takes a lock).
STOP_POLL_S = 0.05
# How often a worker forwards its running task's statistics to the parent.
WORKER_PROGRESS_S = 0.5

_worker_stop: Any = None
_worker_progress: Any = None


def init_worker(stop_event: Any, progress_q: Any, parent_pid: int) -> None:
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


def worker_run(core: SearchCore, spec: Any, task: Any, key: int, save_every_s: float | None) -> Outcome:
    """Run job ``key`` (``task``) in a pool worker, sending its progress and save points to the parent."""
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
            send(("progress", key, stats_to_dict(stats)))

    saving: dict[str, Any] = {}
    if save_every_s is not None:
        saving = {
            "save_every_s": save_every_s,
            "on_save": lambda res: send(("save", key, encode(idx, res, time.perf_counter() - t0))),
        }
    res = core.run_task(
        spec, task, should_stop=Throttled(_worker_should_stop), on_progress=on_progress, **saving
    )
    return encode(idx, res, time.perf_counter() - t0)


class Throttled:
    """``should_stop`` for the core: consults ``check`` at most every ``every_s`` seconds (default
    :data:`STOP_POLL_S`), the first time ``first_s`` seconds after it is made; once True, stays."""

    __slots__ = ("_check", "_every_s", "_next", "_stopped")

    def __init__(self, check: Callable[[], bool], every_s: float = STOP_POLL_S, first_s: float = 0.0) -> None:
        self._check = check
        self._every_s = every_s
        self._next = time.monotonic() + first_s if first_s else 0.0
        self._stopped = False

    def __call__(self) -> bool:
        if self._stopped:
            return True
        now = time.monotonic()
        if now >= self._next:
            self._next = now + self._every_s
            self._stopped = bool(self._check())
        return self._stopped


def submit(executor: ProcessPoolExecutor, fn: Callable[..., Outcome], *args: Any) -> Future[Outcome]:
    """``executor.submit``, with SIGINT ignored meanwhile: submit may spawn a worker, which then ignores it
    from its first instruction, before its initializer could (:func:`.processes.sigint_ignored`)."""
    with sigint_ignored():
        return executor.submit(fn, *args)


def terminate(executor: ProcessPoolExecutor) -> None:
    """Kill the pool's workers now (tasks that did not honour the stop request, or a forced abort)."""
    terminate = getattr(executor, "terminate_workers", None)  # Python >= 3.14
    if callable(terminate):
        terminate()
        return
    # Older Pythons have no public way; the pool's process table is the only handle on its workers.
    for proc in list((getattr(executor, "_processes", None) or {}).values()):
        if proc.is_alive():
            proc.terminate()


__all__ = [
    "STOP_POLL_S",
    "WORKER_PROGRESS_S",
    "Throttled",
    "init_worker",
    "submit",
    "terminate",
    "worker_run",
]

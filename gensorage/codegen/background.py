"""One background thread per owner that runs queued builds in order, and lets the process exit promptly.

A serving process meets new lengths faster than their background rebuilds finish (each is a ``tvm.compile``
of a few seconds, one at a time: they share the cores with the calls). A thread per rebuild, each waiting for
the one before, piled up one thread per length (30 alive after 40 lengths of the small decoder layer), and the
interpreter, which joins every non-daemon thread at exit, then waited for all of them: minutes. Here one worker
thread drains a queue and ends when it is empty; a new build starts it again.

The worker is not a daemon: a daemon thread killed by the interpreter's exit inside LLVM's compile would run
TVM's code while its statics are destroyed. Instead, once the interpreter begins to exit (its main thread
returned, ``sys.exit``, an uncaught exception), the queued builds are dropped (they only make kernels faster,
never different) and exit waits for at most the one build in flight.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable

_EXITING = threading.Event()


def _exiting() -> None:
    _EXITING.set()


# Run by threading's shutdown before it joins the non-daemon threads (concurrent.futures registers its own
# workers' stop the same way); the interpreter's atexit handlers would run only after that join.
threading._register_atexit(_exiting)  # type: ignore[attr-defined]


class BackgroundBuilds:
    """Tasks run in the order given, one at a time, on one thread started on demand (see the module docstring).

    ``dropped`` counts the tasks left unrun because the process was exiting. A task handles its own errors
    (one that raises anyway is counted in ``failed`` and the next task runs).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.dropped = 0
        self.failed = 0
        self._lock = threading.Lock()
        self._queue: deque[Callable[[], None]] = deque()
        self._thread: threading.Thread | None = None

    def submit(self, tasks: Iterable[Callable[[], None]]) -> None:
        """Queue ``tasks``, starting the worker if it is not running."""
        with self._lock:
            self._queue.extend(tasks)
            if self._thread is None and self._queue:
                self._thread = threading.Thread(target=self._run, name=self.name)
                self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                with self._lock:
                    if _EXITING.is_set():
                        self.dropped += len(self._queue)
                        self._queue.clear()
                    if not self._queue:
                        return
                    task = self._queue.popleft()
                try:
                    task()
                except Exception:  # the task's own error handling missed it: the next task still runs
                    self.failed += 1
        finally:  # also when a task raises past that (SystemExit): the next submit starts a worker
            with self._lock:
                self._thread = None

    @property
    def queued(self) -> int:
        """Tasks waiting (the one running not counted)."""
        return len(self._queue)

    @property
    def thread(self) -> threading.Thread | None:
        """The worker while it runs, else None."""
        return self._thread

    def join(self, timeout: float | None = None) -> None:
        """Wait until the queue is drained (up to ``timeout`` seconds per worker run)."""
        while (thread := self._thread) is not None:
            thread.join(timeout)
            if thread.is_alive():  # timed out
                return


__all__ = ["BackgroundBuilds"]

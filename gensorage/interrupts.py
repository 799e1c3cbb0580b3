"""Ctrl-C during a long call: first a request to stop cleanly, then an abort.

Long calls (a search, the choice among its candidates) run inside :func:`stop_requests`. While one is active
in the main thread, SIGINT does not raise at once: each press adds a request (``count``) that the running code
polls where it can stop without losing work. A press that reaches ``abort_at`` raises ``KeyboardInterrupt``
(an abort), except inside :meth:`StopRequests.critical` (a checkpoint commit), where it is held back until the
block ends. Nested calls share the outermost object, so a press is seen by whichever layer is running.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class StopRequests:
    """The Ctrl-C presses of one long call (see the module docstring)."""

    def __init__(self) -> None:
        self.count = 0
        self.abort_at = 2
        self._in_critical = False
        self._deferred = False

    def handle(self, signum: int, frame: FrameType | None) -> None:
        """The SIGINT handler."""
        self.count += 1
        if self.count >= self.abort_at:
            if self._in_critical:
                self._deferred = True
            else:
                raise KeyboardInterrupt

    def grace(self) -> int:
        """Make the next press a stop request again (the one after it aborts); the presses so far."""
        self.abort_at = self.count + 2
        return self.count

    @contextmanager
    def critical(self) -> Iterator[None]:
        """A block an abort must not cut (it is raised when the block ends)."""
        self._in_critical = True
        try:
            yield
        finally:
            self._in_critical = False
        if self._deferred:
            self._deferred = False
            raise KeyboardInterrupt


_active: StopRequests | None = None


@contextmanager
def stop_requests() -> Iterator[StopRequests]:
    """SIGINT counted as stop requests while the block runs (the outermost active object when nested).

    Outside the main thread no handler can be installed: the object then never counts a press.
    """
    global _active
    if _active is not None:
        yield _active
        return
    requests = StopRequests()
    if threading.current_thread() is not threading.main_thread():
        yield requests
        return
    old = signal.signal(signal.SIGINT, requests.handle)
    _active = requests
    try:
        yield requests
    finally:
        _active = None
        signal.signal(signal.SIGINT, old)


__all__ = ["StopRequests", "stop_requests"]

"""What the search's worker processes need from the process that starts them, and what they do when it dies.

Workers are started with ``spawn`` (a fresh interpreter: no inherited locks or threads). A spawned interpreter
imports the parent's ``__main__`` script again before it runs anything, so a script that starts a search from
its top level without ``if __name__ == "__main__":`` would start it again in every worker (multiprocessing then
fails with a long traceback). :func:`unguarded_main_script` finds that case before any worker starts, so the
runner can run the search in its own process instead and say why.

A worker must not outlive its parent: :func:`die_with_parent` asks Linux to kill it when the parent dies, and
:func:`watch_parent` (every platform) exits once the parent is gone.
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

# How often a worker checks that its parent is still alive (where the kernel does not tell it).
PARENT_POLL_S = 1.0
_PR_SET_PDEATHSIG = 1


def unguarded_main_script(frame: FrameType | None = None) -> str | None:
    """The ``__main__`` script's path when this call comes from its top level outside a
    ``if __name__ == "__main__":`` block (spawned processes would re-run that line); None otherwise.

    ``frame``: where to start looking up the stack (default: the caller's).
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not isinstance(path, str):
        return None  # an interactive session, or an embedded interpreter: spawn re-imports nothing
    name = getattr(getattr(main, "__spec__", None), "name", None) or ""
    if name == "__main__" or name.endswith(".__main__"):
        return None  # ``python -m package``: spawn does not run a package's __main__ again
    f: FrameType | None = frame if frame is not None else sys._getframe(1)
    while f is not None and not (f.f_code.co_name == "<module>" and f.f_globals is vars(main)):
        f = f.f_back
    if f is None:
        return None  # called from a function the script's top level did not call (a thread, a callback)
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None  # no source to read: assume the script knows what it does
    line = f.f_lineno
    for stmt in tree.body:
        if stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno):
            return None if _guarded(stmt, line) else path
    return None


def _guarded(stmt: ast.stmt, line: int) -> bool:
    """Whether ``line`` lies in the body of ``stmt`` when it is ``if __name__ == "__main__":``."""
    if not isinstance(stmt, ast.If) or not _is_main_test(stmt.test) or not stmt.body:
        return False
    return stmt.body[0].lineno <= line <= (stmt.body[-1].end_lineno or stmt.body[-1].lineno)


def _is_main_test(test: ast.expr) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    consts = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(consts) == 1


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """SIGINT ignored while the block starts processes: a child started meanwhile ignores it from its first
    instruction (Python installs no KeyboardInterrupt handler where SIGINT is ignored at start), so a Ctrl-C
    reaching the whole process group is the parent's alone to act on. Outside the main thread: no change."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def die_with_parent(parent_pid: int) -> None:
    """In a worker: be killed (SIGKILL) by the kernel the moment the parent dies (Linux; elsewhere a no-op).

    Only the parent writes the checkpoint, so a worker has nothing to save.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before the request was made
        os._exit(1)


def watch_parent(parent_pid: int) -> None:
    """In a worker: a daemon thread that exits the process once the parent is gone (any platform). Without it
    an idle worker would wait for its next task forever: it holds both ends of the pool's call queue itself."""
    threading.Thread(target=_watch, args=(parent_pid,), name="gensorage-parent-watch", daemon=True).start()


def _watch(parent_pid: int) -> None:
    while True:
        time.sleep(PARENT_POLL_S)
        if os.getppid() != parent_pid:
            os._exit(1)


__all__ = ["PARENT_POLL_S", "die_with_parent", "sigint_ignored", "unguarded_main_script", "watch_parent"]

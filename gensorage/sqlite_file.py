"""The one way gensorage keeps data in SQLite: the result store and the search checkpoints build on it.

A :class:`SQLiteFile` is one database file opened in autocommit mode with a busy timeout, in WAL journal mode
with ``synchronous = NORMAL``; every write is one ``BEGIN IMMEDIATE`` transaction (:meth:`SQLiteFile.write`),
so several processes may read and write the same file: a writer waits for another's transaction (up to the busy
timeout) instead of failing on a lock upgrade. Every commit survives the process being killed at any moment;
after an OS crash the last few commits may be rolled back, never half applied.

A file gensorage did not create (not SQLite, or SQLite without the subclass's meta table) is refused with a
:class:`~gensorage.errors.StoreError` naming the path and the reason; it is never written to.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self, TypeVar

from gensorage.errors import StoreError

T = TypeVar("T")

DEFAULT_BUSY_TIMEOUT_MS = 30_000


class SQLiteFile:
    """An open gensorage SQLite file (see the module docstring).

    Subclasses name what they hold (``what``, for messages) and their meta table (``meta_table``: a database
    with tables but without it is someone else's), then create and check their own schema.

    Raises
    ------
    StoreError
        The file cannot be opened, is not a SQLite database, or is a database gensorage did not create.
    """

    what: ClassVar[str] = "gensorage database"
    meta_table: ClassVar[str] = "meta"

    def __init__(
        self, path: str | os.PathLike[str], *, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS
    ) -> None:
        self.path = Path(path).expanduser()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Autocommit mode: every write opens its own explicit transaction (write()).
            self._conn = sqlite3.connect(str(self.path), timeout=busy_timeout_ms / 1000, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"{self.path}: cannot open {self.what} ({exc})") from exc
        with self.opening():
            self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            self._retry_locked(self._set_up, busy_timeout_ms)

    def _set_up(self) -> None:
        """Check the file is ours (or new) and switch it to WAL."""
        tables = self.tables()
        if tables and self.meta_table not in tables:
            raise StoreError(
                f"{self.path}: a SQLite database that is not a {self.what} "
                f"(tables: {', '.join(sorted(tables)[:5])})"
            )
        mode = self._conn.execute("PRAGMA journal_mode = WAL").fetchone()
        if mode is None or str(mode[0]).lower() != "wal":
            raise StoreError(f"{self.path}: cannot switch the {self.what} to WAL mode (got {mode})")
        self._conn.execute("PRAGMA synchronous = NORMAL")

    @staticmethod
    def _retry_locked(step: Callable[[], T], timeout_ms: int) -> T:
        """``step`` again while the file is locked, up to ``timeout_ms``.

        Switching a new file to WAL needs an exclusive lock. When several processes open the same new file at
        once, SQLite refuses the switch at once with "database is locked" instead of waiting in the busy
        handler (its deadlock avoidance between a shared and an exclusive lock), so the wait is done here.
        """
        deadline = time.monotonic() + timeout_ms / 1000
        delay = 0.001
        while True:
            try:
                return step()
            except sqlite3.OperationalError as exc:
                locked = "locked" in str(exc) or "busy" in str(exc)
                if not locked or time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay)
            delay = min(2 * delay, 0.05)

    @contextmanager
    def opening(self) -> Iterator[None]:
        """Setting the file up: any failure closes the connection; SQLite's own errors become StoreErrors."""
        try:
            yield
        except sqlite3.OperationalError as exc:
            self._conn.close()
            raise StoreError(f"{self.path}: cannot open {self.what} ({exc})") from exc
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            raise StoreError(f"{self.path}: not a usable {self.what} ({exc})") from exc
        except BaseException:
            self._conn.close()
            raise

    def tables(self) -> set[str]:
        """The names of the file's tables."""
        return {r[0] for r in self._conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}

    @contextmanager
    def write(self) -> Iterator[None]:
        """One IMMEDIATE transaction: the write lock is taken up front, so concurrent writers queue (busy
        timeout) instead of failing with a lock upgrade deadlock; any exception rolls it back."""
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    @contextmanager
    def errors(self, doing: str) -> Iterator[None]:
        """SQLite failures while ``doing`` something (a lock held past the busy timeout, a full disk) as
        one-line StoreErrors."""
        try:
            yield
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot {doing} ({exc})") from exc

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


__all__ = ["DEFAULT_BUSY_TIMEOUT_MS", "SQLiteFile"]

"""The one SQLite base (gensorage.sqlite_file): WAL, IMMEDIATE writes, foreign files refused."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gensorage.errors import StoreError
from gensorage.sqlite_file import SQLiteFile


class Notes(SQLiteFile):
    what = "notes file"
    meta_table = "notes_meta"

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        with self.opening(), self.write():
            self._conn.execute("CREATE TABLE IF NOT EXISTS notes_meta (k TEXT PRIMARY KEY, v TEXT)")
            self._conn.execute("CREATE TABLE IF NOT EXISTS notes (n INTEGER)")

    def add(self, n: int, fail: bool = False) -> None:
        with self.errors("add a note"), self.write():
            self._conn.execute("INSERT INTO notes VALUES (?)", (n,))
            if fail:
                raise RuntimeError("after the insert")

    def all(self) -> list[int]:
        return [r[0] for r in self._conn.execute("SELECT n FROM notes ORDER BY n")]


def test_a_new_file_is_created_in_wal_mode_and_reopens(tmp_path: Path) -> None:
    with Notes(tmp_path / "sub" / "n.sqlite") as notes:
        notes.add(1)
        assert notes._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with Notes(tmp_path / "sub" / "n.sqlite") as notes:
        assert notes.all() == [1] and {"notes", "notes_meta"} <= notes.tables()


def test_an_exception_inside_a_write_rolls_it_back(tmp_path: Path) -> None:
    with Notes(tmp_path / "n.sqlite") as notes:
        notes.add(1)
        with pytest.raises(RuntimeError):
            notes.add(2, fail=True)
        assert notes.all() == [1]


def test_someone_elses_database_and_a_non_database_are_refused_untouched(tmp_path: Path) -> None:
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE users (name TEXT)")
    with pytest.raises(StoreError, match=r"a SQLite database that is not a notes file \(tables: users\)"):
        Notes(other)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database at all" * 100)
    with pytest.raises(StoreError, match="not a usable notes file"):
        Notes(junk)
    assert junk.read_bytes() == b"not a database at all" * 100


def test_sqlite_failures_are_one_line_store_errors(tmp_path: Path) -> None:
    with Notes(tmp_path / "n.sqlite") as notes:
        notes._conn.execute("DROP TABLE notes")
        with pytest.raises(StoreError, match=r"cannot add a note \(no such table: notes\)"):
            notes.add(1)


def test_a_locked_set_up_is_retried_until_the_timeout() -> None:
    # Several processes opening one new file: SQLite refuses the switch to WAL with "database is locked"
    # at once (no busy handler), so opening retries.
    import sqlite3

    from gensorage.sqlite_file import SQLiteFile

    calls: list[int] = []

    def locked_twice() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise sqlite3.OperationalError("database is locked")
        return "wal"

    assert SQLiteFile._retry_locked(locked_twice, 1000) == "wal" and len(calls) == 3

    def other() -> None:
        raise sqlite3.OperationalError("no such table: x")

    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        SQLiteFile._retry_locked(other, 1000)

    def always() -> None:
        raise sqlite3.OperationalError("database is locked")

    with pytest.raises(sqlite3.OperationalError, match="locked"):
        SQLiteFile._retry_locked(always, 20)

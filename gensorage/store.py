"""An embedded SQLite store for results that are expensive to recompute.

One file (default ``$GENSORAGE_HOME/store.sqlite``, ``GENSORAGE_HOME`` defaulting to ``~/.cache/gensorage``)
holds:

* ``schedules``: tuned schedules keyed by (workload key, hw name, method, seed, method options, gensorage
  version), with the predicted time, the construction wall time and the creation time;
* any number of generic key/value tables (``Store.get(kind, key)`` / ``Store.put(kind, key, value)``, values
  are JSON), one SQLite table per ``kind``, so other parts (µGraph structures, search checkpoints) can share
  the file.

The file is a :class:`gensorage.sqlite_file.SQLiteFile`: several processes can read and write it concurrently,
and a file that is not a SQLite database, or a SQLite database that gensorage did not create, raises
:class:`StoreError` naming the path and the reason; it is never overwritten.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gensorage.errors import StoreError
from gensorage.sqlite_file import DEFAULT_BUSY_TIMEOUT_MS, SQLiteFile

FORMAT_MARKER = "gensorage-store"
SCHEMA_VERSION = 1
_KIND_RE = re.compile(r"^[a-z][a-z0-9_]{0,47}$")

JsonValue = Any  # anything json.dumps accepts


def gensorage_home() -> Path:
    """``$GENSORAGE_HOME``, or ``~/.cache/gensorage`` when unset."""
    env = os.environ.get("GENSORAGE_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "gensorage"


def default_store_path() -> Path:
    """``$GENSORAGE_HOME/store.sqlite``."""
    return gensorage_home() / "store.sqlite"


@dataclass(frozen=True, slots=True)
class ScheduleKey:
    """What identifies a tuning result: the same key always yields the same schedule."""

    workload: str  # Workload.key()
    hw: str
    method: str
    seed: int
    options: str  # canonical JSON of the method options ("{}" for none)
    version: str  # gensorage version

    @staticmethod
    def make(
        workload: str,
        hw: str,
        method: str,
        seed: int,
        options: dict[str, Any] | None = None,
        version: str | None = None,
    ) -> ScheduleKey:
        if version is None:
            from gensorage import __version__ as version
        opts = json.dumps(options or {}, sort_keys=True, separators=(",", ":"))
        return ScheduleKey(workload, hw, method, int(seed), opts, str(version))


@dataclass(frozen=True, slots=True)
class ScheduleRecord:
    key: ScheduleKey
    schedule: dict[str, Any]  # Schedule.to_json()
    predicted_time_s: float
    construction_time_s: float
    created_at: float  # Unix time
    evaluated: int | None = None  # schedules the method scored, when known


_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS gensorage_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS schedules (
        workload TEXT NOT NULL, hw TEXT NOT NULL, method TEXT NOT NULL, seed INTEGER NOT NULL,
        options TEXT NOT NULL, version TEXT NOT NULL,
        schedule TEXT NOT NULL, predicted_time_s REAL NOT NULL, construction_time_s REAL NOT NULL,
        created_at REAL NOT NULL, evaluated INTEGER,
        PRIMARY KEY (workload, hw, method, seed, options, version))""",
)


class Store(SQLiteFile):
    """A gensorage result store backed by one SQLite file (see the module docstring).

    Parameters
    ----------
    path
        The database file; ``None`` means :func:`default_store_path`. Parent directories are created.
    busy_timeout_ms
        How long a writer waits for another process's transaction before failing.

    Raises
    ------
    StoreError
        The file is not a SQLite database, is a database gensorage did not create, has a newer schema, or
        cannot be opened.
    """

    what = "gensorage store"
    meta_table = "gensorage_meta"

    def __init__(
        self, path: str | os.PathLike[str] | None = None, *, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS
    ) -> None:
        super().__init__(path if path is not None else default_store_path(), busy_timeout_ms=busy_timeout_ms)
        with self.opening():
            self._create_schema()
        self._tables: set[str] = set()

    def _create_schema(self) -> None:
        with self.write():
            for stmt in _SCHEMA:
                self._conn.execute(stmt)
            self._conn.execute("INSERT OR IGNORE INTO gensorage_meta VALUES ('format', ?)", (FORMAT_MARKER,))
            self._conn.execute(
                "INSERT OR IGNORE INTO gensorage_meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
            )
        meta = dict(self._conn.execute("SELECT name, value FROM gensorage_meta").fetchall())
        if meta.get("format") != FORMAT_MARKER:
            raise StoreError(f"{self.path}: not a gensorage store (format marker {meta.get('format')!r})")
        if int(meta.get("schema_version", "0")) > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path}: store schema {meta['schema_version']} is newer than this "
                f"gensorage understands ({SCHEMA_VERSION})"
            )

    # -------------------------------------------------------------------------------- generic tables
    def _table(self, kind: str, *, create: bool) -> str | None:
        if not _KIND_RE.match(kind):
            raise StoreError(
                f"invalid store table name {kind!r} (lowercase letters, digits and _, starting with a letter)"
            )
        name = f"kv_{kind}"
        if name in self._tables:
            return name
        with self.errors(f"look up table {kind}"):
            exists = self._conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
            ).fetchone()
        if not exists and not create:
            return None
        if not exists:
            with self.errors(f"create table {kind}"), self.write():
                self._conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {name} (key TEXT PRIMARY KEY, "
                    "value TEXT NOT NULL, created_at REAL NOT NULL, updated_at REAL NOT NULL)"
                )
        self._tables.add(name)
        return name

    def put(self, kind: str, key: str, value: JsonValue) -> None:
        """Store ``value`` (JSON-serialisable) under ``key`` in table ``kind`` (created on first use)."""
        try:
            text = json.dumps(value, sort_keys=True)
        except (TypeError, ValueError) as exc:
            raise StoreError(f"value for {kind}/{key} is not JSON-serialisable: {exc}") from exc
        table = self._table(kind, create=True)
        now = time.time()
        with self.errors(f"write {kind}/{key}"), self.write():
            self._conn.execute(
                f"INSERT INTO {table} (key, value, created_at, updated_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
                (key, text, now, now),
            )

    def get(self, kind: str, key: str) -> JsonValue | None:
        """The value stored under ``key`` in table ``kind``, or None."""
        table = self._table(kind, create=False)
        if table is None:
            return None
        with self.errors(f"read {kind}/{key}"):
            row = self._conn.execute(f"SELECT value FROM {table} WHERE key = ?", (key,)).fetchone()
        return None if row is None else _loads(row[0], f"{self.path}: {kind}/{key}")

    def delete(self, kind: str, key: str) -> bool:
        """Remove ``key`` from table ``kind``; True if it was there."""
        table = self._table(kind, create=False)
        if table is None:
            return False
        with self.errors(f"delete {kind}/{key}"), self.write():
            cur = self._conn.execute(f"DELETE FROM {table} WHERE key = ?", (key,))
        return cur.rowcount > 0

    def keys(self, kind: str) -> list[str]:
        """All keys of table ``kind``, sorted."""
        table = self._table(kind, create=False)
        if table is None:
            return []
        with self.errors(f"list {kind}"):
            return [r[0] for r in self._conn.execute(f"SELECT key FROM {table} ORDER BY key")]

    # ------------------------------------------------------------------------------------ schedules
    def put_schedule(self, record: ScheduleRecord) -> None:
        """Insert or replace the schedule stored under ``record.key``."""
        k = record.key
        with self.errors("write schedule"), self.write():
            self._conn.execute(
                "INSERT OR REPLACE INTO schedules VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    k.workload,
                    k.hw,
                    k.method,
                    k.seed,
                    k.options,
                    k.version,
                    json.dumps(record.schedule),
                    float(record.predicted_time_s),
                    float(record.construction_time_s),
                    record.created_at,
                    record.evaluated,
                ),
            )

    def get_schedule(self, key: ScheduleKey) -> ScheduleRecord | None:
        """The schedule stored under ``key``, or None."""
        with self.errors("read schedules"):
            row = self._conn.execute(
                "SELECT schedule, predicted_time_s, construction_time_s, created_at, evaluated FROM schedules "
                "WHERE workload = ? AND hw = ? AND method = ? AND seed = ? AND options = ? AND version = ?",
                (key.workload, key.hw, key.method, key.seed, key.options, key.version),
            ).fetchone()
        if row is None:
            return None
        sched = _loads(row[0], f"{self.path}: schedule of {key.workload}")
        if not isinstance(sched, dict):
            raise StoreError(f"{self.path}: schedule of {key.workload} is not a JSON object")
        return ScheduleRecord(
            key, sched, float(row[1]), float(row[2]), float(row[3]), None if row[4] is None else int(row[4])
        )

    def count_schedules(self) -> int:
        with self.errors("count schedules"):
            return int(self._conn.execute("SELECT COUNT(*) FROM schedules").fetchone()[0])


def _loads(text: str, where: str) -> JsonValue:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise StoreError(f"{where}: stored value is not valid JSON ({exc})") from exc

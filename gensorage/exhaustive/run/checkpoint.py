"""The incremental SQLite checkpoint of an exhaustive µGraph search.

One file per search (see :func:`default_checkpoint_path`) records which of the search's tasks are done, with
their statistics and every candidate µGraph they found. A task's candidates and its ``done`` mark are written
in ONE transaction, so the file is consistent whenever the process dies (``kill -9``, power loss): a task is
either completely recorded or not at all, and a resumed search runs exactly the tasks not marked done, each
from its last saved resume point if it has one (table ``partial``).

Tables
------
``meta``
    ``(name, value)``: ``format`` (:data:`FORMAT_MARKER`), ``format_version``, ``spec_key``, ``spec`` (the
    search spec as JSON), ``tasks_digest`` (hash of the task list, checked on every open), ``num_tasks``,
    ``gensorage_version``, ``created_at``, ``updated_at`` (Unix times).
``tasks``
    ``(idx, status, task, stats, elapsed_s, updated_at)``: one row per task, ``task`` its JSON, ``status``
    ``'pending'`` or ``'done'``; ``stats`` (JSON) and ``elapsed_s`` are set when it is done. On every open the
    search's task list must match the stored one (digest): a task is named by its position in the search tree,
    so a core whose enumeration changed (same spec, other code) would otherwise mix two different splits.
``candidates``
    ``(task_idx, position, predicted_time_s, ugraph, equivalence, found_in_task)``: the candidates of done
    tasks (and of stopped ones, below); ``position`` is the candidate's place in its task's result, so loading
    reproduces the exact order the task returned (the final ranking is recomputed from them, so no rank is
    stored).
``partial``
    ``(idx, resume, stats, elapsed_s, updated_at)``: a pending task that was stopped (time budget, Ctrl-C) and
    said where to continue (``resume``, the core's JSON); its candidates so far are in ``candidates`` and its
    statistics here, all written in one transaction. Done tasks have no row. A task killed without a stop
    request (``kill -9``) keeps the last saved point, or starts afresh.

Durability: the file is a :class:`~gensorage.sqlite_file.SQLiteFile` (WAL journal, ``synchronous = NORMAL``). In
WAL mode a commit has been written to the WAL file (the OS page cache) when it returns, so every committed task
survives the *process* being killed at any moment, ``kill -9`` included, and the file is never corrupted. What
NORMAL gives up against FULL is an fsync per commit: after an OS crash or power loss the last few commits may be
rolled back — those tasks are simply pending again and re-run on resume, so the result is unchanged. A search can
have tens of thousands of tiny tasks, and an fsync per commit costs more than many of them take (CHANGELOG.md).
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gensorage.errors import StoreError
from gensorage.sqlite_file import SQLiteFile

FORMAT_MARKER = "gensorage-search-checkpoint"
FORMAT_VERSION = 1
BUSY_TIMEOUT_MS = 30_000

_PARTIAL = """CREATE TABLE IF NOT EXISTS partial (
        idx INTEGER PRIMARY KEY REFERENCES tasks(idx), resume TEXT NOT NULL, stats TEXT NOT NULL,
        elapsed_s REAL NOT NULL, updated_at REAL NOT NULL)"""
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS tasks (
        idx INTEGER PRIMARY KEY, status TEXT NOT NULL CHECK (status IN ('pending', 'done')),
        task TEXT NOT NULL, stats TEXT, elapsed_s REAL, updated_at REAL NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS candidates (
        task_idx INTEGER NOT NULL REFERENCES tasks(idx), position INTEGER NOT NULL,
        predicted_time_s REAL NOT NULL, ugraph TEXT NOT NULL, equivalence TEXT NOT NULL,
        found_in_task INTEGER NOT NULL,
        PRIMARY KEY (task_idx, position))""",
    _PARTIAL,
)


def checkpoint_dir() -> Path:
    """``$GENSORAGE_HOME/checkpoints`` (``GENSORAGE_HOME`` defaults to ``~/.cache/gensorage``)."""
    from gensorage.store import gensorage_home

    return gensorage_home() / "checkpoints"


class StaleCheckpoint(StoreError):
    """A checkpoint of this search made by another gensorage version or another task list: sound, but not
    resumable by this code."""


def default_checkpoint_path(spec_key: str) -> Path:
    """Where a search with this spec key keeps its work when no checkpoint path is given."""
    return checkpoint_dir() / f"{spec_key}.sqlite"


@dataclass(frozen=True, slots=True)
class CandidateRow:
    """One stored candidate, in JSON form (the runner converts to and from the search core's types)."""

    task_index: int
    position: int
    ugraph: dict[str, Any]  # KernelGraph.to_json()
    predicted_time_s: float
    equivalence: dict[str, Any]
    found_in_task: int


@dataclass(frozen=True, slots=True)
class PartialTask:
    """A stopped task: where it continues (the core's JSON), its statistics and seconds so far, its candidates."""

    index: int
    resume: Any
    stats: dict[str, Any]
    elapsed_s: float
    candidates: tuple[CandidateRow, ...]


@dataclass(frozen=True, slots=True)
class DoneTask:
    """A task marked done: its statistics (``Stats`` as a dict) and the seconds it took."""

    index: int
    stats: dict[str, Any]
    elapsed_s: float


class Checkpoint(SQLiteFile):
    """An open search checkpoint (see the module docstring); create it with :meth:`open`.

    Raises
    ------
    StoreError
        From :meth:`open`: the file is not a SQLite database, is not a gensorage search checkpoint, has a newer
        format, or was made for a different search (spec key, task list) or gensorage version.
    """

    what = "gensorage search checkpoint"
    meta_table = "meta"

    # ------------------------------------------------------------------------------------------ open
    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        spec_key: str,
        spec_json: Any,
        tasks: Sequence[Any],
        version: str | None = None,
    ) -> Checkpoint:
        """Open the checkpoint at ``path`` for the search ``spec_key``, creating it (all tasks pending) if new.

        Parameters
        ----------
        path
            The SQLite file; parent directories are created.
        spec_key, spec_json
            The search spec's stable key and its JSON form (stored for humans and tools).
        tasks
            The search's tasks as JSON values, in index order (task ``i`` is ``tasks[i]``); an existing
            checkpoint must have been made for exactly this list.
        version
            The gensorage version (default: the running one); results of another version are refused.
        """
        if version is None:
            from gensorage import __version__ as version
        ckpt = cls(path, busy_timeout_ms=BUSY_TIMEOUT_MS)
        with ckpt.opening():
            ckpt._setup(
                spec_key, spec_json, [_dumps(t, f"task {i}") for i, t in enumerate(tasks)], str(version)
            )
        return ckpt

    def _setup(self, spec_key: str, spec_json: Any, task_texts: list[str], version: str) -> None:
        tables = self.tables()
        digest = _digest(task_texts)
        if not tables:
            with self.write():
                if not self.tables():  # another process may have created it meanwhile
                    self._create(spec_key, spec_json, task_texts, digest, version)
        self._check(spec_key, version)
        if "partial" not in self.tables():  # a checkpoint from before stopped tasks were kept
            with self.write():
                self._conn.execute(_PARTIAL)
        if self.meta().get("tasks_digest") != digest:
            meta = self.meta()
            raise StaleCheckpoint(
                f"{self.path}: checkpoint was made for a different task list of the same search "
                f"({meta.get('num_tasks')} tasks, digest {meta.get('tasks_digest')}; now "
                f"{len(task_texts)} tasks, digest {digest}): the search code changed; delete it or "
                "use another path"
            )

    def _create(
        self, spec_key: str, spec_json: Any, task_texts: list[str], digest: str, version: str
    ) -> None:
        now = time.time()
        for stmt in _SCHEMA:
            self._conn.execute(stmt)
        meta = {
            "format": FORMAT_MARKER,
            "format_version": str(FORMAT_VERSION),
            "spec_key": spec_key,
            "spec": _dumps(spec_json, "spec"),
            "tasks_digest": digest,
            "num_tasks": str(len(task_texts)),
            "gensorage_version": version,
            "created_at": repr(now),
            "updated_at": repr(now),
        }
        self._conn.executemany("INSERT INTO meta VALUES (?, ?)", sorted(meta.items()))
        self._conn.executemany(
            "INSERT INTO tasks (idx, status, task, updated_at) VALUES (?, 'pending', ?, ?)",
            [(i, t, now) for i, t in enumerate(task_texts)],
        )

    def _check(self, spec_key: str, version: str) -> None:
        tables = self.tables()
        missing = {"meta", "tasks", "candidates"} - tables
        meta = self.meta() if "meta" in tables else {}
        if meta.get("format") != FORMAT_MARKER:
            raise StoreError(
                f"{self.path}: not a gensorage search checkpoint (format marker {meta.get('format')!r})"
            )
        if missing:
            raise StoreError(f"{self.path}: damaged search checkpoint (missing tables {sorted(missing)})")
        fv = meta.get("format_version", "")
        if not fv.isdigit() or int(fv) > FORMAT_VERSION:
            raise StoreError(
                f"{self.path}: checkpoint format {fv!r} is not one this gensorage reads "
                f"(up to {FORMAT_VERSION})"
            )
        if meta.get("spec_key") != spec_key:
            raise StoreError(
                f"{self.path}: checkpoint belongs to a different search (spec key "
                f"{meta.get('spec_key')}, this search is {spec_key}); pass another checkpoint path "
                "or delete the file"
            )
        if meta.get("gensorage_version") != version:
            raise StaleCheckpoint(
                f"{self.path}: checkpoint was written by gensorage {meta.get('gensorage_version')}, "
                f"this is {version}; its results may differ, so delete it or use another path"
            )
        texts = [r[0] for r in self._conn.execute("SELECT task FROM tasks ORDER BY idx")]
        if meta.get("num_tasks") != str(len(texts)) or meta.get("tasks_digest") != _digest(texts):
            raise StoreError(
                f"{self.path}: damaged search checkpoint (its task list does not match its digest)"
            )
        last = self._conn.execute("SELECT MAX(idx) FROM tasks").fetchone()[0]
        if texts and last != len(texts) - 1:
            raise StoreError(
                f"{self.path}: damaged search checkpoint (task indices are not 0..{len(texts) - 1})"
            )

    # --------------------------------------------------------------------------------------- access
    def meta(self) -> dict[str, str]:
        """The ``meta`` table as a dict."""
        return dict(self._conn.execute("SELECT name, value FROM meta").fetchall())

    def done_tasks(self) -> dict[int, DoneTask]:
        """Every task marked done, by index."""
        out: dict[int, DoneTask] = {}
        try:
            rows = self._conn.execute(
                "SELECT idx, stats, elapsed_s FROM tasks WHERE status = 'done' ORDER BY idx"
            ).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot read tasks ({exc})") from exc
        for idx, stats, elapsed in rows:
            value = _loads(stats, f"{self.path}: stats of task {idx}")
            if not isinstance(value, dict):
                raise StoreError(f"{self.path}: stats of task {idx} is not a JSON object")
            out[int(idx)] = DoneTask(int(idx), value, float(elapsed))
        return out

    def task_jsons(self) -> list[Any]:
        """The stored tasks' JSON values, in index order."""
        return [
            _loads(r[0], f"{self.path}: task {r[1]}")
            for r in self._conn.execute("SELECT task, idx FROM tasks ORDER BY idx")
        ]

    def pending_tasks(self) -> list[int]:
        """Indices of the tasks not marked done, ascending."""
        return [
            int(r[0])
            for r in self._conn.execute("SELECT idx FROM tasks WHERE status = 'pending' ORDER BY idx")
        ]

    def candidates(self, status: str = "done") -> list[CandidateRow]:
        """Every stored candidate of the tasks with ``status`` (``'done'``; ``'pending'``: of stopped tasks),
        ordered by (task index, position)."""
        try:
            rows = self._conn.execute(
                "SELECT c.task_idx, c.position, c.ugraph, c.predicted_time_s, c.equivalence, c.found_in_task "
                "FROM candidates c JOIN tasks t ON t.idx = c.task_idx WHERE t.status = ? "
                "ORDER BY c.task_idx, c.position",
                (status,),
            ).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot read candidates ({exc})") from exc
        out: list[CandidateRow] = []
        for task, pos, ug, t, eq, found in rows:
            where = f"{self.path}: candidate {pos} of task {task}"
            ugraph, equivalence = _loads(ug, where), _loads(eq, where)
            if not isinstance(ugraph, dict) or not isinstance(equivalence, dict):
                raise StoreError(f"{where}: stored µGraph or equivalence is not a JSON object")
            # A predicted time is a finite number of seconds, not negative; anything else would rank first or last.
            if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0:
                raise StoreError(
                    f"{where}: stored predicted time {t!r} is not a non-negative number of seconds"
                )
            out.append(CandidateRow(int(task), int(pos), ugraph, float(t), equivalence, int(found)))
        return out

    def partial_tasks(self) -> dict[int, PartialTask]:
        """Every stopped (pending) task that saved where to continue, by index."""
        try:
            rows = self._conn.execute(
                "SELECT p.idx, p.resume, p.stats, p.elapsed_s FROM partial p JOIN tasks t ON t.idx = p.idx "
                "WHERE t.status = 'pending' ORDER BY p.idx"
            ).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot read stopped tasks ({exc})") from exc
        cands: dict[int, list[CandidateRow]] = {}
        for row in self.candidates("pending"):
            cands.setdefault(row.task_index, []).append(row)
        out: dict[int, PartialTask] = {}
        for idx, resume, stats, elapsed in rows:
            where = f"{self.path}: stopped task {idx}"
            stats_value = _loads(stats, where)
            if not isinstance(stats_value, dict):
                raise StoreError(f"{where}: stats is not a JSON object")
            out[int(idx)] = PartialTask(
                int(idx), _loads(resume, where), stats_value, float(elapsed), tuple(cands.get(int(idx), ()))
            )
        return out

    def save_partial(
        self,
        index: int,
        *,
        resume: Any,
        stats: dict[str, Any],
        elapsed_s: float,
        candidates: Sequence[CandidateRow],
    ) -> bool:
        """Record where stopped task ``index`` continues, with everything it found so far, in one transaction
        (replacing an earlier stop of it). Returns False (and writes nothing) if the task is already done."""
        row = (
            index,
            _dumps(resume, f"resume point of task {index}"),
            _dumps(stats, f"stats of task {index}"),
            float(elapsed_s),
            time.time(),
        )
        try:
            with self.write():
                if not self._pending(index):
                    return False
                self._replace_candidates(index, candidates)
                self._conn.execute("INSERT OR REPLACE INTO partial VALUES (?, ?, ?, ?, ?)", row)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot record stopped task {index} ({exc})") from exc
        return True

    def _pending(self, index: int) -> bool:
        """Inside a write transaction: whether task ``index`` is still pending (False: already done)."""
        status = self._conn.execute("SELECT status FROM tasks WHERE idx = ?", (index,)).fetchone()
        if status is None:
            raise StoreError(f"{self.path}: no task {index} in this checkpoint")
        return bool(status[0] == "pending")

    def _replace_candidates(self, index: int, candidates: Sequence[CandidateRow]) -> None:
        rows = [
            (
                index,
                c.position,
                float(c.predicted_time_s),
                _dumps(c.ugraph, "µGraph"),
                _dumps(c.equivalence, "equivalence"),
                int(c.found_in_task),
            )
            for c in candidates
        ]
        self._conn.execute("DELETE FROM candidates WHERE task_idx = ?", (index,))
        self._conn.executemany("INSERT INTO candidates VALUES (?, ?, ?, ?, ?, ?)", rows)

    def commit_task(
        self, index: int, *, stats: dict[str, Any], elapsed_s: float, candidates: Sequence[CandidateRow]
    ) -> bool:
        """Record task ``index`` as done with its statistics and candidates, in one transaction.

        Returns False (and writes nothing) if the task was already done, e.g. by a second process sharing the
        file, so results are never duplicated.
        """
        stats_text = _dumps(stats, f"stats of task {index}")
        now = time.time()
        try:
            with self.write():
                if not self._pending(index):
                    return False
                self._replace_candidates(index, candidates)
                self._conn.execute("DELETE FROM partial WHERE idx = ?", (index,))
                self._conn.execute(
                    "UPDATE tasks SET status = 'done', stats = ?, elapsed_s = ?, updated_at = ? "
                    "WHERE idx = ?",
                    (stats_text, float(elapsed_s), now, index),
                )
                self._conn.execute("UPDATE meta SET value = ? WHERE name = 'updated_at'", (repr(now),))
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot record task {index} ({exc})") from exc
        return True


def _digest(texts: Sequence[str]) -> str:
    import hashlib

    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode())
        h.update(b"\n")
    return h.hexdigest()[:16]


def _dumps(value: Any, what: str) -> str:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise StoreError(f"{what} is not JSON-serialisable: {exc}") from exc


def _loads(text: str | None, where: str) -> Any:
    if text is None:
        raise StoreError(f"{where}: missing value")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise StoreError(f"{where}: stored value is not valid JSON ({exc})") from exc


__all__ = [
    "FORMAT_MARKER",
    "FORMAT_VERSION",
    "CandidateRow",
    "Checkpoint",
    "DoneTask",
    "PartialTask",
    "StaleCheckpoint",
    "checkpoint_dir",
    "default_checkpoint_path",
]

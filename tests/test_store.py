"""The SQLite result store: round trips, generic tables, concurrency across processes, corrupt files."""

from __future__ import annotations

import multiprocessing
import sqlite3
import time
from pathlib import Path

import pytest

from gensorage.errors import StoreError
from gensorage.store import ScheduleKey, ScheduleRecord, Store, default_store_path, gensorage_home

SCHED = {
    "axes": ["i", "j", "k"],
    "tiles": [[2, 2, 4], [32, 32, 16], [64, 64, 64]],
    "vthreads": [1, 1, 1],
    "level": 2,
}


def _record(workload: str = "gemm(M=64)", seed: int = 0, **opts: int) -> ScheduleRecord:
    return ScheduleRecord(
        ScheduleKey.make(workload, "h100", "markov", seed, opts), SCHED, 1.5e-6, 0.25, time.time(), 17
    )


def test_schedule_round_trip(tmp_path: Path) -> None:
    with Store(tmp_path / "s.sqlite") as st:
        assert st.get_schedule(_record().key) is None
        st.put_schedule(_record())
        got = st.get_schedule(_record().key)
        assert got is not None and got.schedule == SCHED and got.predicted_time_s == 1.5e-6
        assert got.construction_time_s == 0.25 and got.evaluated == 17
        # Every key component matters: seed, options and version give distinct entries.
        assert st.get_schedule(_record(seed=1).key) is None
        assert st.get_schedule(_record(trials=10).key) is None
        other_version = ScheduleKey.make("gemm(M=64)", "h100", "markov", 0, None, version="0.0.0")
        assert st.get_schedule(other_version) is None
        st.put_schedule(_record())  # replacing is fine
        assert st.count_schedules() == 1
    with Store(tmp_path / "s.sqlite") as st:  # persisted
        assert st.get_schedule(_record().key) is not None


def test_options_key_is_canonical() -> None:
    a = ScheduleKey.make("w", "h100", "optuna", 0, {"trials": 10, "b": 1})
    b = ScheduleKey.make("w", "h100", "optuna", 0, {"b": 1, "trials": 10})
    assert a == b and a.options == '{"b":1,"trials":10}'


def test_generic_tables(tmp_path: Path) -> None:
    with Store(tmp_path / "s.sqlite") as st:
        assert st.get("ugraphs", "x") is None and st.keys("ugraphs") == []
        st.put("ugraphs", "x", {"ops": [1, 2, {"a": None}]})
        st.put("checkpoints", "run-1", [1, 2, 3])
        assert st.get("ugraphs", "x") == {"ops": [1, 2, {"a": None}]}
        st.put("ugraphs", "x", "replaced")
        st.put("ugraphs", "a", 3.5)
        assert st.get("ugraphs", "x") == "replaced" and st.keys("ugraphs") == ["a", "x"]
        assert st.get("checkpoints", "run-1") == [1, 2, 3]
        assert st.delete("ugraphs", "a") and not st.delete("ugraphs", "a")
        with pytest.raises(StoreError, match="invalid store table name"):
            st.put("drop table; --", "k", 1)
        with pytest.raises(StoreError, match="not JSON-serialisable"):
            st.put("ugraphs", "k", object())


def test_wal_mode_and_busy_timeout(tmp_path: Path) -> None:
    Store(tmp_path / "s.sqlite").close()
    conn = sqlite3.connect(tmp_path / "s.sqlite")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    st = Store(tmp_path / "s.sqlite", busy_timeout_ms=1234)
    assert st._conn.execute("PRAGMA busy_timeout").fetchone()[0] == 1234
    st.close()


def _writer(path: str, worker: int, n: int, start: object) -> None:
    with Store(path) as st:
        start.wait()  # type: ignore[attr-defined]  # all processes write at the same time
        for i in range(n):
            st.put("items", f"{worker}-{i}", {"worker": worker, "i": i})
            st.put_schedule(_record(workload=f"w{worker}-{i}"))


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.sqlite")
    n, workers = 60, 4
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(workers)
    procs = [ctx.Process(target=_writer, args=(path, w, n, start)) for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * workers
    with Store(path) as st:
        assert len(st.keys("items")) == workers * n and st.count_schedules() == workers * n
        assert all(
            st.get("items", f"{w}-{i}") == {"worker": w, "i": i} for w in range(workers) for i in range(n)
        )


def test_garbage_file_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    path.write_bytes(b"this is not a database\n" * 64)
    with pytest.raises(StoreError) as err:
        Store(path)
    assert str(path) in str(err.value) and "not a database" in str(err.value)
    assert path.read_bytes().startswith(b"this is not a database")  # left untouched


def test_foreign_sqlite_file_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "other.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE photos (id INTEGER)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="not a gensorage store.*photos"):
        Store(path)


def test_newer_schema_and_corrupt_value_are_store_errors(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    with Store(path) as st:
        st.put("items", "k", 1)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE kv_items SET value = '{broken' WHERE key = 'k'")
    conn.commit()
    with Store(path) as st, pytest.raises(StoreError, match="not valid JSON"):
        st.get("items", "k")
    conn.execute("UPDATE gensorage_meta SET value = '99' WHERE name = 'schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="schema 99 is newer"):
        Store(path)


def test_default_path_follows_gensorage_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENSORAGE_HOME", str(tmp_path / "home"))
    assert gensorage_home() == tmp_path / "home"
    assert default_store_path() == tmp_path / "home" / "store.sqlite"
    with Store() as st:
        st.put("items", "k", 1)
    assert (tmp_path / "home" / "store.sqlite").is_file()
    monkeypatch.delenv("GENSORAGE_HOME")
    assert default_store_path() == Path.home() / ".cache" / "gensorage" / "store.sqlite"

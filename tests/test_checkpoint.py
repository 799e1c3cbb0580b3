"""The search checkpoint file: round trip, one-transaction commits, refusal of foreign / mismatched files."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gensorage.errors import StoreError
from gensorage.exhaustive.run.checkpoint import CandidateRow, Checkpoint, default_checkpoint_path
from gensorage.store import Store

ROOT = Path(__file__).resolve().parents[1]
TASKS = [{"index": i, "what": f"t{i}"} for i in range(4)]
GRAPH = {"inputs": [], "ops": [], "outputs": []}  # the checkpoint stores µGraph JSON as given


def open_ckpt(
    path: Path, key: str = "k1", tasks: list[dict[str, object]] = TASKS, version: str = "9.9"
) -> Checkpoint:
    return Checkpoint.open(path, spec_key=key, spec_json={"spec": key}, tasks=tasks, version=version)


def rows(task: int, n: int) -> list[CandidateRow]:
    return [
        CandidateRow(task, p, {**GRAPH, "tag": [task, p]}, 1e-6 * (n - p), {"trials": p, "ok": True}, task)
        for p in range(n)
    ]


def test_round_trip_and_order(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    with open_ckpt(path) as ck:
        assert ck.pending_tasks() == [0, 1, 2, 3] and ck.done_tasks() == {}
        assert ck.commit_task(2, stats={"states": 5}, elapsed_s=0.5, candidates=rows(2, 3))
        assert ck.commit_task(0, stats={"states": 7}, elapsed_s=1.5, candidates=rows(0, 2))
        meta = ck.meta()
    assert meta["spec_key"] == "k1" and meta["num_tasks"] == "4" and meta["gensorage_version"] == "9.9"
    with open_ckpt(path) as ck:
        assert ck.task_jsons() == TASKS
        assert ck.pending_tasks() == [1, 3]
    with open_ckpt(path) as ck:
        done = ck.done_tasks()
        assert sorted(done) == [0, 2] and done[0].stats == {"states": 7} and done[2].elapsed_s == 0.5
        got = ck.candidates()
    assert got == rows(0, 2) + rows(2, 3)  # (task, position) order, values exact


def test_commit_is_idempotent(tmp_path: Path) -> None:
    with open_ckpt(tmp_path / "c.sqlite") as ck:
        assert ck.commit_task(1, stats={}, elapsed_s=0.1, candidates=rows(1, 2))
        assert not ck.commit_task(1, stats={}, elapsed_s=0.1, candidates=rows(1, 5))
        assert ck.candidates() == rows(1, 2)


def test_a_stopped_task_keeps_its_resume_point_until_it_is_done(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    with open_ckpt(path) as ck:
        assert ck.save_partial(
            1, resume={"cursor": [1, 4]}, stats={"states": 3}, elapsed_s=0.2, candidates=rows(1, 1)
        )
        assert ck.save_partial(
            1, resume={"cursor": [1, 7]}, stats={"states": 5}, elapsed_s=0.4, candidates=rows(1, 2)
        )  # a later stop replaces the earlier one
    with open_ckpt(path) as ck:
        (part,) = ck.partial_tasks().values()
        assert (part.index, part.resume, part.stats, part.elapsed_s) == (
            1,
            {"cursor": [1, 7]},
            {"states": 5},
            0.4,
        )
        assert list(part.candidates) == rows(1, 2)
        assert (
            ck.pending_tasks() == [0, 1, 2, 3] and ck.candidates() == []
        )  # not results until the task is done
        assert ck.commit_task(1, stats={"states": 9}, elapsed_s=0.9, candidates=rows(1, 3))
        assert ck.partial_tasks() == {} and ck.candidates() == rows(1, 3)
        assert not ck.save_partial(1, resume={"cursor": [1, 9]}, stats={}, elapsed_s=0.0, candidates=[])
        assert ck.partial_tasks() == {}


def test_a_checkpoint_without_the_partial_table_gains_it(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    with open_ckpt(path) as ck:
        ck.commit_task(0, stats={"states": 1}, elapsed_s=0.1, candidates=rows(0, 1))
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE partial")
    conn.commit()
    conn.close()
    with open_ckpt(path) as ck:
        assert ck.partial_tasks() == {} and ck.candidates() == rows(0, 1)
        assert ck.save_partial(2, resume={"cursor": [2]}, stats={}, elapsed_s=0.0, candidates=[])


def test_failed_commit_leaves_the_task_pending(tmp_path: Path) -> None:
    with open_ckpt(tmp_path / "c.sqlite") as ck:
        bad = rows(1, 2) + [rows(1, 1)[0]]  # position 0 twice: the third insert fails inside the transaction
        with pytest.raises(StoreError, match="cannot record task 1"):
            ck.commit_task(1, stats={}, elapsed_s=0.1, candidates=bad)
        assert ck.pending_tasks() == [0, 1, 2, 3] and ck.candidates() == []
        assert ck.commit_task(1, stats={}, elapsed_s=0.1, candidates=rows(1, 2))


def test_wal_and_full_sync(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    with open_ckpt(path):
        conn = sqlite3.connect(path)
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        conn.close()


def test_different_spec_is_refused_naming_both(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    open_ckpt(path, key="alpha").close()
    with pytest.raises(StoreError) as info:
        open_ckpt(path, key="beta")
    assert "alpha" in str(info.value) and "beta" in str(info.value) and str(path) in str(info.value)


def test_other_task_list_version_or_damage_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    open_ckpt(path).close()
    with pytest.raises(StoreError, match="different task list"):
        open_ckpt(path, tasks=TASKS[:3])
    with pytest.raises(StoreError, match="different task list"):
        open_ckpt(path, tasks=[*TASKS[:3], {"index": 3, "what": "other"}])
    with pytest.raises(StoreError, match="gensorage 9.9"):
        open_ckpt(path, version="1.0")
    conn = sqlite3.connect(path)
    conn.execute("UPDATE tasks SET task = '{}' WHERE idx = 2")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="damaged search checkpoint"):
        open_ckpt(path)


def test_corrupt_file_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    path.write_bytes(os.urandom(4096))
    with pytest.raises(StoreError) as info:
        open_ckpt(path)
    assert str(path) in str(info.value) and "not a usable gensorage search checkpoint" in str(info.value)
    assert path.stat().st_size == 4096  # never overwritten


def test_foreign_sqlite_and_general_store_are_refused(tmp_path: Path) -> None:
    foreign = tmp_path / "f.sqlite"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE people (name TEXT)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="not a gensorage search checkpoint"):
        open_ckpt(foreign)
    store = tmp_path / "store.sqlite"
    with Store(store) as s:
        s.put("thing", "a", 1)
    with pytest.raises(StoreError, match="not a gensorage search checkpoint"):
        open_ckpt(store)
    hijacked = tmp_path / "h.sqlite"
    conn = sqlite3.connect(hijacked)
    conn.execute("CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT)")
    conn.execute("INSERT INTO meta VALUES ('format', 'something-else')")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="format marker 'something-else'"):
        open_ckpt(hijacked)


def test_default_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GENSORAGE_HOME", str(tmp_path))
    assert default_checkpoint_path("abc") == tmp_path / "checkpoints" / "abc.sqlite"


_WRITER = """
import sys
from gensorage.exhaustive.run.checkpoint import CandidateRow, Checkpoint
tasks = [{"index": i} for i in range(400)]
ck = Checkpoint.open(sys.argv[1], spec_key="k", spec_json={}, tasks=tasks, version="v")
print("open", flush=True)
for i in ck.pending_tasks():
    n = 1 + i % 37
    ck.commit_task(i, stats={"n": n}, elapsed_s=0.0, candidates=[
        CandidateRow(i, p, {"pad": "x" * 2000}, float(p), {}, i) for p in range(n)])
"""


@pytest.mark.parametrize("delay", [0.05, 0.15, 0.3])
def test_kill_9_during_commits_leaves_a_consistent_file(tmp_path: Path, delay: float) -> None:
    path = tmp_path / "k.sqlite"
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(path)],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert proc.stdout is not None and proc.stdout.readline() == "open\n"
    time.sleep(delay)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    with Checkpoint.open(
        path, spec_key="k", spec_json={}, tasks=[{"index": i} for i in range(400)], version="v"
    ) as ck:
        done = ck.done_tasks()
        per_task: dict[int, int] = {}
        for r in ck.candidates():
            per_task[r.task_index] = per_task.get(r.task_index, 0) + 1
        raw = sqlite3.connect(path).execute("SELECT task_idx, COUNT(*) FROM candidates GROUP BY task_idx")
        stored = dict(raw.fetchall())
    # Every done task has exactly its candidates; no candidate belongs to a task not marked done.
    assert per_task == stored == {i: d.stats["n"] for i, d in done.items()}
    assert sorted(done) == list(range(len(done)))  # committed in order, a prefix survived


@pytest.mark.parametrize("bad", [-1e-6, float("inf"), "'fast'"])
def test_a_tampered_predicted_time_is_a_store_error(tmp_path: Path, bad: object) -> None:
    """A stored predicted time that is negative, infinite or not a number would rank its candidate first (or
    last): reading it is refused with the candidate named."""
    path = tmp_path / "c.sqlite"
    with open_ckpt(path) as ck:
        assert ck.commit_task(1, stats={}, elapsed_s=0.1, candidates=rows(1, 2))
    conn = sqlite3.connect(path)
    value = bad if isinstance(bad, str) else repr(bad) if bad != float("inf") else "9e999"
    conn.execute(f"UPDATE candidates SET predicted_time_s = {value} WHERE position = 1")
    conn.commit()
    conn.close()
    with (
        open_ckpt(path) as ck,
        pytest.raises(StoreError, match="candidate 1 of task 1: stored predicted time"),
    ):
        ck.candidates()

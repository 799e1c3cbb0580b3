"""The search runner: process pool, checkpoint/resume under kill -9, time budget, Ctrl-C, progress.

Most tests drive the runner with a toy core (below) whose tasks are fast, deterministic and can be slowed down
on purpose, so kills and budgets land mid-search; one test runs the real exhaustive core at tiny limits.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from checkpoint_rows import done_tasks

from gensorage.errors import ConfigError, StoreError
from gensorage.exhaustive import SearchCore, SearchInterrupted, SearchResult, run_search
from gensorage.exhaustive.run.checkpoint import CandidateRow, Checkpoint
from gensorage.exhaustive.run.conversions import Outcome
from gensorage.exhaustive.run.pieces import Part
from gensorage.exhaustive.run.progress import ProgressReporter
from gensorage.exhaustive.run.search_run import SearchRun, _Job

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


# ============================================================================================ toy core


@dataclass(frozen=True)
class ToySpec:
    """``n_tasks`` tasks of ``per_task`` states each; every state sleeps ``sleep_s``."""

    n_tasks: int = 6
    per_task: int = 12
    sleep_s: float = 0.0
    seed: int = 0
    fail_task: int = -1  # this task raises (a core error must reach the caller)
    log_dir: str = ""  # each completed run_task drops a file here (to count what was re-run)

    def key(self) -> str:
        text = json.dumps(self.to_json(), sort_keys=True)
        return "toy-" + hashlib.sha256(text.encode()).hexdigest()[:12]

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        del d["log_dir"]  # where logs go does not change the search
        return d


@dataclass(frozen=True)
class ToyTask:
    index: int
    start: int
    skip: int = 0  # states of this task a stopped run already walked (the resumable core continues there)


@dataclass(frozen=True)
class ToyResume:
    walked: int

    def to_json(self) -> dict[str, int]:
        return {"walked": self.walked}


@dataclass(frozen=True)
class ToyStats:
    states: int = 0
    pruned_expr: int = 0
    solver_queries: int = 0
    cache_hits: int = 0
    verified: int = 0

    def __add__(self, other: ToyStats) -> ToyStats:
        return ToyStats(
            *(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other), strict=True))
        )


@dataclass(frozen=True)
class ToyGraph:
    """Stands in for a KernelGraph in the workers: only its JSON (a valid µGraph: ``exp`` of a [2, width]
    input) is used there, and the runner decodes it into a real KernelGraph. Keeping gensorage.ugraph out of
    this module keeps the spawned workers' start-up cheap."""

    width: int

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "gensorage.ugraph",
            "version": 1,
            "inputs": [{"name": "X", "shape": [2, self.width], "dtype": "float16"}],
            "ops": [{"kind": "op", "op": "exp", "inputs": [[0, 0]], "attrs": {}}],
            "outputs": [[1, 0]],
        }


@dataclass(frozen=True)
class ToyCandidate:
    ugraph: Any  # ToyGraph where it was found, KernelGraph once read back from the checkpoint
    predicted_time_s: float
    equivalence: dict[str, Any]
    found_in_task: int


@dataclass(frozen=True)
class ToyResult:
    task_index: int
    candidates: tuple[ToyCandidate, ...]
    stats: ToyStats
    complete: bool
    resume: ToyResume | None = None


def toy_enumerate(spec: ToySpec) -> list[ToyTask]:
    return [ToyTask(i, i * spec.per_task) for i in range(spec.n_tasks)]


def _hash(seed: int, i: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{i}".encode()).digest()[:8], "little")


def toy_run_task(
    spec: ToySpec,
    task: ToyTask,
    *,
    should_stop: Callable[[], bool] = lambda: False,
    on_progress: Callable[[ToyStats], None] | None = None,
    on_save: Callable[[ToyResult], None] | None = None,
    save_every_s: float = 60.0,
) -> ToyResult:
    if task.index == spec.fail_task:
        raise ValueError(f"toy failure in task {task.index}")
    stats, cands = ToyStats(), []
    next_save = time.monotonic() + save_every_s
    for i in range(task.start + task.skip, task.start + spec.per_task):
        if should_stop():
            return ToyResult(task.index, tuple(cands), stats, False, ToyResume(i - task.start))
        if spec.sleep_s:
            time.sleep(spec.sleep_s)
        h = _hash(spec.seed, i)
        stats = stats + ToyStats(1, h % 3, h % 2, (h >> 3) % 2, int(h % 4 == 0))
        if h % 4 == 0:
            cands.append(
                ToyCandidate(
                    ToyGraph(1 + h % 9),
                    1e-6 * (1 + (h >> 8) % 500),
                    {"trials": 2, "prime": 2_147_483_647, "state": i},
                    task.index,
                )
            )
        if on_progress is not None:
            on_progress(stats)
        if on_save is not None and time.monotonic() >= next_save:
            next_save = time.monotonic() + save_every_s
            on_save(ToyResult(task.index, tuple(cands), stats, False, ToyResume(i + 1 - task.start)))
    if spec.log_dir:
        Path(spec.log_dir, f"task{task.index}-{os.getpid()}-{time.monotonic_ns()}").touch()
    return ToyResult(task.index, tuple(cands), stats, True)


def toy_rank(cands: list[ToyCandidate]) -> list[ToyCandidate]:
    return sorted(cands, key=lambda c: (c.predicted_time_s, c.found_in_task, c.equivalence["state"]))


def toy_resume(task: ToyTask, data: dict[str, int]) -> ToyTask:
    return dataclasses.replace(task, skip=int(data["walked"]))


TOY = SearchCore(
    enumerate_tasks=toy_enumerate,
    run_task=toy_run_task,
    rank_candidates=toy_rank,
    candidate_type=ToyCandidate,
    stats_type=ToyStats,
)
TOY_RESUMABLE = dataclasses.replace(TOY, resume_task=toy_resume)


# ============================================================================================ helpers


def summary(r: SearchResult) -> tuple[Any, ...]:
    """Everything that must not depend on workers, kills or resumes."""
    cands = [
        (json.dumps(c.ugraph.to_json(), sort_keys=True), c.predicted_time_s, c.equivalence, c.found_in_task)
        for c in r.candidates
    ]
    return (cands, r.stats, r.tasks_done, r.tasks_total, r.complete)


def expected(spec: ToySpec) -> tuple[list[Any], ToyStats]:
    """The answer computed without the runner: every task in order, ranked."""
    results = [toy_run_task(spec, t) for t in toy_enumerate(spec)]
    cands = toy_rank([c for r in results for c in r.candidates])
    stats = functools.reduce(lambda a, b: a + b, (r.stats for r in results), ToyStats())
    return [(c.predicted_time_s, c.found_in_task, c.equivalence["state"]) for c in cands], stats


def spawn_search(
    spec: ToySpec,
    ckpt: Path,
    workers: int,
    *,
    budget: float | None = None,
    core: str = "TOY",
    save_every_s: float = 60.0,
) -> subprocess.Popen[str]:
    """A separate Python process running the toy search (to kill it)."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "import json\n"
        "import test_runner\n"
        "from test_runner import ToySpec\n"
        "from gensorage.exhaustive.run.runner import run_search, SearchInterrupted\n"
        "spec = ToySpec(**json.loads(sys.argv[2]))\n"
        "budget = None if sys.argv[5] == 'none' else float(sys.argv[5])\n"
        "try:\n"
        "    r = run_search(spec, checkpoint=sys.argv[3], workers=int(sys.argv[4]), core=getattr(test_runner, sys.argv[6]),\n"
        "                   time_budget_s=budget, save_every_s=float(sys.argv[7]), inline_s=0)\n"
        "except SearchInterrupted as exc:\n"
        "    print('INTERRUPTED', exc.result.tasks_done, flush=True); sys.exit(130)\n"
        "print('DONE', r.tasks_done, r.complete, flush=True)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            code,
            str(TESTS),
            json.dumps(dataclasses.asdict(spec)),
            str(ckpt),
            str(workers),
            "none" if budget is None else str(budget),
            core,
            str(save_every_s),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_for_done(path: Path, at_least: int, proc: subprocess.Popen[str], timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        n = done_tasks(path) if path.exists() else 0
        if n >= at_least:
            return n
        if proc.poll() is not None:
            raise AssertionError(f"search exited early: {proc.communicate()}")
        time.sleep(0.02)
    raise AssertionError(f"no {at_least} tasks done within {timeout} s")


# ============================================================================================== tests


def test_one_worker_and_two_workers_match_the_direct_answer(tmp_path: Path) -> None:
    spec = ToySpec(n_tasks=5, per_task=15)
    r1 = run_search(spec, checkpoint=tmp_path / "a.sqlite", workers=1, core=TOY, progress=False)
    r2 = run_search(spec, checkpoint=tmp_path / "b.sqlite", workers=2, core=TOY, progress=False)
    pool = run_search(spec, checkpoint=tmp_path / "c.sqlite", workers=2, core=TOY, progress=False, inline_s=0)
    assert summary(r1) == summary(r2) == summary(pool)
    want_cands, want_stats = expected(spec)
    assert [
        (c.predicted_time_s, c.found_in_task, c.equivalence["state"]) for c in r1.candidates
    ] == want_cands
    assert r1.stats == want_stats and r1.complete and r1.tasks_done == 5
    assert r1.best is r1.candidates[0]
    from gensorage.ugraph import KernelGraph

    assert isinstance(r2.best.ugraph, KernelGraph)  # read back from the checkpoint as a real µGraph
    assert r1.stopped_by is None and r1.tasks_resumed == 0


def test_resume_reruns_only_tasks_not_done(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    spec = ToySpec(n_tasks=6, per_task=10, sleep_s=0.02, log_dir=str(logs))
    ckpt = tmp_path / "c.sqlite"
    first = run_search(spec, checkpoint=ckpt, workers=1, core=TOY, progress=False, time_budget_s=0.5)
    assert not first.complete and first.stopped_by == "time budget"
    assert 0 < first.tasks_done < 6
    second = run_search(spec, checkpoint=ckpt, workers=1, core=TOY, progress=False)
    assert second.complete and second.tasks_resumed == first.tasks_done
    runs = sorted(p.name.split("-")[0] for p in logs.iterdir())
    assert runs == [f"task{i}" for i in range(6)]  # each task completed exactly once over both runs
    # A finished checkpoint answers at once, without running anything.
    again = run_search(spec, checkpoint=ckpt, workers=2, core=TOY, progress=False)
    assert summary(again) == summary(second) and again.tasks_resumed == 6
    assert len(list(logs.iterdir())) == 6
    fresh = run_search(spec, checkpoint=tmp_path / "fresh.sqlite", workers=1, core=TOY, progress=False)
    assert summary(second) == summary(fresh)


def test_kill_9_at_any_moment_then_resume_gives_the_same_result(tmp_path: Path) -> None:
    spec = ToySpec(n_tasks=8, per_task=8, sleep_s=0.03)
    # Sleeping changes nothing but the time, so the reference runs without it.
    reference = run_search(
        dataclasses.replace(spec, sleep_s=0.0),
        checkpoint=tmp_path / "ref.sqlite",
        workers=1,
        core=TOY,
        progress=False,
    )
    ckpt = tmp_path / "killed.sqlite"
    done = 0
    # Kill twice (the second run resumes the first's file), each time right after a new task commits,
    # once with the pool and once inline, then let a third run finish.
    for workers in (2, 1):
        proc = spawn_search(spec, ckpt, workers)
        done = wait_for_done(ckpt, done + 1, proc)
        children = psutil.Process(proc.pid).children(recursive=True)
        assert len(children) >= (workers if workers > 1 else 0)  # the pool's workers and resource tracker
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert proc.returncode == -signal.SIGKILL
        # Orphaned workers notice and exit instead of waiting for tasks forever.
        _, alive = psutil.wait_procs(children, timeout=15)
        assert not alive, alive
    assert done < spec.n_tasks
    resumed = run_search(spec, checkpoint=ckpt, workers=1, core=TOY, progress=False)
    assert resumed.tasks_resumed >= 2
    assert summary(resumed) == summary(reference)


@pytest.mark.parametrize("workers", [1, 2])
def test_kill_9_mid_task_keeps_the_last_save_point(tmp_path: Path, workers: int) -> None:
    # One long task per worker saves where it is every 0.1 s; kill -9 the search mid-task, resume: the resumed
    # run walks only what the last save point had not covered, and the result is the uninterrupted one.
    spec = ToySpec(n_tasks=workers, per_task=150, sleep_s=0.02, seed=5)  # 3 s per task
    ckpt = tmp_path / "k.sqlite"
    proc = spawn_search(spec, ckpt, workers, core="TOY_RESUMABLE", save_every_s=0.1)
    deadline = time.monotonic() + 30
    saved = 0
    while saved < workers and time.monotonic() < deadline:
        time.sleep(0.1)
        try:
            with closing(sqlite3.connect(f"file:{ckpt}?mode=ro", uri=True, timeout=5)) as conn:
                saved = conn.execute("SELECT COUNT(*) FROM partial").fetchone()[0]
        except sqlite3.Error:
            pass
    time.sleep(0.3)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert saved == workers and done_tasks(ckpt) == 0
    resumed = run_search(spec, checkpoint=ckpt, workers=1, core=TOY_RESUMABLE, progress=False)
    assert 0 < resumed.run_stats["states"] < spec.n_tasks * spec.per_task
    reference = run_search(
        spec, checkpoint=tmp_path / "ref.sqlite", workers=1, core=TOY_RESUMABLE, progress=False
    )
    assert summary(resumed) == summary(reference)


def found_in_first_states(spec: ToySpec, task: int, walked: int) -> list[Any]:
    """What the toy task ``task`` finds in its first ``walked`` states, as (time, task, state), ranked."""
    start = task * spec.per_task
    return [
        (1e-6 * (1 + (h >> 8) % 500), task, i)
        for i in range(start, start + walked)
        if (h := _hash(spec.seed, i)) % 4 == 0
    ]


def ranked(r: SearchResult) -> list[Any]:
    return [(c.predicted_time_s, c.found_in_task, c.equivalence["state"]) for c in r.candidates]


@pytest.mark.parametrize("core", [TOY, TOY_RESUMABLE], ids=["redone", "resumable"])
def test_time_budget_stops_the_running_task_and_returns_what_it_found(
    tmp_path: Path, core: SearchCore
) -> None:
    # A budget shorter than one task: nothing is done, and the result holds the stopped task's candidates
    # (a long task's finds are not lost to its budget); only a resumable core keeps them in the checkpoint.
    spec = ToySpec(n_tasks=3, per_task=40, sleep_s=0.05)  # 2 s per task
    t0 = time.monotonic()
    r = run_search(
        spec, checkpoint=tmp_path / "t.sqlite", workers=1, core=core, progress=False, time_budget_s=0.5
    )
    took = time.monotonic() - t0
    assert not r.complete and r.stopped_by == "time budget" and r.tasks_done == 0
    walked = r.run_stats["states"]
    assert 0 < walked < 40  # task 0 was running and was stopped, not finished
    found = sorted(found_in_first_states(spec, 0, walked))
    assert found, "the toy's first states hold candidates (the seed is fixed)"
    assert ranked(r) == found and r.best is not None
    assert took < 1.9
    assert done_tasks(tmp_path / "t.sqlite") == 0
    with closing(sqlite3.connect(tmp_path / "t.sqlite")) as conn:
        kept = conn.execute("SELECT COUNT(*) FROM candidates").fetchone()[0]
    assert kept == (len(found) if core is TOY_RESUMABLE else 0)


def test_a_budget_stopped_search_returns_done_and_stopped_tasks_candidates(tmp_path: Path) -> None:
    # Two tasks done, the third stopped midway: the result is both; the resumed run completes to the reference.
    spec = ToySpec(n_tasks=4, per_task=20, sleep_s=0.02, seed=5)  # 0.4 s per task
    ckpt = tmp_path / "t.sqlite"
    r = run_search(spec, checkpoint=ckpt, workers=1, core=TOY_RESUMABLE, progress=False, time_budget_s=1.0)
    assert not r.complete and 1 <= r.tasks_done < 4
    walked = r.run_stats["states"] - r.tasks_done * spec.per_task
    found = [c for t in range(r.tasks_done) for c in found_in_first_states(spec, t, spec.per_task)]
    found += found_in_first_states(spec, r.tasks_done, walked)
    assert ranked(r) == sorted(found)
    again = run_search(spec, checkpoint=ckpt, workers=1, core=TOY_RESUMABLE, progress=False)
    assert again.complete and ranked(again) == expected(spec)[0]


def test_a_split_task_stopped_by_the_budget_returns_its_pieces_candidates(tmp_path: Path) -> None:
    # On a cluster a long task is split into pieces run apart; when the budget stops them the checkpoint keeps
    # the split point only, and the result still holds what the finished and the stopped pieces found.
    spec = ToySpec(n_tasks=2, per_task=10, seed=7)
    tasks = toy_enumerate(spec)
    ckpt = Checkpoint.open(
        tmp_path / "t.sqlite",
        spec_key=spec.key(),
        spec_json=spec.to_json(),
        tasks=[dataclasses.asdict(t) for t in tasks],
    )
    with ckpt:
        run = SearchRun(TOY_RESUMABLE, spec, tasks, ckpt, ProgressReporter(enabled=False), 0.0, None, 60.0)
        row = functools.partial(CandidateRow, 1, ugraph=ToyGraph(3).to_json(), found_in_task=1)
        done_piece = Outcome(1, True, {}, [row(0, predicted_time_s=2e-6, equivalence={"state": 11})], 0.1)
        stopped_piece = Outcome(1, False, {}, [row(0, predicted_time_s=1e-6, equivalence={"state": 15})], 0.1)
        run.parts[1] = [Part(tasks[1], done=done_piece), Part(tasks[1])]
        run._ended(_Job(1, run.parts[1][1], 0.0), stopped_piece, deque(), may_continue=False)
        r = run.result()
    assert not r.complete and r.tasks_done == 0
    assert ranked(r) == [(1e-6, 1, 15), (2e-6, 1, 11)]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_task_stopped_by_the_budget_continues_where_it_stopped(tmp_path: Path, workers: int) -> None:
    # Budget-limited runs stop tasks midway; each later run continues them, so the states walked over all runs
    # add up to the search's exactly (nothing redone) and the result equals an uninterrupted run's.
    spec = ToySpec(n_tasks=3, per_task=40 * workers, sleep_s=0.02, seed=3)  # 0.8 s per task and worker
    ckpt = tmp_path / "r.sqlite"
    walked, stopped_midway = [], 0
    budget = 0.5 if workers == 1 else 2.0  # spawned workers need about a second to start
    while True:
        r = run_search(
            spec,
            checkpoint=ckpt,
            workers=workers,
            core=TOY_RESUMABLE,
            progress=False,
            time_budget_s=budget,
            inline_s=0,
        )
        walked.append(r.run_stats["states"])
        if r.complete:
            break
        assert r.stopped_by == "time budget" and len(walked) < 20
        with closing(sqlite3.connect(ckpt)) as conn:
            stopped_midway += conn.execute("SELECT COUNT(*) FROM partial").fetchone()[0]
    assert len(walked) >= 2 and stopped_midway >= 1
    assert sum(walked) == spec.n_tasks * spec.per_task
    reference = run_search(
        spec, checkpoint=tmp_path / "ref.sqlite", workers=1, core=TOY_RESUMABLE, progress=False
    )
    assert summary(r) == summary(reference)
    with closing(sqlite3.connect(ckpt)) as conn:
        assert conn.execute("SELECT COUNT(*) FROM partial").fetchone()[0] == 0  # every stop point was used up


def test_a_core_without_resume_redoes_a_stopped_task(tmp_path: Path) -> None:
    spec = ToySpec(n_tasks=1, per_task=40, sleep_s=0.02)
    ckpt = tmp_path / "r.sqlite"
    first = run_search(spec, checkpoint=ckpt, workers=1, core=TOY, progress=False, time_budget_s=0.3)
    again = run_search(spec, checkpoint=ckpt, workers=1, core=TOY, progress=False)
    assert first.run_stats["states"] > 0 and again.run_stats["states"] == spec.per_task
    assert summary(again) == summary(
        run_search(spec, checkpoint=tmp_path / "ref.sqlite", workers=1, core=TOY, progress=False)
    )


def test_a_small_search_starts_no_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # With two workers, a search that ends within the inline time runs in this process only.
    def no_pool(*a: object, **k: object) -> None:
        raise AssertionError("a worker process was started")

    monkeypatch.setattr(SearchRun, "run_pool", no_pool)
    spec = ToySpec(n_tasks=4, per_task=5)
    r = run_search(spec, checkpoint=tmp_path / "s.sqlite", workers=2, core=TOY, progress=False, inline_s=60)
    assert r.complete and summary(r) == summary(
        run_search(spec, checkpoint=tmp_path / "ref.sqlite", workers=1, core=TOY, progress=False)
    )


@pytest.mark.parametrize("core", ["TOY", "TOY_RESUMABLE"])
def test_inline_then_pool_gives_the_same_result(tmp_path: Path, core: str) -> None:
    # The inline time ends inside a task: a resumable core saves it and a worker continues it, another starts it
    # afresh; either way the result is the one-process answer and every task ran (the pool was needed).
    toy = globals()[core]
    spec = ToySpec(n_tasks=4, per_task=20, sleep_s=0.02, seed=5)  # 0.4 s per task
    r = run_search(spec, checkpoint=tmp_path / "p.sqlite", workers=2, core=toy, progress=False, inline_s=0.5)
    reference = run_search(spec, checkpoint=tmp_path / "ref.sqlite", workers=1, core=toy, progress=False)
    assert r.complete and summary(r) == summary(reference)
    with pytest.raises(ConfigError, match="inline time"):
        run_search(spec, checkpoint=tmp_path / "x.sqlite", workers=2, core=toy, inline_s=-1)


def test_time_budget_with_a_pool(tmp_path: Path) -> None:
    spec = ToySpec(n_tasks=6, per_task=20, sleep_s=0.05)  # 1 s per task, 3 s of work per worker
    t0 = time.monotonic()
    r = run_search(
        spec,
        checkpoint=tmp_path / "t.sqlite",
        workers=2,
        core=TOY,
        progress=False,
        time_budget_s=1.5,
        inline_s=0,
    )
    took = time.monotonic() - t0
    assert not r.complete and r.stopped_by == "time budget" and r.tasks_done <= 2
    assert took < 1.5 + 10  # stop request honoured (well within the 30 s grace)
    assert done_tasks(tmp_path / "t.sqlite") == r.tasks_done


def test_sigint_stops_cleanly_and_resume_completes(tmp_path: Path) -> None:
    spec = ToySpec(n_tasks=6, per_task=10, sleep_s=0.04)
    ckpt = tmp_path / "i.sqlite"
    proc = spawn_search(spec, ckpt, 2)
    wait_for_done(ckpt, 1, proc)
    # Ctrl-C reaches the whole foreground process group: parent and workers alike.
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert out.startswith("INTERRUPTED")
    assert "Traceback" not in err  # workers ignored the signal
    saved = int(out.split()[1])
    assert 1 <= saved == done_tasks(ckpt) < spec.n_tasks
    resumed = run_search(spec, checkpoint=ckpt, workers=1, core=TOY, progress=False)
    reference = run_search(
        dataclasses.replace(spec, sleep_s=0.0),
        checkpoint=tmp_path / "ref.sqlite",
        workers=1,
        core=TOY,
        progress=False,
    )
    assert resumed.tasks_resumed == saved and summary(resumed) == summary(reference)


def test_interrupt_in_process_raises_with_partial_result(tmp_path: Path) -> None:
    spec = ToySpec(n_tasks=4, per_task=10)
    calls = []

    def interrupting_run_task(spec: ToySpec, task: ToyTask, **kw: Any) -> ToyResult:
        calls.append(task.index)
        if task.index == 2:
            os.kill(os.getpid(), signal.SIGINT)  # a Ctrl-C while task 2 runs: task 2 is dropped
            time.sleep(0.1)
        return toy_run_task(spec, task, **kw)

    core = dataclasses.replace(TOY, run_task=interrupting_run_task)
    with pytest.raises(SearchInterrupted) as info:
        run_search(spec, checkpoint=tmp_path / "x.sqlite", workers=1, core=core, progress=False)
    res = info.value.result
    assert res.tasks_done == 2 and not res.complete and res.stopped_by == "interrupt"
    assert calls == [0, 1, 2]
    assert "resume" in str(info.value) and str(tmp_path / "x.sqlite") in str(info.value)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler restored


def test_core_error_propagates_and_keeps_finished_tasks(tmp_path: Path) -> None:
    spec = ToySpec(n_tasks=10, per_task=5, sleep_s=0.02, fail_task=5)
    with pytest.raises(ValueError, match="toy failure in task 5"):
        run_search(spec, checkpoint=tmp_path / "f.sqlite", workers=2, core=TOY, progress=False, inline_s=0)
    # Task 5 is dispatched only after two tasks finished; those stay committed, task 5 never is.
    assert 2 <= done_tasks(tmp_path / "f.sqlite") < 10
    conn = sqlite3.connect(tmp_path / "f.sqlite")
    assert conn.execute("SELECT status FROM tasks WHERE idx = 5").fetchone() == ("pending",)
    conn.close()


def test_progress_goes_to_stderr_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = ToySpec(n_tasks=3, per_task=5)
    run_search(spec, checkpoint=tmp_path / "p.sqlite", workers=1, core=TOY, progress=True)
    out, err = capsys.readouterr()
    assert out == ""
    assert str(tmp_path / "p.sqlite") in err  # the header says where the work is kept
    assert "tasks 3/3" in err and "states 15" in err and "ETA 0:00" in err
    run_search(spec, checkpoint=tmp_path / "q.sqlite", workers=1, core=TOY, progress=False)
    assert capsys.readouterr() == ("", "")


def test_default_checkpoint_lives_under_gensorage_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GENSORAGE_HOME", str(tmp_path / "home"))
    spec = ToySpec(n_tasks=2, per_task=3)
    r = run_search(spec, workers=1, core=TOY, progress=False)
    assert r.checkpoint_path == tmp_path / "home" / "checkpoints" / f"{spec.key()}.sqlite"
    assert r.checkpoint_path.is_file()


def test_a_default_checkpoint_of_another_task_list_is_kept_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The same spec (same key) split differently, as after an upgrade that changed the search code.
    monkeypatch.setenv("GENSORAGE_HOME", str(tmp_path / "home"))
    spec = ToySpec(n_tasks=3, per_task=2)
    first = run_search(spec, workers=1, core=TOY, progress=False)
    other = dataclasses.replace(TOY, enumerate_tasks=lambda sp: toy_enumerate(sp)[:2])
    with pytest.raises(StoreError, match="different task list"):  # a path the user passed stays theirs
        run_search(spec, checkpoint=first.checkpoint_path, workers=1, core=other, progress=False)
    again = run_search(spec, workers=1, core=other, progress=True)
    err = capsys.readouterr().err
    aside = first.checkpoint_path.with_name(f"{spec.key()}.stale-1.sqlite")
    assert again.complete and again.tasks_total == 2 and again.checkpoint_path == first.checkpoint_path
    assert aside.is_file() and f"kept it as {aside.name}, starting afresh" in err


def test_bad_arguments_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="workers"):
        run_search(ToySpec(), checkpoint=tmp_path / "w.sqlite", workers=0, core=TOY)
    with pytest.raises(ConfigError, match="time budget"):
        run_search(ToySpec(), checkpoint=tmp_path / "w.sqlite", time_budget_s=0, core=TOY)


def test_real_core_one_and_two_workers_match_the_serial_search(tmp_path: Path) -> None:
    from gensorage.exhaustive import search_serial
    from gensorage.exhaustive.spec import SearchSpec
    from gensorage.program import parse_program

    program = parse_program("program one\ninput A [2, 4] float16\nD = exp(A)\noutput D\n")
    spec = SearchSpec(program=program, max_kernel_ops=1, max_block_ops=1)
    r1 = run_search(spec, checkpoint=tmp_path / "a.sqlite", workers=1, progress=False)
    r2 = run_search(spec, checkpoint=tmp_path / "b.sqlite", workers=2, progress=False)
    serial = search_serial(spec)
    assert r1.complete and r2.complete and serial.complete and serial.best is not None
    for r in (r1, r2):
        assert [(c.ugraph.to_json(), c.predicted_time_s, c.found_in_task) for c in r.candidates] == [
            (c.ugraph.to_json(), c.predicted_time_s, c.found_in_task) for c in serial.candidates
        ]
        assert r.stats.logical() == serial.stats.logical()
        assert (r.tasks_done, r.tasks_total, r.complete) == (serial.tasks_done, serial.tasks_total, True)
    assert [c.equivalence for c in r1.candidates] == [c.equivalence for c in r2.candidates]


def test_progress_formatting() -> None:
    from gensorage.exhaustive.run.progress import Snapshot, eta_s, format_count, format_line, format_seconds

    assert (format_count(999), format_count(1234), format_count(2_500_000)) == ("999", "1.23k", "2.5M")
    assert (format_seconds(75.2), format_seconds(3725), format_seconds(None)) == ("1:15", "1:02:05", "?")
    snap = Snapshot(
        {"states": 10, "pruned_expr": 3, "pruned_shape": 2, "verified": 1},
        tasks_done=6,
        tasks_total=10,
        tasks_done_this_run=2,
        tasks_running=2,
        best_time_s=2.5e-6,
        elapsed_s=20.0,
    )
    assert eta_s(snap) == 40.0  # 10 s per task this run, 4 tasks left
    line = format_line(snap)
    assert "tasks 6/10 (2 running)" in line and "pruned 5 (expr 3, shape 2, mem 0)" in line
    assert "best 2.5 µs" in line and "ETA 0:40" in line
    assert eta_s(Snapshot({}, 6, 10, 0, 0, None, 5.0)) is None
    short = format_line(snap, compact=True)  # the terminal form: no pruning breakdown, same facts
    assert "pruned 5 |" in short and "expr" not in short and "ETA 0:40" in short and len(short) < len(line)


def test_final_progress_line_is_not_repeated() -> None:
    """An update and the final line in the same second show the same facts: the line is written once (a log
    used to end with it twice); a change of facts is always written."""
    import io

    from gensorage.exhaustive.run.progress import ProgressReporter, Snapshot

    out = io.StringIO()
    rep = ProgressReporter(stream=out, tty=False, interval_s=0.0)
    snap = Snapshot(
        {"states": 10},
        tasks_done=2,
        tasks_total=2,
        tasks_done_this_run=2,
        tasks_running=0,
        best_time_s=None,
        elapsed_s=3.0,
    )
    rep.update(snap)
    rep.finish(snap)
    assert out.getvalue().count("search: ") == 1
    rep.finish(dataclasses.replace(snap, elapsed_s=4.0))
    assert out.getvalue().count("search: ") == 2


# ====================================================================================== the main guard

_SCRIPT = """\
import sys
import gensorage

def main():
    r = gensorage.superoptimize("mlp", mode="full", workers=2, preset=sys.argv[1], checkpoint=sys.argv[2],
                                use_store=False)
    print("DONE", r.complete, flush=True)

{call}
"""
# A run that used to crash now and then (a stop inside a replayed candidate's check when the parent's inline
# phase ended): two kernels, a search long enough that the pool does start. It runs at the search shapes: what
# is tested ends with the search (the choice's re-instantiation of its 74 structures at larger shapes cost
# about a tenth of the test's CPU time and tested nothing here).
_PRESET = """\
program = "mlp"
[search_params]
t = 2
k = 8
f = 16
[run_params]
t = 2
k = 8
f = 16
[search]
max_kernel_ops = 2
max_block_ops = 4
"""
# Without the guard the search runs in the script's process, no pool: a one-kernel search shows that as well.
_PRESET_IN_PROCESS = _PRESET.replace("max_kernel_ops = 2", "max_kernel_ops = 1")


# The guarded run starts the pool for a two-kernel search (33 s idle): in the slow run; the pool's stop and
# resume are in the default run (test_parallel_first, test_cluster), the guard's detection below.
@pytest.mark.parametrize("guarded", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_a_script_with_or_without_the_main_guard_runs_full_mode_with_workers(
    guarded: bool, tmp_path: Path
) -> None:
    # Without the guard, spawned workers would import the script and start the search again in each (a
    # recursive-spawn traceback); the search then runs in the script's process, with a one-line note why.
    script = tmp_path / "user_script.py"
    script.write_text(_SCRIPT.format(call='if __name__ == "__main__":\n    main()' if guarded else "main()"))
    (tmp_path / "p.toml").write_text(_PRESET if guarded else _PRESET_IN_PROCESS)
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "p.toml"), str(tmp_path / "c.sqlite")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(ROOT), GENSORAGE_HOME=str(tmp_path / "home")),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("DONE True") and "Traceback" not in proc.stderr
    notes = [line for line in proc.stderr.splitlines() if "__main__" in line]
    header = next(
        line for line in proc.stderr.splitlines() if line.startswith("gensorage search") and "tasks," in line
    )
    if guarded:
        assert notes == [] and ", 2 workers" in header
    else:
        assert len(notes) == 1 and str(script) in notes[0] and "searching in this process" in notes[0]
        assert ", 1 worker" in header


@pytest.mark.parametrize(
    ("source", "guarded"),
    [
        ("if __name__ == '__main__':\n    here()\n", True),
        ("if '__main__' == __name__: here()\n", True),
        ("def f():\n    here()\n\nif __name__ == '__main__':\n    f()\n", True),
        ("here()\n", False),
        ("def f():\n    here()\n\nf()\n", False),
        ("if __name__ != 'x':\n    here()\n", False),
        ("if True:\n    here()\n", False),
    ],
)
def test_the_main_guard_is_read_off_the_calling_line(
    source: str, guarded: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import types

    from gensorage.exhaustive.run.processes import unguarded_main_script

    path = tmp_path / "s.py"
    path.write_text(source)
    main = types.ModuleType("__main__")
    main.__file__ = str(path)
    found: list[str | None] = []
    main.here = lambda: found.append(unguarded_main_script())  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "__main__", main)
    exec(compile(source, str(path), "exec"), vars(main))  # noqa: S102 - the test's own text
    assert found == [None if guarded else str(path)]
    found.clear()
    main.here()  # type: ignore[attr-defined]  # not from the script's top level
    assert found == [None]

"""Full mode on a Dask cluster (run_search(cluster=...)): the same candidates as one process, a worker or the
driver killed mid-search, long tasks split among idle workers, mismatched workers and bad addresses refused.

The searches are real and small (a few seconds of walking). ``WHOLE`` is the real core with the whole search
as one task, so one long task is what the workers share: a kill lands inside it, and splitting has work to do.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from checkpoint_rows import done_tasks, partial_rows

from gensorage.errors import ConfigError
from gensorage.exhaustive import SearchResult, SearchSpec, run_search
from gensorage.exhaustive.results import Task
from gensorage.exhaustive.run.core import default_core
from gensorage.program import Program

distributed = pytest.importorskip("distributed")

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


def whole_search(spec: SearchSpec) -> list[Task]:
    """The whole search as one task (the root's subtree)."""
    return [Task(0, ())]


WHOLE = dataclasses.replace(default_core(), enumerate_tasks=whole_search)


def held_after_first_save(
    marker: str, spec: SearchSpec, task: Task, *, on_save: Any = None, **kwargs: Any
) -> Any:
    """WHOLE's job, which the first process to reach a save point (it creates ``marker``) then holds for up to a
    minute: the kill lands while the job runs, however fast the machine. Without the process's subtree memo
    (``run_task``, same candidates and logical counters) and saving every 0.05 s, so a worker that walked this
    search before still reaches a save point before it finishes."""
    from gensorage.exhaustive.walk import tasks

    def save(result: Any) -> None:
        if on_save is not None:
            on_save(result)  # the save point reaches the driver first
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:  # the job continued elsewhere: run on
            return
        time.sleep(60)

    kwargs["save_every_s"] = min(kwargs.get("save_every_s", 60.0), 0.05)
    return tasks.run_task(spec, task, on_save=save, **kwargs)


def exp_matmul() -> Program:
    p = Program("exp_matmul")
    x = p.input("X", (2, 3))
    w = p.input("W", (3, 4))
    p.output(p.matmul(p.exp(x), w))
    return p


SPEC = SearchSpec(program=exp_matmul(), max_kernel_ops=2, max_block_ops=2, max_grid_dims=1)


def digest(r: SearchResult) -> str:
    """A hash of the ranked candidates: µGraph, predicted time, task that found it."""
    rows = [(c.ugraph.to_json(), c.predicted_time_s, c.found_in_task) for c in r.candidates]
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> dict[str, SearchResult]:
    """Both searches in this process (the reference)."""
    d = tmp_path_factory.mktemp("ref")
    return {
        "tasks": run_search(SPEC, checkpoint=d / "t.sqlite", workers=1, progress=False),
        "whole": run_search(SPEC, checkpoint=d / "w.sqlite", workers=1, progress=False, core=WHOLE),
    }


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A LocalCluster of two worker processes (their nannies restart a killed one) and a client on it."""
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(TESTS)])  # workers import this module
    try:
        lc = distributed.LocalCluster(
            n_workers=2,
            processes=True,
            threads_per_worker=1,
            host="127.0.0.1",
            dashboard_address=None,
            silence_logs=50,
        )
        client = distributed.Client(lc)
        yield client
        client.close()
        lc.close()
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old


def test_local_n_matches_one_process(tmp_path: Path, one_process: dict[str, SearchResult]) -> None:
    r = run_search(SPEC, checkpoint=tmp_path / "c.sqlite", cluster="local:2", inline_s=0, progress=False)
    ref = one_process["tasks"]
    assert r.complete and ref.complete and len(r.candidates) > 5
    assert digest(r) == digest(ref)
    assert r.stats.logical() == ref.stats.logical()


def test_a_long_task_is_split_among_idle_workers(
    tmp_path: Path, cluster: Any, one_process: dict[str, SearchResult]
) -> None:
    with distributed.get_task_stream(cluster) as stream:
        r = run_search(
            SPEC,
            checkpoint=tmp_path / "c.sqlite",
            cluster=cluster.scheduler.address,
            core=WHOLE,
            inline_s=0,
            split_after_s=0.3,
            save_every_s=0.2,
            progress=False,
        )
    assert r.complete and r.tasks_split >= 1
    assert digest(r) == digest(one_process["whole"])
    jobs = [t for t in stream.data if str(t["key"]).startswith("gensorage-")]
    assert len(jobs) > 2 and len({t["worker"] for t in jobs}) == 2, "the pieces ran on both workers"


def test_a_worker_killed_mid_task_is_continued_elsewhere(
    tmp_path: Path, cluster: Any, one_process: dict[str, SearchResult]
) -> None:
    ckpt = tmp_path / "c.sqlite"
    killed: list[int] = []

    def kill_the_busy_worker() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not partial_rows(ckpt):
            time.sleep(0.02)  # until the job's first save point reached the driver
        busy = [w for w, keys in cluster.processing().items() if keys]
        pids = cluster.run(os.getpid, workers=busy)
        for pid in pids.values():
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    killer = threading.Thread(target=kill_the_busy_worker)
    killer.start()
    log = io.StringIO()
    held = functools.partial(held_after_first_save, str(tmp_path / "held"))
    r = run_search(
        SPEC,
        checkpoint=ckpt,
        cluster=cluster.scheduler.address,
        core=dataclasses.replace(WHOLE, run_task=held),
        inline_s=0,
        split_after_s=None,
        save_every_s=0.2,
        progress_stream=log,
    )
    killer.join()
    ref = one_process["whole"]
    assert killed and r.complete
    assert "continues on another worker from its last save point" in log.getvalue()
    assert digest(r) == digest(ref)
    assert r.stats.logical() == ref.stats.logical(), "nothing counted twice"


def test_the_driver_killed_then_rerun_resumes_from_the_checkpoint(
    tmp_path: Path, one_process: dict[str, SearchResult]
) -> None:
    ckpt = tmp_path / "c.sqlite"
    code = (
        "import sys\n"
        "from test_cluster import SPEC\n"
        "from gensorage.exhaustive import run_search\n"
        "if __name__ == '__main__':\n"
        "    run_search(SPEC, checkpoint=sys.argv[1], cluster='local:2', inline_s=0, progress=False)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS)]))
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(ckpt)], env=env, start_new_session=True, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 90
        while done_tasks(ckpt) < 5:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no task done in time"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and the cluster it started
        proc.wait()
    before = done_tasks(ckpt)
    r = run_search(SPEC, checkpoint=ckpt, workers=1, progress=False)
    ref = one_process["tasks"]
    assert r.complete and r.tasks_resumed == before and before < r.tasks_total
    assert digest(r) == digest(ref)
    assert r.stats.logical() == ref.stats.logical()


def test_ctrl_c_on_a_local_cluster_stops_at_once_and_resumes(
    tmp_path: Path, one_process: dict[str, SearchResult]
) -> None:
    # A terminal's Ctrl-C reaches the whole process group, the cluster's worker processes included: they must
    # leave it to the driver, which stops their jobs, keeps what they did and raises SearchInterrupted.
    ckpt = tmp_path / "c.sqlite"
    code = (
        "import sys\n"
        "from test_cluster import SPEC\n"
        "from gensorage.exhaustive import SearchInterrupted, run_search\n"
        "if __name__ == '__main__':\n"
        "    try:\n"
        "        run_search(SPEC, checkpoint=sys.argv[1], cluster='local:2', inline_s=0, progress=False)\n"
        "    except SearchInterrupted as exc:\n"
        "        print('INTERRUPTED', exc.result.tasks_done, flush=True)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS)]))
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(ckpt)],
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90
        while done_tasks(ckpt) < 3:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no task done in time"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=25)  # well within the 30 s grace for jobs that ignore a stop
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert out.startswith("INTERRUPTED") and "Traceback" not in err, (out, err)
    r = run_search(SPEC, checkpoint=ckpt, workers=1, progress=False)
    assert r.complete and r.tasks_resumed >= 3
    assert digest(r) == digest(one_process["tasks"])


def _set_version(version: str) -> str:
    import gensorage

    old, gensorage.__version__ = gensorage.__version__, version
    return old


def test_a_worker_of_another_version_is_refused(tmp_path: Path, cluster: Any) -> None:
    worker = sorted(cluster.scheduler_info()["workers"])[0]
    old = cluster.run(_set_version, "0.0.0-other", workers=[worker])[worker]
    try:
        with pytest.raises(ConfigError, match=f"worker {worker} has gensorage version 0.0.0-other"):
            run_search(SPEC, checkpoint=tmp_path / "c.sqlite", cluster=cluster.scheduler.address, inline_s=0)
    finally:
        cluster.run(_set_version, old, workers=[worker])


def test_a_worker_that_joins_after_the_check_is_refused_by_its_first_job(
    tmp_path: Path, cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The check at connect sees the workers there then; one that joins later meets the check every job makes.
    from gensorage.exhaustive.run import cluster as engine

    monkeypatch.setattr(engine, "_check_workers", lambda *args: None)
    old = cluster.run(_set_version, "0.0.0-late")
    try:
        with pytest.raises(
            ConfigError, match="worker tcp://.* has gensorage version 0.0.0-late, this driver"
        ):
            run_search(SPEC, checkpoint=tmp_path / "c.sqlite", cluster=cluster.scheduler.address, inline_s=0)
    finally:
        for worker, version in old.items():
            cluster.run(_set_version, version, workers=[worker])


@pytest.mark.parametrize(
    ("cluster", "message"),
    [
        ("local:0", "local:N needs N >= 1"),
        ("local:x", "local:N needs N >= 1"),
        ("", "expected a scheduler address"),
        ("nowhere", "not a scheduler address"),
    ],
)
def test_bad_addresses_are_config_errors(tmp_path: Path, cluster: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        run_search(SPEC, checkpoint=tmp_path / "c.sqlite", cluster=cluster)
    assert not (tmp_path / "c.sqlite").exists(), "refused before any work"


def test_an_unreachable_scheduler_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gensorage.exhaustive.run import cluster

    monkeypatch.setattr(cluster, "CONNECT_TIMEOUT_S", 1.0)
    with pytest.raises(ConfigError, match="cannot reach a Dask scheduler at tcp://127.0.0.1:9"):
        run_search(SPEC, checkpoint=tmp_path / "c.sqlite", cluster="tcp://127.0.0.1:9", inline_s=0)


def test_the_missing_extra_and_workers_with_a_cluster_are_config_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError, match="workers .* or cluster, not both"):
        run_search(SPEC, checkpoint=tmp_path / "c.sqlite", cluster="local:2", workers=2)
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'gensorage\[distributed\]'"):
        run_search(SPEC, checkpoint=tmp_path / "c.sqlite", cluster="local:2")


@pytest.mark.parametrize("command", ["search", "superopt"])
def test_the_cli_says_what_is_wrong_with_the_cluster_in_one_line(
    tmp_path: Path, command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gensorage.cli import main

    monkeypatch.setenv("GENSORAGE_HOME", str(tmp_path))
    prog = tmp_path / "one.gsp"
    prog.write_text("program one\ninput A [2, 4] float16\nD = exp(A)\noutput D\n")
    code = main([command, str(prog), "--cluster", "local:0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0
    assert len(err) == 1 and "local:N needs N >= 1" in err[0]

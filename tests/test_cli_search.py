"""``gensorage search`` on the real exhaustive core at tiny limits: output, exit codes, resume, Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gensorage.cli import main
from gensorage.exhaustive import enumerate_tasks, search_serial
from gensorage.exhaustive.results import WORK_COUNTERS
from gensorage.exhaustive.spec import SearchSpec
from gensorage.program import load_program

ROOT = Path(__file__).resolve().parents[1]

# exp then a row sum: with only exp allowed nothing can compute it.
TWO = "program two\ninput A [4, 8] float16\nB = exp(A)\nD = sum(B, dim=1)\noutput D\n"
TINY = ["--max-kernel-ops", "1", "--max-block-ops", "1", "--workers", "1"]
# Tens of tasks, a few seconds in all: long enough to be interrupted half-way. With exp alone every reuse of A breaks
# the occurrence budget (A occurs once in exp(A)) and the search is tiny; add switches that rule off. Four block
# operators took ~35 s a run since the max and online-softmax accumulators joined the space; three take ~6 s.
LONGER = ["--max-kernel-ops", "2", "--max-block-ops", "3", "--ops", "exp,add", "--workers", "1"]

# `prog` (tests/conftest.py): ONE in a file, with GENSORAGE_HOME in the test's tmp_path.


def n_tasks(path: Path, **limits: object) -> int:
    """The number of tasks the search of the program at ``path`` splits into."""
    return len(enumerate_tasks(SearchSpec(program=load_program(path), **limits)))  # type: ignore[arg-type]


ONE_TASKS = {"max_kernel_ops": 1, "max_block_ops": 1}
LONGER_TASKS = {"max_kernel_ops": 2, "max_block_ops": 3, "ops": ("exp", "add")}


def done_tasks(path: Path) -> tuple[int, int]:
    """(done, total) tasks of a checkpoint; (0, 0) while it is still being created."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    try:
        done = conn.execute("SELECT COUNT(*) FROM tasks WHERE status = 'done'").fetchone()[0]
        total = conn.execute("SELECT COUNT(*) FROM tasks").fetchone()[0]
    except sqlite3.OperationalError:
        return 0, 0
    finally:
        conn.close()
    return int(done), int(total)


def test_json_result_matches_the_serial_search(prog: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", str(prog), *TINY, "--json", "--top", "3"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["complete"] and doc["tasks_done"] == doc["tasks_total"] == n_tasks(prog, **ONE_TASKS)
    assert "search:" not in err  # --json: no progress
    serial = search_serial(SearchSpec(program=load_program(prog), max_kernel_ops=1, max_block_ops=1))
    assert serial.best is not None
    assert doc["best"]["ugraph"] == serial.best.ugraph.to_json()
    assert doc["best"]["predicted_time_s"] == serial.best.predicted_time_s
    assert doc["num_candidates"] == len(serial.candidates) and len(doc["top"]) == min(
        3, len(serial.candidates)
    )
    # Work counters depend on what the process ran before (subtree memo, shared oracle); the others do not.
    assert doc["stats"] == {**serial.stats.to_json(), **{k: doc["stats"][k] for k in WORK_COUNTERS}}


def test_text_output_progress_on_stderr_and_resume(prog: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", str(prog), *TINY]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("# µGraph #1: predicted ") and "exp(" in out
    n = n_tasks(prog, **ONE_TASKS)
    assert f"{n}/{n}" in out and "search: tasks" not in out
    ckpt = Path(os.environ["GENSORAGE_HOME"]) / "checkpoints"
    assert f"checkpoint {ckpt}" in err and f"search: tasks {n}/{n}" in err
    # The same command again reads the finished checkpoint and prints the same result.
    assert main(["search", str(prog), *TINY]) == 0
    out2, err2 = capsys.readouterr()
    assert f"{n} already done (resuming)" in err2
    assert out2.split("; this run")[0] == out.split("; this run")[0]


def test_nothing_found_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GENSORAGE_HOME", str(tmp_path))
    (tmp_path / "two.gsp").write_text(TWO)
    assert (
        main(
            [
                "search",
                str(tmp_path / "two.gsp"),
                "--max-kernel-ops",
                "1",
                "--max-block-ops",
                "2",
                "--ops",
                "exp",
                "--workers",
                "1",
            ]
        )
        == 1
    )
    out, err = capsys.readouterr()
    assert "# no µGraph found" in out and "found no µGraph" in err


def test_time_budget_exits_1_and_says_incomplete(prog: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", str(prog), *LONGER, "--time-budget", "0.3"]) == 1
    out, err = capsys.readouterr()
    assert "(incomplete)" in out and "search incomplete" in err and "run the same command again" in err


def test_bad_input_exit_codes(prog: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", "no_such_program_config"]) == 6
    assert main(["search", str(prog), "--hw", "no_such_gpu"]) == 6
    assert main(["search", str(prog), "--max-block-ops", "0"]) == 6
    assert main(["search", str(prog), *TINY, "--top", "0"]) == 6
    capsys.readouterr()
    ck = tmp_path / "shared.sqlite"
    assert main(["search", str(prog), *TINY, "--checkpoint", str(ck), "--json"]) == 0
    assert (
        main(
            [
                "search",
                str(prog),
                "--max-kernel-ops",
                "2",
                "--max-block-ops",
                "1",
                "--workers",
                "1",
                "--checkpoint",
                str(ck),
            ]
        )
        == 7
    )
    err = capsys.readouterr().err
    assert "belongs to a different search" in err
    assert len(set(re.findall(r"\b[0-9a-f]{24}\b", err))) == 2  # both spec keys named
    bad = tmp_path / "garbage.sqlite"
    bad.write_bytes(b"\x00not sqlite\xff" * 500)
    assert main(["search", str(prog), *TINY, "--checkpoint", str(bad)]) == 7
    assert str(bad) in capsys.readouterr().err


@pytest.mark.parametrize("as_json", [False, True])
def test_ctrl_c_exits_130_keeps_the_checkpoint_and_resume_completes(
    as_json: bool, prog: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ck = tmp_path / "run.sqlite"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gensorage",
            "search",
            str(prog),
            *LONGER,
            "--checkpoint",
            str(ck),
            *(["--json"] if as_json else []),
        ],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if ck.exists() and done_tasks(ck)[0] >= 1:
                break
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # a failed test leaves no search running
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "run the same command again to resume" in err and str(ck) in err
    assert "Traceback" not in err
    if as_json:  # what was found so far, marked incomplete
        doc = json.loads(out)
        assert doc["complete"] is False and doc["checkpoint"] == str(ck) and doc["tasks_done"] >= 1
    else:
        assert out == ""
    done, total = done_tasks(ck)
    assert 1 <= done < total == n_tasks(prog, **LONGER_TASKS)
    if as_json:  # the resume is the same with either output; checked once
        return
    assert main(["search", str(prog), *LONGER, "--checkpoint", str(ck), "--json"]) == 0
    resumed = json.loads(capsys.readouterr().out)
    assert main(["search", str(prog), *LONGER, "--checkpoint", str(tmp_path / "fresh.sqlite"), "--json"]) == 0
    fresh = json.loads(capsys.readouterr().out)
    for doc in (resumed, fresh):
        del doc["elapsed_s"], doc["checkpoint"]
        for name in WORK_COUNTERS:  # work done depends on which tasks shared a process (subtree memo)
            del doc["stats"][name]
    assert resumed == fresh and resumed["complete"]


def test_no_replicated_writes_reaches_the_spec(prog: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", str(prog), *TINY, "--json"]) == 0
    wide = json.loads(capsys.readouterr().out)
    assert main(["search", str(prog), *TINY, "--json", "--no-replicated-writes"]) == 0
    narrow = json.loads(capsys.readouterr().out)
    assert "replicated_writes" not in wide["spec"] and narrow["spec"]["replicated_writes"] is False
    assert narrow["spec_key"] != wide["spec_key"]  # its own checkpoint


def test_block_graph_limits_and_order_reach_the_spec(prog: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flags = [
        "--max-block-graphs",
        "1",
        "--graph-defined-last",
        "--fused-first",
        "--parallel-first",
        "--program-ops-first",
    ]
    assert main(["search", str(prog), *TINY, "--json", *flags]) == 0
    spec = json.loads(capsys.readouterr().out)["spec"]
    assert (
        spec["max_block_graphs"] == 1 and spec["graph_defined_last"] is True and spec["fused_first"] is True
    )
    assert spec["parallel_first"] is True and spec["program_ops_first"] is True

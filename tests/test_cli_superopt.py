"""``gensorage superopt``: modes, output forms, exit codes and one-line errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import gensorage
from gensorage.cli import main
from gensorage.program import dump_program, parse_program
from gensorage.superopt import StructureRecord, StructureStore
from gensorage.ugraph.examples import rmsnorm_matmul

ROOT = Path(__file__).resolve().parents[1]

SOFTMAX = """program softmax
param m = 4
param n = 16
input X [m, n] float32
E = exp(X)
O = div(E, sum(E, dim=1))
output O
"""
TWO_MATMULS = """program two_matmuls
input A [4, 8] float32
input B [8, 16] float32
input C [16, 4] float32
O = matmul(matmul(A, B), C)
output O
"""
TINY_PRESET = """program = "softmax"
time_budget_s = 120
[run_params]
m = 4
n = 16
[search]
max_kernel_ops = 1
max_block_ops = 3
max_grid_dims = 1
max_block_inputs = 2
max_block_outputs = 1
"""


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GENSORAGE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture()
def softmax_file(tmp_path: Path) -> Path:
    path = tmp_path / "softmax.gsp"
    path.write_text(SOFTMAX)
    return path


def _rmsnorm32_with_structure(tmp_path: Path) -> tuple[Path, Path]:
    """A float32 RMSNorm program file and a store holding the paper's fused structure for it."""
    path = tmp_path / "rmsnorm32.gsp"
    path.write_text((ROOT / "configs" / "programs" / "rmsnorm.gsp").read_text().replace("float16", "float32"))
    small = parse_program(path.read_text(), {"b": 4, "h": 16, "d": 12})
    _, graph = rmsnorm_matmul(4, 16, 12, blocks=3, forloop=4, dtype="float32")
    db = tmp_path / "store.sqlite"
    with StructureStore(db) as st:
        st.put(
            StructureRecord(
                small.structure_key(),
                "h100",
                gensorage.__version__,
                dump_program(small),
                dict(small.params),
                (graph,),
                1.0,
                1.0,
            )
        )
    return path, db


def test_fast_mode_from_a_stored_structure_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, db = _rmsnorm32_with_structure(tmp_path)
    code = main(
        [
            "superopt",
            str(path),
            "--param",
            "b=8",
            "--param",
            "h=32",
            "--param",
            "d=64",
            "--mode",
            "fast",
            "--store",
            str(db),
            "--json",
        ]
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    data = json.loads(out.out)
    assert data["from_store"] and data["verified"] and data["num_kernels"] == 1 and data["mode"] == "fast"
    assert data["params"] == {"b": 8, "h": 32, "d": 64}
    assert "superopt:" in out.err  # progress goes to stderr


def test_nothing_better_than_direct_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "two_matmuls.gsp"  # nothing row fusion groups
    path.write_text(TWO_MATMULS)
    code = main(["superopt", str(path), "--mode", "fast", "--no-store", "--quiet"])
    out = capsys.readouterr()
    assert code == 1
    assert "2 kernel(s)" in out.out and "direct µGraph used" in out.out
    assert out.err == ""  # --quiet
    code = main(["superopt", str(path), "--mode", "fast", "--no-store", "--quiet", "--emit", "tir"])
    out = capsys.readouterr()
    assert code == 1 and "prim_func" in out.out and "2 kernel(s)" in out.err  # the summary moves to stderr


def test_fast_mode_without_a_store_fuses_rows(softmax_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["superopt", str(softmax_file), "--mode", "fast", "--no-store", "--quiet"])
    out = capsys.readouterr()
    assert code == 0  # better than one kernel per op: exp, sum and div in one row kernel
    assert "1 kernel(s) (direct: 3)" in out.out and "direct µGraph (row-fused) used" in out.out


def test_full_mode_then_emit(softmax_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    preset = tmp_path / "tiny.toml"
    preset.write_text(TINY_PRESET)
    out_file = tmp_path / "kernels.cu"
    code = main(
        [
            "superopt",
            str(softmax_file),
            "--preset",
            str(preset),
            "--workers",
            "1",
            "--emit",
            "cuda",
            "--out",
            str(out_file),
            "--quiet",
        ]
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "__global__" in out_file.read_text() and "1 kernel(s)" in out.out
    # The structure is in the default store now ($GENSORAGE_HOME): fast mode at a new shape finds it.
    code = main(
        [
            "superopt",
            str(softmax_file),
            "--param",
            "m=16",
            "--param",
            "n=64",
            "--mode",
            "fast",
            "--emit",
            "dot",
            "--quiet",
        ]
    )
    out = capsys.readouterr()
    assert code == 0
    assert out.out.startswith("digraph") and "re-used the stored structure" in out.err


def test_a_preset_without_a_program_runs_its_program(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "programs").mkdir()
    (tmp_path / "programs" / "softmax.gsp").write_text(SOFTMAX)
    monkeypatch.setenv("GENSORAGE_CONFIG_DIR", str(tmp_path))
    preset = tmp_path / "tiny.toml"
    preset.write_text(TINY_PRESET.replace("time_budget_s = 120", 'modes = ["fast", "full"]'))
    code = main(["superopt", "--preset", str(preset), "--workers", "1", "--json", "--quiet"])
    out = capsys.readouterr()
    assert code == 0, out.err
    data = json.loads(out.out)
    assert data["mode"] == "full" and data["program"] == "softmax" and data["num_kernels"] == 1
    assert [r["mode"] for r in data["earlier_runs"]] == ["fast"]


@pytest.mark.parametrize(
    ("argv", "code", "match"),
    [
        (["superopt", "no_such_program"], 6, "no program file or bundled config"),
        (["superopt", "missing/file.gsp"], 6, "no such program file"),
        (["superopt", "rmsnorm", "--param", "b"], 6, "NAME=VALUE"),
        (["superopt", "rmsnorm", "--param", "zz=2"], 6, "zz"),
        (["superopt", "rmsnorm", "--workers", "0"], 6, "--workers"),
        (["superopt", "rmsnorm", "--time-budget", "-3"], 6, "--time-budget"),
        (["superopt", "rmsnorm", "--delta", "2"], 6, "--delta"),
        (["superopt", "rmsnorm", "--out", "x.cu"], 6, "--out needs --emit"),
        (["superopt", "rmsnorm", "--hw", "tpu9000", "--mode", "fast"], 6, "hardware profile"),
        (["superopt", "rmsnorm", "--preset", "no_such_preset"], 6, "unknown preset"),
    ],
)
def test_bad_input_is_one_line_with_its_exit_code(
    argv: list[str], code: int, match: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == code
    err = capsys.readouterr().err.strip()
    assert err.startswith("gensorage: error:") and match in err and "\n" not in err


def test_a_malformed_program_file_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.gsp"
    bad.write_text("input X [4, 4]\nO = matmul(X, Y)\noutput O\n")
    code = main(["superopt", str(bad), "--mode", "fast", "--no-store"])
    err = capsys.readouterr().err.strip()
    assert code in (3, 6) and err.startswith("gensorage: error:") and "bad.gsp" in err and "\n" not in err


def test_ctrl_c_exits_130_and_keeps_the_checkpoint(tmp_path: Path, _home: Path) -> None:
    """A real SIGINT during a search that runs for many minutes (RMSNorm+MatMul, two kernels: 725 tasks): exit
    130, the checkpoint file exists, what was found so far is reported on stdout.

    The search must be long: a gated-MLP search used here once finished in a second, so the signal landed
    while the result was being lowered, which reported nothing (now it reports the direct µGraph there too).
    """
    ckpt = tmp_path / "ckpt.sqlite"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GENSORAGE_HOME": str(_home)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gensorage",
            "superopt",
            "rmsnorm",
            "--workers",
            "1",
            "--checkpoint",
            str(ckpt),
            "--time-budget",
            "600",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=str(tmp_path),
    )
    assert proc.stderr is not None
    try:
        deadline = time.monotonic() + 120
        for line in proc.stderr:  # wait until the search itself runs
            if (line.startswith("gensorage search") and "checkpoint" in line) or time.monotonic() > deadline:
                break
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:  # a failed test leaves no search running
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err and ckpt.is_file()
    assert "program rmsnorm" in out  # what was found so far is still reported
    assert "stopped by interrupt" in out  # the signal landed in the search


def test_a_shape_larger_than_the_device_is_an_error_not_a_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "huge.gsp"
    path.write_text("program huge\ninput X [99999999999, 99999999] float16\nY = exp(X)\noutput Y\n")
    code = main(["superopt", str(path), "--mode", "fast", "--no-store", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 5  # UGraphError's
    assert err.startswith("gensorage: error: no kernels:") and "device memory" in err and "\n" not in err

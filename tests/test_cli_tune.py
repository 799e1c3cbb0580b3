"""``gensorage tune``: workloads from ids / --op --shape / the default, outputs, store flags, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gensorage.cli import main
from gensorage.cli.tune import parse_shape
from gensorage.errors import ConfigError


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENSORAGE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GENSORAGE_CONFIG_DIR", raising=False)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["tune", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def errors(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("gensorage: error:")]


def test_default_workload_and_store(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, out, err = run(capsys, "--method", "roller", "--json")
    assert rc == 0 and not errors(err)
    data = json.loads(out)
    assert data["workload"].startswith("gemm(M=1024,N=1024,K=1024)") and data["hw"] == "h100"
    assert data["from_store"] is False and (tmp_path / "home" / "store.sqlite").is_file()
    assert "tuning gemm" in err  # progress goes to stderr
    rc, out, _ = run(capsys, "--method", "roller", "--json")
    assert rc == 0 and json.loads(out)["from_store"] is True
    rc, out, _ = run(capsys, "--method", "roller", "--json", "--no-store")
    assert rc == 0 and json.loads(out)["from_store"] is False
    store = tmp_path / "elsewhere.sqlite"
    rc, out, _ = run(capsys, "--method", "roller", "--json", "--store", str(store))
    assert rc == 0 and json.loads(out)["from_store"] is False and store.is_file()


def test_config_id_with_trials_and_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "M2", "--method", "random", "--trials", "30", "--seed", "2", "--no-store")
    assert rc == 0
    assert "gemm(M=65536,N=1024,K=4)" in out and "random (seed 2, trials=30)" in out
    assert "T1 (block)" in out and "predicted" in out


def test_op_shape_emit_and_check(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "--op",
        "conv2d",
        "--shape",
        "N=1,C=8,H=13,W=13,F=16,KH=3,KW=3,stride=2,padding=1",
        "--dtype",
        "float32",
        "--no-store",
        "--method",
        "roller",
    ]
    rc, out, _ = run(capsys, *args, "--emit", "cuda")
    assert rc == 0 and "__global__" in out and "__shared__" in out and "blockIdx.x" in out
    rc, out, _ = run(capsys, *args, "--emit", "tir")
    assert rc == 0 and "T.prim_func" in out and "threadIdx.x" in out
    rc, out, _ = run(capsys, *args, "--check", "--json")
    data = json.loads(out)
    assert rc == 0 and data["check"]["ok"] is True and data["check"]["max_rel_error"] < 1e-4
    assert data["params"]["stride_h"] == 2 and data["dtype"] == "float32"


def test_failed_check_exits_1_with_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import gensorage.tuning.result as tune_mod

    monkeypatch.setattr(tune_mod, "relative_error", lambda out, ref: 0.5)  # as if the kernel were wrong
    rc, out, err = run(
        capsys,
        "--op",
        "gemm",
        "--shape",
        "M=32,N=32,K=32",
        "--dtype",
        "float32",
        "--method",
        "roller",
        "--check",
        "--no-store",
    )
    assert rc == 1
    assert errors(err) == [
        "gensorage: error: check failed: CPU result differs from the reference by 0.5 (tolerance 0.0001)"
    ]
    assert "FAILED" in out


@pytest.mark.parametrize(
    ("argv", "message", "code"),
    [
        (["--op", "matmul3d"], "unknown op 'matmul3d'", 6),
        (["--op", "gemm", "--shape", "M=1,N"], "--shape: expected NAME=INT", 6),
        (["--op", "gemm", "--shape", "M=1,N=x,K=3"], "--shape: expected NAME=INT", 6),
        (["--op", "gemm", "--shape", "M=4,N=4"], "field 'K': missing", 6),
        (["--op", "gemm", "--shape", "M=4,N=4,K=0"], "field 'K'", 6),
        (["--shape", "M=4"], "--shape needs --op", 2),
        (["M1", "--op", "gemm"], "either CONFIG_ID or --op", 2),
        (["Q7"], "unknown op config 'Q7'", 6),
        (["--hw", "h999"], "unknown hardware profile 'h999'", 6),
        (["--method", "ansor"], "unknown method 'ansor'", 2),
        (["--method", "markov", "--trials", "10"], "--trials applies to optuna and random", 2),
        (["--emit", "ptx"], "--emit: expected one of cuda, tir", 2),
        (["--dtype", "int4"], "unsupported dtype 'int4'", 6),
    ],
)
def test_bad_input_is_one_line_and_nonzero(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str, code: int
) -> None:
    rc, out, err = run(capsys, *argv, "--no-store")
    assert rc == code and out == ""
    lines = errors(err)
    assert len(lines) == 1 and message in lines[0] and len(err.strip().splitlines()) <= 2


def test_parse_shape() -> None:
    assert parse_shape("M=1024, N=8,stride=2:1") == {"M": 1024, "N": 8, "stride": [2, 1]}
    for bad in ("M", "=3", "M=1:2:3", "M=1,M=2", "1M=3"):
        with pytest.raises(ConfigError):
            parse_shape(bad)


def test_module_entry_point(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gensorage", "tune", "--op", "nosuch", "--no-store"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert proc.returncode == 6 and proc.stdout == ""
    assert proc.stderr.strip().splitlines()[-1].startswith("gensorage: error: --op/--shape: field 'op'")

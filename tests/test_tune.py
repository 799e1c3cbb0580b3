"""The tune() API: methods, the store round trip and bypass, lazily derived CUDA/TIR, CPU check, GPU runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import gensorage.workloads as workloads
from gensorage.codegen.cuda_build import cuda_device_available
from gensorage.errors import (
    ConfigError,
    DeviceError,
    GensorageError,
    ScheduleError,
    StoreError,
    VerificationError,
)
from gensorage.hw.loader import load_profile
from gensorage.store import Store
from gensorage.tuning import TuneResult, check_tolerance, relative_error, tune

SMALL = workloads.gemm(96, 80, 72, dtype="float32")


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENSORAGE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GENSORAGE_CONFIG_DIR", raising=False)


def test_store_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    first = tune(SMALL, "h100", "markov", seed=3, store=path)
    assert not first.from_store and first.construction_time_s > 0 and first.evaluated and first.evaluated > 0
    again = tune(SMALL, "h100", "markov", seed=3, store=path)
    assert again.from_store and again.schedule == first.schedule
    assert again.predicted_time_s == first.predicted_time_s
    assert again.construction_time_s == first.construction_time_s and again.evaluated == first.evaluated
    # A different seed is a different key; a Store object works as well as a path.
    with Store(path) as st:
        assert not tune(SMALL, "h100", "markov", seed=4, store=st).from_store
        assert st.count_schedules() == 2


def test_bypassing_the_store(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    tune(SMALL, "h100", "roller", store=path)
    bypass = tune(SMALL, "h100", "roller", store=path, use_store=False)
    assert not bypass.from_store
    with Store(path) as st:
        assert st.count_schedules() == 1
    tune(workloads.gemv(64, 64, dtype="float32"), "h100", "roller", use_store=False)
    assert not (tmp_path / "home" / "store.sqlite").exists()  # the default store was never opened


def test_default_store_location(tmp_path: Path) -> None:
    assert not tune(SMALL, "h100", "roller").from_store
    assert (tmp_path / "home" / "store.sqlite").is_file()
    assert tune(SMALL, "h100", "roller").from_store


def test_options_are_part_of_the_key(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    a = tune(SMALL, "h100", "random", trials=20, store=path)
    b = tune(SMALL, "h100", "random", trials=40, store=path)
    assert not a.from_store and not b.from_store and a.options == {"trials": 20}
    assert tune(SMALL, "h100", "random", trials=20, store=path).from_store


def test_config_id_and_profile_object() -> None:
    r = tune("M2", load_profile("a100"), "roller", use_store=False)
    assert r.workload.name == "gemm" and dict(r.workload.params) == {"M": 65536, "N": 1024, "K": 4}
    assert r.hw.name == "a100"


def test_bad_arguments() -> None:
    with pytest.raises(GensorageError, match="unknown method 'annealing'"):
        tune(SMALL, "h100", "annealing", use_store=False)
    with pytest.raises(ConfigError, match="unknown op config 'Z9'"):
        tune("Z9", use_store=False)
    with pytest.raises(ConfigError, match="nohw"):
        tune(SMALL, "nohw", use_store=False)
    with pytest.raises(ScheduleError, match="unknown option"):
        tune(SMALL, "h100", "roller", use_store=False, trials=5)


def test_corrupt_store_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    path.write_bytes(b"\x00garbage" * 100)
    with pytest.raises(StoreError, match=str(path)):
        tune(SMALL, store=path)
    assert not tune(SMALL, "h100", "roller", store=path, use_store=False).from_store


def test_derived_artifacts_and_check() -> None:
    r = tune(
        workloads.conv2d(1, 8, 14, 14, 16, 3, 3, stride=2, padding=1, dtype="float32"),
        "h100",
        "markov",
        use_store=False,
    )
    src = r.cuda_source()
    assert "__global__" in src and "__shared__" in src and r.cuda_source() is src  # cached
    assert "T.thread_binding" in r.tir() and "blockIdx.x" in r.tir()
    assert r.check(seed=1) < check_tolerance("float32")
    xs = workloads.random_inputs(r.workload, 2)
    np.testing.assert_allclose(r.run(*xs), r.workload.reference(*xs), rtol=1e-5, atol=1e-5)
    data = r.to_json()
    assert json.loads(json.dumps(data)) == data
    assert (
        data["method"] == "markov"
        and data["from_store"] is False
        and data["schedule"] == r.schedule.to_json()
    )
    assert data["threads_per_block"] >= 1 and data["grid_blocks"] >= 1 and data["predicted_tflops"] > 0
    with pytest.raises(GensorageError, match="unknown run target"):
        r.run(*xs, target="tpu")


def test_check_fails_on_a_wrong_kernel() -> None:
    r = tune(SMALL, "h100", "roller", use_store=False)
    wrong = workloads.gemm(96, 80, 72, dtype="float32")
    # Same loop nest, different mathematics: the reference of another op.
    object.__setattr__(wrong, "reference", lambda a, b: a @ b + 1.0)
    bad = TuneResult(wrong, r.hw, r.method, r.seed, {}, r.schedule, r.predicted_time_s, 0.0, None, False)
    with pytest.raises(VerificationError, match="differs from the reference"):
        bad.check()
    assert bad.check(raise_on_mismatch=False) > check_tolerance("float32")


def test_relative_error() -> None:
    ref = np.array([[1.0, -4.0], [2.0, 0.5]])
    assert relative_error(ref, ref) == 0.0
    assert relative_error(ref + 0.04, ref) == pytest.approx(0.01)
    assert relative_error(np.zeros(3), np.zeros(3)) == 0.0
    assert relative_error(np.full(2, np.nan), np.ones(2)) == float("inf")
    assert relative_error(np.ones(3), np.ones(2)) == float("inf")


@pytest.mark.skipif(cuda_device_available() is None, reason="a CUDA GPU is present")
def test_cuda_run_without_gpu_is_a_device_error() -> None:
    r = tune(SMALL, "h100", "roller", use_store=False)
    with pytest.raises(DeviceError, match="cannot run gemm on CUDA"):
        r.run(*workloads.random_inputs(SMALL, 0), target="cuda")


@pytest.mark.skipif(cuda_device_available() is not None, reason="needs a CUDA GPU")
def test_cuda_run_matches_reference_on_gpu() -> None:
    r = tune(SMALL, "h100", "markov", use_store=False)
    xs = workloads.random_inputs(SMALL, 0)
    np.testing.assert_allclose(r.run(*xs, target="cuda"), SMALL.reference(*xs), rtol=1e-4, atol=1e-4)

"""Hardware profiles, their validation, GPU detection and the ``gensorage hw`` CLI."""

from __future__ import annotations

import json
import os
import stat
import sys
import tomllib
import types
from pathlib import Path

import pytest

from gensorage.cli import main
from gensorage.errors import ConfigError
from gensorage.hw import (
    HwProfile,
    MemLevel,
    detect,
    list_profiles,
    load_profile,
    match_profile,
    parse_nvidia_smi_csv,
    probe,
)
from gensorage.hw.loader import LEVEL_NAMES, profile_from_dict, repo_config_dir, resolve_profile_path
from gensorage.hw.profile import CALIBRATION_KEYS

# gensorage.hw exports the function ``detect``, which shadows the submodule of the same name as an attribute.
detect_mod = sys.modules["gensorage.hw.detect"]
PROFILES = ("a100", "h100", "h200", "rtx4090", "orin-nano")
A100_TOML = (repo_config_dir() / "hw" / "a100.toml").read_text()


@pytest.fixture(autouse=True)
def _no_user_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GENSORAGE_CONFIG_DIR", raising=False)


# ---------------------------------------------------------------------------------------------------------
# The shipped profiles
# ---------------------------------------------------------------------------------------------------------


def test_list_profiles_has_the_five() -> None:
    assert set(PROFILES) <= set(list_profiles())


@pytest.mark.parametrize("name", PROFILES)
def test_profile_loads_and_is_consistent(name: str) -> None:
    p = load_profile(name)
    assert isinstance(p, HwProfile) and p.name == name
    assert tuple(lv.name for lv in p.levels) == LEVEL_NAMES
    assert all(isinstance(lv, MemLevel) for lv in p.levels)
    # Capacities come from the scalar fields.
    assert p.level("dram").capacity_bytes == p.dram_bytes
    assert p.level("l2").capacity_bytes == p.l2_bytes
    assert p.level("shared").capacity_bytes == p.shared_mem_per_sm
    assert p.level("register").capacity_bytes == 4 * p.registers_per_sm
    bws = [lv.bandwidth_Bps for lv in p.levels]
    lats = [lv.latency_cycles for lv in p.levels]
    assert bws == sorted(bws) and lats == sorted(lats, reverse=True)
    for dt in ("float16", "bfloat16", "float32"):
        assert p.flops(dt) > 0
        assert p.flops(dt, tensor_cores=True) >= p.flops(dt)
    assert p.max_threads_per_block <= p.max_threads_per_sm
    assert p.shared_mem_per_block <= p.shared_mem_per_sm


@pytest.mark.parametrize("name", PROFILES)
def test_every_value_has_a_source(name: str) -> None:
    p = load_profile(name)
    tables = ("levels", "peak_flops", "sources", "calibration")
    scalar = [f for f in HwProfile.__dataclass_fields__ if f not in tables]
    expected = set(scalar)
    expected |= {f"levels.{lv}.{k}" for lv in LEVEL_NAMES for k in ("bandwidth_Bps", "latency_cycles")}
    expected |= {f"peak_flops.{dt}.{k}" for dt, _, _ in p.peak_flops for k in ("cuda", "tensor")}
    # The calibration comes from measurements on the GPUs we had; the other profiles use the defaults.
    if name in ("h100", "h200"):
        expected |= {f"calibration.{k}" for k in CALIBRATION_KEYS}
    assert set(dict(p.sources)) == expected


def test_calibration_is_checked() -> None:
    data = tomllib.loads(resolve_profile_path("h200").read_text())
    data["calibration"]["mma_sync_fraction"] = 1.5
    with pytest.raises(ConfigError, match="calibration.mma_sync_fraction"):
        profile_from_dict(data)
    data["calibration"] = {"mma_rate": 1.0}
    with pytest.raises(ConfigError, match="mma_rate"):
        profile_from_dict(data)


@pytest.mark.parametrize(
    ("name", "tag"),
    [("a100", "nvidia/nvidia-a100"), ("h100", "nvidia/nvidia-h100"), ("rtx4090", "nvidia/geforce-rtx-4090")],
)
def test_l2_and_arch_agree_with_tvm_target_tags(name: str, tag: str) -> None:
    from tvm.target import Target

    t = Target(tag)
    p = load_profile(name)
    assert int(t.attrs["l2_cache_size_bytes"]) == p.l2_bytes
    assert str(t.attrs["arch"]).rstrip("a") == p.arch


def test_shared_bandwidth_is_sms_x_bank_bytes_x_clock() -> None:
    for name in PROFILES:
        p = load_profile(name)
        per_clk = p.shared_banks * p.bank_width_bytes
        assert p.level("shared").bandwidth_Bps == pytest.approx(p.sm_count * per_clk * p.clock_hz, rel=1e-6)


def test_profiles_are_cached_and_loadable_by_path() -> None:
    assert load_profile("a100") is load_profile("a100")
    path = repo_config_dir() / "hw" / "h100.toml"
    assert load_profile(str(path)) == load_profile("h100")


def test_unknown_profile_lists_known() -> None:
    with pytest.raises(ConfigError, match=r"unknown hardware profile 'v100'.*a100.*orin-nano"):
        load_profile("v100")


def test_config_dir_env_takes_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "hw").mkdir()
    (tmp_path / "hw" / "a100.toml").write_text(
        A100_TOML.replace('display_name = "NVIDIA A100-SXM4-40GB"', 'display_name = "my A100"')
    )
    (tmp_path / "hw" / "mine.toml").write_text(A100_TOML.replace('name = "a100"', 'name = "mine"'))
    monkeypatch.setenv("GENSORAGE_CONFIG_DIR", str(tmp_path))
    assert load_profile("a100").display_name == "my A100"
    assert "mine" in list_profiles() and "h100" in list_profiles()
    assert load_profile("h100").name == "h100"  # falls back to the repo


# ---------------------------------------------------------------------------------------------------------
# Malformed files: the error names the file and the field
# ---------------------------------------------------------------------------------------------------------


def _write(tmp_path: Path, text: str, name: str = "a100") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("old", "new", "field", "reason"),
    [
        ("sm_count = 108\n", "", "sm_count", "missing"),
        ("sm_count = 108", 'sm_count = "108"', "sm_count", "expected an integer"),
        ("sm_count = 108", "sm_count = true", "sm_count", "expected an integer"),
        ("sm_count = 108", "sm_count = -108", "sm_count", "must be positive"),
        ("clock_hz = 1.41e9", "clock_hz = 1.41", "clock_hz", "not a GPU clock"),
        ("shared_banks = 32", "shared_banks = 33", "shared_banks", "power of two"),
        ("shared_mem_per_block = 166912", "shared_mem_per_block = 200000", "shared_mem_per_block", "exceeds"),
        ("bandwidth_Bps = 7.2192e12", "bandwidth_Bps = 1e9", "levels.l2.bandwidth_Bps", "ordered dram"),
        ("latency_cycles = 29", "latency_cycles = 900", "levels.shared.latency_cycles", "ordered dram"),
        ("latency_cycles = 4\n", "", "levels.register.latency_cycles", "missing"),
        ("cuda = 19.5e12", "cuda = -1.0", "peak_flops.float32.cuda", "must be positive"),
        ("[peak_flops.bfloat16]\ncuda = 39e12\ntensor = 312e12\n", "", "peak_flops.bfloat16", "missing"),
        ('arch = "sm_80"', 'arch = "ampere"', "arch", "CUDA arch"),
        ("sm_count = 108", "sm_count = 108\nsm_cout = 108", "sm_cout", "unknown field"),
        ('sm_count = "NVIDIA', 'smcount = "NVIDIA', "sources.smcount", "names no profile field"),
        ('name = "a100"', 'name = "h100"', "name", "does not match the file name"),
    ],
)
def test_malformed_profile_names_file_and_field(
    tmp_path: Path, old: str, new: str, field: str, reason: str
) -> None:
    assert old in A100_TOML
    path = _write(tmp_path, A100_TOML.replace(old, new, 1))
    with pytest.raises(ConfigError) as info:
        load_profile(path)
    msg = str(info.value)
    assert str(path) in msg and f"'{field}'" in msg and reason in msg, msg
    assert "\n" not in msg


def test_broken_toml_names_file(tmp_path: Path) -> None:
    path = _write(tmp_path, A100_TOML.replace("sm_count = 108", "sm_count = = 108"))
    with pytest.raises(ConfigError, match=r"a100\.toml: invalid TOML.*line"):
        load_profile(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_profile(tmp_path / "nope.toml")


def test_edited_file_is_reloaded(tmp_path: Path) -> None:
    path = _write(tmp_path, A100_TOML)
    assert load_profile(path).sm_count == 108
    path.write_text(A100_TOML.replace("sm_count = 108", "sm_count = 100"))
    os.utime(path, ns=(1, 1))  # a different mtime even on coarse-grained file systems
    assert load_profile(path).sm_count == 100


# ---------------------------------------------------------------------------------------------------------
# Detection
# ---------------------------------------------------------------------------------------------------------

# Lines in the format of `nvidia-smi --query-gpu=name,memory.total,compute_cap --format=csv,noheader`, with
# product names and memory totals as nvidia-smi prints them for these boards.
SMI_LINES = {
    "NVIDIA A100-SXM4-40GB, 40960 MiB, 8.0": ("a100", 40960 * 2**20, (8, 0)),
    "NVIDIA H100 80GB HBM3, 81559 MiB, 9.0": ("h100", 81559 * 2**20, (9, 0)),
    "NVIDIA H200, 143771 MiB, 9.0": ("h200", 143771 * 2**20, (9, 0)),
    "NVIDIA GeForce RTX 4090, 24564 MiB, 8.9": ("rtx4090", 24564 * 2**20, (8, 9)),
    "Orin (nvgpu), [N/A], 8.7": (None, None, (8, 7)),
    "NVIDIA A100-SXM4-80GB, 81920 MiB, 8.0": (None, 81920 * 2**20, (8, 0)),
    "NVIDIA H100 PCIe, 81559 MiB, 9.0": (None, 81559 * 2**20, (9, 0)),
    "NVIDIA GeForce RTX 4090 D, 24564 MiB, 8.9": (None, 24564 * 2**20, (8, 9)),
    "Tesla V100-SXM2-16GB, 16160 MiB": (None, 16160 * 2**20, None),
}


@pytest.mark.parametrize(("line", "expected"), list(SMI_LINES.items()))
def test_parse_nvidia_smi_line(
    line: str, expected: tuple[str | None, int | None, tuple[int, int] | None]
) -> None:
    (gpu,) = parse_nvidia_smi_csv(line + "\n")
    assert (gpu.profile, gpu.memory_bytes, gpu.compute_capability) == expected
    assert gpu.name == line.split(",")[0] and gpu.source == "nvidia-smi"


def test_parse_several_gpus_and_noise() -> None:
    text = "NVIDIA H100 80GB HBM3, 81559 MiB, 9.0\nNVIDIA H100 80GB HBM3, 81559 MiB, 9.0\n\n"
    gpus = parse_nvidia_smi_csv(text)
    assert [g.index for g in gpus] == [0, 1] and all(g.profile == "h100" for g in gpus)
    assert parse_nvidia_smi_csv("No devices were found\n") == []


def test_orin_matched_by_memory() -> None:
    assert match_profile("Orin (nvgpu)", 7 * 2**30) == "orin-nano"
    assert match_profile("Orin (nvgpu)", 32 * 2**30) is None
    assert match_profile("NVIDIA Jetson Orin Nano Developer Kit") == "orin-nano"


def _block_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError


def _fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    exe = tmp_path / "nvidia-smi"
    exe.write_text("#!/bin/sh\n" + script)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ.get("PATH", ""))


def _fake_nvml(monkeypatch: pytest.MonkeyPatch, *, init_error: bool = False) -> None:
    """A stand-in for the pynvml module with the calls detect() makes (names as in nvidia-ml-py)."""
    mod = types.ModuleType("pynvml")

    def init() -> None:
        if init_error:
            raise RuntimeError("NVML Shared Library Not Found")

    mod.nvmlInit = init  # type: ignore[attr-defined]
    mod.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    mod.nvmlDeviceGetCount = lambda: 2  # type: ignore[attr-defined]
    mod.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    mod.nvmlDeviceGetName = lambda h: b"NVIDIA H200" if h == 0 else "NVIDIA A100-SXM4-80GB"  # type: ignore[attr-defined]
    mod.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=150754820096)  # type: ignore[attr-defined]
    mod.nvmlDeviceGetCudaComputeCapability = lambda h: (9, 0) if h == 0 else (8, 0)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", mod)


def test_detect_through_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_nvml(monkeypatch)
    gpus = probe().gpus
    assert [(g.name, g.profile, g.compute_capability, g.source) for g in gpus] == [
        ("NVIDIA H200", "h200", (9, 0), "nvml"),
        ("NVIDIA A100-SXM4-80GB", None, (8, 0), "nvml"),
    ]
    assert detect() == gpus[0] and gpus[0].memory_bytes == 150754820096


def test_nvml_failure_falls_back_to_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_nvml(monkeypatch, init_error=True)
    _fake_smi(tmp_path, monkeypatch, 'echo "NVIDIA A100-SXM4-40GB, 40960 MiB, 8.0"\n')
    found = probe()
    assert found.gpus[0].profile == "a100" and found.gpus[0].source == "nvidia-smi"
    assert found.notes == ("NVML unavailable: NVML Shared Library Not Found",)


def test_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    _block_nvml(monkeypatch)
    monkeypatch.setattr(detect_mod.shutil, "which", lambda _name: None)
    assert detect() is None
    notes = probe().notes
    assert any("NVML unavailable" in n for n in notes) and "nvidia-smi not found" in notes


def test_detect_through_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _block_nvml(monkeypatch)
    _fake_smi(tmp_path, monkeypatch, 'echo "NVIDIA H100 80GB HBM3, 81559 MiB, 9.0"\n')
    gpu = detect()
    assert gpu is not None and gpu.profile == "h100" and gpu.source == "nvidia-smi"


def test_old_driver_without_compute_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _block_nvml(monkeypatch)
    _fake_smi(
        tmp_path,
        monkeypatch,
        'case "$1" in *compute_cap*) echo \'Field "compute_cap" is not a valid field to query.\'; exit 2;; '
        'esac\necho "NVIDIA A100-SXM4-40GB, 40960 MiB"\n',
    )
    gpu = detect()
    assert gpu is not None and gpu.profile == "a100" and gpu.compute_capability is None


def test_nvidia_smi_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _block_nvml(monkeypatch)
    _fake_smi(tmp_path, monkeypatch, "exec sleep 5\n")
    monkeypatch.setattr(detect_mod, "NVIDIA_SMI_TIMEOUT_S", 0.3)
    found = probe()
    assert found.gpus == () and any("timed out" in n for n in found.notes)


def test_nvidia_smi_failure_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _block_nvml(monkeypatch)
    _fake_smi(
        tmp_path, monkeypatch, 'echo "NVIDIA-SMI has failed because it couldn\'t communicate"; exit 9\n'
    )
    found = probe()
    assert found.gpus == () and any("exit 9" in n and "couldn't communicate" in n for n in found.notes)


# ---------------------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------------------


def test_cli_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hw", "list"]) == 0
    out = capsys.readouterr().out
    for name in PROFILES:
        assert name in out
    assert "NVIDIA GeForce RTX 4090" in out and "NVIDIA Jetson Orin Nano 8GB" in out


def test_cli_show_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hw", "show", "a100"]) == 0
    out = capsys.readouterr().out
    assert "sm_count" in out and "108" in out and "1,555.0 GB/s" in out and "Luo et al." in out


def test_cli_show_json_by_path(capsys: pytest.CaptureFixture[str]) -> None:
    path = repo_config_dir() / "hw" / "orin-nano.toml"
    assert main(["hw", "show", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["sm_count"] == 8 and [lv["name"] for lv in data["levels"]] == list(LEVEL_NAMES)
    assert data["peak_flops"]["float32"]["cuda"] == pytest.approx(1.28e12)


def test_cli_show_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hw", "show", "nosuch"]) == ConfigError.exit_code
    err = capsys.readouterr().err
    assert err.startswith("gensorage: error: unknown hardware profile 'nosuch'") and err.count("\n") == 1
    path = _write(tmp_path, A100_TOML.replace("sm_count = 108", "sm_count = 0"))
    assert main(["hw", "show", str(path)]) == ConfigError.exit_code
    assert "'sm_count': must be positive" in capsys.readouterr().err


def test_cli_detect_without_gpu(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _block_nvml(monkeypatch)
    monkeypatch.setattr(detect_mod.shutil, "which", lambda _name: None)
    assert main(["hw", "detect"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("no NVIDIA GPU detected (") and "nvidia-smi not found" in out and "NVML" in out


def test_cli_detect_with_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _block_nvml(monkeypatch)
    _fake_smi(tmp_path, monkeypatch, 'echo "NVIDIA GeForce RTX 4090, 24564 MiB, 8.9"\n')
    assert main(["hw", "detect"]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA GeForce RTX 4090" in out and "compute capability 8.9" in out
    assert "matching profile: rtx4090" in out

"""Detect the local NVIDIA GPU (NVML through ``pynvml`` when importable, else ``nvidia-smi``).

Nothing here needs a GPU to be imported or tested: the ``nvidia-smi`` output parser is a pure function and the
NVML path is only taken when ``pynvml`` imports and initialises.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

NVIDIA_SMI_TIMEOUT_S = 10.0
_QUERY_FULL = "name,memory.total,compute_cap"
_QUERY_OLD = "name,memory.total"  # drivers before ~510 reject the compute_cap field
_MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class DetectedGpu:
    """One GPU as the driver reports it.

    ``memory_bytes`` and ``compute_capability`` are ``None`` where the driver does not report them (Jetson's
    nvidia-smi prints ``[N/A]`` for memory); ``profile`` is the name of the matching hardware profile, if any.
    """

    index: int
    name: str
    memory_bytes: int | None
    compute_capability: tuple[int, int] | None
    profile: str | None
    source: str  # "nvml" | "nvidia-smi"


@dataclass(frozen=True, slots=True)
class Probe:
    """Every GPU found, and why each detection method that found nothing failed."""

    gpus: tuple[DetectedGpu, ...]
    notes: tuple[str, ...]


# (pattern on the lower-cased reported name, profile). Products that share a name prefix but differ in the
# numbers a profile holds (A100 80GB's 2 TB/s HBM2e, H100 PCIe/NVL, H200 NVL, RTX 4090 D/Laptop) are
# deliberately left unmatched rather than mapped to a profile with the wrong bandwidth or SM count.
_NAME_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\ba100\b.*\b40\s?gb\b"), "a100"),
    (re.compile(r"\bh100\b(?!.*\b(pcie|nvl)\b).*\b(sxm|hbm3)\b"), "h100"),
    (re.compile(r"\bh200\b(?!.*\bnvl\b)"), "h200"),
    (re.compile(r"\brtx 4090\b(?!\s*(d|laptop)\b)"), "rtx4090"),
    (re.compile(r"\borin nano\b"), "orin-nano"),
)
_ORIN_NANO_MAX_BYTES = 8 * 1024**3


def match_profile(name: str, memory_bytes: int | None = None) -> str | None:
    """Name of the hardware profile matching a reported GPU name, or ``None``.

    Jetson's driver reports only ``"Orin (nvgpu)"``; it is taken as the Orin Nano when the reported memory is
    at most 8 GiB (the AGX Orin / Orin NX modules have more), and left unmatched when memory is unknown.
    """
    low = " ".join(name.lower().split())
    for pattern, profile in _NAME_RULES:
        if pattern.search(low):
            return profile
    if low.startswith("orin") and memory_bytes is not None and memory_bytes <= _ORIN_NANO_MAX_BYTES:
        return "orin-nano"
    return None


def _parse_memory(text: str) -> int | None:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(MiB|GiB|KiB|B)?\s*", text)
    if not m:
        return None  # "[N/A]", "[Not Supported]"
    scale = {"KiB": 1024, "MiB": _MIB, "GiB": 1024**3, "B": 1, None: _MIB}[m.group(2)]
    return int(float(m.group(1)) * scale)


def _parse_cc(text: str) -> tuple[int, int] | None:
    m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def parse_nvidia_smi_csv(text: str) -> list[DetectedGpu]:
    """Parse ``nvidia-smi --query-gpu=name,memory.total[,compute_cap] --format=csv,noheader`` output.

    Lines that do not have at least a name and a memory column are skipped (e.g. "No devices were found").
    """
    gpus: list[DetectedGpu] = []
    for line in text.splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) < 2 or not cols[0]:
            continue
        mem = _parse_memory(cols[1])
        if mem is None and not cols[1].startswith("["):  # not "[N/A]": not a GPU line
            continue
        cc = _parse_cc(cols[2]) if len(cols) > 2 else None
        gpus.append(
            DetectedGpu(
                index=len(gpus),
                name=cols[0],
                memory_bytes=mem,
                compute_capability=cc,
                profile=match_profile(cols[0], mem),
                source="nvidia-smi",
            )
        )
    return gpus


def _probe_nvml() -> tuple[list[DetectedGpu], str | None]:
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return [], "NVML unavailable: pynvml (nvidia-ml-py) is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # pynvml raises NVMLError subclasses; any failure means "no NVML here"
        return [], f"NVML unavailable: {exc}"
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            raw = pynvml.nvmlDeviceGetName(h)
            name = raw.decode() if isinstance(raw, bytes) else str(raw)
            try:
                mem: int | None = int(pynvml.nvmlDeviceGetMemoryInfo(h).total)
            except Exception:  # Jetson's NVML does not report memory
                mem = None
            try:
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
                cc: tuple[int, int] | None = (int(major), int(minor))
            except Exception:
                cc = None
            gpus.append(DetectedGpu(i, name, mem, cc, match_profile(name, mem), "nvml"))
        return gpus, None if gpus else "NVML reports no GPU"
    except Exception as exc:
        return [], f"NVML query failed: {exc}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _run_smi(exe: str, query: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [exe, f"--query-gpu={query}", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=NVIDIA_SMI_TIMEOUT_S,
        check=False,
    )


def _probe_smi() -> tuple[list[DetectedGpu], str | None]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return [], "nvidia-smi not found"
    try:
        proc = _run_smi(exe, _QUERY_FULL)
        if proc.returncode != 0 and "compute_cap" in (proc.stdout + proc.stderr):
            proc = _run_smi(exe, _QUERY_OLD)
    except subprocess.TimeoutExpired:
        return [], f"nvidia-smi timed out after {NVIDIA_SMI_TIMEOUT_S:g} s"
    except OSError as exc:
        return [], f"nvidia-smi could not run: {exc.strerror or exc}"
    gpus = parse_nvidia_smi_csv(proc.stdout) if proc.returncode == 0 else []
    if gpus:
        return gpus, None
    first = next((ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()), "no output")
    return [], f"nvidia-smi found no GPU (exit {proc.returncode}: {first})"


def probe() -> Probe:
    """Query NVML, then ``nvidia-smi``; the first method that finds a GPU wins."""
    notes: list[str] = []
    for method in (_probe_nvml, _probe_smi):
        gpus, note = method()
        if gpus:
            return Probe(tuple(gpus), tuple(notes))
        if note:
            notes.append(note)
    return Probe((), tuple(notes))


def detect() -> DetectedGpu | None:
    """The first local NVIDIA GPU (device 0), or ``None`` when there is none or no way to query it.

    Returns
    -------
    DetectedGpu or None
        Name, memory, compute capability, the matching profile name (``None`` when no profile matches) and
        which method found it.
    """
    found = probe().gpus
    return found[0] if found else None

"""CUDA code generation for scheduled modules: CUDA C via ``tvm.compile``, cubins via nvcc, GPU execution.

``tvm.compile`` for a CUDA target only lowers and prints CUDA C; nothing is compiled to a binary (that
happens when the module is loaded on a GPU machine). ``build_cubin`` runs nvcc offline, which also checks
that the emitted source is valid CUDA for the profile's architecture.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gensorage.errors import DeviceError, ScheduleError

if TYPE_CHECKING:
    import tvm

    from gensorage.hw.profile import HwProfile
    from gensorage.markov.schedule import Schedule
    from gensorage.workloads.workload import Workload


def cuda_target(hw: HwProfile) -> tvm.target.Target:
    """The TVM CUDA target for ``hw``: its arch plus per-block thread and shared-memory limits."""
    import tvm

    return tvm.target.Target(
        {
            "kind": "cuda",
            "arch": hw.arch,
            "max_threads_per_block": hw.max_threads_per_block,
            "max_num_threads": hw.max_threads_per_block,
            "max_shared_memory_per_block": hw.shared_mem_per_block,
            "thread_warp_size": hw.warp_size,
        }
    )


def compile_cuda_module(mod: tvm.IRModule, hw: HwProfile) -> Any:
    """``tvm.compile`` of a thread-bound module for ``hw`` (an Executable; CUDA C inside, no binary yet)."""
    import tvm

    try:
        return tvm.compile(mod, target=cuda_target(hw))
    except (RuntimeError, ValueError) as exc:
        raise ScheduleError(f"CUDA code generation failed: {_last_line(exc)}") from exc


def build_cuda(mod: tvm.IRModule, hw: HwProfile) -> str:
    """CUDA C source of the scheduled module ``mod`` for ``hw``."""
    ex = compile_cuda_module(mod, hw)
    return str(ex.mod.imports[0].inspect_source())


def nvcc_path() -> str | None:
    """The nvcc executable on PATH (or under ``$CUDA_HOME/bin``), or None."""
    found = shutil.which("nvcc")
    if found:
        return found
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
        return os.path.join(home, "bin", "nvcc")
    return None


def cubin_unavailable_reason() -> str | None:
    """Why :func:`build_cubin` cannot produce a cubin here (None when it can)."""
    return None if nvcc_path() else "nvcc not found on PATH (set CUDA_HOME or install the CUDA toolkit)"


def build_cubin(src: str, arch: str) -> bytes | None:
    """Compile CUDA source to a cubin for ``arch`` (e.g. ``"sm_90"``) with nvcc.

    Returns None when nvcc is not available (:func:`cubin_unavailable_reason` says why); raises
    :class:`ScheduleError` when nvcc rejects the source.
    """
    if cubin_unavailable_reason() is not None:
        return None
    import tvm
    from tvm.support import nvcc

    try:
        # nvcc.compile_cuda consults the current target for the compute version, so one must be active.
        with tvm.target.Target({"kind": "cuda", "arch": arch}):
            return bytes(nvcc.compile_cuda(src, target_format="cubin", arch=arch, compiler="nvcc"))
    except (RuntimeError, ValueError, OSError) as exc:
        raise ScheduleError(f"nvcc failed for {arch}: {_error_line(exc)}") from exc


@dataclass(frozen=True, slots=True)
class KernelResources:
    """What ptxas reports for one kernel: registers per thread, static shared memory, stack frame (local arrays
    not in registers) and spills, in bytes."""

    registers: int
    shared_bytes: int
    stack_bytes: int
    spill_stores: int
    spill_loads: int


def ptx_and_resources(src: str, arch: str) -> tuple[str, dict[str, KernelResources]] | None:
    """The PTX of CUDA source ``src`` and ptxas's resource report per kernel (``nvcc -Xptxas -v``).

    Returns None when nvcc is not available; raises :class:`ScheduleError` when nvcc rejects the source.
    """
    nvcc = nvcc_path()
    if nvcc is None:
        return None
    with tempfile.TemporaryDirectory() as d:
        cu = Path(d) / "k.cu"
        cu.write_text(src)
        runs = [
            [nvcc, "--ptx", f"-arch={arch}", "-o", str(Path(d) / "k.ptx"), str(cu)],
            [nvcc, "--cubin", f"-arch={arch}", "-Xptxas", "-v", "-o", str(Path(d) / "k.cubin"), str(cu)],
        ]
        done = [subprocess.run(cmd, capture_output=True, text=True, check=False) for cmd in runs]
        for r in done:
            if r.returncode:
                raise ScheduleError(f"nvcc failed for {arch}: {_error_line(RuntimeError(r.stderr))}")
        return (Path(d) / "k.ptx").read_text(), parse_ptxas_report(done[1].stderr)


def parse_ptxas_report(report: str) -> dict[str, KernelResources]:
    """Per kernel (its entry name) the registers, shared memory and spills of a ``ptxas -v`` report."""
    out: dict[str, KernelResources] = {}
    for block in re.split(r"Compiling entry function '", report)[1:]:
        name = block.split("'", 1)[0]
        spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", block)
        regs = re.search(r"Used (\d+) registers", block)
        smem = re.search(r"(\d+) bytes smem", block)
        stack = re.search(r"(\d+) bytes stack frame", block)
        out[name] = KernelResources(
            int(regs.group(1)) if regs else 0,
            int(smem.group(1)) if smem else 0,
            int(stack.group(1)) if stack else 0,
            int(spills.group(1)) if spills else 0,
            int(spills.group(2)) if spills else 0,
        )
    return out


def cuda_device_available() -> str | None:
    """None when a CUDA device can run TVM modules here, else the reason it cannot."""
    import tvm

    try:
        dev = tvm.cuda(0)
        if not dev.exist:
            return "no CUDA device visible to TVM"
    except (RuntimeError, ValueError) as exc:
        return f"TVM's CUDA runtime is unavailable: {_last_line(exc)}"
    return None


def require_cuda_device(what: str) -> None:
    """Raise :class:`DeviceError` (naming ``what``) unless a CUDA device can run TVM modules here; where it can,
    make TVM compile CUDA modules with nvcc if NVRTC is missing."""
    reason = cuda_device_available()
    if reason is not None:
        raise DeviceError(f"cannot run {what} on CUDA: {reason}")
    _prefer_nvcc_when_nvrtc_missing()


def run_cuda(workload: Workload, schedule: Schedule, hw: HwProfile, *arrays: np.ndarray) -> np.ndarray:
    """Build the thread-bound kernel and run it on GPU 0; raises :class:`DeviceError` without a GPU."""
    import tvm

    from gensorage.codegen.lower_schedule import check_inputs, lower

    require_cuda_device(workload.name)
    inputs = check_inputs(workload, arrays)
    ex = compile_cuda_module(lower(workload, schedule, "cuda", hw=hw), hw)
    dev = tvm.cuda(0)
    out = workload.output
    args = [tvm.runtime.tensor(a, device=dev) for a in inputs]
    result = tvm.runtime.empty(out.shape, out.dtype, dev)
    ex["main"](*args, result)
    dev.sync()
    return np.asarray(result.numpy())


def _prefer_nvcc_when_nvrtc_missing() -> None:
    # TVM loads CUDA modules through NVRTC, which needs the cuda-bindings package; nvcc works without it.
    if "TVM_CUDA_COMPILE_MODE" in os.environ:
        return
    try:
        import cuda.bindings  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        if nvcc_path():
            os.environ["TVM_CUDA_COMPILE_MODE"] = "nvcc"


def _error_line(exc: BaseException) -> str:
    """nvcc's first diagnostic ("...: error: ..."), which names the problem; else the last line."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return next((ln[:300] for ln in lines if "error" in ln and ".cu(" in ln), _last_line(exc))


def _last_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:300]

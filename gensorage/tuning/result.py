"""What :func:`gensorage.tune` returns: a schedule and everything derived from it, computed on demand."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from gensorage.errors import GensorageError, VerificationError
from gensorage.markov.schedule import Schedule

if TYPE_CHECKING:
    from gensorage.hw.profile import HwProfile
    from gensorage.workloads.workload import Workload

# Largest tolerated error of the CPU check, relative to the largest reference magnitude, by output dtype.
# float32 accumulation over K terms drifts by ~sqrt(K) ulps (K = 8192: ~1e-5); 16-bit outputs round at 1e-3.
CHECK_RTOL: dict[str, float] = {"float64": 1e-9, "float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}


def check_tolerance(dtype: str) -> float:
    """Relative tolerance of :meth:`TuneResult.check` for an output of ``dtype`` (exact for integers)."""
    return CHECK_RTOL.get(dtype, 0.0)


@dataclass(frozen=True, slots=True)
class TuneResult:
    """A tuned schedule and everything derived from it (CUDA source, TIR, runs), computed on demand."""

    workload: Workload
    hw: HwProfile
    method: str
    seed: int
    options: dict[str, Any]
    schedule: Schedule
    predicted_time_s: float
    construction_time_s: float  # wall time of the method (as measured when it ran, also for store hits)
    evaluated: int | None  # schedules the method scored with the cost model; None when unknown
    from_store: bool
    _cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def cuda_source(self) -> str:
        """CUDA C of the lowered kernel (lowered, limit-checked and generated once, then cached)."""
        if "cuda" not in self._cache:
            from gensorage.codegen.cuda_build import build_cuda
            from gensorage.codegen.lower_schedule import lower

            self._cache["cuda"] = build_cuda(lower(self.workload, self.schedule, "cuda", hw=self.hw), self.hw)
        return str(self._cache["cuda"])

    def tir(self) -> str:
        """TVMScript text of the scheduled (thread-bound) module."""
        if "tir" not in self._cache:
            from gensorage.codegen.lower_schedule import lower

            self._cache["tir"] = lower(self.workload, self.schedule, "cuda").script()
        return str(self._cache["tir"])

    def run(self, *arrays: np.ndarray, target: str = "cpu") -> np.ndarray:
        """Run the kernel on ``arrays`` (the workload's inputs, in order) and return the output.

        ``target="cpu"`` runs the same schedule without thread bindings through LLVM; ``target="cuda"`` runs
        the CUDA kernel on GPU 0 and raises :class:`DeviceError` where there is none.
        """
        if target in ("cpu", "llvm"):
            from gensorage.codegen.lower_schedule import run_cpu

            return run_cpu(self.workload, self.schedule, *arrays)
        if target in ("cuda", "gpu"):
            from gensorage.codegen.cuda_build import run_cuda

            return run_cuda(self.workload, self.schedule, self.hw, *arrays)
        raise GensorageError(f"unknown run target {target!r} (expected 'cpu' or 'cuda')")

    def check(self, seed: int = 0, *, raise_on_mismatch: bool = True) -> float:
        """Run on random inputs on the CPU and compare with the float64 reference.

        Returns the largest absolute difference divided by the largest reference magnitude. Raises
        :class:`VerificationError` when it exceeds :func:`check_tolerance` of the output dtype (unless
        ``raise_on_mismatch`` is false).
        """
        from gensorage.workloads import random_inputs

        inputs = random_inputs(self.workload, seed)
        out = np.asarray(self.run(*inputs, target="cpu"), dtype=np.float64)
        ref = np.asarray(self.workload.reference(*inputs), dtype=np.float64)
        err = relative_error(out, ref)
        tol = check_tolerance(self.workload.output.dtype)
        if raise_on_mismatch and not err <= tol:
            raise VerificationError(
                f"{self.workload.key()} with the {self.method} schedule: CPU result differs "
                f"from the reference by {err:.3g} (tolerance {tol:.1g})"
            )
        return err

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable summary (no source code)."""
        from gensorage import __version__
        from gensorage.codegen.lower_schedule import axis_tilings

        tilings = axis_tilings(self.workload, self.schedule)
        grid = math.prod(-(-t.extent // t.block_tile) for t in tilings if t.kind == "spatial")
        threads = math.prod(t.threads for t in tilings if t.kind == "spatial")
        t = self.predicted_time_s
        return {
            "workload": self.workload.key(),
            "op": self.workload.name,
            "params": dict(self.workload.params),
            "dtype": self.workload.dtype,
            "hw": self.hw.name,
            "method": self.method,
            "seed": self.seed,
            "options": dict(self.options),
            "schedule": self.schedule.to_json(),
            "grid_blocks": grid,
            "threads_per_block": threads,
            "predicted_time_s": t,
            "predicted_tflops": self.workload.flops / t / 1e12 if t > 0 and math.isfinite(t) else None,
            "construction_time_s": self.construction_time_s,
            "evaluated": self.evaluated,
            "from_store": self.from_store,
            "gensorage_version": __version__,
        }


def relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    """max |out - ref| / max |ref| (absolute when the reference is all zero); inf on shape mismatch/NaN."""
    if out.shape != ref.shape:
        return math.inf
    diff = float(np.max(np.abs(out - ref))) if out.size else 0.0
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    err = diff / scale if scale > 0 else diff
    return err if math.isfinite(err) else math.inf


__all__ = ["CHECK_RTOL", "TuneResult", "check_tolerance", "relative_error"]

"""``tune``: build a schedule for one operator on one GPU profile, lower it, check it, remember it.

>>> from gensorage.tuning import tune
>>> r = tune("M1", hw="h100", method="markov")          # doctest: +SKIP
>>> r.predicted_time_s, r.construction_time_s, r.from_store  # doctest: +SKIP
>>> print(r.cuda_source())                                # doctest: +SKIP

A method (``gensorage.markov.METHODS``: markov, roller, optuna, random) picks the schedule from the cost model
alone; lowering to TVM TIR / CUDA happens lazily when the source or a run is asked for. Results are kept in
the SQLite store (:mod:`gensorage.store`) under (workload, hw, method, seed, options, version), so tuning the
same thing again is a lookup.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gensorage.errors import GensorageError, StoreError, VerificationError
from gensorage.markov.schedule import Schedule
from gensorage.store import ScheduleKey, ScheduleRecord, Store

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
            raise VerificationError(f"{self.workload.key()} with the {self.method} schedule: CPU result differs "
                                    f"from the reference by {err:.3g} (tolerance {tol:.1g})")
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


def resolve_workload(workload: Workload | str) -> Workload:
    """A Workload as given, or the default op configuration with that id (``"M1"``, ``"C2"`` ...)."""
    if isinstance(workload, str):
        from gensorage.workloads import get_op_config

        return get_op_config(workload)
    return workload


def resolve_hw(hw: HwProfile | str) -> HwProfile:
    """A profile as given, or the profile with that name or path (``gensorage.hw.loader.load_profile``)."""
    if isinstance(hw, str):
        from gensorage.hw.loader import load_profile

        return load_profile(hw)
    return hw


def method_names() -> tuple[str, ...]:
    from gensorage.markov import METHODS

    return tuple(METHODS)


def _algorithm_version(profile: HwProfile) -> str:
    """Package version + fingerprints of the tuner code and the profile's numbers (stale results never served)."""
    from gensorage import __version__
    from gensorage.fingerprint import code_fingerprint, data_fingerprint

    return f"{__version__}+{code_fingerprint('markov', 'baselines', 'workloads')}.{data_fingerprint(profile)}"


def tune(workload: Workload | str, hw: HwProfile | str = "h100", method: str = "markov", seed: int = 0, *,
         store: Store | str | Path | None = None, use_store: bool = True, **opts: Any) -> TuneResult:
    """Pick a schedule for ``workload`` on ``hw`` with ``method``; reuse a stored result when there is one.

    Parameters
    ----------
    workload
        A :class:`~gensorage.workloads.workload.Workload` or the id of a default op configuration.
    hw
        A hardware profile or its name (``"h100"``) / path.
    method
        A key of ``gensorage.markov.METHODS``: ``"markov"``, ``"roller"``, ``"optuna"``, ``"random"``.
    seed
        Seed of the method (the result is a function of workload, hw, method, seed and options).
    store
        The result store: a :class:`Store`, a path, or None for the default store.
    use_store
        False bypasses the store entirely (no lookup, no write).
    **opts
        Method options, e.g. ``trials=1000`` for optuna / random; part of the store key.

    Returns
    -------
    TuneResult

    Raises
    ------
    ConfigError
        Unknown op configuration id or hardware profile.
    GensorageError
        Unknown method.
    ScheduleError
        The method found no schedule that fits (or rejected an option).
    StoreError
        The store file is corrupt or not a gensorage store.
    """
    from gensorage.markov import METHODS

    wl = resolve_workload(workload)
    profile = resolve_hw(hw)
    if method not in METHODS:
        raise GensorageError(f"unknown method {method!r} (expected one of: {', '.join(METHODS)})")
    key = ScheduleKey.make(wl.key(), profile.name, method, seed, opts, version=_algorithm_version(profile))
    if not use_store:
        return _run_method(wl, profile, method, seed, opts, None, key)
    st = store if isinstance(store, Store) else Store(store)
    try:
        rec = st.get_schedule(key)
        if rec is not None:
            return _from_record(wl, profile, method, seed, opts, rec)
        return _run_method(wl, profile, method, seed, opts, st, key)
    finally:
        if st is not store:
            st.close()


def _run_method(wl: Workload, hw: HwProfile, method: str, seed: int, opts: dict[str, Any], st: Store | None,
                key: ScheduleKey) -> TuneResult:
    from gensorage.markov import METHODS

    start = time.perf_counter()
    outcome = METHODS[method](wl, hw, seed=seed, **opts)
    elapsed = time.perf_counter() - start
    result = TuneResult(workload=wl, hw=hw, method=method, seed=seed, options=dict(opts),
                        schedule=outcome.schedule, predicted_time_s=float(outcome.predicted_time_s),
                        construction_time_s=elapsed, evaluated=int(outcome.evaluated), from_store=False)
    if st is not None:
        st.put_schedule(ScheduleRecord(key=key, schedule=outcome.schedule.to_json(),
                                       predicted_time_s=result.predicted_time_s, construction_time_s=elapsed,
                                       created_at=time.time(), evaluated=result.evaluated))
    return result


def _from_record(wl: Workload, hw: HwProfile, method: str, seed: int, opts: dict[str, Any],
                 rec: ScheduleRecord) -> TuneResult:
    from gensorage.codegen.lower_schedule import axis_tilings
    from gensorage.errors import ScheduleError

    try:
        schedule = Schedule.from_json(rec.schedule)
        axis_tilings(wl, schedule)
    except (KeyError, TypeError, ValueError, ScheduleError) as exc:
        raise StoreError(f"stored schedule for {wl.key()} is malformed: {exc} "
                         f"({json.dumps(rec.schedule)[:120]})") from exc
    return TuneResult(workload=wl, hw=hw, method=method, seed=seed, options=dict(opts), schedule=schedule,
                      predicted_time_s=rec.predicted_time_s, construction_time_s=rec.construction_time_s,
                      evaluated=rec.evaluated, from_store=True)

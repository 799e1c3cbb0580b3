"""``tune``: build a schedule for one operator on one GPU profile, lower it, check it, remember it.

>>> from gensorage import tune
>>> r = tune("M1", hw="h100", method="markov")          # doctest: +SKIP
>>> r.predicted_time_s, r.construction_time_s, r.from_store  # doctest: +SKIP
>>> print(r.cuda_source())                                # doctest: +SKIP

A method (:data:`~gensorage.tuning.methods.METHODS`: markov, roller, optuna, random) picks the schedule from the cost model
alone; lowering to TVM TIR / CUDA happens lazily when the source or a run is asked for. Results are kept in
the SQLite store (:mod:`gensorage.store`) under (workload, hw, method, seed, options, version), so tuning the
same thing again is a lookup.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gensorage.errors import GensorageError, StoreError
from gensorage.markov.schedule import Schedule
from gensorage.store import ScheduleKey, ScheduleRecord, Store
from gensorage.tuning.methods import METHODS
from gensorage.tuning.result import TuneResult

if TYPE_CHECKING:
    from gensorage.hw.profile import HwProfile
    from gensorage.workloads.workload import Workload


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
    return tuple(METHODS)


def _algorithm_version(profile: HwProfile) -> str:
    """Package version + fingerprints of the tuner code and the profile's numbers (stale results never served)."""
    from gensorage import __version__
    from gensorage.fingerprint import code_fingerprint, data_fingerprint

    return f"{__version__}+{code_fingerprint('markov', 'baselines', 'workloads')}.{data_fingerprint(profile)}"


def tune(
    workload: Workload | str,
    hw: HwProfile | str = "h100",
    method: str = "markov",
    seed: int = 0,
    *,
    store: Store | str | Path | None = None,
    use_store: bool = True,
    **opts: Any,
) -> TuneResult:
    """Pick a schedule for ``workload`` on ``hw`` with ``method``; reuse a stored result when there is one.

    Parameters
    ----------
    workload
        A :class:`~gensorage.workloads.workload.Workload` or the id of a default op configuration.
    hw
        A hardware profile or its name (``"h100"``) / path.
    method
        A key of :data:`gensorage.tuning.METHODS`: ``"markov"``, ``"roller"``, ``"optuna"``, ``"random"``.
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


def _run_method(
    wl: Workload,
    hw: HwProfile,
    method: str,
    seed: int,
    opts: dict[str, Any],
    st: Store | None,
    key: ScheduleKey,
) -> TuneResult:
    start = time.perf_counter()
    outcome = METHODS[method](wl, hw, seed=seed, **opts)
    elapsed = time.perf_counter() - start
    result = TuneResult(
        workload=wl,
        hw=hw,
        method=method,
        seed=seed,
        options=dict(opts),
        schedule=outcome.schedule,
        predicted_time_s=float(outcome.predicted_time_s),
        construction_time_s=elapsed,
        evaluated=int(outcome.evaluated),
        from_store=False,
    )
    if st is not None:
        st.put_schedule(
            ScheduleRecord(
                key=key,
                schedule=outcome.schedule.to_json(),
                predicted_time_s=result.predicted_time_s,
                construction_time_s=elapsed,
                created_at=time.time(),
                evaluated=result.evaluated,
            )
        )
    return result


def _from_record(
    wl: Workload, hw: HwProfile, method: str, seed: int, opts: dict[str, Any], rec: ScheduleRecord
) -> TuneResult:
    from gensorage.codegen.lower_schedule import axis_tilings
    from gensorage.errors import ScheduleError

    try:
        schedule = Schedule.from_json(rec.schedule)
        axis_tilings(wl, schedule)
    except (KeyError, TypeError, ValueError, ScheduleError) as exc:
        raise StoreError(
            f"stored schedule for {wl.key()} is malformed: {exc} ({json.dumps(rec.schedule)[:120]})"
        ) from exc
    return TuneResult(
        workload=wl,
        hw=hw,
        method=method,
        seed=seed,
        options=dict(opts),
        schedule=schedule,
        predicted_time_s=rec.predicted_time_s,
        construction_time_s=rec.construction_time_s,
        evaluated=rec.evaluated,
        from_store=True,
    )


__all__ = ["method_names", "resolve_hw", "resolve_workload", "tune"]

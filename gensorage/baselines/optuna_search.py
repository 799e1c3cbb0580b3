"""Optuna TPE search over the schedule space, scored by the cost model (no measurement).

Several processes, on one machine or many, can share one study through Optuna's own storage: give each the same
``storage`` (an RDB URL such as ``sqlite:///study.db``, or the path of a journal file, which needs no database
and suits NFS-style shared folders) and ``study_name``, and a different ``seed`` (the same seed would make them
sample the same first schedules). Each runs its ``trials`` and returns the best schedule of the whole study.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import optuna

from gensorage.baselines.sampling import decode, parameters
from gensorage.errors import ScheduleError
from gensorage.hw.profile import HwProfile
from gensorage.markov.cost_model import space_time
from gensorage.markov.outcome import SearchOutcome
from gensorage.markov.schedule import Schedule
from gensorage.markov.space import ScheduleSpace, space_for
from gensorage.workloads.workload import Workload

# What TPE is told for a schedule that does not fit (it is still scored inf): far above any kernel time and
# graded by how far the block overshoots the SM, so TPE can tell nearly-fitting samples from hopeless ones.
_PENALTY_S = 1e3


def _penalty(space: ScheduleSpace, s: Schedule) -> float:
    hw = space.hw
    r = space.resources(s)
    over = max(
        r.threads / hw.max_threads_per_block,
        r.registers_per_thread / hw.max_registers_per_thread,
        r.registers_per_thread * r.threads / hw.registers_per_sm,
        r.shared_bytes / hw.shared_mem_per_block,
    )
    return _PENALTY_S * max(1.0, over)


def search(
    workload: Workload,
    hw: HwProfile,
    seed: int = 0,
    trials: int = 100,
    *,
    storage: str | os.PathLike[str] | None = None,
    study_name: str | None = None,
) -> SearchOutcome:
    """Run ``trials`` Optuna trials with ``TPESampler(seed=seed)`` and keep the best schedule.

    Parameters
    ----------
    workload, hw
        The loop nest and the GPU profile.
    seed
        Seeds the TPE sampler; the result is a function of the inputs and the seed.
    trials
        Trials run (by this call); schedules that do not fit score ``inf`` and still count.
    storage
        Share the study (see the module docstring): an RDB URL (``sqlite:///study.db``,
        ``postgresql://...``) or a journal file path; None keeps the study in memory, for this call only.
    study_name
        The shared study's name (required with ``storage``); every process sharing it must search the same
        workload on the same GPU profile.

    Returns
    -------
    SearchOutcome
        ``method="optuna"``, ``evaluated == trials``; with ``storage``, the best schedule of every trial in the
        study so far, whichever process ran it.

    Raises
    ------
    ScheduleError
        When ``trials < 1``, no trial's schedule fits the hardware, ``storage`` comes without
        ``study_name``, or the named study belongs to another workload or profile.
    """
    if trials < 1:
        raise ScheduleError(f"optuna search: trials must be >= 1, got {trials}")
    if storage is not None and not study_name:
        raise ScheduleError("optuna search: a shared storage needs a study_name")
    start = time.perf_counter()
    space = space_for(workload, hw)
    params = parameters(space)
    best: list[tuple[float, Schedule | None]] = [(math.inf, None)]
    trace: list[tuple[float, float]] = []

    def objective(trial: optuna.Trial) -> float:
        s = decode(space, {p.name: trial.suggest_int(p.name, 0, p.high) for p in params})
        value = space_time(space, s)
        if value < best[0][0]:
            best[0] = (value, s)
            trace.append((time.perf_counter() - start, value))
        return value if math.isfinite(value) else _penalty(space, s)

    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.create_study(
            storage=_storage(storage) if storage is not None else None,
            study_name=study_name,
            load_if_exists=storage is not None,
            direction="minimize",
            sampler=optuna.samplers.TPESampler(seed=seed),
        )
        _claim(study, f"{workload.key()} on {hw.name}")
        study.optimize(objective, n_trials=trials)
        if storage is not None:
            best[0] = _study_best(study, space)
    finally:
        optuna.logging.set_verbosity(verbosity)
    value, s = best[0]
    if s is None:
        raise ScheduleError(f"{workload.key()}: none of {trials} Optuna trials fits {hw.name}")
    return SearchOutcome(
        schedule=s,
        predicted_time_s=value,
        method="optuna",
        evaluated=trials,
        elapsed_s=time.perf_counter() - start,
        trace=tuple(trace),
    )


def _storage(storage: str | os.PathLike[str]) -> Any:
    """An RDB URL as Optuna takes it; anything else is a journal file (created if new)."""
    text = os.fspath(storage)
    if "://" in text:
        return text
    try:
        from optuna.storages.journal import JournalFileBackend
    except ImportError:  # Optuna < 4.0
        from optuna.storages import JournalFileStorage as JournalFileBackend
    return optuna.storages.JournalStorage(JournalFileBackend(text))


_OWNER = "gensorage_search"


def _claim(study: optuna.Study, what: str) -> None:
    """Mark a new study as this search's; refuse a shared one made for another workload or profile."""
    owner = study.user_attrs.get(_OWNER)
    if owner is None:
        study.set_user_attr(_OWNER, what)
    elif owner != what:
        raise ScheduleError(f"optuna study {study.study_name!r} searches {owner}, not {what}")


def _study_best(study: optuna.Study, space: ScheduleSpace) -> tuple[float, Schedule | None]:
    """The best schedule of every finished trial of the study, re-scored (a function of its parameters)."""
    best: tuple[float, Schedule | None] = (math.inf, None)
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        s = decode(space, t.params)
        value = space_time(space, s)
        if value < best[0]:
            best = (value, s)
    return best

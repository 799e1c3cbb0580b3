"""Optuna TPE search over the schedule space, scored by the cost model (no measurement)."""

from __future__ import annotations

import math
import time

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


def search(workload: Workload, hw: HwProfile, seed: int = 0, trials: int = 100) -> SearchOutcome:
    """Run ``trials`` Optuna trials with ``TPESampler(seed=seed)`` and keep the best schedule.

    Parameters
    ----------
    workload, hw
        The loop nest and the GPU profile.
    seed
        Seeds the TPE sampler; the result is a function of the inputs and the seed.
    trials
        Trials run; schedules that do not fit score ``inf`` and still count.

    Returns
    -------
    SearchOutcome
        ``method="optuna"``, ``evaluated == trials``.

    Raises
    ------
    ScheduleError
        When ``trials < 1`` or no trial's schedule fits the hardware.
    """
    if trials < 1:
        raise ScheduleError(f"optuna search: trials must be >= 1, got {trials}")
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
        study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=seed))
        study.optimize(objective, n_trials=trials)
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

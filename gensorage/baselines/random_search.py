"""Uniform random search over the schedule space, scored by the cost model."""

from __future__ import annotations

import math
import time

import numpy as np

from gensorage.baselines.sampling import decode, parameters
from gensorage.errors import ScheduleError
from gensorage.hw.profile import HwProfile
from gensorage.markov.cost_model import space_time
from gensorage.markov.outcome import SearchOutcome
from gensorage.markov.schedule import Schedule
from gensorage.markov.space import space_for
from gensorage.workloads.workload import Workload


def search(workload: Workload, hw: HwProfile, seed: int = 0, trials: int = 1000) -> SearchOutcome:
    """Score ``trials`` uniformly drawn parameter vectors and keep the best.

    Parameters
    ----------
    workload, hw
        The loop nest and the GPU profile.
    seed
        Seeds the ``numpy.random.Generator``; the result is a function of the inputs and the seed.
    trials
        Samples drawn; samples that do not fit score ``inf`` and still count.

    Returns
    -------
    SearchOutcome
        ``method="random"``, ``evaluated == trials``.

    Raises
    ------
    ScheduleError
        When ``trials < 1`` or no sample fits the hardware.
    """
    if trials < 1:
        raise ScheduleError(f"random search: trials must be >= 1, got {trials}")
    start = time.perf_counter()
    space = space_for(workload, hw)
    params = parameters(space)
    rng = np.random.default_rng(seed)
    best, best_s = math.inf, None
    trace: list[tuple[float, float]] = []
    for _ in range(trials):
        draw = rng.integers(0, [p.high + 1 for p in params])
        s: Schedule = decode(space, {p.name: int(x) for p, x in zip(params, draw, strict=True)})
        value = space_time(space, s)
        if value < best:
            best, best_s = value, s
            trace.append((time.perf_counter() - start, best))
    if best_s is None:
        raise ScheduleError(f"{workload.key()}: none of {trials} random schedules fits {hw.name}")
    return SearchOutcome(
        schedule=best_s,
        predicted_time_s=best,
        method="random",
        evaluated=trials,
        elapsed_s=time.perf_counter() - start,
        trace=tuple(trace),
    )

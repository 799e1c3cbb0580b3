"""Gensor-style Markov construction of GPU schedules from a hardware profile, without measurement.

``construct(workload, hw)`` walks the construction graph (states: tilings per memory level with virtual
threads; edges: tile / inverse tile / cache / vThread, with benefit-normalized probabilities) and returns the
best schedule of its top results under the analytic cost model. The baselines it is compared with live in
:mod:`gensorage.baselines`; :data:`gensorage.tuning.METHODS` names them all.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from gensorage.errors import ScheduleError
from gensorage.hw.profile import HwProfile
from gensorage.markov.anneal import anneal
from gensorage.markov.cost_model import predict_schedule_time, space_time
from gensorage.markov.outcome import SearchOutcome
from gensorage.markov.schedule import Schedule
from gensorage.markov.space import LAST, ScheduleSpace, space_for
from gensorage.workloads.workload import Workload

__all__ = ["Schedule", "ScheduleSpace", "SearchOutcome", "construct", "predict_schedule_time", "space_for"]

# 4 walks from each of the 12 best distinct register tiles per round, until 3 rounds bring nothing better or
# 6000 transitions are spent; walks of at most 50 steps (Algorithm 1 keeps a state with probability < 1e-4 after
# ~40 halvings, so longer walks only add cost). The values were chosen by measurement (CHANGELOG.md).
ANNEAL_DEFAULTS: dict[str, int] = {
    "walks": 4,
    "population": 12,
    "rounds": 12,
    "patience": 3,
    "top_k": 10,
    "iterations": 50,
    "max_steps": 6000,
}


def construct(workload: Workload, hw: HwProfile, seed: int = 0, **opts: Any) -> SearchOutcome:
    """Build a schedule for ``workload`` on ``hw`` by Gensor's Markov construction.

    Parameters
    ----------
    workload, hw
        The loop nest and the GPU profile.
    seed
        Seeds the ``numpy.random.Generator`` of the walks; the result is a function of the inputs and the seed.
    **opts
        Integers >= 1 passed to :func:`gensorage.markov.anneal.anneal` (defaults in ``ANNEAL_DEFAULTS``):
        ``walks`` per start state and round, ``population`` (start states per round), ``rounds``,
        ``patience`` (rounds without improvement before stopping), ``iterations`` (steps per walk),
        ``max_steps`` (transition budget), ``top_k`` (ranked results kept).

    Returns
    -------
    SearchOutcome
        The best-scoring state, its predicted time, ``method="markov"``, the number of states scored,
        the wall time and the improvement trace.

    Raises
    ------
    ScheduleError
        When no state the walks reached fits the hardware, or an option is unknown or out of range.
    """
    params: dict[str, Any] = {k: int(opts.pop(k, v)) for k, v in ANNEAL_DEFAULTS.items()}
    if opts:
        raise ScheduleError(f"construct: unknown option(s) {', '.join(sorted(opts))}")
    if min(params.values()) < 1:
        raise ScheduleError(f"construct: options must be >= 1, got {params}")
    start = time.perf_counter()
    space = space_for(workload, hw)
    result = anneal(space, lambda s: space_time(space, s), seed=seed, **params)
    if not result.ranked:
        raise ScheduleError(f"{workload.key()}: no schedule reached by the construction fits {hw.name}")
    value, best = result.ranked[0]
    best = dataclasses.replace(best, level=LAST)  # the construction is finished
    return SearchOutcome(
        schedule=best,
        predicted_time_s=value,
        method="markov",
        evaluated=result.evaluated,
        elapsed_s=time.perf_counter() - start,
        trace=result.trace,
    )

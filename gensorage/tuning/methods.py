"""The schedule-search methods :func:`gensorage.tune` offers: Gensor's construction and its baselines.

Each maps ``(workload, hw, seed=..., **options)`` to a :class:`~gensorage.markov.outcome.SearchOutcome`, scored
by the same cost model, so they are compared on equal terms.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gensorage.baselines import random_search, roller
from gensorage.hw.profile import HwProfile
from gensorage.markov import construct
from gensorage.markov.outcome import SearchOutcome
from gensorage.workloads.workload import Workload


def _optuna(workload: Workload, hw: HwProfile, seed: int = 0, **opts: Any) -> SearchOutcome:
    from gensorage.baselines import optuna_search  # imports Optuna, which takes a while: only when asked for

    return optuna_search.search(workload, hw, seed=seed, **opts)


METHODS: dict[str, Callable[..., SearchOutcome]] = {
    "markov": construct,
    "roller": roller.construct,
    "optuna": _optuna,
    "random": random_search.search,
}

__all__ = ["METHODS"]

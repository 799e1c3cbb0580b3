"""Search baselines over the tensor-core tiling space: Optuna TPE and random sampling.

They search the same space as :func:`gensorage.construction.tensor_core.construct_tensor_core` (block tile,
warp tile, k step, stages, within the construction's limits) and score a tiling with the same cost model
(:func:`gensorage.construction.tensor_core.predict_tensor_core_time`), so a measured difference between their
pick and the construction's is a difference of search, not of model. ``benchmarks/gpu_suite.py`` measures all
three on the device.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from gensorage.codegen.tensor_core import MMA, TensorCoreTiles
from gensorage.construction.tensor_core import (
    MAX_BLOCK_K,
    MAX_STAGES,
    MAX_TILE,
    fits,
    predict_tensor_core_time,
)
from gensorage.errors import ScheduleError
from gensorage.hw.profile import HwProfile

_SIZES = tuple(MMA * 2**i for i in range(5))  # 16 .. 256
_CHOICES = {
    "block_m": _SIZES,
    "block_n": _SIZES,
    "block_k": tuple(v for v in _SIZES if v <= MAX_BLOCK_K),
    "warp_m": tuple(v for v in _SIZES if v <= MAX_TILE // 2),
    "warp_n": tuple(v for v in _SIZES if v <= MAX_TILE // 2),
    "stages": tuple(range(1, MAX_STAGES + 1)),
}


@dataclass(frozen=True, slots=True)
class TilingSearch:
    """The best tiling a search found, its predicted time, the trials it ran and its wall time."""

    tiles: TensorCoreTiles
    predicted_s: float
    trials: int
    wall_s: float


def _score(dims: tuple[int, int, int, int], hw: HwProfile, dtype: str) -> Callable[[TensorCoreTiles], float]:
    def score(t: TensorCoreTiles) -> float:
        if not fits(t, dims):
            return float("inf")
        c = predict_tensor_core_time(dims, t, hw, dtype)
        return float("inf") if c is None else c.total_s

    return score


def _best(found: list[tuple[float, TensorCoreTiles]], trials: int, t0: float, dims: object) -> TilingSearch:
    finite = [f for f in found if f[0] < float("inf")]
    if not finite:
        raise ScheduleError(f"no sampled tensor-core tiling fits matmul {dims} in {trials} trials")
    s, t = min(finite, key=lambda f: (f[0], f[1].describe()))
    return TilingSearch(t, s, trials, time.perf_counter() - t0)


def random_tiling(
    dims: tuple[int, int, int, int], hw: HwProfile, dtype: str = "float16", trials: int = 1000, seed: int = 0
) -> TilingSearch:
    """The best of ``trials`` tilings drawn uniformly from the space."""
    t0 = time.perf_counter()
    rng = random.Random(seed)
    score = _score(dims, hw, dtype)
    found = []
    for _ in range(trials):
        t = TensorCoreTiles(**{k: rng.choice(v) for k, v in _CHOICES.items()})
        found.append((score(t), t))
    return _best(found, trials, t0, dims)


def optuna_tiling(
    dims: tuple[int, int, int, int], hw: HwProfile, dtype: str = "float16", trials: int = 1000, seed: int = 0
) -> TilingSearch:
    """Optuna's TPE sampler over the space for ``trials`` trials (a tiling that does not fit scores 1e3 s)."""
    import optuna

    t0 = time.perf_counter()
    score = _score(dims, hw, dtype)
    found: list[tuple[float, TensorCoreTiles]] = []

    def objective(trial: optuna.Trial) -> float:
        t = TensorCoreTiles(**{k: trial.suggest_categorical(k, v) for k, v in _CHOICES.items()})
        s = score(t)
        found.append((s, t))
        return s if s < float("inf") else 1e3

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed))
    study.optimize(objective, n_trials=trials)
    return _best(found, trials, t0, dims)

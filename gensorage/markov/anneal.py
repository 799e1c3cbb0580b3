"""Algorithms 1 and 2 of Gensor (§IV-C): a simulated-annealing walk over the construction graph.

Algorithm 2 (:func:`get_policy`) scores every action at the current state with its benefit
(:mod:`gensorage.markov.benefit`), normalizes the benefits into probabilities and picks one by roulette
selection. Algorithm 1 (:func:`run_chain`) starts from the unscheduled state, applies the picked action, keeps
the new state among the top results with probability ``keep_probability(T)``, halves the temperature and stops
when it falls below the threshold or the construction has left the last tunable level.

Implementation choices beyond the paper's text: the walk is repeated ``chains`` times from the same start with
one seeded ``numpy.random.Generator`` (the paper's single walk is ``chains=1``); the final state of every walk
joins its top results; the top results of all walks are scored with the cost model and the best is returned.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from gensorage.markov.actions import Action, actions
from gensorage.markov.benefit import benefit, keep_probability
from gensorage.markov.schedule import Schedule
from gensorage.markov.space import LAST, ScheduleSpace

T_START = 1.0
# The paper reports convergence "after about 100 iterations"; halving from 1 reaches 2**-100 in 100 steps.
THRESHOLD = 2.0**-100


@dataclass(frozen=True, slots=True)
class ChainResult:
    final: Schedule
    top: tuple[Schedule, ...]
    steps: int


@dataclass(frozen=True, slots=True)
class AnnealResult:
    """Scored top results of all walks, best first, with the search statistics."""

    ranked: tuple[tuple[float, Schedule], ...]
    evaluated: int  # distinct states scored by the cost model
    steps: int  # transitions taken over all walks
    trace: tuple[tuple[float, float], ...]  # (elapsed seconds, best predicted time so far)


def get_policy(space: ScheduleSpace, s: Schedule, t: int, rng: np.random.Generator) -> tuple[Action, Schedule] | None:
    """Algorithm 2: roulette selection over the normalized benefits of every action at ``s``.

    Returns the chosen action and the state it leads to, or ``None`` when no action has positive benefit.
    """
    acts = actions(space, s)
    weights: list[float] = []
    succ: list[Schedule | None] = []
    for ac in acts:
        w, nxt = benefit(space, s, ac, t)
        weights.append(w)
        succ.append(nxt)
    total = sum(weights)
    if total <= 0.0:
        return None
    u = rng.random() * total
    acc = 0.0
    for ac, w, nxt in zip(acts, weights, succ, strict=True):
        acc += w
        if w > 0.0 and u < acc and nxt is not None:
            return ac, nxt
    last = max(i for i, w in enumerate(weights) if w > 0.0)  # u == total up to rounding
    nxt = succ[last]
    assert nxt is not None
    return acts[last], nxt


def run_chain(space: ScheduleSpace, rng: np.random.Generator, start: Schedule | None = None,
              t_start: float = T_START, threshold: float = THRESHOLD) -> ChainResult:
    """Algorithm 1: one annealing walk from ``start`` (default: the unscheduled state), at level 0."""
    e = space.initial() if start is None else replace(start, level=0)
    top: list[Schedule] = []
    temperature, t = t_start, 0
    while temperature > threshold:
        pick = get_policy(space, e, t, rng)
        if pick is None:
            break
        _, nxt = pick
        if rng.random() < keep_probability(temperature):
            top.append(nxt)
        e = nxt
        temperature /= 2
        t += 1
        if e.level >= LAST:
            break
    return ChainResult(final=e, top=tuple(top), steps=t)


def anneal(space: ScheduleSpace, score: Callable[[Schedule], float], seed: int = 0, walks: int = 8,
           population: int = 4, rounds: int = 12, patience: int = 2, top_k: int = 10) -> AnnealResult:
    """Walks seeded by ``seed`` from the best states found so far, top results scored by ``score``.

    Round 0 runs ``walks`` walks from the unscheduled state; each later round runs ``walks`` walks from each of
    the ``population`` best states scored so far. It stops after ``rounds`` rounds or ``patience`` rounds
    without a better state. States are compared without their ``level`` (it does not change the kernel), so a
    tiling reached twice is scored once.
    """
    clock = time.perf_counter()
    rng = np.random.default_rng(seed)
    seen: dict[tuple[object, ...], tuple[float, Schedule]] = {}
    trace: list[tuple[float, float]] = []
    best = math.inf
    steps = 0
    starts: list[Schedule | None] = [None]
    stale = 0
    for _ in range(rounds):
        improved = False
        for start in starts:
            for _ in range(walks):
                chain = run_chain(space, rng, start)
                steps += chain.steps
                for s in (*chain.top, chain.final):
                    key = (s.tiles, s.vthreads)
                    if key in seen:
                        continue
                    value = score(s)
                    seen[key] = (value, s)
                    if value < best:
                        best, improved = value, True
                        trace.append((time.perf_counter() - clock, best))
        stale = 0 if improved else stale + 1
        if stale >= patience:
            break
        ranked = sorted((p for p in seen.values() if math.isfinite(p[0])), key=lambda p: p[0])
        starts = [s for _, s in ranked[:population]]
        if not starts:
            starts = [None]
    ranked = sorted((p for p in seen.values() if math.isfinite(p[0])), key=lambda p: p[0])
    return AnnealResult(ranked=tuple(ranked[:top_k]), evaluated=len(seen), steps=steps, trace=tuple(trace))

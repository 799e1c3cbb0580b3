"""Algorithms 1 and 2 of Gensor (§IV-C): simulated-annealing walks over the construction graph.

Algorithm 2 (:func:`get_policy`) scores every action at the current state with its benefit
(:mod:`gensorage.markov.benefit`), normalizes the benefits into probabilities and picks one by roulette
selection. Algorithm 1 (:func:`run_chain`) starts from a state at level 0, applies the picked action, keeps
the new state among the top results with probability ``keep_probability(T)``, halves the temperature and stops
when it falls below the threshold or the construction has left the last tunable level.

Implementation choices beyond the paper's text (:func:`anneal`), all deterministic given the seed:

- Many walks instead of one. Round 0 starts ``walks`` walks from the unscheduled state; every later round
  starts ``walks`` walks from each of the ``population`` best states scored so far (with pairwise different
  register tiles). Algorithm 1 takes its start (``dim_configs``) as an input, and restarting from the best
  states is the "backtracking" the graph structure allows. A single walk from the unscheduled state is a
  poor optimizer (measured on H100 GEMM/GEMV/conv/pool/BMM shapes: median over 5 seeds 1-9x the predicted
  time of the best of 3000 random samples; 32 walks: 0.36-1.04x).
- Every walk's final state joins its top results; the top results of all walks are scored once each with
  the cost model, and the best scored state is the answer.
- Stops after ``rounds`` rounds, after ``patience`` rounds without a better state, or once ``max_steps``
  transitions have been taken (a deterministic budget instead of a wall-clock one).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from gensorage.markov.actions import Action, actions
from gensorage.markov.benefit import benefit, cache_weight, keep_probability
from gensorage.markov.schedule import Schedule
from gensorage.markov.space import LAST, ScheduleSpace

T_START = 1.0
# The paper reports convergence "after about 100 iterations"; halving from 1 reaches 2**-100 in 100 steps.
# (``anneal`` uses fewer, its ``iterations`` argument: by then a state is kept with probability ~1e-4.)
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


# Per state: the actions with positive weight, their time-independent weights and successors, and which of
# them is the cache action (its weight is multiplied by cache_weight(t) when used).
_Row = tuple[tuple[Action, ...], tuple[float, ...], tuple[Schedule, ...], int]
PolicyMemo = dict[tuple[object, ...], _Row]


def _policy_row(space: ScheduleSpace, s: Schedule) -> _Row:
    acts: list[Action] = []
    weights: list[float] = []
    succ: list[Schedule] = []
    cache_at = -1
    for ac in actions(space, s):
        # benefit() at t = 10 has cache_weight 1.5; divide it out to keep the weight time-independent.
        w, nxt = benefit(space, s, ac, 10)
        if w > 0.0 and nxt is not None:
            if ac.kind == "cache":
                cache_at = len(acts)
                w /= cache_weight(10)
            acts.append(ac)
            weights.append(w)
            succ.append(nxt)
    return tuple(acts), tuple(weights), tuple(succ), cache_at


def get_policy(
    space: ScheduleSpace, s: Schedule, t: int, rng: np.random.Generator, memo: PolicyMemo | None = None
) -> tuple[Action, Schedule] | None:
    """Algorithm 2: roulette selection over the normalized benefits of every action at ``s``.

    Returns the chosen action and the state it leads to, or ``None`` when no action has positive benefit.
    ``memo`` caches each state's benefits across calls (they depend on ``t`` only through the cache weight).
    """
    key = (s.tiles, s.vthreads, s.level)
    row = memo.get(key) if memo is not None else None
    if row is None:
        row = _policy_row(space, s)
        if memo is not None:
            memo[key] = row
    acts, base, succ, cache_at = row
    weights = list(base)
    if cache_at >= 0:
        weights[cache_at] *= cache_weight(t)
    total = sum(weights)
    if total <= 0.0:
        return None
    u = rng.random() * total
    acc = 0.0
    for ac, w, nxt in zip(acts, weights, succ, strict=True):
        acc += w
        if u < acc:
            return ac, nxt
    return acts[-1], succ[-1]  # u == total up to rounding


def run_chain(
    space: ScheduleSpace,
    rng: np.random.Generator,
    start: Schedule | None = None,
    t_start: float = T_START,
    threshold: float = THRESHOLD,
    memo: PolicyMemo | None = None,
) -> ChainResult:
    """Algorithm 1: one annealing walk from ``start`` (default: the unscheduled state), at level 0."""
    e = space.initial() if start is None else replace(start, level=0)
    top: list[Schedule] = []
    temperature, t = t_start, 0
    while temperature > threshold:
        pick = get_policy(space, e, t, rng, memo)
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


def _diverse(ranked: list[tuple[float, Schedule]], n: int) -> list[Schedule | None]:
    """The ``n`` best states with pairwise different register tiles (then the best of the rest).

    States that differ only in their block tile or virtual threads are one basin for the next round's walks;
    starting from distinct register tiles spreads the walks over more of them.
    """
    picked: list[Schedule | None] = []
    tiles: set[tuple[int, ...]] = set()
    for _, s in ranked:
        if s.tiles[0] not in tiles:
            tiles.add(s.tiles[0])
            picked.append(s)
            if len(picked) == n:
                return picked
    chosen = {id(s) for s in picked}
    picked += [s for _, s in ranked if id(s) not in chosen][: n - len(picked)]
    return picked


def anneal(
    space: ScheduleSpace,
    score: Callable[[Schedule], float],
    seed: int = 0,
    walks: int = 8,
    population: int = 4,
    rounds: int = 12,
    patience: int = 2,
    top_k: int = 10,
    iterations: int = 100,
    max_steps: int = 1_000_000,
    starts: tuple[Schedule, ...] = (),
) -> AnnealResult:
    """Walks seeded by ``seed`` from the best states found so far, top results scored by ``score``.

    Round 0 runs ``walks`` walks from the unscheduled state (from each of ``starts``, scored too, when given:
    a warm start, :mod:`gensorage.markov.warm`); each later round runs ``walks`` walks from each of
    the ``population`` best distinct states scored so far. Each walk runs at most ``iterations`` steps (the
    threshold is ``T_START * 2**-iterations``). It stops after ``rounds`` rounds, ``patience`` rounds without
    a better state, or ``max_steps`` transitions. States are compared without their ``level`` (it does not
    change the kernel), so a tiling reached twice is scored once.
    """
    clock = time.perf_counter()
    rng = np.random.default_rng(seed)
    memo: PolicyMemo = {}
    seen: dict[tuple[object, ...], tuple[float, Schedule]] = {}
    trace: list[tuple[float, float]] = []
    best = math.inf
    steps = 0
    for s in starts:
        seen[(s.tiles, s.vthreads)] = (score(s), s)
    best = min((v for v, _ in seen.values()), default=math.inf)
    round_starts: list[Schedule | None] = list(starts) or [None]
    stale = 0
    for _ in range(rounds):
        improved = False
        for start in round_starts:
            if steps >= max_steps:
                break
            for _ in range(walks):
                chain = run_chain(space, rng, start, threshold=T_START * 2.0**-iterations, memo=memo)
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
        if stale >= patience or steps >= max_steps:
            break
        ranked = sorted((p for p in seen.values() if math.isfinite(p[0])), key=lambda p: p[0])
        round_starts = _diverse(ranked, population) or [None]
    ranked = sorted((p for p in seen.values() if math.isfinite(p[0])), key=lambda p: p[0])
    return AnnealResult(ranked=tuple(ranked[:top_k]), evaluated=len(seen), steps=steps, trace=tuple(trace))

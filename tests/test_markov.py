"""The Markov construction: schedule space, actions, benefit formulas (1)-(3), Algorithms 1-2, construct()."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gensorage.workloads as workloads
from gensorage.errors import ScheduleError
from gensorage.hw import load_profile
from gensorage.markov import SearchOutcome, construct
from gensorage.markov.actions import Action, actions, apply
from gensorage.markov.anneal import get_policy, run_chain
from gensorage.markov.benefit import (
    benefit,
    cache_weight,
    caching_benefit,
    keep_probability,
    tiling_benefit,
    vthread_benefit,
)
from gensorage.markov.cost_model import predict_schedule_time
from gensorage.markov.schedule import Schedule
from gensorage.markov.space import LAST, space_for
from gensorage.tuning import METHODS

H100 = load_profile("h100")


# ------------------------------------------------------------------------------------------------ space
def test_candidates_are_powers_of_two_and_divisors() -> None:
    space = space_for(workloads.gemv(1000, 4096), H100)
    c = space.candidates[0]
    assert {1, 2, 4, 5, 8, 125, 250, 256, 500, 512, 1000} <= set(c)
    assert 3 not in c and 1024 not in c and max(c) == 1000
    assert space.candidates[1] == tuple(2**i for i in range(13))


def test_conv_input_footprint_is_the_span_of_the_affine_index() -> None:
    wl = workloads.conv2d(8, 16, 30, 30, 32, 3, 3, stride=2)
    space = space_for(wl, H100)
    x = next(t for t in space.inputs if t.name == "X")
    tile = {"n": 2, "f": 4, "oh": 4, "ow": 7, "c": 8, "kh": 3, "kw": 1}
    t = tuple(tile[a] for a in space.axes)
    # rows: (T_oh - 1) * stride + T_kh, cols: (T_ow - 1) * stride + T_kw, capped by the 30-wide image
    assert space.tensor_elems(x, t) == 2 * 8 * ((4 - 1) * 2 + 3) * min(30, (7 - 1) * 2 + 1)


def test_gemm_traffic_and_footprint_by_hand() -> None:
    M, N, K = 256, 512, 128
    wl = workloads.gemm(M, N, K)
    space = space_for(wl, H100)
    s = space.make((4, 8, 2), (64, 128, 32))
    # Level 1: every block loads its A and B tiles once per 32-wide K chunk, writes its fp32 C tile once.
    blocks, chunks = (M // 64) * (N // 128), K // 32
    q1 = blocks * chunks * (64 * 32 + 32 * 128) * 2 + blocks * 64 * 128 * 4
    assert space.traffic(s, 1) == q1
    assert space.footprint(s, 1) == (64 * 32 + 32 * 128) * 2
    # Level 0: every thread loads its fragments once per 2-wide K step.
    threads, steps = (M // 4) * (N // 8), K // 2
    q0 = threads * steps * (4 * 2 + 2 * 8) * 2 + threads * 4 * 8 * 4
    assert space.traffic(s, 0) == q0
    assert space.footprint(s, 0) == (4 * 2 + 2 * 8) * 2 + 4 * 8 * 4
    r = space.resources(s)
    assert r.threads == (64 // 4) * (128 // 8)
    assert r.shared_bytes == space.footprint(s, 1)


def test_fits_checks_each_limit() -> None:
    wl = workloads.gemm(4096, 4096, 4096)
    space = space_for(wl, H100)
    assert space.fits(space.make((8, 8, 1), (128, 128, 32)))
    assert not space.fits(space.make((1, 1, 1), (64, 32, 1)))  # 2048 threads
    assert not space.fits(space.make((32, 32, 4), (32, 32, 4)))  # > 255 registers
    assert not space.fits(space.make((8, 8, 1), (256, 256, 512)))  # > 227 KiB shared
    assert not space.fits(space.make((8, 8, 1), (4, 128, 32)))  # T0 > T1
    assert not space.fits(space.make((6, 8, 1), (96, 128, 32)))  # 6 is neither a power of two nor a divisor
    assert not space.fits(space.make((4, 8, 1), (64, 128, 32), (8, 1, 1)))  # vthreads must divide T0
    assert not space.fits(space.make((4, 8, 2), (64, 128, 32), (1, 1, 2)))  # none on reduction axes


def test_initial_state_is_unscheduled_and_fits() -> None:
    wl = workloads.conv2d(4, 8, 16, 16, 8, 3, 3, padding=1)
    space = space_for(wl, H100)
    s = space.initial()
    assert s.level == 0 and s.tiles[0] == s.tiles[1] == (1,) * len(space.axes)
    assert s.tiles[LAST] == space.extents and set(s.vthreads) == {1}
    assert space.fits(s)


# ---------------------------------------------------------------------------------------------- actions
def test_actions_move_through_legal_sizes() -> None:
    wl = workloads.gemv(1000, 64)
    space = space_for(wl, H100)
    s = space.make((4, 1), (4, 1), level=0)
    grown = apply(space, s, Action("tile", 0))
    assert grown is not None and grown.tiles[0][0] == 5 and grown.tiles[1][0] == 5  # T1 follows T0 upwards
    shrunk = apply(space, s, Action("inv_tile", 0))
    assert shrunk is not None and shrunk.tiles[0][0] == 2 and shrunk.tiles[1][0] == 4
    assert apply(space, space.make((1, 1), (8, 1), level=0), Action("inv_tile", 0)) is None
    at_shared = apply(space, s, Action("cache", -1))
    assert at_shared is not None and at_shared.level == 1
    assert apply(space, at_shared, Action("inv_tile", 0)) is None  # T1 never below T0
    bigger = apply(space, at_shared, Action("tile", 0))
    assert bigger is not None and bigger.tiles[0][0] == 4 and bigger.tiles[1][0] == 5
    assert apply(space, space.make((1000, 1), (1000, 1), level=1), Action("tile", 0)) is None
    done = apply(space, at_shared, Action("cache", -1))
    assert done is not None and done.level == LAST
    assert all(apply(space, done, a) is None for a in actions(space, done))


def test_vthread_action_doubles_and_shrinking_keeps_it_legal() -> None:
    space = space_for(workloads.gemm(256, 256, 256), H100)
    s = space.make((4, 2, 1), (64, 32, 16), level=1)
    v2 = apply(space, s, Action("vthread", 0))
    v4 = apply(space, v2, Action("vthread", 0)) if v2 else None
    assert v2 is not None and v4 is not None and v4.vthreads == (4, 1, 1)
    assert apply(space, v4, Action("vthread", 0)) is None  # 8 does not divide T0 = 4
    assert Action("vthread", 2) not in actions(space, s)  # no vthreads on the reduction axis
    low = apply(
        space, Schedule(axes=v4.axes, tiles=v4.tiles, vthreads=v4.vthreads, level=0), Action("inv_tile", 0)
    )
    assert low is not None and low.tiles[0][0] == 2 and low.vthreads[0] == 2


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 40))
def test_every_successor_is_well_formed(seed: int, steps: int) -> None:
    space = space_for(workloads.conv2d(4, 24, 14, 14, 40, 3, 3, stride=2, padding=1), H100)
    rng = np.random.default_rng(seed)
    s = space.initial()
    for _ in range(steps):
        nxt = [n for a in actions(space, s) if (n := apply(space, s, a)) is not None]
        if not nxt:
            break
        s = nxt[int(rng.integers(len(nxt)))]
        assert space.well_formed(s)


# ---------------------------------------------------------------------------------------------- benefits
def test_tiling_benefit_formula_1_by_hand() -> None:
    space = space_for(workloads.gemm(64, 64, 64), H100)
    s = space.initial()
    t = apply(space, s, Action("tile", 0))
    assert t is not None
    # Q(T): 64^2 threads x 64 steps x (1 + 1) fp16 loads + 64^2 fp32 stores; F(T) = 2 + 2 + 4 bytes.
    q, f = 64 * 64 * 64 * 2 * 2 + 64 * 64 * 4, 2 + 2 + 4
    # T': 32 x 64 threads, A fragment 2x1, B 1x1, C 2x1.
    q2, f2 = 32 * 64 * 64 * (2 + 1) * 2 + 32 * 64 * 2 * 4, 2 * 2 + 2 + 2 * 4
    assert (space.traffic(s, 0), space.footprint(s, 0), space.traffic(t, 0), space.footprint(t, 0)) == (
        q,
        f,
        q2,
        f2,
    )
    assert tiling_benefit(space, s, t, 0) == pytest.approx(q * f2 / (q2 * f))
    assert tiling_benefit(space, s, t, 0) == pytest.approx(2.3214285714)


def test_caching_benefit_formula_2_by_hand() -> None:
    # Leaving level 0 moves data access from registers to shared memory; leaving level 1 from shared memory
    # to global memory: access time of the memory left over that of the memory entered.
    space = space_for(workloads.gemm(64, 64, 64), H100)
    s = space.initial()
    data = space.traffic(s, 0)
    sh, reg, dram = H100.level("shared"), H100.level("register"), H100.level("dram")
    t_reg = reg.latency_cycles / H100.clock_hz + data / reg.bandwidth_Bps
    t_sh = sh.latency_cycles / H100.clock_hz + data / sh.bandwidth_Bps
    assert caching_benefit(space, s) == pytest.approx(t_reg / t_sh)
    at_shared = Schedule(axes=s.axes, tiles=s.tiles, vthreads=s.vthreads, level=1)
    data1 = space.traffic(at_shared, 1)
    expected = (sh.latency_cycles / H100.clock_hz + data1 / sh.bandwidth_Bps) / (
        dram.latency_cycles / H100.clock_hz + data1 / dram.bandwidth_Bps
    )
    assert caching_benefit(space, at_shared) == pytest.approx(expected)
    assert 0 < caching_benefit(space, at_shared) < 1  # going outwards is slower data access


def test_vthread_benefit_formula_3_by_hand() -> None:
    space = space_for(workloads.gemm(1024, 1024, 1024), H100)
    # 32 threads along j (the fastest axis) with T0 = 8 fp16: a warp sweeps x = 32 * 8 * 2 = 512 bytes;
    # W = 32 banks x 4 bytes = 128 bytes: ceil(512/128) / ceil(512/(2*128)) = 4 / 2.
    s = space.make((1, 8, 1), (1, 256, 16), level=1)
    assert vthread_benefit(space, s, 1, 2) == pytest.approx(2.0)
    s2 = space.make((1, 8, 1), (1, 256, 16), (1, 2, 1), level=1)
    assert vthread_benefit(space, s2, 1, 4) == pytest.approx(2.0)  # ceil(512/256) / ceil(512/512)
    s4 = space.make((1, 8, 1), (1, 256, 16), (1, 4, 1), level=1)
    assert vthread_benefit(space, s4, 1, 8) == pytest.approx(1.0)  # ceil(512/512) / ceil(512/1024)
    narrow = space.make((1, 2, 1), (1, 16, 16), level=1)  # x = 8 * 2 * 2 = 32 bytes: nothing to gain
    assert vthread_benefit(space, narrow, 1, 2) == pytest.approx(1.0)


def test_annealing_constants() -> None:
    assert cache_weight(0) == pytest.approx(0.5)
    assert cache_weight(10) == pytest.approx(1.5)
    assert cache_weight(20) == pytest.approx(2.5)
    assert cache_weight(1000) == pytest.approx(3.0)
    assert keep_probability(1.0) == pytest.approx(1 - 1 / (1 + math.exp(5)))
    assert keep_probability(math.exp(-10)) == pytest.approx(0.5)
    assert keep_probability(2.0**-60) < 1e-6


def test_benefit_is_zero_where_the_successor_does_not_fit() -> None:
    space = space_for(workloads.gemm(4096, 4096, 4096), H100)
    s = space.make((4, 4, 1), (16, 512, 8), level=1)  # 4 x 128 = 512 threads; doubling rows -> 1024 fits
    w, nxt = benefit(space, s, Action("tile", 0), t=0)
    assert w > 0 and nxt is not None
    s2 = space.make((4, 4, 1), (32, 512, 8), level=1)  # 1024 threads: one more row step -> 2048
    assert benefit(space, s2, Action("tile", 0), t=0) == (0.0, None)
    w_cache, _ = benefit(space, s2, Action("cache", -1), t=10)
    assert w_cache == pytest.approx(caching_benefit(space, s2) * cache_weight(10))


# ------------------------------------------------------------------------------------------- algorithms
def test_roulette_follows_the_normalized_benefits() -> None:
    space = space_for(workloads.gemm(512, 512, 512), H100)
    s = space.make((2, 2, 1), (16, 16, 4), level=1)
    t = 5
    weights = {a: benefit(space, s, a, t)[0] for a in actions(space, s)}
    total = sum(weights.values())
    rng = np.random.default_rng(7)
    n = 4000
    counts: Counter[Action] = Counter()
    for _ in range(n):
        pick = get_policy(space, s, t, rng)
        assert pick is not None
        counts[pick[0]] += 1
    for a, w in weights.items():
        p = w / total
        if p == 0:
            assert counts[a] == 0
        else:
            assert abs(counts[a] / n - p) < 4 * math.sqrt(p * (1 - p) / n) + 1e-3


def test_chain_terminates_and_keeps_only_fitting_states() -> None:
    space = space_for(workloads.conv2d(16, 64, 28, 28, 64, 3, 3, padding=1), H100)
    rng = np.random.default_rng(0)
    for _ in range(20):
        chain = run_chain(space, rng)
        assert 1 <= chain.steps <= 100
        assert all(space.fits(s) for s in chain.top)
        assert space.fits(chain.final)


WORKLOADS = [
    workloads.gemm(1024, 1024, 1024),
    workloads.gemm(65536, 4, 1024),
    workloads.gemv(16384, 1000),
    workloads.batch_matmul(8, 256, 256, 64),
    workloads.conv2d(32, 64, 28, 28, 64, 3, 3, padding=1),
    workloads.avgpool2d(16, 48, 48, 48, 2, 2, stride=2),
]


@pytest.mark.parametrize("wl", WORKLOADS, ids=lambda w: w.name)
def test_construct_returns_a_fitting_scored_schedule(wl) -> None:
    out = construct(wl, H100, seed=1)
    space = space_for(wl, H100)
    assert isinstance(out, SearchOutcome) and out.method == "markov"
    assert space.fits(out.schedule)
    r = space.resources(out.schedule)
    assert r.threads <= H100.max_threads_per_block
    assert r.registers_per_thread <= H100.max_registers_per_thread
    assert r.shared_bytes <= H100.shared_mem_per_block
    assert out.predicted_time_s == predict_schedule_time(wl, H100, out.schedule)
    assert out.evaluated > 0 and out.elapsed_s > 0
    bests = [b for _, b in out.trace]
    assert bests == sorted(bests, reverse=True) and bests[-1] == out.predicted_time_s
    times = [t for t, _ in out.trace]
    assert times == sorted(times)


def test_construct_is_deterministic_for_a_seed() -> None:
    for wl, opts in (
        (workloads.gemm(2048, 512, 1024), {}),
        (workloads.conv2d(8, 32, 14, 14, 64, 3, 3, padding=1), {"max_steps": 800}),
    ):
        a, b = construct(wl, H100, seed=11, **opts), construct(wl, H100, seed=11, **opts)
        assert (a.schedule, a.predicted_time_s, a.evaluated) == (b.schedule, b.predicted_time_s, b.evaluated)
        assert [v for _, v in a.trace] == [v for _, v in b.trace]


def test_construct_beats_random_sampling_with_as_many_samples() -> None:
    for wl in (workloads.gemm(2048, 2048, 2048), workloads.conv2d(32, 128, 28, 28, 128, 3, 3, padding=1)):
        out = construct(wl, H100, seed=0)
        rand = METHODS["random"](wl, H100, seed=0, trials=out.evaluated)
        assert out.predicted_time_s <= rand.predicted_time_s


def test_construct_rejects_bad_options() -> None:
    wl = workloads.gemm(64, 64, 64)
    with pytest.raises(ScheduleError, match="unknown option"):
        construct(wl, H100, chains=3)
    with pytest.raises(ScheduleError, match=">= 1"):
        construct(wl, H100, walks=0)


def test_schedule_json_round_trip_and_malformed_input() -> None:
    s = construct(workloads.gemm(256, 256, 256), H100, seed=0, max_steps=200).schedule
    assert s.level == LAST
    assert Schedule.from_json(s.to_json()) == s
    bad = s.to_json()
    bad["tiles"] = [[1, 2], "x"]
    with pytest.raises(ScheduleError, match="malformed"):
        Schedule.from_json(bad)
    with pytest.raises(ScheduleError, match="malformed"):
        Schedule.from_json({"axes": ["i"]})

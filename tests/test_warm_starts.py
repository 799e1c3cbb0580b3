"""Constructions at a new shape started from a known shape's (gensorage.markov.warm for CUDA-core schedules,
gensorage.construction.tensor_core for tensor-core tiles) and the memos that pick the known shape inside
gensorage.construction.warm_starts: as good as a cold construction under the cost model, within a stated
tolerance, and never leaking into the cold answer."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from gensorage.construction import construct_schedule, matmul_workload
from gensorage.construction import schedule as memo
from gensorage.construction import tensor_core as tc
from gensorage.hw import load_profile
from gensorage.markov import construct
from gensorage.markov.cost_model import space_time
from gensorage.markov.space import space_for
from gensorage.markov.warm import _one_axis_moves, carry_schedule, construct_from, descend

H100 = load_profile("h100")
# A warm-started construction's modelled time is at most this much above a cold construction's at the same shape.
# The cold one is a heuristic walk and the warm one a descent (often the better); measured on 40 drawn matmuls
# within the memo's MAX_CARRY_FACTOR: geometric mean 0.995x, worst 1.34x, while cold constructions with other
# seeds give 0.75-1.31x of the seed-0 one.
TOLERANCE = 1.4
TC_TOLERANCE = 1.05  # the same for the tensor-core construction (measured: never above 1.0x)


def _cost(wl, s) -> float:  # type: ignore[no-untyped-def]
    space = space_for(wl, H100)
    return space_time(space, s)


# Derandomized: the bound is statistical (a drawn shape can land where both walks miss), so the draws are fixed
# and a change in the construction, not the luck of a run, is what fails it.
@settings(max_examples=8, deadline=None, derandomize=True)
@given(
    batch=st.sampled_from([1, 2, 8, 32]),
    m=st.integers(1, 2048),
    factor=st.floats(1 / memo.MAX_CARRY_FACTOR, memo.MAX_CARRY_FACTOR),
    n=st.sampled_from([8, 32, 64, 256, 1024, 4096]),
    k=st.sampled_from([8, 32, 128, 512, 4096]),
    tied=st.booleans(),  # attention's scores: the reduction is the sequence too
    dtype=st.sampled_from(["float32", "float16"]),
)
def test_a_warm_started_construction_is_within_tolerance_of_a_cold_one(
    batch: int, m: int, factor: float, n: int, k: int, tied: bool, dtype: str
) -> None:
    new_m = max(1, min(4096, round(m * factor)))
    old = matmul_workload(batch, m, n, m if tied else k, dtype)
    new = matmul_workload(batch, new_m, n, new_m if tied else k, dtype)
    known = construct(old, H100).schedule
    cold = construct(new, H100)
    warm = construct_from(new, H100, known)
    assert warm is not None and warm.method == "markov-warm"
    assert space_for(new, H100).fits(warm.schedule)
    assert math.isclose(warm.predicted_time_s, _cost(new, warm.schedule))
    assert warm.predicted_time_s <= TOLERANCE * cold.predicted_time_s
    carried = carry_schedule(known, space_for(new, H100))
    if carried is not None:  # the descent only ever moves to a better state than its start
        assert warm.predicted_time_s <= _cost(new, carried)


def test_carrying_a_schedule_keeps_full_tiles_full_and_caps_the_rest() -> None:
    old, new = matmul_workload(1, 16, 512, 256, "float32"), matmul_workload(1, 24, 512, 256, "float32")
    space = space_for(new, H100)
    known = space_for(old, H100).make((2, 4, 32), (16, 64, 256), (2, 1, 1))
    carried = carry_schedule(known, space)
    assert carried is not None and space.fits(carried)
    assert carried.tiles[1] == (24, 64, 256)  # the block covered all of M: it covers all of the new M
    assert carried.tiles[0] == (2, 4, 32) and carried.vthreads == (2, 1, 1)
    small = carry_schedule(known, space_for(matmul_workload(1, 3, 512, 256, "float32"), H100))
    assert small is not None and small.tiles[0][0] == 2 and small.tiles[1][0] == 3
    odd = carry_schedule(known, space_for(matmul_workload(1, 1, 512, 256, "float32"), H100))
    assert odd is not None and odd.tiles[0][0] == 1 and odd.vthreads[0] == 1  # vthreads must divide T0
    other_axes = space_for(matmul_workload(2, 16, 512, 256, "float32"), H100)
    assert carry_schedule(known, other_axes) is None


def test_warm_starts_walk_from_the_nearest_shape_and_leave_the_cold_answer_alone() -> None:
    memo._clear()
    base = matmul_workload(1, 40, 96, 48, "float32")
    first = construct_schedule(base, H100)  # cold: the class's first shape
    near = matmul_workload(1, 56, 96, 48, "float32")
    with memo.warm_starts():
        warm = construct_schedule(near, H100)
        assert construct_schedule(near, H100) is warm  # memoised
        far = matmul_workload(1, 400, 96, 48, "float32")  # over MAX_CARRY_FACTOR from every known shape
        assert construct_schedule(far, H100) == construct(far, H100).schedule
    assert warm == construct_from(near, H100, first).schedule
    assert construct_schedule(near, H100) == construct(near, H100).schedule  # outside: always the cold one
    assert (
        memo.shape_class(base)
        == memo.shape_class(near)
        != memo.shape_class(matmul_workload(2, 40, 96, 48, "float32"))
    )


def test_the_descent_stops_where_no_one_axis_step_improves() -> None:
    # A local minimum of the one-axis neighbourhood, by exhaustion: every neighbour that fits costs as much or
    # more; and a budget of one evaluation returns the start unchanged.
    wl = matmul_workload(2, 96, 384, 160, "float16")
    space = space_for(wl, H100)
    start = carry_schedule(construct(matmul_workload(2, 40, 384, 160, "float16"), H100).schedule, space)
    assert start is not None
    value, best, evaluated = descend(space, start)
    assert evaluated > 1 and value == _cost(wl, best) <= _cost(wl, start)
    for n in _one_axis_moves(space, best):
        if space.well_formed(n) and space.fits(n):
            assert _cost(wl, n) >= value
    assert descend(space, start, max_evaluations=1)[1] == start


@settings(max_examples=8, deadline=None, derandomize=True)
@given(
    batch=st.sampled_from([1, 4, 32]),
    m=st.integers(1, 2048),
    factor=st.floats(1 / memo.MAX_CARRY_FACTOR, memo.MAX_CARRY_FACTOR),
    n=st.sampled_from([16, 64, 256, 1024, 4096]),
    k=st.sampled_from([16, 64, 256, 1024, 4096]),
    tied=st.booleans(),
)
def test_tensor_core_tiles_warm_started_at_a_new_shape_cost_no_more_than_cold_ones(
    batch: int, m: int, factor: float, n: int, k: int, tied: bool
) -> None:
    new_m = max(1, min(4096, round(m * factor)))
    old, new = (batch, m, n, m if tied else k), (batch, new_m, n, new_m if tied else k)
    tc._KNOWN.clear()
    tc._WARM.clear()
    tc.construct_tensor_core(old, H100)
    cold = tc._construct(new, H100, "float16", 0, True, False)
    with memo.warm_starts():
        warm = tc.construct_tensor_core(new, H100)
    assert new == old or tc._WARM  # the warm path ran
    assert tc.fits(warm[0], new) and warm[1] == tc.predict_tensor_core_time(new, warm[0], H100)
    # Measured over drawn shapes: never above the cold cost (the greedy chains from the smallest kernel and from
    # the carried tiles find what the cold construction's 24 chains find, or better).
    assert warm[1].total_s <= TC_TOLERANCE * cold[1].total_s
    assert tc.construct_tensor_core(new, H100) == cold  # outside warm_starts: the cold answer

"""The analytic cost model: feasibility, orders of magnitude, occupancy / waves, conflicts, tensor cores."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gensorage.markov.cost_model as cost_model
import gensorage.workloads as workloads
from gensorage.baselines.sampling import decode, parameters
from gensorage.errors import ScheduleError
from gensorage.hw import load_profile
from gensorage.markov.cost_model import bank_conflict, blocks_per_sm, breakdown, predict_schedule_time
from gensorage.markov.space import space_for

H100 = load_profile("h100")


def _gemm_schedule(wl, t0, t1, v=None):
    return space_for(wl, H100).make(t0, t1, v)


def test_tiled_gemm_beats_untiled_by_orders_of_magnitude() -> None:
    wl = workloads.gemm(4096, 4096, 4096)
    good = predict_schedule_time(wl, H100, _gemm_schedule(wl, (8, 8, 1), (128, 128, 32)))
    untiled = predict_schedule_time(wl, H100, _gemm_schedule(wl, (1, 1, 1), (1, 1, 1)))
    one_thread = predict_schedule_time(wl, H100, _gemm_schedule(wl, (4, 4, 1), (4, 4, 32)))
    assert math.isfinite(good) and math.isfinite(untiled)
    assert untiled > 100 * good
    assert one_thread > 10 * good
    # The emitted code is CUDA-core FMA in float32 (EMITS_TENSOR_CORES is off): a 4096^3 GEMM cannot beat the
    # float32 CUDA-core peak, and a decent tiling is within 10x of it.
    ideal = wl.flops / H100.flops("float32", tensor_cores=False)
    assert ideal < good < 10 * ideal


def test_schedules_that_do_not_fit_are_infinite() -> None:
    wl = workloads.gemm(4096, 4096, 4096)
    too_many_threads = _gemm_schedule(wl, (1, 1, 1), (64, 64, 1))  # 4096 threads per block
    too_many_registers = _gemm_schedule(wl, (64, 64, 1), (64, 64, 1))  # 4096 accumulators per thread
    too_much_shared = _gemm_schedule(wl, (8, 8, 1), (256, 256, 512))  # 512 KiB of fp16 tiles
    t0_above_t1 = _gemm_schedule(wl, (16, 16, 1), (8, 8, 1))
    bad_vthread = _gemm_schedule(wl, (4, 4, 1), (64, 64, 16), (8, 1, 1))
    for s in (too_many_threads, too_many_registers, too_much_shared, t0_above_t1, bad_vthread):
        assert predict_schedule_time(wl, H100, s) == math.inf
        assert breakdown(wl, H100, s) is None


def test_wave_quantization_is_visible() -> None:
    # One block per 128-row panel of a 128-wide GEMM: fill exactly the resident capacity, then one block more.
    t0, t1 = (8, 8, 1), (128, 128, 32)
    probe = space_for(workloads.gemm(128, 128, 1024), H100)
    r = probe.resources(probe.make(t0, t1))
    per_wave = H100.sm_count * blocks_per_sm(H100, r.threads, r.registers_per_thread, r.shared_bytes)
    full = workloads.gemm(128 * per_wave, 128, 1024)
    over = workloads.gemm(128 * (per_wave + 1), 128, 1024)
    b_full = breakdown(full, H100, space_for(full, H100).make(t0, t1))
    b_over = breakdown(over, H100, space_for(over, H100).make(t0, t1))
    assert b_full is not None and b_over is not None
    assert (b_full.waves, b_over.waves) == (1, 2)
    # One extra block (a fraction 1/per_wave more work) costs a whole extra wave.
    assert b_over.total_s > 1.6 * b_full.total_s


def test_occupancy_limits() -> None:
    assert blocks_per_sm(H100, 1024, 32, 0) == 2  # threads
    assert blocks_per_sm(H100, 256, 255, 0) == 1  # registers: 256 x 256 (allocation granule) = 64K
    assert blocks_per_sm(H100, 128, 32, 100 * 1024) == 2  # shared memory (228 KiB / (100 KiB + 1 KiB))
    assert blocks_per_sm(H100, 32, 16, 0) == 32  # the per-SM block limit


def test_vthreads_reduce_bank_conflicts_and_time() -> None:
    wl = workloads.gemm(4096, 4096, 4096, "float32")  # CUDA cores: per-thread fragments from shared memory
    space = space_for(wl, H100)
    plain = space.make((8, 8, 1), (128, 128, 16))
    split = space.make((8, 8, 1), (128, 128, 16), (2, 2, 1))
    b_plain, b_split = breakdown(wl, H100, plain), breakdown(wl, H100, split)
    assert b_plain is not None and b_split is not None
    # B[k, n]: 16 lanes along n 8 words apart hit 4 banks -> 4-way; with 2 vthreads 4 apart -> 2-way.
    b_tensor = space.inputs[1]
    assert bank_conflict(space, plain, b_tensor) == 4
    assert bank_conflict(space, split, b_tensor) == 2
    assert b_split.bank_conflict < b_plain.bank_conflict
    assert b_split.total_s < b_plain.total_s


def test_no_tensor_cores_while_the_lowering_emits_fma_code() -> None:
    fp16 = workloads.gemm(4096, 4096, 4096)
    b16 = breakdown(fp16, H100, space_for(fp16, H100).make((8, 8, 1), (128, 128, 32)))
    assert b16 is not None and not b16.tensor_cores


@pytest.fixture
def tensor_cores_on(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(cost_model, "EMITS_TENSOR_CORES", True)
    cost_model._mma_groups.cache_clear()
    yield
    cost_model._mma_groups.cache_clear()


def test_tensor_cores_only_where_they_apply(tensor_cores_on: None) -> None:
    # The tensor-core path of the model, for a lowering that emits MMA instructions.
    fp16 = workloads.gemm(4096, 4096, 4096)
    fp32 = workloads.gemm(4096, 4096, 4096, "float32")
    shape = ((8, 8, 1), (128, 128, 32))
    b16 = breakdown(fp16, H100, space_for(fp16, H100).make(*shape))
    b32 = breakdown(fp32, H100, space_for(fp32, H100).make(*shape))
    assert b16 is not None and b16.tensor_cores
    assert b32 is not None and not b32.tensor_cores
    # A reduction chunk below the MMA k of 16 falls back to CUDA cores.
    b16k = breakdown(fp16, H100, space_for(fp16, H100).make((8, 8, 1), (128, 128, 8)))
    assert b16k is not None and not b16k.tensor_cores
    gemv = workloads.gemv(4096, 4096)
    bv = breakdown(gemv, H100, space_for(gemv, H100).make((4, 8), (512, 64)))
    assert bv is not None and not bv.tensor_cores


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_never_faster_than_dram_allows(data: st.DataObject) -> None:
    wl = data.draw(
        st.sampled_from(
            [
                workloads.gemm(512, 256, 1024),
                workloads.gemv(4096, 1000),
                workloads.conv2d(8, 32, 14, 14, 64, 3, 3, padding=1),
                workloads.avgpool2d(4, 16, 24, 24, 2, 2, stride=2),
            ]
        )
    )
    space = space_for(wl, H100)
    params = parameters(space)
    s = decode(space, {p.name: data.draw(st.integers(0, p.high)) for p in params})
    t = predict_schedule_time(wl, H100, s)
    compulsory = sum(space.tensor_elems(x, space.extents) * x.elem_bytes for x in space.tensors)
    assert t == math.inf or t >= compulsory / H100.level("dram").bandwidth_Bps
    assert (t == math.inf) == (not space.fits(s))


@settings(max_examples=40, deadline=None)
@given(k=st.sampled_from([64, 256, 1024]), t0k=st.sampled_from([1, 2, 4]), t1k=st.sampled_from([16, 32, 64]))
def test_more_work_is_never_faster(k: int, t0k: int, t1k: int) -> None:
    small, big = workloads.gemm(1024, 1024, k), workloads.gemm(1024, 1024, 4 * k)
    t1k = min(t1k, k)
    a = predict_schedule_time(small, H100, space_for(small, H100).make((4, 4, t0k), (64, 64, t1k)))
    b = predict_schedule_time(big, H100, space_for(big, H100).make((4, 4, t0k), (64, 64, t1k)))
    assert math.isfinite(a) and b > a


def test_profile_without_the_dtype_is_a_schedule_error() -> None:
    hw = dataclasses.replace(H100, peak_flops=tuple(p for p in H100.peak_flops if p[0] == "float16"))
    wl = workloads.gemm(256, 256, 256, "float32")
    with pytest.raises(ScheduleError, match="float32"):
        predict_schedule_time(wl, hw, space_for(wl, hw).make((4, 4, 1), (64, 64, 16)))

"""Hopper wgmma matmul kernels: layouts, the CPU twin against float64, the PTX nvcc makes, the construction."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gensorage.codegen.cuda_build import cubin_unavailable_reason, ptx_and_resources
from gensorage.codegen.tensor_core import TensorCoreTiles
from gensorage.codegen.wgmma import (
    A_DESC,
    ARCH,
    ATOM,
    BLOCK_K,
    WgmmaTiles,
    a_offset,
    b_desc,
    b_offset,
    block_tile,
    fragment_row_col,
    wgmma_matmul,
)
from gensorage.codegen.wgmma_twin import k_major_address, mn_major_address, wgmma_twin
from gensorage.construction.tensor_core import (
    construct_matmul_tiles,
    construct_tensor_core,
    predict_tiles_time,
)
from gensorage.construction.wgmma import registers, wgmma_available, wgmma_fits
from gensorage.dtypes import numpy_dtype
from gensorage.errors import ScheduleError
from gensorage.hw import load_profile

H200 = load_profile("h200")
#: A Hopper whose mma.sync is slow: the construction takes wgmma even at shapes small enough for the twins.
SLOW_MMA = dataclasses.replace(
    H200, calibration=dataclasses.replace(H200.calibration, mma_sync_fraction=0.01, wgmma_fraction=1.0)
)


def _run_twin(
    a: np.ndarray, b: np.ndarray, out_shape: tuple[int, ...], tiles: WgmmaTiles, out_dtype: str | None = None
) -> np.ndarray:
    import tvm

    dtype = "bfloat16" if a.dtype == numpy_dtype("bfloat16") else "float16"
    out_dtype = out_dtype or dtype
    func = wgmma_twin(a.shape, b.shape, out_shape, dtype, out_dtype, tiles)
    ex = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target="llvm")
    out = tvm.runtime.empty(out_shape, out_dtype, tvm.cpu())
    ex(tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    return out.numpy()


def test_the_stored_layouts_are_what_the_descriptors_read() -> None:
    # Each element's store offset (the copies) is the address the descriptor names for it (the MMA's reads),
    # and no two elements share an address: A K-major, B N-major over four 64-column atoms.
    seen = set()
    for row in range(64):
        for k in range(BLOCK_K):
            address = k_major_address(0, A_DESC[1], row, k)
            assert address == 2 * a_offset(row, k)
            seen.add(address)
    assert len(seen) == 64 * BLOCK_K
    lbo, sbo = b_desc(256)
    seen = set()
    for k in range(BLOCK_K):
        for col in range(256):
            address = mn_major_address(0, lbo, sbo, k, col)
            assert address == 2 * b_offset(k, col)
            seen.add(address)
    assert len(seen) == BLOCK_K * 256
    # The swizzle moves chunks: row 1's first chunk is its second 16 bytes.
    assert a_offset(1, 0) == ATOM + 8


def test_the_accumulator_fragment_covers_the_tile_once() -> None:
    # 128 threads x N/2 registers are the 64 x N tile, each element once; thread 0 holds (0, 0), (0, 1),
    # (8, 0), (8, 1) in its first four registers (the PTX ISA's m64nNk16 D layout).
    n = 128
    cells = {fragment_row_col(t % 32, t // 32, r) for t in range(128) for r in range(n // 2)}
    assert cells == {(i, j) for i in range(64) for j in range(n)}
    assert [fragment_row_col(0, 0, r) for r in range(4)] == [(0, 0), (0, 1), (8, 0), (8, 1)]


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 140),
    n=st.integers(1, 40).map(lambda x: 8 * x),
    k=st.integers(1, 24).map(lambda x: 8 * x),
    tiles=st.sampled_from(
        [
            WgmmaTiles(1, 64, 1),
            WgmmaTiles(1, 128, 2),
            WgmmaTiles(2, 64, 3),
            WgmmaTiles(4, 64, 2),
            WgmmaTiles(1, 64, 4, pending=2),
            WgmmaTiles(2, 128, 2, staged=True),
        ]
    ),
    scale=st.sampled_from([1e-3, 1.0, 30.0]),
    seed=st.integers(0, 2**16),
    dtype=st.sampled_from(["float16", "bfloat16"]),
)
def test_twin_matches_float64_at_any_shape_and_magnitude(
    m: int, n: int, k: int, tiles: WgmmaTiles, scale: float, seed: int, dtype: str
) -> None:
    # Ragged M, N and K (the zero-filled copies, the guarded write-back), one to three stages of the ring.
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((m, k)) * scale).astype(numpy_dtype(dtype))
    b = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(numpy_dtype(dtype))
    want = a.astype(np.float64) @ b.astype(np.float64)
    got = _run_twin(a, b, (m, n), tiles).astype(np.float64)
    assert np.isfinite(got).all()
    rounding = np.linalg.norm(want.astype(numpy_dtype(dtype)).astype(np.float64) - want)
    tol = (2e-3 if dtype == "float16" else 8e-3) * np.linalg.norm(want) + 2 * rounding
    assert np.linalg.norm(got - want) <= tol


def test_twin_float32_output_is_the_accumulator() -> None:
    # A float32 result is the float32 accumulation itself: within float32 rounding of float64's answer,
    # through a four-stage ring over nine reduction steps.
    rng = np.random.default_rng(3)
    a = rng.standard_normal((96, 576)).astype(np.float16)
    b = rng.standard_normal((576, 136)).astype(np.float16)
    want = a.astype(np.float64) @ b.astype(np.float64)
    got = _run_twin(a, b, (96, 136), WgmmaTiles(1, 128, 4), "float32")
    assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()


def test_twin_batched_and_broadcast_operands() -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 70, 48)).astype(np.float16)
    b = rng.standard_normal((48, 24)).astype(np.float16)  # one B for every batch (a weight)
    want = a.astype(np.float64) @ b.astype(np.float64)
    got = _run_twin(a, b, (3, 70, 24), WgmmaTiles(1, 64, 2), "float32")
    assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()
    bb = rng.standard_normal((3, 48, 24)).astype(np.float16)
    want = a.astype(np.float64) @ bb.astype(np.float64)
    got = _run_twin(a, bb, (3, 70, 24), WgmmaTiles(2, 64, 2), "float32")
    assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()


@pytest.mark.parametrize(
    ("tiles", "dims", "why"),
    [
        (WgmmaTiles(3, 64, 2), (64, 64, 64), "warpgroups=3"),
        (WgmmaTiles(1, 96, 2), (64, 64, 64), "block_n=96"),
        (WgmmaTiles(1, 64, 5), (64, 64, 64), "stages=5"),
        (WgmmaTiles(1, 64, 2), (64, 64, 4), "multiples of 8"),
        (WgmmaTiles(1, 64, 2), (64, 60, 64), "multiples of 8"),
    ],
)
def test_what_the_kernel_does_not_cover_is_refused(
    tiles: WgmmaTiles, dims: tuple[int, int, int], why: str
) -> None:
    m, n, k = dims
    with pytest.raises(ScheduleError, match=why):
        wgmma_matmul((m, k), (k, n), (m, n), "float16", "float16", tiles)
    with pytest.raises(ScheduleError, match="float32"):
        wgmma_matmul((64, 64), (64, 64), (64, 64), "float32", "float32", WgmmaTiles(1, 64, 1))


@pytest.mark.skipif(cubin_unavailable_reason() is not None, reason="needs nvcc for the PTX")
@pytest.mark.parametrize(
    ("tiles", "dtype"),
    [
        (WgmmaTiles(1, 64, 1), "float16"),
        (WgmmaTiles(2, 256, 3), "float16"),
        (WgmmaTiles(4, 128, 4), "float16"),
        (WgmmaTiles(2, 256, 3, staged=True), "float16"),
        (WgmmaTiles(1, 128, 4), "bfloat16"),
    ],
)
def test_ptx_has_wgmma_and_no_spills(tiles: WgmmaTiles, dtype: str) -> None:
    import tvm

    from gensorage.codegen.cuda_build import cuda_target

    m, n, k = 300, 520, 1000  # ragged in every dim
    func = wgmma_matmul((m, k), (k, n), (m, n), dtype, dtype, tiles)
    hw = dataclasses.replace(H200, arch=ARCH)
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    src = str(tvm.compile(mod, target=cuda_target(hw)).mod.imports[0].inspect_source())
    got = ptx_and_resources(src, ARCH)
    assert got is not None
    ptx, report = got
    ab = {"float16": "f16", "bfloat16": "bf16"}[dtype]
    # Four k16 MMAs per 64-wide step (nvcc may unroll the loop), the transposed (N-major) B.
    mmas = re.findall(rf"wgmma\.mma_async\.sync\.aligned\.m64n{tiles.block_n}k16\.f32\.{ab}\.{ab}", ptx)
    assert mmas and len(mmas) % 4 == 0
    assert "wgmma.fence.sync.aligned" in ptx and "wgmma.commit_group.sync.aligned" in ptx
    assert "cp.async.cg.shared.global" in ptx and "fence.proxy.async.shared::cta" in ptx
    (res,) = report.values()
    assert res.spill_stores == res.spill_loads == res.stack_bytes == 0
    # The construction's register estimate is within a few of ptxas's count.
    assert abs(res.registers - registers(tiles)) <= 16


def test_construction_picks_wgmma_for_large_gemms_and_mma_sync_for_decode() -> None:
    for dims in ((1, 8192, 8192, 8192), (1, 4096, 4096, 4096)):
        tiles, cost = construct_matmul_tiles(dims, H200)
        assert isinstance(tiles, WgmmaTiles)
        mma, mma_cost = construct_tensor_core(dims, H200)
        assert cost.total_s < mma_cost.total_s
    tiles, _ = construct_matmul_tiles((1, 16, 4096, 4096), H200)
    assert isinstance(tiles, TensorCoreTiles)
    # K = 4 has no 16-byte copies: mma.sync.
    assert isinstance(construct_matmul_tiles((1, 65536, 1024, 4), H200)[0], TensorCoreTiles)


@pytest.mark.parametrize("name", ["a100", "rtx4090", "orin-nano"])
def test_other_gpus_construct_what_they_did(name: str) -> None:
    hw = load_profile(name)
    assert not wgmma_available(hw)
    for dims in ((1, 4096, 4096, 4096), (1, 16, 4096, 4096)):
        assert construct_matmul_tiles(dims, hw) == construct_tensor_core(dims, hw)


def test_wgmma_rate_comes_from_the_profile() -> None:
    t, dims = WgmmaTiles(2, 256, 3), (1, 8192, 8192, 8192)
    fast = predict_tiles_time(dims, t, H200)
    slow_hw = dataclasses.replace(H200, calibration=dataclasses.replace(H200.calibration, wgmma_fraction=0.1))
    slow = predict_tiles_time(dims, t, slow_hw)
    assert fast is not None and slow is not None
    assert slow.total_s > fast.total_s and slow.bound == "compute"
    off = dataclasses.replace(H200, calibration=dataclasses.replace(H200.calibration, wgmma_fraction=0.0))
    assert predict_tiles_time(dims, t, off) is None


def test_the_space_keeps_blocks_within_the_shape() -> None:
    assert wgmma_fits(WgmmaTiles(1, 64, 2), (1, 16, 64, 4096))
    assert not wgmma_fits(WgmmaTiles(2, 64, 2), (1, 16, 64, 4096))  # two warpgroups of padding rows
    assert not wgmma_fits(WgmmaTiles(1, 256, 2), (1, 64, 128, 4096))
    assert not wgmma_fits(WgmmaTiles(1, 64, 1), (1, 64, 64, 4096))  # several steps, not pipelined
    assert not wgmma_fits(WgmmaTiles(1, 64, 4), (1, 64, 64, 128))  # more stages than steps
    assert not wgmma_fits(WgmmaTiles(1, 64, 2, pending=2), (1, 64, 64, 4096))  # no slot left for the copies
    assert WgmmaTiles(1, 64, 4, pending=2).ahead == 2 and WgmmaTiles(1, 64, 4).ahead == 3
    assert WgmmaTiles(1, 64, 1).ahead == 1 and WgmmaTiles(1, 64, 1).in_flight == 0


@pytest.mark.skipif(cubin_unavailable_reason() is not None, reason="needs nvcc to build cubins")
def test_the_smoke_gemm_bundles(tmp_path: Path) -> None:
    from benchmarks import gpu_wgmma
    from benchmarks.gpu_bundle import validate_bundle
    from benchmarks.gpu_prepare import write_manifest

    dims, tiles = gpu_wgmma.SMOKE["smoke_n64"]
    case = gpu_wgmma.wgmma_case("smoke_n64", dims, tiles, H200, tmp_path, "float16", "wgmma64x64s1")
    write_manifest(tmp_path, [case], {"hw": "h200"})
    (parsed,) = validate_bundle(tmp_path)
    (kernel,) = parsed.raw["kernels"]
    assert kernel["block"] == [128, 1, 1] and kernel["grid"] == [16, 1, 1]
    assert kernel["smem"] == (64 + 64) * 64 * 2 + 1024
    assert "wgmma.mma_async" in (tmp_path / "smoke_n64_wgmma64x64s1.cu").read_text()


def _matmul_ugraph(m: int, n: int, k: int, dtype: str = "float16") -> tuple[object, object]:
    from gensorage.program import Program
    from gensorage.ugraph import from_program

    p = Program("mm")
    a = p.input("A", (m, k), dtype)
    b = p.input("B", (k, n), dtype)
    p.output(p.matmul(a, b))
    return p, from_program(p)


def test_a_ugraph_matmul_on_hopper_is_a_wgmma_kernel_and_its_twins_agree() -> None:
    from gensorage.codegen.field_twin import check_field_twin
    from gensorage.codegen.module import compile_ugraph

    # Ragged: M, N and K are not tile multiples.
    hw = SLOW_MMA
    m, n, k = 200, 136, 200
    program, g = _matmul_ugraph(m, n, k)
    cg = compile_ugraph(g, hw, "cuda")  # type: ignore[arg-type]
    (kern,) = cg.kernels("cuda")
    assert kern.rule.startswith("wgmma construct")
    (twin,) = cg.kernels("llvm")
    assert twin.rule == kern.rule
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    (got,) = cg.run(a, b)
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert _rel_err(got, want) < 2e-3
    assert check_field_twin(g, program, trials=1, hw=hw)  # type: ignore[arg-type]
    # Other GPUs, and decode-sized M, keep mma.sync.
    assert compile_ugraph(g, load_profile("a100"), "cuda").kernels("cuda")[0].rule.startswith("tensor-core")  # type: ignore[arg-type]
    _, small = _matmul_ugraph(16, 4096, 4096)
    assert compile_ugraph(small, H200, "cuda").kernels("cuda")[0].rule.startswith("tensor-core")  # type: ignore[arg-type]


@pytest.mark.skipif(cubin_unavailable_reason() is not None, reason="needs nvcc to build cubins")
def test_a_ugraph_with_a_wgmma_kernel_builds_for_sm_90a() -> None:
    from gensorage.codegen.module import compile_ugraph

    _, g = _matmul_ugraph(256, 256, 256)
    cg = compile_ugraph(g, SLOW_MMA, "cuda")  # type: ignore[arg-type]
    assert "wgmma.mma_async" in cg.cuda_source()
    assert cg.cubin()


def _two_dtypes_tma() -> object:
    from gensorage.program import Program
    from gensorage.ugraph import from_program

    p = Program("two_dtypes")
    for i, dtype in enumerate(("float16", "bfloat16")):
        p.output(p.matmul(p.input(f"A{i}", (256, 256), dtype), p.input(f"B{i}", (256, 256), dtype)))
    return from_program(p)


def _two_dtypes_cp_async() -> object:
    # Row-fused attention with the papers' unstabilised softmax: exp(S) is unbounded, so the probabilities are
    # stored in float32 and P @ V converts both operands to bfloat16 (a stable softmax's stay float16).
    from gensorage.precision import DEFAULT_PRECISION
    from gensorage.program import Program
    from gensorage.superopt.row_fusion import fused_direct

    p = Program("attention")
    q, k, v = (p.input(x, (2, 512, 128), "float16") for x in "QKV")
    e = p.exp(p.matmul(q, p.transpose(k, 1, 2)))
    p.output(p.matmul(p.div(e, p.sum(e, dim=2, keepdim=True)), v))
    return fused_direct(p, DEFAULT_PRECISION, SLOW_MMA)


@pytest.mark.skipif(cubin_unavailable_reason() is not None, reason="needs nvcc to build cubins")
@pytest.mark.parametrize("make", [_two_dtypes_tma, _two_dtypes_cp_async], ids=["tma", "cp_async"])
def test_wgmma_kernels_of_two_dtypes_build_into_one_module(make: Callable[[], object]) -> None:
    # CUDA gives every extern __shared__ array one address: two kernels declaring one name with two element
    # types do not compile (LLaMA-3's row-fused prefill attention: a float16 and a converting bfloat16 wgmma).
    from gensorage.codegen.module import compile_ugraph

    cg = compile_ugraph(make(), SLOW_MMA, "cuda")  # type: ignore[arg-type]
    assert sum(k.rule.startswith("wgmma") for k in cg.kernels("cuda")) == 2
    declared = re.findall(r"extern __shared__ __align__\(\d+\) (\w+) (\w+)\[\]", cg.cuda_source())
    assert {"half", "nv_bfloat16"} <= {t for t, _ in declared}
    assert len({n for _, n in declared}) == len(declared)
    assert cg.cubin()


def _rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))


@pytest.mark.parametrize(("gm", "gn"), [(1, 1), (3, 5), (8, 2), (13, 7), (64, 32)])
def test_the_grid_raster_visits_every_tile_once(gm: int, gn: int) -> None:
    from tvm import tirx
    from tvm.sym.analyzer import Analyzer

    ana = Analyzer()
    tiles = set()
    for bx in range(gm * gn):
        i, j = block_tile(tirx.const(bx, "int32"), gm, gn)
        tiles.add((int(ana.simplify(i)), int(ana.simplify(j))))
    assert tiles == {(i, j) for i in range(gm) for j in range(gn)}

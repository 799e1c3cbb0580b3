"""The warp-specialised TMA wgmma kernel: its twin against float64, the layout the copy engine writes, the PTX
nvcc makes, the tensor maps the runner encodes, and the bundle entries that name them."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.gpu_tensor_map import (
    DATA_TYPES,
    L2_PROMOTION_256B,
    OOB_FILL_NONE,
    SWIZZLES,
    TensorMapError,
    check_tensor_map,
    encode_arguments,
)
from gensorage.codegen.cuda_build import cubin_unavailable_reason, ptx_and_resources
from gensorage.codegen.wgmma import ARCH, ATOM, BLOCK_K, WgmmaTiles, a_offset, b_offset, wgmma_matmul
from gensorage.codegen.wgmma_tma import SETMAXNREG, stage_bytes, tensor_map_args
from gensorage.codegen.wgmma_twin import swizzle_128b, wgmma_twin
from gensorage.dtypes import numpy_dtype
from gensorage.errors import ScheduleError
from gensorage.hw import load_profile

H200 = load_profile("h200")


def _run_twin(a: np.ndarray, b: np.ndarray, tiles: WgmmaTiles, dtype: str) -> np.ndarray:
    import tvm

    m, n = a.shape[0], b.shape[1]
    func = wgmma_twin(a.shape, b.shape, (m, n), dtype, dtype, tiles)
    ex = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target="llvm")
    out = tvm.runtime.empty((m, n), dtype, tvm.cpu())
    ex(tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    return out.numpy()


def test_the_copy_engine_writes_the_layout_the_descriptors_read() -> None:
    # A 128-byte-swizzled box of 128-byte rows (the copy engine's layout: the 16-byte chunk bits 4-6 XOR
    # the row bits 7-9 of the shared address) is the kernel's A and B tile layout element for element.
    for row in range(128):
        for col in range(BLOCK_K):
            assert swizzle_128b((row * ATOM + col) * 2) == 2 * a_offset(row, col)
    for k in range(BLOCK_K):
        for col in range(256):
            box_at = (col // ATOM * ATOM * BLOCK_K + k * ATOM + col % ATOM) * 2  # box col // 64, row k
            assert swizzle_128b(box_at) == 2 * b_offset(k, col)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 200),
    n=st.integers(1, 40).map(lambda x: 8 * x),
    k=st.integers(1, 30).map(lambda x: 8 * x),
    tiles=st.sampled_from(
        [
            WgmmaTiles(1, 64, 2, tma=True),
            WgmmaTiles(2, 128, 3, tma=True),
            WgmmaTiles(1, 128, 6, tma=True),
            WgmmaTiles(2, 64, 4, pending=2, tma=True),
        ]
    ),
    scale=st.sampled_from([1e-3, 1.0, 30.0]),
    seed=st.integers(0, 2**16),
    dtype=st.sampled_from(["float16", "bfloat16"]),
)
def test_tma_twin_matches_float64_at_any_shape_and_magnitude(
    m: int, n: int, k: int, tiles: WgmmaTiles, scale: float, seed: int, dtype: str
) -> None:
    # Ragged M, N and K: the copy engine's zero fill outside the matrix, the guarded write-back; deep rings.
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((m, k)) * scale).astype(numpy_dtype(dtype))
    b = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(numpy_dtype(dtype))
    want = a.astype(np.float64) @ b.astype(np.float64)
    got = _run_twin(a, b, tiles, dtype).astype(np.float64)
    assert np.isfinite(got).all()
    rounding = np.linalg.norm(want.astype(numpy_dtype(dtype)).astype(np.float64) - want)
    tol = (2e-3 if dtype == "float16" else 8e-3) * np.linalg.norm(want) + 2 * rounding
    assert np.linalg.norm(got - want) <= tol


@pytest.mark.parametrize(
    ("tiles", "why"),
    [
        (WgmmaTiles(1, 64, 1, tma=True), "stages=1 must be 2 to 6 with TMA"),
        (WgmmaTiles(1, 64, 7, tma=True), "stages=7"),
        (WgmmaTiles(1, 64, 2, staged=True, tma=True), "staged"),
        (WgmmaTiles(1, 64, 2, persistent=132), "persistent grid needs TMA"),
    ],
)
def test_what_the_tma_kernel_does_not_cover_is_refused(tiles: WgmmaTiles, why: str) -> None:
    with pytest.raises(ScheduleError, match=why):
        wgmma_matmul((64, 64), (64, 64), (64, 64), "float16", "float16", tiles)
    with pytest.raises(ScheduleError, match="2-D operands"):
        wgmma_matmul((2, 64, 64), (64, 64), (2, 64, 64), "float16", "float16", WgmmaTiles(1, 64, 2, tma=True))


def test_a_tma_block_has_a_producer_warpgroup() -> None:
    t = WgmmaTiles(2, 256, 4, tma=True)
    assert t.threads == 384 and t.warps == 12 and t.block_m == 128
    assert dataclasses.replace(t, tma=False).threads == 256
    assert "TMA" in t.describe()


@pytest.mark.skipif(cubin_unavailable_reason() is not None, reason="needs nvcc for the PTX")
@pytest.mark.parametrize(
    ("tiles", "dtype"),
    [
        (WgmmaTiles(2, 256, 4, tma=True), "float16"),
        (WgmmaTiles(2, 128, 6, pending=2, tma=True), "bfloat16"),
        (WgmmaTiles(1, 64, 2, tma=True), "float16"),
        (WgmmaTiles(2, 256, 4, tma=True, persistent=132), "float16"),
    ],
)
def test_tma_ptx_has_bulk_tensor_copies_mbarriers_and_wgmma_and_no_spills(
    tiles: WgmmaTiles, dtype: str
) -> None:
    import tvm

    from gensorage.codegen.cuda_build import cuda_target

    m, n, k = 300, 520, 1000  # ragged in every dim
    func = wgmma_matmul((m, k), (k, n), (m, n), dtype, dtype, tiles)
    hw = dataclasses.replace(H200, arch=ARCH)
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    src = str(tvm.compile(mod, target=cuda_target(hw)).mod.imports[0].inspect_source())
    assert src.count("const __grid_constant__ CUtensorMap") == 2 * 2  # A_map, B_map: declaration, definition
    got = ptx_and_resources(src, ARCH)
    assert got is not None
    ptx, report = got
    ab = {"float16": "f16", "bfloat16": "bf16"}[dtype]
    assert re.search(
        r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\.mbarrier::complete_tx::bytes", ptx
    )
    assert "mbarrier.arrive.expect_tx.shared.b64" in ptx and "mbarrier.try_wait.parity" in ptx
    assert "mbarrier.init.shared.b64" in ptx and "mbarrier.arrive.shared.b64" in ptx
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{tiles.block_n}k16\.f32\.{ab}\.{ab}", ptx)
    assert "cp.async.cg.shared.global" not in ptx  # every operand load is a TMA copy
    assert "trap;" in ptx and "%globaltimer" in ptx  # a barrier wait that never ends stops the kernel
    assert ("setmaxnreg" in ptx) == (tiles.warpgroups in SETMAXNREG)
    (res,) = report.values()
    assert res.spill_stores == res.spill_loads == res.stack_bytes == 0
    if tiles.warpgroups in SETMAXNREG:
        # setmaxnreg moves registers within the block's launch-time share: 65536 / 384 threads per thread.
        producer, consumer = SETMAXNREG[tiles.warpgroups]
        assert res.registers == 168
        assert 128 * producer + 256 * consumer <= 384 * res.registers


@pytest.mark.parametrize("tiles", [WgmmaTiles(2, 256, 4, tma=True), WgmmaTiles(1, 64, 3, tma=True)])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_tensor_maps_the_runner_encodes(tiles: WgmmaTiles, dtype: str) -> None:
    m, n, k = 4096, 14336, 1000
    a, b = tensor_map_args(m, n, k, dtype, tiles)
    # A [M, K] row-major: K innermost, one K row of 2K bytes per M; a box of 64 K (128 bytes, the swizzle's
    # span) by the block's rows. B [K, N]: N innermost; 64 N x 64 K boxes, block_n / 64 per step.
    assert (a.dims, a.strides, a.box) == ((k, m), (2 * k,), (BLOCK_K, tiles.block_m))
    assert (b.dims, b.strides, b.box) == ((n, k), (2 * n,), (ATOM, BLOCK_K))
    # The boxes of one step are the bytes the full barrier expects.
    assert 2 * (a.box[0] * a.box[1] + tiles.block_n // ATOM * b.box[0] * b.box[1]) == stage_bytes(tiles)
    for spec, address in ((a, 0x7F0000000000), (b, 0x7F0000100000)):
        args = encode_arguments(spec.as_json(), address)
        assert args == (
            DATA_TYPES[dtype],
            2,
            address,
            spec.dims,
            spec.strides,
            spec.box,
            (1, 1),
            0,
            SWIZZLES[128],
            L2_PROMOTION_256B,
            OOB_FILL_NONE,
        )
    assert DATA_TYPES == {"float16": 6, "bfloat16": 9} and SWIZZLES[128] == 3  # cuda.h's enum values


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"strides": [1000]}, "multiples of 16"),
        ({"box": [128, 64]}, "exceeds the 128-byte swizzle"),
        ({"box": [64, 512]}, "at most 256"),
        ({"dtype": "float32"}, "dtype"),
        ({"swizzle": 96}, "swizzle"),
        ({"dims": [64]}, "rank"),
    ],
)
def test_a_tensor_map_the_copy_engine_refuses_is_named(change: dict[str, object], why: str) -> None:
    spec = {**tensor_map_args(64, 64, 64, "float16", WgmmaTiles(1, 64, 2, tma=True))[0].as_json(), **change}
    assert why in str(check_tensor_map(spec))
    with pytest.raises(TensorMapError, match=why):
        encode_arguments(spec, 0)
    good = tensor_map_args(64, 64, 64, "float16", WgmmaTiles(1, 64, 2, tma=True))[0].as_json()
    with pytest.raises(TensorMapError, match="aligned"):
        encode_arguments(good, 8)


@pytest.mark.skipif(cubin_unavailable_reason() is not None, reason="needs nvcc to build cubins")
def test_a_tma_gemm_bundles_with_its_tensor_maps(tmp_path: Path) -> None:
    from benchmarks import gpu_wgmma
    from benchmarks.gpu_bundle import validate_bundle
    from benchmarks.gpu_prepare import write_manifest

    tiles = WgmmaTiles(1, 64, 2, tma=True)
    dims = (200, 136, 200)
    case = gpu_wgmma.wgmma_case(
        "smoke_tma", dims, tiles, H200, tmp_path, "float16", gpu_wgmma.variant_name(tiles)
    )
    write_manifest(tmp_path, [case], {"hw": "h200"})
    (parsed,) = validate_bundle(tmp_path)
    (kernel,) = parsed.kernels
    # The kernel's parameters in order: A's map, B's map, C's pointer.
    assert kernel.args == ("A", "B", "C") and kernel.block == (256, 1, 1)
    a, b = tensor_map_args(*dims, "float16", tiles)
    assert kernel.maps == (a.as_json(), b.as_json(), None)
    # An unchanged (cp.async) kernel passes only pointers: no maps, the CuPy launch path.
    plain = gpu_wgmma.wgmma_case("smoke_n64", dims, WgmmaTiles(1, 64, 2), H200, tmp_path, "float16", "p")
    write_manifest(tmp_path, [plain], {"hw": "h200"})
    assert validate_bundle(tmp_path)[0].kernels[0].maps == ()


def test_the_construction_takes_tma_where_asked_and_for_2d_predefined_matmuls() -> None:
    from gensorage.construction.tensor_core import construct_matmul_tiles, construct_predefined_matmul

    for dims in ((1, 8192, 8192, 8192), (1, 4096, 4096, 4096), (1, 65536, 4096, 1024)):
        with_tma, _ = construct_matmul_tiles(dims, H200, "float16", tma=True)
        assert isinstance(with_tma, WgmmaTiles) and with_tma.tma and with_tma.stages >= 2
        without, _ = construct_matmul_tiles(dims, H200, "float16")
        assert isinstance(without, WgmmaTiles) and not without.tma
    # A µGraph's pre-defined matmul: TMA with 2-D operands (the kernel's host code encodes the maps), the
    # cp.async kernel with a batch dim.
    got = construct_predefined_matmul((4096, 4096), (4096, 4096), (4096, 4096), "float16", "float16", H200)
    assert got is not None and isinstance(got[0], WgmmaTiles) and got[0].tma
    got = construct_predefined_matmul(
        (2, 2000, 1048), (1048, 1032), (2, 2000, 1032), "float16", "float16", H200
    )
    assert got is not None and isinstance(got[0], WgmmaTiles) and not got[0].tma


def _matmul_program(m: int, n: int, k: int) -> object:
    from gensorage.program import Program

    p = Program("mm")
    a = p.input("A", (m, k), "float16")
    b = p.input("B", (k, n), "float16")
    p.output(p.matmul(a, b))
    return p


def test_a_ugraph_matmul_takes_tma_with_its_maps_encoded_by_the_host_code() -> None:
    # What TVM's runtime needs to run the kernel: the host function encodes both tensor maps (TVM's
    # runtime.cuTensorMapEncodeTiled) and passes them by value to the kernel's __grid_constant__ parameters.
    from gensorage.codegen.module import compile_ugraph
    from gensorage.ugraph import from_program

    m, n, k = 1000, 1032, 1048  # ragged
    program = _matmul_program(m, n, k)
    cg = compile_ugraph(from_program(program), H200, "cuda")  # type: ignore[arg-type]
    (kern,) = cg.kernels("cuda")
    assert "TMA loads" in kern.rule
    assert cg.tir("cuda").count("T.tensormap_encode_tiled(") == 2
    assert cg.cuda_source().count("const __grid_constant__ CUtensorMap") == 4  # declaration, definition
    host = cg.executable("cuda").mod.inspect_source("ll")
    assert "runtime.cuTensorMapEncodeTiled" in host
    if cubin_unavailable_reason() is None:
        assert cg.cubin()
    # Its CPU twin on llvm: the same tiling, against float64.
    rng = np.random.default_rng(3)
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    (got,) = cg.run(a, b)
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want) < 2e-3


def test_a_tma_matmul_runs_through_tvms_runtime_on_the_gpu() -> None:
    """On a Hopper GPU (skipped elsewhere): TVM's runtime runs the TMA kernel, host-encoded maps and all."""
    from gensorage.codegen.cuda_build import cuda_device_available
    from gensorage.codegen.module import compile_ugraph
    from gensorage.ugraph import from_program

    why = cuda_device_available()
    if why is not None:
        pytest.skip(f"needs a CUDA GPU: {why}")
    for m, n, k in ((1000, 1032, 1048), (2048, 4096, 1024)):
        program = _matmul_program(m, n, k)
        cg = compile_ugraph(from_program(program), H200, "cuda")  # type: ignore[arg-type]
        assert "TMA loads" in cg.kernels("cuda")[0].rule
        for seed in (0, 1):  # fresh inputs twice: an output left unwritten cannot pass
            rng = np.random.default_rng(seed)
            a = rng.standard_normal((m, k)).astype(np.float16)
            b = rng.standard_normal((k, n)).astype(np.float16)
            (got,) = cg.run(a, b, target="cuda")
            want = a.astype(np.float64) @ b.astype(np.float64)
            assert np.linalg.norm(np.asarray(got, np.float64) - want) / np.linalg.norm(want) < 2e-3


def test_tma_kernels_are_priced_by_their_own_rate_and_only_where_the_profile_has_it() -> None:
    from gensorage.construction.tensor_core import predict_tiles_time
    from gensorage.construction.wgmma import registers, tma_available, wgmma_neighbours

    cal = H200.calibration
    assert tma_available(H200) and 0 < cal.tma_wgmma_fraction <= 1 and 0 < cal.tma_l2_fraction <= 1
    dims = (1, 8192, 8192, 8192)
    tma, plain = WgmmaTiles(2, 256, 4, tma=True), WgmmaTiles(2, 256, 4)
    t_tma, t_plain = predict_tiles_time(dims, tma, H200), predict_tiles_time(dims, plain, H200)
    assert t_tma is not None and t_plain is not None and t_tma.bound == t_plain.bound == "l2"
    # Bound by L2 alike, the launch aside, in the ratio of the two L2 fractions; besides, the TMA kernel's 16
    # rounds of 132 tiles each write their tile back (at an SM's share of DRAM) and fill their ring.
    dram_sm = H200.level("dram").bandwidth_Bps * cal.dram_fraction / H200.sm_count
    serial = 16 * (128 * 256 * 2 / dram_sm + cal.wgmma_latency_cycles / H200.clock_hz)
    ratio = (t_plain.total_s - cal.launch_overhead_s) / (t_tma.total_s - cal.launch_overhead_s - serial)
    assert ratio == pytest.approx(cal.tma_l2_fraction / cal.l2_fraction)
    # Never under the MMAs at the TMA kernels' own rate.
    assert t_tma.total_s >= 2 * 8192**3 / (H200.flops("float16", True) * cal.tma_wgmma_fraction)
    assert registers(tma) == 168 and t_tma.blocks_per_sm == 1
    without = dataclasses.replace(H200, calibration=dataclasses.replace(cal, tma_wgmma_fraction=0.0))
    assert not tma_available(without) and predict_tiles_time(dims, tma, without) is None
    # The move between the two loads, and the TMA ring's deeper stages, are in the space only with tma.
    assert WgmmaTiles(2, 128, 4, tma=True) in wgmma_neighbours(WgmmaTiles(2, 128, 4), dims, tma=True)
    assert WgmmaTiles(2, 128, 5, tma=True) in wgmma_neighbours(
        WgmmaTiles(2, 128, 4, tma=True), dims, tma=True
    )
    assert not any(t.tma for t in wgmma_neighbours(WgmmaTiles(2, 128, 4), dims))


def test_a_profile_with_a_tma_rate_above_the_peak_is_refused(tmp_path: Path) -> None:
    from gensorage.errors import ConfigError

    text = (Path(__file__).resolve().parents[1] / "configs/hw/h200.toml").read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace("tma_wgmma_fraction = 0.76", "tma_wgmma_fraction = 1.5"))
    with pytest.raises(ConfigError, match="tma_wgmma_fraction"):
        load_profile(str(bad))


def test_calibration_recovers_the_tma_rates_from_measured_tma_kernels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from benchmarks import calibrate_tensor_core as calibrate
    from gensorage.construction.tensor_core import predict_tiles_time

    # "Measured" times made by the model at known TMA rates; the other constants held at the profile's.
    monkeypatch.setattr(calibrate, "GRID", {k: [getattr(H200.calibration, k)] for k in calibrate.GRID})
    truth = dataclasses.replace(H200.calibration, tma_wgmma_fraction=0.6, tma_l2_fraction=0.5)
    hw = dataclasses.replace(H200, calibration=truth)
    data = []
    for dims in ((1, 8192, 8192, 8192), (1, 4096, 4096, 4096), (1, 65536, 4096, 1024)):
        for tiles in (WgmmaTiles(2, 256, 4, tma=True), WgmmaTiles(2, 128, 6, tma=True)):
            cost = predict_tiles_time(dims, tiles, hw)
            assert cost is not None
            data.append((dims, tiles, cost.total_s))
    fitted, score = calibrate.calibrate(H200, data)
    assert (fitted.tma_wgmma_fraction, fitted.tma_l2_fraction) == (0.6, 0.5)
    assert score["median_abs_log_error"] == pytest.approx(0.0)


def test_tma_cases_run_after_every_other_case() -> None:
    from benchmarks.gpu_prepare import _priority

    def case(shape: str, variant: str, tma: bool | None, kind: str = "gemm") -> dict[str, object]:
        tiles = {} if tma is None else {"tiles": dataclasses.asdict(WgmmaTiles(1, 64, 2, tma=tma))}
        return {"kind": kind, "meta": {"shape": shape, "variant": variant, **tiles}}

    plain = [
        case("M1", "constructed", None),
        case("smoke_ragged", "wgmma64x64s2", False),
        case("M1", "wgmma_constructed", False),
        case("M1", "wgmma128x256s4", False),
        case("gated_mlp", "direct", None, "program"),
    ]
    tma = [case("smoke_tma", "wgmma64x64s2tma", True), case("M1", "wgmma_constructed", True)]
    tma.append(case("M1", "wgmma128x256s4tma", True))
    assert max(_priority(c) for c in plain) < min(_priority(c) for c in tma)
    assert _priority(tma[0]) < _priority(tma[2])  # the TMA smoke GEMMs first among them


@pytest.mark.parametrize(
    "tiles", [WgmmaTiles(1, 64, 3, tma=True), WgmmaTiles(2, 128, 2, pending=2, tma=True)]
)
def test_the_field_twin_runs_the_tma_tiling_exactly(tiles: WgmmaTiles) -> None:
    import tvm

    # int64 residues: each product reduced mod p, the sum mod p; equal to the exact modular product, so every
    # element of every box is read once, from the right place (a misplaced or doubled one changes the sum).
    p = 2_147_483_629
    m, n, k = 150, 136, 200
    rng = np.random.default_rng(7)
    a = rng.integers(0, p, (m, k), dtype=np.int64)
    b = rng.integers(0, p, (k, n), dtype=np.int64)
    func = wgmma_twin(a.shape, b.shape, (m, n), "int64", "int64", tiles, modulus=p)
    ex = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target="llvm")
    out = tvm.runtime.empty((m, n), "int64", tvm.cpu())
    ex(tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    want = np.array(
        [
            [sum(int(x) * int(y) for x, y in zip(a[i], b[:, j], strict=True)) % p for j in range(n)]
            for i in range(m)
        ]
    )
    assert np.array_equal(out.numpy(), want)


class _Barrier:
    """An mbarrier as the PTX ISA defines it: a phase completes when its arrivals (and bytes) are in;
    ``try_wait.parity(q)`` passes once the phase of parity ``q`` has completed, which on a barrier in phase
    ``p`` means ``q != p % 2`` (phase ``-1`` counts as completed)."""

    def __init__(self, count: int) -> None:
        self.count, self.pending, self.phase = count, count, 0

    def arrive(self) -> None:
        self.pending -= 1
        if self.pending == 0:
            self.phase, self.pending = self.phase + 1, self.count

    def passes(self, parity: int) -> bool:
        return parity != self.phase % 2


def _simulate_ring(stages: int, wait: int, ktiles: int, tiles: int, warps: int, seed: int) -> None:
    """Runs the kernel's producer and consumer warps over ``tiles`` tiles in a random interleaving, with its
    slots, parities and releases; fails on a deadlock, a step read from a slot that does not hold it, or a
    slot overwritten while a warp's MMAs may still read it."""
    import random

    from gensorage.codegen.wgmma_tma import empty_parity, freed_steps, full_parity, ring_slot

    rng = random.Random(seed)
    full, empty = [_Barrier(1) for _ in range(stages)], [_Barrier(warps) for _ in range(stages)]
    held: list[int | None] = [None] * stages  # the step whose boxes a slot holds
    reading: list[set[int]] = [set() for _ in range(warps)]  # steps a warp has issued and not freed
    total = tiles * ktiles
    produced, consumed = 0, [0] * warps
    while produced < total or min(consumed) < total:
        ready = []
        if produced < total and empty[ring_slot(produced, stages)].passes(empty_parity(produced, stages)):
            ready.append(-1)
        ready += [
            w
            for w in range(warps)
            if consumed[w] < total
            and full[ring_slot(consumed[w], stages)].passes(full_parity(consumed[w], stages))
        ]
        assert ready, f"deadlock at produced={produced}, consumed={consumed}"
        agent = rng.choice(ready)
        if agent < 0:  # the producer: expect_tx and the copies (complete at once here)
            slot = ring_slot(produced, stages)
            assert not any(ring_slot(g, stages) == slot for r in reading for g in r), "slot overwritten"
            held[slot] = produced
            full[slot].arrive()
            produced += 1
            continue
        g = consumed[agent]
        assert held[ring_slot(g, stages)] == g, f"warp {agent} read the wrong step at {g}"
        reading[agent].add(g)
        tile, kt = divmod(g, ktiles)
        # wait_group(wait) after step kt has seen steps up to kt - wait done; wait_group(0) at a tile's end all.
        assert all(j <= kt - wait for j in freed_steps(kt, ktiles, wait)), "slot freed under running MMAs"
        freed = freed_steps(kt, ktiles, wait) + (
            freed_steps(ktiles, ktiles, wait) if kt == ktiles - 1 else []
        )
        for j in freed:
            reading[agent].remove(tile * ktiles + j)
            empty[ring_slot(tile * ktiles + j, stages)].arrive()
        consumed[agent] += 1
    assert all(not r for r in reading)


@pytest.mark.parametrize("stages", [2, 3, 4, 6])
@pytest.mark.parametrize("wait", [1, 2])
@pytest.mark.parametrize("ktiles", [1, 2, 3, 7])
def test_the_ring_protocol_never_deadlocks_or_overwrites_a_slot_in_use(
    stages: int, wait: int, ktiles: int
) -> None:
    # Over several tiles per block (the persistent grid: the ring runs on from tile to tile) and random
    # interleavings of the producer and the consumer warps.
    if wait > stages - 1:
        return
    for seed in range(20):
        _simulate_ring(stages, wait, ktiles, tiles=3, warps=4, seed=seed)


def test_a_persistent_grid_hides_the_fill_of_every_tile_but_the_first() -> None:
    from gensorage.construction.tensor_core import construct_matmul_tiles, predict_tiles_time
    from gensorage.construction.wgmma import wgmma_neighbours

    sms = H200.sm_count
    plain, persistent = WgmmaTiles(2, 256, 4, tma=True), WgmmaTiles(2, 256, 4, tma=True, persistent=sms)
    # 8192 tiles over 132 SMs: 63 rounds; the persistent grid saves 62 fills of the ring.
    many = (1, 65536, 4096, 1024)
    a, b = predict_tiles_time(many, plain, H200), predict_tiles_time(many, persistent, H200)
    assert a is not None and b is not None and b.total_s < a.total_s
    fill = H200.calibration.wgmma_latency_cycles / H200.clock_hz
    assert a.total_s - b.total_s == pytest.approx(62 * fill)
    # 128 tiles: one round, one fill either way.
    one = (1, 4096, 1024, 4096)
    a, b = predict_tiles_time(one, plain, H200), predict_tiles_time(one, persistent, H200)
    assert a is not None and b is not None and a.total_s == pytest.approx(b.total_s)
    # The construction moves to and from the persistent grid (TMA only) and takes it where it is faster.
    assert persistent in wgmma_neighbours(plain, many, tma=True, sms=sms)
    assert plain in wgmma_neighbours(persistent, many, tma=True, sms=sms)
    picked, _ = construct_matmul_tiles(many, H200, "float16", tma=True)
    assert isinstance(picked, WgmmaTiles) and picked.persistent == sms
    picked, _ = construct_matmul_tiles(one, H200, "float16", tma=True)
    assert isinstance(picked, WgmmaTiles) and picked.tma and picked.persistent == 0  # ties: one block a tile


@pytest.mark.parametrize(
    "dims", [(1, 16, 14336, 4096), (1, 8, 4096, 4096), (1, 8, 14336, 4096), (1, 16, 4096, 4096)]
)
def test_decode_sized_gemms_keep_the_kernels_they_had_before_tma(dims: tuple[int, int, int, int]) -> None:
    # Fewer rows than a block: TMA is out of the space (on the H200 it ran 16 x 14336 x 4096 at 0.60x of cuBLAS
    # against 0.77x for the cp.async wgmma kernel), so the pick is what the space without TMA gives.
    from gensorage.construction.tensor_core import construct_matmul_tiles, construct_predefined_matmul

    with_tma, _ = construct_matmul_tiles(dims, H200, "float16", tma=True)
    without, _ = construct_matmul_tiles(dims, H200, "float16")
    assert with_tma == without and not getattr(with_tma, "tma", False)
    _, m, n, k = dims
    got = construct_predefined_matmul((m, k), (k, n), (m, n), "float16", "float16", H200)
    assert got is not None and got[0] == without

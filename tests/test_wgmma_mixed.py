"""wgmma matmuls of a float32 operand with a 16-bit one: both multiply in bfloat16, converted in the threads'
copies to shared memory (gensorage.codegen.wgmma), as mma.sync converts them; never TMA (it copies bytes). The
CPU twins of both round the operands as the GPU does."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from gensorage.codegen.cuda_build import cubin_unavailable_reason, ptx_and_resources
from gensorage.codegen.module import compile_ugraph
from gensorage.codegen.predefined_matmul import _matmul_build, _MatmulShape
from gensorage.codegen.tensor_core import TensorCoreTiles, schedule_tensor_core
from gensorage.codegen.wgmma import WgmmaTiles, wgmma_matmul
from gensorage.codegen.wgmma_twin import wgmma_twin
from gensorage.construction.tensor_core import construct_predefined_matmul
from gensorage.dtypes import numpy_dtype
from gensorage.errors import ScheduleError
from gensorage.hw import load_profile
from gensorage.program import Program
from gensorage.ugraph import from_program
from gensorage.verify.floatcheck import round_to

H200 = load_profile("h200")
#: A Hopper whose mma.sync is slow: the construction takes wgmma even at shapes small enough for the twins.
SLOW_MMA = dataclasses.replace(
    H200, calibration=dataclasses.replace(H200.calibration, mma_sync_fraction=0.01, wgmma_fraction=1.0)
)
# (tiles, (m, n, k), B stored [N, K]): ragged edges, one to three stages, an N-major and a K-major B.
CASES = [
    (WgmmaTiles(1, 64, 1), (37, 72, 40), False),
    (WgmmaTiles(1, 64, 2), (70, 72, 136), False),
    (WgmmaTiles(2, 128, 3), (130, 200, 200), True),
    (WgmmaTiles(1, 64, 4, pending=2), (64, 64, 264), True),
]


def _twin(a: np.ndarray, b: np.ndarray, b_dtype: str, tiles: WgmmaTiles, k_major_b: bool) -> np.ndarray:
    import tvm

    m, n = a.shape[0], b.shape[0] if k_major_b else b.shape[1]
    func = wgmma_twin(
        a.shape, b.shape, (m, n), "float32", "float32", tiles, k_major_b=k_major_b, b_dtype=b_dtype
    )
    ex = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target="llvm")
    out = tvm.runtime.empty((m, n), "float32", tvm.cpu())
    ex(tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    return out.numpy().astype(np.float64)


@pytest.mark.parametrize("b_dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize(("tiles", "mnk", "k_major_b"), CASES)
@pytest.mark.parametrize("scale", [1e-3, 30.0])
def test_twin_of_a_float32_times_16_bit_gemm_matches_float64(
    b_dtype: str, tiles: WgmmaTiles, mnk: tuple[int, int, int], k_major_b: bool, scale: float
) -> None:
    m, n, k = mnk
    rng = np.random.default_rng(m * n + k)
    a = (rng.standard_normal((m, k)) * scale).astype(np.float32)
    b = (rng.standard_normal((n, k) if k_major_b else (k, n)) / np.sqrt(k)).astype(numpy_dtype(b_dtype))
    b64 = b.astype(np.float64).T if k_major_b else b.astype(np.float64)
    got = _twin(a, b, b_dtype, tiles, k_major_b)
    assert np.isfinite(got).all()
    want = a.astype(np.float64) @ b64
    # The tolerance of the mixed mma.sync tests (tests/test_operand_views.py): both operands in bfloat16.
    assert np.linalg.norm(got - want) <= 8e-3 * np.linalg.norm(want)
    # And the rounding is the GPU's: both operands rounded to bfloat16 (to nearest even), products in float32.
    rounded = round_to(a, "bfloat16") @ round_to(b64, "bfloat16")
    assert np.linalg.norm(got - rounded) <= 1e-5 * np.linalg.norm(rounded)
    assert np.linalg.norm(got - want) > 1e-4 * np.linalg.norm(want)  # not float32's answer


@pytest.mark.parametrize("b_dtype", ["bfloat16", "float16"])
def test_the_mma_sync_twin_rounds_a_float32_operand_as_the_gpu_does(b_dtype: str) -> None:
    import tvm

    m, n, k = 48, 64, 96
    shape = _MatmulShape((m, k), (k, n), (m, n), False, False)
    build = _matmul_build(
        shape, "float32", "float32", None, b_dtype=b_dtype, cast_to="bfloat16", cast_by_bits=True
    )
    sch = schedule_tensor_core(build(), TensorCoreTiles(32, 32, 32, 16, 16, 2), gpu=False, convert=True)
    ex = tvm.compile(sch.mod, target="llvm")
    rng = np.random.default_rng(7)
    a = (rng.standard_normal((m, k)) * 30).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(numpy_dtype(b_dtype))
    out = tvm.runtime.empty((m, n), "float32", tvm.cpu())
    ex(tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    got, b64 = out.numpy().astype(np.float64), b.astype(np.float64)
    rounded = round_to(a, "bfloat16") @ round_to(b64, "bfloat16")
    assert np.linalg.norm(got - rounded) <= 1e-5 * np.linalg.norm(rounded)
    want = a.astype(np.float64) @ b64
    assert 1e-4 * np.linalg.norm(want) < np.linalg.norm(got - want) <= 8e-3 * np.linalg.norm(want)


def test_the_construction_puts_mixed_operands_on_cp_async_wgmma_never_tma() -> None:
    dims = ((2048, 2048), (2048, 2048), (2048, 2048))
    same = construct_predefined_matmul(*dims, "bfloat16", "bfloat16", H200)
    mixed = construct_predefined_matmul(*dims, "float32", "bfloat16", H200)
    assert same is not None and mixed is not None
    assert isinstance(same[0], WgmmaTiles) and isinstance(mixed[0], WgmmaTiles)
    assert same[0].tma  # this shape takes TMA where the operands are copied as bytes
    assert mixed[0] == dataclasses.replace(same[0], tma=False)  # priced at the MMA dtype, as mma.sync is
    with pytest.raises(ScheduleError, match="TMA copies bytes"):
        wgmma_matmul(*dims, "float32", "float32", same[0], b_dtype="bfloat16")


def _normed_matmul(dtype: str, m: int, n: int, k: int, transposed: bool) -> Program:
    """``(x·g / rms(x)) @ W`` (or ``@ W.T``): the gain inside the division is bounded by √k·|g| only, so the
    precision policy keeps the normalised x in float32 (a bare ``rms_norm(x)``, bounded by √k, is stored in the
    program's dtype), and a sum reads it too (read by matmuls alone, a bfloat16 program would store it in
    bfloat16: matmul_operands)."""
    p = Program()
    x = p.input("x", (m, k), dtype)
    w = p.input("w", (n, k) if transposed else (k, n), dtype)
    g = p.input("g", (k,), dtype)
    xn = p.div(p.mul(x, g), p.sqrt(p.add_scalar(p.scale(p.sum(p.mul(x, x), 1), 1 / k), 1e-6)))
    total = p.sum(xn, 1)
    p.output(p.matmul(xn, p.transpose(w, 0, 1) if transposed else w))
    p.output(total)
    return p


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("transposed", [False, True])
def test_a_normalised_float32_activation_times_a_16_bit_weight_runs_on_wgmma(
    dtype: str, transposed: bool
) -> None:
    p = _normed_matmul(dtype, 96, 136, 200, transposed)
    cg = compile_ugraph(from_program(p), SLOW_MMA, "llvm")
    rule = cg.kernels("llvm")[-1].rule
    assert rule.startswith("wgmma") and f"float32 x {dtype} operands converted to bfloat16" in rule, rule
    xs = p.random_inputs(seed=3)
    xs[0] = (xs[0].astype(np.float32) * 40).astype(xs[0].dtype)  # magnitudes beyond N(0, 1)
    got, want = cg.run(*xs)[0].astype(np.float64), p.run(*xs)[0].astype(np.float64)
    assert np.linalg.norm(got - want) <= 8e-3 * np.linalg.norm(want)


@pytest.mark.skipif(cubin_unavailable_reason() is not None, reason=str(cubin_unavailable_reason()))
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_mixed_wgmma_compiles_for_sm_90a_without_spills(dtype: str) -> None:
    p = _normed_matmul(dtype, 256, 512, 512, True)
    cg = compile_ugraph(from_program(p), SLOW_MMA, "cuda")
    kernel = cg.kernels("cuda")[-1]
    assert kernel.rule.startswith("wgmma") and "TMA" not in kernel.rule.split(";")[0]
    built = ptx_and_resources(cg.cuda_source(), "sm_90a")
    assert built is not None
    ptx, report = built
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.bf16\.bf16", ptx)
    assert "cvt.rn.bf16" in ptx  # the float32 (or float16) operand converted in the copies
    for name, res in report.items():
        assert res.spill_stores == 0 and res.spill_loads == 0, (name, res)


def test_a_programs_mixed_mma_sync_matmul_rounds_by_the_bits_on_llvm_only() -> None:
    p = _normed_matmul("bfloat16", 48, 64, 96, False)
    cg = compile_ugraph(from_program(p), H200, "llvm")
    llvm, cuda = cg.kernels("llvm")[-1], cg.kernels("cuda")[-1]
    assert llvm.rule.startswith("tensor-core") and cuda.rule == llvm.rule
    assert "T.reinterpret" in llvm.script and "T.reinterpret" not in cuda.script

"""Transposed operand views: a matmul reads a transposed tensor in place (``x @ W.T`` without a copy kernel).

Every layout (NN, NT, TN, TT), batched and broadcast, 16-bit and float32, ragged shapes and drawn magnitudes,
through the whole µGraph lowering (which kernel path a shape takes is the construction's choice: tensor cores,
split-k, the cooperative matrix-vector kernel, the CUDA-core kernel), on the llvm twin against float64 and on
the field twin against the program; the CUDA of the NT tensor-core kernel through nvcc; both cost models.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gensorage.codegen.cuda_build import cubin_unavailable_reason, ptx_and_resources
from gensorage.codegen.field_twin import check_field_twin
from gensorage.codegen.module import compile_ugraph
from gensorage.codegen.operand_views import graph_views
from gensorage.codegen.predefined_matmul import matmul_prim_func
from gensorage.codegen.tensor_core import TensorCoreTiles, schedule_tensor_core, shared_bytes
from gensorage.codegen.wgmma import WgmmaTiles
from gensorage.construction.tensor_core import construct_predefined_matmul
from gensorage.dtypes import numpy_dtype
from gensorage.hw import load_profile
from gensorage.opset import Op
from gensorage.program.program import Program
from gensorage.ugraph.cost import kernel_costs
from gensorage.ugraph.from_program import from_program
from gensorage.ugraph.ir import KernelOp
from gensorage.ugraph.validate import validate

HW = load_profile("h100")
H200 = load_profile("h200")
#: A Hopper whose mma.sync is slow: the construction takes wgmma even at shapes small enough for the twins.
SLOW_MMA = dataclasses.replace(
    H200, calibration=dataclasses.replace(H200.calibration, mma_sync_fraction=0.01, wgmma_fraction=1.0)
)
LAYOUTS = ("nn", "nt", "tn", "tt")


def _matmul_program(
    m: int,
    n: int,
    k: int,
    dtype: str,
    layout: str,
    a_batch: tuple[int, ...] = (),
    b_batch: tuple[int, ...] = (),
) -> Program:
    """``a @ b`` with each operand given transposed (and transposed back in the program) as ``layout`` says."""
    p = Program()
    a = p.input("a", (*a_batch, k, m) if layout[0] == "t" else (*a_batch, m, k), dtype)
    b = p.input("b", (*b_batch, n, k) if layout[1] == "t" else (*b_batch, k, n), dtype)
    a = p.transpose(a, -1, -2) if layout[0] == "t" else a
    b = p.transpose(b, -1, -2) if layout[1] == "t" else b
    p.output(p.matmul(a, b))
    return p


def _float64_product(xs: list[np.ndarray], layout: str) -> np.ndarray:
    a, b = (x.astype(np.float64) for x in xs)
    a = np.swapaxes(a, -1, -2) if layout[0] == "t" else a
    b = np.swapaxes(b, -1, -2) if layout[1] == "t" else b
    return np.asarray(a @ b)


def _draw(g: object, scale: float, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    specs = g.inputs  # type: ignore[attr-defined]
    k = specs[0].shape[-1]  # one of A's last two dims: B over sqrt of it keeps the outputs O(scale)
    xs = [rng.standard_normal(specs[0].shape) * scale, rng.standard_normal(specs[1].shape) / np.sqrt(k)]
    return [x.astype(numpy_dtype(s.dtype)) for x, s in zip(xs, specs, strict=True)]


def _check(program: Program, layout: str, scale: float, seed: int) -> list[str]:
    """Run the direct µGraph's llvm build against float64; returns its kernels' rules."""
    g = from_program(program)
    cg = compile_ugraph(g, HW, "llvm")
    kernels = cg.kernels("llvm")
    # No copy kernel for a transposed operand: one kernel op per matmul (split-k: two kernels of it).
    assert {g.ops[k.op_index].op for k in kernels} == {Op.MATMUL}  # type: ignore[union-attr]
    xs = _draw(g, scale, seed)
    want = _float64_product(xs, layout)
    got = cg.run(*xs)[0].astype(np.float64)
    dtype = g.inputs[0].dtype
    # 16-bit operands accumulate in float32 and round once to the output; float32 has 2^-24 per term.
    rounding = np.linalg.norm(want.astype(numpy_dtype(dtype)).astype(np.float64) - want)
    rel = {"float16": 2e-3, "bfloat16": 8e-3, "float32": 1e-5}[dtype]
    assert np.isfinite(got).all()
    assert np.linalg.norm(got - want) <= rel * np.linalg.norm(want) + 2 * rounding
    return [k.rule for k in kernels]


def test_a_transpose_is_a_view_only_where_every_reader_is_a_matmul() -> None:
    p = Program()
    f32 = "float32"
    x, w, v = p.input("x", (8, 16), f32), p.input("w", (24, 16), f32), p.input("v", (2, 16, 8), f32)
    wt = p.transpose(w, 0, 1)  # last two dims, read by two matmuls: a view
    p.output(p.matmul(x, wt))
    p.output(p.matmul(p.scale(x, factor=2.0), wt))
    xt = p.transpose(x, 1, 0)  # also read by an elementwise op: copied
    p.output(p.matmul(xt, x))
    p.output(p.scale(xt, factor=3.0))
    vt = p.transpose(v, 0, 1)  # not the last two dims: copied
    p.output(p.matmul(vt, p.input("y", (8, 4), f32)))
    ut = p.transpose(p.input("u", (16, 8), f32), 0, 1)  # a program output itself: copied
    p.output(p.matmul(x, p.input("z", (16, 8), f32)))
    p.output(ut)
    g = from_program(p)
    views = graph_views(g, validate(g))
    transposes = [k for k, op in enumerate(g.ops) if isinstance(op, KernelOp) and op.op is Op.TRANSPOSE]
    assert len(transposes) == 4
    assert views == {transposes[0]}
    xs = [np.random.default_rng(3).uniform(-1, 1, s.shape).astype(np.float32) for s in g.inputs]
    cg = compile_ugraph(g, HW, "llvm")
    assert transposes[0] not in {k.op_index for k in cg.kernels("llvm")}
    for got, want in zip(cg.run(*xs), p.run(*xs), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layout=st.sampled_from(LAYOUTS),
    dtype=st.sampled_from(["float16", "bfloat16", "float32"]),
    m=st.integers(1, 70),
    n=st.integers(1, 70),
    k=st.integers(1, 90),
    batch=st.sampled_from([((), ()), ((3,), (3,)), ((2,), ()), ((2, 2), (2, 2))]),
    scale=st.sampled_from([1e-3, 1.0, 30.0]),
    seed=st.integers(0, 2**16),
)
def test_every_layout_matches_float64_at_drawn_shapes_and_magnitudes(
    layout: str,
    dtype: str,
    m: int,
    n: int,
    k: int,
    batch: tuple[tuple[int, ...], tuple[int, ...]],
    scale: float,
    seed: int,
) -> None:
    _check(_matmul_program(m, n, k, dtype, layout, *batch), layout, scale, seed)


@pytest.mark.parametrize(
    ("m", "n", "k", "dtype", "layout", "path"),
    [
        (2, 96, 1024, "float16", "nt", "cooperative matrix-vector"),  # a decoding step's x @ W.T
        (3, 40, 1500, "float32", "nt", "cooperative matrix-vector"),
        (2, 40, 1100, "bfloat16", "tn", "cooperative matrix-vector"),
        (16, 256, 4096, "float16", "nt", "split-k"),  # few output tiles, a long reduction
        (16, 256, 4096, "bfloat16", "tt", "split-k"),
        (24, 40, 56, "float32", "nt", "markov construct"),  # the CUDA-core kernel
    ],
)
def test_each_kernel_path_reads_the_view(m: int, n: int, k: int, dtype: str, layout: str, path: str) -> None:
    rules = _check(_matmul_program(m, n, k, dtype, layout), layout, 1.0, 5)
    assert any(path in r for r in rules), rules


@pytest.mark.parametrize(
    ("dtype", "layout", "batch"),
    [
        ("float16", "nt", ((), ())),
        ("bfloat16", "tn", ((2,), (2,))),
        ("float32", "tt", ((2,), ())),
        ("float32", "nt", ((), ())),
    ],
)
def test_field_twin_of_each_layout_matches_the_program(
    dtype: str, layout: str, batch: tuple[tuple[int, ...], tuple[int, ...]]
) -> None:
    program = _matmul_program(20, 36, 44, dtype, layout, *batch)
    g = from_program(program)
    result = check_field_twin(g, program, trials=2, seed=3, hw=HW)
    assert result, str(result)


def test_field_twin_of_a_transposed_matrix_vector_product() -> None:
    program = _matmul_program(2, 40, 1024, "float32", "nt")
    assert check_field_twin(from_program(program), program, trials=1, seed=4, hw=HW)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_tensor_core_twin_with_split_k_in_each_layout(layout: str) -> None:
    import tvm

    m, n, k = 24, 64, 256
    tiles = TensorCoreTiles(16, 32, 32, 16, 16, 2, split_k=4, layout=layout)
    func = matmul_prim_func((m, k), (k, n), (m, n), "float16", "float16", 4, 16, layout)
    ex = tvm.compile(schedule_tensor_core(func, tiles, gpu=False).mod, target="llvm")
    rng = np.random.default_rng(11)
    a = rng.standard_normal((k, m) if layout[0] == "t" else (m, k)).astype(np.float16)
    b = rng.standard_normal((n, k) if layout[1] == "t" else (k, n)).astype(np.float16)
    out = tvm.runtime.empty((m, n), "float16", tvm.cpu())
    ex(tvm.runtime.tensor(a), tvm.runtime.tensor(b), out, tvm.runtime.empty((4, 32, n), "float32", tvm.cpu()))
    want = _float64_product([a, b], layout)
    assert np.linalg.norm(out.numpy() - want) <= 2e-3 * np.linalg.norm(want)


def test_shared_tiles_keep_the_operands_layout() -> None:
    t = TensorCoreTiles(64, 128, 32, 32, 32, 4)
    assert shared_bytes(t) == 4 * (64 * 40 + 32 * 136) * 2  # A [64, 32 + 8], B [32, 128 + 8]
    assert shared_bytes(replace(t, layout="nt")) == 4 * (64 * 40 + 128 * 40) * 2  # B as [128, 32 + 8]
    assert shared_bytes(replace(t, layout="tn")) == 4 * (32 * 72 + 32 * 136) * 2  # A as [32, 64 + 8]


def test_a_transposed_a_stays_on_mma_sync_and_a_k_major_b_may_take_wgmma() -> None:
    # wgmma reads B N-major (its transpose immediate) or K-major (its own layout); A only K-major.
    dims = ((4096, 4096), (4096, 4096), (4096, 4096))
    for layout in ("tn", "tt"):
        got = construct_predefined_matmul(*dims, "float16", "float16", H200, 0, layout)
        assert got is not None and isinstance(got[0], TensorCoreTiles) and got[0].layout == layout
        assert shared_bytes(got[0]) <= H200.shared_mem_per_block
    got = construct_predefined_matmul(*dims, "float16", "float16", H200, 0, "nt")
    assert got is not None and isinstance(got[0], WgmmaTiles)
    small = construct_predefined_matmul(
        (16, 4096), (4096, 1024), (16, 1024), "float16", "float16", H200, 0, "nt"
    )
    assert small is not None and isinstance(small[0], TensorCoreTiles) and small[0].layout == "nt"


@pytest.mark.parametrize(
    ("m", "n", "k", "dtype", "batch"),
    [
        (100, 72, 136, "float16", ((), ())),
        (70, 136, 72, "bfloat16", ((2,), (2,))),
        (64, 64, 200, "float16", ((3,), ())),
    ],
)
def test_wgmma_reads_a_k_major_b_in_place(
    m: int, n: int, k: int, dtype: str, batch: tuple[tuple[int, ...], tuple[int, ...]]
) -> None:
    # A Hopper whose mma.sync is slow takes wgmma at shapes small enough for the twins.
    program = _matmul_program(m, n, k, dtype, "nt", *batch)
    g = from_program(program)
    cg = compile_ugraph(g, SLOW_MMA, "llvm")
    (kernel,) = cg.kernels("llvm")
    assert kernel.rule.startswith("wgmma")
    xs = _draw(g, 3.0, 8)
    want = _float64_product(xs, "nt")
    got = cg.run(*xs)[0].astype(np.float64)
    assert np.linalg.norm(got - want) <= (2e-3 if dtype == "float16" else 8e-3) * np.linalg.norm(want)
    assert check_field_twin(g, program, trials=1, seed=2, hw=SLOW_MMA)
    src = compile_ugraph(g, SLOW_MMA, "cuda").cuda_source()
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16[^;]*, 1, 1, 0, 0;", src)  # no transpose


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_nt_cuda_loads_b_with_ldmatrix_without_trans(dtype: str) -> None:
    g = from_program(_matmul_program(128, 256, 512, dtype, "nt"))
    cg = compile_ugraph(g, HW, "cuda")
    (kernel,) = cg.kernels()
    assert "layout NT" in kernel.rule
    src = cg.cuda_source()
    short = "f16" if dtype == "float16" else "bf16"
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{short}.{short}.f32" in src
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in src
    assert ".trans" not in src  # A [m, k] and B [n, k]: both k-contiguous, no transposing load
    assert "cp.async" in src  # the copies to shared memory stay 16-byte vectors along k


@pytest.mark.skipif(cubin_unavailable_reason() is not None, reason="needs nvcc for the PTX")
def test_nvcc_compiles_the_nt_kernel_for_sm_90() -> None:
    g = from_program(_matmul_program(256, 512, 1024, "bfloat16", "nt"))
    got = ptx_and_resources(compile_ugraph(g, HW, "cuda").cuda_source(), "sm_90")
    assert got is not None
    ptx, resources = got
    assert re.search(r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32", ptx)
    assert re.search(r"ldmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16", ptx)
    assert "ldmatrix.sync.aligned.m8n8.x4.trans" not in ptx
    assert all(r.spill_stores == 0 for r in resources.values())


def test_both_cost_models_price_what_is_emitted() -> None:
    # x @ W.T: no transpose kernel, and the matmul reads W once, in its own layout.
    g = from_program(_matmul_program(128, 1024, 4096, "bfloat16", "nt"))
    costs = kernel_costs(g, HW)
    assert [c.kind for c in costs] == ["view", "matmul"]
    assert costs[0].time_s == 0 and costs[0].dram_bytes == 0
    assert costs[1].dram_bytes == 2 * (128 * 4096 + 1024 * 4096 + 128 * 1024)
    want = construct_predefined_matmul(
        (128, 4096), (4096, 1024), (128, 1024), "bfloat16", "bfloat16", HW, 0, "nt"
    )
    assert want is not None and costs[1].time_s == want[1].total_s
    # A transpose the program also returns stays a copy kernel, priced as one.
    p = Program()
    x, w = p.input("x", (128, 4096), "bfloat16"), p.input("w", (1024, 4096), "bfloat16")
    wt = p.transpose(w, 0, 1)
    p.output(p.matmul(x, wt))
    p.output(wt)
    copied = kernel_costs(from_program(p), HW)
    assert copied[0].kind == "transpose" and copied[0].time_s > 0


def test_a_float32_activation_times_a_transposed_16_bit_weight() -> None:
    # The precision policy keeps a float16 program's normalised activation with its gain inside the division
    # (bounded by √100·|g| only) in float32: the matmul converts both operands to bfloat16 on their way to shared
    # memory, the weight still read in place. (A bfloat16 program stores it in bfloat16:
    # tests/test_matmul_operands.py; a bare rms_norm(x), bounded by √100, is stored in float16.)
    p = Program()
    x, w = p.input("x", (40, 100), "float16"), p.input("w", (72, 100), "float16")
    g = p.input("g", (100,), "float16")
    xn = p.div(p.mul(x, g), p.sqrt(p.add_scalar(p.scale(p.sum(p.mul(x, x), 1), 1 / 100), 1e-6)))
    p.output(p.matmul(xn, p.transpose(w, 0, 1)))
    g = from_program(p)
    info = validate(g)
    (mm,) = [op for op in g.ops if isinstance(op, KernelOp) and op.op is Op.MATMUL]
    assert [info.of(r).dtype for r in mm.inputs] == ["float32", "float16"]
    cg = compile_ugraph(g, HW, "llvm")
    assert "layout NT" in cg.kernels("llvm")[-1].rule
    xs = p.random_inputs(seed=2)
    got, want = cg.run(*xs)[0].astype(np.float64), p.run(*xs)[0].astype(np.float64)
    assert np.linalg.norm(got - want) <= 8e-3 * np.linalg.norm(want)
    assert check_field_twin(g, p, trials=1, seed=1, hw=HW)

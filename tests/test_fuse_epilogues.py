"""Epilogue fusion (:mod:`gensorage.ugraph.optimize.fuse_epilogues`): the rewrite, its verification, the GEMM
kernels that run it (llvm twin against float64, field twin) and the cost model's view of it."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gensorage.codegen.cuda_build import cubin_unavailable_reason, ptx_and_resources
from gensorage.codegen.field_twin import check_field_twin
from gensorage.codegen.module import compile_ugraph
from gensorage.hw import load_profile
from gensorage.program.configs import load_config
from gensorage.ugraph import from_program
from gensorage.ugraph.cost import predict_ugraph_time
from gensorage.ugraph.ir import KernelGraph, KernelOp, Ref, TensorSpec
from gensorage.ugraph.optimize.fuse_epilogues import MAX_EXTRA, fuse_epilogues, has_epilogue, split_epilogues
from gensorage.verify.equivalent import equivalent
from gensorage.verify.floatcheck import float_check, round_to

HW = load_profile("h200")


def _graph(name: str, dtype: str, m: int = 64, k: int = 128, n: int = 128) -> KernelGraph:
    """gated_mlp, mlp, lora and a decoder MLP with a bias and a residual, as direct µGraphs in ``dtype``."""
    x = TensorSpec("x", (m, k), dtype)
    w1, w3 = TensorSpec("w1", (k, n), dtype), TensorSpec("w3", (k, n), dtype)
    if name == "gated_mlp":  # silu(x W1) * (x W3)
        ops = [
            KernelOp("matmul", (0, 1)),
            KernelOp("silu", (3,)),
            KernelOp("matmul", (0, 2)),
            KernelOp("mul", (4, 5)),
        ]
        return KernelGraph((x, w1, w3), tuple(ops), (Ref(6),))
    if name == "mlp":  # relu(x W1) W2
        w2 = TensorSpec("w2", (n, k), dtype)
        ops = [KernelOp("matmul", (0, 1)), KernelOp("relu", (3,)), KernelOp("matmul", (4, 2))]
        return KernelGraph((x, w1, w2), tuple(ops), (Ref(5),))
    if name == "lora":  # x W + (x A) B
        a, b = TensorSpec("a", (k, 16), dtype), TensorSpec("b", (16, n), dtype)
        ops = [KernelOp("matmul", (0, 1)), KernelOp("matmul", (0, 2)), KernelOp("matmul", (5, 3))]
        return KernelGraph((x, w1, a, b), (*ops, KernelOp("add", (4, 6))), (Ref(7),))
    assert name == "residual"  # x + relu(x W1 + bias) W2, scaled
    w2, bias = TensorSpec("w2", (n, k), dtype), TensorSpec("bias", (n,), dtype)
    ops = [
        KernelOp("matmul", (0, 1)),
        KernelOp("add", (4, 3)),
        KernelOp("relu", (5,)),
        KernelOp("matmul", (6, 2)),
        KernelOp("scale", (7,), {"factor": 0.5}),
        KernelOp("add", (8, 0)),
    ]
    return KernelGraph((x, w1, w2, bias), tuple(ops), (Ref(9),))


PROGRAMS = ["gated_mlp", "mlp", "lora", "residual"]


@pytest.mark.parametrize("name", PROGRAMS)
def test_the_chain_folds_and_computes_the_same(name: str) -> None:
    g = _graph(name, "float16")
    fused = fuse_epilogues(g)
    assert sum(has_epilogue(op) for op in fused.ops) >= 1 and len(fused.ops) < len(g.ops)
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s.shape) for s in g.inputs]
    np.testing.assert_allclose(fused.run(*arrays)[0], g.run(*arrays)[0], rtol=1e-12, atol=1e-12)
    back, _ = split_epilogues(fused, lambda k: False)
    assert not any(has_epilogue(op) for op in back.ops) and len(back.ops) == len(g.ops)
    np.testing.assert_allclose(back.run(*arrays)[0], g.run(*arrays)[0], rtol=1e-12, atol=1e-12)
    assert KernelGraph.from_json(json.loads(json.dumps(fused.to_json()))) == fused


def test_an_epilogue_reads_at_most_max_extra_operands() -> None:
    n = MAX_EXTRA + 1
    specs = [TensorSpec("x", (4, 8)), TensorSpec("w", (8, 8))] + [
        TensorSpec(f"e{i}", (4, 8)) for i in range(n)
    ]
    ops = [KernelOp("matmul", (0, 1))] + [KernelOp("add", (len(specs) + i, 2 + i)) for i in range(n)]
    fused = fuse_epilogues(KernelGraph(tuple(specs), tuple(ops), (Ref(len(specs) + n),)))
    assert [op.op.value for op in fused.ops] == ["matmul", "add"]  # the fifth add stays a kernel of its own
    assert len(fused.ops[0].inputs) == 2 + MAX_EXTRA


def test_a_product_read_twice_keeps_its_kernel() -> None:
    x, w = TensorSpec("x", (8, 16)), TensorSpec("w", (16, 16))
    g = KernelGraph(
        (x, w), (KernelOp("matmul", (0, 1)), KernelOp("relu", (2,)), KernelOp("add", (3, 2))), (Ref(4),)
    )
    assert fuse_epilogues(g) == g  # the raw product is read by the add too


@pytest.mark.parametrize("name", ["gated_mlp", "mlp", "lora"])
def test_the_fused_program_is_verified_like_a_candidate(name: str) -> None:
    params = {"gated_mlp": {"t": 8, "k": 16, "f": 16}, "mlp": {"t": 8, "k": 16, "f": 16}}.get(
        name, {"t": 8, "k": 16, "m": 16, "r": 4}
    )
    p = load_config(name, params)
    fused = fuse_epilogues(from_program(p))
    assert any(has_epilogue(op) for op in fused.ops)
    assert equivalent(p, fused, 1e-9, seed=3)
    assert float_check(from_program(p), fused, seed=3).ok


@settings(max_examples=3, deadline=None)
@given(
    name=st.sampled_from(PROGRAMS),
    dtype=st.sampled_from(["float16", "bfloat16"]),
    scale=st.floats(min_value=2.0**-4, max_value=2.0),
    seed=st.integers(0, 2**16),
)
def test_llvm_twin_of_the_fused_gemm_against_float64(name: str, dtype: str, scale: float, seed: int) -> None:
    g = fuse_epilogues(_graph(name, dtype))
    compiled = compile_ugraph(g, HW, "llvm", seed=0)
    assert any(has_epilogue(op) for op in compiled.ugraph.ops)  # the mma.sync kernel took its epilogue
    assert any("tensor-core" in k.rule for k in compiled.kernels("llvm"))
    rng = np.random.default_rng(seed)
    arrays = [round_to(rng.standard_normal(s.shape) * scale, dtype) for s in g.inputs]
    ref = g.run(*arrays)[0]
    np_dtype = np.float16 if dtype == "float16" else np.float32  # bfloat16 inputs travel as float32 here
    got = compiled.run(*[a.astype(np_dtype) for a in arrays], target="cpu")[0].astype(np.float64)
    tol = {"float16": 1e-2, "bfloat16": 5e-2}[dtype]  # the output rounded once to the dtype
    assert np.abs(got - ref).max() <= tol * np.abs(ref).max()


@pytest.mark.parametrize("name", ["residual", "gated_mlp"])
def test_field_twin_of_the_fused_gemm(name: str) -> None:
    assert check_field_twin(fuse_epilogues(_graph(name, "float16")), None, trials=1, seed=5, hw=HW)


@pytest.mark.parametrize("name", ["gated_mlp", "mlp", "lora"])
def test_the_cost_model_prices_the_fused_epilogue_faster(name: str) -> None:
    g = _graph(name, "float16", m=256, k=1024, n=1024)
    fused = fuse_epilogues(g, HW)
    assert predict_ugraph_time(fused, HW) < predict_ugraph_time(g, HW)


#: A Hopper whose mma.sync is slow: the construction takes wgmma even at shapes small enough for the twins.
SLOW_MMA = dataclasses.replace(
    HW, calibration=dataclasses.replace(HW.calibration, mma_sync_fraction=0.01, wgmma_fraction=1.0)
)


@pytest.mark.parametrize(
    ("hw", "shape", "dtype", "family"),
    [
        (HW, (8, 1024, 256), "bfloat16", "split-k 8"),
        (SLOW_MMA, (128, 128, 128), "bfloat16", "wgmma block"),
        (HW, (64, 128, 128), "float32", "markov construct"),  # the CUDA-core construction
    ],
    ids=["mma-split-k", "wgmma", "cuda-core"],
)
def test_every_gemm_family_runs_the_epilogue(
    hw: Any, shape: tuple[int, int, int], dtype: str, family: str
) -> None:
    m, k, n = shape
    g = fuse_epilogues(_graph("residual", dtype, m=m, k=k, n=n))
    compiled = compile_ugraph(g, hw, "llvm", seed=0)
    fused = [x for x in compiled.kernels("llvm") if has_epilogue(compiled.ugraph.ops[x.op_index])]
    assert len(fused) >= 2 and any(family in x.rule for x in fused)  # both matmuls, one on that family
    rng = np.random.default_rng(4)
    arrays = [round_to(rng.standard_normal(s.shape) * 0.3, dtype) for s in g.inputs]
    ref = g.run(*arrays)[0]
    got = compiled.run(*[a.astype(np.float32) for a in arrays], target="cpu")[0].astype(np.float64)
    assert np.abs(got - ref).max() <= {"bfloat16": 5e-2, "float32": 1e-5}[dtype] * np.abs(ref).max()
    assert check_field_twin(g, None, trials=1, seed=6, hw=hw)


@pytest.mark.parametrize("hw", [HW, SLOW_MMA], ids=["mma", "wgmma"])
def test_batched_epilogue_operands_broadcast(hw: Any) -> None:
    # (x W + bias[n]) * scale[e, t, 1] - r[e, t, n] over two batches: each extra operand indexed by its own dims.
    x, w = TensorSpec("x", (2, 128, 128)), TensorSpec("w", (2, 128, 128))
    b, r, s = TensorSpec("b", (128,)), TensorSpec("r", (2, 128, 128)), TensorSpec("s", (2, 128, 1))
    ops = (
        KernelOp("matmul", (0, 1)),
        KernelOp("add", (5, 2)),
        KernelOp("mul", (6, 4)),
        KernelOp("sub", (7, 3)),
    )
    g = fuse_epilogues(KernelGraph((x, w, b, r, s), ops, (Ref(8),)))
    assert len(g.ops) == 1
    compiled = compile_ugraph(g, hw, "llvm", seed=0)
    assert ("wgmma" in compiled.kernels("llvm")[0].rule) == (hw is SLOW_MMA)
    rng = np.random.default_rng(8)
    arrays = [round_to(rng.standard_normal(t.shape) * 0.5, "float16") for t in g.inputs]
    got = compiled.run(*[a.astype(np.float16) for a in arrays], target="cpu")[0].astype(np.float64)
    ref = g.run(*arrays)[0]
    assert np.abs(got - ref).max() <= 1e-2 * np.abs(ref).max()
    assert check_field_twin(g, None, trials=1, seed=1, hw=hw)


_UNARY = ["relu", "silu", "gelu", "exp", "scale", "add_scalar"]
_BINARY = ["add", "sub", "mul", "div"]


@st.composite
def _chains(draw: Any) -> KernelGraph:
    """A matmul [m, k] x [k, n] followed by a drawn chain of element-wise ops, the binary ones against an input
    of the product's shape, an [n] row or an [m, 1] column."""
    m, k, n = draw(st.sampled_from([(4, 8, 8), (3, 5, 7), (1, 16, 4)]))
    inputs = [TensorSpec("x", (m, k), "float32"), TensorSpec("w", (k, n), "float32")]
    ops: list[KernelOp] = [KernelOp("matmul", (0, 1))]
    for _ in range(draw(st.integers(1, MAX_EXTRA))):  # at most MAX_EXTRA extra operands: one kernel op
        last = len(inputs) + len(ops) - 1
        if draw(st.booleans()):
            op = draw(st.sampled_from(_UNARY))
            attrs = {"scale": {"factor": 0.5}, "add_scalar": {"value": 1.5}}.get(op, {})
            ops.append(KernelOp(op, (last,), attrs))
            continue
        shape = draw(st.sampled_from([(m, n), (n,), (m, 1)]))
        inputs.append(TensorSpec(f"e{len(inputs)}", shape, "float32"))
        # the extra input is a new node: every op index moves up one
        ops = [
            KernelOp(o.op, tuple(Ref(r.node + (r.node >= len(inputs) - 1)) for r in o.inputs), o.attrs)
            for o in ops
        ]
        last += 1
        args = (last, len(inputs) - 1) if draw(st.booleans()) else (len(inputs) - 1, last)
        ops.append(KernelOp(draw(st.sampled_from(_BINARY)), args))
    return KernelGraph(tuple(inputs), tuple(ops), (Ref(len(inputs) + len(ops) - 1),))


@settings(max_examples=40, deadline=None)
@given(g=_chains(), scale=st.floats(min_value=2.0**-6, max_value=4.0), seed=st.integers(0, 2**16))
def test_any_element_wise_chain_folds_into_one_kernel_op(g: KernelGraph, scale: float, seed: int) -> None:
    fused = fuse_epilogues(g)
    assert len(fused.ops) == 1 and has_epilogue(fused.ops[0])
    rng = np.random.default_rng(seed)
    # divisors kept away from zero: the law is about the rewrite, not about dividing by tiny numbers
    arrays = [np.abs(rng.standard_normal(s.shape)) * scale + 0.5 for s in g.inputs]
    want = g.run(*arrays)[0]
    np.testing.assert_allclose(fused.run(*arrays)[0], want, rtol=1e-12, atol=1e-300)
    back, _ = split_epilogues(fused, lambda k: False)
    np.testing.assert_allclose(back.run(*arrays)[0], want, rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("fused", [True, False], ids=["epilogue", "own-kernel"])
def test_relu_keeps_nan_as_torch_does(fused: bool) -> None:
    """relu(NaN) is NaN in torch; ``max(x, 0)`` gave 0 on both targets (llvm's and CUDA's max drop a NaN), so a
    NaN activation vanished in the kernels (and in abs, sigmoid and tanh, built from relu). The relu of a GEMM's
    epilogue and of an element-wise kernel now select, and the CUDA text compiles for sm_90a."""
    g = _graph("mlp", "float32", m=32, k=64, n=64)
    g = fuse_epilogues(g) if fused else g
    compiled = compile_ugraph(g, HW, "llvm", seed=0)
    assert any(has_epilogue(op) for op in compiled.ugraph.ops) == fused
    rng = np.random.default_rng(7)
    arrays = [rng.standard_normal(s.shape).astype(np.float32) for s in g.inputs]
    arrays[0][3, 5] = np.nan
    got = compiled.run(*arrays, target="cpu")[0]
    assert np.isnan(got[3]).all() and not np.isnan(np.delete(got, 3, axis=0)).any()
    if cubin_unavailable_reason() is None:
        assert ptx_and_resources(compile_ugraph(g, HW, "cuda", seed=0).cuda_source(), "sm_90a") is not None

"""The online-softmax P·V on tensor cores (:mod:`gensorage.codegen.online_mma`): when it applies, the llvm twin
(same warps and slots, the MMA's scalar semantics) against float64 with large logits and masked rows, and the
CUDA build (nvcc for sm_90a: mma.sync in the PTX, no spills)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gensorage.codegen.cuda_build import cubin_unavailable_reason, ptx_and_resources
from gensorage.codegen.module import CompiledUGraph, compile_ugraph
from gensorage.codegen.online_mma import online_tiling
from gensorage.construction.block_threads import ThreadChoice
from gensorage.dtypes import numpy_dtype
from gensorage.hw import load_profile
from gensorage.program import Program
from gensorage.ugraph import examples
from gensorage.ugraph.ir import (
    Accumulator,
    BlockGraph,
    GraphDefinedOp,
    InputIterator,
    KernelGraph,
    OutputSaver,
    Ref,
    TensorSpec,
)

HW = load_profile("h100")
ON_TENSOR_CORES = "P·V on tensor cores"

#: flash_attention2 tilings whose P·V fits m16n8k16: query rows per block (8 pads each MMA to 16), keys per
#: iteration (one or two 16-wide k chunks), head dims of one to three 8-wide n tiles.
TILINGS = {
    "rows8": {"heads": 2, "q_len": 16, "kv_len": 48, "head_dim": 8, "q_blocks": 2, "forloop": 3},
    "rows24": {"heads": 2, "q_len": 24, "kv_len": 64, "head_dim": 24, "q_blocks": 1, "forloop": 2},
    "rows32": {"heads": 1, "q_len": 64, "kv_len": 96, "head_dim": 16, "q_blocks": 2, "forloop": 3},
    # Head dim 128 on 1,024 threads: a row's 64 accumulators do not fit, so warp tiles side by side (each
    # computing its rows' P and maxima) as a block matmul's.
    "side_by_side": {"heads": 1, "q_len": 32, "kv_len": 32, "head_dim": 128, "q_blocks": 1, "forloop": 2},
}
THREADS = {"side_by_side": 1024}


@functools.cache
def _compiled(tiling: str, dtype: str) -> tuple[Program, CompiledUGraph]:
    program, g = examples.flash_attention2(dtype=dtype, **TILINGS[tiling])  # type: ignore[arg-type]
    threads = THREADS.get(tiling)
    plans = None if threads is None else {1: ThreadChoice(threads, None, None, "test")}
    return program, compile_ugraph(g, HW, "llvm", plans=plans)


def test_rows_split_over_the_warps_where_their_accumulators_fit() -> None:
    # FlashAttention-2's layout: a warp owns 16 rows by all 128 columns at 128 threads; at 1,024 threads a
    # thread's registers do not hold 64 accumulators and the warp tiles sit side by side.
    assert online_tiling((1, 64, 128), 64, "float16", 128).warp_n == 16
    side = online_tiling((1, 64, 128), 64, "float16", 1024)
    assert side.warp_n < 16 and side.slots <= 32
    _, cg = _compiled("side_by_side", "bfloat16")
    online = _rules(cg, "llvm").split("online accumulator")[1]
    assert ON_TENSOR_CORES in online and "32 warps" in online and "x128" not in online


def _rules(cg: CompiledUGraph, target: str) -> str:
    return "; ".join(k.rule for k in cg.kernels(target))  # type: ignore[arg-type]


def _attention_inputs(program: Program, magnitude: float, seed: int, sink: bool) -> list[np.ndarray]:
    """Q, K, V whose largest logit is about ``magnitude``: on one key of each head (a sink), or all scaled."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(t.shape) for t in program.inputs)
    root = np.sqrt(q.shape[-1])
    if sink:
        key = int(rng.integers(k.shape[1]))
        k[:, key, :] = q.mean(axis=1)
        k[:, key, :] *= magnitude / np.abs(np.einsum("hqd,hd->hq", q, k[:, key, :]) / root).max()
    else:
        q *= magnitude / np.abs(np.einsum("hqd,hkd->hqk", q, k) / root).max()
    return [q, k, v]


@pytest.mark.parametrize("tiling", sorted(TILINGS))
def test_the_fitting_tilings_run_on_tensor_cores(tiling: str) -> None:
    # The P·V on tensor cores, and l (softmax_sum over the same scores) kept in the same phase.
    _, cg = _compiled(tiling, "float16")
    assert ON_TENSOR_CORES in _rules(cg, "llvm") and "with the row sums of #6" in _rules(cg, "llvm")


def test_float32_values_or_rows_off_the_mma_shape_keep_the_cuda_core_step() -> None:
    for dtype, shape in [
        ("float32", TILINGS["rows8"]),  # a float32 value tile: no 16-bit operand
        ("float16", {"heads": 2, "q_len": 12, "kv_len": 48, "head_dim": 8, "q_blocks": 2, "forloop": 3}),
        ("float16", {"heads": 2, "q_len": 16, "kv_len": 24, "head_dim": 8, "q_blocks": 2, "forloop": 3}),
    ]:
        _, g = examples.flash_attention2(dtype=dtype, **shape)  # type: ignore[arg-type]
        assert ON_TENSOR_CORES not in _rules(compile_ugraph(g, HW, "llvm"), "llvm")


@settings(max_examples=24, deadline=None)
@given(
    tiling=st.sampled_from(sorted(TILINGS)),
    dtype=st.sampled_from(["float16", "bfloat16"]),
    magnitude=st.sampled_from([1e-2, 1.0, 10.0, 30.0, 100.0]),
    sink=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_llvm_twin_against_float64(tiling: str, dtype: str, magnitude: float, sink: bool, seed: int) -> None:
    # P is held in v's 16-bit dtype (P <= 1: no overflow), products summed in float32.
    program, cg = _compiled(tiling, dtype)
    xs = [x.astype(numpy_dtype(dtype)) for x in _attention_inputs(program, magnitude, seed, sink)]
    (want,) = program.run(*(x.astype(np.float64) for x in xs))
    (got,) = cg.run(*xs)
    got = got.astype(np.float64)
    assert np.isfinite(got).all()
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-2


def _masked(
    dtype: str, grid: int = 2, rows: int = 16, keys: int = 32, dim: int = 8, loop: int = 2
) -> KernelGraph:
    """The online accumulators straight on scores S [grid, rows, keys] (float32, so -inf can be fed) and
    values V [grid, keys, dim] in ``dtype``, saving o and l."""
    nodes = (
        InputIterator(0, (0,), 2),
        InputIterator(1, (0,), 1),
        Accumulator(0, "softmax_matmul", values=Ref(1)),
        Accumulator(0, "softmax_sum"),
        OutputSaver(2, (0,)),
        OutputSaver(3, (0,)),
    )
    block = BlockGraph((grid,), loop, nodes)
    specs = (TensorSpec("S", (grid, rows, keys), "float32"), TensorSpec("V", (grid, keys, dim), dtype))
    return KernelGraph(specs, (GraphDefinedOp(block, (0, 1)),), (Ref(2, 0), Ref(2, 1)))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_masked_rows_give_zero_never_nan(dtype: str) -> None:
    # Row 0: its first key tile all -inf; row 1: every score -inf (o = 0); row 2: a logit of 100 in the
    # second tile; row 3: every score near -200.
    cg = compile_ugraph(_masked(dtype), HW, "llvm")
    assert "with the row sums of #3" in _rules(cg, "llvm")
    rng = np.random.default_rng(0)
    s = rng.standard_normal((2, 16, 32))
    s[:, 3, :] -= 200.0
    s[:, 0, :16] = -np.inf
    s[:, 1, :] = -np.inf
    s[:, 2, 20] = 100.0
    s = s.astype(np.float32)
    v = rng.standard_normal((2, 32, 8)).astype(numpy_dtype(dtype))
    o, l_ = cg.run(s, v)
    o, l_ = np.asarray(o, dtype=np.float64), np.asarray(l_, dtype=np.float64)
    m = np.max(s, axis=2, keepdims=True).astype(np.float64)
    e = np.exp(s.astype(np.float64) - np.where(np.isfinite(m), m, 0.0))
    want = e @ v.astype(np.float64)
    assert np.isfinite(o).all() and (o[:, 1] == 0).all()
    assert np.isfinite(l_).all() and (l_[:, 1] == 0).all()
    # l sums P in float32, unrounded (the row sums beside the P·V share its maxima).
    np.testing.assert_allclose(l_, e.sum(axis=2, keepdims=True), rtol=1e-5, atol=1e-6)
    # P in 16 bits: each term's relative error is at most 2^-8 (bfloat16), so |o - want| <= 2^-8 Σ e |v|.
    bound = 2.0**-7 * (e @ np.abs(v.astype(np.float64))) + 1e-6
    assert (np.abs(o - want) <= bound).all()


@pytest.mark.skipif(cubin_unavailable_reason() is not None, reason="needs nvcc")
def test_cuda_build_holds_mma_and_shuffles_without_spills() -> None:
    # LLaMA's head dim 128, a 64-row query block, 64 keys per iteration.
    program, g = examples.flash_attention2(
        heads=2, q_len=128, kv_len=512, head_dim=128, q_blocks=2, forloop=8, dtype="bfloat16"
    )
    cg = compile_ugraph(g, HW, "cuda")
    assert ON_TENSOR_CORES in _rules(cg, "cuda")
    built = ptx_and_resources(cg.cuda_source(), "sm_90a")
    assert built is not None
    ptx, resources = built
    assert "mma.sync.aligned.m16n8k16" in ptx and "shfl.sync" in ptx
    graph = next(r for name, r in resources.items() if "graph" in name)
    assert graph.spill_stores == 0 and graph.spill_loads == 0


@pytest.mark.slow
def test_full_modes_choice_for_the_bundled_stable_mha_prefill_runs_on_tensor_cores() -> None:
    # The bundled program at shapes small enough for the llvm twin (2 heads, 64 queries, 256 keys, head dim 32):
    # full mode (its preset's search, then the µGraphs rebuilt at these shapes) chooses FlashAttention-2, whose
    # P·V and row sums run on tensor cores; every such candidate against float64 with logits up to 100.
    # About a minute on two cores.
    from gensorage import superoptimize
    from gensorage.program import load_config

    program = load_config("mha_prefill", {"b": 1, "h": 2, "s": 64, "n": 256, "d": 32})
    res = superoptimize(
        program, load_profile("h200"), mode="full", time_budget_s=300, use_store=False, progress=False
    )
    fa2 = [
        g
        for _, g, _ in res.candidates
        if any(
            isinstance(n, Accumulator)
            for op in g.ops
            if isinstance(op, GraphDefinedOp)
            for n in op.block.nodes
        )
    ]
    assert res.best in fa2
    on_tensor_cores = 0
    for g in fa2:
        cg = compile_ugraph(g, HW, "llvm")
        on_tensor_cores += ON_TENSOR_CORES in _rules(cg, "llvm")
        for magnitude, sink in [(100.0, True), (30.0, False)]:
            xs = [x.astype(np.float16) for x in _attention_inputs(program, magnitude, 1, sink)]
            (want,) = program.run(*(x.astype(np.float64) for x in xs))
            (got,) = cg.run(*xs)
            got = np.asarray(got, dtype=np.float64)
            assert np.isfinite(got).all()
            assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-2
    assert ON_TENSOR_CORES in _rules(compile_ugraph(res.best, HW, "llvm"), "llvm") and on_tensor_cores >= 3

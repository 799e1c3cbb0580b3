"""The online-softmax accumulators (FlashAttention-2): IR, shapes, evaluation, verification, text and JSON.

The hand-built µGraphs are :func:`gensorage.ugraph.examples.flash_attention2` (one kernel after K's transpose)
and :func:`~gensorage.ugraph.examples.flash_decoding_stable` (split-KV partials ``o, l, m`` and a combine).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gensorage.codegen.module import CompiledUGraph, compile_ugraph
from gensorage.dtypes import numpy_dtype
from gensorage.errors import NotLaxError, UGraphError
from gensorage.hw import load_profile
from gensorage.program import Program
from gensorage.superopt.api import superoptimize
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
from gensorage.verify import equivalent, float_check

HW = load_profile("h100")

SMALL = {
    "flash_attention2": {"heads": 2, "q_len": 3, "kv_len": 6, "head_dim": 5, "q_blocks": 1, "forloop": 3},
    "flash_decoding_stable": {"heads": 2, "kv_len": 4, "head_dim": 3, "splits": 2, "forloop": 2},
}


def _block_nodes(g: KernelGraph, k: int) -> list[object]:
    op = g.ops[k]
    assert isinstance(op, GraphDefinedOp)
    return list(op.block.nodes)


def _with_node(g: KernelGraph, k: int, j: int, node: object) -> KernelGraph:
    op = g.ops[k]
    assert isinstance(op, GraphDefinedOp)
    nodes = list(op.block.nodes)
    nodes[j] = node  # type: ignore[call-overload]
    block = dataclasses.replace(op.block, nodes=tuple(nodes))
    ops = list(g.ops)
    ops[k] = dataclasses.replace(op, block=block)
    return dataclasses.replace(g, ops=tuple(ops))


@pytest.mark.parametrize("name", sorted(SMALL))
def test_verified_by_the_second_tier(name: str) -> None:
    program, g = examples.ONLINE_EXAMPLES[name](**SMALL[name])
    r = equivalent(program, g, 1e-9, seed=3)
    # The rescale needs exp(a + b) = exp(a)·exp(b): the first tier sees a difference, the second accepts.
    assert r and r.tier == 2


def test_a_wrong_scale_is_rejected() -> None:
    program, g = examples.flash_attention2(**SMALL["flash_attention2"])  # type: ignore[arg-type]
    nodes = _block_nodes(g, 1)
    wrong = dataclasses.replace(nodes[4], attrs={"factor": 0.25})  # type: ignore[type-var]
    assert not equivalent(program, _with_node(g, 1, 4, wrong), 1e-9, seed=3)


def test_both_accumulators_must_read_the_same_scores() -> None:
    # l over the unscaled scores: the sums are relative to a different maximum and exponentiate other values.
    program, g = examples.flash_attention2(**SMALL["flash_attention2"])  # type: ignore[arg-type]
    acc = _block_nodes(g, 1)[6]
    assert isinstance(acc, Accumulator) and acc.kind == "softmax_sum"
    wrong = _with_node(g, 1, 6, dataclasses.replace(acc, input=Ref(3)))
    assert not equivalent(program, wrong, 1e-9, seed=3)


@settings(max_examples=12, deadline=None)
@given(magnitude=st.sampled_from([1e-3, 1.0, 10.0, 100.0]), seed=st.integers(0, 2**16))
def test_float64_against_the_program_with_large_logits(magnitude: float, seed: int) -> None:
    for name in SMALL:
        program, g = examples.ONLINE_EXAMPLES[name](**SMALL[name])
        rng = np.random.default_rng(seed)
        arrays = [rng.standard_normal(t.shape) for t in program.inputs]
        arrays[0] *= magnitude  # logits up to ~100·|K|: exp(S) alone overflows float64 at ~710
        arrays[1][:, 0, :] *= magnitude  # one key with a large logit, as attention sinks
        (want,) = program.run(*arrays)
        (got,) = g.run(*arrays)
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_float_check_finds_the_maxima_bounded(name: str) -> None:
    program, g = examples.ONLINE_EXAMPLES[name](**SMALL[name])
    r = float_check(program, g)
    assert r


@pytest.mark.parametrize("name", sorted(SMALL))
def test_json_and_text_round_trip(name: str) -> None:
    _, g = examples.ONLINE_EXAMPLES[name](**SMALL[name])
    back = KernelGraph.from_json(json.loads(json.dumps(g.to_json())))
    assert back == g
    assert "softmax_matmul" in g.to_text() and "softmax_sum" in g.to_dot()


def test_one_line_errors() -> None:
    _, g = examples.flash_attention2(**SMALL["flash_attention2"])  # type: ignore[arg-type]
    bad = [
        (Accumulator(4, "softmax_matmul"), "needs values"),
        (Accumulator(4, "softmax_sum", values=Ref(2)), "takes no values"),
        (Accumulator(4, "softmax_sum", fmap=2), "does not concatenate"),
        (Accumulator(4, "sum", values=Ref(2)), "reads no values"),
        (Accumulator(4, "softmax_matmul", values=Ref(0)), "matmul"),
    ]
    for node, message in bad:
        with pytest.raises(UGraphError, match=message) as info:
            _with_node(g, 1, 5, node).validate()
        assert "\n" not in str(info.value)
    with pytest.raises(UGraphError, match="accum: expected one of"):
        data = g.to_json()
        data["ops"][1]["block"]["nodes"][5]["accum"] = "softmax"
        KernelGraph.from_json(data)


def test_cost_and_code_generation() -> None:
    from gensorage.ugraph.cost import predict_ugraph_time

    for name in SMALL:
        _, g = examples.ONLINE_EXAMPLES[name](**SMALL[name])
        assert predict_ugraph_time(g, HW) > 0
        cg = compile_ugraph(g, HW, "cuda")
        src = cg.cuda_source()
        assert "__global__" in src and "exp" in src
        cubin = cg.cubin()  # nvcc for the profile's arch, where it is installed
        assert cubin is None or len(cubin) > 0


# ---------------------------------------------------------------------------------------------- code generation

#: Trip counts above 1 (several online steps), two q blocks / two splits, head dim 8.
CODEGEN = {
    "flash_attention2": {"heads": 4, "q_len": 4, "kv_len": 12, "head_dim": 8, "q_blocks": 2, "forloop": 3},
    "flash_decoding_stable": {"heads": 4, "kv_len": 12, "head_dim": 8, "splits": 2, "forloop": 3},
}


@functools.cache
def _compiled(name: str, dtype: str) -> tuple[Program, CompiledUGraph]:
    """The example's program and its kernels built for the CPU (llvm), once per example and dtype."""
    program, g = examples.ONLINE_EXAMPLES[name](dtype=dtype, **CODEGEN[name])
    return program, compile_ugraph(g, HW, "llvm")


def _logits(program: Program, magnitude: float, seed: int, sink: bool) -> list[np.ndarray]:
    """Q, K, V whose largest logit |Q Kᵀ/√d| is ``magnitude``: on one key of each head (an attention sink, the
    others N(0,1)-sized), or every logit scaled together (spread)."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(t.shape) for t in program.inputs)
    root = np.sqrt(q.shape[-1])
    if sink:
        key = int(rng.integers(k.shape[1]))  # any tile of the loop, the first included
        k[:, key, :] = q.mean(axis=1)
        k[:, key, :] *= magnitude / np.abs(np.einsum("hqd,hd->hq", q, k[:, key, :]) / root).max()
    else:
        q *= magnitude / np.abs(np.einsum("hqd,hkd->hqk", q, k) / root).max()
    return [q, k, v]


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(sorted(CODEGEN)),
    dtype=st.sampled_from(["float32", "float16", "bfloat16"]),
    magnitude=st.sampled_from([1e-2, 1.0, 10.0, 100.0]),
    sink=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_cpu_twin_against_float64(name: str, dtype: str, magnitude: float, sink: bool, seed: int) -> None:
    # The generated kernels (llvm build) against the program in float64 on the same rounded inputs.
    program, cg = _compiled(name, dtype)
    xs = [x.astype(numpy_dtype(dtype)) for x in _logits(program, magnitude, seed, sink)]
    (want,) = program.run(*(x.astype(np.float64) for x in xs))
    (got,) = cg.run(*xs)
    got = got.astype(np.float64)
    assert np.isfinite(got).all()
    if dtype == "float32":
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    else:
        # bfloat16 split-KV with every logit large included: the scores and maxima that flow into exp are
        # stored in float32 (gensorage.ugraph.exp_operands). These shapes measured at most 2.3e-3 over 600
        # draws at logits of 30 and 100, with and without that rule (this build keeps the scores in registers).
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-2


def _masked_scores(grid: int = 2, rows: int = 4, keys: int = 6, dim: int = 2, loop: int = 3) -> KernelGraph:
    """A kernel of the online accumulators straight on a score input S [grid, rows, keys] and V [grid, keys, dim],
    saving o and l (so masked scores, -inf, can be fed in)."""
    nodes = (
        InputIterator(0, (0,), 2),  # #0 S tile [1, rows, keys / loop]
        InputIterator(1, (0,), 1),  # #1 V tile [1, keys / loop, dim]
        Accumulator(0, "softmax_matmul", values=Ref(1)),  # #2 o
        Accumulator(0, "softmax_sum"),  # #3 l
        OutputSaver(2, (0,)),
        OutputSaver(3, (0,)),
    )
    block = BlockGraph((grid,), loop, nodes)
    specs = (TensorSpec("S", (grid, rows, keys), "float32"), TensorSpec("V", (grid, keys, dim), "float32"))
    return KernelGraph(specs, (GraphDefinedOp(block, (0, 1)),), (Ref(2, 0), Ref(2, 1)))


def test_masked_rows_give_zero_sums_never_nan() -> None:
    # Row 0: its first tile all -inf (masked), later tiles finite, so the first step sees a running max of -inf.
    # Row 1: every score -inf: o and l must be 0 (the softmax itself, o / l, is 0 / 0 as in the program).
    # Row 2: finite, with a logit of 100. Row 3: every logit near -200 (a maximum that is not -inf matters).
    g = _masked_scores()
    rng = np.random.default_rng(0)
    s = rng.standard_normal((2, 4, 6))
    s[:, 3, :] -= 200.0
    s[:, 0, :2] = -np.inf
    s[:, 1, :] = -np.inf
    s[:, 2, 4] = 100.0
    s, v = s.astype(np.float32), rng.standard_normal((2, 6, 2)).astype(np.float32)
    o, l_ = compile_ugraph(g, HW, "llvm").run(s, v)
    s, v = s.astype(np.float64), v.astype(np.float64)
    m = np.max(s, axis=2, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    np.testing.assert_allclose(o, e @ v, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(l_, e.sum(axis=2, keepdims=True), rtol=1e-5, atol=1e-6)
    assert (o[:, 1] == 0).all() and (l_[:, 1] == 0).all()


def test_the_field_twin_refuses_in_one_line() -> None:
    # The twin would need the rescale's exp(a + b) = exp(a)·exp(b), a law only the second tier models.
    from gensorage.codegen.field_twin import check_field_twin

    _, g = examples.flash_attention2(**SMALL["flash_attention2"])  # type: ignore[arg-type]
    with pytest.raises(NotLaxError, match="no field twin") as info:
        check_field_twin(g, hw=HW)
    assert "\n" not in str(info.value)


def test_one_iteration_is_plain_block_ops_and_runs_on_the_cpu() -> None:
    # With a trip count of 1, drop_loop writes the one online step as max, exp(s − max) and a sum / matmul.
    program, g = examples.flash_attention2(
        heads=2, q_len=4, kv_len=8, head_dim=4, q_blocks=2, forloop=1, dtype="float32"
    )
    assert not any(isinstance(n, Accumulator) for n in _block_nodes(g, 1))
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(t.shape).astype("float32") for t in program.inputs]
    xs[0] *= 30.0  # logits up to ~100
    (got,) = compile_ugraph(g, HW, "llvm").run(*xs)
    (want,) = program.run(*xs)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.slow
def test_full_mode_returns_the_fused_kernel_and_it_runs(tmp_path: Path) -> None:
    # The search finds FlashAttention-2 (K's transpose, then one looped kernel with the online accumulators);
    # full mode used to skip it for want of code generation. Two to three minutes on two cores.
    from gensorage.superopt.presets import preset_from_dict

    program, _ = examples.flash_attention2(
        heads=2, q_len=3, kv_len=4, head_dim=5, q_blocks=1, forloop=2, dtype="float32"
    )
    limits = {"max_kernel_ops": 2, "max_block_ops": 3, "max_grid_dims": 1, "max_block_outputs": 1}
    res = superoptimize(
        program,
        hw=HW,
        mode="full",
        preset=preset_from_dict({"search": limits}, name="test"),
        use_store=False,
        checkpoint=tmp_path / "ckpt.sqlite",
        progress=False,
    )
    kinds = sorted(
        n.kind
        for op in res.best.ops
        if isinstance(op, GraphDefinedOp)
        for n in op.block.nodes
        if isinstance(n, Accumulator)
    )
    assert res.num_kernels == 2 and kinds == ["softmax_matmul", "softmax_sum"]
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(t.shape).astype(np.float32) for t in program.inputs]
    xs[0] *= 30.0  # logits up to ~100
    (got,) = res.run(*xs, target="cpu")
    (want,) = program.run(*xs)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())

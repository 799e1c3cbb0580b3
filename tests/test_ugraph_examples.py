"""The papers' µGraphs: each evaluates (literally, block by block) to its program, at several schedules."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from gensorage.errors import UGraphError
from gensorage.program import Program
from gensorage.ugraph import (
    Accumulator,
    BlockGraph,
    GraphDefinedOp,
    InputIterator,
    KernelGraph,
    OutputSaver,
    ThreadGraph,
    evaluate,
    is_valid,
    validate,
)
from gensorage.ugraph.examples import (
    EXAMPLES,
    flash_attention,
    flash_attention2,
    flash_decoding,
    flash_decoding_stable,
    gated_mlp,
    gqa,
    lora,
    qknorm_attention,
    rmsnorm_matmul,
)
from gensorage.ugraph.rewrite import drop_loop

# Small-shape variants: (builder, kwargs) with different grids and loops from the defaults.
VARIANTS: list[tuple[Callable[..., Any], dict[str, int]]] = [
    (rmsnorm_matmul, {}),
    (rmsnorm_matmul, {"batch": 3, "hidden": 12, "out": 8, "blocks": 2, "forloop": 3}),
    (rmsnorm_matmul, {"blocks": 1, "forloop": 1}),
    (gqa, {}),
    (
        gqa,
        {
            "kv_heads": 3,
            "group": 2,
            "q_len": 2,
            "kv_len": 16,
            "head_dim": 4,
            "kv_splits": 2,
            "forloop": 4,
            "out_splits": 4,
        },
    ),
    (gqa, {"kv_splits": 1, "forloop": 1, "out_splits": 1}),
    (lora, {}),
    (lora, {"m": 6, "k": 4, "n": 8, "rank": 3, "n_blocks": 4, "m_blocks": 3}),
    (gated_mlp, {}),
    (gated_mlp, {"m": 2, "k": 6, "n": 4, "blocks": 4, "forloop": 6}),
    (flash_attention, {}),
    (flash_attention, {"heads": 3, "q_len": 6, "kv_len": 8, "head_dim": 2, "q_blocks": 3, "forloop": 4}),
    (flash_decoding, {}),
    (flash_decoding, {"heads": 6, "group": 3, "kv_len": 12, "splits": 2, "forloop": 3}),
    (qknorm_attention, {}),
    (qknorm_attention, {"q_len": 6, "kv_len": 8, "q_blocks": 3, "forloop": 2}),
    (flash_attention2, {}),
    (flash_attention2, {"forloop": 1}),
    (flash_decoding_stable, {}),
    (flash_decoding_stable, {"splits": 2, "forloop": 1}),
    (flash_decoding_stable, {"combine": "matmul"}),
]


def _inputs(p: Program, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(t.shape) for t in p.inputs]


@pytest.mark.parametrize(("build", "kwargs"), VARIANTS, ids=lambda v: getattr(v, "__name__", str(v)))
def test_example_equals_program(build: Callable[..., Any], kwargs: dict[str, int]) -> None:
    p, g = build(**kwargs)
    validate(g)
    arrays = _inputs(p)
    got, want = g.run(*arrays), p.run(*arrays)
    assert len(got) == len(want) == 1
    assert got[0].shape == want[0].shape
    np.testing.assert_allclose(got[0], want[0], rtol=1e-9, atol=1e-12)


def test_every_example_is_listed_and_graph_defined() -> None:
    assert set(EXAMPLES) == {
        "rmsnorm_matmul",
        "gqa",
        "lora",
        "gated_mlp",
        "flash_attention",
        "flash_decoding",
        "qknorm_attention",
    }
    for name, build in EXAMPLES.items():
        _, g = build()
        assert any(isinstance(op, GraphDefinedOp) for op in g.ops), name


def test_figure_structures() -> None:
    # RMSNorm (Fig. 3b): one kernel, two accumulators, a post-loop thread graph of scale/sqrt/div.
    _, g = rmsnorm_matmul()
    (k,) = g.ops
    assert isinstance(k, GraphDefinedOp) and k.block.forloop > 1
    assert sum(isinstance(n, Accumulator) for n in k.block.nodes) == 2
    tg = [n for n in k.block.nodes if isinstance(n, ThreadGraph)]
    assert [o.op.value for o in tg[0].ops] == ["scale", "sqrt", "div"]
    # GQA (Fig. 4c): two graph-defined kernels, no repeat anywhere, a reshape in block graph 1.
    _, g = gqa()
    assert len(g.ops) == 2 and all(isinstance(o, GraphDefinedOp) for o in g.ops)
    ops1 = [getattr(n, "op", None) for n in g.ops[0].block.nodes]  # type: ignore[union-attr]
    assert "reshape" in ops1 and "repeat" not in ops1
    # LoRA (Fig. 9b): concat in the block graph.
    _, g = lora()
    assert [getattr(n, "op", None) for n in g.ops[0].block.nodes].count("concat") == 2  # type: ignore[union-attr]
    # FlashDecoding: split-KV kernel with two outputs, then a reduction kernel.
    _, g = flash_decoding()
    assert len(g.ops[0].block.savers) == 2 and g.ops[1].block.forloop == 1  # type: ignore[union-attr]


def test_forloop_one_builds_the_loop_free_form() -> None:
    _, g = gated_mlp(blocks=2, forloop=1)
    block = g.ops[0].block  # type: ignore[union-attr]
    assert block.forloop == 1
    assert not any(isinstance(n, Accumulator) for n in block.nodes)
    assert all(n.fmap is None for n in block.nodes if isinstance(n, InputIterator))
    with pytest.raises(UGraphError, match="only a trip count of 1"):
        drop_loop(gated_mlp()[1].ops[0].block)  # type: ignore[union-attr]


def test_schedule_that_does_not_divide_is_invalid() -> None:
    _, g = gated_mlp(k=16, forloop=3)
    with pytest.raises(UGraphError, match="does not divide"):
        validate(g)


# Paper-scale shapes (validity and memory only; evaluating these would be slow).
PAPER_SCALE: list[tuple[Callable[..., Any], dict[str, int]]] = [
    (rmsnorm_matmul, {"batch": 16, "hidden": 1024, "out": 4096, "blocks": 128, "forloop": 16}),
    (
        gqa,
        {
            "kv_heads": 8,
            "group": 8,
            "q_len": 1,
            "kv_len": 2000,
            "head_dim": 64,
            "kv_splits": 10,
            "forloop": 20,
            "out_splits": 8,
        },
    ),
    (lora, {"m": 16, "k": 1024, "n": 4096, "rank": 16, "n_blocks": 256, "m_blocks": 1}),
    (gated_mlp, {"m": 16, "k": 4096, "n": 4096, "blocks": 64, "forloop": 64}),
    (
        flash_attention,
        {"heads": 32, "q_len": 1024, "kv_len": 1024, "head_dim": 64, "q_blocks": 16, "forloop": 16},
    ),
    (flash_decoding, {"heads": 32, "group": 4, "kv_len": 4096, "head_dim": 128, "splits": 16, "forloop": 8}),
    (
        qknorm_attention,
        {"heads": 32, "q_len": 1024, "kv_len": 1024, "head_dim": 64, "q_blocks": 16, "forloop": 16},
    ),
]


def _h100() -> Any:
    from gensorage.hw import load_profile

    return load_profile("h100")


@pytest.mark.parametrize(("build", "kwargs"), PAPER_SCALE, ids=lambda v: getattr(v, "__name__", str(v)))
def test_paper_scale_examples_fit_h100(build: Callable[..., Any], kwargs: dict[str, int]) -> None:
    _, g = build(**kwargs)
    validate(g, _h100())


def test_oversized_block_graph_does_not_fit_h100() -> None:
    _, g = lora(
        m=16, k=8192, n=4096, rank=16, n_blocks=64, m_blocks=1
    )  # a 16x8192 fp16 X tile alone is 256 KiB
    validate(g)
    assert not is_valid(g, _h100())


def test_examples_in_the_finite_field() -> None:
    """The same literal evaluator in Z_p x Z_q agrees with the program's field evaluation."""
    field = pytest.importorskip("gensorage.verify.field")
    for name, build in EXAMPLES.items():
        p, g = build()
        arith = field.FieldArith(3, np.random.default_rng(1))
        values = [arith.random_input(t.shape) for t in p.inputs]
        (got,) = evaluate(g, arith, values)
        (want,) = p.evaluate(arith, values)
        assert got.shape == want.shape, name
        assert arith.equal(got, want).all(), name


def test_field_catches_a_wrong_omap() -> None:
    field = pytest.importorskip("gensorage.verify.field")
    p, g = flash_attention(heads=2, q_len=2, kv_len=6, head_dim=4, q_blocks=2, forloop=3)
    block = g.ops[0].block  # type: ignore[union-attr]
    saver = block.nodes[-1]
    assert isinstance(saver, OutputSaver) and saver.omap == (0, 1)
    # Heads and query blocks both come in 2s, so the transposed omap keeps every shape but misplaces tiles.
    swapped_block = BlockGraph(
        block.grid, block.forloop, block.nodes[:-1] + (OutputSaver(saver.input, (1, 0)),)
    )
    swapped = KernelGraph(g.inputs, (GraphDefinedOp(swapped_block, g.ops[0].inputs),), g.outputs)
    validate(swapped)
    arith = field.FieldArith(2, np.random.default_rng(2))
    values = [arith.random_input(t.shape) for t in p.inputs]
    (right,) = evaluate(g, arith, values)
    (wrong,) = evaluate(swapped, arith, values)
    (want,) = p.evaluate(arith, values)
    assert arith.equal(right, want).all()
    assert wrong.shape == want.shape and not arith.equal(wrong, want).any()

"""The literal µGraph evaluator: partitions followed exactly, wrong maps give wrong answers."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gensorage.arith import Float64Arith
from gensorage.errors import UGraphError
from gensorage.opset import Op
from gensorage.program import Program
from gensorage.ugraph import (
    Accumulator,
    BlockGraph,
    BlockOp,
    GraphDefinedOp,
    InputIterator,
    KernelGraph,
    KernelOp,
    OutputSaver,
    Ref,
    TensorSpec,
    evaluate,
    from_program,
    wrap_kernel_op,
)
from gensorage.ugraph.examples import EXAMPLES
from gensorage.verify.field import FieldArith
from gensorage.verify.mutate import MUTATIONS, mutate
from gensorage.verify.uninterpreted import UninterpretedArith

RTOL = 1e-9


def _arrays(shapes: list[tuple[int, ...]], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s) for s in shapes]


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=RTOL, atol=1e-12))


def _kernel(
    specs: tuple[TensorSpec, ...],
    grid: tuple[int, ...],
    forloop: int,
    nodes: tuple,
    n_in: int = 2,
    post: tuple = (),
) -> KernelGraph:
    gd = GraphDefinedOp(BlockGraph(grid, forloop, nodes), tuple(range(n_in)))
    return KernelGraph(specs, (gd, *post), (len(specs) + len(post),))


def _tiled_matmul(
    m: int,
    k: int,
    n: int,
    grid: tuple[int, int],
    forloop: int,
    x_imap=(None, 0),
    w_imap=(1, None),
    omap=(1, 0),
    x_fmap=1,
    w_fmap=0,
) -> KernelGraph:
    looped = forloop > 1
    nodes = [
        InputIterator(0, x_imap, x_fmap if looped else None),
        InputIterator(1, w_imap, w_fmap if looped else None),
        BlockOp(Op.MATMUL, (0, 1)),
    ]
    if looped:
        nodes.append(Accumulator(2))
    nodes.append(OutputSaver(len(nodes) - 1, omap))
    return _kernel((TensorSpec("X", (m, k)), TensorSpec("W", (k, n))), grid, forloop, tuple(nodes))


# -------------------------------------------------------------------------------------------- from_program


def test_from_program_matches_program() -> None:
    p = Program("mix")
    x = p.input("X", (2, 3, 4))
    w = p.input("W", (4, 6))
    y = p.reshape(p.exp(p.scale(p.matmul(x, w), 0.5)), (6, 6))
    z = p.concat([y, p.repeat(p.sum(y, dim=1), 1, 2)], dim=1)
    p.exp(x)  # dead: not an output
    p.output(p.div(z, p.add(z, z)))
    p.output(y)
    g = from_program(p)
    assert len(g.ops) == 9 and all(isinstance(o, KernelOp) for o in g.ops)
    assert [s.name for s in g.inputs] == ["X", "W"]
    arrays = _arrays([(2, 3, 4), (4, 6)])
    for a, b in zip(g.run(*arrays), p.run(*arrays), strict=True):
        assert _same(a, b)


def test_from_program_needs_outputs() -> None:
    p = Program("empty")
    p.input("X", (2,))
    with pytest.raises(UGraphError, match="no outputs"):
        from_program(p)


def test_wrap_kernel_op_is_equivalent() -> None:
    p = Program("mm")
    x, w = p.input("X", (4, 6)), p.input("W", (6, 8))
    p.output(p.exp(p.matmul(x, w)))
    g = from_program(p)
    wrapped = wrap_kernel_op(g, 0, (2, 4), [(0, None), (None, 1)], (0, 1))
    wrapped.validate()
    arrays = _arrays([(4, 6), (6, 8)])
    assert _same(wrapped.run(*arrays)[0], p.run(*arrays)[0])
    with pytest.raises(UGraphError, match="only elementwise ops and matmul"):
        wrap_kernel_op(from_program(_sum_program()), 0, (1,), [(None,)], (0,))


def _sum_program() -> Program:
    p = Program("s")
    p.output(p.sum(p.input("X", (4, 4)), dim=0))
    return p


# ------------------------------------------------------------------------------------------ partitioning


@settings(max_examples=25, deadline=None)
@given(
    gm=st.sampled_from([1, 2, 3]),
    gn=st.sampled_from([1, 2, 4]),
    loop=st.sampled_from([1, 2, 5]),
    seed=st.integers(0, 2**16),
)
def test_tiled_matmul_any_schedule(gm: int, gn: int, loop: int, seed: int) -> None:
    m, k, n = 6, 10, 8
    g = _tiled_matmul(m, k, n, (gn, gm), loop)
    x, w = _arrays([(m, k), (k, n)], seed)
    assert _same(g.run(x, w)[0], x @ w)


def test_wrong_imap_gives_wrong_answer() -> None:
    x, w = _arrays([(6, 8), (8, 6)])
    right = _tiled_matmul(6, 8, 6, (2, 3), 2)
    assert _same(right.run(x, w)[0], x @ w)
    # Same shapes everywhere, blocks pick the wrong rows/columns: x splits X's rows and y W's columns.
    wrong = _tiled_matmul(6, 8, 6, (2, 3), 2, x_imap=(0, None), w_imap=(None, 1))
    wrong.validate()
    assert not _same(wrong.run(x, w)[0], x @ w)


def test_wrong_omap_gives_wrong_answer() -> None:
    x, w = _arrays([(6, 8), (8, 6)])
    wrong = _tiled_matmul(6, 8, 6, (2, 2), 2, x_imap=(None, 0), w_imap=(1, None), omap=(0, 1))
    wrong.validate()
    out = wrong.run(x, w)[0]
    assert out.shape == (6, 6) and not _same(out, x @ w)


def _total_of_product(x_fmap: int, w_fmap: int) -> KernelGraph:
    """Σ_ij (X W)_ij with the loop splitting X by ``x_fmap`` and W by ``w_fmap``."""
    nodes = (
        InputIterator(0, (None,), x_fmap),
        InputIterator(1, (None,), w_fmap),
        BlockOp(Op.MATMUL, (0, 1)),
        BlockOp(Op.SUM, (2,), {"dim": 0}),
        BlockOp(Op.SUM, (3,), {"dim": 1}),
        Accumulator(4),
        OutputSaver(5, (0,)),
    )
    return _kernel((TensorSpec("X", (4, 4)), TensorSpec("W", (4, 4))), (1,), 2, nodes)


def test_wrong_fmap_gives_wrong_answer() -> None:
    x, w = _arrays([(4, 4), (4, 4)])
    expected = (x @ w).sum().reshape(1, 1)
    assert _same(_total_of_product(1, 0).run(x, w)[0], expected)
    # Splitting X by rows and W by columns gives [2,2] products of matching shape that miss the cross terms.
    wrong = _total_of_product(0, 1)
    wrong.validate()
    out = wrong.run(x, w)[0]
    assert out.shape == (1, 1) and not _same(out, expected)


def test_grid_dims_on_one_data_dim_nest_x_major() -> None:
    # Blocks (x, y) of a 2x2 grid both split X's rows: block (x, y) gets row chunk 2x + y.
    nodes = (
        InputIterator(0, (0, 0)),
        BlockOp(Op.RESHAPE, (0,), {"shape": (1, 1, 2, 3)}),
        OutputSaver(1, (0, 1)),
    )
    spec = (TensorSpec("X", (8, 3)),)
    g = _kernel(spec, (2, 2), 1, nodes, n_in=1, post=(KernelOp(Op.RESHAPE, (1,), {"shape": (8, 3)}),))
    (x,) = _arrays([(8, 3)])
    assert _same(g.run(x)[0], x)


def test_loop_walks_within_the_blocks_chunk() -> None:
    # imap and fmap on the same dim: block b, iteration i reads rows [4b + 2i, 4b + 2i + 2).
    nodes = (InputIterator(0, (0,), 0), BlockOp(Op.EXP, (0,)), Accumulator(1, "sum", 0), OutputSaver(2, (0,)))
    g = _kernel((TensorSpec("X", (8, 3)),), (2,), 2, nodes, n_in=1)
    (x,) = _arrays([(8, 3)])
    assert _same(g.run(x)[0], np.exp(x))


def test_concat_accumulator() -> None:
    # Loop over W's columns, concatenating the iterations' products.
    nodes = (
        InputIterator(0, (0,)),
        InputIterator(1, (None,), 1),
        BlockOp(Op.MATMUL, (0, 1)),
        Accumulator(2, "sum", 1),
        OutputSaver(3, (0,)),
    )
    g = _kernel((TensorSpec("X", (4, 5)), TensorSpec("W", (5, 6))), (2,), 3, nodes)
    x, w = _arrays([(4, 5), (5, 6)])
    assert _same(g.run(x, w)[0], x @ w)


def test_max_accumulator() -> None:
    nodes = (InputIterator(0, (None,), 1), Accumulator(0, "max"), OutputSaver(1, (0,)))
    g = _kernel((TensorSpec("X", (4, 6)),), (1,), 3, nodes, n_in=1)
    (x,) = _arrays([(4, 6)])
    assert _same(g.run(x)[0], np.maximum.reduce([x[:, 0:2], x[:, 2:4], x[:, 4:6]]))


def test_multi_output_graph_defined_op() -> None:
    nodes = (
        InputIterator(0, (0,)),
        BlockOp(Op.EXP, (0,)),
        BlockOp(Op.SQRT, (1,)),
        OutputSaver(2, (0,)),
        OutputSaver(1, (0,)),
    )
    gd = GraphDefinedOp(BlockGraph((2,), 1, nodes), (0,))
    g = KernelGraph(
        (TensorSpec("X", (4, 2)),), (gd, KernelOp(Op.SUB, (Ref(1, 0), Ref(1, 1)))), (2, Ref(1, 1))
    )
    (x,) = _arrays([(4, 2)])
    diff, e = g.run(x)
    assert _same(e, np.exp(x)) and _same(diff, np.sqrt(np.exp(x)) - np.exp(x))


# ------------------------------------------------------------------------------------------------ errors


def test_input_count_and_shape_checked() -> None:
    g = _tiled_matmul(4, 4, 4, (1, 1), 1)
    x, w = _arrays([(4, 4), (4, 4)])
    with pytest.raises(UGraphError, match="takes 2 inputs"):
        g.run(x)
    with pytest.raises(UGraphError, match="input W: expected shape"):
        g.run(x, w[:2])


def test_invalid_graph_is_not_evaluated() -> None:
    g = _tiled_matmul(4, 4, 4, (1, 3), 1)  # 3 blocks over 4 rows
    with pytest.raises(UGraphError, match="does not divide"):
        g.run(*_arrays([(4, 4), (4, 4)]))


# ---------------------------------------------------------------------------------- only Arith touches values


class _CountingArith(Float64Arith):
    """Float64 arithmetic that counts slices and concats (values stay opaque to the evaluator)."""

    def __init__(self) -> None:
        self.slices = 0
        self.concats = 0

    def slice(self, a, axis, start, stop):  # type: ignore[no-untyped-def]
        self.slices += 1
        return super().slice(a, axis, start, stop)

    def concat(self, parts, axis):  # type: ignore[no-untyped-def]
        self.concats += 1
        return super().concat(parts, axis)


def test_evaluator_slices_per_block_and_iteration() -> None:
    g = _tiled_matmul(6, 10, 8, (4, 3), 5)
    arith = _CountingArith()
    x, w = _arrays([(6, 10), (10, 8)])
    (out,) = evaluate(g, arith, [x, w])
    assert _same(out, x @ w)
    blocks = 12
    # per block: X sliced by y and by the loop (5x), W by x and by the loop (5x)
    assert arith.slices == blocks * (1 + 5 + 1 + 5)
    # output: one concat over x, then one per x-column over y
    assert arith.concats == 1 + 4


# ---------------------------------------------------------------------------------- blocks run stacked


def _field_outputs(graph: KernelGraph, arith_kind: str, stack: bool, seed: int) -> list:
    arith = (UninterpretedArith if arith_kind == "uninterpreted" else FieldArith)(
        2, np.random.default_rng(seed)
    )
    inputs = [arith.random_input(t.shape) for t in graph.inputs]
    return evaluate(graph, arith, inputs, stack=stack)


def _same_residues(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        np.array_equal(x.data, y.data) and getattr(x, "tainted", False) == getattr(y, "tainted", False)
        for x, y in zip(a, b, strict=True)
    )


@pytest.mark.parametrize("name", sorted(EXAMPLES))
@pytest.mark.parametrize("arith_kind", ["uninterpreted", "field"])
def test_stacked_blocks_equal_one_block_at_a_time(name: str, arith_kind: str) -> None:
    """The paper examples: every residue of every output is the same whether the blocks run stacked or not."""
    _, graph = EXAMPLES[name]()
    stacked = _field_outputs(graph, arith_kind, True, 3)
    assert _same_residues(stacked, _field_outputs(graph, arith_kind, False, 3))
    assert not _same_residues(stacked, _field_outputs(graph, arith_kind, False, 4))  # the comparison can fail


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_stacked_float64_matches(name: str) -> None:
    """Forced on float64 (never the default there), stacking gives the same numbers on the paper examples."""
    _, graph = EXAMPLES[name]()
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(t.shape) * 10.0 ** rng.integers(-3, 4) for t in graph.inputs]
    one = evaluate(graph, Float64Arith(), arrays, stack=False)
    for x, y in zip(evaluate(graph, Float64Arith(), arrays, stack=True), one, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-12, atol=0)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(EXAMPLES)), st.sampled_from(sorted(MUTATIONS)), st.integers(0, 2**32 - 1))
def test_stacked_blocks_follow_wrong_maps_too(name: str, kind: str, seed: int) -> None:
    """Mutants (wrong imaps, fmaps, omaps, grids, ops): stacking changes no residue, so a wrong map stays wrong."""
    _, graph = EXAMPLES[name]()
    m = mutate(graph, random.Random(seed), kind)
    assume(m is not None)
    assert m is not None
    assert _same_residues(
        _field_outputs(m.graph, "uninterpreted", True, seed),
        _field_outputs(m.graph, "uninterpreted", False, seed),
    )


class _CountingField(UninterpretedArith):
    """The first tier's arithmetic, counting matmuls."""

    matmuls = 0

    def matmul(self, a, b):  # type: ignore[no-untyped-def]
        self.matmuls += 1
        return super().matmul(a, b)


def test_stacked_body_runs_once_for_all_blocks_and_iterations() -> None:
    g = _tiled_matmul(6, 10, 8, (4, 3), 5)
    arith = _CountingField(1, np.random.default_rng(0))
    x, w = arith.random_input((6, 10)), arith.random_input((10, 8))
    (out,) = evaluate(g, arith, [x, w])
    assert arith.matmuls == 1  # all 12 blocks and 5 iterations at once (one at a time: 60)
    assert np.array_equal(out.data, arith.matmul(x, w).data)


def test_a_running_maximum_runs_stacked_once_per_iteration() -> None:
    nodes = (
        InputIterator(0, (None, 0), 1),
        InputIterator(1, (1, None), 0),
        BlockOp(Op.MATMUL, (0, 1)),
        Accumulator(2, "max"),
        OutputSaver(3, (1, 0)),
    )
    g = _kernel((TensorSpec("X", (6, 10)), TensorSpec("W", (10, 8))), (4, 3), 5, nodes)
    arith = _CountingField(1, np.random.default_rng(0))
    x, w = arith.random_input((6, 10)), arith.random_input((10, 8))
    (out,) = evaluate(g, arith, [x, w])
    assert arith.matmuls == 5  # one per loop iteration for all 12 blocks
    (literal,) = evaluate(g, arith, [x, w], stack=False)
    assert np.array_equal(out.data, literal.data) and np.array_equal(out.digest, literal.digest)

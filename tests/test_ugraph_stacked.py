"""The grid's blocks at once (:mod:`gensorage.ugraph.stacked`): tiles cut out and outputs assembled by layout ops
hold exactly the values of the literal block-by-block slices and concatenations, in float64 and in both fields,
and whole evaluations agree residue for residue."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gensorage.arith import Float64Arith
from gensorage.errors import NotLaxError, UGraphError
from gensorage.opset import Op
from gensorage.program import Program
from gensorage.superopt.row_fusion import fused_direct
from gensorage.ugraph import (
    Accumulator,
    BlockGraph,
    BlockOp,
    GraphDefinedOp,
    InputIterator,
    KernelGraph,
    OutputSaver,
    TensorSpec,
    evaluate,
)
from gensorage.ugraph.evaluate import _assemble, _block_tile
from gensorage.ugraph.examples import EXAMPLES
from gensorage.ugraph.stacked import assemble_stacked, loop_concat, loop_sum, loop_tiles, stacked_tiles
from gensorage.verify.bounds import BoundsArith
from gensorage.verify.field import FieldArith
from gensorage.verify.mutate import MUTATIONS, mutate
from gensorage.verify.uninterpreted import UninterpretedArith

F64 = Float64Arith()


@st.composite
def _partitions(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int | None, ...], tuple[int, ...]]:
    """A grid (1-3 dims), an imap onto a tensor of 1-4 dims (replicas, nested dims), and a divisible shape."""
    ndim = draw(st.integers(1, 4))
    grid = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    imap = tuple(draw(st.one_of(st.none(), st.integers(0, ndim - 1))) for _ in grid)
    shape = []
    for d in range(ndim):
        parts = int(np.prod([n for n, m in zip(grid, imap, strict=True) if m == d]))
        shape.append(parts * draw(st.integers(1, 3)))
    return grid, imap, tuple(shape)


def _literal_stack(x: np.ndarray, imap: tuple[int | None, ...], grid: tuple[int, ...]) -> np.ndarray:
    it = InputIterator(0, imap)
    blocks = itertools.product(*(range(n) for n in grid))
    return np.stack([_block_tile(F64, x, it, grid, b) for b in blocks])


@settings(max_examples=200, deadline=None)
@given(_partitions(), st.integers(0, 2**32 - 1))
def test_stacked_tiles_are_the_literal_tiles_bit_for_bit(part: tuple, seed: int) -> None:
    grid, imap, shape = part
    x = np.random.default_rng(seed).standard_normal(shape)
    got = stacked_tiles(F64, x, imap, grid)
    want = _literal_stack(x, imap, grid)
    assert got.shape == want.shape and np.array_equal(got, want)


@settings(max_examples=200, deadline=None)
@given(_partitions(), st.integers(0, 2**32 - 1))
def test_assembly_is_the_literal_concatenation_bit_for_bit(part: tuple, seed: int) -> None:
    grid, _, shape = part
    omap = (
        tuple(random.Random(seed).sample(range(len(shape)), len(grid))) if len(grid) <= len(shape) else None
    )
    if omap is None:
        return
    blocks = list(itertools.product(*(range(n) for n in grid)))
    tiles = np.random.default_rng(seed).standard_normal((len(blocks), *shape))
    got = assemble_stacked(F64, tiles, grid, omap)
    want = _assemble(F64, dict(zip(blocks, tiles, strict=True)), grid, omap)
    assert got.shape == want.shape and np.array_equal(got, want)


def test_tiles_and_assembly_are_inverse_in_the_field() -> None:
    arith = UninterpretedArith(2, np.random.default_rng(0))
    x = arith.random_input((6, 4, 8))
    grid, imap = (3, 2, 2), (0, 2, 1)
    tiles = stacked_tiles(arith, x, imap, grid)
    assert tiles.shape == (12, 2, 2, 4)
    assert np.array_equal(assemble_stacked(arith, tiles, grid, imap).data, x.data)  # type: ignore[arg-type]


def test_an_uneven_split_is_a_one_line_error() -> None:
    with pytest.raises(UGraphError, match="cannot split a dim of size 6 into 4 equal parts"):
        stacked_tiles(F64, np.zeros((6, 2)), (0, 0), (2, 2))


@settings(max_examples=100, deadline=None)
@given(_partitions(), st.integers(2, 4), st.integers(0, 2**32 - 1))
def test_loop_tiles_and_concat_are_the_literal_slices_bit_for_bit(part: tuple, loop: int, seed: int) -> None:
    """Every iteration's tile (block major) and the iterations concatenated back, against the literal
    per-iteration slices and concatenation."""
    grid, _, shape = part
    rng = np.random.default_rng(seed)
    fmap = int(rng.integers(-1, len(shape)))
    tile = tuple(d * loop if j == fmap else d for j, d in enumerate(shape))
    x = rng.standard_normal((3, *tile))
    fm = None if fmap < 0 else fmap
    got = loop_tiles(F64, x, loop, fm)
    parts = [[b if fm is None else np.split(b, loop, axis=fm)[i] for i in range(loop)] for b in x]
    assert np.array_equal(got, np.stack([t for block in parts for t in block]))
    if fm is not None:
        assert np.array_equal(loop_concat(F64, got, loop, fm), x)


@pytest.mark.parametrize("kind", ["uninterpreted", "field"])
def test_the_loop_sum_is_the_accumulated_sum_in_the_field(kind: str) -> None:
    arith = (UninterpretedArith if kind == "uninterpreted" else FieldArith)(2, np.random.default_rng(5))
    x = arith.random_input((3 * 4, 2, 5))
    acc = None
    rows = [arith.slice(x, 0, i, i + 1) for i in range(12)]
    sums = []
    for b in range(3):
        acc = None
        for i in range(4):
            acc = arith.accumulate(acc, rows[4 * b + i], "sum")
        sums.append(acc)
    assert np.array_equal(loop_sum(arith, x, 4).data, arith.concat(sums, 0).data)  # type: ignore[attr-defined]


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from([1, 2, 3]),
    st.sampled_from([1, 2, 4]),
    st.sampled_from([2, 5]),
    st.sampled_from(["sum", "max"]),
    st.integers(0, 2**32 - 1),
)
def test_looped_tiled_matmuls_agree_with_one_block_at_a_time(
    gm: int, gn: int, loop: int, kind: str, seed: int
) -> None:
    """Looped schedules (sum: all iterations at once; max: one iteration at a time), K split by the loop."""
    nodes = (
        InputIterator(0, (None, 0), 1),
        InputIterator(1, (1, None), 0),
        BlockOp(Op.MATMUL, (0, 1)),
        Accumulator(2, kind),  # type: ignore[arg-type]
        OutputSaver(3, (1, 0)),
    )
    block = BlockGraph((gn, gm), loop, nodes)
    g = KernelGraph(
        (TensorSpec("X", (6, 10)), TensorSpec("W", (10, 8))), (GraphDefinedOp(block, (0, 1)),), (2,)
    )
    assert _same(_outputs(g, "uninterpreted", True, seed), _outputs(g, "uninterpreted", False, seed))


# --------------------------------------------------------------------------------- whole evaluations


def _outputs(graph: KernelGraph, kind: str, stack: bool, seed: int) -> list:
    arith = (UninterpretedArith if kind == "uninterpreted" else FieldArith)(2, np.random.default_rng(seed))
    return evaluate(graph, arith, [arith.random_input(t.shape) for t in graph.inputs], stack=stack)


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        np.array_equal(x.data, y.data)
        and getattr(x, "tainted", False) == getattr(y, "tainted", False)
        and np.array_equal(getattr(x, "digest", None), getattr(y, "digest", None))
        for x, y in zip(a, b, strict=True)
    )


def _layer_rows(t: int) -> Program:
    """A decoder layer's row kernels at ``t`` tokens: RMSNorm, a projection, a row softmax and SwiGLU."""
    p = Program(name="rows")
    x, g = p.input("X", (1, t, 16), "float32"), p.input("G", (16,), "float32")
    w, s = p.input("W", (16, 24), "float32"), p.input("S", (2, t, t), "float32")
    h = p.matmul(p.mul(p.rms_norm(x), g), w)
    p.output(p.mul(p.silu(h), h))
    p.output(p.softmax(s, 2))
    return p


@pytest.mark.parametrize("t", [3, 12, 20])
@pytest.mark.parametrize("kind", ["uninterpreted", "field"])
def test_row_fused_layer_graphs_agree_with_one_block_at_a_time(t: int, kind: str) -> None:
    graph = fused_direct(_layer_rows(t), "float32", None)
    assert graph is not None and any(hasattr(op, "block") for op in graph.ops)
    assert _same(_outputs(graph, kind, True, t), _outputs(graph, kind, False, t))
    assert not _same(_outputs(graph, kind, True, t), _outputs(graph, kind, False, t + 1))


@pytest.mark.parametrize("kind", ["uninterpreted", "field"])
@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(EXAMPLES)), st.sampled_from(sorted(MUTATIONS)), st.integers(0, 2**32 - 1))
def test_examples_and_their_mutants_agree_in_both_fields(
    kind: str, name: str, mutation: str, seed: int
) -> None:
    _, graph = EXAMPLES[name]()
    m = mutate(graph, random.Random(seed), mutation)
    g = graph if m is None else m.graph
    try:
        literal = _outputs(g, kind, False, seed)
    except UGraphError:
        with pytest.raises(UGraphError):
            _outputs(g, kind, True, seed)
        return
    assert _same(_outputs(g, kind, True, seed), literal)


# --------------------------------------------------------------------------------- the bounds: blocks alike


def _bounds_state(graph: KernelGraph, uninterpreted: bool, stack: bool | None) -> tuple:
    arith = BoundsArith(uninterpreted=uninterpreted)
    outs = evaluate(graph, arith, [arith.variable(t.shape) for t in graph.inputs], stack=stack)
    apps = {s: (a.count, a.dn, a.dd, a.wn, a.wd) for s, a in arith.applications.items()}
    counters = (arith.divisor_degree_p, arith.divisor_degree_q, arith.exp_divisor, arith.total_numel)
    return outs, apps, counters, sorted(arith.opaque)


def _graphs() -> list[tuple[str, KernelGraph]]:
    out = [(name, make()[1]) for name, make in sorted(EXAMPLES.items())]
    for t in (3, 12):
        graph = fused_direct(_layer_rows(t), "float32", None)
        assert graph is not None
        out.append((f"rows@{t}", graph))
    return out


@pytest.mark.parametrize("uninterpreted", [True, False])
def test_the_bounds_run_one_block_and_count_the_others_exactly(uninterpreted: bool) -> None:
    """Outputs (bounds, sharing), applications, divisor degrees and element counts equal every block run
    literally, on the paper examples and row-fused layer graphs: the trial plans cannot differ."""
    for name, graph in _graphs():
        try:
            literal = _bounds_state(graph, uninterpreted, False)
        except NotLaxError:  # the second tier's bounds reject two exps on one path, alike or literal
            with pytest.raises(NotLaxError):
                _bounds_state(graph, uninterpreted, None)
            continue
        assert _bounds_state(graph, uninterpreted, None) == literal, name


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(EXAMPLES)), st.sampled_from(sorted(MUTATIONS)), st.integers(0, 2**32 - 1))
def test_the_bounds_of_mutants_are_counted_exactly(name: str, mutation: str, seed: int) -> None:
    _, graph = EXAMPLES[name]()
    m = mutate(graph, random.Random(seed), mutation)
    g = graph if m is None else m.graph
    try:
        literal = _bounds_state(g, True, False)
    except UGraphError:
        with pytest.raises(UGraphError):
            _bounds_state(g, True, None)
        return
    assert _bounds_state(g, True, None) == literal


def test_the_counts_are_checked_against_a_miscount() -> None:
    """The comparison above can fail: one block's counts added once too often change the state."""
    graph = fused_direct(_layer_rows(12), "float32", None)
    assert graph is not None
    literal = _bounds_state(graph, True, False)
    real = BoundsArith.add_counters
    try:
        BoundsArith.add_counters = lambda self, before, times: real(self, before, times + 1)  # type: ignore[method-assign]
        assert _bounds_state(graph, True, None) != literal
    finally:
        BoundsArith.add_counters = real  # type: ignore[method-assign]

"""Finishing a block graph: once every input iterator is used and every tensor is consumed except the ones to
save (all after the for-loop when there is one), one output saver per unconsumed tensor, for every assignment of
the grid dims to output dims (omap); the graph-defined operator is then added to the kernel graph.

The finished graph has the grid dims that exist (those a binding split an input along; at least one). Checks,
in order: for the last kernel operator, the program outputs' shapes; the dim strategy's omaps; the canonical
rank; the oracle on each kernel tensor written (``pruned_expr``) and device memory (``pruned_memory``); for an
earlier kernel operator, the element counts of what it writes (``pruned_expr``) and, unless replicated writes are
allowed, no copies written (uncounted).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from functools import lru_cache
from typing import TYPE_CHECKING

from gensorage.dtypes import dtype_bytes
from gensorage.exhaustive.dim_strategy import fits
from gensorage.exhaustive.expr.expr_arith import EXPR, ExprValue
from gensorage.exhaustive.expr.ties import Ties, holds_copies, saved_ties
from gensorage.exhaustive.walk.rank import GRAPH_DEFINED_CODE, follows, rank_key
from gensorage.exhaustive.walk.search_state import BlockBuild, BlockOpRec, numel
from gensorage.exhaustive.walk.stable_subs import block_sub_result
from gensorage.opset import Shape
from gensorage.ugraph.evaluate import run_block_graph
from gensorage.ugraph.ir import (
    Accumulator,
    BlockGraph,
    BlockNode,
    BlockOp,
    GraphDefinedOp,
    InputIterator,
    OutputSaver,
    Ref,
)

if TYPE_CHECKING:
    from gensorage.exhaustive.walk.walk import Walk


@lru_cache(maxsize=256)
def omap_choices(ndim: int, r: int) -> tuple[tuple[int, ...], ...]:
    """Every omap: an injective map of the ``r`` grid dims to output dims."""
    return tuple(itertools.permutations(range(ndim), r))


def live_dims(b: BlockBuild) -> tuple[int, ...]:
    """The grid dims that exist: those a binding has split an input along (see the module docstring)."""
    return tuple(g for g, size in enumerate(b.grid) if size is not None)


def live_imaps(b: BlockBuild) -> tuple[tuple[int | None, ...], ...]:
    """The iterators' imaps over the existing grid dims only (every iterator bound)."""
    live = live_dims(b)
    return tuple(tuple(m[g] for g in live) for m in b.imap)  # type: ignore[index]


def block_nodes(b: BlockBuild) -> list[BlockNode]:
    """Iterators and operators of the block graph in progress (no savers; every iterator bound)."""
    imaps = live_imaps(b)
    nodes: list[BlockNode] = [InputIterator(i, imaps[i], b.fmap[i]) for i in range(len(b.inputs))]
    for rec in b.recs:
        if isinstance(rec, BlockOpRec):
            nodes.append(BlockOp(rec.variant.op, tuple(Ref(i) for i in rec.inputs), rec.variant.attrs))
        else:
            values = None if rec.values is None else Ref(rec.values)
            nodes.append(Accumulator(Ref(rec.input), rec.kind, rec.fmap, values))
    return nodes


def finishable(s: Walk, b: BlockBuild) -> list[int] | None:
    """The tensors the block graph would save if finished now, or None when it cannot finish yet."""
    m = len(b.inputs)
    if b.n_ops == 0 or any(b.shape[i] is None or b.uses[i] == 0 for i in range(m)):
        return None
    if not live_dims(b):
        return None  # no grid dim yet (a block graph has one at least)
    outs = [j for j in range(m, len(b.shape)) if b.uses[j] == 0]
    if not 1 <= len(outs) <= b.max_outputs:
        return None
    if b.looped and not all(b.post[j] for j in outs):
        return None
    if s.spec.sub_stabilises_only and any(block_sub_result(b, j) for j in outs):
        return None  # only an exp reads a sub result
    return outs


def finish(s: Walk) -> Iterator[None]:
    """Every finishing child of the block-level node (see the module docstring)."""
    st = s.state
    b = st.block
    assert b is not None
    tie_rule = s.context.rules.ties
    outs = finishable(s, b)
    if outs is None:
        return
    nodes = block_nodes(b)
    live = live_dims(b)
    grid = tuple(size for size in b.grid if size is not None)
    imaps = live_imaps(b)
    forloop = b.forloop or 1
    refs = tuple(st.ref[t] for t in b.inputs)
    body = _body_key(b, grid, imaps, forloop)
    for omaps in itertools.product(*(omap_choices(len(b.shape[j]), len(live)) for j in outs)):  # type: ignore[arg-type]
        if b.last_kernel_op and not _final_shapes_ok(s, b, outs, omaps, grid):
            continue
        if s.spec.dims is not None and not fits(s.spec.dims, len(live), imaps, omaps):
            continue
        key = rank_key(b.inputs, GRAPH_DEFINED_CODE, (*body, tuple(outs), omaps))
        if s.spec.canonical and not follows(st.last_key, key):
            continue
        savers = [OutputSaver(Ref(j), om) for j, om in zip(outs, omaps, strict=True)]
        block = BlockGraph(grid, forloop, (*nodes, *savers))
        results = _outputs(s, b, block, outs, omaps)
        if results is None:
            continue
        if not b.last_kernel_op and not _counts_ok(s, results):
            s.counters.pruned_expr += 1
            continue
        ties: list[Ties | None] | None = None
        if tie_rule is not None:
            ties = [
                saved_ties(b.ties[j], om, grid, live)  # type: ignore[arg-type]
                for j, om in zip(outs, omaps, strict=True)
            ]
            if (
                not s.spec.replicated_writes
                and not b.last_kernel_op
                and any(t is not None and holds_copies(t) for t in ties)
            ):
                continue
        st.close_block()
        st.push_kernel(
            GraphDefinedOp(block, refs), key, b.inputs, results, [b.const[j] for j in outs], ties=ties
        )
        try:
            yield
        finally:
            st.pop_kernel(b.inputs)
            st.block = b


def _counts_ok(s: Walk, results: list[tuple[Shape, str, ExprValue]]) -> bool:
    """Whether each kernel tensor a block graph writes has no more elements than a µGraph equal to the program
    can reduce to its outputs (see :mod:`gensorage.exhaustive.rules.element_counts`)."""
    caps = s.context.rules.element_caps
    return caps is None or all(
        v.layout is not None or caps.admits(numel(shape), v.term) for shape, _, v in results
    )


def _body_key(
    b: BlockBuild, grid: tuple[int, ...], imaps: tuple[tuple[int | None, ...], ...], forloop: int
) -> tuple[object, ...]:
    """The block graph without its savers as a tuple of ints (an injective attribute key for its rank; cheaper
    than the block's text and totally ordered, None written as -1)."""
    maps = tuple(tuple(-1 if d is None else d for d in m) for m in imaps)
    fmaps = tuple(-1 if f is None else f for f in b.fmap)
    recs = tuple(
        (r.variant.code, r.inputs) if isinstance(r, BlockOpRec) else (-1, (r.inputs, r.code)) for r in b.recs
    )
    return (grid, forloop, maps, fmaps, recs)


def _final_shapes_ok(
    s: Walk, b: BlockBuild, outs: list[int], omaps: tuple[tuple[int, ...], ...], grid: tuple[int, ...]
) -> bool:
    """For the last kernel operator: its outputs must have the program outputs' shapes."""
    shapes = []
    for j, om in zip(outs, omaps, strict=True):
        shape = list(b.shape[j])  # type: ignore[arg-type]
        for g, d in enumerate(om):
            shape[d] *= grid[g]
        shapes.append(tuple(shape))
    return sorted(shapes) == sorted(s.context.output_shapes)


def _outputs(
    s: Walk, b: BlockBuild, block: BlockGraph, outs: list[int], omaps: tuple[tuple[int, ...], ...]
) -> list[tuple[Shape, str, ExprValue]] | None:
    """(shape, dtype, expression) of each kernel tensor the finished block graph writes, or None if pruned."""
    st = s.state
    values: list[ExprValue] = []
    if b.exact:
        for j, om in zip(outs, omaps, strict=True):
            v = b.val[j]
            assert v is not None
            for g, d in enumerate(om):
                v = EXPR.concat([v] * block.grid[g], d)
            values.append(v)
    else:  # a concatenated input: blocks see different pieces, so evaluate them all
        values = run_block_graph(EXPR, block, [st.val[t] for t in b.inputs])
    if s.spec.prune and not all(s.context.oracle.is_subexpr(v.term) for v in values):
        s.counters.pruned_expr += 1
        return None
    added = sum(numel(v.shape) * dtype_bytes(b.dtype[j]) for v, j in zip(values, outs, strict=True))
    if st.dram + added > s.context.hw.dram_bytes:
        s.counters.pruned_memory += 1
        return None
    return [(v.shape, b.dtype[j], v) for v, j in zip(values, outs, strict=True)]


__all__ = ["block_nodes", "finish", "finishable", "live_dims", "live_imaps", "omap_choices"]

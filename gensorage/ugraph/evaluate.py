"""The literal µGraph evaluator: runs every block of every grid and every for-loop iteration.

Values are opaque: only :class:`gensorage.arith.Arith` methods touch them, so the same walk serves float64
numerics, the finite-field identity test and abstract arithmetics. Partitioning is followed literally — each
iterator's tile is cut out with ``arith.slice`` per imap (x, y, z in order) and fmap, accumulators combine
iterations with ``arith.accumulate`` (or concatenate them), and every output is assembled with ``arith.concat``
of the blocks' saver tiles in grid order — so a wrong imap, fmap or omap gives a wrong answer.

In the exact arithmetics (the verifier's fields) the blocks of a grid run *stacked*: every block's tile of an
iterator is cut out of the whole input at once by layout ops (a reshape splitting each mapped dim into
(blocks, tile), a repeat per replica grid dim, axis swaps: :func:`gensorage.ugraph.stacked.stacked_tiles`) into
one value with the block index as a leading axis, the block graph's body runs on it
(:class:`gensorage.ugraph.stacked.StackedArith`), and each saver's stacked tiles are laid out into the output by
the inverse layout ops (:func:`~gensorage.ugraph.stacked.assemble_stacked`). When every accumulator sums or
concatenates, the loop's iterations are stacked too (block major) and the body runs once: a sum accumulator is
one exact sum over the iteration axis, a concatenation one layout; with a running maximum (``max``, online
softmax) the body runs once per iteration. Layout ops move values without computing and the fields' sums are
exact, so every residue is the same as one block and one iteration at a time, and the number of operations no
longer grows with the grid or the loop. The bounds (:class:`gensorage.verify.bounds.BoundsArith`, ``blocks_alike``) give every block's
tile the same bound wherever it is cut, so every block computes the same values: the first block runs
literally and the arithmetic adds the other blocks' shares to its counters.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np

from gensorage import opset
from gensorage.arith import Arith, Float64Arith
from gensorage.errors import UGraphError
from gensorage.ugraph.ir import (
    ONLINE_SOFTMAX_KINDS,
    Accumulator,
    BlockGraph,
    BlockOp,
    GraphDefinedOp,
    InputIterator,
    KernelGraph,
    KernelOp,
    OutputSaver,
    ThreadGraph,
)
from gensorage.ugraph.online_softmax import online_result, online_step
from gensorage.ugraph.stacked import (
    StackedArith,
    assemble_stacked,
    can_stack,
    loop_concat,
    loop_sum,
    loop_tiles,
    stacked_tiles,
)
from gensorage.ugraph.validate import loop_phases, validate

V = TypeVar("V")


def _part(arith: Arith[V], x: V, axis: int, parts: int, index: int) -> V:
    """Chunk ``index`` of ``parts`` equal chunks of ``x`` along ``axis``."""
    if parts == 1:
        return x
    size = arith.shape(x)[axis]
    if size % parts:
        raise UGraphError(f"cannot split a dim of size {size} into {parts} equal parts")
    step = size // parts
    return arith.slice(x, axis, index * step, (index + 1) * step)


def _concat(arith: Arith[V], parts: Sequence[V], axis: int) -> V:
    return parts[0] if len(parts) == 1 else arith.concat(parts, axis)


def _block_tile(arith: Arith[V], x: V, it: InputIterator, grid: Sequence[int], bidx: Sequence[int]) -> V:
    for g, d in enumerate(it.imap):
        if d is not None:
            x = _part(arith, x, d, grid[g], bidx[g])
    return x


def _thread(arith: Arith[V], tg: ThreadGraph, args: Sequence[V]) -> tuple[V, ...]:
    local = list(args)
    for top in tg.ops:
        local.append(opset.apply(top.op, arith, [local[r.node] for r in top.inputs], top.attrs))
    return tuple(local[r.node] for r in tg.outputs)


def _compute(arith: Arith[V], node: BlockOp | ThreadGraph, vals: dict[int, tuple[V, ...]]) -> tuple[V, ...]:
    args = [vals[r.node][r.out] for r in node.inputs]
    if isinstance(node, BlockOp):
        return (opset.apply(node.op, arith, args, node.attrs),)
    return _thread(arith, node, args)


def _run_tiles(arith: Arith[V], block: BlockGraph, tiles: dict[int, V], phases: Sequence[str]) -> list[V]:
    """The saver tiles of a block whose input iterators cut ``tiles`` (by node index), in saver order."""
    nodes = block.nodes
    accs: dict[int, Any] = {
        j: (None if n.fmap is None else []) for j, n in enumerate(nodes) if isinstance(n, Accumulator)
    }
    vals: dict[int, tuple[V, ...]] = {}
    for i in range(block.forloop):
        for j, node in enumerate(nodes):
            if phases[j] != "body":
                continue
            if isinstance(node, InputIterator):
                tile = tiles[j] if node.fmap is None else _part(arith, tiles[j], node.fmap, block.forloop, i)
                vals[j] = (tile,)
            else:
                assert isinstance(node, BlockOp | ThreadGraph)
                vals[j] = _compute(arith, node, vals)
        for j, acc in accs.items():
            node = nodes[j]
            assert isinstance(node, Accumulator)
            x = vals[node.input.node][node.input.out]
            if node.kind in ONLINE_SOFTMAX_KINDS:
                v = None if node.values is None else vals[node.values.node][node.values.out]
                accs[j] = online_step(arith, acc, x, v, node.kind)
            elif node.fmap is None:
                accs[j] = arith.accumulate(acc, x, node.kind)  # type: ignore[arg-type]
            else:
                acc.append(x)
    for j, acc in accs.items():
        node = nodes[j]
        assert isinstance(node, Accumulator)
        if node.kind in ONLINE_SOFTMAX_KINDS:
            vals[j] = (online_result(arith, acc),)
        else:
            vals[j] = (acc if node.fmap is None else _concat(arith, acc, node.fmap),)
    return _after_loop(arith, block, vals, phases)


def _after_loop(
    arith: Arith[V], block: BlockGraph, vals: dict[int, tuple[V, ...]], phases: Sequence[str]
) -> list[V]:
    """The saver tiles, from the loop's accumulators (in ``vals``) and the post-loop nodes."""
    outs: list[V] = []
    for j, node in enumerate(block.nodes):
        if isinstance(node, OutputSaver):
            outs.append(vals[node.input.node][node.input.out])
        elif phases[j] == "post" and not isinstance(node, Accumulator):
            assert isinstance(node, BlockOp | ThreadGraph)
            vals[j] = _compute(arith, node, vals)
    return outs


def _loop_at_once(block: BlockGraph) -> bool:
    """Whether every accumulator sums or concatenates (no running maximum): then, stacked, every iteration of
    the loop can run at once and the accumulators become one sum or one layout over the iteration axis."""
    accs = [n for n in block.nodes if isinstance(n, Accumulator)]
    return block.forloop > 1 and all(
        a.kind not in ONLINE_SOFTMAX_KINDS and (a.fmap is not None or a.kind == "sum") for a in accs
    )


def _run_loop_at_once(
    arith: Arith[V], block: BlockGraph, tiles: dict[int, V], phases: Sequence[str]
) -> list[V]:
    """:func:`_run_tiles` on stacked ``tiles`` (``arith`` the inner arithmetic) with all iterations of the loop
    stacked too (:func:`~gensorage.ugraph.stacked.loop_tiles`): the body runs once, each sum accumulator is one
    exact sum over the iteration axis, each concatenation one layout."""
    loop, nodes = block.forloop, block.nodes
    wide = StackedArith(arith)
    vals: dict[int, tuple[V, ...]] = {}
    for j, node in enumerate(nodes):
        if phases[j] != "body":
            continue
        if isinstance(node, InputIterator):
            vals[j] = (loop_tiles(arith, tiles[j], loop, node.fmap),)
        else:
            assert isinstance(node, BlockOp | ThreadGraph)
            vals[j] = _compute(wide, node, vals)
    for j, node in enumerate(nodes):
        if isinstance(node, Accumulator):
            x = vals[node.input.node][node.input.out]
            vals[j] = (
                loop_sum(arith, x, loop) if node.fmap is None else loop_concat(arith, x, loop, node.fmap),
            )
    return _after_loop(wide, block, vals, phases)


def _iterators(block: BlockGraph) -> list[tuple[int, InputIterator]]:
    return [(j, n) for j, n in enumerate(block.nodes) if isinstance(n, InputIterator)]


def _run_blocks(
    arith: Arith[V], block: BlockGraph, args: Sequence[V], phases: Sequence[str]
) -> list[list[V]]:
    """Per saver, the tile of every block (in grid order), one block at a time."""
    per_saver: list[list[V]] = [[] for _ in block.savers]
    for bidx in itertools.product(*(range(n) for n in block.grid)):
        tiles = {j: _block_tile(arith, args[n.input], n, block.grid, bidx) for j, n in _iterators(block)}
        for s, tile in enumerate(_run_tiles(arith, block, tiles, phases)):
            per_saver[s].append(tile)
    return per_saver


def _run_alike(arith: Any, block: BlockGraph, args: Sequence[V], phases: Sequence[str]) -> list[list[V]]:
    """:func:`_run_blocks` for an arithmetic whose blocks all compute the same values (``blocks_alike``): the
    first block runs literally and the arithmetic adds the others' counts to its counters."""
    blocks = math.prod(block.grid)
    before = arith.counters()
    first = tuple(0 for _ in block.grid)
    tiles = {j: _block_tile(arith, args[n.input], n, block.grid, first) for j, n in _iterators(block)}
    outs = _run_tiles(arith, block, tiles, phases)
    arith.add_counters(before, blocks - 1)
    return [[x] * blocks for x in outs]


def _run_stacked(arith: Arith[V], block: BlockGraph, args: Sequence[V], phases: Sequence[str]) -> list[V]:
    """The outputs of :func:`_run_blocks`' tiles assembled, with every block at once (:mod:`.stacked`): each
    iterator's tiles cut out and stacked by layout ops on the whole input, the body run on the stack, each
    saver's stacked tiles laid out into its output."""
    stacked = StackedArith(arith)
    tiles = {j: stacked_tiles(arith, args[n.input], n.imap, block.grid) for j, n in _iterators(block)}
    if _loop_at_once(block):
        outs = _run_loop_at_once(arith, block, tiles, phases)
    else:
        outs = _run_tiles(stacked, block, tiles, phases)
    return [assemble_stacked(arith, x, block.grid, sv.omap) for x, sv in zip(outs, block.savers, strict=True)]


def _assemble(
    arith: Arith[V], tiles: dict[tuple[int, ...], V], grid: Sequence[int], omap: Sequence[int]
) -> V:
    """Concatenate the blocks' tiles: along ``omap[0]`` over x (outermost), then y, then z."""

    def build(prefix: tuple[int, ...]) -> V:
        g = len(prefix)
        if g == len(grid):
            return tiles[prefix]
        return _concat(arith, [build(prefix + (b,)) for b in range(grid[g])], omap[g])

    return build(())


def run_block_graph(
    arith: Arith[V], block: BlockGraph, args: Sequence[V], *, stack: bool | None = None
) -> list[V]:
    """Outputs of a graph-defined kernel op with block graph ``block`` on kernel inputs ``args``.

    ``stack``: run the blocks together on stacked tiles (:mod:`gensorage.ugraph.stacked`); by default when the
    arithmetic declares that batching does not change its results (the exact fields). ``stack=False`` runs every
    block literally; by default an arithmetic whose blocks all compute the same values (``blocks_alike``: the
    bounds) runs the first block and counts the others.
    """
    phases = loop_phases(block)
    if can_stack(arith) if stack is None else stack:
        return _run_stacked(arith, block, args, phases)
    alike = stack is None and getattr(arith, "blocks_alike", False)
    per_saver = (_run_alike if alike else _run_blocks)(arith, block, args, phases)
    grid = list(itertools.product(*(range(n) for n in block.grid)))
    return [
        _assemble(arith, dict(zip(grid, tiles, strict=True)), block.grid, sv.omap)
        for tiles, sv in zip(per_saver, block.savers, strict=True)
    ]


def evaluate(
    g: KernelGraph, arith: Arith[V], inputs: Sequence[V], *, check: bool = True, stack: bool | None = None
) -> list[V]:
    """Evaluate µGraph ``g`` on ``inputs`` (one per kernel input, in order) in ``arith``.

    Parameters
    ----------
    g : KernelGraph
        The µGraph.
    arith : Arith
        The arithmetic values live in.
    inputs : sequence
        One value per ``g.inputs``, of the declared shape.
    check : bool
        Validate ``g`` (without a hardware profile) first; skip only for graphs already validated.
    stack : bool, optional
        Run each grid's blocks together on stacked tiles; by default exactly for arithmetics that declare
        batching does not change their results (the finite fields), never for float64. False: every block
        literally, one at a time, in every arithmetic (by default the bounds run one block and count the rest).

    Returns
    -------
    list
        One value per ``g.outputs``.
    """
    if check:
        validate(g)
    if len(inputs) != len(g.inputs):
        raise UGraphError(f"µGraph takes {len(g.inputs)} inputs, got {len(inputs)}")
    for spec, v in zip(g.inputs, inputs, strict=True):
        if tuple(arith.shape(v)) != spec.shape:
            raise UGraphError(
                f"input {spec.name}: expected shape {list(spec.shape)}, got {list(arith.shape(v))}"
            )
    values: list[tuple[V, ...]] = [(v,) for v in inputs]
    for node in g.ops:
        args = [values[r.node][r.out] for r in node.inputs]
        if isinstance(node, KernelOp):
            values.append((opset.apply(node.op, arith, args, node.attrs),))
        elif isinstance(node, GraphDefinedOp):
            values.append(tuple(run_block_graph(arith, node.block, args, stack=stack)))
        else:
            raise UGraphError(f"not a kernel op: {type(node).__name__}")
    return [values[r.node][r.out] for r in g.outputs]


def run(g: KernelGraph, *arrays: np.ndarray) -> list[np.ndarray]:
    """Evaluate ``g`` on numpy arrays in float64 (:class:`gensorage.arith.Float64Arith`)."""
    return evaluate(g, Float64Arith(), [np.asarray(a, dtype=np.float64) for a in arrays])


__all__ = ["evaluate", "run", "run_block_graph"]

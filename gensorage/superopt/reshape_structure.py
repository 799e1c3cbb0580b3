"""Re-instantiating a µGraph found for one shape of a program at another shape of the same program.

A µGraph stores concrete sizes, but most of what the search found is shape-agnostic: which kernels exist, which
ops each block runs on which tiles, the imaps, fmaps, omaps and accumulators (the *algebraic structure*). Only
three kinds of numbers depend on the shape:

1. the kernel inputs' shapes, which come from the new program;
2. size-valued attributes (``reshape`` targets, ``sum`` groups, ``repeat`` counts) and ``scale`` factors, which
   are mapped from the old program to the new one through the programs' node-by-node correspondence (both have
   the same :meth:`~gensorage.program.Program.structure_key`, so their canonical node orders pair up), and, for
   tile-level reshapes, re-derived from the new tile shapes;
3. each graph-defined kernel's grid and for-loop trip count — a schedule choice. They are *constructed* again
   for the new shapes: every grid dim and the loop range over the divisors of the dims they split, and a
   walk over that lattice (exhaustive when it is small) keeps the choice the µGraph cost model predicts
   fastest among those that fit the hardware. Kernels are constructed one after another in topological
   order, since a kernel's choice can change the shape of what later kernels read (e.g. a split count that
   appears in a partial-sum tensor).

Whatever cannot be mapped unambiguously raises :class:`ReshapeFailed` with the reason; the caller falls back to
the direct µGraph. The result is valid by construction; *equivalence* to the new program is still checked by
the caller (``gensorage.verify.equivalent``), since a mapped attribute can be wrong in ways shapes do not show.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from gensorage import opset
from gensorage.codegen.gpu_limits import MAX_GRID
from gensorage.codegen.kernel_fit import launch_problem
from gensorage.construction.kernel_sizes import (
    CostFn,
    SizeLattice,
    divisors,
    kernel_sizes,
    nearest,
    single_op_graph,
)
from gensorage.errors import ProgramError, UGraphError
from gensorage.opset import Attrs, Op, Shape
from gensorage.superopt.size_map import ReshapeFailed, SizeMap, map_attrs, size_map
from gensorage.ugraph.ir import (
    ONLINE_SOFTMAX_KINDS,
    Accumulator,
    BlockGraph,
    BlockNode,
    BlockOp,
    GraphDefinedOp,
    InputIterator,
    KernelGraph,
    KernelNode,
    KernelOp,
    OutputSaver,
    Ref,
    TensorSpec,
    ThreadGraph,
)
from gensorage.ugraph.shapes import BlockInfo, TensorInfo, block_shapes, infer, iterator_tile, thread_shapes
from gensorage.ugraph.validate import validate

if TYPE_CHECKING:
    from gensorage.hw.profile import HwProfile
    from gensorage.program import Program


# =========================================================================================== block graphs


@dataclass(frozen=True, slots=True)
class _KernelContext:
    """What re-instantiating one graph-defined kernel needs."""

    k: int
    node: GraphDefinedOp
    old_args: tuple[TensorInfo, ...]
    new_args: tuple[TensorInfo, ...]
    old_info: BlockInfo
    smap: SizeMap


def _where(ctx: _KernelContext, j: int | None = None) -> str:
    return f"kernel op {ctx.k}" + ("" if j is None else f", block node #{j}")


def rebuild_block(ctx: _KernelContext, grid: tuple[int, ...], forloop: int) -> BlockGraph:
    """The kernel's block graph with ``grid`` and ``forloop``, attributes re-derived from the new tiles.

    Raises :class:`UGraphError` when the partition does not divide and :class:`ReshapeFailed` when an
    attribute cannot be mapped.
    """
    old = ctx.node.block
    tiles: list[tuple[Shape, ...]] = []
    nodes: list[BlockNode] = []
    for j, node in enumerate(old.nodes):
        where = _where(ctx, j)
        new: BlockNode
        match node:
            case InputIterator():
                new = node
                src = ctx.new_args[node.input]
                outs: tuple[Shape, ...] = (iterator_tile(node, src.shape, grid, forloop, where),)
            case BlockOp():
                old_in = [ctx.old_info.nodes[r.node][r.out].shape for r in node.inputs]
                new_in = [tiles[r.node][r.out] for r in node.inputs]
                same_broadcast(node.op, old_in, new_in, where)
                attrs = map_attrs(node.op, node.attrs, old_in, new_in, ctx.smap, where)
                new = replace(node, attrs=attrs)
                outs = (_shape(node.op, new_in, attrs, where),)
            case ThreadGraph():
                new = _rebuild_thread(node, ctx.smap, where)
                # Only the tiles' shapes matter here (validate() checks dtypes on the finished graph).
                args = [TensorInfo(tiles[r.node][r.out], "float32") for r in node.inputs]
                local = thread_shapes(new, args, where)
                old_args = [
                    TensorInfo(ctx.old_info.nodes[r.node][r.out].shape, "float32") for r in node.inputs
                ]
                old_local = thread_shapes(node, old_args, where)
                for i, top in enumerate(node.ops):
                    same_broadcast(
                        top.op,
                        [old_local[r.node].shape for r in top.inputs],
                        [local[r.node].shape for r in top.inputs],
                        f"{where}, thread op {i}",
                    )
                outs = tuple(local[r.node].shape for r in new.outputs)
            case Accumulator() if node.kind in ONLINE_SOFTMAX_KINDS:
                new = node
                s_tile = tiles[node.input.node][node.input.out]
                if node.values is None:
                    outs = (s_tile[:-1] + (1,),)
                else:
                    v_tile = tiles[node.values.node][node.values.out]
                    outs = (s_tile[:-1] + v_tile[-1:],)
            case Accumulator():
                src_tile = tiles[node.input.node][node.input.out]
                new = node
                outs = (
                    src_tile
                    if node.fmap is None
                    else src_tile[: node.fmap] + (src_tile[node.fmap] * forloop,) + src_tile[node.fmap + 1 :],
                )
            case OutputSaver():
                new = node
                outs = ()
            case _:
                raise ReshapeFailed(f"{where}: unknown block node {type(node).__name__}")
        tiles.append(outs)
        nodes.append(new)
    return BlockGraph(grid, forloop, tuple(nodes))


def same_broadcast(op: Op, old_in: Sequence[Shape], new_in: Sequence[Shape], where: str) -> None:
    """Raise :class:`ReshapeFailed` unless a binary operator broadcasts the same dims the same way at the new
    tiles as at the old ones. A structure verified where a tile dim was 1 (broadcast against the other operand)
    means something else where that dim is no longer 1 but happens to equal the other operand's: an elementwise
    operation the verified µGraph never performed (e.g. dividing by an accumulated tile of exps instead of by its
    row sums)."""
    if len(old_in) != 2 or (op not in opset.BINARY_ELEMENTWISE and op is not Op.MATMUL):
        return
    if op is Op.MATMUL:  # the batch dims broadcast; the two matrix dims are checked by shape inference
        old_in, new_in = [a[:-2] for a in old_in], [a[:-2] for a in new_in]
    if _broadcast_pattern(*old_in) != _broadcast_pattern(*new_in):
        raise ReshapeFailed(
            f"{where}: {op.value} broadcasts {list(new_in[0])} with {list(new_in[1])} differently "
            f"from the verified {list(old_in[0])} with {list(old_in[1])}"
        )


def _broadcast_pattern(a: Shape, b: Shape) -> tuple[str, ...]:
    """Per dim (aligned from the right): 'a' (only a is 1 and b is not: a broadcasts), 'b', or '=' otherwise."""
    n = max(len(a), len(b))
    pa, pb = (1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)
    return tuple(
        "a" if x == 1 and y != 1 else "b" if y == 1 and x != 1 else "=" for x, y in zip(pa, pb, strict=True)
    )


def _rebuild_thread(tg: ThreadGraph, smap: SizeMap, where: str) -> ThreadGraph:
    ops = tuple(
        replace(t, attrs=map_attrs(t.op, t.attrs, [], [], smap, f"{where}, thread op {i}"))
        if t.op is Op.SCALE
        else t
        for i, t in enumerate(tg.ops)
    )
    return ThreadGraph(tg.inputs, ops, tg.outputs)


def _shape(op: Op, shapes: Sequence[Shape], attrs: Attrs, where: str) -> Shape:
    try:
        return opset.infer_shape(op, list(shapes), attrs)
    except ProgramError as exc:
        raise UGraphError(f"{where}: {exc}") from None


# ====================================================================================== grid construction


def grid_choices(ctx: _KernelContext) -> SizeLattice:
    """Per grid dim: divisors of the gcd of the new input dims it splits (the old value when it splits none);
    for the loop: divisors > 1 of the dims the fmaps split, or 1 when the old graph had no loop. The start
    scales the old choice in proportion to the dims it splits."""
    old = ctx.node.block
    iters = [n for n in old.nodes if isinstance(n, InputIterator)]
    values: list[tuple[int, ...]] = []
    start: list[int] = []
    for g, old_g in enumerate(old.grid):
        split = [
            (ctx.old_args[it.input].shape[d], ctx.new_args[it.input].shape[d])
            for it in iters
            for d in [it.imap[g]]
            if d is not None
        ]
        if not split:
            values.append((old_g,))
            start.append(old_g)
            continue
        vals = divisors(math.gcd(*(n for _, n in split)), limit=MAX_GRID[g])
        values.append(vals)
        start.append(nearest(vals, old_g * split[0][1] / split[0][0]))
    if old.forloop == 1:
        values.append((1,))
        start.append(1)
    else:
        looped = [
            (ctx.old_args[it.input].shape[it.fmap], ctx.new_args[it.input].shape[it.fmap])
            for it in iters
            if it.fmap is not None
        ]
        if looped:
            vals = tuple(v for v in divisors(math.gcd(*(n for _, n in looped)), limit=1 << 20) if v > 1)
            if not vals:
                raise ReshapeFailed(f"{_where(ctx)}: the for-loop's dims have size 1 at the new shapes")
            values.append(vals)
            start.append(nearest(vals, old.forloop * looped[0][1] / looped[0][0]))
        else:
            values.append((old.forloop,))
            start.append(old.forloop)
    return SizeLattice(tuple(values), tuple(start))


def construct_kernel(
    ctx: _KernelContext, hw: HwProfile, cost: CostFn, rng: np.random.Generator, seed: int = 0
) -> GraphDefinedOp:
    """The kernel with the grid and loop the cost model prefers at the new shapes among those that launch on
    ``hw`` as the CUDA build emits them (:func:`gensorage.construction.kernel_sizes`, over
    :func:`grid_choices`; :func:`gensorage.codegen.kernel_fit.launch_problem`)."""
    block, error = kernel_sizes(
        lambda grid, forloop: rebuild_block(ctx, grid, forloop),
        ctx.new_args,
        grid_choices(ctx),
        hw,
        cost,
        rng,
        seed,
        lambda g: launch_problem(g, hw, seed),
    )
    if block is None:
        raise ReshapeFailed(
            f"{_where(ctx)}: no grid and loop fit at the new shapes" + (f" (last: {error})" if error else "")
        )
    return GraphDefinedOp(block, ctx.node.inputs)


# ============================================================================================ kernel graph


def structure_signature(g: KernelGraph) -> str:
    """What re-instantiation keeps of ``g``: everything but the input shapes, grid sizes and trip counts.

    Two µGraphs of one program with the same signature re-instantiate to the same graph at any shapes, so only
    one of them needs trying.
    """
    data = g.to_json()
    for spec in data["inputs"]:
        spec["shape"] = len(spec["shape"])
    for op in data["ops"]:
        if op.get("kind") == "graph":
            block = op["block"]
            block["grid"] = len(block["grid"])
            block["forloop"] = block["forloop"] > 1
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def reinstantiate(
    graph: KernelGraph, old: Program, new: Program, hw: HwProfile, cost: CostFn, *, seed: int = 0
) -> KernelGraph:
    """``graph`` (a µGraph of ``old``) rebuilt for ``new``, another instantiation of the same program.

    Parameters
    ----------
    graph : KernelGraph
        A µGraph equivalent to ``old`` (its inputs are ``old``'s inputs, in order).
    old, new : Program
        Two instantiations of one program (equal :meth:`~gensorage.program.Program.structure_key`).
    hw : HwProfile
        The GPU the grids and loops are constructed for (and whose memory they must fit).
    cost : callable
        Predicted time of a µGraph on ``hw`` (the µGraph cost model); ranks grid and loop choices.
    seed : int
        Seeds the restarts of the walk over large choice lattices.

    Returns
    -------
    KernelGraph
        A valid µGraph on ``new``'s inputs. Its equivalence to ``new`` is NOT checked here.

    Raises
    ------
    ReshapeFailed
        The structure does not carry over (the message says which node and why).
    """
    smap = size_map(old, new)
    if len(graph.inputs) != len(new.inputs):
        raise ReshapeFailed(
            f"the stored µGraph has {len(graph.inputs)} inputs, the program {len(new.inputs)}"
        )
    for spec, t in zip(graph.inputs, new.inputs, strict=True):
        if len(spec.shape) != len(t.shape) or spec.dtype != t.dtype:
            raise ReshapeFailed(
                f"stored µGraph input '{spec.name}' does not correspond to program input '{t.name}'"
            )
    try:
        old_info = infer(graph)
    except UGraphError as exc:
        raise ReshapeFailed(f"the stored µGraph is not well formed: {exc}") from None
    specs = tuple(TensorSpec(s.name, t.shape, t.dtype) for s, t in zip(graph.inputs, new.inputs, strict=True))
    new_infos: list[tuple[TensorInfo, ...]] = [(TensorInfo(s.shape, s.dtype),) for s in specs]
    ops: list[KernelNode] = []
    rng = np.random.default_rng(seed)
    for k, node in enumerate(graph.ops):
        old_args = tuple(old_info.of(r) for r in node.inputs)
        new_args = tuple(new_infos[r.node][r.out] for r in node.inputs)
        where = f"kernel op {k}"
        if isinstance(node, KernelOp):
            attrs = map_attrs(
                node.op, node.attrs, [a.shape for a in old_args], [a.shape for a in new_args], smap, where
            )
            shape = _shape(node.op, [a.shape for a in new_args], attrs, where)
            ops.append(KernelOp(node.op, node.inputs, attrs))
            old_out = old_info.nodes[len(specs) + k][0]  # dtypes do not depend on shapes
            new_infos.append((TensorInfo(shape, old_out.dtype, old_out.program),))
            continue
        block_info = old_info.blocks[k]
        assert block_info is not None  # a graph-defined op always has block info
        ctx = _KernelContext(k, node, old_args, new_args, block_info, smap)
        built = construct_kernel(ctx, hw, cost, rng, seed)
        ops.append(built)
        sub = single_op_graph(
            GraphDefinedOp(built.block, tuple(Ref(i) for i in range(len(new_args)))), new_args
        )
        shapes = block_shapes(sub, 0, built.block, new_args).outputs
        olds = old_info.nodes[len(specs) + k]
        new_infos.append(
            tuple(TensorInfo(t.shape, o.dtype, o.program) for t, o in zip(shapes, olds, strict=True))
        )
    out = KernelGraph(specs, tuple(ops), graph.outputs, graph.precision)
    try:
        validate(out, hw)
    except UGraphError as exc:
        raise ReshapeFailed(f"the re-instantiated µGraph is not valid: {exc}") from None
    _check_outputs(out, new)
    return out


def _check_outputs(g: KernelGraph, p: Program) -> None:
    info = infer(g)
    got = [info.of(r).shape for r in g.outputs]
    want = [t.shape for t in p.outputs]
    if got != want:
        raise ReshapeFailed(f"the re-instantiated µGraph's outputs have shapes {got}, the program's {want}")


__all__ = ["ReshapeFailed", "construct_kernel", "grid_choices", "reinstantiate", "structure_signature"]

"""Mutation operators on µGraphs, to test that the verifier rejects near misses.

Each operator takes a valid :class:`~gensorage.ugraph.KernelGraph` and a :class:`random.Random` and returns a
changed graph (or None when the graph has no site for it). :func:`mutate` keeps only mutants that are still
valid µGraphs and differ structurally from the original; :func:`differs_numerically` tells whether a mutant
computes a different function in float64 (a mutant that happens to be equivalent, e.g. ``a+b`` swapped, must
not be counted as a miss of the verifier).

Operators: swap two inputs of a non-commutative op or of a graph-defined kernel; change an imap, fmap or omap
entry; change a reduction dim; drop an op (its readers read its input); add an op (before an output or a saver,
or at the end of a thread graph); change a repeat factor or dim; change a scale factor; permute a reshape
target; change a concat dim. Most
changes of a size-changing attribute give an invalid graph and are discarded; what remains is the test set.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gensorage.errors import GensorageError
from gensorage.opset import UNARY_ELEMENTWISE, Op, attr, freeze_attrs
from gensorage.ugraph.ir import (
    BlockGraph,
    BlockNode,
    BlockOp,
    GraphDefinedOp,
    InputIterator,
    KernelGraph,
    KernelOp,
    OutputSaver,
    Ref,
    ThreadGraph,
    ThreadOp,
)
from gensorage.ugraph.shapes import infer
from gensorage.ugraph.validate import validate

Mutation = Callable[[KernelGraph, random.Random], KernelGraph | None]
# Ops whose operands can be swapped without changing the result: swapping them is no mutation.
_COMMUTATIVE = frozenset({Op.ADD, Op.MUL})
_UNARY_DROPPABLE = UNARY_ELEMENTWISE
_ATTR_OPS = (KernelOp, BlockOp, ThreadOp)


@dataclass(frozen=True, slots=True)
class Mutant:
    """A valid µGraph derived from an original by one mutation ``kind``."""

    kind: str
    graph: KernelGraph


# --------------------------------------------------------------------------------------- locating op nodes

# A location of an op-like node: ("kernel", k) | ("block", k, j) | ("thread", k, j, t).
Loc = tuple[Any, ...]


def _op_sites(g: KernelGraph) -> Iterator[tuple[Loc, KernelOp | BlockOp | ThreadOp]]:
    for k, node in enumerate(g.ops):
        if isinstance(node, KernelOp):
            yield ("kernel", k), node
            continue
        for j, bn in enumerate(node.block.nodes):
            if isinstance(bn, BlockOp):
                yield ("block", k, j), bn
            elif isinstance(bn, ThreadGraph):
                for t, top in enumerate(bn.ops):
                    yield ("thread", k, j, t), top


def _block_sites(g: KernelGraph, kind: type) -> list[tuple[int, int, Any]]:
    return [
        (k, j, bn)
        for k, node in enumerate(g.ops)
        if isinstance(node, GraphDefinedOp)
        for j, bn in enumerate(node.block.nodes)
        if isinstance(bn, kind)
    ]


def _set_kernel(g: KernelGraph, k: int, node: Any) -> KernelGraph:
    return KernelGraph(g.inputs, g.ops[:k] + (node,) + g.ops[k + 1 :], g.outputs, g.precision)


def _set_block(g: KernelGraph, k: int, block: BlockGraph) -> KernelGraph:
    node = g.ops[k]
    assert isinstance(node, GraphDefinedOp)
    return _set_kernel(g, k, dataclasses.replace(node, block=block))


def _set_block_node(g: KernelGraph, k: int, j: int, new: BlockNode) -> KernelGraph:
    node = g.ops[k]
    assert isinstance(node, GraphDefinedOp)
    nodes = node.block.nodes
    return _set_block(g, k, dataclasses.replace(node.block, nodes=nodes[:j] + (new,) + nodes[j + 1 :]))


def _thread_graph(g: KernelGraph, k: int, j: int) -> ThreadGraph:
    node = g.ops[k]
    assert isinstance(node, GraphDefinedOp)
    tg = node.block.nodes[j]
    assert isinstance(tg, ThreadGraph)
    return tg


def _set_op(g: KernelGraph, loc: Loc, new: Any) -> KernelGraph:
    if loc[0] == "kernel":
        return _set_kernel(g, loc[1], new)
    if loc[0] == "block":
        return _set_block_node(g, loc[1], loc[2], new)
    _, k, j, t = loc
    tg = _thread_graph(g, k, j)
    return _set_block_node(g, k, j, dataclasses.replace(tg, ops=tg.ops[:t] + (new,) + tg.ops[t + 1 :]))


def _with_attr(node: Any, name: str, value: Any) -> Any:
    attrs = dict(node.attrs)
    attrs[name] = value
    return dataclasses.replace(node, attrs=freeze_attrs(attrs))


def _ndim_of_block_input(g: KernelGraph, k: int, it: InputIterator) -> int:
    node = g.ops[k]
    assert isinstance(node, GraphDefinedOp)
    return len(infer(g).of(node.inputs[it.input]).shape)


def _other(rng: random.Random, current: Any, choices: Sequence[Any]) -> Any:
    options = [c for c in choices if c != current]
    return rng.choice(options) if options else None


# -------------------------------------------------------------------------------------------- operators


def swap_inputs(g: KernelGraph, rng: random.Random) -> KernelGraph | None:
    """Swap two different inputs of a non-commutative op, or of a graph-defined kernel."""
    sites: list[tuple[Loc, Any]] = [
        (loc, n) for loc, n in _op_sites(g) if n.op not in _COMMUTATIVE and len(set(n.inputs)) >= 2
    ]
    sites += [
        (("gdo", k), n)
        for k, n in enumerate(g.ops)
        if isinstance(n, GraphDefinedOp) and len(set(n.inputs)) >= 2
    ]
    if not sites:
        return None
    loc, node = rng.choice(sites)
    ins = list(node.inputs)
    i, j = rng.choice([(i, j) for i in range(len(ins)) for j in range(i) if ins[i] != ins[j]])
    ins[i], ins[j] = ins[j], ins[i]
    new = dataclasses.replace(node, inputs=tuple(ins))
    return _set_kernel(g, loc[1], new) if loc[0] == "gdo" else _set_op(g, loc, new)


def change_imap(g: KernelGraph, rng: random.Random) -> KernelGraph | None:
    """Point one grid dim of an input iterator at another data dim (or at the replica φ, or away from it)."""
    sites = _block_sites(g, InputIterator)
    if not sites:
        return None
    k, j, it = rng.choice(sites)
    gdim = rng.randrange(len(it.imap))
    ndim = _ndim_of_block_input(g, k, it)
    value = _other(rng, it.imap[gdim], [None, *range(ndim)])
    imap = it.imap[:gdim] + (value,) + it.imap[gdim + 1 :]
    return _set_block_node(g, k, j, dataclasses.replace(it, imap=imap))


def change_fmap(g: KernelGraph, rng: random.Random) -> KernelGraph | None:
    """Iterate a looped input iterator along another dim (or not at all)."""
    sites = [(k, j, it) for k, j, it in _block_sites(g, InputIterator) if g.ops[k].block.forloop > 1]  # type: ignore[union-attr]
    if not sites:
        return None
    k, j, it = rng.choice(sites)
    value = _other(rng, it.fmap, [None, *range(_ndim_of_block_input(g, k, it))])
    return _set_block_node(g, k, j, dataclasses.replace(it, fmap=value))


def change_omap(g: KernelGraph, rng: random.Random) -> KernelGraph | None:
    """Concatenate the blocks of one grid dim along another output dim."""
    sites = _block_sites(g, OutputSaver)
    if not sites:
        return None
    k, j, sv = rng.choice(sites)
    gdim = rng.randrange(len(sv.omap))
    ndim = len(infer(g).blocks[k].nodes[sv.input.node][sv.input.out].shape)  # type: ignore[union-attr]
    value = _other(rng, sv.omap[gdim], range(ndim))
    if value is None:
        return None
    omap = list(sv.omap)
    if value in omap:  # keep the dims distinct: swap with the grid dim that had it
        omap[omap.index(value)] = omap[gdim]
    omap[gdim] = value
    return _set_block_node(g, k, j, dataclasses.replace(sv, omap=tuple(omap)))


def _attr_sites(g: KernelGraph, op: Op) -> list[tuple[Loc, Any]]:
    return [(loc, n) for loc, n in _op_sites(g) if n.op is op]


def change_reduction_dim(g: KernelGraph, rng: random.Random) -> KernelGraph | None:
    """Sum along another dim."""
    sites = _attr_sites(g, Op.SUM)
    if not sites:
        return None
    loc, node = rng.choice(sites)
    ndim = _op_input_ndim(g, loc, node)
    value = _other(rng, attr(node.attrs, "dim") % ndim, range(ndim))
    return None if value is None else _set_op(g, loc, _with_attr(node, "dim", value))


def _op_input_ndim(g: KernelGraph, loc: Loc, node: Any) -> int:
    info = infer(g)
    ref = node.inputs[0]
    if loc[0] == "kernel":
        return len(info.of(ref).shape)
    block = info.blocks[loc[1]]
    assert block is not None
    if loc[0] == "block":
        return len(block.nodes[ref.node][ref.out].shape)
    return len(block.threads[loc[2]][ref.node].shape)


def change_repeat(g: KernelGraph, rng: random.Random) -> KernelGraph | None:
    """Repeat by another factor or along another dim, or tile instead (the copies concatenated whole, not
    interleaved: the classic GQA head-mapping mistake)."""
    sites = _attr_sites(g, Op.REPEAT)
    if not sites:
        return None
    loc, node = rng.choice(sites)
    times, dim = attr(node.attrs, "times"), attr(node.attrs, "dim")
    how = rng.randrange(3)
    if how == 0 and times > 1 and loc[0] != "thread":
        return _set_op(
            g,
            loc,
            dataclasses.replace(
                node, op=Op.CONCAT, inputs=(node.inputs[0],) * times, attrs=freeze_attrs({"dim": dim})
            ),
        )
    if how == 1:
        return _set_op(
            g, loc, _with_attr(node, "times", _other(rng, times, [1, 2, times + 1, max(1, times - 1)]))
        )
    value = _other(rng, dim, range(_op_input_ndim(g, loc, node)))
    return None if value is None else _set_op(g, loc, _with_attr(node, "dim", value))


def change_scale(g: KernelGraph, rng: random.Random) -> KernelGraph | None:
    """Scale by another factor, or add another constant (an add_scalar's value)."""
    sites = _attr_sites(g, Op.SCALE) + _attr_sites(g, Op.ADD_SCALAR)
    if not sites:
        return None
    loc, node = rng.choice(sites)
    key = "factor" if node.op is Op.SCALE else "value"
    c = float(attr(node.attrs, key))
    new = rng.choice([2.0 * c, 0.5 * c, -c, c + 1.0, 1.0])
    return None if new == c else _set_op(g, loc, _with_attr(node, key, new))


def swap_transpose(g: KernelGraph, rng: random.Random) -> KernelGraph | None:
    """Transpose another pair of dims (a wrong layout of a square or cube)."""
    sites = _attr_sites(g, Op.TRANSPOSE)
    if not sites:
        return None
    loc, node = rng.choice(sites)
    ndim = _op_input_ndim(g, loc, node)
    pair = (attr(node.attrs, "dim0"), attr(node.attrs, "dim1"))
    new = _other(rng, pair, [(i, j) for i in range(ndim) for j in range(i + 1, ndim)])
    if new is None:
        return None
    return _set_op(g, loc, dataclasses.replace(node, attrs=freeze_attrs({"dim0": new[0], "dim1": new[1]})))


def shift_slice(g: KernelGraph, rng: random.Random) -> KernelGraph | None:
    """Move a slice's window by one element (the same shape, other elements: rotate_half's halves off by one)."""
    sites = [
        (loc, n) for loc, n in _attr_sites(g, Op.SLICE) if loc[0] == "kernel"
    ]  # slice is kernel-level only
    if not sites:
        return None
    loc, node = rng.choice(sites)
    dim = attr(node.attrs, "dim") % _op_input_ndim(g, loc, node)
    size = infer(g).of(node.inputs[0]).shape[dim]
    lo, hi, _ = slice(attr(node.attrs, "start"), attr(node.attrs, "stop")).indices(size)
    moves = [d for d in (-1, 1) if lo + d >= 0 and hi + d <= size]
    if not moves:
        return None
    d = rng.choice(moves)
    return _set_op(
        g, loc, dataclasses.replace(node, attrs=freeze_attrs({"dim": dim, "start": lo + d, "stop": hi + d}))
    )


def permute_reshape(g: KernelGraph, rng: random.Random) -> KernelGraph | None:
    """Reshape to a permutation of the target shape (a wrong layout)."""
    sites = [(loc, n) for loc, n in _attr_sites(g, Op.RESHAPE) if len(set(attr(n.attrs, "shape"))) > 1]
    if not sites:
        return None
    loc, node = rng.choice(sites)
    shape = list(attr(node.attrs, "shape"))
    new = shape[:]
    while new == shape:
        rng.shuffle(new)
    return _set_op(g, loc, _with_attr(node, "shape", tuple(new)))


def change_concat_dim(g: KernelGraph, rng: random.Random) -> KernelGraph | None:
    """Concatenate along another dim."""
    sites = _attr_sites(g, Op.CONCAT)
    if not sites:
        return None
    loc, node = rng.choice(sites)
    value = _other(rng, attr(node.attrs, "dim"), range(_op_input_ndim(g, loc, node)))
    return None if value is None else _set_op(g, loc, _with_attr(node, "dim", value))


def _redirect(refs: Sequence[Ref], old: int, new: Ref) -> tuple[Ref, ...]:
    return tuple(new if r.node == old else r for r in refs)


def drop_op(g: KernelGraph, rng: random.Random) -> KernelGraph | None:
    """Remove an op: everything that read its result reads its (first or chosen) input instead."""
    sites = [(loc, n) for loc, n in _op_sites(g)]
    if not sites:
        return None
    loc, node = rng.choice(sites)
    src = node.inputs[0] if node.op in _UNARY_DROPPABLE else rng.choice(node.inputs)
    if loc[0] == "kernel":
        me = len(g.inputs) + loc[1]
        ops = tuple(_retarget_kernel(n, me, src) for n in g.ops)
        return KernelGraph(g.inputs, ops, _redirect(g.outputs, me, src), g.precision)
    if loc[0] == "block":
        k, j = loc[1], loc[2]
        block = g.ops[k].block  # type: ignore[union-attr]
        nodes = tuple(_retarget_block(n, j, src) for n in block.nodes)
        return _set_block(g, k, dataclasses.replace(block, nodes=nodes))
    _, k, j, t = loc
    tg = _thread_graph(g, k, j)
    me = len(tg.inputs) + t
    ops = tuple(dataclasses.replace(o, inputs=_redirect(o.inputs, me, src)) for o in tg.ops)
    return _set_block_node(g, k, j, ThreadGraph(tg.inputs, ops, _redirect(tg.outputs, me, src)))


def _retarget_kernel(n: Any, old: int, new: Ref) -> Any:
    return dataclasses.replace(n, inputs=_redirect(n.inputs, old, new))


def _retarget_block(n: BlockNode, old: int, new: Ref) -> BlockNode:
    if isinstance(n, InputIterator):
        return n
    if isinstance(n, BlockOp | ThreadGraph):
        return dataclasses.replace(n, inputs=_redirect(n.inputs, old, new))
    return dataclasses.replace(n, input=_redirect((n.input,), old, new)[0])


def _new_unary(rng: random.Random, cls: type, x: Ref) -> Any:
    choice = rng.randrange(4)
    if choice == 0:
        return cls(Op.SCALE, (x,), {"factor": rng.choice([2.0, -1.0, 0.5, 3.0])})
    if choice == 1:
        return cls(Op.MUL, (x, x))
    if choice == 2:
        return cls(Op.ADD, (x, x))
    return cls(Op.RELU, (x,))


def add_op(g: KernelGraph, rng: random.Random) -> KernelGraph | None:
    """Insert an extra op (scale, square, doubling or relu) before an output, a saver, or a thread output."""
    where = rng.randrange(3)
    if where == 0:
        i = rng.randrange(len(g.outputs))
        new = _new_unary(rng, KernelOp, g.outputs[i])
        ops = g.ops + (new,)
        ref = Ref(len(g.inputs) + len(ops) - 1)
        return KernelGraph(g.inputs, ops, g.outputs[:i] + (ref,) + g.outputs[i + 1 :], g.precision)
    if where == 1:
        sites = _block_sites(g, OutputSaver)
        if not sites:
            return None
        k, j, sv = rng.choice(sites)
        block = g.ops[k].block  # type: ignore[union-attr]
        return _set_block(g, k, _insert_before_saver(block, j, _new_unary(rng, BlockOp, sv.input)))
    sites = _block_sites(g, ThreadGraph)
    if not sites:
        return None
    k, j, tg = rng.choice(sites)
    o = rng.randrange(len(tg.outputs))
    new = _new_unary(rng, ThreadOp, tg.outputs[o])
    ref = Ref(len(tg.inputs) + len(tg.ops))
    outs = tg.outputs[:o] + (ref,) + tg.outputs[o + 1 :]
    return _set_block_node(g, k, j, ThreadGraph(tg.inputs, tg.ops + (new,), outs))


def _insert_before_saver(block: BlockGraph, j: int, op: BlockOp) -> BlockGraph:
    """``op`` inserted at position ``j`` (the saver's), the saver then reading it; later refs shift by one."""

    def shift(r: Ref) -> Ref:
        return Ref(r.node + 1, r.out) if r.node >= j else r

    nodes: list[BlockNode] = list(block.nodes[:j]) + [op]
    for n in block.nodes[j:]:
        if isinstance(n, BlockOp | ThreadGraph):
            n = dataclasses.replace(n, inputs=tuple(shift(r) for r in n.inputs))
        elif not isinstance(n, InputIterator):
            n = dataclasses.replace(n, input=shift(n.input))
        nodes.append(n)
    saver = nodes[j + 1]
    assert isinstance(saver, OutputSaver)
    nodes[j + 1] = dataclasses.replace(saver, input=Ref(j))
    return dataclasses.replace(block, nodes=tuple(nodes))


MUTATIONS: dict[str, Mutation] = {
    "swap_inputs": swap_inputs,
    "change_imap": change_imap,
    "change_fmap": change_fmap,
    "change_omap": change_omap,
    "change_reduction_dim": change_reduction_dim,
    "drop_op": drop_op,
    "add_op": add_op,
    "change_repeat": change_repeat,
    "change_scale": change_scale,
    "swap_transpose": swap_transpose,
    "shift_slice": shift_slice,
    "permute_reshape": permute_reshape,
    "change_concat_dim": change_concat_dim,
}


def mutate(g: KernelGraph, rng: random.Random, kind: str | None = None) -> Mutant | None:
    """One random valid mutant of ``g`` (of ``kind``, or of a random applicable kind), or None if none came out.

    A mutant that fails :func:`~gensorage.ugraph.validate` or equals ``g`` is discarded (None).
    """
    name = kind or rng.choice(sorted(MUTATIONS))
    if name not in MUTATIONS:
        raise ValueError(f"unknown mutation {name!r} (known: {', '.join(sorted(MUTATIONS))})")
    try:
        out = MUTATIONS[name](g, rng)
        if out is None or out == g:
            return None
        validate(out)
    except GensorageError:
        return None
    return Mutant(name, out)


def mutants(
    g: KernelGraph, count: int, seed: int = 0, *, kinds: Sequence[str] | None = None, attempts: int = 50
) -> list[Mutant]:
    """Up to ``count`` valid mutants (``attempts`` tries per mutant before giving up)."""
    rng = random.Random(seed)
    names = list(kinds or sorted(MUTATIONS))
    out: list[Mutant] = []
    for _ in range(count):
        for _ in range(attempts):
            m = mutate(g, rng, rng.choice(names))
            if m is not None:
                out.append(m)
                break
    return out


def differs_numerically(a: Any, b: Any, seed: int = 0, rtol: float = 1e-6) -> bool:
    """Whether ``a`` and ``b`` give different float64 results on random normal inputs (shapes included)."""
    rng = np.random.default_rng(seed)
    inputs = [rng.standard_normal(tuple(t.shape)) for t in a.inputs]
    ra, rb = a.run(*inputs), b.run(*inputs)
    if len(ra) != len(rb):
        return True
    for x, y in zip(ra, rb, strict=True):
        x, y = np.asarray(x), np.asarray(y)
        if x.shape != y.shape:
            return True
        scale = max(float(np.max(np.abs(x), initial=0.0)), 1e-300)
        if not np.allclose(x, y, rtol=rtol, atol=rtol * scale, equal_nan=True):
            return True
    return False


__all__ = [
    "MUTATIONS",
    "Mutant",
    "Mutation",
    "add_op",
    "change_concat_dim",
    "change_fmap",
    "change_imap",
    "change_omap",
    "change_reduction_dim",
    "change_repeat",
    "change_scale",
    "swap_transpose",
    "differs_numerically",
    "drop_op",
    "mutants",
    "mutate",
    "permute_reshape",
    "swap_inputs",
]

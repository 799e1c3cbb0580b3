"""Structure-preserving rewrites of block graphs."""

from __future__ import annotations

import dataclasses

from gensorage.errors import UGraphError
from gensorage.opset import Op, freeze_attrs
from gensorage.ugraph.ir import (
    ONLINE_SOFTMAX_KINDS,
    Accumulator,
    BlockGraph,
    BlockNode,
    BlockOp,
    InputIterator,
    OutputSaver,
    Ref,
    ThreadGraph,
    ThreadOp,
)


def drop_loop(block: BlockGraph) -> BlockGraph:
    """The same block graph with no for-loop: fmaps cleared, accumulators removed (readers read their input).

    With a trip count of 1 an iterator's fmap and every sum, max or concatenating accumulator are identities, so
    this is the canonical, valid form of a graph written for a loop and instantiated with ``forloop=1``. An
    online-softmax accumulator becomes what its one iteration computes: ``exp(s − rowmax(s))`` summed over the
    keys, or multiplied by the values.
    """
    if block.forloop != 1:
        raise UGraphError(
            f"drop_loop: block graph loops {block.forloop} times; only a trip count of 1 is dropped"
        )
    alias: dict[int, Ref] = {}
    index: dict[int, int] = {}
    nodes: list[BlockNode] = []

    def remap(r: Ref) -> Ref:
        return alias[r.node] if r.node in alias else Ref(index[r.node], r.out)

    for j, node in enumerate(block.nodes):
        match node:
            case Accumulator() if node.kind in ONLINE_SOFTMAX_KINDS:
                nodes.extend(
                    _one_online_step(
                        node.kind, remap(node.input), [remap(r) for r in node.reads[1:]], len(nodes)
                    )
                )
                alias[j] = Ref(len(nodes) - 1)
                continue
            case Accumulator():
                alias[j] = remap(node.input)
                continue
            case InputIterator():
                new: BlockNode = dataclasses.replace(node, fmap=None)
            case BlockOp() | ThreadGraph():
                new = dataclasses.replace(node, inputs=tuple(remap(r) for r in node.inputs))
            case OutputSaver():
                new = dataclasses.replace(node, input=remap(node.input))
        index[j] = len(nodes)
        nodes.append(new)
    return BlockGraph(block.grid, 1, tuple(nodes))


def _one_online_step(kind: str, s: Ref, values: list[Ref], at: int) -> list[BlockNode]:
    """Block operators computing one online-softmax iteration on ``s`` (they become nodes ``at, at + 1, ...``)."""
    last = freeze_attrs({"dim": -1, "keepdim": True})
    exp_shifted = (ThreadOp(Op.SUB, (Ref(0), Ref(1))), ThreadOp(Op.EXP, (Ref(2),)))
    p = Ref(at + 1)
    return [
        BlockOp(Op.MAX, (s,), last),
        ThreadGraph((s, Ref(at)), exp_shifted, (Ref(3),)),
        BlockOp(Op.SUM, (p,), last) if kind == "softmax_sum" else BlockOp(Op.MATMUL, (p, values[0])),
    ]


__all__ = ["drop_loop"]

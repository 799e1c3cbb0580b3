"""Structure-preserving rewrites of block graphs."""

from __future__ import annotations

import dataclasses

from gensorage.errors import UGraphError
from gensorage.ugraph.ir import (
    Accumulator,
    BlockGraph,
    BlockNode,
    BlockOp,
    InputIterator,
    OutputSaver,
    Ref,
    ThreadGraph,
)


def drop_loop(block: BlockGraph) -> BlockGraph:
    """The same block graph with no for-loop: fmaps cleared, accumulators removed (readers read their input).

    With a trip count of 1 an iterator's fmap and every accumulator are identities, so this is the
    canonical, valid form of a graph written for a loop and instantiated with ``forloop=1``.
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


__all__ = ["drop_loop"]

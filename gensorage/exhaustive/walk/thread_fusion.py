"""Thread-graph construction by fusion (Algorithm 1, ``ThreadGraphConstruction``; Mirage §4.2).

Rule: inside a block graph, an elementwise operator whose result has exactly one consumer, itself elementwise,
is fused into that consumer. Each maximal group so formed — an in-tree of elementwise operators, all in the same
loop phase since phases follow dependences — with at least two operators becomes one :class:`ThreadGraph`: its
inputs (the block tensors the group reads) are loaded into registers once, the intermediates never touch shared
memory, and only the root's result is written back. Single elementwise operators stay block operators.
"""

from __future__ import annotations

import dataclasses

from gensorage.opset import ELEMENTWISE
from gensorage.ugraph.ir import (
    BlockGraph,
    BlockNode,
    BlockOp,
    GraphDefinedOp,
    KernelGraph,
    Ref,
    ThreadGraph,
    ThreadOp,
    node_inputs,
)


def _fusable(node: BlockNode) -> bool:
    return isinstance(node, BlockOp) and node.op in ELEMENTWISE


def fuse_block(block: BlockGraph) -> BlockGraph:
    """``block`` with every maximal single-consumer chain of elementwise operators as a thread graph."""
    nodes = block.nodes
    consumers: list[list[int]] = [[] for _ in nodes]
    for j, node in enumerate(nodes):
        for r in node_inputs(node):
            consumers[r.node].append(j)
    # root[j]: the group a fusable node belongs to (the node its single-consumer chain ends at).
    root = list(range(len(nodes)))
    for j in range(len(nodes) - 1, -1, -1):
        if _fusable(nodes[j]) and len(consumers[j]) == 1 and _fusable(nodes[consumers[j][0]]):
            root[j] = root[consumers[j][0]]
    members: dict[int, list[int]] = {}
    for j in range(len(nodes)):
        if _fusable(nodes[j]):
            members.setdefault(root[j], []).append(j)
    groups = {r: m for r, m in members.items() if len(m) >= 2}
    if not groups:
        return block
    fused_into = {j: r for r, m in groups.items() for j in m if j != r}
    new_index: dict[int, int] = {}
    out: list[BlockNode] = []
    for j, node in enumerate(nodes):
        if j in fused_into:
            continue
        if j in groups:
            node = _thread_graph(nodes, groups[j], new_index)
        else:
            node = _remap(node, new_index)
        new_index[j] = len(out)
        out.append(node)
    return BlockGraph(block.grid, block.forloop, tuple(out))


def _thread_graph(nodes: tuple[BlockNode, ...], group: list[int], new_index: dict[int, int]) -> ThreadGraph:
    """The thread graph of ``group`` (block node indices in topological order; the last is the root)."""
    inside = set(group)
    ext: list[Ref] = []  # block-level refs the group reads, in first-use order
    local: dict[int, int] = {}  # member node -> its thread-local index (after the inputs)
    ops_src: list[tuple[BlockOp, list[tuple[bool, int | Ref]]]] = []
    for j in group:
        op = nodes[j]
        assert isinstance(op, BlockOp)
        args: list[tuple[bool, int | Ref]] = []
        for r in op.inputs:
            if r.node in inside:
                args.append((True, r.node))
            else:
                outer = Ref(new_index[r.node], r.out)
                if outer not in ext:
                    ext.append(outer)
                args.append((False, outer))
        ops_src.append((op, args))
    n_in = len(ext)
    ops: list[ThreadOp] = []
    for k, (op, args) in enumerate(ops_src):
        refs = [Ref(n_in + local[a]) if is_local else Ref(ext.index(a)) for is_local, a in args]  # type: ignore[index,arg-type]
        ops.append(ThreadOp(op.op, tuple(refs), op.attrs))
        local[group[k]] = k
    return ThreadGraph(tuple(ext), tuple(ops), (Ref(n_in + len(ops) - 1),))


def _remap(node: BlockNode, new_index: dict[int, int]) -> BlockNode:
    refs = node_inputs(node)
    if not refs:
        return node
    moved = tuple(Ref(new_index[r.node], r.out) for r in refs)
    if isinstance(node, BlockOp | ThreadGraph):
        return dataclasses.replace(node, inputs=moved)
    return dataclasses.replace(node, input=moved[0])  # type: ignore[call-arg,arg-type]


def fuse(g: KernelGraph) -> KernelGraph:
    """``g`` with :func:`fuse_block` applied to every block graph (pre-defined kernels are left alone)."""
    ops = tuple(
        dataclasses.replace(op, block=fuse_block(op.block)) if isinstance(op, GraphDefinedOp) else op
        for op in g.ops
    )
    return KernelGraph(g.inputs, ops, g.outputs, g.precision)


__all__ = ["fuse", "fuse_block"]

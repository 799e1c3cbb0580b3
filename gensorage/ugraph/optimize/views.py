"""Views inside a block graph: reshape and repeat are index arithmetic on their source, never a tile of their
own, so a read of a view is a read of the tile it views."""

from __future__ import annotations

from gensorage.opset import Op
from gensorage.ugraph.ir import BlockGraph, BlockOp, Ref

#: Block ops that are index arithmetic on their source (no tile of their own).
VIEW_OPS = frozenset({Op.RESHAPE, Op.REPEAT})


def is_view(node: object) -> bool:
    """Whether a block node is a reshape or repeat (read through, never materialised)."""
    return isinstance(node, BlockOp) and node.op in VIEW_OPS


def storage(block: BlockGraph, r: Ref) -> Ref:
    """The tile holding block tensor ``r``'s elements (``r`` itself unless it is a view)."""
    node = block.nodes[r.node]
    while isinstance(node, BlockOp) and node.op in VIEW_OPS:
        r = node.inputs[0]
        node = block.nodes[r.node]
    return r


__all__ = ["VIEW_OPS", "is_view", "storage"]

"""Operator order by depth (the later Mirage paper's operator ordering): the phases of a block graph in
topological levels, so that independent operators sit side by side and share one barrier.

A barrier is needed before a phase that reads a tile written since the last barrier (or overwrites bytes read
since then). In node order, a producer and its consumer may alternate with independent work (load A, use A,
load B, use B: two barriers per iteration); by depth, every load comes first, then every operator of depth 1,
and so on (load A, load B, barrier, use A, use B: one). Within a level the node order is kept.

Depth: an iterator tile is 0; an operator is one more than the deepest tile it reads; a view (reshape, repeat)
has its source's depth; an accumulator is 0 for the post-loop nodes (its tile exists only after the loop).
Loop-body and post-loop nodes are ordered separately (the loop runs between them).
"""

from __future__ import annotations

from gensorage.ugraph.ir import Accumulator, BlockGraph, InputIterator, OutputSaver, node_inputs
from gensorage.ugraph.optimize.views import is_view
from gensorage.ugraph.validate import loop_phases


def depths(block: BlockGraph) -> tuple[int, ...]:
    """Every block node's depth (see the module docstring; a saver gets its input's)."""
    out: list[int] = []
    for node in block.nodes:
        if isinstance(node, InputIterator | Accumulator):
            out.append(0)
        elif is_view(node) or isinstance(node, OutputSaver):
            out.append(out[node_inputs(node)[0].node])
        else:
            out.append(1 + max(out[r.node] for r in node_inputs(node)))
    return tuple(out)


def depth_order(block: BlockGraph) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The loop body's phases and the post-loop phases (iterators, block ops and thread graphs; no views),
    each by depth, then node index."""
    phases = loop_phases(block)
    level = depths(block)
    computing = [
        j
        for j, n in enumerate(block.nodes)
        if not is_view(n) and not isinstance(n, Accumulator | OutputSaver)
    ]
    body = sorted((j for j in computing if phases[j] == "body"), key=lambda j: (level[j], j))
    post = sorted((j for j in computing if phases[j] == "post"), key=lambda j: (level[j], j))
    return tuple(body), tuple(post)


__all__ = ["depth_order", "depths"]

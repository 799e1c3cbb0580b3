"""Live intervals of a block graph's tiles in the order a graph-defined kernel runs its phases.

The kernel (:mod:`gensorage.codegen.ugraph_tir`) runs, in this order, numbered as *steps*:

- step 0: the loop-invariant iterator tiles (``fmap=None`` in a looped graph), loaded once before the loop;
- steps 1..B: the loop body's iterators, block ops and thread graphs, by depth (:mod:`.phase_order`);
- step B+1 (loop end): every accumulator reads its input tile (its copy or online-softmax phase, or the
  producer's phase writing it directly, which is earlier and so covered);
- step B+2 (flush): the combining accumulators (``fmap=None``) leave their registers for their shared tiles;
- the post-loop block ops and thread graphs, by depth;
- the last step: the output savers read their tiles.

A tile lives from the step that writes it to the last step that reads it, both included, so a tile written in
a step never shares bytes with a tile read in the same step. Two tiles live across the loop: a loop-invariant
iterator tile (read in every iteration, loaded once) and a concatenating accumulator (``fmap=d``, written a
slice per iteration); both start at step 0 and live at least to the loop end. Every other body tile is written
and read within one iteration, so its interval inside the body holds for every iteration. Reshape and repeat
are views, not tiles: a read of a view is a read of its source. The intervals are conservative for the
kernel's actual phases (a hoisting or fusion the emitter does only shortens a real lifetime).

A *staged* iterator tile (software pipelining, :mod:`gensorage.codegen.block_loads`: the copies of iteration
``i + 1`` land in another stage of the tile while iteration ``i`` computes) is written before the loop (the
prologue) and in every iteration while the other body tiles live, so it too lives from step 0 to at least the
loop end: no body tile shares its bytes. After the loop its bytes are free again (no copy is in flight then).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from gensorage.ugraph.ir import (
    Accumulator,
    BlockGraph,
    InputIterator,
    OutputSaver,
    Ref,
    node_inputs,
    num_outputs,
)
from gensorage.ugraph.optimize.phase_order import depth_order
from gensorage.ugraph.optimize.views import is_view, storage


@dataclass(frozen=True, slots=True)
class Interval:
    """Steps ``start`` to ``end``, both included."""

    start: int
    end: int

    def overlaps(self, other: Interval) -> bool:
        return self.start <= other.end and other.start <= self.end


@dataclass(frozen=True, slots=True)
class Liveness:
    """Every tile's live interval (views excluded), in node order; ``steps`` is the number of steps."""

    intervals: tuple[tuple[Ref, Interval], ...]
    steps: int

    def of(self, r: Ref) -> Interval:
        for ref, interval in self.intervals:
            if ref == r:
                return interval
        raise KeyError(r)


def _positions(block: BlockGraph, fused: Fused) -> tuple[list[int], int, int, int]:
    """Step of every node that computes (-1 otherwise), the loop-end and flush steps, and the savers' step."""
    body, post = depth_order(block)
    looped = block.forloop > 1
    pos = [-1] * len(block.nodes)
    step = 1
    for j in body:
        node = block.nodes[j]
        hoisted = looped and isinstance(node, InputIterator) and node.fmap is None
        pos[j] = 0 if hoisted else step
        step += 0 if hoisted else 1
    loop_end, flush = step, step + 1
    step = flush + 1
    for j in post:
        pos[j] = step
        step += 1
    for j, t in fused:
        pos[t] = pos[j]
    return pos, loop_end, flush, step


#: (node j, node t) pairs: node t runs in node j's step (a thread graph the code generator runs on a tensor-core
#: matmul's accumulators, :func:`gensorage.codegen.block_mma.fused_thread_graphs`), so its outputs are written
#: while j still reads its inputs.
Fused = tuple[tuple[int, int], ...]


@lru_cache(maxsize=4096)  # block graphs are immutable; validity, the cost model and the emitter ask again
def live_intervals(block: BlockGraph, fused: Fused = (), staged: tuple[int, ...] = ()) -> Liveness:
    """The live interval of every tile of ``block`` (a verified block graph; see the module docstring), with
    the nodes of ``fused`` run in one step and the iterators ``staged`` (node indices) pipelined."""
    pos, loop_end, flush, last = _positions(block, fused)
    start: dict[Ref, int] = {}
    end: dict[Ref, int] = {}
    for j, node in enumerate(block.nodes):
        if is_view(node) or isinstance(node, OutputSaver):
            continue
        for o in range(num_outputs(node)):
            r = Ref(j, o)
            if isinstance(node, Accumulator):
                start[r] = 0 if node.fmap is not None else flush
            else:
                start[r] = pos[j]
            if j in staged:
                start[r] = 0
            across = (
                (isinstance(node, InputIterator) and pos[j] == 0 and block.forloop > 1)
                or (isinstance(node, Accumulator) and node.fmap is not None)
                or j in staged
            )
            end[r] = max(start[r], loop_end if across else start[r])
    for j, node in enumerate(block.nodes):
        if is_view(node):
            continue
        match node:
            case Accumulator():
                use = loop_end
            case OutputSaver():
                use = last
            case _:
                use = pos[j]
        for r in node_inputs(node):
            s = storage(block, r)
            end[s] = max(end[s], use)
    intervals = tuple((r, Interval(start[r], end[r])) for r in start)
    return Liveness(intervals, last + 1)


__all__ = ["Fused", "Interval", "Liveness", "live_intervals"]

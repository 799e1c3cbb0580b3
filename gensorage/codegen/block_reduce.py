"""Block reductions (``sum``/``max`` block ops) of a graph-defined kernel: serial or cooperative.

A reduction with at least as many results as the block has threads gives each thread whole results (a serial
loop over the reduced elements). One with fewer results — a row kernel's ``Σ x²`` over a row of 4096, or four
short rows per block — would leave all but a few threads idle while one walks the row, so there ``lanes``
threads (a power of two) share each result:

1. thread ``tx`` takes result ``tx // lanes`` and every ``lanes``-th element of it from ``tx % lanes`` on
   (consecutive threads read consecutive elements: no bank conflicts), combining them in a register, and
   stores the partial in a per-reduction scratch array of one slot per thread;
2. a tree halves the partials: ``lanes / 2`` steps of ``red[tx] ⊕= red[tx + step]``, a barrier before each;
3. after a barrier, result ``o`` is ``red[o * lanes]``, written where the serial form writes it (its tile and
   its sinks, dealt to threads like any block op's result).

The llvm twin runs the same loops one after the other (each step a loop over the threads), which is the same
arithmetic in the same order: a thread's slot is read at step ``s`` only by the slot ``s`` below it, which
was already combined at the earlier step.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import TYPE_CHECKING

from gensorage.codegen.scalar import combined, reduction_kind
from gensorage.codegen.tir_text import Ix, ravel, shape_text, summed_index, unravel
from gensorage.opset import REDUCTIONS, attr
from gensorage.ugraph.ir import BlockOp, Ref

if TYPE_CHECKING:
    from gensorage.codegen.block_emitter import BlockEmitter


def reduce_lanes(results: int, count: int, threads: int) -> int:
    """Threads that share one result: the largest power of two with ``results * lanes <= threads`` and
    ``lanes <= count`` (1: each thread reduces whole results serially)."""
    lanes = 1
    while results * lanes * 2 <= threads and lanes * 2 <= count:
        lanes *= 2
    return lanes


class ReduceEmitter:
    """The reduction phases of one :class:`~gensorage.codegen.block_emitter.BlockEmitter`."""

    def __init__(self, e: BlockEmitter) -> None:
        self.e = e
        #: Cooperative reductions: block node -> threads per result.
        self.lanes: dict[int, int] = {}
        for j, node in enumerate(e.nodes):
            if isinstance(node, BlockOp) and node.op in REDUCTIONS:
                results = math.prod(e.tile(Ref(j)).shape)
                lanes = reduce_lanes(results, self._count(node), e.nt)
                if lanes > 1:
                    self.lanes[j] = lanes

    def _count(self, node: BlockOp) -> int:
        shape = self.e.tile(node.inputs[0]).shape
        dim = int(attr(node.attrs, "dim")) % len(shape)
        group = attr(node.attrs, "group")
        return shape[dim] if group is None or group == shape[dim] else int(group)

    def allocate(self) -> None:
        """Declare each cooperative reduction's scratch array (one slot per thread)."""
        e = self.e
        scope = "shared" if e.gpu else "global"
        for j in self.lanes:
            shape = e.sc.buf_shape((e.nt,))
            e.w.line(f'red{j} = T.alloc_buffer({shape_text(shape)}, "{e.sc.acc_dtype}", scope="{scope}")')

    def phase(self, j: int, node: BlockOp) -> None:
        e = self.e
        x = node.inputs[0]
        shape = e.tile(x).shape
        dim = int(attr(node.attrs, "dim")) % len(shape)
        kind = reduction_kind(node.op)
        keep = bool(attr(node.attrs, "keepdim", kind == "sum"))  # sum keeps the dim by default, max drops it
        group = attr(node.attrs, "group")
        full = group is None or group == shape[dim]
        count = self._count(node)
        out = e.tile(Ref(j)).shape
        if j not in self.lanes:
            self._serial(j, x, dim, kind, keep, full, count, out)
            return
        lanes = self.lanes[j]
        results = math.prod(out)
        red = f"red{j}"
        tx = Ix.var("tx")
        lane = tx.mod(lanes, e.nt)
        busy = results * lanes < e.nt
        with e.threads(), e.w.block(f"if tx < {results * lanes}:") if busy else nullcontext():
            idx = unravel(tx.floordiv(lanes, results * lanes), out)
            acc = e.acc_buffer(1)
            e.store(acc, "0", e.sc.initial(kind), e.sc.acc_dtype)
            steps = -(-count // lanes)
            with e.w.loop(e.w.fresh("g"), steps) as s:
                at = s * lanes + lane
                with e.w.block(f"if {at} < {count}:") if steps * lanes > count else nullcontext():
                    cur = e.sc.load(acc, "0", e.sc.acc_dtype)
                    nxt = combined(e.sc, kind, cur, e.read(x, summed_index(idx, dim, at, count, full, keep)))
                    e.store(acc, "0", nxt, e.sc.acc_dtype)
            e.store(red, "tx", e.sc.load(acc, "0", e.sc.acc_dtype), e.sc.acc_dtype)
        step = lanes // 2
        while step >= 1:
            self._barrier()
            with e.threads(), e.w.block(f"if {lane} < {step} and tx < {results * lanes}:"):
                here = e.sc.load(red, "tx", e.sc.acc_dtype)
                there = e.sc.load(red, f"tx + {step}", e.sc.acc_dtype)
                e.store(red, "tx", combined(e.sc, kind, here, there), e.sc.acc_dtype)
            step //= 2
        self._barrier()
        with e.threads(), e.elements(out) as (idx, slot):
            total = e.sc.load(red, str(ravel(idx, out) * lanes), e.sc.acc_dtype)
            e.emit_value(Ref(j), idx, e.sc.reduced(total), slot)

    def _barrier(self) -> None:
        # Not through the emitter's barrier placement: the scratch array is no tile, and the placement's
        # pending accesses must survive to decide the barrier before this phase.
        if self.e.gpu:
            self.e.w.line('T.tvm_storage_sync("shared")')

    def _serial(
        self, j: int, x: Ref, dim: int, kind: str, keep: bool, full: bool, count: int, out: tuple[int, ...]
    ) -> None:
        e = self.e
        with e.threads(), e.elements(out) as (idx, slot):
            acc = e.acc_buffer(1)
            e.store(acc, "0", e.sc.initial(kind), e.sc.acc_dtype)
            with e.w.loop(e.w.fresh("g"), count) as gi:
                cur = e.sc.load(acc, "0", e.sc.acc_dtype)
                nxt = combined(e.sc, kind, cur, e.read(x, summed_index(idx, dim, gi, count, full, keep)))
                e.store(acc, "0", nxt, e.sc.acc_dtype)
            e.emit_value(Ref(j), idx, e.sc.reduced(e.sc.load(acc, "0", e.sc.acc_dtype)), slot)


__all__ = ["ReduceEmitter", "reduce_lanes"]

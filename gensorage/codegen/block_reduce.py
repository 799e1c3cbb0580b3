"""Block reductions (``sum``/``max`` block ops) of a graph-defined kernel: serial or cooperative.

A reduction with at least as many results as the block has threads, or over few elements, gives each thread whole
results (a serial loop over the reduced elements). One with fewer results — a row kernel's ``Σ x²`` over a row of 4096, or four
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

from gensorage.codegen.predefined import MIN_COOPERATIVE_SUM
from gensorage.codegen.scalar import Val, combined, reduction_kind
from gensorage.codegen.tir_text import Ix, ravel, shape_text, summed_index, unravel
from gensorage.dtypes import dtype_bytes
from gensorage.opset import REDUCTIONS, attr
from gensorage.ugraph.ir import BlockOp, Ref

if TYPE_CHECKING:
    from gensorage.codegen.block_emitter import BlockEmitter


WARP = 32
FULL_MASK = (1 << WARP) - 1


def reduce_lanes(results: int, count: int, threads: int) -> int:
    """Threads that share one result: the largest power of two with ``results * lanes <= threads`` and
    ``lanes <= count``; 1 (each thread reduces whole results serially) for a reduction over fewer than
    :data:`~gensorage.codegen.predefined.MIN_COOPERATIVE_SUM` elements, where a short loop beats the barriers."""
    if count < MIN_COOPERATIVE_SUM:
        return 1
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

    def scratch_bytes(self) -> int:
        """Bytes of the scratch arrays (one slot of the accumulator type per thread and reduction)."""
        e = self.e
        return len(self.lanes) * math.prod(e.sc.buf_shape((e.nt,))) * dtype_bytes(e.sc.acc_dtype)

    def allocate(self, arena_offset: int | None = None, scope: str = "") -> None:
        """Declare each cooperative reduction's scratch array: static shared arrays, or views of the arena
        from byte ``arena_offset`` on (one after another, never sharing bytes: a reduction's last reads and the
        next one's first writes have no barrier between them)."""
        e = self.e
        shape = e.sc.buf_shape((e.nt,))
        size = math.prod(shape) * dtype_bytes(e.sc.acc_dtype)
        for i, j in enumerate(self.lanes):
            if arena_offset is None:
                where = "shared" if e.gpu else "global"
                e.w.line(f'red{j} = T.alloc_buffer({shape_text(shape)}, "{e.sc.acc_dtype}", scope="{where}")')
            else:
                offset = (arena_offset + i * size) // dtype_bytes(e.sc.acc_dtype)
                e.w.line(
                    f'red{j} = T.decl_buffer({shape_text(shape)}, "{e.sc.acc_dtype}", data={e.arena_name}.data, '
                    f'elem_offset={offset}, scope="{scope}")'
                )

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
        used = results * lanes
        warp = min(lanes, WARP)  # lanes of one result within a warp
        shuffle = self.shuffles()
        with e.threads():
            acc = e.acc_buffer(1)
            e.store(acc, "0", e.sc.initial(kind), e.sc.acc_dtype)
            with e.w.block(f"if tx < {used}:") if used < e.nt else nullcontext():
                idx = unravel(tx.floordiv(lanes, used), out)
                steps = -(-count // lanes)
                with e.w.loop(e.w.fresh("g"), steps) as s:
                    at = s * lanes + lane
                    with e.w.block(f"if {at} < {count}:") if steps * lanes > count else nullcontext():
                        cur = e.sc.load(acc, "0", e.sc.acc_dtype)
                        nxt = combined(
                            e.sc, kind, cur, e.read(x, summed_index(idx, dim, at, count, full, keep))
                        )
                        e.store(acc, "0", nxt, e.sc.acc_dtype)
            if shuffle:  # the warp's lanes combine in registers; lane 0 of each result's warp keeps the sum
                self._shuffle_tree(acc, kind, warp, warp)
                with e.w.block(f"if tx % {warp} == 0 and tx < {used}:"):
                    e.store(red, "tx", e.sc.load(acc, "0", e.sc.acc_dtype), e.sc.acc_dtype)
            else:
                e.store(red, "tx", e.sc.load(acc, "0", e.sc.acc_dtype), e.sc.acc_dtype)
        if not shuffle:
            self._shared_tree(red, kind, warp, 1, used)
        if lanes > warp:  # the warps' partials (red[o * lanes + w * 32]) combined
            self._barrier()
            if shuffle:
                self._shuffle_partials(red, kind, lanes, lanes // warp, used)
            else:
                self._shared_tree(red, kind, lanes // warp, warp, used)
        self._barrier()
        with e.threads(), e.elements(out) as (idx, slot):
            total = e.sc.load(red, str(ravel(idx, out) * lanes), e.sc.acc_dtype)
            e.emit_value(Ref(j), idx, e.sc.reduced(total), slot)

    def shuffles(self) -> bool:
        """Whether warps combine in registers (warp shuffles: a CUDA kernel of whole warps, float values)."""
        e = self.e
        return e.gpu and e.nt % WARP == 0 and not e.sc.field

    def _shuffle_tree(self, acc: str, kind: str, count: int, width: int) -> None:
        """``acc`` of lane ``i`` combined with lane ``i + s`` for ``s = count / 2 .. 1`` (in segments of
        ``width`` lanes): lane 0 of each segment ends with the segment's first ``count`` values combined."""
        e = self.e
        s = count // 2
        while s >= 1:
            cur = e.sc.load(acc, "0", e.sc.acc_dtype)
            other = Val(
                tuple(
                    f"T.tvm_warp_shuffle_down(T.uint32({FULL_MASK}), {c}, {s}, {width}, {WARP})"
                    for c in cur.comps
                ),
                cur.dtype,
            )
            e.store(acc, "0", combined(e.sc, kind, cur, other), e.sc.acc_dtype)
            s //= 2

    def _shuffle_partials(self, red: str, kind: str, lanes: int, parts: int, used: int) -> None:
        """The first warp of each result combines its ``parts`` warp partials (``red[o * lanes + w * 32]``)
        into ``red[o * lanes]``."""
        e = self.e
        lane = Ix.var("tx").mod(lanes, e.nt)
        with e.threads(), e.w.block(f"if {lane} < {WARP} and tx < {used}:"):
            acc = e.acc_buffer(1)
            e.store(acc, "0", e.sc.initial(kind), e.sc.acc_dtype)
            with e.w.block(f"if {lane} < {parts}:"):
                src = Ix.var("tx") + lane * (WARP - 1)  # o * lanes + lane * 32
                e.store(acc, "0", e.sc.load(red, str(src), e.sc.acc_dtype), e.sc.acc_dtype)
            self._shuffle_tree(acc, kind, parts, WARP)
            with e.w.block(f"if {lane} == 0:"):
                e.store(red, "tx", e.sc.load(acc, "0", e.sc.acc_dtype), e.sc.acc_dtype)

    def _shared_tree(self, red: str, kind: str, count: int, stride: int, used: int) -> None:
        """In shared memory, the shuffle trees' arithmetic: ``red[t] ⊕= red[t + s * stride]`` for the slots
        ``t`` that are multiples of ``stride`` with ``(t / stride) % count < s``, ``s = count / 2 .. 1``."""
        e = self.e
        tx = Ix.var("tx")
        pos = tx.floordiv(stride, e.nt).mod(count, e.nt)
        s = count // 2
        while s >= 1:
            self._barrier()
            cond = f"{pos} < {s} and tx < {used}" + (f" and tx % {stride} == 0" if stride > 1 else "")
            with e.threads(), e.w.block(f"if {cond}:"):
                here = e.sc.load(red, "tx", e.sc.acc_dtype)
                there = e.sc.load(red, f"tx + {s * stride}", e.sc.acc_dtype)
                e.store(red, "tx", combined(e.sc, kind, here, there), e.sc.acc_dtype)
            s //= 2

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

"""The load phase of an input iterator in a graph-defined kernel: its tile copied from global to shared memory.

An element-wise copy moves 2 or 4 bytes per thread and instruction, through a register. Where the tile allows,
each thread instead copies 16-byte runs of a row with ``cp.async.cg.shared.global`` (global to shared without
a register, all of a thread's copies in flight at once; the phase ends with ``cp.async.commit_group``, and
``cp.async.wait_group 0`` comes before the next phase that is not such a copy, so consecutive loads are in flight
together, and before the barrier that the phases reading the tile already have). That needs
(besides the thread plan's ``runs``):

- the GPU (the llvm twin copies each run element by element, through the same slots and index arithmetic);
- a tile kept in shared memory and nothing else (no accumulator or saver reads the load itself), in the
  input's dtype (a copy converts nothing);
- whole 16-byte runs: the tile's rows and the input's rows a multiple of 16 bytes, so that every run of the
  tile starts 16-byte aligned in global memory (the input's base is: TVM and the runners allocate at 64 or
  256 bytes) and in shared memory (arena tiles start at multiples of 16 bytes, static arrays are 64-byte
  aligned), with a layout that keeps runs whole (no swizzle, pads of whole runs; the layout choice is told).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gensorage.codegen.tir_text import Ix, index_text
from gensorage.dtypes import dtype_bytes
from gensorage.ugraph.ir import InputIterator, Ref
from gensorage.ugraph.optimize.layouts import Layout

if TYPE_CHECKING:
    from gensorage.codegen.block_emitter import BlockEmitter

GRID_VARS = ("bx", "by", "bz")
COPY_BYTES = 16  # one cp.async.cg: 16 bytes


class LoadEmitter:
    """The load phases of one :class:`~gensorage.codegen.block_emitter.BlockEmitter`."""

    def __init__(self, e: BlockEmitter) -> None:
        self.e = e
        self.in_flight = False  # copies committed and not yet waited for

    def window(self, node: InputIterator) -> list[Ix]:
        """The offset of this block's (and this iteration's) tile in the input, per dim."""
        e = self.e
        shape = e.info.of(e.op.inputs[node.input]).shape
        ext, off = list(shape), [Ix() for _ in shape]
        for g, d in enumerate(node.imap):
            if d is not None and e.block.grid[g] > 1:
                ext[d] //= e.block.grid[g]
                off[d] = off[d] + Ix.var(GRID_VARS[g]) * ext[d]
        if node.fmap is not None:
            ext[node.fmap] //= e.block.forloop
            off[node.fmap] = off[node.fmap] + Ix.var("it") * ext[node.fmap]
        return off

    def run_elements(self, j: int) -> int:
        """Elements per 16-byte run when load ``j`` copies runs (the module docstring), else 0."""
        e = self.e
        node = e.nodes[j]
        assert isinstance(node, InputIterator)
        r = Ref(j)
        src = e.info.of(e.op.inputs[node.input])
        dtype = e.sc.buf_dtype(src.dtype)
        if (
            not e.choice.runs
            or e.sc.comps != 1
            or e.sinks_of(r)
            or not e.needs_buffer(r)
            or e.buf_dtype(r) != dtype
        ):
            return 0
        width = COPY_BYTES // dtype_bytes(dtype)
        lay = e.layouts.get(r, Layout())
        shape = e.tile(r).shape
        if width < 2 or shape[-1] % width or src.shape[-1] % width or lay.swizzle or lay.pad % width:
            return 0
        return width

    def phase(self, j: int) -> None:
        e = self.e
        node = e.nodes[j]
        assert isinstance(node, InputIterator)
        off = self.window(node)
        src = f"in{node.input}"
        dtype = e.sc.buf_dtype(e.info.of(e.op.inputs[node.input]).dtype)
        shape = e.tile(Ref(j)).shape
        width = self.run_elements(j)
        if not width:
            with e.threads(), e.elements(shape) as (idx, slot):
                gidx = [o + i for o, i in zip(off, idx, strict=True)]
                e.emit_value(Ref(j), idx, e.sc.load(src, index_text(gidx), dtype), slot)
            return
        r = Ref(j)
        e.row_loads.add(r)
        e.barriers.writes.add(r)
        with e.threads():
            with e.elements((*shape[:-1], shape[-1] // width)) as (idx, _):
                first = [*idx[:-1], idx[-1] * width]
                e.recorder.note_run(r, first, width)
                gfirst = index_text([o + i for o, i in zip(off, first, strict=True)])
                if e.gpu:
                    e.w.line(
                        f'T.evaluate(T.ptx["cp.async.cg.shared.global"]({e.buffers[r]}.ptr_to([{e.tile_index(r, first)}]), '
                        f"{src}.ptr_to([{gfirst}]), {COPY_BYTES}))"
                    )
                else:  # the twin: the same runs, element by element
                    with e.w.loop(e.w.fresh("c"), width) as c:
                        at = [*first[:-1], first[-1] + c]
                        g = [o + i for o, i in zip(off, at, strict=True)]
                        e.store(
                            e.buffers[r], e.tile_index(r, at), e.sc.load(src, index_text(g), dtype), dtype
                        )
            if e.gpu:
                e.w.line('T.evaluate(T.ptx["cp.async.commit_group"]())')
                self.in_flight = True

    def wait(self) -> None:
        """Wait for this thread's copies in flight (before the barrier that precedes any reader: every phase
        that is not itself a copy, and the end of each loop iteration), so consecutive loads overlap."""
        if self.in_flight:
            with self.e.threads():
                self.e.w.line('T.evaluate(T.ptx["cp.async.wait_group"](0))')
            self.in_flight = False


__all__ = ["COPY_BYTES", "GRID_VARS", "LoadEmitter"]

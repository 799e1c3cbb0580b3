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

Software pipelining of the for-loop (``ThreadChoice.stages`` = S of 2 or 3, :meth:`LoadEmitter.pipelined`):
every iterator that copies a slice per iteration with ``cp.async`` (``fmap`` set; they are then all the loop's
``cp.async`` copies) gets S stages of its tile (a leading dim; reads in iteration ``it`` address stage
``it % S``). The schedule, with one commit group per iteration::

    prologue:  for s < S - 1: copy iteration s into stage s; commit
    for it:    if it + S - 1 < F: copy iteration it + S - 1 into stage (it + S - 1) % S
               commit                      (an empty group near the end keeps the count uniform)
               cp.async.wait_group S - 1   (this thread's copies of iteration it have landed)
               barrier                     (everyone's copies have landed and are visible)
               <the body's phases, reading stage it % S> ... barrier (the iteration's last)
    after:     cp.async.wait_group 0

Why no stage is overwritten while a warp still reads it: the copies issued in iteration ``it`` write stage
``(it - 1) % S``, last read in iteration ``it - 1``, whose last barrier every thread has passed before any
issues them (that barrier is in every iteration: the stage's reads are pending until one). Why no stage is
read before it is complete: when thread t passes ``wait_group S - 1`` in iteration ``it``, t has committed
S - 1 + it + 1 groups and at most the last S - 1 (iterations it + 1 .. it + S - 1) are pending, so its copies of
iteration ``it`` are in shared memory; the barrier after the wait makes that true of every thread before any
reads. ``tests/test_pipeline.py`` replays the emitted order of copies, waits, barriers and reads against
these rules. The llvm twin runs the same stages and index arithmetic with plain copies (no groups).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
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

    def window(self, node: InputIterator, it: Ix | None = None) -> list[Ix]:
        """The offset of this block's tile in the input, per dim, at iteration ``it`` (default: this one)."""
        e = self.e
        shape = e.info.of(e.op.inputs[node.input]).shape
        ext, off = list(shape), [Ix() for _ in shape]
        for g, d in enumerate(node.imap):
            if d is not None and e.split[g]:
                ext[d] //= e.block.grid[g]
                off[d] = off[d] + Ix.var(GRID_VARS[g]) * ext[d]
        if node.fmap is not None:
            ext[node.fmap] //= e.block.forloop
            off[node.fmap] = off[node.fmap] + (Ix.var("it") if it is None else it) * ext[node.fmap]
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

    def pipelined(self) -> tuple[int, ...]:
        """The iterators whose tiles are staged (module docstring): none unless the thread plan asks for 2 or
        more stages of a for-loop that copies some tile with ``cp.async``."""
        return self.stageable() if self.e.choice.stages > 1 else ()

    def stageable(self) -> tuple[int, ...]:
        """The iterators a for-loop of this kernel would stage: those copying a slice per iteration in runs."""
        e = self.e
        if e.block.forloop < 2:
            return ()
        read = {r.node for r in e.consumers}
        return tuple(
            j
            for j, n in enumerate(e.nodes)
            if isinstance(n, InputIterator) and n.fmap is not None and j in read and self.run_elements(j)
        )

    def phase(self, j: int) -> None:
        e = self.e
        node = e.nodes[j]
        assert isinstance(node, InputIterator)
        off = self.window(node)
        src = f"in{node.input}"
        dtype = e.sc.buf_dtype(e.info.of(e.op.inputs[node.input]).dtype)
        shape = e.tile(Ref(j)).shape
        if not self.run_elements(j):
            with e.threads(), e.elements(shape) as (idx, slot):
                gidx = [o + i for o, i in zip(off, idx, strict=True)]
                e.emit_value(Ref(j), idx, e.sc.load(src, index_text(gidx), dtype), slot)
            return
        with e.threads():
            self._runs(j, off)
            self._commit()
        self.in_flight = self.in_flight or e.gpu

    def _runs(self, j: int, off: list[Ix]) -> None:
        """Inside a thread loop: this thread's 16-byte runs of load ``j``'s tile at input offset ``off``."""
        e = self.e
        node = e.nodes[j]
        assert isinstance(node, InputIterator)
        src = f"in{node.input}"
        dtype = e.sc.buf_dtype(e.info.of(e.op.inputs[node.input]).dtype)
        shape = e.tile(Ref(j)).shape
        width = self.run_elements(j)
        r = Ref(j)
        e.row_loads.add(r)
        e.barriers.writes.add(r)
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
                    e.store(e.buffers[r], e.tile_index(r, at), e.sc.load(src, index_text(g), dtype), dtype)

    def _commit(self) -> None:
        if self.e.gpu:
            self.e.w.line('T.evaluate(T.ptx["cp.async.commit_group"]())')

    @contextmanager
    def _stage(self, stage: Ix) -> Iterator[None]:
        """Writes and reads of the staged tiles address ``stage`` (then the iteration's again)."""
        e = self.e
        before, e.stage_at = e.stage_at, stage
        try:
            yield
        finally:
            e.stage_at = before

    def _copy_iteration(self, it: Ix, guard: str | None) -> None:
        """One phase: every staged tile's copies of iteration ``it`` into stage ``it % stages`` (under
        ``guard``, the same for every thread), then one commit group (empty when the guard is false)."""
        e = self.e
        with e.barrier_phase(), e.threads(), self._stage(it.mod(e.stages)):
            with e.w.block(f"if {guard}:") if guard else nullcontext():
                for j in e.staged:
                    node = e.nodes[j]
                    assert isinstance(node, InputIterator)
                    self._runs(j, self.window(node, it))
            self._commit()

    def prologue(self) -> None:
        """Before the loop: the copies of iterations ``0 .. stages - 2``, one group each (when staged)."""
        e = self.e
        if not e.staged:
            return
        # Nothing reads these stages before the first iteration's barrier after its wait, and each copy here and
        # the first prefetch write a stage of their own: no barrier is owed between them (the placement sees
        # tiles, not stages, and would put one between the prologue's copies and at the top of the loop). The
        # loop's settle before the prologue left nothing else pending.
        for s in range(e.stages - 1):  # stages <= forloop (allocate)
            e.barriers.clear()
            self._copy_iteration(Ix.of(s), None)
        e.barriers.clear()

    def begin_iteration(self) -> None:
        """When staged, at the top of each iteration: :meth:`prefetch`, then :meth:`wait_stage`."""
        if self.e.staged:
            self.prefetch()
            self.wait_stage()

    def prefetch(self) -> None:
        """At the top of iteration ``it``: the copies of iteration ``it + stages - 1``, into the stage that
        iteration ``it - 1`` read (its last barrier is behind every thread)."""
        e = self.e
        ahead = e.stages - 1
        self._copy_iteration(Ix.var("it") + ahead, f"it + {ahead} < {e.block.forloop}")

    def wait_stage(self) -> None:
        """This iteration's copies landed (this thread's: at most ``stages - 1`` groups pending), then a barrier
        (everyone's)."""
        e = self.e
        if e.gpu:
            with e.threads():
                e.w.line(f'T.evaluate(T.ptx["cp.async.wait_group"]({e.stages - 1}))')
        e.sync()

    def drain(self) -> None:
        """After a staged loop: nothing in flight (the last groups are empty; this makes it so whatever they
        hold)."""
        e = self.e
        if e.gpu and e.staged:
            with e.threads():
                e.w.line('T.evaluate(T.ptx["cp.async.wait_group"](0))')

    def wait(self) -> None:
        """Wait for this thread's copies in flight (before the barrier that precedes any reader: every phase
        that is not itself a copy, and the end of each loop iteration), so consecutive loads overlap."""
        if self.in_flight:
            with self.e.threads():
                self.e.w.line('T.evaluate(T.ptx["cp.async.wait_group"](0))')
            self.in_flight = False


__all__ = ["COPY_BYTES", "GRID_VARS", "LoadEmitter"]

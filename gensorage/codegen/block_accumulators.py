"""The for-loop accumulators of a graph-defined kernel: registers kept across the loop, concatenation into shared
memory, and the flush after the loop (see :mod:`.ugraph_tir` for the kernel's structure)."""

from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING

from gensorage.codegen.element_maps import Cyclic, ElementMap
from gensorage.codegen.scalar import Val
from gensorage.codegen.tir_text import Ix, index_text, is_atomic
from gensorage.ugraph.ir import Accumulator, Ref

if TYPE_CHECKING:
    from gensorage.codegen.block_emitter import BlockEmitter


class AccumulatorEmitter:
    """The accumulator phases of one :class:`~gensorage.codegen.block_emitter.BlockEmitter`."""

    def __init__(self, e: BlockEmitter) -> None:
        self.e = e

    def register_maps(self) -> dict[int, ElementMap]:
        """Element-to-thread map of every accumulator kept in registers (all but the concatenating ones)."""
        return {
            j: self._register_map(n)
            for j, n in enumerate(self.e.nodes)
            if isinstance(n, Accumulator) and n.fmap is None
        }

    def _register_map(self, node: Accumulator) -> ElementMap:
        """Element-to-thread map of a register accumulator: its producer's (fused) or a cyclic copy phase's.

        Every iteration runs the same phase, so a thread always combines the same elements and can keep them
        in registers; read-modify-writes of shared memory in a loop would also make TVM's barrier insertion put
        a barrier inside the loop.
        """
        r = node.input
        shape = self.e.tile(r).shape
        return self.e.producer_map(r) if self.e.fusable(r) else Cyclic(shape, shape)

    def reg(self, slot: Ix) -> str:
        """Index text of this thread's register ``slot`` of an accumulator (a row per thread on the CPU)."""
        return str(slot) if self.e.gpu else f"tx, {slot}"

    def sink(self, j: int, idx: list[Ix], v: Val, slot: Ix) -> None:
        """Element ``idx`` of accumulator ``j``'s input (this thread's ``slot``) combined into the accumulator."""
        e, sc = self.e, self.e.sc
        node = e.nodes[j]
        assert isinstance(node, Accumulator)
        if node.fmap is not None:
            shifted = list(idx)
            shifted[node.fmap] = idx[node.fmap] + Ix.var("it") * e.tile(node.input).shape[node.fmap]
            e.store(e.buffers[Ref(j)], index_text(shifted), v, sc.acc_dtype)
            return
        if not all(is_atomic(c) for c in v.comps):
            v = e.temp(v)
        reg, at = f"a{j}", self.reg(slot)
        new = sc.combine(node.kind, sc.load(reg, at, sc.acc_dtype), v)
        first = sc.store(v, sc.acc_dtype)
        for c, x in enumerate(sc.store(new, sc.acc_dtype)):
            e.w.line(f"{sc.at(reg, c, at)} = T.if_then_else(it == 0, {first[c]}, {x})")

    def phase_copy(self, src: Ref, sinks: list[int]) -> None:
        """Accumulators/savers reading a view, a concat or a shared accumulator: a cyclic pass over the value."""
        e = self.e
        with e.threads(), e.elements(e.tile(src).shape) as (idx, slot):
            v = e.read(src, idx)
            for s in sinks:
                e.sink(s, idx, v, slot)
        e.after(
            any(
                isinstance(e.nodes[s], Accumulator) and e.nodes[s].fmap is not None  # type: ignore[union-attr]
                for s in sinks
            )
        )

    def phase_flush(self) -> None:
        """After the loop: register accumulators to their shared buffers and fused savers (same element map)."""
        e = self.e
        if not e.reg_accs:
            return
        with e.threads():
            for j, m in e.reg_accs.items():
                with e.w.loop(e.w.fresh("sl"), e.slots(m)) as slot:
                    idx, conds = e.locate(m, slot)
                    with e.w.block(f"if {' and '.join(conds)}:") if conds else nullcontext():
                        v = e.sc.load(f"a{j}", self.reg(slot), e.sc.acc_dtype)
                        e.emit_value(Ref(j), idx, v, slot)
        e.after(any(Ref(j) in e.buffers for j in e.reg_accs))


__all__ = ["AccumulatorEmitter"]

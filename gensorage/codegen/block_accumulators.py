"""The for-loop accumulators of a graph-defined kernel: registers kept across the loop, concatenation into shared
memory, the online-softmax step, and the flush after the loop (see :mod:`.ugraph_tir` for the kernel's structure).

An online-softmax accumulator (FlashAttention-2; semantics in :mod:`gensorage.ugraph.online_softmax`) runs its own
phase each iteration, after the loop body, reading the score tile ``s`` (and the value tile ``v``) from shared
memory. One thread owns each element ``(row, col)`` of the result, dealt cyclically, and keeps two registers
across the loop: the running maximum ``m`` of the row and the accumulator ``acc``. Per iteration, in the compute
dtype (float32)::

    m' = rowmax(s)                  if it == 0 else max(m, rowmax(s))
    p  = Σ_k exp(s[row, k] - m')    (softmax_sum)   or   Σ_k exp(s[row, k] - m') · v[k, col]   (softmax_matmul)
    acc = p                         if it == 0 else acc · exp(m - m') + p
    m  = m'

The first iteration stores rather than rescales, so no register is read before it is written. A row maximum
starts at the max identity of :meth:`~gensorage.codegen.scalar.Scalar.initial`, the lowest *finite* float, so a
row whose scores so far are all -inf (masked) has a finite maximum: its terms are exp(-inf - lowest) = 0 and its
rescale exp(lowest - m') is 0 or 1, never the NaN of exp(-inf + inf); such a row sums to 0 (the program's own
softmax of it is 0 / 0). The rowmax is recomputed by every thread of a row (one pass over the keys before the
sum). That is the general path, for a ``softmax_matmul`` whose value tile is float32 or whose shapes do not
fit m16n8k16, and a ``softmax_sum`` beside it. A ``softmax_matmul`` that fits runs its step on tensor cores
instead (:mod:`gensorage.codegen.online_mma`: row maxima by the lanes that share a row, P computed into the
MMA's fragments, float32 accumulators kept in the MMA's register slots), with the same first-iteration and
masked-row rules, and a ``softmax_sum`` over the same scores keeps its row sums in that phase.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING

from gensorage.codegen.element_maps import Cyclic, ElementMap, Fragments, RowFragments
from gensorage.codegen.scalar import Val
from gensorage.codegen.tir_text import Ix, broadcast_index, is_atomic
from gensorage.errors import NotLaxError
from gensorage.opset import Op
from gensorage.ugraph.ir import ONLINE_SOFTMAX_KINDS, Accumulator, Ref

if TYPE_CHECKING:
    from gensorage.codegen.block_emitter import BlockEmitter


class AccumulatorEmitter:
    """The accumulator phases of one :class:`~gensorage.codegen.block_emitter.BlockEmitter`."""

    def __init__(self, e: BlockEmitter) -> None:
        self.e = e

    def register_maps(self) -> dict[int, ElementMap]:
        """Element-to-thread map of every accumulator kept in registers (all but the concatenating ones)."""
        return {
            j: self._register_map(j, n)
            for j, n in enumerate(self.e.nodes)
            if isinstance(n, Accumulator) and n.fmap is None
        }

    def _register_map(self, j: int, node: Accumulator) -> ElementMap:
        """Element-to-thread map of a register accumulator: its producer's (fused) or a cyclic copy phase's.

        Every iteration runs the same phase, so a thread always combines the same elements and can keep them
        in registers; read-modify-writes of shared memory in a loop would also make TVM's barrier insertion put
        a barrier inside the loop.
        """
        if j in self.e.online_mma:  # P·V on tensor cores: the fragments stay in the MMA's slots
            return Fragments(self.e.online_mma[j])
        if j in self.e.online_sums:  # its row sums, kept beside them by the lanes of each row
            return RowFragments(self.e.online_mma[self.e.online_sums[j]])
        if node.kind in ONLINE_SOFTMAX_KINDS:  # its own phase, one element of the result per thread slot
            out = self.e.tile(Ref(j)).shape
            return Cyclic(out, out)
        r = node.input
        shape = self.e.tile(r).shape
        return self.e.producer_map(r) if self.e.fusable(r) else Cyclic(shape, shape)

    def is_online(self, j: int) -> bool:
        """Whether block node ``j`` is an online-softmax accumulator (fed by its own phase, never fused)."""
        node = self.e.nodes[j]
        return isinstance(node, Accumulator) and node.kind in ONLINE_SOFTMAX_KINDS

    def registers(self, j: int) -> tuple[str, ...]:
        """Names of register accumulator ``j``'s per-thread arrays: the value, then an online one's running max
        (a sum beside a tensor-core P·V shares that one's)."""
        return (f"a{j}", f"m{j}") if self.is_online(j) and j not in self.e.online_sums else (f"a{j}",)

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
            e.store(e.buffers[Ref(j)], e.tile_index(Ref(j), shifted), v, sc.acc_dtype)
            return
        if not all(is_atomic(c) for c in v.comps):
            v = e.temp(v)
        reg, at = f"a{j}", self.reg(slot)
        new = sc.combine(node.kind, sc.load(reg, at, sc.acc_dtype), v)
        first = sc.store(v, sc.acc_dtype)
        for c, x in enumerate(sc.store(new, sc.acc_dtype)):
            e.w.line(f"{sc.at(reg, c, at)} = T.if_then_else(it == 0, {first[c]}, {x})")

    def phase(self, j: int) -> None:
        """The per-iteration phase of an accumulator its input's producer does not feed directly."""
        node = self.e.nodes[j]
        assert isinstance(node, Accumulator)
        if node.kind in ONLINE_SOFTMAX_KINDS:
            self.phase_online(j, node)
        else:
            self.phase_copy(node.input, [j])

    def phase_online(self, j: int, node: Accumulator) -> None:
        """One online-softmax step of accumulator ``j`` (see the module docstring)."""
        e, sc, w = self.e, self.e.sc, self.e.w
        if sc.field:
            raise NotLaxError(
                f"block node #{j}: a {node.kind} accumulator has no field twin (its rescale needs "
                "exp(a + b) = exp(a)·exp(b), which only the second verification tier models)"
            )
        if j in e.online_mma:
            e.online.phase(j, node, e.online_mma[j])
            return
        if j in e.online_sums:
            return  # in its P·V's phase
        s = e.tile(node.input).shape
        m_reg, a_reg = f"m{j}", f"a{j}"
        with e.barrier_phase(), e.threads(), e.elements(e.tile(Ref(j)).shape) as (idx, slot):
            at = self.reg(slot)
            m_old, a_old = sc.load(m_reg, at, sc.acc_dtype), sc.load(a_reg, at, sc.acc_dtype)
            st = e.acc_buffer(2)  # [0]: the tile's row max, then the new running max; [1]: the tile's sum
            row_max, part = (sc.load(st, str(i), sc.acc_dtype) for i in range(2))
            e.store(st, "0", sc.initial("max"), sc.acc_dtype)
            with w.loop(w.fresh("k"), s[-1]) as k:
                score = e.read(node.input, self._score_index(idx, s, k))
                e.store(st, "0", sc.combine("max", row_max, score), sc.acc_dtype)
            grown = sc.combine("max", m_old, row_max)
            w.line(f"{sc.at(st, 0, '0')} = T.if_then_else(it == 0, {row_max.comps[0]}, {grown.comps[0]})")
            e.store(st, "1", sc.zero(), sc.acc_dtype)
            with w.loop(w.fresh("k"), s[-1]) as k:
                score = e.read(node.input, self._score_index(idx, s, k))
                p = sc.op(w, Op.EXP, (), [sc.op(w, Op.SUB, (), [score, row_max])])
                if node.values is not None:
                    p = sc.product(p, e.read(node.values, self._value_index(idx, node.values, k)))
                e.store(st, "1", sc.plus(part, p), sc.acc_dtype)
            rescaled = sc.plus(
                sc.product(a_old, sc.op(w, Op.EXP, (), [sc.op(w, Op.SUB, (), [m_old, row_max])])), part
            )
            w.line(f"{sc.at(a_reg, 0, at)} = T.if_then_else(it == 0, {part.comps[0]}, {rescaled.comps[0]})")
            e.store(m_reg, at, row_max, sc.acc_dtype)

    @staticmethod
    def _score_index(idx: list[Ix], s: tuple[int, ...], k: Ix) -> list[Ix]:
        """Score ``k`` of the row of result element ``idx`` (batch dims broadcast as a matmul's)."""
        return broadcast_index(idx[:-2], s[:-2]) + [idx[-2], k]

    def _value_index(self, idx: list[Ix], v: Ref, k: Ix) -> list[Ix]:
        """Row ``k`` of the value tile, at result element ``idx``'s column."""
        return broadcast_index(idx[:-2], self.e.tile(v).shape[:-2]) + [k, idx[-1]]

    def phase_copy(self, src: Ref, sinks: list[int]) -> None:
        """Accumulators/savers reading a view, a concat or a shared accumulator: a cyclic pass over the value."""
        e = self.e
        with e.barrier_phase(), e.threads(), e.elements(e.tile(src).shape) as (idx, slot):
            v = e.read(src, idx)
            for s in sinks:
                e.sink(s, idx, v, slot)

    def phase_flush(self) -> None:
        """After the loop: register accumulators to their shared buffers and fused savers (same element map)."""
        e = self.e
        if not e.reg_accs:
            return
        with e.barrier_phase(), e.threads():
            for j, m in e.reg_accs.items():
                with e.w.loop(e.w.fresh("sl"), e.slots(m)) as slot:
                    idx, conds = e.locate(m, slot)
                    with e.w.block(f"if {' and '.join(conds)}:") if conds else nullcontext():
                        v = e.sc.load(f"a{j}", self.reg(slot), e.sc.acc_dtype)
                        e.emit_value(Ref(j), idx, v, slot)


__all__ = ["AccumulatorEmitter"]

"""Block matmuls of a graph-defined kernel on tensor cores: warp-level ``mma.sync.m16n8k16``, float32 accumulate.

A block matmul whose operand tiles are 16-bit (float16 or bfloat16; they sit in shared memory, read directly
or through reshape/repeat views), whose output tile has a multiple of 8 rows (the last 16-row MMA tile padded
with zero rows when the count is not a multiple of 16: a decode batch or a query group of 8 rows uses half of
each MMA) and of 8 columns, with a whole number of 16-wide k chunks, runs on tensor cores when the block has
whole warps (:func:`mma_tiling` is the rule; it returns None otherwise and the matmul keeps the CUDA-core path
of :mod:`gensorage.codegen.block_matmul`, e.g. a decode block's single query row). Operand dtypes follow the
predefined tensor-core GEMM (:func:`gensorage.codegen.tensor_core.mma_dtype`): a float32 operand (an
intermediate the precision policy keeps wide, e.g. FlashAttention's probabilities) with a 16-bit one multiplies
in bfloat16, both converted as the fragments are loaded (float32's range, 8 significant bits, products summed
in float32); two float32 operands keep the CUDA-core path.

Layout. The output ``[batch, m, n]`` is cut into *warp tiles* of ``warp_m x warp_n`` MMA tiles
(``16 warp_m x 8 warp_n`` elements); warp ``w = tx // 32`` computes warp tiles ``w, w + warps, ...`` (``steps``
of them), each into ``4 warp_m warp_n`` float32 registers per lane. Per 16-wide k chunk a lane loads its
fragments from the shared tiles (the PTX ISA's m16n8k16 layout, :func:`a_element`, :func:`b_element`), and the
warp issues one ``mma.sync`` per MMA tile (TVM's ``ptx_legacy.mma`` builtin). Fragments are loaded element by
element, so any view and either operand layout works (no ``ldmatrix``, which needs 16-byte aligned rows).
Accumulator ``c`` of MMA tile ``(mi, nj)`` of step ``s`` is this thread's slot ``s * regs + (mi * warp_n + nj) *
4 + c`` (:class:`~gensorage.codegen.element_maps.Fragments`): from there it goes to the output's shared tile
and to the sinks (loop accumulators in registers keep the same slots across iterations, savers), or to the
thread graph that is the result's only reader, element for element, which then runs in this phase on the
accumulators (its outputs keep the same slots; see ``BlockEmitter.fused``).

The CPU twins (llvm, finite field) run the same warps, steps and slots with each MMA replaced by its scalar
semantics: per k chunk, each accumulator adds its 16 products in k order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gensorage.codegen.mma_bfloat16 import bfloat16_rounded_text
from gensorage.codegen.scalar import Val
from gensorage.codegen.tensor_core import mma_dtype
from gensorage.codegen.tir_text import Ix, broadcast_index, tvm_float, unravel
from gensorage.dtypes import dtype_bytes
from gensorage.errors import ScheduleError
from gensorage.opset import Op
from gensorage.ugraph.ir import Accumulator, BlockNode, BlockOp, Ref, ThreadGraph
from gensorage.ugraph.optimize.layouts import Layout
from gensorage.ugraph.optimize.views import VIEW_OPS
from gensorage.ugraph.shapes import BlockInfo, GraphInfo, TensorInfo

if TYPE_CHECKING:
    from gensorage.codegen.block_emitter import BlockEmitter

WARP = 32
MMA_M, MMA_N, MMA_K = 16, 8, 16  # the m16n8k16 instruction
MIN_ROWS = 8  # a tile of 8 rows (a decode batch, a query group) runs padded to 16: half of each MMA
A_ELEMS, B_ELEMS, C_ELEMS = 8, 4, 4  # fragment elements per lane
MAX_ACC_REGS = 64  # float32 accumulators per thread and step: a quarter of the 255 registers a thread may use
MAX_REGS_PER_THREAD = 255
REGISTERS_PER_BLOCK = 65536  # CUDA's per-block register file (compute capability 5.0 to 9.0)
PTX_DTYPE = {"float16": "fp16", "bfloat16": "bf16"}
ROW_BYTES = 16  # one ldmatrix row: 8 16-bit elements, 16-byte aligned


@dataclass(frozen=True, slots=True)
class MmaTiling:
    """Warp tiling of one block matmul: output ``batch + (m, n)``, inner dim ``k``, ``warps`` warps, warp tiles
    of ``warp_m x warp_n`` MMA tiles; ``dtype`` is the operands' (see the module docstring)."""

    batch: tuple[int, ...]
    m: int
    n: int
    k: int
    warps: int
    warp_m: int
    warp_n: int
    dtype: str
    block_warps: int = 0  # the block's warps (0: ``warps``); those past ``warps`` idle in this matmul's phase

    @property
    def m_tiles(self) -> int:
        """MMA tiles along i (the last one padded when ``m`` is not a multiple of 16)."""
        return -(-self.m // MMA_M)

    @property
    def padded(self) -> bool:
        return self.m % MMA_M != 0

    @property
    def grid(self) -> tuple[int, int, int]:
        """Warp tiles along (batch, i, j)."""
        return math.prod(self.batch), self.m_tiles // self.warp_m, self.n // (MMA_N * self.warp_n)

    @property
    def warp_tiles(self) -> int:
        return math.prod(self.grid)

    @property
    def steps(self) -> int:
        """Warp tiles each warp computes in turn."""
        return -(-self.warp_tiles // self.warps)

    @property
    def regs(self) -> int:
        """Accumulators per thread and step."""
        return self.warp_m * self.warp_n * C_ELEMS

    @property
    def slots(self) -> int:
        return self.steps * self.regs

    def slot_tile(self, r: int) -> tuple[int, int, int]:
        """Accumulator ``r`` of one step as (MMA tile row ``mi``, MMA tile column ``nj``, element ``c``)."""
        return r // (C_ELEMS * self.warp_n), r // C_ELEMS % self.warp_n, r % C_ELEMS

    @property
    def idle(self) -> bool:
        """Whether some of the block's warps take no part (then each lane checks its warp)."""
        return self.block_warps > self.warps

    def describe(self) -> str:
        of = f" of {self.block_warps}" if self.idle else ""
        return (
            f"tensor cores (mma.m16n8k16 {self.dtype}): {self.warps}{of} warp{'s' if self.warps > 1 else ''}, warp tile "
            f"{MMA_M * self.warp_m}x{MMA_N * self.warp_n}, {self.steps} step{'s' if self.steps > 1 else ''}"
        )


def mma_tiling(
    binfo: BlockInfo, node: BlockOp, j: int, threads: int, warps: int | None = None
) -> MmaTiling | None:
    """The warp tiling of block matmul ``j`` on ``warps`` of the block's ``threads`` threads (default: all of
    them; the others idle in its phase), or None when it does not run on tensor cores.

    Among warp tiles whose accumulators over all steps (:attr:`MmaTiling.slots`: a loop accumulator or the
    fused thread graph keeps every step's in registers) fit :func:`acc_budget`, the one with the fewest MMAs on
    the busiest warp (the critical path), then the largest (each fragment loaded feeds more MMAs), then the one
    loading the fewest fragment elements per k chunk (the squarer). When none fits, the one with the fewest
    accumulators. How many warps: :mod:`gensorage.codegen.mma_threads`.
    """
    a, b = (binfo.nodes[r.node][r.out] for r in node.inputs)
    out = binfo.nodes[j][0].shape
    dtype = fits_mma(a, b, out)
    if dtype is None or threads % WARP:
        return None
    warps = threads // WARP if warps is None else warps
    if not 1 <= warps <= threads // WARP:
        raise ScheduleError(f"{warps} warps for block matmul #{j} on {threads} threads")
    return warp_tiling(out, a.shape[-1], dtype, threads, warps)


def warp_tiling(out: tuple[int, ...], k: int, dtype: str, threads: int, warps: int) -> MmaTiling:
    """The best warp tile (see :func:`mma_tiling`) of an MMA product into ``out`` over inner dim ``k`` on
    ``warps`` of ``threads`` threads (the shapes fit m16n8k16; the online-softmax P·V asks this too)."""
    m, n = out[-2], out[-1]
    budget = acc_budget(threads)
    best: tuple[tuple[bool, int, int, int], MmaTiling] | None = None
    for wm in _divisors(-(-m // MMA_M)):
        for wn in _divisors(n // MMA_N):
            t = MmaTiling(tuple(out[:-2]), m, n, k, warps, wm, wn, dtype, threads // WARP)
            over = t.slots > budget
            key = (over, t.slots if over else t.steps * wm * wn, -wm * wn, A_ELEMS * wm + B_ELEMS * wn)
            if best is None or key < best[0]:
                best = (key, t)
    assert best is not None
    return best[1]


def acc_budget(threads: int) -> int:
    """Accumulator registers a thread of a ``threads``-thread block may keep: a quarter of its registers (at
    most :data:`MAX_ACC_REGS`), the rest for fragments, addresses and the phases around."""
    return min(MAX_ACC_REGS, min(MAX_REGS_PER_THREAD, REGISTERS_PER_BLOCK // threads) // 4)


def fits_mma(a: TensorInfo, b: TensorInfo, out: tuple[int, ...]) -> str | None:
    """The MMA dtype of a block matmul of tiles ``a`` by ``b`` into ``out`` whose shapes fit m16n8k16 (rows a
    multiple of 8, padded to 16; None: CUDA cores whatever the threads). :func:`mma_tiling` asks this, and
    also needs whole warps (the cost model reads the emitter's tilings)."""
    m, n, k = out[-2], out[-1], a.shape[-1]
    if m % MIN_ROWS or n % MMA_N or k % MMA_K:
        return None
    return mma_dtype(a.dtype, b.dtype)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def lane_group(lane: Ix) -> tuple[Ix, Ix]:
    """(group, thread in group) of a lane: ``lane // 4`` and ``lane % 4``; ``lane`` may also be the thread index,
    whose lane is ``tx % 32``."""
    return lane.floordiv(4).mod(WARP // 4), lane.mod(4)


def a_element(lane: Ix, e: int) -> tuple[Ix, Ix]:
    """(row, col) in the 16 x 16 A tile of element ``e`` of ``lane``'s A fragment (PTX ISA, m16n8k16)."""
    g, t = lane_group(lane)
    return g + 8 * (e // 2 % 2), t * 2 + (e % 2 + 8 * (e // 4))


def b_element(lane: Ix, e: int) -> tuple[Ix, Ix]:
    """(k, col) in the 16 x 8 B tile of element ``e`` of ``lane``'s B fragment."""
    g, t = lane_group(lane)
    return t * 2 + (e % 2 + 8 * (e // 2)), g


def ldmatrix_row(lane: Ix) -> tuple[Ix, Ix]:
    """(row, first column) in a 16 x 16 block of the 8-element row whose address ``lane`` gives ``ldmatrix.x4``:
    lanes ``8q .. 8q + 7`` give matrix ``q``'s rows, and the matrices are (rows 0-7, columns 0-7), (rows 8-15,
    columns 0-7), (rows 0-7, columns 8-15), (rows 8-15, columns 8-15): for A (rows i, columns k) the
    registers are the :func:`a_element` fragment; for B (rows k, columns n; transposed) the fragments of two
    16 x 8 B tiles (:func:`b_element`), columns 0-7 then 8-15."""
    return lane.mod(16), lane.floordiv(16).mod(2) * 8


def c_element(lane: Ix, c: Ix) -> tuple[Ix, Ix]:
    """(row, col) in the 16 x 8 C tile of accumulator ``c`` of ``lane``."""
    g, t = lane_group(lane)
    return g + c.floordiv(2, C_ELEMS) * 8, t * 2 + c.mod(2, C_ELEMS)


def lane_and_warp(threads: int) -> tuple[Ix, Ix]:
    """This thread's lane (as the thread index: the fragment layouts only read it modulo 32) and warp."""
    tx = Ix.var("tx")
    return tx, tx.floordiv(WARP, threads)


def slot_coords(t: MmaTiling, threads: int, slot: Ix) -> tuple[list[Ix], list[str]]:
    """Output element (batch..., i, j) held in this thread's ``slot``, and the condition for it to exist."""
    s, mi, nj, c = unravel(slot, (t.steps, t.warp_m, t.warp_n, C_ELEMS))
    wt, conds = warp_tile(t, threads, s)
    idx = tile_coords(t, threads, wt, mi, nj, c)
    return idx, conds + row_guard(t, idx[-2])


def row_guard(t: MmaTiling, row: Ix) -> list[str]:
    """The condition for output row ``row`` to exist (padded rows of the last MMA tile do not)."""
    return [f"{row} < {t.m}"] if t.padded else []


def warp_tile(t: MmaTiling, threads: int, step: Ix) -> tuple[Ix, list[str]]:
    """The warp tile this thread's warp computes at ``step``, and the condition for it to exist."""
    _, warp = lane_and_warp(threads)
    wt = step * t.warps + warp
    conds = [f"{warp} < {t.warps}"] if t.idle else []
    return wt, conds + ([f"{wt} < {t.warp_tiles}"] if t.steps * t.warps > t.warp_tiles else [])


def tile_coords(t: MmaTiling, threads: int, wt: Ix, mi: Ix, nj: Ix, c: Ix) -> list[Ix]:
    """Output element of accumulator ``c`` of MMA tile ``(mi, nj)`` of warp tile ``wt`` held by this lane."""
    lane, _ = lane_and_warp(threads)
    bt, ti, tj = unravel(wt, t.grid)
    row, col = c_element(lane, c)
    i = ti * (MMA_M * t.warp_m) + mi * MMA_M + row
    j = tj * (MMA_N * t.warp_n) + nj * MMA_N + col
    return (unravel(bt, t.batch) if t.batch else []) + [i, j]


class MmaEmitter:
    """The tensor-core matmul phase of one :class:`~gensorage.codegen.block_emitter.BlockEmitter`."""

    def __init__(self, e: BlockEmitter) -> None:
        self.e = e

    def phase(self, j: int, node: BlockOp, t: MmaTiling) -> None:
        e, w = self.e, self.e.w
        a, b = node.inputs
        with e.threads():
            acc = e.acc_buffer(t.regs)
            frags = self.fragments(t) if e.gpu else None
            with w.loop(w.fresh("ws"), t.steps) as step:
                wt, conds = warp_tile(t, e.nt, step)
                with w.block(f"if {' and '.join(conds)}:") if conds else nullcontext():
                    for r in range(t.regs):
                        e.store(acc, str(r), e.sc.zero(), e.sc.acc_dtype)
                    bt = unravel(wt, t.grid)[0]
                    batch = unravel(bt, t.batch) if t.batch else []
                    with w.loop(w.fresh("kc"), t.k // MMA_K) as kc:
                        if frags is None:
                            self._scalar_mmas(t, acc, a, b, wt, batch, kc)
                        else:
                            self._mmas(t, acc, frags, a, b, wt, batch, kc)
                    for r in range(t.regs):
                        mi, nj, c = t.slot_tile(r)
                        idx = tile_coords(t, e.nt, wt, Ix.of(mi), Ix.of(nj), Ix.of(c))
                        v = e.sc.reduced(e.sc.load(acc, str(r), e.sc.acc_dtype))
                        guard = row_guard(t, idx[-2])
                        with w.block(f"if {guard[0]}:") if guard else nullcontext():
                            self._result(j, idx, v, step * t.regs + r)

    def _result(self, j: int, idx: list[Ix], v: Val, slot: Ix) -> None:
        """Element ``idx`` of the matmul's result: emitted, or handed to the thread graph fused into this phase
        (rounded to the result's dtype, as its shared tile would hold it)."""
        e = self.e
        tg = e.fused.get(j)
        if tg is None:
            e.emit_value(Ref(j), idx, v, slot)
            return
        dtype = e.buf_dtype(Ref(j))
        rounded = Val(e.sc.store(v, dtype), dtype)
        e.thread_graph_element(tg, idx, [rounded] * len(e.nodes[tg].inputs), slot)  # type: ignore[union-attr]

    def fragments(self, t: MmaTiling) -> tuple[str, str]:
        e = self.e
        names = e.w.fresh("fa"), e.w.fresh("fb")
        for name, size in zip(names, (A_ELEMS * t.warp_m, B_ELEMS * t.warp_n), strict=True):
            e.w.line(f'{name} = T.alloc_buffer(({size},), "{t.dtype}", scope="local")')
        return names

    @staticmethod
    def origin(t: MmaTiling, wt: Ix) -> tuple[Ix, Ix]:
        """First output row and column of warp tile ``wt``."""
        _, ti, tj = unravel(wt, t.grid)
        return ti * (MMA_M * t.warp_m), tj * (MMA_N * t.warp_n)

    def _mmas(
        self, t: MmaTiling, acc: str, frags: tuple[str, str], a: Ref, b: Ref, wt: Ix, batch: list[Ix], kc: Ix
    ) -> None:
        """One k chunk on tensor cores: this lane's fragments from shared memory, then one MMA per MMA tile."""
        e = self.e
        lane, _ = lane_and_warp(e.nt)
        i0, j0 = self.origin(t, wt)
        fa, fb = frags
        ab = broadcast_index(batch, e.tile(a).shape[:-2])
        bb = broadcast_index(batch, e.tile(b).shape[:-2])
        low, high = ldmatrix_row(lane)
        for mi in range(t.warp_m):
            if self.row_loadable(a, t, t.padded):  # A rows (k contiguous): x4 gives the a_element layout
                idx = ab + [i0 + mi * MMA_M + low, kc * MMA_K + high]
                self.ldmatrix(t, fa, mi * A_ELEMS, a, idx, 4, trans=False)
                continue
            for x in range(A_ELEMS):
                row, col = a_element(lane, x)
                i = i0 + mi * MMA_M + row
                v = e.read(a, ab + [i, kc * MMA_K + col])
                guard = row_guard(t, i)
                if (
                    guard
                ):  # a padded row multiplies as zeros (if_then_else reads the tile only when it exists)
                    v = Val(
                        (f"T.if_then_else({guard[0]}, {v.comps[0]}, {tvm_float(0.0, v.dtype)})",), v.dtype
                    )
                e.store(fa, str(mi * A_ELEMS + x), v, t.dtype)
        self.b_fragments(t, fb, b, bb, j0, kc)
        self.issue(t, acc, frags)

    def b_fragments(self, t: MmaTiling, fb: str, b: Ref, bb: list[Ix], j0: Ix, kc: Ix) -> None:
        """This lane's B fragments of k chunk ``kc`` (columns from ``j0``) from shared tile ``b``."""
        e = self.e
        lane, _ = lane_and_warp(e.nt)
        low, high = ldmatrix_row(lane)
        for nj in range(t.warp_n):
            if self.row_loadable(b, t, False):  # B rows (n contiguous), transposed: two n tiles per x4
                if nj % 2 == 0:
                    pair = nj + 1 < t.warp_n
                    idx = bb + [kc * MMA_K + low, j0 + nj * MMA_N + (high if pair else Ix())]
                    self.ldmatrix(t, fb, nj * B_ELEMS, b, idx, 4 if pair else 2, trans=True)
                continue
            for x in range(B_ELEMS):
                kk, col = b_element(lane, x)
                v = e.read(b, bb + [kc * MMA_K + kk, j0 + nj * MMA_N + col])
                e.store(fb, str(nj * B_ELEMS + x), v, t.dtype)

    def issue(self, t: MmaTiling, acc: str, frags: tuple[str, str]) -> None:
        """One ``mma.sync`` per MMA tile of the warp tile, from the loaded fragments into ``acc``."""
        fa, fb = frags
        ptx = PTX_DTYPE[t.dtype]
        for mi in range(t.warp_m):
            for nj in range(t.warp_n):
                self.e.w.line(
                    f'T.evaluate(T.ptx_legacy.mma("m16n8k16", "row", "col", "{ptx}", "{ptx}", "fp32", '
                    f"{fa}.data, {mi * A_ELEMS}, {fb}.data, {nj * B_ELEMS}, "
                    f'{acc}.data, {(mi * t.warp_n + nj) * C_ELEMS}, False, dtype="float32"))'
                )

    def row_loadable(self, r: Ref, t: MmaTiling, padded_rows: bool) -> bool:
        """Whether ``ldmatrix`` can load fragments of operand ``r``: a shared tile of its own (no view) in the
        MMA dtype, on the GPU, every 8-element run of a row 16-byte aligned (arena tiles start at multiples of 16
        bytes, TVM aligns static ``__shared__`` arrays to 64): rows of whole runs, no swizzle. A padded tile of
        A rows would read past the tile."""
        e = self.e
        if not (e.gpu and e.choice.runs) or padded_rows or not e.needs_buffer(r):
            return False
        if e.sc.comps != 1 or not row_operand(e.binfo, e.nodes, r, t) or e.buf_dtype(r) != t.dtype:
            return False
        if e.layouts.get(r, Layout()).swizzle:
            return False
        return e.buf_tile_shape(r)[-1] * dtype_bytes(t.dtype) % ROW_BYTES == 0

    def ldmatrix(self, t: MmaTiling, frag: str, at: int, r: Ref, idx: list[Ix], n: int, trans: bool) -> None:
        """``ldmatrix`` of ``n`` 8 x 8 matrices of tile ``r`` into ``frag[at:]``; this lane's row starts at
        element ``idx``."""
        e = self.e
        e.barriers.reads.add(r)
        e.recorder.note_rows(r, idx, n, ROW_BYTES // dtype_bytes(t.dtype))
        e.row_loads.add(r)
        flat = Ix()
        for i, size in zip(e.staged_index(r, idx), e.buf_tile_shape(r), strict=True):
            flat = flat * size + i
        src = note = e.buffers[r]
        if e.arena:  # TVM's access_ptr must name the allocation's type: the arena's, in its elements
            src, flat = (
                e.arena_name,
                _scaled(flat * dtype_bytes(t.dtype) + e.memory.offset(r), dtype_bytes(e.arena_dtype)),
            )
        e.w.line(
            f'T.evaluate(T.ptx_legacy.ldmatrix({trans}, {n}, ".b16", {frag}.data, {at}, '
            f'{src}.access_ptr("r"), {flat}, dtype="{t.dtype}"))'
            + (f"  # reads {note}" if src != note else "")
        )

    def _scalar_mmas(self, t: MmaTiling, acc: str, a: Ref, b: Ref, wt: Ix, batch: list[Ix], kc: Ix) -> None:
        """One k chunk by the MMA's scalar semantics: each of this lane's accumulators adds 16 products."""
        e, w = self.e, self.e.w
        lane, _ = lane_and_warp(e.nt)
        i0, j0 = self.origin(t, wt)
        ab = broadcast_index(batch, e.tile(a).shape[:-2])
        bb = broadcast_index(batch, e.tile(b).shape[:-2])
        with w.loop(w.fresh("k"), MMA_K) as kk:
            for r in range(t.regs):
                mi, nj, c = t.slot_tile(r)
                row, col = c_element(lane, Ix.of(c))
                i = i0 + mi * MMA_M + row
                guard = row_guard(t, i)
                with w.block(f"if {guard[0]}:") if guard else nullcontext():
                    av = self.rounded(e.read(a, ab + [i, kc * MMA_K + kk]), t)
                    bv = self.rounded(e.read(b, bb + [kc * MMA_K + kk, j0 + nj * MMA_N + col]), t)
                    e.mac(acc, Ix.of(r), av, bv)

    def rounded(self, v: Val, t: MmaTiling) -> Val:
        """A float operand rounded to the MMA dtype as the fragment load rounds it (float32 to bfloat16); the
        field twin's residues are exact, nothing to round."""
        if self.e.sc.field or v.dtype == t.dtype:
            return v
        return to_mma_dtype(v, t, self.e.gpu)


def to_mma_dtype(v: Val, t: MmaTiling, gpu: bool) -> Val:
    """``v`` converted to the MMA dtype as a fragment holds it. TVM's llvm build drops a float32 -> bfloat16 ->
    float32 round trip, so the llvm twin rounds by the bits instead (the same value, as float32)."""
    if gpu or t.dtype != "bfloat16":
        return Val((f'T.Cast("{t.dtype}", {v.comps[0]})',), t.dtype)
    return Val((bfloat16_rounded_text(f'T.Cast("float32", {v.comps[0]})'),), "float32")


def row_operand(binfo: BlockInfo, nodes: tuple[BlockNode, ...], r: Ref, t: MmaTiling) -> bool:
    """Whether operand ``r`` of a tensor-core matmul is a tile of its own (not a reshape or repeat view) in the
    MMA dtype, which ``ldmatrix`` may load (the emitter also needs its shared layout to keep rows aligned)."""
    node = nodes[r.node]
    if isinstance(node, BlockOp) and node.op in VIEW_OPS:
        return False
    return binfo.nodes[r.node][r.out].dtype == t.dtype


def _scaled(x: Ix, k: int) -> Ix:
    """``x // k`` for an ``x`` whose every coefficient and constant ``k`` divides (a 16-byte aligned offset)."""
    assert all(c % k == 0 for _, c in x.terms) and x.const % k == 0, (x, k)
    return Ix(tuple((a, c // k) for a, c in x.terms), x.const // k)


def mma_tilings(e: BlockEmitter) -> dict[int, MmaTiling]:
    """The block matmuls of ``e``'s kernel that run on tensor cores, with the warps its thread plan chose
    (:func:`block_mma_tilings`)."""
    return block_mma_tilings(e.info, e.binfo, e.nodes, e.nt, dict(e.choice.mma_warps))


def block_mma_tilings(
    info: GraphInfo, binfo: BlockInfo, nodes: tuple[BlockNode, ...], threads: int, warps: Mapping[int, int]
) -> dict[int, MmaTiling]:
    """The warp layout of every block matmul of a block graph that runs on tensor cores (the one source of it:
    the code generator and the cost models read it here): block matmul ``j`` on ``warps[j]`` warps (default:
    all of the block's ``threads``), its warp tile by :func:`mma_tiling`. None when the graph computes in
    float64 (the MMA accumulates in float32), in the field twin too, so that it indexes as the float kernel
    does."""
    if any(t.dtype == "float64" for outs in info.nodes for t in outs):
        return {}
    tilings = {
        j: mma_tiling(binfo, n, j, threads, warps.get(j))
        for j, n in enumerate(nodes)
        if isinstance(n, BlockOp) and n.op is Op.MATMUL
    }
    return {j: t for j, t in tilings.items() if t is not None}


def fused_thread_graphs(e: BlockEmitter) -> dict[int, int]:
    """Tensor-core matmul -> the thread graph that runs on its accumulators in registers, in the MMA phase.

    A thread graph whose every input is the matmul's result, read element for element (no broadcast), and
    which is that result's only reader, gets each accumulator (rounded to the result's dtype, as its shared
    tile would hold it) without the round trip through shared memory and the barrier between the phases.
    """
    fused: dict[int, int] = {}
    for j in e.mma:
        readers = e.consumers.get(Ref(j), [])
        if len(readers) != 1 or not isinstance(e.nodes[readers[0]], ThreadGraph):
            continue
        t = readers[0]
        node = e.nodes[t]
        assert isinstance(node, ThreadGraph)
        shape = e.tile(Ref(j)).shape
        # An accumulator reading the thread graph's output element by element keeps its elements in registers
        # by the element slots of the default thread mapping; the MMA layout hands out other slots (on a subset
        # of the warps, more per thread), so such a graph runs in a phase of its own. (Fused, the full-mode
        # choice for mha_specdec_papers, whose accumulator sums exp(S) tiles, read uninitialised slots:
        # NaN.)
        feeds_accumulator = any(isinstance(e.nodes[c], Accumulator) for c in e.consumers.get(Ref(t), []))
        if (
            all(r == Ref(j) for r in node.inputs)
            and all(x.shape == shape for x in e.binfo.threads[t])
            and e.phase_of[t] == e.phase_of[j]
            and not feeds_accumulator
        ):
            fused[j] = t
    return fused


__all__ = [
    "MmaEmitter",
    "fused_thread_graphs",
    "mma_tilings",
    "MmaTiling",
    "a_element",
    "acc_budget",
    "block_mma_tilings",
    "b_element",
    "c_element",
    "ldmatrix_row",
    "fits_mma",
    "lane_group",
    "lane_and_warp",
    "warp_tile",
    "warp_tiling",
    "mma_tiling",
    "row_operand",
    "slot_coords",
]

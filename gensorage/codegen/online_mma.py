"""The online-softmax P·V on tensor cores (FlashAttention-2's output accumulator; semantics in
:mod:`gensorage.ugraph.online_softmax`).

A ``softmax_matmul`` accumulator whose value tile is 16-bit and whose shapes fit m16n8k16 (result rows a
multiple of 8, columns of 8, keys of 16: :func:`~gensorage.codegen.block_mma.fits_mma`'s rule) in a block of whole
warps runs its per-iteration step as a warp-level MMA (:func:`online_mma_tilings`); otherwise the CUDA-core
phase of :mod:`gensorage.codegen.block_accumulators` runs it. The result ``o [batch, m, n]`` is laid out as a
block matmul's (:mod:`gensorage.codegen.block_mma`: warp tiles, steps, fragment slots; the warp tile of
:func:`online_tiling`, whole rows per warp where they fit), and the accumulator
keeps its float32 fragments across the loop in those slots, as a matmul's loop accumulator does. Per iteration
and warp tile, for the ``2 warp_m`` rows a lane's fragments touch (``g`` and ``g + 8`` of each MMA row tile)::

    m' = rowmax(s)                 the 4 lanes of a row each take every 4th key, two shuffles and a broadcast
    m' = m' if it == 0 else max(m, m')
    o  = 0 if it == 0 else o · exp(m − m')       each fragment row rescaled before the add
    o += P · v,   P = exp(s − m')  (MMA's A fragments, computed in registers from the score tile; P ≤ 1, so
                                    it is held in v's 16-bit dtype without overflow)
    m  = m'

The row maximum starts at the max identity of :meth:`~gensorage.codegen.scalar.Scalar.initial` (the lowest
finite float), so a masked row (all -inf) has terms exp(-inf − lowest) = 0 and rescales exp(lowest − m') ∈
{0, 1}: no NaN. A padded MMA row (past ``m``) reads no score and multiplies as zeros. The running maximum of
row tile ``r`` of a step sits in register ``step * regs + r`` of the accumulator's max array (the value array
uses all ``regs``).

A ``softmax_sum`` over the same scores (:func:`online_sums`) runs in this phase: each lane adds its A fragments'
P (float32, before the convert) for its rows, two shuffles and a broadcast combine the row's 4 lanes, and
``l = part if it == 0 else l · exp(m − m') + part`` with the same rescale; the first lane of each row's group,
in the warp tiles of the first columns, keeps it (:class:`~gensorage.codegen.element_maps.RowFragments`).

The llvm twin runs the same warps, steps and slots: each lane's row maximum over all the keys (max is exact, so
the same value as the shuffles'), P rounded to the MMA dtype as the fragment holds it, and the MMA's scalar
semantics (per k chunk, each accumulator adds its 16 products in k order); a row sum adds the row's keys in
order (the GPU's order is the lanes' quarters, then the shuffle tree). The field twin has none (the rescale
needs exp(a + b) = exp(a)·exp(b)).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING

from gensorage.codegen.block_mma import (
    A_ELEMS,
    MAX_ACC_REGS,
    MMA_K,
    MMA_M,
    MMA_N,
    REGISTERS_PER_BLOCK,
    WARP,
    MmaTiling,
    a_element,
    c_element,
    lane_and_warp,
    lane_group,
    row_guard,
    to_mma_dtype,
    warp_tile,
    warp_tiling,
)
from gensorage.codegen.block_reduce import FULL_MASK
from gensorage.codegen.scalar import Val
from gensorage.codegen.tensor_core import MMA_DTYPES
from gensorage.codegen.tir_text import Ix, broadcast_index, tvm_float, unravel
from gensorage.opset import Op
from gensorage.ugraph.ir import Accumulator, BlockNode, Ref
from gensorage.ugraph.shapes import BlockInfo, GraphInfo

if TYPE_CHECKING:
    from gensorage.codegen.block_emitter import BlockEmitter

GROUP = 4  # lanes sharing an accumulator row in the m16n8k16 C layout


def online_mma_tilings(
    info: GraphInfo, binfo: BlockInfo, nodes: tuple[BlockNode, ...], threads: int
) -> dict[int, MmaTiling]:
    """The warp layout of every ``softmax_matmul`` accumulator of a block graph whose P·V runs on tensor cores
    (the one source of it: the code generator and the cost model read it here), on all the block's warps.
    None when the graph computes in float64, as for block matmuls."""
    if threads % WARP or any(t.dtype == "float64" for outs in info.nodes for t in outs):
        return {}
    tilings: dict[int, MmaTiling] = {}
    for j, n in enumerate(nodes):
        if not (isinstance(n, Accumulator) and n.kind == "softmax_matmul" and n.values is not None):
            continue
        s = binfo.nodes[n.input.node][n.input.out]
        v = binfo.nodes[n.values.node][n.values.out]
        out = binfo.nodes[j][0].shape
        if v.dtype not in MMA_DTYPES or out[-2] % 8 or out[-1] % MMA_N or s.shape[-1] % MMA_K:
            continue
        tilings[j] = online_tiling(out, s.shape[-1], v.dtype, threads)
    return tilings


def online_tiling(out: tuple[int, ...], keys: int, dtype: str, threads: int) -> MmaTiling:
    """The warp tiling of an online P·V into ``out``: FlashAttention-2's split of the rows over the warps (a
    warp tile of 16 rows by every column) when its accumulators fit (at most :data:`MAX_ACC_REGS`, and half
    a thread's share of the block's registers: 64 at head dim 128, as FlashAttention-2 keeps), so that each P
    element and row maximum is computed by one warp only; else a block matmul's (:func:`warp_tiling`), whose
    warp tiles side by side each compute their rows' P again."""
    warps = threads // WARP
    whole = MmaTiling(tuple(out[:-2]), out[-2], out[-1], keys, warps, 1, out[-1] // MMA_N, dtype, warps)
    fits = whole.slots <= min(MAX_ACC_REGS, REGISTERS_PER_BLOCK // threads // 2)
    return whole if fits else warp_tiling(out, keys, dtype, threads, warps)


def online_sums(nodes: tuple[BlockNode, ...], tilings: dict[int, MmaTiling]) -> dict[int, int]:
    """``softmax_sum`` accumulator -> the tensor-core P·V over the same scores, whose phase also keeps its row
    sums (sharing the row maxima and the exps)."""
    sums: dict[int, int] = {}
    for j, n in enumerate(nodes):
        if isinstance(n, Accumulator) and n.kind == "softmax_sum":
            pv = next((o for o in tilings if nodes[o].input == n.input), None)  # type: ignore[union-attr]
            if pv is not None:
                sums[j] = pv
    return sums


def row_slot_coords(t: MmaTiling, threads: int, slot: Ix) -> tuple[list[Ix], list[str]]:
    """Row sum (batch..., i, 0) held in this thread's ``slot`` (step, row tile), and the condition for this lane
    to hold it: the first lane of the row's group, in a warp tile of the first columns."""
    step, r = unravel(slot, (t.steps, 2 * t.warp_m))
    wt, conds = warp_tile(t, threads, step)
    bt, ti, tj = unravel(wt, t.grid)
    g, q = lane_group(lane_and_warp(threads)[0])
    i = ti * (MMA_M * t.warp_m) + r.floordiv(2, 2 * t.warp_m) * MMA_M + g + r.mod(2, 2 * t.warp_m) * 8
    conds = conds + [f"{q} == 0"] + ([f"{tj} == 0"] if t.grid[2] > 1 else [])
    return (unravel(bt, t.batch) if t.batch else []) + [i, Ix()], conds + row_guard(t, i)


class OnlineMmaEmitter:
    """The tensor-core online step of one :class:`~gensorage.codegen.block_emitter.BlockEmitter`."""

    def __init__(self, e: BlockEmitter) -> None:
        self.e = e

    def phase(self, j: int, node: Accumulator, t: MmaTiling) -> None:
        """One online step of accumulator ``j`` (see the module docstring)."""
        e, sc, w = self.e, self.e.sc, self.e.w
        assert node.values is not None
        with e.barrier_phase(), e.threads():
            acc = e.acc_buffer(t.regs)
            mx = e.acc_buffer(2 * t.warp_m)
            sums = [s for s, pv in e.online_sums.items() if pv == j]
            part = e.acc_buffer(2 * t.warp_m) if sums else ""  # this step's row sums of P
            frags = e.mma_emitter.fragments(t) if e.gpu else None
            with w.loop(w.fresh("ws"), t.steps) as step:
                wt, conds = warp_tile(t, e.nt, step)
                with w.block(f"if {' and '.join(conds)}:") if conds else nullcontext():
                    bt = unravel(wt, t.grid)[0]
                    batch = unravel(bt, t.batch) if t.batch else []
                    sb = broadcast_index(batch, e.tile(node.input).shape[:-2])
                    vb = broadcast_index(batch, e.tile(node.values).shape[:-2])
                    i0, j0 = e.mma_emitter.origin(t, wt)
                    self._maxima(j, node.input, t, mx, sb, i0, step)
                    scales = self._rescale(j, t, acc, mx, step)
                    for r in range(2 * t.warp_m if sums else 0):
                        e.store(part, str(r), sc.zero(), sc.acc_dtype)
                    with w.loop(w.fresh("kc"), t.k // MMA_K) as kc:
                        if frags is None:
                            self._scalar_mmas(t, acc, mx, node, sb, vb, i0, j0, kc)
                        else:
                            self._p_fragments(t, frags[0], mx, node.input, sb, i0, kc, part if sums else None)
                            e.mma_emitter.b_fragments(t, frags[1], node.values, vb, j0, kc)
                            e.mma_emitter.issue(t, acc, frags)
                    if sums:
                        self._row_sums(t, part, mx, node.input, sb, i0)
                    for jl in sums:
                        for r in range(2 * t.warp_m):
                            at = e.accs.reg(step * 2 * t.warp_m + r)
                            new = sc.plus(
                                sc.product(sc.load(f"a{jl}", at, sc.acc_dtype), scales[r]),
                                sc.load(part, str(r), sc.acc_dtype),
                            )
                            w.line(
                                f"{sc.at(f'a{jl}', 0, at)} = T.if_then_else(it == 0, {part}[{r}], {new.comps[0]})"
                            )
                    for r in range(t.regs):
                        e.store(
                            f"a{j}",
                            e.accs.reg(step * t.regs + r),
                            e.sc.load(acc, str(r), sc.acc_dtype),
                            sc.acc_dtype,
                        )

    def _row(self, t: MmaTiling, i0: Ix, r: int) -> Ix:
        """Result row of this lane's row tile ``r`` (MMA row tile ``r // 2``, upper or lower 8 rows)."""
        g, _ = lane_group(lane_and_warp(self.e.nt)[0])
        return i0 + (r // 2) * MMA_M + g + 8 * (r % 2)

    def _maxima(self, j: int, s: Ref, t: MmaTiling, mx: str, sb: list[Ix], i0: Ix, step: Ix) -> None:
        """``mx[r]``: the new running maximum of each of this lane's rows (the tile's, then the old one's)."""
        e, sc, w = self.e, self.e.sc, self.e.w
        _, q = lane_group(lane_and_warp(e.nt)[0])
        keys = t.k
        for r in range(2 * t.warp_m):
            i = self._row(t, i0, r)
            cur = sc.load(mx, str(r), sc.acc_dtype)
            e.store(mx, str(r), sc.initial("max"), sc.acc_dtype)
            # On the GPU each of the row's 4 lanes takes every 4th key, then two shuffles combine them.
            share, key = (keys // GROUP, lambda k: k * GROUP + q) if e.gpu else (keys, lambda k: k)
            with w.loop(w.fresh("k"), share) as k:
                score = self._score(s, t, sb, i, key(k))
                e.store(mx, str(r), sc.combine("max", cur, score), sc.acc_dtype)
            if e.gpu:
                for d in (2, 1):
                    other = Val(
                        (f"T.tvm_warp_shuffle_down(T.uint32({FULL_MASK}), {mx}[{r}], {d}, {GROUP}, {WARP})",),
                        sc.acc_dtype,
                    )
                    e.store(mx, str(r), sc.combine("max", cur, other), sc.acc_dtype)
                w.line(
                    f"{mx}[{r}] = T.tvm_warp_shuffle(T.uint32({FULL_MASK}), {mx}[{r}], 0, {GROUP}, {WARP})"
                )
            old = sc.load(f"m{j}", e.accs.reg(step * t.regs + r), sc.acc_dtype)
            grown = sc.combine("max", old, cur)
            w.line(f"{mx}[{r}] = T.if_then_else(it == 0, {mx}[{r}], {grown.comps[0]})")

    def _score(self, s: Ref, t: MmaTiling, sb: list[Ix], i: Ix, k: Ix) -> Val:
        """Score ``(i, k)``, in float32; the lowest float on a padded row (no read)."""
        sc = self.e.sc
        v = self.e.read(s, sb + [i, k])
        guard = row_guard(t, i)
        if not guard:
            return v
        low = self.e.sc.initial("max")
        return Val(
            (f"T.if_then_else({guard[0]}, {self.e.sc.store(v, sc.acc_dtype)[0]}, {low.comps[0]})",),
            sc.acc_dtype,
        )

    def _rescale(self, j: int, t: MmaTiling, acc: str, mx: str, step: Ix) -> list[Val]:
        """``acc``: the kept fragments times exp(m − m') per row (0 on the first iteration); then m = m'.
        Returns each row's exp(m − m')."""
        e, sc, w = self.e, self.e.sc, self.e.w
        scales = []
        for r in range(2 * t.warp_m):
            old = sc.load(f"m{j}", e.accs.reg(step * t.regs + r), sc.acc_dtype)
            diff = sc.op(w, Op.SUB, (), [old, sc.load(mx, str(r), sc.acc_dtype)])
            scale = sc.op(w, Op.EXP, (), [diff]).comps[0]  # the first iteration reads no running max
            zero = tvm_float(0.0, sc.acc_dtype)
            scales.append(e.temp(Val((f"T.if_then_else(it == 0, {zero}, {scale})",), sc.acc_dtype)))
        for x in range(t.regs):
            mi, _, c = t.slot_tile(x)
            kept = sc.load(f"a{j}", e.accs.reg(step * t.regs + x), sc.acc_dtype)
            scaled = sc.product(kept, scales[2 * mi + c // 2])
            w.line(f"{acc}[{x}] = T.if_then_else(it == 0, {tvm_float(0.0, sc.acc_dtype)}, {scaled.comps[0]})")
        for r in range(2 * t.warp_m):
            e.store(f"m{j}", e.accs.reg(step * t.regs + r), sc.load(mx, str(r), sc.acc_dtype), sc.acc_dtype)
        return scales

    def _p(self, t: MmaTiling, s: Ref, sb: list[Ix], i: Ix, k: Ix, m: Val) -> Val:
        """P at ``(i, k)`` = exp(s − m') in float32; 0 on a padded row."""
        sc, w = self.e.sc, self.e.w
        p = sc.op(w, Op.EXP, (), [sc.op(w, Op.SUB, (), [self._score(s, t, sb, i, k), m])]).comps[0]
        guard = row_guard(t, i)
        if guard:
            p = f"T.if_then_else({guard[0]}, {p}, {tvm_float(0.0, sc.acc_dtype)})"
        return Val((p,), sc.acc_dtype)

    def _rounded(self, p: Val, t: MmaTiling) -> Val:
        """P as the A fragment holds it: in the MMA dtype."""
        return to_mma_dtype(p, t, self.e.gpu)

    def _p_fragments(
        self, t: MmaTiling, fa: str, mx: str, s: Ref, sb: list[Ix], i0: Ix, kc: Ix, part: str | None
    ) -> None:
        """This lane's A fragments of k chunk ``kc``: P computed in registers from the score tile (and added,
        in float32, to ``part``, the lane's share of its rows' sums, when a row sum is kept)."""
        e, sc = self.e, self.e.sc
        lane, _ = lane_and_warp(e.nt)
        for mi in range(t.warp_m):
            for x in range(A_ELEMS):
                row, col = a_element(lane, x)
                r = 2 * mi + x // 2 % 2
                m = sc.load(mx, str(r), sc.acc_dtype)
                p = self._p(t, s, sb, i0 + mi * MMA_M + row, kc * MMA_K + col, m)
                if part is not None:
                    p = e.temp(p)
                    e.store(part, str(r), sc.plus(sc.load(part, str(r), sc.acc_dtype), p), sc.acc_dtype)
                e.store(fa, str(mi * A_ELEMS + x), self._rounded(p, t), t.dtype)

    def _row_sums(self, t: MmaTiling, part: str, mx: str, s: Ref, sb: list[Ix], i0: Ix) -> None:
        """``part[r]``: the sum of P over row tile ``r``'s keys. On the GPU the 4 lanes of a row added their
        fragments' quarter of the keys; two shuffles and a broadcast combine them. The llvm twin adds the row's
        keys in order (another order of float32 additions)."""
        e, sc, w = self.e, self.e.sc, self.e.w
        for r in range(2 * t.warp_m):
            cur = sc.load(part, str(r), sc.acc_dtype)
            if e.gpu:
                for d in (2, 1):
                    other = Val(
                        (
                            f"T.tvm_warp_shuffle_down(T.uint32({FULL_MASK}), {part}[{r}], {d}, {GROUP}, {WARP})",
                        ),
                        sc.acc_dtype,
                    )
                    e.store(part, str(r), sc.plus(cur, other), sc.acc_dtype)
                w.line(
                    f"{part}[{r}] = T.tvm_warp_shuffle(T.uint32({FULL_MASK}), {part}[{r}], 0, {GROUP}, {WARP})"
                )
                continue
            i = self._row(t, i0, r)
            with w.loop(w.fresh("k"), t.k) as k:
                p = self._p(t, s, sb, i, k, sc.load(mx, str(r), sc.acc_dtype))
                e.store(part, str(r), sc.plus(cur, p), sc.acc_dtype)

    def _scalar_mmas(
        self,
        t: MmaTiling,
        acc: str,
        mx: str,
        node: Accumulator,
        sb: list[Ix],
        vb: list[Ix],
        i0: Ix,
        j0: Ix,
        kc: Ix,
    ) -> None:
        """One k chunk by the MMA's scalar semantics (the llvm twin)."""
        e, sc, w = self.e, self.e.sc, self.e.w
        assert node.values is not None
        lane, _ = lane_and_warp(e.nt)
        with w.loop(w.fresh("k"), MMA_K) as kk:
            for x in range(t.regs):
                mi, nj, c = t.slot_tile(x)
                row, col = c_element(lane, Ix.of(c))
                i = i0 + mi * MMA_M + row
                guard = row_guard(t, i)
                with w.block(f"if {guard[0]}:") if guard else nullcontext():
                    m = e.sc.load(mx, str(2 * mi + c // 2), sc.acc_dtype)
                    p = self._rounded(self._p(t, node.input, sb, i, kc * MMA_K + kk, m), t)
                    v = e.mma_emitter.rounded(
                        e.read(node.values, vb + [kc * MMA_K + kk, j0 + nj * MMA_N + col]), t
                    )
                    e.mac(acc, Ix.of(x), p, v)


__all__ = ["OnlineMmaEmitter", "online_mma_tilings", "online_sums", "online_tiling", "row_slot_coords"]

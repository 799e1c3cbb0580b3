"""The CUDA-core matmuls of a graph-defined kernel: one thread per output element, or the constructor's register
tiling (:mod:`gensorage.construction.block_threads`): per thread a T0 tile of accumulators, T1 tiles walked in
turn. Block matmuls that fit tensor cores take :mod:`gensorage.codegen.block_mma` instead."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING

from gensorage.codegen.tir_text import Ix, broadcast_index, unravel, unroll
from gensorage.construction.block_threads import MatmulTiling
from gensorage.errors import UnsupportedOpError
from gensorage.ugraph.ir import BlockOp, Ref
from gensorage.ugraph.shapes import BlockInfo

if TYPE_CHECKING:
    from gensorage.codegen.block_emitter import BlockEmitter


class MatmulEmitter:
    """The matmul phases of one :class:`~gensorage.codegen.block_emitter.BlockEmitter`."""

    def __init__(self, e: BlockEmitter) -> None:
        self.e = e

    def cyclic(self, j: int, node: BlockOp) -> None:
        """One thread per output element (cyclic), the whole inner dim in one register."""
        a, b = node.inputs
        kdim = self.e.tile(a).shape[-1]
        with self.e.threads(), self.e.elements(self.e.tile(Ref(j)).shape) as (idx, slot):
            acc = self.e.acc_buffer(1)
            self.e.store(acc, "0", self.e.sc.zero(), self.e.sc.acc_dtype)
            with self.e.w.loop(self.e.w.fresh("k"), kdim) as kk:
                av = self.e.read(a, broadcast_index(idx[:-2], self.e.tile(a).shape[:-2]) + [idx[-2], kk])
                bv = self.e.read(b, broadcast_index(idx[:-2], self.e.tile(b).shape[:-2]) + [kk, idx[-1]])
                self.e.mac(acc, Ix(), av, bv)
            self.e.emit_value(
                Ref(j), idx, self.e.sc.reduced(self.e.sc.load(acc, "0", self.e.sc.acc_dtype)), slot
            )

    def tiled(self, j: int, node: BlockOp, t: MatmulTiling) -> None:
        """The constructor's register tiling: per thread a T0 tile of accumulators, T1 tiles walked in turn."""
        a, b = node.inputs
        batch = self.e.tile(Ref(j)).shape[:-2]
        regs = math.prod(t.t0)
        with self.e.threads():
            acc = self.e.acc_buffer(regs)
            with (
                self.e.w.loop(self.e.w.fresh("sb"), t.steps[0]) as sb,
                self.e.w.loop(self.e.w.fresh("si"), t.steps[1]) as si,
                self.e.w.loop(self.e.w.fresh("sj"), t.steps[2]) as sj,
            ):
                steps = [sb, si, sj]
                with self.e.w.loop(self.e.w.fresh("r"), regs, unroll(regs)) as r:
                    self.e.store(acc, str(r), self.e.sc.zero(), self.e.sc.acc_dtype)
                with self.e.w.loop(self.e.w.fresh("k"), t.k) as kk, self.register_tile(t, steps) as (r, g):
                    bi = batch_index(g[0], batch)
                    av = self.e.read(a, broadcast_index(bi, self.e.tile(a).shape[:-2]) + [g[1], kk])
                    bv = self.e.read(b, broadcast_index(bi, self.e.tile(b).shape[:-2]) + [kk, g[2]])
                    self.e.mac(acc, r, av, bv)
                with self.register_tile(t, steps) as (r, g):
                    slot = ((sb * t.steps[1] + si) * t.steps[2] + sj) * regs + r
                    v = self.e.sc.reduced(self.e.sc.load(acc, str(r), self.e.sc.acc_dtype))
                    self.e.emit_value(Ref(j), batch_index(g[0], batch) + [g[1], g[2]], v, slot)

    def thread_coords(self, t: MatmulTiling) -> list[Ix]:
        """This thread's position (b, i, j) in the tiling's thread grid; the last axis varies fastest."""
        th = t.threads_per_axis
        tx = Ix.var("tx")
        return [
            tx.floordiv(th[1] * th[2], self.e.nt).mod(th[0], -(-self.e.nt // (th[1] * th[2]))),
            tx.floordiv(th[2], self.e.nt).mod(th[1], -(-self.e.nt // th[2])),
            tx.mod(th[2], self.e.nt),
        ]

    def tile_coords(self, t: MatmulTiling, steps: list[Ix], regs: list[Ix]) -> tuple[list[Ix], list[str]]:
        """Output coordinates (b, i, j) of register ``regs`` in step ``steps`` of this thread, and their guards.

        Along an axis a T1 tile is laid out ``[vthreads, threads, T0 / vthreads]``: register ``r`` is in chunk
        ``r // c`` (``c = T0 / vthreads``), at ``chunk * threads * c + thread * c + r % c``.
        """
        th = t.threads_per_axis
        coords = self.thread_coords(t)
        glob, conds = [], []
        for ax in range(3):
            chunk = t.t0[ax] // t.vthreads[ax]
            pos = (
                regs[ax].floordiv(chunk, t.t0[ax]) * (th[ax] * chunk)
                + coords[ax] * chunk
                + regs[ax].mod(chunk, t.t0[ax])
            )
            gl = steps[ax] * t.t1[ax] + pos
            if th[ax] * t.t0[ax] > t.t1[ax]:
                conds.append(f"{pos} < {t.t1[ax]}")
            if t.steps[ax] * t.t1[ax] > t.extents[ax]:
                conds.append(f"{gl} < {t.extents[ax]}")
            glob.append(gl)
        return glob, conds

    @contextmanager
    def register_tile(self, t: MatmulTiling, steps: list[Ix]) -> Iterator[tuple[Ix, list[Ix]]]:
        """Loops over a thread's register tile; yields (register index, output coords (b, i, j)), guarded."""
        names = [self.e.w.fresh(p) for p in ("rb", "ri", "rj")]
        with (
            self.e.w.loop(names[0], t.t0[0], unroll(t.t0[0])) as rb,
            self.e.w.loop(names[1], t.t0[1], unroll(t.t0[1])) as ri,
            self.e.w.loop(names[2], t.t0[2], unroll(t.t0[2])) as rj,
        ):
            glob, conds = self.tile_coords(t, steps, [rb, ri, rj])
            r = rb * (t.t0[1] * t.t0[2]) + ri * t.t0[2] + rj
            with self.e.w.block(f"if {' and '.join(conds)}:") if conds else nullcontext():
                yield r, glob


def matmul_dims(binfo: BlockInfo, node: BlockOp, j: int) -> tuple[int, int, int, int]:
    """(batch, m, n, k) of block matmul node ``j``: its output tile and inner dim, batch dims flattened."""
    a = binfo.nodes[node.inputs[0].node][node.inputs[0].out].shape
    out = binfo.nodes[j][0].shape
    return math.prod(out[:-2]), out[-2], out[-1], a[-1]


def batch_index(flat: Ix, batch: tuple[int, ...]) -> list[Ix]:
    """The batch coordinates of flat batch index ``flat`` (none without batch dims)."""
    return unravel(flat, batch) if batch else []


def check_tiling(t: MatmulTiling, threads: int) -> None:
    """A tiling must nest (``1 <= T0 <= T1 <= extent``, vthreads a power of two dividing T0) and fill the block."""
    for ax in range(3):
        t0, t1, e, v = t.t0[ax], t.t1[ax], t.extents[ax], t.vthreads[ax]
        if not 1 <= t0 <= t1 <= e or v < 1 or v & (v - 1) or t0 % v:
            raise UnsupportedOpError(
                f"matmul tiling {t.describe()} does not nest on axis {'bij'[ax]} "
                f"(T0={t0}, T1={t1}, extent={e}, vthreads={v})"
            )
    if t.threads != threads:
        raise UnsupportedOpError(f"matmul tiling needs {t.threads} threads, the block has {threads}")


__all__ = ["MatmulEmitter", "batch_index", "check_tiling", "matmul_dims"]

"""The CPU twin of the wgmma matmul kernel (:mod:`gensorage.codegen.wgmma`): the same tiling on llvm.

The twin keeps what can be wrong without a GPU: the grid's tile order, the copies (which chunk each thread
moves, the zero fill outside the matrix, the clamped addresses), the 128-byte swizzled shared layout they
store, the ring of ``stages`` slots and which step each slot holds, the descriptors' per-step offsets, the
accumulator fragment layout and the write-back with its cast. Each ``wgmma.mma_async`` is replaced by its
semantics as the PTX ISA defines them: for every accumulator register of every thread, the 16 products of
its row of A and its column of B, each operand element read at the shared address the descriptor names
(start address, leading and stride byte offsets, K-major or MN-major canonical layout, then the 128-byte
swizzle of the address bits). The stores use the kernel's own layout functions and the reads only the
descriptor fields, so a layout the descriptors do not describe reads the wrong elements here too.
"""

from __future__ import annotations

from typing import Any

from gensorage.codegen.epilogue_expr import KernelEpilogue, with_extras
from gensorage.codegen.mma_bfloat16 import bfloat16_rounded
from gensorage.codegen.tensor_core import mma_dtype
from gensorage.codegen.wgmma import (
    A_DESC,
    ALIGN,
    ATOM,
    BLOCK_K,
    CHUNK,
    WARPGROUP,
    WG_K,
    WG_M,
    WgmmaTiles,
    _check,
    a_copy,
    a_offset,
    along,
    b_desc,
    b_source,
    b_tile,
    block_tile,
    fragment_row_col,
    operand_index,
    out_offset,
    shared_bytes,
    step_geometry,
    step_offsets,
)

ROW_BYTES = 128  # one row of a 128-byte swizzle atom
GROUP_ROWS = 8  # rows of a swizzle atom; the descriptor's stride offset steps over these


def swizzle_128b(address: Any) -> Any:
    """The 128-byte swizzle of a shared byte address: bits 4-6 (the 16-byte chunk) XOR bits 7-9 (the row)."""
    return address ^ (((address >> 7) & 7) << 4)


def k_major_address(start: Any, sbo: int, row: Any, k: Any) -> Any:
    """Byte address of element (row, k) of a K-major swizzled operand whose descriptor starts at ``start``
    (16-byte units): 8-row groups ``sbo`` units apart, each row 128 bytes of K."""
    return swizzle_128b(start * 16 + row // GROUP_ROWS * sbo * 16 + row % GROUP_ROWS * ROW_BYTES + k * 2)


def mn_major_address(start: Any, lbo: int, sbo: int, k: Any, col: Any) -> Any:
    """Byte address of element (k, col) of an MN-major swizzled operand: 64-column atoms ``lbo`` units apart,
    8-row (k) groups ``sbo`` units apart, each row 128 bytes of MN."""
    offset = col // ATOM * lbo * 16 + k // GROUP_ROWS * sbo * 16 + k % GROUP_ROWS * ROW_BYTES
    return swizzle_128b(start * 16 + offset + col % ATOM * 2)


def b_address(start: Any, lbo: int, sbo: int, k: Any, col: Any, k_major_b: bool) -> Any:
    """Byte address of B's element (k, col) as its descriptor names it: MN-major (read with wgmma's transpose
    immediate), or K-major (no transpose: the layout of A, n for A's rows)."""
    return k_major_address(start, sbo, col, k) if k_major_b else mn_major_address(start, lbo, sbo, k, col)


def wgmma_twin(
    a: tuple[int, ...],
    b: tuple[int, ...],
    out: tuple[int, ...],
    dtype: str,
    out_dtype: str,
    tiles: WgmmaTiles,
    modulus: int | None = None,
    k_major_b: bool = False,
    epi: KernelEpilogue | None = None,
    b_dtype: str | None = None,
) -> Any:
    """The twin PrimFunc ``main(A, B, C)`` of :func:`gensorage.codegen.wgmma.wgmma_matmul` (same arguments),
    for the llvm target. Its operand dtype may be any float type (the twin has no MMA dtype to satisfy); with
    ``b_dtype`` (a float32 operand with a 16-bit one) the ring holds their MMA dtype and the copies convert to
    it, as the kernel's do. An epilogue ``epi`` runs on each accumulator before the cast (or in field mode,
    after the ``mod``), its extra operands following B.

    With ``modulus`` it is the field twin: int64 residues, each product reduced mod ``modulus``, int64
    accumulators and a ``mod modulus`` write-back (``dtype`` and ``out_dtype`` int64)."""
    batch = out[0] if len(out) == 3 else 0
    m, n, k = out[-2], out[-1], a[-1]
    _check(tiles, "float16", (m, n, k))
    dtypes = (dtype, b_dtype or dtype)
    return _build(a, b, out, dtypes, out_dtype, tiles, batch, (m, n, k), modulus, k_major_b, epi)


def _build(
    a_shape: tuple[int, ...],
    b_shape: tuple[int, ...],
    c_shape: tuple[int, ...],
    dtypes: tuple[str, str],
    out_dtype: str,
    t: WgmmaTiles,
    batch: int,
    mnk: tuple[int, int, int],
    modulus: int | None,
    k_major_b: bool,
    epi: KernelEpilogue | None = None,
) -> Any:
    from tvm import tirx
    from tvm.script import tirx as T

    a_dtype, b_dtype = dtypes
    dtype = a_dtype if a_dtype == b_dtype else mma_dtype(a_dtype, b_dtype)  # what the ring holds
    assert dtype is not None
    m, n, k = mnk
    bm, bn, stages = t.block_m, t.block_n, t.stages
    threads, nacc = WARPGROUP * t.warpgroups, t.accumulators  # the threads that compute (no TMA producer)
    gm, gn, ktiles, a_elems, stage_elems, a_copies, b_copies = step_geometry(t, mnk, threads)
    ahead = t.ahead
    staged = t.staged and out_dtype == dtype and epi is None  # as the kernel stages it
    slots = (epi or KernelEpilogue((), ())).slots(field=modulus is not None)
    out_copies = bm * bn // CHUNK // threads
    ring_elems = (shared_bytes(t) - ALIGN) // 2
    lbo, sbo = A_DESC if k_major_b else b_desc(bn)
    b_chunk, b_place = b_tile(k_major_b, bn)
    a_batched, b_batched = len(a_shape) == 3, len(b_shape) == 3
    zero = T.Cast(dtype, 0)
    acc_dtype = "float32" if modulus is None else "int64"

    def ring(src: str, x: Any) -> Any:
        """An operand element as the ring holds it: converted to the MMA dtype, rounded as the GPU rounds."""
        return x if src == dtype else T.Cast(dtype, bfloat16_rounded(T.Cast("float32", x)))

    def term(x: Any, y: Any) -> Any:
        if modulus is None:
            return T.Cast("float32", x) * T.Cast("float32", y)
        return tirx.truncmod(x * y, tirx.const(modulus, "int64"))

    def finish(v: Any, extra: tuple[Any, ...] = (), ix: tuple[Any, ...] = ()) -> Any:
        if modulus is not None:
            v = tirx.truncmod(v, tirx.const(modulus, "int64"))
        if epi is not None:
            v = epi.value(v, extra, ix, modulus)
        return T.Cast(out_dtype, v) if modulus is None else v

    a_at, b_at, c_at = (operand_index(bool(b)) for b in (a_batched, b_batched, batch))

    @T.prim_func(private=True)
    def main(
        A: T.Buffer(a_shape, a_dtype),  # type: ignore[valid-type]  # noqa: N803
        B: T.Buffer(b_shape, b_dtype),  # type: ignore[valid-type]  # noqa: N803
        C: T.Buffer(c_shape, out_dtype),  # type: ignore[valid-type]  # noqa: N803
        E0: T.Buffer(*slots[0]),  # type: ignore[valid-type]  # noqa: N803
        E1: T.Buffer(*slots[1]),  # type: ignore[valid-type]  # noqa: N803
        E2: T.Buffer(*slots[2]),  # type: ignore[valid-type]  # noqa: N803
        E3: T.Buffer(*slots[3]),  # type: ignore[valid-type]  # noqa: N803
    ) -> None:
        T.func_attr({"tirx.noalias": True})
        buf = T.alloc_buffer((ring_elems,), dtype)  # the shared ring, at an aligned address 0
        acc = T.alloc_buffer((threads, nacc), acc_dtype)
        for bz, bx in T.grid(max(batch, 1), gm * gn):
            m0 = block_tile(bx, gm, gn)[0] * bm
            n0 = block_tile(bx, gm, gn)[1] * bn
            for step in T.serial(ktiles + ahead):
                # Step ``step``'s copies (the loop's first ``ahead`` steps are the kernel's prologue).
                if step < ktiles and t.tma:  # TMA: whole boxes, swizzled by address, zero outside the matrix
                    for row, col in T.grid(bm, BLOCK_K):
                        kc = step * BLOCK_K + col
                        at = (step % stages * stage_elems + row * ATOM + col) * 2
                        buf[swizzle_128b(at) // 2] = T.if_then_else(
                            m0 + row < m and kc < k,
                            ring(a_dtype, A[a_at(bz, T.min(m0 + row, m - 1), T.min(kc, k - 1))]),
                            zero,
                        )
                    for j, row, col in T.grid(bn // ATOM, BLOCK_K, ATOM):
                        kr, nc = step * BLOCK_K + row, n0 + j * ATOM + col
                        at = (
                            step % stages * stage_elems + a_elems + j * ATOM * BLOCK_K + row * ATOM + col
                        ) * 2
                        buf[swizzle_128b(at) // 2] = T.if_then_else(
                            kr < k and nc < n,
                            ring(b_dtype, B[b_at(bz, T.min(kr, k - 1), T.min(nc, n - 1))]),
                            zero,
                        )
                if step < ktiles and not t.tma:
                    for tx, c, e in T.grid(threads, a_copies, CHUNK):
                        row, col = a_copy(tx + c * threads)
                        kc = step * BLOCK_K + col
                        buf[step % stages * stage_elems + a_offset(row, col) + e] = T.if_then_else(
                            m0 + row < m and kc < k,
                            ring(a_dtype, A[a_at(bz, T.min(m0 + row, m - 1), T.min(kc, k - CHUNK) + e)]),
                            zero,
                        )
                    for tx, c, e in T.grid(threads, b_copies, CHUNK):
                        row, col = b_chunk(tx + c * threads)
                        kr = step * BLOCK_K + row
                        buf[step % stages * stage_elems + a_elems + b_place(row, col) + e] = T.if_then_else(
                            kr < k and n0 + col < n,
                            ring(b_dtype, B[along(b_source(b_at, bz, kr, n0 + col, k, n, k_major_b), e)]),
                            zero,
                        )
                if step == ahead - 1:
                    for tx, r in T.grid(threads, nacc):
                        acc[tx, r] = T.Cast(acc_dtype, 0)
                # The MMAs of step ``kt``, issued once its copies (``ahead`` steps earlier) are in.
                if step >= ahead - 1 and step - (ahead - 1) < ktiles:
                    kt = step - (ahead - 1)
                    for tx, kk, r, kq in T.grid(threads, BLOCK_K // WG_K, nacc, WG_K):
                        wg_row = tx // WARPGROUP * WG_M
                        row, col = fragment_row_col(tx % 32, tx % WARPGROUP // 32, r)
                        start_a = wg_row * ATOM * 2 // 16 + step_offsets(kt % stages, kk, stage_elems)[0]
                        start_b = a_elems * 2 // 16 + step_offsets(kt % stages, kk, stage_elems, k_major_b)[1]
                        acc[tx, r] = acc[tx, r] + term(
                            buf[k_major_address(start_a, A_DESC[1], row, kq) // 2],
                            buf[b_address(start_b, lbo, sbo, kq, col, k_major_b) // 2],
                        )
            if staged:  # the result through the ring's memory, copied out in 16-byte words
                for tx, r in T.grid(threads, nacc):
                    row = tx // WARPGROUP * WG_M + fragment_row_col(tx % 32, tx % WARPGROUP // 32, r)[0]
                    col = fragment_row_col(tx % 32, tx % WARPGROUP // 32, r)[1]
                    buf[out_offset(row, col, bn)] = finish(acc[tx, r])
                for tx, q, e in T.grid(threads, out_copies, CHUNK):
                    row = (tx + q * threads) // (bn // CHUNK)
                    col = (tx + q * threads) % (bn // CHUNK) * CHUNK
                    if m0 + row < m and n0 + col < n:
                        C[c_at(bz, m0 + row, n0 + col + e)] = buf[out_offset(row, col, bn) + e]
            else:
                for tx, r in T.grid(threads, nacc):
                    row = m0 + tx // WARPGROUP * WG_M + fragment_row_col(tx % 32, tx % WARPGROUP // 32, r)[0]
                    col = n0 + fragment_row_col(tx % 32, tx % WARPGROUP // 32, r)[1]
                    if row < m and col < n:
                        C[c_at(bz, row, col)] = finish(acc[tx, r], (E0, E1, E2, E3), c_at(bz, row, col))

    return with_extras(main, len(epi.extra) if epi else 0)

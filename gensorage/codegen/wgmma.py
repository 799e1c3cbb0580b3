"""Hopper tensor-core matmul kernels: ``wgmma.mma_async`` from shared-memory descriptors (sm_90a).

``C[b?, M, N] = A[b?, M, K] @ B[b?, K, N]`` (float16 or bfloat16 operands, float32 accumulators, the result cast
to the output dtype) as one TVMScript PrimFunc built from TVM's own PTX ops (``T.ptx`` wgmma, cp.async and
fence entries, ``T.cuda.wgmma.encode_matrix_descriptor``); no hand-written assembly:

* a thread block of ``warpgroups`` (1, 2 or 4) x 128 threads computes a ``64 * warpgroups`` x ``block_n`` output tile;
  warpgroup ``w`` owns rows ``64 w .. 64 w + 63`` and issues ``wgmma.mma_async.m64n{block_n}k16`` (the ss form:
  both operands read from shared memory through matrix descriptors), four per 64-wide reduction step;
* per reduction step the A tile (``block_m`` x 64, K-major: each row is 128 bytes) and the B tile (64 x
  ``block_n``, N-major: B is row-major ``[K, N]``, read with wgmma's transpose immediate; or, for a B stored
  ``[N, K]`` and read in place (``x @ W.T``, ``k_major_b``), ``block_n`` x 64 K-major like A, wgmma's own
  layout, no transpose) are copied global ->
  shared by all threads with 16-byte ``cp.async`` (zero-filled outside the matrix), in the 128-byte swizzled
  layout the descriptors name: 16-byte chunk ``c`` of 128-byte row ``r`` is stored at chunk ``c ^ (r % 8)``
  of its row (:func:`a_offset`, :func:`b_offset`);
* ``stages`` shared buffers form a ring: ``wgmma.wait_group(pending)`` leaves the last ``pending`` steps'
  MMAs running while the next step is issued, and the copies of ``stages - pending`` steps ahead fill the
  slots no running MMA reads (one stage: ``wait_group(0)``, then the next step's copies);
  ``fence.proxy.async`` makes the copies (generic proxy) visible to wgmma (async proxy);
* the accumulators (the m64nNk16 fragment layout, :func:`fragment_row_col`) are cast and written to global
  memory from registers, two adjacent columns per 4-byte store; or (``staged``) cast into shared memory
  (padded rows, :func:`out_offset`) and copied out in coalesced 16-byte stores.

:func:`wgmma_twin` is the CPU twin: the same tiling, layouts and descriptors on llvm, with each wgmma computed
by its scalar semantics (the descriptor decoded into the shared addresses the hardware reads, see
:mod:`gensorage.codegen.wgmma_twin`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from gensorage.codegen.dynamic_shared import alloc_dynamic_shared
from gensorage.codegen.epilogue_expr import KernelEpilogue, with_extras
from gensorage.codegen.tensor_core import CONVERT_VECTOR, mma_dtype
from gensorage.errors import ScheduleError

if TYPE_CHECKING:
    from gensorage.hw.profile import HwProfile

WARPGROUP = 128  # threads that issue one wgmma together
WG_M = 64  # rows of one wgmma (m64nNk16)
WG_K = 16  # reduction depth of one wgmma
BLOCK_K = 64  # reduction step of a block: one 128-byte swizzle row of 16-bit elements
CHUNK = 8  # 16-bit elements per 16-byte copy (and per swizzled chunk)
SWIZZLE_ROWS = 8  # rows of a 128-byte swizzle atom (1024 bytes)
ATOM = 64  # 16-bit elements in one 128-byte row
ALIGN = 1024  # bytes: the swizzle atom; each tile starts on one (the descriptor's base offset is 0)
SWIZZLE_128B = 3  # encode_matrix_descriptor's swizzle code for the 128-byte swizzle
OUT_PAD = 8  # 16-bit elements padding each row of the staged result
RULE = "wgmma"  # how a kernel's rule names this lowering
GROUP_M = 8  # tile rows a group of blocks sweeps together (the grid's raster, see block_tile)
ARCH = "sm_90a"  # wgmma needs the architecture-specific target
MAX_TMA_STAGES = 6  # the deepest TMA ring (a 128x128 block's six slots take 192 KiB)


@dataclass(frozen=True, slots=True)
class WgmmaTiles:
    """A wgmma kernel's levels: warpgroups per block (each 64 rows), the block's N tile, pipeline stages."""

    warpgroups: int
    block_n: int
    stages: int
    pending: int = 1  # wgmma groups left running at the end of a step (at most stages - 1)
    staged: bool = False  # the result goes through shared memory to coalesced 16-byte stores
    tma: bool = False  # TMA loads by a producer warpgroup (:mod:`gensorage.codegen.wgmma_tma`), not cp.async
    persistent: int = (
        0  # with TMA: a grid of at most this many blocks looping over the tiles (0: one per tile)
    )

    @property
    def in_flight(self) -> int:
        """wgmma groups a step leaves running: ``pending``, none with one stage (its buffer is reused)."""
        return min(self.pending, self.stages - 1)

    @property
    def ahead(self) -> int:
        """Steps whose copies are in flight: the ring's slots not read by running wgmma groups."""
        return max(1, self.stages - self.in_flight)

    @property
    def block_m(self) -> int:
        return WG_M * self.warpgroups

    @property
    def block_k(self) -> int:
        return BLOCK_K

    @property
    def threads(self) -> int:
        """Threads of a block: the consumer warpgroups, and the producer's with TMA."""
        return WARPGROUP * (self.warpgroups + self.tma)

    @property
    def warps(self) -> int:
        return self.threads // 32

    @property
    def accumulators(self) -> int:
        """float32 accumulator registers per thread (m64nNk16: N / 2)."""
        return self.block_n // 2

    def describe(self) -> str:
        return (
            f"wgmma block {self.block_m}x{self.block_n}x{BLOCK_K}, {self.warpgroups} warpgroup"
            f"{'s' if self.warpgroups > 1 else ''}, {self.stages} stage{'s' if self.stages > 1 else ''}"
            + (f", {self.in_flight} wgmma groups in flight" if self.in_flight > 1 else "")
            + (", result staged in shared memory" if self.staged else "")
            + (", TMA loads by a producer warpgroup" if self.tma else "")
            + (f", persistent over {self.persistent} blocks" if self.persistent else "")
        )

    def invalid(self) -> str | None:
        """Why these tiles cannot be emitted (None when they can)."""
        if self.warpgroups not in (1, 2, 4):
            return f"warpgroups={self.warpgroups} must be 1, 2 or 4"
        if self.block_n not in (64, 128, 256):
            return f"block_n={self.block_n} must be 64, 128 or 256"
        low, high = (2, MAX_TMA_STAGES) if self.tma else (1, 4)
        if not low <= self.stages <= high:
            return f"stages={self.stages} must be {low} to {high}{' with TMA' if self.tma else ''}"
        if self.pending not in (1, 2):
            return f"pending={self.pending} must be 1 or 2"
        if self.tma and self.staged:
            return "the staged result is not done with TMA loads"
        if self.persistent and not self.tma or self.persistent < 0:
            return f"persistent={self.persistent}: a persistent grid needs TMA loads"
        return None


def shared_bytes(t: WgmmaTiles) -> int:
    """Dynamic shared memory of one block: the operand ring (or the staged result, which reuses it), plus one
    atom to align it at run time."""
    ring = t.stages * (t.block_m + t.block_n) * BLOCK_K * 2
    return max(ring, t.block_m * (t.block_n + OUT_PAD) * 2 if t.staged else 0) + ALIGN


def out_offset(row: Any, col: Any, block_n: int) -> Any:
    """Element offset of the staged result's (row, col): rows padded by 16 bytes, so the 8 rows a warp's
    fragment stores touch start in different banks."""
    return row * (block_n + OUT_PAD) + col


def unsupported(m: int, n: int, k: int) -> str | None:
    """Why a (m, n, k) matmul has no wgmma kernel (None when it has): 16-byte copies need n and k in 8s."""
    if n % CHUNK or k % CHUNK:
        return f"n={n} and k={k} must be multiples of {CHUNK} (16-byte copies)"
    return None


def covers_operands(a: tuple[int, ...], b: tuple[int, ...], out: tuple[int, ...]) -> bool:
    """Whether the kernel takes these operand shapes as they are: each operand 2-D, or with the output's batch
    dims (other broadcasts stay on ``mma.sync``, whose loads follow any broadcast)."""
    return all(len(x) == 2 or x[:-2] == out[:-2] for x in (a, b))


def target_profile(hw: HwProfile, rules: Iterable[str]) -> HwProfile:
    """``hw`` with the ``sm_90a`` target when any kernel (its rule) is a wgmma kernel; ``hw`` otherwise."""
    if hw.arch == "sm_90" and any(r.startswith(RULE) for r in rules):
        return replace(hw, arch=ARCH)
    return hw


def a_offset(row: Any, col: Any) -> Any:
    """Element offset of A's tile element (row, k = col) in the K-major 128-byte swizzled layout."""
    chunk = col // CHUNK
    return row * ATOM + ((chunk ^ (row % SWIZZLE_ROWS)) * CHUNK) + col % CHUNK


def b_offset(row: Any, col: Any) -> Any:
    """Element offset of B's tile element (k = row, n = col) in the N-major 128-byte swizzled layout: atoms of
    64 columns one after the other, each 64 rows of 128 bytes."""
    chunk = (col % ATOM) // CHUNK
    return (
        (col // ATOM) * ATOM * BLOCK_K + row * ATOM + ((chunk ^ (row % SWIZZLE_ROWS)) * CHUNK) + col % CHUNK
    )


#: Descriptor fields (16-byte units) of the A operand: K-major, the leading offset unused with a swizzle, the
#: stride offset the 1024 bytes between 8-row groups.
A_DESC = (1, ALIGN // 16)


def b_desc(block_n: int) -> tuple[int, int]:
    """Descriptor fields of the N-major B operand: leading offset = bytes between 64-column atoms, stride
    offset = bytes between 8-row (k) groups."""
    del block_n
    return (ATOM * BLOCK_K * 2 // 16, ALIGN // 16)


def a_copy(q: Any) -> tuple[Any, Any]:
    """(row, first column) of the A tile's 16-byte chunk ``q`` (eight chunks per 64-wide row)."""
    return q // (BLOCK_K // CHUNK), q % (BLOCK_K // CHUNK) * CHUNK


def b_copy(q: Any, block_n: int) -> tuple[Any, Any]:
    """(row, first column) of the B tile's 16-byte chunk ``q`` (``block_n / 8`` chunks per row)."""
    return q // (block_n // CHUNK), q % (block_n // CHUNK) * CHUNK


def step_geometry(t: WgmmaTiles, mnk: tuple[int, int, int], threads: int) -> tuple[int, ...]:
    """What every wgmma kernel and its twin derive from the tiling: block rows and columns of the grid, reduction
    steps, the A and stage tile sizes in elements, and each of ``threads``' 16-byte copies of A and B per step."""
    m, n, k = mnk
    bm, bn = t.block_m, t.block_n
    a_elems = bm * BLOCK_K
    return (
        -(-m // bm),
        -(-n // bn),
        -(-k // BLOCK_K),
        a_elems,
        (bm + bn) * BLOCK_K,
        a_elems // CHUNK // threads,
        BLOCK_K * bn // CHUNK // threads,
    )


def step_offsets(slot: Any, kk: Any, stage_elems: int, k_major_b: bool = False) -> tuple[Any, Any]:
    """What the A and B descriptors of ring slot ``slot``'s k16 step ``kk`` add to the slot-0 descriptors
    (16-byte units): A (and a K-major B) advances 32 bytes within its swizzled rows, an N-major B 16 rows of
    128 bytes."""
    base = slot * stage_elems * 2
    b_step = WG_K * 2 if k_major_b else WG_K * ATOM * 2
    return (base + kk * WG_K * 2) // 16, (base + kk * b_step) // 16


def b_tile(
    k_major_b: bool, block_n: int
) -> tuple[Callable[[Any], tuple[Any, Any]], Callable[[Any, Any], Any]]:
    """(chunk -> (k, n) of its first element, (k, n) -> element offset) of the B tile's copies and layout:
    N-major rows of ``block_n``, or K-major rows of 64 k (A's layout, with n for A's rows)."""
    if k_major_b:
        return (lambda q: a_copy(q)[::-1]), (lambda kr, col: a_offset(col, kr))
    return (lambda q: b_copy(q, block_n)), b_offset


def block_tile(bx: Any, gm: int, gn: int) -> tuple[Any, Any]:
    """(tile row, tile column) of block ``bx`` in a grid of ``gm`` x ``gn`` tiles, in groups of ``GROUP_M``
    tile rows swept column by column: the blocks resident at once share a few rows of A and a few columns of
    B, so a wave reads less of both from DRAM than one sweeping whole rows of tiles (which streams all of B)."""
    from tvm import tirx

    group = GROUP_M * gn
    first = bx // group * GROUP_M
    rows = tirx.min(gm - first, GROUP_M)
    return first + bx % group % rows, bx % group // rows


def fragment_row_col(lane: Any, warp: Any, reg: Any) -> tuple[Any, Any]:
    """(row, col) of accumulator register ``reg`` of thread ``32 warp + lane`` in a m64nNk16 float32 result.

    The PTX ISA's wgmma D fragment: warp ``w`` holds rows ``16 w .. 16 w + 15``; register ``4 i + 2 h + e``
    holds row ``16 w + lane / 4 + 8 h``, column ``8 i + 2 (lane % 4) + e``.
    """
    i, h, e = reg // 4, (reg // 2) % 2, reg % 2
    return warp * 16 + lane // 4 + 8 * h, i * 8 + (lane % 4) * 2 + e


def _check(tiles: WgmmaTiles, dtype: str, dims: tuple[int, int, int], b_dtype: str | None = None) -> str:
    """The operands' MMA dtype (:func:`~gensorage.codegen.tensor_core.mma_dtype`); raises where the kernel does
    not cover the tiles, shapes or dtypes."""
    mma = mma_dtype(dtype, b_dtype or dtype)
    why = tiles.invalid() or unsupported(*dims)
    if why is None and mma is None:
        why = f"operand dtypes {dtype} and {b_dtype or dtype}, expected 16-bit ones or float32 with one"
    if why is None and tiles.tma and not dtype == (b_dtype or dtype) == mma:
        why = "TMA copies bytes: an operand converted to the MMA dtype runs the cp.async kernel"
    if why is not None:
        raise ScheduleError(f"wgmma kernel: {why}")
    assert mma is not None
    return mma


def wgmma_matmul(
    a: tuple[int, ...],
    b: tuple[int, ...],
    out: tuple[int, ...],
    dtype: str,
    out_dtype: str,
    tiles: WgmmaTiles,
    maps_as_params: bool = False,
    k_major_b: bool = False,
    epi: KernelEpilogue | None = None,
    b_dtype: str | None = None,
) -> Any:
    """The wgmma matmul PrimFunc ``main(A, B, C)`` for the kernel's view of the operands (with TMA and
    ``maps_as_params``: ``main(A, B, C, A_map, B_map)``, see :func:`gensorage.codegen.wgmma_tma.build_tma`);
    with an epilogue ``epi`` its extra operands follow B (``main(A, B, E0, .., C)``) and its steps run on each
    float32 accumulator before the cast (:mod:`gensorage.codegen.epilogue_expr`).

    Parameters
    ----------
    a, b, out
        ``[M, K]``, ``[K, N]`` (``[N, K]`` with ``k_major_b``), ``[M, N]``, or with one leading batch dim (an
        operand without it is broadcast over the batch), as
        :func:`gensorage.codegen.predefined_matmul.matmul_prim_func` takes them.
    dtype
        The operands' dtype (float16 or bfloat16), or A's when ``b_dtype`` is given.
    out_dtype
        The result's dtype; the float32 accumulators are cast to it.
    tiles
        Warpgroups, N tile and pipeline stages.
    k_major_b
        B is stored ``[N, K]`` (a transposed view read in place): its tile is K-major, like A's.
    b_dtype
        B's dtype when it differs from A's: a float32 operand with a 16-bit one multiplies in bfloat16
        (:func:`~gensorage.codegen.tensor_core.mma_dtype`), each operand not already in it converted on its way to
        shared memory by the threads (loads, converts, 16-byte stores; not cp.async, which copies bytes; not
        TMA either).

    Raises
    ------
    ScheduleError
        Tiles or shapes the kernel does not cover.
    """
    batch = out[0] if len(out) == 3 else 0
    m, n, k = out[-2], out[-1], a[-1]
    _check(tiles, dtype, (m, n, k), b_dtype)
    if tiles.tma:
        from gensorage.codegen.wgmma_tma import build_tma

        if not len(a) == len(b) == len(out) == 2:
            raise ScheduleError("wgmma kernel: TMA loads take 2-D operands (no batch dim)")
        if k_major_b:
            raise ScheduleError(
                "wgmma kernel: TMA loads take an N-major B (a K-major B runs the cp.async kernel)"
            )
        return build_tma(a, b, out, dtype, out_dtype, tiles, (m, n, k), maps_as_params, epi)
    dtypes = (dtype, b_dtype or dtype)
    return _build(a, b, out, dtypes, out_dtype, tiles, batch, (m, n, k), k_major_b, epi)


def _build(
    a_shape: tuple[int, ...],
    b_shape: tuple[int, ...],
    c_shape: tuple[int, ...],
    dtypes: tuple[str, str],
    out_dtype: str,
    t: WgmmaTiles,
    batch: int,
    mnk: tuple[int, int, int],
    k_major_b: bool,
    epi: KernelEpilogue | None = None,
) -> Any:
    from tvm.script import tirx as T

    a_dtype, b_dtype = dtypes
    dtype = mma_dtype(a_dtype, b_dtype)  # the ring's and the MMA's
    assert dtype is not None
    convert_a, convert_b = a_dtype != dtype, b_dtype != dtype
    vec, zero = CONVERT_VECTOR, T.Cast(dtype, 0)
    m, n, k = mnk
    bm, bn, stages = t.block_m, t.block_n, t.stages
    threads, nacc = t.threads, t.accumulators
    gm, gn, ktiles, a_elems, stage_elems, a_copies, b_copies = step_geometry(t, mnk, threads)
    ahead = t.ahead  # steps whose copies are in flight before the loop
    wait = t.in_flight  # wgmma groups left running at the end of a step
    smem = shared_bytes(t) // 2
    ab = {"float16": "f16", "bfloat16": "bf16"}[dtype]
    mma = f"wgmma.mma_async.sync.aligned.m64n{bn}k16.f32.{ab}.{ab}"
    lbo, sbo = A_DESC if k_major_b else b_desc(bn)
    b_chunk, b_place = b_tile(k_major_b, bn)
    transpose_b = 0 if k_major_b else 1  # wgmma's imm-trans-b: an N-major B is read transposed
    a_batched, b_batched = len(a_shape) == 3, len(b_shape) == 3
    # the ring's 16-bit elements hold the cast result (an epilogue's result is stored from the registers)
    staged = t.staged and out_dtype == dtype and epi is None
    out_copies = bm * bn // CHUNK // threads
    fused = epi is not None
    slots = (epi or KernelEpilogue((), ())).slots(field=False)

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
        bx = T.launch_thread("blockIdx.x", gm * gn)
        bz = T.launch_thread("blockIdx.y", max(batch, 1))
        tx = T.launch_thread("threadIdx.x", threads)
        buf = T.meta_var(alloc_dynamic_shared("buf", smem, dtype))
        acc = T.alloc_buffer((nacc,), "float32", scope="local")
        desc = T.alloc_buffer((2,), "uint64", scope="local")
        pad = T.alloc_buffer((1,), "int32", scope="local")
        word = T.alloc_buffer((4,), "uint32", scope="local")
        # The ring starts on a 1024-byte boundary: the hardware swizzles by shared address bits.
        pad[0] = T.Cast("int32", (ALIGN - T.cuda.cvta_generic_to_shared(buf.data) % ALIGN) % ALIGN) // 2
        m0 = block_tile(bx, gm, gn)[0] * bm
        n0 = block_tile(bx, gm, gn)[1] * bn
        for s in T.unroll(ahead):
            if s < ktiles:
                for c in T.unroll(a_copies):
                    row, col = a_copy(tx + c * threads)
                    ok = m0 + row < m and s * BLOCK_K + col < k
                    dst = pad[0] + s % stages * stage_elems + a_offset(row, col)
                    src = a_at(bz, T.min(m0 + row, m - 1), T.min(s * BLOCK_K + col, k - CHUNK))
                    if convert_a:  # loaded, converted and stored by the thread (a chunk in two vectors)
                        for h in T.unroll(CHUNK // vec):
                            for e in T.vectorized(vec):
                                buf[dst + h * vec + e] = T.if_then_else(
                                    ok, T.Cast(dtype, A[along(src, h * vec + e)]), zero
                                )
                    else:
                        T.ptx.cp.async_.cg.shared.global_(
                            T.address_of(buf[dst]),
                            T.address_of(A[src]),
                            16,
                            T.Select(ok, T.uint32(16), T.uint32(0)),
                        )
                for c in T.unroll(b_copies):
                    row, col = b_chunk(tx + c * threads)
                    ok = s * BLOCK_K + row < k and n0 + col < n
                    dst = pad[0] + s % stages * stage_elems + a_elems + b_place(row, col)
                    src = b_source(b_at, bz, s * BLOCK_K + row, n0 + col, k, n, k_major_b)
                    if convert_b:
                        for h in T.unroll(CHUNK // vec):
                            for e in T.vectorized(vec):
                                buf[dst + h * vec + e] = T.if_then_else(
                                    ok, T.Cast(dtype, B[along(src, h * vec + e)]), zero
                                )
                    else:
                        T.ptx.cp.async_.cg.shared.global_(
                            T.address_of(buf[dst]),
                            T.address_of(B[src]),
                            16,
                            T.Select(ok, T.uint32(16), T.uint32(0)),
                        )
            T.ptx.cp.async_.commit_group()
        for r in T.unroll(nacc):
            acc[r] = T.float32(0)
        T.cuda.wgmma.encode_matrix_descriptor(
            T.address_of(desc[0]),
            T.address_of(buf[pad[0] + tx // WARPGROUP * WG_M * ATOM]),
            A_DESC[0],
            A_DESC[1],
            SWIZZLE_128B,
        )
        T.cuda.wgmma.encode_matrix_descriptor(
            T.address_of(desc[1]), T.address_of(buf[pad[0] + a_elems]), lbo, sbo, SWIZZLE_128B
        )
        for kt in T.serial(ktiles):
            T.ptx.cp.async_.wait_group(ahead - 1)
            T.ptx.fence.proxy.async_.shared__cta()
            T.tvm_storage_sync("shared")
            T.ptx.wgmma.fence.sync.aligned()
            for kk in T.unroll(BLOCK_K // WG_K):
                T.ptx[mma](
                    *[acc[r] for r in range(nacc)],
                    desc[0] + T.Cast("uint64", step_offsets(kt % stages, kk, stage_elems)[0]),
                    desc[1] + T.Cast("uint64", step_offsets(kt % stages, kk, stage_elems, k_major_b)[1]),
                    T.bool(True),
                    1,
                    1,
                    0,
                    transpose_b,
                )
            T.ptx.wgmma.commit_group.sync.aligned()
            T.ptx.wgmma.wait_group.sync.aligned(wait)
            # Every warpgroup is done with the buffer the next copies overwrite (step kt - in_flight, or kt
            # itself with one stage).
            T.tvm_storage_sync("shared")
            if kt + ahead < ktiles:
                for c in T.unroll(a_copies):
                    row, col = a_copy(tx + c * threads)
                    kc = (kt + ahead) * BLOCK_K + col
                    ok = m0 + row < m and kc < k
                    dst = pad[0] + (kt + ahead) % stages * stage_elems + a_offset(row, col)
                    src = a_at(bz, T.min(m0 + row, m - 1), T.min(kc, k - CHUNK))
                    if convert_a:
                        for h in T.unroll(CHUNK // vec):
                            for e in T.vectorized(vec):
                                buf[dst + h * vec + e] = T.if_then_else(
                                    ok, T.Cast(dtype, A[along(src, h * vec + e)]), zero
                                )
                    else:
                        T.ptx.cp.async_.cg.shared.global_(
                            T.address_of(buf[dst]),
                            T.address_of(A[src]),
                            16,
                            T.Select(ok, T.uint32(16), T.uint32(0)),
                        )
                for c in T.unroll(b_copies):
                    row, col = b_chunk(tx + c * threads)
                    kr = (kt + ahead) * BLOCK_K + row
                    ok = kr < k and n0 + col < n
                    dst = pad[0] + (kt + ahead) % stages * stage_elems + a_elems + b_place(row, col)
                    src = b_source(b_at, bz, kr, n0 + col, k, n, k_major_b)
                    if convert_b:
                        for h in T.unroll(CHUNK // vec):
                            for e in T.vectorized(vec):
                                buf[dst + h * vec + e] = T.if_then_else(
                                    ok, T.Cast(dtype, B[along(src, h * vec + e)]), zero
                                )
                    else:
                        T.ptx.cp.async_.cg.shared.global_(
                            T.address_of(buf[dst]),
                            T.address_of(B[src]),
                            16,
                            T.Select(ok, T.uint32(16), T.uint32(0)),
                        )
            T.ptx.cp.async_.commit_group()
        T.ptx.wgmma.wait_group.sync.aligned(0)
        if staged:
            T.tvm_storage_sync("shared")  # every MMA is done with the ring: the result reuses it
            for p in T.unroll(nacc // 2):
                row = tx // WARPGROUP * WG_M + fragment_row_col(tx % 32, tx % WARPGROUP // 32, 2 * p)[0]
                col = fragment_row_col(tx % 32, tx % WARPGROUP // 32, 2 * p)[1]
                buf[T.ramp(pad[0] + out_offset(row, col, bn), 1, 2)] = T.Cast(
                    f"{dtype}x2", acc[T.ramp(2 * p, 1, 2)]
                )
            T.tvm_storage_sync("shared")
            for q in T.unroll(out_copies):
                row = (tx + q * threads) // (bn // CHUNK)
                col = (tx + q * threads) % (bn // CHUNK) * CHUNK
                if m0 + row < m and n0 + col < n:
                    # One 16-byte word: TVM's CUDA printer loads a 16-bit x 8 vector element by element.
                    T.ptx.ld.shared.v4.b32(
                        word[0],
                        word[1],
                        word[2],
                        word[3],
                        T.address_of(buf[pad[0] + out_offset(row, col, bn)]),
                    )
                    T.ptx.st.global_.v4.b32(
                        T.address_of(C[c_at(bz, m0 + row, n0 + col)]), word[0], word[1], word[2], word[3]
                    )
        else:
            for p in T.unroll(nacc // 2):
                row = m0 + tx // WARPGROUP * WG_M + fragment_row_col(tx % 32, tx % WARPGROUP // 32, 2 * p)[0]
                col = n0 + fragment_row_col(tx % 32, tx % WARPGROUP // 32, 2 * p)[1]
                if row < m and col < n:
                    if fused:  # the epilogue on each accumulator, then the cast
                        for e in T.unroll(2):
                            C[c_at(bz, row, col + e)] = T.Cast(
                                out_dtype,
                                epilogue_at(epi, acc[2 * p + e], (E0, E1, E2, E3), c_at(bz, row, col + e)),
                            )
                    else:
                        C[c_at(bz, row, T.ramp(col, 1, 2))] = T.Cast(
                            f"{out_dtype}x2", acc[T.ramp(2 * p, 1, 2)]
                        )

    return with_extras(main, len(epi.extra) if epi else 0)


def epilogue_at(
    epi: Any, v: Any, extra: tuple[Any, ...], ix: tuple[Any, ...], modulus: int | None = None
) -> Any:
    """``epi``'s value at output index ``ix`` from accumulator ``v`` (a call the kernels' TVMScript makes)."""
    return epi.value(v, extra, ix, modulus)


def b_source(
    b_at: Callable[[Any, Any, Any], tuple[Any, ...]],
    bz: Any,
    kr: Any,
    col: Any,
    k: int,
    n: int,
    k_major_b: bool,
) -> tuple[Any, ...]:
    """The index of the first element of a B chunk starting at (k ``kr``, n ``col``), clamped into the matrix
    (a chunk outside it is zero-filled, but its address must stay valid): along n for an N-major B, along k
    for a K-major one."""
    from tvm.script import tirx as T

    if k_major_b:
        return b_at(bz, T.min(col, n - 1), T.min(kr, k - CHUNK))
    return b_at(bz, T.min(kr, k - 1), T.min(col, n - CHUNK))


def along(index: tuple[Any, ...], e: Any) -> tuple[Any, ...]:
    """``index`` moved ``e`` elements along its last (contiguous) dim: element ``e`` of a 16-byte chunk."""
    return (*index[:-1], index[-1] + e)


def operand_index(batched: bool) -> Callable[[Any, Any, Any], tuple[Any, ...]]:
    """The index of element (row, col) of batch ``bz`` in an operand with (True) or without a batch dim; the
    kernel and its CPU twin index alike."""
    return lambda bz, row, col: (bz, row, col) if batched else (row, col)

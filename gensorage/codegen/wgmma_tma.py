"""The warp-specialised wgmma matmul: TMA loads into an mbarrier ring, one producer and consumer warpgroups.

The variant of :mod:`gensorage.codegen.wgmma` that ``WgmmaTiles(tma=True)`` selects; the same 128-byte
swizzled shared tiles, descriptors, wgmma issue and accumulator write-back, with the loads done as Hopper's
own GEMMs do them, through TVM 0.27's PTX ops (``cp.async.bulk.tensor``, ``mbarrier``, ``setmaxnreg``):

* the block has one warpgroup more than it has consumers: warpgroup 0 is the producer, warpgroups
  ``1 .. warpgroups`` the consumers (each owns 64 rows of the block, as in the cp.async kernel);
* one thread of the producer issues, per reduction step, one TMA copy of the A tile (a ``64 x block_m`` box of
  the ``[M, K]`` tensor map: 128-byte rows of K, one per row of M) and ``block_n / 64`` copies of B (64 x 64
  boxes of the ``[K, N]`` map), all with the 128-byte swizzle, so they land in exactly the layout
  :func:`~gensorage.codegen.wgmma.a_offset` and :func:`~gensorage.codegen.wgmma.b_offset` describe; the copy
  engine zero-fills what lies outside the matrix;
* ``stages`` slots, each with a *full* barrier (the producer's ``arrive.expect_tx`` of the slot's bytes, which
  the copies complete) and an *empty* barrier (one arrival per consumer warp once the wgmma groups reading the
  slot are done); the producer waits on empty, the consumers on full, each tracking the phase parity of the
  slot's round (:func:`ring_slot`, :func:`full_parity`, :func:`empty_parity`, :func:`freed_steps`);
* with ``persistent``, a grid of at most that many blocks, each taking tiles ``bx, bx + grid, ...`` with its
  steps numbered on through them, so the ring runs on from tile to tile (the next tile's copies overlap the
  last MMAs and the write-back);
* ``setmaxnreg`` gives the registers the producer does not need to the consumers' accumulators;
* a barrier wait that lasts ``WAIT_LIMIT_NS`` traps (a broken ring fails its launch instead of hanging).

The tensor maps (``CUtensorMap``, built on the host by ``cuTensorMapEncodeTiled``) are kernel parameters
(``const __grid_constant__ CUtensorMap``); :func:`tensor_map_args` says what each must hold, and the GPU
runner (``benchmarks/gpu_tensor_map.py``) encodes them from the manifest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gensorage.codegen.dynamic_shared import alloc_dynamic_shared
from gensorage.codegen.epilogue_expr import KernelEpilogue, with_extras
from gensorage.codegen.wgmma import (
    A_DESC,
    ALIGN,
    ATOM,
    BLOCK_K,
    SWIZZLE_128B,
    WARPGROUP,
    WG_K,
    WG_M,
    b_desc,
    block_tile,
    epilogue_at,
    fragment_row_col,
    shared_bytes,
    step_geometry,
    step_offsets,
)

if TYPE_CHECKING:
    from gensorage.codegen.wgmma import WgmmaTiles

SWIZZLE_BYTES = 128  # the tensor maps' swizzle: CU_TENSOR_MAP_SWIZZLE_128B
#: cuda.h's enums: CUtensorMapDataType (FLOAT16 = 6, BFLOAT16 = 9), CUtensorMapSwizzle by its span in bytes.
DATA_TYPES = {"float16": 6, "bfloat16": 9}
SWIZZLE_ENUM = {0: 0, 32: 1, 64: 2, 128: 3}
INTERLEAVE_NONE = 0
L2_PROMOTION_256B = 3  # CU_TENSOR_MAP_L2_PROMOTION_L2_256B, as CUTLASS's Hopper GEMMs use
OOB_FILL_NONE = 0  # out-of-bounds elements read as zero
WAIT_HINT_NS = 1_000_000  # try_wait's suspend-time hint
#: A barrier wait longer than this traps: a ring that never fills (a wrong parity, count or byte total) stops
#: the kernel with an error the runner reports instead of hanging the device (a GEMM here takes milliseconds).
WAIT_LIMIT_NS = 2_000_000_000
#: setmaxnreg (producer, consumer registers per thread) by consumer warpgroups. The block's registers are
#: fixed at launch (ptxas gives a 384-thread kernel that uses setmaxnreg its whole 65536 / 384 = 168), so the
#: producer's release must pay for the consumers' raise: 128 x (168 - 40) = 256 x (232 - 168), CUTLASS's
#: split. With one consumer warpgroup a thread can have 255 already; four are not split (no setmaxnreg).
SETMAXNREG = {2: (40, 232)}


@dataclass(frozen=True, slots=True)
class TensorMapArgs:
    """What ``cuTensorMapEncodeTiled`` gets for one operand: dims and box innermost first, the byte strides of
    the outer dims, the swizzle in bytes; elements outside the tensor read as zero."""

    tensor: str
    dtype: str
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    swizzle: int = SWIZZLE_BYTES

    def as_json(self) -> dict[str, Any]:
        return {
            "dtype": self.dtype,
            "dims": list(self.dims),
            "strides": list(self.strides),
            "box": list(self.box),
            "swizzle": self.swizzle,
        }


def tensor_map_args(m: int, n: int, k: int, dtype: str, t: WgmmaTiles) -> tuple[TensorMapArgs, TensorMapArgs]:
    """The tensor maps of A (``[M, K]`` row-major: boxes of 64 K x ``block_m`` rows) and B (``[K, N]``
    row-major: boxes of 64 N x 64 K, ``block_n / 64`` per step), 16-bit elements."""
    a = TensorMapArgs("A", dtype, (k, m), (k * 2,), (BLOCK_K, t.block_m))
    b = TensorMapArgs("B", dtype, (n, k), (n * 2,), (ATOM, BLOCK_K))
    return a, b


def encode_operands(spec: TensorMapArgs) -> tuple[int, ...]:
    """The shape operands of ``cuTensorMapEncodeTiled`` after the address: dims, strides, box, element
    strides (all 1), as ``T.tensormap_encode_tiled`` takes them."""
    return (*spec.dims, *spec.strides, *spec.box, *(1,) * len(spec.dims))


def ring_slot(g: Any, stages: int) -> Any:
    """The ring slot of a block's step ``g`` (its steps numbered on through its tiles)."""
    return g % stages


def full_parity(g: Any, stages: int) -> Any:
    """The phase parity the consumers wait for on step ``g``'s full barrier: its round of the ring."""
    return g // stages % 2


def empty_parity(g: Any, stages: int) -> Any:
    """The parity the producer waits for on step ``g``'s empty barrier: the previous round's, freed by the
    consumers (on a fresh barrier, parity 1 passes at once)."""
    return (g // stages + 1) % 2


def freed_steps(kt: int, ktiles: int, wait: int) -> list[int]:
    """The steps of a tile (by index ``0 .. ktiles - 1``) whose slots the consumers free after its step
    ``kt`` (``kt = ktiles``: after the tile's last ``wait_group(0)``): the one ``wait`` steps back, whose MMAs
    ``wait_group(wait)`` has seen done; at the end, the tile's last ``wait``."""
    if kt == ktiles:
        return [j for j in range(ktiles - wait, ktiles) if j >= 0]
    return [kt - wait] if kt >= wait else []


def stage_bytes(t: WgmmaTiles) -> int:
    """Bytes the copies of one reduction step bring (whole boxes: the zero fill counts too)."""
    return (t.block_m + t.block_n) * BLOCK_K * 2


def build_tma(
    a_shape: tuple[int, ...],
    b_shape: tuple[int, ...],
    c_shape: tuple[int, ...],
    dtype: str,
    out_dtype: str,
    t: WgmmaTiles,
    mnk: tuple[int, int, int],
    maps_as_params: bool = False,
    epi: KernelEpilogue | None = None,
) -> Any:
    """The PrimFunc ``main(A, B, C)`` whose host code encodes the tensor maps of A and B (``T.tensormap_encode_tiled``)
    and passes them to the kernel by value, so TVM's runtime can run it; or (``maps_as_params``) ``main(A, B, C,
    A_map, B_map)``, the maps made by the caller (the GPU suite's runner). 2-D operands; the kernel reads A and
    B through the maps. An epilogue ``epi`` runs as :func:`~gensorage.codegen.wgmma.wgmma_matmul`'s does (its
    extra operands follow B)."""
    from tvm.script import tirx as T

    fused = epi is not None
    slots = (epi or KernelEpilogue((), ())).slots(field=False)

    m, n, k = mnk
    bm, bn, stages = t.block_m, t.block_n, t.stages
    threads, nacc = t.threads, t.accumulators
    gm, gn, ktiles, a_elems, stage_elems, _, _ = step_geometry(t, mnk, threads)
    wait = t.in_flight  # wgmma groups left running at the end of a step; their slots stay full
    smem = shared_bytes(t) // 2
    ab = {"float16": "f16", "bfloat16": "bf16"}[dtype]
    mma = f"wgmma.mma_async.sync.aligned.m64n{bn}k16.f32.{ab}.{ab}"
    tma = "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
    lbo, sbo = b_desc(bn)
    nbytes = stage_bytes(t)
    consumer_warps = t.warpgroups * WARPGROUP // 32
    producer_regs, consumer_regs = SETMAXNREG.get(t.warpgroups, (0, 0))
    tiles = gm * gn
    grid = min(tiles, t.persistent) if t.persistent else tiles  # blocks; each takes tiles bx, bx + grid, ...
    per_block = -(-tiles // grid)

    @T.macro
    def bar_wait(bar: Any, parity: Any, done: Any, start: Any) -> None:
        # mbarrier.try_wait until the phase of this parity completes; the clock is read only once it has not.
        T.ptx.mbarrier.try_wait.parity.acquire.cta.shared__cta.b64(
            done[0], T.address_of(bar), T.Cast("uint32", parity), T.uint32(WAIT_HINT_NS)
        )
        if done[0] == T.uint32(0):
            start[0] = T.cuda.mov_sreg(64, "globaltimer")
            while done[0] == T.uint32(0):
                T.ptx.mbarrier.try_wait.parity.acquire.cta.shared__cta.b64(
                    done[0], T.address_of(bar), T.Cast("uint32", parity), T.uint32(WAIT_HINT_NS)
                )
                T.cuda.trap_when_assert_failed(
                    T.cuda.mov_sreg(64, "globaltimer") < start[0] + T.int64(WAIT_LIMIT_NS)
                )

    @T.macro
    def kernel(A_map: Any, B_map: Any, C: Any, E: Any) -> None:  # noqa: N803
        bx = T.launch_thread("blockIdx.x", grid)
        tx = T.launch_thread("threadIdx.x", threads)
        buf = T.meta_var(alloc_dynamic_shared("buf", smem, dtype))
        full = T.alloc_buffer((stages,), "uint64", scope="shared")
        empty = T.alloc_buffer((stages,), "uint64", scope="shared")
        acc = T.alloc_buffer((nacc,), "float32", scope="local")
        desc = T.alloc_buffer((2,), "uint64", scope="local")
        pad = T.alloc_buffer((1,), "int32", scope="local")
        done = T.alloc_buffer((1,), "uint32", scope="local")
        start = T.alloc_buffer((1,), "int64", scope="local")
        # The ring starts on a 1024-byte boundary: TMA and wgmma swizzle by shared address bits.
        pad[0] = T.Cast("int32", (ALIGN - T.cuda.cvta_generic_to_shared(buf.data) % ALIGN) % ALIGN) // 2
        if tx == 0:
            for s in T.unroll(stages):
                T.ptx.mbarrier.init.shared.b64(T.address_of(full[s]), T.uint32(1))
                T.ptx.mbarrier.init.shared.b64(T.address_of(empty[s]), T.uint32(consumer_warps))
            T.ptx.fence.mbarrier_init.release.cluster()
        T.tvm_storage_sync("shared")
        if tx < WARPGROUP:
            if producer_regs > 0:
                T.ptx.setmaxnreg.dec.sync.aligned.u32(producer_regs)
            if tx == 0:
                # Tile bx + i * grid, its steps numbered on through the block's tiles (g): the ring runs on
                # from one tile to the next, so the next tile's copies overlap this one's last MMAs and
                # write-back.
                for i, kt in T.grid(per_block, ktiles):
                    if bx + i * grid < tiles:
                        g = i * ktiles + kt
                        bar_wait(
                            empty[ring_slot(g, stages)],
                            empty_parity(g, stages),
                            done,
                            start,
                        )
                        T.ptx.mbarrier.arrive.expect_tx.shared.b64(
                            T.address_of(full[ring_slot(g, stages)]), T.uint32(nbytes)
                        )
                        T.ptx[tma](
                            T.address_of(buf[pad[0] + ring_slot(g, stages) * stage_elems]),
                            T.address_of(A_map),
                            T.int32(kt * BLOCK_K),
                            T.Cast("int32", block_tile(bx + i * grid, gm, gn)[0] * bm),
                            T.address_of(full[ring_slot(g, stages)]),
                        )
                        for j in T.unroll(bn // ATOM):
                            T.ptx[tma](
                                T.address_of(
                                    buf[
                                        pad[0]
                                        + ring_slot(g, stages) * stage_elems
                                        + a_elems
                                        + j * ATOM * BLOCK_K
                                    ]
                                ),
                                T.address_of(B_map),
                                T.Cast("int32", block_tile(bx + i * grid, gm, gn)[1] * bn + j * ATOM),
                                T.int32(kt * BLOCK_K),
                                T.address_of(full[ring_slot(g, stages)]),
                            )
        else:
            if consumer_regs > 0:
                T.ptx.setmaxnreg.inc.sync.aligned.u32(consumer_regs)
            T.cuda.wgmma.encode_matrix_descriptor(
                T.address_of(desc[0]),
                T.address_of(buf[pad[0] + (tx // WARPGROUP - 1) * WG_M * ATOM]),
                A_DESC[0],
                A_DESC[1],
                SWIZZLE_128B,
            )
            T.cuda.wgmma.encode_matrix_descriptor(
                T.address_of(desc[1]), T.address_of(buf[pad[0] + a_elems]), lbo, sbo, SWIZZLE_128B
            )
            for i in T.serial(per_block):
                if bx + i * grid < tiles:
                    for r in T.unroll(nacc):
                        acc[r] = T.float32(0)
                    g0 = i * ktiles
                    for kt in T.serial(ktiles):
                        g = g0 + kt
                        bar_wait(full[ring_slot(g, stages)], full_parity(g, stages), done, start)
                        T.ptx.wgmma.fence.sync.aligned()
                        for kk in T.unroll(BLOCK_K // WG_K):
                            T.ptx[mma](
                                *[acc[r] for r in range(nacc)],
                                desc[0]
                                + T.Cast("uint64", step_offsets(ring_slot(g, stages), kk, stage_elems)[0]),
                                desc[1]
                                + T.Cast("uint64", step_offsets(ring_slot(g, stages), kk, stage_elems)[1]),
                                T.bool(True),
                                1,
                                1,
                                0,
                                1,
                            )
                        T.ptx.wgmma.commit_group.sync.aligned()
                        T.ptx.wgmma.wait_group.sync.aligned(wait)
                        # Step kt - wait's MMAs are done in this warp: its slot may be refilled once every
                        # consumer warp says so.
                        if kt >= wait and tx % 32 == 0:
                            T.ptx.mbarrier.arrive.shared.b64(
                                T.address_of(empty[ring_slot(g - wait, stages)]), T.uint32(1)
                            )
                    T.ptx.wgmma.wait_group.sync.aligned(0)
                    # The tile's last steps are done too: free their slots for the next tile's copies.
                    for j in T.unroll(wait):
                        if ktiles - wait + j >= 0 and tx % 32 == 0:
                            T.ptx.mbarrier.arrive.shared.b64(
                                T.address_of(empty[ring_slot(g0 + ktiles - wait + j, stages)]), T.uint32(1)
                            )
                    for p in T.unroll(nacc // 2):
                        row = (
                            block_tile(bx + i * grid, gm, gn)[0] * bm
                            + (tx // WARPGROUP - 1) * WG_M
                            + fragment_row_col(tx % 32, tx % WARPGROUP // 32, 2 * p)[0]
                        )
                        col = (
                            block_tile(bx + i * grid, gm, gn)[1] * bn
                            + fragment_row_col(tx % 32, tx % WARPGROUP // 32, 2 * p)[1]
                        )
                        if row < m and col < n:
                            if fused:  # the epilogue on each accumulator, then the cast
                                for e in T.unroll(2):
                                    C[row, col + e] = T.Cast(
                                        out_dtype, epilogue_at(epi, acc[2 * p + e], E, (row, col + e))
                                    )
                            else:
                                C[row, T.ramp(col, 1, 2)] = T.Cast(f"{out_dtype}x2", acc[T.ramp(2 * p, 1, 2)])

    a_args, b_args = tensor_map_args(m, n, k, dtype, t)
    a_enc, b_enc = encode_operands(a_args), encode_operands(b_args)
    attrs = {"descriptor_dtype": dtype, "rank": 2, "swizzle": SWIZZLE_ENUM[SWIZZLE_BYTES]}
    attrs |= {"l2_promotion": L2_PROMOTION_256B, "oob_fill": OOB_FILL_NONE}

    @T.prim_func(private=True)
    def with_maps(
        A: T.Buffer(a_shape, dtype),  # type: ignore[valid-type]  # noqa: N803
        B: T.Buffer(b_shape, dtype),  # type: ignore[valid-type]  # noqa: N803
        C: T.Buffer(c_shape, out_dtype),  # type: ignore[valid-type]  # noqa: N803
        A_map: T.handle("tensormap"),  # type: ignore[valid-type]  # noqa: N803
        B_map: T.handle("tensormap"),  # type: ignore[valid-type]  # noqa: N803
        E0: T.Buffer(*slots[0]),  # type: ignore[valid-type]  # noqa: N803
        E1: T.Buffer(*slots[1]),  # type: ignore[valid-type]  # noqa: N803
        E2: T.Buffer(*slots[2]),  # type: ignore[valid-type]  # noqa: N803
        E3: T.Buffer(*slots[3]),  # type: ignore[valid-type]  # noqa: N803
    ) -> None:
        T.func_attr({"tirx.noalias": True})
        kernel(A_map, B_map, C, (E0, E1, E2, E3))

    @T.prim_func(private=True)
    def main(
        A: T.Buffer(a_shape, dtype),  # type: ignore[valid-type]  # noqa: N803
        B: T.Buffer(b_shape, dtype),  # type: ignore[valid-type]  # noqa: N803
        C: T.Buffer(c_shape, out_dtype),  # type: ignore[valid-type]  # noqa: N803
        E0: T.Buffer(*slots[0]),  # type: ignore[valid-type]  # noqa: N803
        E1: T.Buffer(*slots[1]),  # type: ignore[valid-type]  # noqa: N803
        E2: T.Buffer(*slots[2]),  # type: ignore[valid-type]  # noqa: N803
        E3: T.Buffer(*slots[3]),  # type: ignore[valid-type]  # noqa: N803
    ) -> None:
        T.func_attr({"tirx.noalias": True})
        # The host encodes the maps before the launch (TVM's runtime passes them by value).
        A_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)  # noqa: N806
        T.tensormap_encode_tiled(A_map, A.data, *a_enc, **attrs)
        B_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)  # noqa: N806
        T.tensormap_encode_tiled(B_map, B.data, *b_enc, **attrs)
        kernel(A_map, B_map, C, (E0, E1, E2, E3))

    return with_extras(with_maps if maps_as_params else main, len(epi.extra) if epi else 0)

"""The memory of one graph-defined kernel: its shared tiles (static ``__shared__`` arrays, or past 48 KiB one
dynamic arena with a typed view per tile) and each thread's accumulator registers."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from gensorage.codegen.gpu_limits import MAX_VECTOR_BYTES, STATIC_SHARED_LIMIT
from gensorage.codegen.tir_text import shape_text
from gensorage.dtypes import dtype_bytes
from gensorage.ugraph.ir import Ref

if TYPE_CHECKING:
    from gensorage.codegen.block_emitter import BlockEmitter

# Byte alignment of each tile inside the dynamic shared-memory arena: the widest vector access.
_ARENA_ALIGN = MAX_VECTOR_BYTES


def allocate(e: BlockEmitter) -> None:
    """Declare the block's tiles (shared memory, or one dynamic arena past the static limit) and the
    threads' accumulator registers."""
    total = 0
    for j, outs in enumerate(e.binfo.nodes):
        for o, t in enumerate(outs):
            r = Ref(j, o)
            if e.needs_buffer(r):
                e.buffers[r] = f"s{j}" if len(outs) == 1 else f"s{j}_{o}"
                total += math.prod(e.sc.buf_shape(t.shape)) * dtype_bytes(e.buf_dtype(r))
    e.dynamic_shared = e.gpu and total > STATIC_SHARED_LIMIT
    if e.dynamic_shared:
        _allocate_arena(e)
    else:
        scope = "shared" if e.gpu else "global"
        for r, name in e.buffers.items():
            shape = e.sc.buf_shape(e.tile(r).shape)
            e.w.line(f'{name} = T.alloc_buffer({shape_text(shape)}, "{e.buf_dtype(r)}", scope="{scope}")')
    for j, m in e.reg_accs.items():
        # Registers of each thread; on the CPU the threads are loop iterations, so each gets its own row.
        shape = e.sc.buf_shape((e.slots(m),) if e.gpu else (e.nt, e.slots(m)))
        for name in e.accs.registers(j):
            e.w.line(
                f'{name} = T.alloc_buffer({shape_text(shape)}, "{e.sc.acc_dtype}", '
                f'scope="{"local" if e.gpu else "global"}")'
            )


def _allocate_arena(e: BlockEmitter) -> None:
    """Dynamic shared memory as one arena with a typed view per tile, at offsets we choose.

    TVM's ``MergeSharedMemoryAllocations`` (which the CUDA build runs to place dynamic shared buffers)
    loses the offset of a buffer in some liveness patterns (a scalar tile written after a loop and read by
    every thread: "buffer_byte_offsets" check), so the kernel places its tiles itself and hands TVM a
    single allocation. Tiles never share bytes; each starts at a multiple of 16 bytes (vector loads), so
    every offset is a whole number of elements of any tile type.
    """
    offset = 0
    views: list[tuple[str, tuple[int, ...], str, int]] = []
    for r, name in e.buffers.items():
        dtype = e.buf_dtype(r)
        shape = e.sc.buf_shape(e.tile(r).shape)
        views.append((name, shape, dtype, offset // dtype_bytes(dtype)))
        offset += -(-math.prod(shape) * dtype_bytes(dtype) // _ARENA_ALIGN) * _ARENA_ALIGN
    # The arena has a tile's element type: TVM's StorageRewrite retypes an allocation whose every access has
    # one type to that type *keeping its element count*, so a uint8 arena of float32 tiles would grow 4x.
    arena = max((dtype for _, _, dtype, _ in views), key=dtype_bytes)
    e.w.line(f'smem = T.alloc_buffer(({offset // dtype_bytes(arena)},), "{arena}", scope="shared.dyn")')
    for name, shape, dtype, elem_offset in views:
        e.w.line(
            f'{name} = T.decl_buffer({shape_text(shape)}, "{dtype}", data=smem.data, '
            f'elem_offset={elem_offset}, scope="shared.dyn")'
        )


__all__ = ["STATIC_SHARED_LIMIT", "allocate"]

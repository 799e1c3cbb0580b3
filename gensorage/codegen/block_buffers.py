"""The memory of one graph-defined kernel: its shared tiles and each thread's accumulator registers.

The tiles are placed by the memory plan (:mod:`gensorage.ugraph.optimize.memory_plan`): when tiles whose lives
do not overlap share bytes, or past 48 KiB, they are typed views of one arena (dynamic shared memory on the GPU,
one global buffer on the CPU, so the llvm twin runs the same aliasing); otherwise each is a static
``__shared__`` array."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from gensorage.codegen.dynamic_shared import dynamic_shared_name
from gensorage.codegen.gpu_limits import MAX_VECTOR_BYTES, STAGED_SHARED_LIMIT, STATIC_SHARED_LIMIT
from gensorage.codegen.tir_text import Ix, shape_text
from gensorage.dtypes import dtype_bytes
from gensorage.ugraph.ir import Ref
from gensorage.ugraph.optimize.memory_plan import ARENA_ALIGN, MemoryPlan, plan_memory

if TYPE_CHECKING:
    from gensorage.codegen.block_emitter import BlockEmitter


def allocate(e: BlockEmitter) -> None:
    """Declare the block's tiles (static shared arrays, or one arena laid out by the memory plan) and the
    threads' accumulator registers.

    The for-loop's ``cp.async`` tiles get the thread plan's stages (:mod:`gensorage.codegen.block_loads`) when
    the tiles, so planned, and the scratch fit the plan's ``shared_limit`` (the construction's GPU's; without
    one :data:`STAGED_SHARED_LIMIT`); otherwise the kernel has one stage, as without pipelining."""
    scratch = e.reduce.scratch_bytes()
    e.staged, e.stages = e.loads.pipelined(), min(e.choice.stages, e.block.forloop)
    if e.staged:
        _plan(e)
        if e.memory.bytes + scratch > (e.choice.shared_limit or STAGED_SHARED_LIMIT):
            e.staged, e.stages = (), 1
            e.buffers.clear()
    if not e.staged:
        e.stages = 1
    e.stage_at = Ix.var("it").mod(e.stages) if e.staged else Ix()
    sizes = _plan(e)
    shares = e.memory.bytes < e.memory.unshared_bytes
    # A reduction's scratch array lives in the arena, after the tiles: as a static array of its own, TVM's
    # StorageRewrite may give it the bytes of a tile whose last readers run without a barrier before it.
    e.dynamic_shared = e.gpu and (shares or scratch > 0 or sum(sizes.values()) > STATIC_SHARED_LIMIT)
    e.arena = e.dynamic_shared or shares
    if e.arena:
        _allocate_arena(e, e.memory, scratch)
    else:
        e.shared_bytes = sum(sizes.values()) if e.gpu else 0
        scope = "shared" if e.gpu else "global"
        for r, name in e.buffers.items():
            shape = e.buf_tile_shape(r)
            e.w.line(f'{name} = T.alloc_buffer({shape_text(shape)}, "{e.buf_dtype(r)}", scope="{scope}")')
        e.reduce.allocate()
    for j, m in e.reg_accs.items():
        # Registers of each thread; on the CPU the threads are loop iterations, so each gets its own row.
        shape = e.sc.buf_shape((e.slots(m),) if e.gpu else (e.nt, e.slots(m)))
        for name in e.accs.registers(j):
            e.w.line(
                f'{name} = T.alloc_buffer({shape_text(shape)}, "{e.sc.acc_dtype}", '
                f'scope="{"local" if e.gpu else "global"}")'
            )


def _plan(e: BlockEmitter) -> dict[Ref, int]:
    """Name the tiles the kernel materialises and place them (``e.memory``); their bytes."""
    sizes: dict[Ref, int] = {}
    for j, outs in enumerate(e.binfo.nodes):
        for o in range(len(outs)):
            r = Ref(j, o)
            if e.needs_buffer(r):
                e.buffers[r] = f"s{j}" if len(outs) == 1 else f"s{j}_{o}"
                sizes[r] = math.prod(e.buf_tile_shape(r)) * dtype_bytes(e.buf_dtype(r))
    e.memory = plan_memory(e.block, sizes, MAX_VECTOR_BYTES, tuple(sorted(e.fused.items())), e.staged)
    return sizes


def _allocate_arena(e: BlockEmitter, plan: MemoryPlan, scratch: int) -> None:
    """One arena with a typed view per tile, at the plan's offsets.

    TVM's ``MergeSharedMemoryAllocations`` (which the CUDA build runs to place dynamic shared buffers)
    loses the offset of a buffer in some liveness patterns (a scalar tile written after a loop and read by
    every thread: "buffer_byte_offsets" check), so the kernel places its tiles itself and hands TVM a
    single allocation. Tiles live at one step never share bytes; each starts at a multiple of 16 bytes (vector
    loads), so every offset is a whole number of elements of any tile type. The block reductions' scratch
    arrays (``scratch`` bytes) follow the tiles.
    """
    views: list[tuple[str, tuple[int, ...], str, int]] = []
    for r, name in e.buffers.items():
        dtype = e.buf_dtype(r)
        shape = e.buf_tile_shape(r)
        views.append((name, shape, dtype, plan.offset(r) // dtype_bytes(dtype)))
    # The arena has a tile's element type: TVM's StorageRewrite retypes an allocation whose every access has
    # one type to that type *keeping its element count*, so a uint8 arena of float32 tiles would grow 4x.
    arena = max((dtype for _, _, dtype, _ in views), key=dtype_bytes, default=e.sc.acc_dtype)
    if scratch:
        arena = max(arena, e.sc.acc_dtype, key=dtype_bytes)
    e.arena_dtype, e.arena_name = arena, dynamic_shared_name("smem", arena)
    scope = "shared.dyn" if e.gpu else "global"
    base = -(-plan.bytes // ARENA_ALIGN) * ARENA_ALIGN
    total = base + scratch
    elements = -(-total // dtype_bytes(arena))
    e.shared_bytes = elements * dtype_bytes(arena) if e.gpu else 0
    e.w.line(f'{e.arena_name} = T.alloc_buffer(({elements},), "{arena}", scope="{scope}")')
    for name, shape, dtype, elem_offset in views:
        e.w.line(
            f'{name} = T.decl_buffer({shape_text(shape)}, "{dtype}", data={e.arena_name}.data, '
            f'elem_offset={elem_offset}, scope="{scope}")'
        )
    e.reduce.allocate(base, scope)


__all__ = ["STAGED_SHARED_LIMIT", "STATIC_SHARED_LIMIT", "allocate"]

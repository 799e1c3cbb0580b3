"""How many threads a graph-defined kernel with tensor-core block matmuls gets, chosen jointly with the warps of
each of those matmuls by the block cost model.

The Markov construction (:mod:`gensorage.construction.block_threads`) sizes a block for a CUDA-core matmul: one
thread per few output elements, so a 64 x 64 score tile gets 1,024 threads, and the element-wise phases
around it are spread over all of them. Once the matmuls run on tensor cores, that count serves only the
element-wise part, and it costs: at 1,024 threads a thread may hold 64 registers (nvcc spills the MMA
accumulators past that), an SM runs at most two such blocks, and every barrier waits for 32 warps. Fewer
threads do more element-wise iterations each but keep their accumulators in registers and let more blocks
share an SM.

So for such a kernel the thread count ``T`` (:data:`THREADS`, at most the profile's block limit) and, for each
tensor-core block matmul, its warps ``W`` (a power of two dividing ``T / 32``, each warp with a warp tile:
:func:`~gensorage.codegen.block_mma.mma_tiling` picks it for ``W``) are chosen together: every combination is
planned as the generator would emit it (:func:`gensorage.ugraph.block_cost.plan_block`: occupancy by shared
memory, threads and registers, spills, element-wise work per thread, MMA issue per warp and its fragment loads,
barriers, ``cp.async`` tile loads, at the loop's best stages: :func:`~gensorage.construction.pipeline_stages.priced_stages`)
and the one with the fewest predicted cycles for the whole grid (:func:`~gensorage.ugraph.block_cost.block_cycles`)
is the plan. Ties go to more threads, then more warps.
The choice is a :class:`~gensorage.construction.block_threads.ThreadChoice` without a CUDA-core tiling (a
block matmul left on CUDA cores, e.g. one of two float32 operands, deals its output elements cyclically over the
threads, one per thread at a time, as the construction's register tile of 1 did); the code
generator (:func:`~gensorage.codegen.ugraph_tir.plan_threads`) and the cost model
(:func:`~gensorage.ugraph.block_cost.block_threads`) both take it from here, so the kernel priced is the kernel
emitted.
"""

from __future__ import annotations

import itertools

from gensorage.codegen.block_mma import WARP, block_mma_tilings, mma_tiling
from gensorage.construction.block_threads import ThreadChoice
from gensorage.hw.profile import HwProfile
from gensorage.ugraph.ir import BlockOp, GraphDefinedOp, KernelGraph
from gensorage.ugraph.shapes import GraphInfo

THREADS = (128, 256, 512, 1024)  # candidate block sizes: 4 to 32 warps


def warp_options(info: GraphInfo, k: int, g: KernelGraph, threads: int) -> dict[int, list[int]]:
    """Per tensor-core block matmul of kernel ``k`` at ``threads`` threads, the warp counts that compete: powers
    of two dividing the block's warps, each warp with a warp tile at its first step."""
    op = g.ops[k]
    binfo = info.blocks[k]
    assert isinstance(op, GraphDefinedOp) and binfo is not None
    warps = threads // WARP
    options: dict[int, list[int]] = {}
    for j in block_mma_tilings(info, binfo, op.block.nodes, threads, {}):
        node = op.block.nodes[j]
        assert isinstance(node, BlockOp)
        fits = []
        for w in (2**e for e in range(warps.bit_length())):
            t = mma_tiling(binfo, node, j, threads, w)
            if warps % w == 0 and t is not None and t.steps * w - t.warp_tiles < t.steps:
                fits.append(w)
        options[j] = fits or [1]
    return options


def mma_block_layout(g: KernelGraph, k: int, info: GraphInfo, hw: HwProfile) -> ThreadChoice | None:
    """The thread plan of graph-defined op ``k`` when a block matmul of it runs on tensor cores (module
    docstring), or None: the Markov construction sizes the block."""
    # Imported here: the cost model imports the code generator's modules lazily too.
    from gensorage.construction.pipeline_stages import priced_stages

    op = g.ops[k]
    binfo = info.blocks[k]
    assert isinstance(op, GraphDefinedOp) and binfo is not None
    if not block_mma_tilings(info, binfo, op.block.nodes, WARP, {}):
        return None
    key = (op, tuple(info.of(r) for r in op.inputs), hw)
    cached = _CHOSEN.get(key)
    if cached is not None:
        return cached
    priced: list[tuple[tuple[float, int, int], int, tuple[tuple[int, int], ...]]] = []
    for threads in (t for t in THREADS if t <= hw.max_threads_per_block):
        options = warp_options(info, k, g, threads)
        for combo in itertools.product(*options.values()):
            warps = tuple(zip(options, combo, strict=True))
            # Each layout at its best stages (the stages themselves are chosen after, by plan_threads).
            layout = ThreadChoice(threads, None, None, "", warps)
            cycles = min(priced_stages(g, k, info, hw, layout))[0]
            priced.append(((cycles, -threads, -sum(combo)), threads, warps))
    priced.sort()
    (cycles, _, _), threads, warps = priced[0]
    runner_up = next((p for p in priced if p[1] != threads), None)
    versus = (
        f"; best at {runner_up[1]} threads: {runner_up[0][0] / cycles:.2f}x the cycles"
        if runner_up is not None
        else ""
    )
    rule = (
        f"threads with the tensor-core warps, by the block cost model over {len(priced)} layouts: "
        f"{threads} threads{versus}"
    )
    choice = ThreadChoice(threads, None, None, rule, warps)
    if len(_CHOSEN) >= _MAX_CHOSEN:
        _CHOSEN.clear()
    _CHOSEN[key] = choice
    return choice


_CHOSEN: dict[object, ThreadChoice] = {}
_MAX_CHOSEN = 1024


__all__ = ["THREADS", "mma_block_layout", "warp_options"]

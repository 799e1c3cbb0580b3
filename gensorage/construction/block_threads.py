"""How many threads a graph-defined kernel's block runs, and how its dominant matmul is tiled over them.

Mapping from the Markov construction (Gensor) to a block graph
------------------------------------------------------------
A block graph fixes what one thread block computes; the thread-level schedule inside it is still open. The
block's *dominant op* is its largest matmul (most multiply-adds, first on ties). Its per-block tile — output
``[batch, m, n]`` and inner dim ``k`` as inferred for one iteration — is turned into a construction workload
(:func:`gensorage.workloads.gemm` without batch dims, :func:`gensorage.workloads.batch_matmul` with them flattened) and
:func:`gensorage.markov.construct` schedules it for the hardware profile. From the schedule:

- register tile ``T0`` per spatial axis: the output elements one thread accumulates in registers;
- virtual threads: along an axis a thread owns ``vthreads`` strided chunks of ``T0 / vthreads`` elements
  (the ``[vthreads, threads, T0 / vthreads]`` layout of :mod:`gensorage.markov.schedule`), laid out directly in
  the emitted index arithmetic;
- block tile ``T1``: threads per block = ``prod(ceil(T1 / T0))`` over the spatial axes. The constructor chose
  its ``T1`` for a grid of ``ceil(extent / T1)`` blocks per µGraph block, but the µGraph fixes the grid: a
  decode block's ``1 x 256`` score tile would get a 2-thread ``T1`` (many tiny blocks fill the GPU) while the
  grid has only 32 blocks. So ``T1`` is widened (Gensor's inverse-tile transition) by doubling along ``j``,
  then ``i``, then ``b``, never past the extent, while the threads stay within ``max_threads_per_block`` and
  the grid's share of the GPU (``sm_count * max_threads_per_sm / blocks``). A tile still larger than ``T1``
  is walked in ``T1`` steps one after another by the same threads. The constructor's reduction tiles do not
  apply: the whole ``k`` tile is already in shared memory (an input iterator loaded it), so a thread reduces
  it in one pass.

Every other phase of the block (loads, elementwise ops, reductions, other matmuls, thread graphs, saves) spreads
its elements cyclically over the same threads.

Fallback (no matmul in the block graph, or a dtype the constructor does not model): one thread per element of
the largest tile any phase iterates over, rounded up to a multiple of the warp size and capped at the
profile's ``max_threads_per_block``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from gensorage.construction.schedule import construct_schedule
from gensorage.hw.profile import HwProfile
from gensorage.workloads.data import SUPPORTED_DTYPES
from gensorage.workloads.workload import Workload


@dataclass(frozen=True, slots=True)
class MatmulTiling:
    """Thread/register tiling of one block matmul with output tile ``(batch, m, n)`` (see the module docstring).

    Attributes are per spatial axis ``(b, i, j)``; ``k`` is the reduction extent.
    """

    extents: tuple[int, int, int]
    k: int
    t0: tuple[int, int, int]
    t1: tuple[int, int, int]
    vthreads: tuple[int, int, int]
    workload: str
    constructed_t1: tuple[int, int, int] | None = (
        None  # the constructor's T1 before widening to the fixed grid
    )

    @property
    def threads_per_axis(self) -> tuple[int, int, int]:
        b, i, j = (-(-t1 // t0) for t1, t0 in zip(self.t1, self.t0, strict=True))
        return b, i, j

    @property
    def threads(self) -> int:
        return math.prod(self.threads_per_axis)

    @property
    def steps(self) -> tuple[int, int, int]:
        """``T1`` tiles per axis the block walks (``ceil(extent / T1)``)."""
        b, i, j = (-(-e // t1) for e, t1 in zip(self.extents, self.t1, strict=True))
        return b, i, j

    def describe(self) -> str:
        widened = (
            f" (constructed {list(self.constructed_t1)}, widened to the fixed grid)"
            if self.constructed_t1 not in (None, self.t1)
            else ""
        )
        return (
            f"markov construct on {self.workload}: register tile T0={list(self.t0)}, block tile "
            f"T1={list(self.t1)}{widened}, vthreads={list(self.vthreads)} -> {self.threads} threads"
        )


@dataclass(frozen=True, slots=True)
class ThreadChoice:
    """Threads per block, the block node tiled by the constructor (None: fallback rule), and why; ``mma_warps``
    pairs a tensor-core block matmul with the warps that compute it (the others idle in its phase; one not
    listed runs on all of them), see :mod:`gensorage.codegen.mma_threads`; ``runs``: whether shared memory is
    read and written 16 bytes at a time where the layout allows (``ldmatrix`` fragment loads,
    :mod:`gensorage.codegen.block_mma`; ``cp.async`` tile loads, :mod:`gensorage.codegen.block_loads`), False:
    element by element, e.g. to measure the difference; ``stages``: shared-memory stages of the for-loop's
    ``cp.async`` tiles (2 or 3: the copies of the next iterations are in flight while this one computes,
    :mod:`gensorage.codegen.block_loads`; 1: each iteration waits for its own copies), chosen by
    :mod:`gensorage.construction.pipeline_stages`; ``shared_limit``: the shared bytes per block the kernel's
    tiles with their stages may take, else it has one stage (0: any GPU's,
    :data:`gensorage.codegen.gpu_limits.STAGED_SHARED_LIMIT`; the construction sets its profile's)."""

    threads: int
    matmul_node: int | None
    tiling: MatmulTiling | None
    rule: str
    mma_warps: tuple[tuple[int, int], ...] = ()
    runs: bool = True
    stages: int = 1
    shared_limit: int = 0


def matmul_workload(batch: int, m: int, n: int, k: int, dtype: str) -> Workload:
    """The construction workload of a matmul tile (``gemm`` for ``batch == 1``, else ``batch_matmul``)."""
    from gensorage import workloads

    dt = dtype if dtype in SUPPORTED_DTYPES else "float32"
    return workloads.gemm(m, n, k, dt) if batch == 1 else workloads.batch_matmul(batch, m, n, k, dt)


@lru_cache(maxsize=1024)  # a construction takes about a second; lowering asks again for every compile
def matmul_tiling(
    batch: int, m: int, n: int, k: int, dtype: str, hw: HwProfile, seed: int = 0, blocks: int = 1
) -> MatmulTiling:
    """Construct the tiling of a ``(batch, m, n, k)`` block matmul on ``hw`` for a grid of ``blocks`` blocks."""
    wl = matmul_workload(batch, m, n, k, dtype)
    s = construct_schedule(wl, hw, seed)
    pos = {a: i for i, a in enumerate(s.axes)}

    def pick(level: tuple[int, ...], axis: str) -> int:
        return level[pos[axis]] if axis in pos else 1

    t0 = (pick(s.tiles[0], "b"), pick(s.tiles[0], "i"), pick(s.tiles[0], "j"))
    t1 = (pick(s.tiles[1], "b"), pick(s.tiles[1], "i"), pick(s.tiles[1], "j"))
    v = (pick(s.vthreads, "b"), pick(s.vthreads, "i"), pick(s.vthreads, "j"))
    extents = (batch, m, n)
    return MatmulTiling(
        extents, k, t0, widen_block_tile(extents, t0, t1, thread_cap(hw, blocks)), v, wl.key(), t1
    )


def thread_cap(hw: HwProfile, blocks: int) -> int:
    """The most threads a block of a ``blocks``-block grid widens to: the block limit, or the grid's share of
    the GPU's threads (at least a warp)."""
    return min(
        hw.max_threads_per_block, max(hw.warp_size, hw.sm_count * hw.max_threads_per_sm // max(1, blocks))
    )


def widen_block_tile(
    extents: tuple[int, int, int], t0: tuple[int, int, int], t1: tuple[int, int, int], cap: int
) -> tuple[int, int, int]:
    """``t1`` doubled along ``j``, ``i``, then ``b`` (at most to the extent) while ``prod(ceil(T1 / T0)) <= cap``."""
    tile = list(t1)
    for ax in (2, 1, 0):
        while tile[ax] < extents[ax]:
            wider = tile.copy()
            wider[ax] = min(extents[ax], 2 * tile[ax])
            if math.prod(-(-w // z) for w, z in zip(wider, t0, strict=True)) > cap:
                break
            tile = wider
    return tile[0], tile[1], tile[2]


def fallback_threads(largest_tile: int, hw: HwProfile) -> int:
    """One thread per element of the largest tile, a multiple of the warp size, at most the block limit."""
    warp = hw.warp_size
    want = -(-max(1, largest_tile) // warp) * warp
    cap = max(warp, hw.max_threads_per_block // warp * warp)
    return min(want, cap)


#: Most threads of a graph-defined kernel without a block matmul (a row kernel: element-wise phases and block
#: reductions). On the H200 such kernels ran as fast or faster on 256-512 threads than on 1024 (fewer warps
#: meet at each barrier and combine partials; CHANGELOG has the figures).
ROW_KERNEL_THREADS = 512


def row_kernel_threads(largest_tile: int, hw: HwProfile) -> int:
    """Threads of a block graph without a matmul: :func:`fallback_threads`, at most :data:`ROW_KERNEL_THREADS`."""
    return min(fallback_threads(largest_tile, hw), max(hw.warp_size, ROW_KERNEL_THREADS))


__all__ = [
    "thread_cap",
    "MatmulTiling",
    "ThreadChoice",
    "fallback_threads",
    "ROW_KERNEL_THREADS",
    "row_kernel_threads",
    "matmul_tiling",
    "matmul_workload",
    "widen_block_tile",
]

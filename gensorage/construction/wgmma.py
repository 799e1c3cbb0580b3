"""The cost model and moves of wgmma matmul kernels (:mod:`gensorage.codegen.wgmma`), one level of the
tensor-core construction (:mod:`gensorage.construction.tensor_core`).

A wgmma state is a :class:`~gensorage.codegen.wgmma.WgmmaTiles`: warpgroups per block (64 rows each), the
block's N tile (the wgmma's N) and the pipeline stages; the reduction step is fixed at 64 (one 128-byte
swizzle row). Its time is priced like ``mma.sync``'s (:func:`~gensorage.construction.tensor_core_cost.time_and_bound`
for L2, DRAM, latency and bytes in flight) with the instruction's own terms:

* compute: per reduction step, the MMAs of the SM's resident blocks at the profile's tensor rate times
  ``wgmma_fraction`` (what these kernels reach), or the step's issue (``step_cycles``: barriers, waits,
  copies) when that is longer;
* latency: a step's copies take the memory latency, rising to ``wgmma_latency_cycles`` as the grid fills the
  GPU; the steps whose copies are already in flight and the wgmma groups still running cover part of it, the
  rest stalls every step (shared among the resident blocks). This is what makes a two-stage ring 1.34x slower
  than a three-stage one on the H200;
* L2 and DRAM (shared with ``mma.sync``) count only the rows a block has: rows past the matrix (a 64-row
  wgmma on a 16-row GEMM) are zero-filled without a read;
* shared memory: wgmma reads its operands from shared memory, each warpgroup its own A rows and the whole B
  tile, besides the copies that fill it; the accumulators go to global memory from registers;
* TMA loads (``tma``, :mod:`gensorage.codegen.wgmma_tma`): the MMAs at ``tma_wgmma_fraction`` of the peak,
  the tiles streamed from L2 at ``tma_l2_fraction`` of its bandwidth (the copy engine, not the threads'
  16-byte copies), no per-step issue floor; besides, each tile's write-back from registers (at the SM's share
  of DRAM bandwidth) and its ring's fill (the loaded latency, once per block on a persistent grid) while no
  MMA of the block runs (the consumers neither copy nor pass block barriers), the producer warpgroup's
  threads and the registers ``setmaxnreg`` splits counted in the occupancy.

``wgmma_fraction`` is 0 on profiles without wgmma: there the construction never considers it.
"""

from __future__ import annotations

from dataclasses import replace

from gensorage.codegen.wgmma import BLOCK_K, WG_M, WgmmaTiles, shared_bytes, unsupported
from gensorage.codegen.wgmma_tma import SETMAXNREG
from gensorage.hw.profile import HwProfile
from gensorage.markov.cost_model import blocks_per_sm

REGISTER_FILE = 65536  # 32-bit registers of an SM, the most one block may have
REGISTER_OVERHEAD = 40  # addresses, descriptors, loop counters per thread (ptxas reports: 72 at N = 64)


def registers(t: WgmmaTiles) -> int:
    """Registers per thread: the float32 accumulators (N / 2) and overhead that grows with the unrolled
    epilogue (ptxas: 72, 110, 188 at N = 64, 128, 256); with ``setmaxnreg`` (TMA, two consumer warpgroups)
    the launch bounds' whole share of the register file, which ptxas allocates at launch. (A TMA block of four
    consumer warpgroups and N = 128 gets no more than 96 at 640 threads, and ptxas refuses its wgmma: the
    estimate of 120 keeps it out of the occupancy.)"""
    if t.tma and t.warpgroups in SETMAXNREG:
        return REGISTER_FILE // t.threads // 8 * 8  # what __launch_bounds__(threads) leaves a thread
    return t.accumulators + REGISTER_OVERHEAD + t.block_n // 8


def wgmma_available(hw: HwProfile) -> bool:
    """Whether the construction considers wgmma on ``hw`` (a Hopper profile with a measured rate)."""
    return hw.calibration.wgmma_fraction > 0 and hw.arch.startswith("sm_90")


def tma_available(hw: HwProfile) -> bool:
    """Whether ``hw`` prices the warp-specialised TMA kernels (a wgmma profile with their rate)."""
    return wgmma_available(hw) and hw.calibration.tma_wgmma_fraction > 0


def predict_wgmma_time(
    dims: tuple[int, int, int, int], t: WgmmaTiles, hw: HwProfile, dtype: str = "float16"
) -> tuple[float, str, int, int, int] | None:
    """(time, bound, blocks, blocks per SM, waves) of the wgmma kernel for ``(batch, m, n, k)``; None when it
    cannot run on ``hw`` or does not cover the shape."""
    from gensorage.construction.tensor_core_cost import Grid, time_and_bound

    batch, m, n, k = dims
    regs, smem = registers(t), shared_bytes(t)
    if t.invalid() or unsupported(m, n, k) or not (tma_available(hw) if t.tma else wgmma_available(hw)):
        return None
    if regs > hw.max_registers_per_thread or smem > hw.shared_mem_per_block:
        return None
    bps = blocks_per_sm(hw, t.threads, regs, smem)
    if bps == 0:
        return None
    cal = hw.calibration
    gm, gn, kp = -(-m // t.block_m), -(-n // t.block_n), -(-k // BLOCK_K) * BLOCK_K
    blocks = batch * gm * gn
    waves = -(-blocks // (hw.sm_count * bps))
    resident = min(bps, -(-blocks // hw.sm_count))
    fraction = cal.tma_wgmma_fraction if t.tma else cal.wgmma_fraction
    rate_sm = hw.flops(dtype, True) * fraction / hw.sm_count
    steps = kp // BLOCK_K
    # One step of the SM's resident blocks: their MMAs, or the issue of the step (barriers, waits, copies);
    # with TMA the consumers issue no copies and pass no block barrier, the producer's copies run beside them.
    step_s = resident * 2.0 * t.block_m * t.block_n * BLOCK_K / rate_sm
    step_s = step_s if t.tma else max(step_s, cal.step_cycles / hw.clock_hz)
    # A step's copies take the memory latency, which grows to the loaded one as the grid fills the GPU; the
    # steps in flight ahead of it (and the other resident blocks) cover part of it, the rest stalls the step.
    idle = hw.level("dram").latency_cycles
    latency = idle + (cal.wgmma_latency_cycles - idle) * min(1.0, blocks / hw.sm_count)
    exposed = max(0.0, latency / hw.clock_hz - (t.ahead - 1 + t.in_flight) * step_s)
    compute_s = steps * (step_s + exposed / resident)
    reads = t.warpgroups * (WG_M + t.block_n) * kp * 2
    writes = (t.block_m + t.block_n) * kp * 2
    shared_s = resident * (reads + writes) / (hw.level("shared").bandwidth_Bps / hw.sm_count)
    warps = t.threads // hw.warp_size
    # Rows and columns past the matrix are zero-filled without a read: a block moves only the rows it has.
    rows, cols = min(t.block_m, m), min(t.block_n, n)
    grid = Grid((batch, m, n, k), rows, cols, BLOCK_K, t.stages, warps, blocks, resident, waves)
    l2_fraction = cal.tma_l2_fraction if t.tma else None
    total, bound = time_and_bound(grid, {"compute": compute_s, "shared": shared_s}, hw, l2_fraction)
    if t.tma:
        total += _tma_serial_s(t, hw, blocks, resident, waves, latency)
    return total, bound, blocks, bps, waves


def _tma_serial_s(
    t: WgmmaTiles, hw: HwProfile, blocks: int, resident: int, waves: int, latency: float
) -> float:
    """What a TMA block does while none of its MMAs run: it writes each tile back from registers, and its
    ring fills at each tile's start, unless the grid is persistent (the producer runs on into the next tile,
    so only the first tile's fill is exposed)."""
    dram_sm = hw.level("dram").bandwidth_Bps * hw.calibration.dram_fraction / hw.sm_count
    rounds = -(-blocks // min(blocks, t.persistent)) if t.persistent else waves
    write_s = resident * t.block_m * t.block_n * 2 / dram_sm
    return rounds * write_s + (1 if t.persistent else rounds) * latency / hw.clock_hz


def wgmma_neighbours(
    t: WgmmaTiles, dims: tuple[int, int, int, int], tma: bool = False, sms: int = 0
) -> list[WgmmaTiles]:
    """The wgmma states one action away that fit the shape: warpgroups, the N tile doubled or halved, one stage
    more or less, one or two wgmma groups in flight, and (``tma``: 2-D operands) the loads by cp.async or by a
    TMA producer warpgroup, and a TMA kernel's grid of one block per tile or persistent over ``sms`` blocks."""
    out = [
        replace(t, warpgroups=t.warpgroups * 2),
        replace(t, warpgroups=t.warpgroups // 2),
        replace(t, block_n=t.block_n * 2),
        replace(t, block_n=t.block_n // 2),
        replace(t, stages=t.stages + 1),
        replace(t, stages=t.stages - 1),
        replace(t, pending=3 - t.pending),
        *([replace(t, tma=not t.tma, staged=False, stages=max(2, t.stages), persistent=0)] if tma else []),
        *([replace(t, persistent=0 if t.persistent else sms)] if t.tma and sms else []),
    ]
    return [s for s in out if s != t and wgmma_fits(s, dims) and (tma or not s.tma)]


def wgmma_fits(t: WgmmaTiles, dims: tuple[int, int, int, int]) -> bool:
    """Whether the construction's space holds ``t`` for this shape: no block taller than the rows (beyond one
    warpgroup; with TMA none at all: on the H200 a decode-sized GEMM, 16 x 14336 x 4096, ran at 0.60x of cuBLAS
    with TMA against 0.77x with cp.async) or wider than the columns (beyond 64), a pipelined loop when there are
    several steps."""
    _, m, n, k = dims
    steps = -(-k // BLOCK_K)
    return (
        t.invalid() is None
        and unsupported(m, n, k) is None
        and (t.warpgroups == 1 and not t.tma or t.block_m <= m)
        and (t.block_n == 64 or t.block_n <= n)
        and t.stages <= max(1, steps)
        and (t.stages >= 2 or steps == 1)
        and (t.pending == 1 or t.stages >= 3)  # two groups in flight leave a slot for the copies
    )

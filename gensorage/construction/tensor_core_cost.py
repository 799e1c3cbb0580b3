"""The cost model of the ``mma.sync`` kernels that :mod:`gensorage.codegen.tensor_core` emits.

``mma.sync`` at the profile's tensor rate times the fraction of it that warp-level MMA reaches on the device
(``mma_sync_fraction``), occupancy from registers, shared memory and threads, wave quantization, the bytes each
level moves (the operand tiles every block re-reads from L2, the fragment loads and the staged tiles in shared
memory, DRAM traffic with L2 reuse within a wave), the bytes in flight (Little's law; a gathered operand keeps
fewer in flight), one exposed global round trip per reduction step when the loop is not pipelined, split-k's
partials, and the launch overhead. :func:`time_and_bound` is shared with the wgmma kernels
(:mod:`gensorage.construction.wgmma`).
"""

from __future__ import annotations

from dataclasses import dataclass

from gensorage.codegen.tensor_core import MMA, WARP, TensorCoreTiles, shared_bytes
from gensorage.hw.profile import HwProfile
from gensorage.markov.cost_model import blocks_per_sm

REGISTER_OVERHEAD = 40  # addresses, loop counters and pipeline bookkeeping per thread (ptxas reports)
LDMATRIX_BYTES = 512  # one ldmatrix.x4: four 8 x 8 matrices of 16-bit elements


@dataclass(frozen=True, slots=True)
class TensorCoreCost:
    """The predicted time of a tensor-core kernel and the term that bounds it."""

    total_s: float
    bound: str
    blocks: int
    blocks_per_sm: int
    waves: int


def registers(t: TensorCoreTiles) -> int:
    """Registers per thread: float32 accumulators, the A/B fragments of one k step, and overhead."""
    acc = t.warp_m * t.warp_n // WARP
    frags = (t.warp_m // MMA) * 4 + (t.warp_n // MMA) * 4
    return acc + frags + REGISTER_OVERHEAD


def fragment_loads(t: TensorCoreTiles) -> int:
    """``ldmatrix.x4`` per warp and 16-deep k step: one per 16 x 16 A fragment (``warp_m / 16``) and one per
    two 16 x 8 B fragments (``warp_n / 16``). They feed ``(warp_m / 16) * (warp_n / 8)`` MMAs, so a square
    warp tile loads the fewest per MMA (64 x 64: 8 for 32) and a thin one the most (256 x 16: 17 for 32)."""
    return (t.warp_m + t.warp_n) // MMA


def ldmatrix_cycles(hw: HwProfile) -> float:
    """SM cycles per ``ldmatrix.x4``: the profile's calibrated value, else its 512 bytes at the shared-memory
    bandwidth (4 cycles at 128 bytes per cycle)."""
    if hw.calibration.ldmatrix_cycles > 0:
        return hw.calibration.ldmatrix_cycles
    return LDMATRIX_BYTES / (hw.level("shared").bandwidth_Bps / hw.sm_count / hw.clock_hz)


def predict_tensor_core_time(
    dims: tuple[int, int, int, int],
    tiles: TensorCoreTiles,
    hw: HwProfile,
    dtype: str = "float16",
    gather: bool = False,
) -> TensorCoreCost | None:
    """Predicted time of the tensor-core kernel for ``(batch, m, n, k)``; None when it cannot run on ``hw``.

    ``gather``: the operands are gathered element by element (a convolution's implicit GEMM), so each warp keeps
    ``gather_flight_bytes`` in flight instead of its asynchronous copies' ``warp_flight_bytes``."""
    batch, m, n, k = dims
    t = tiles
    if t.split_k > 1:  # each split is one batch of the MMA kernel over k / split_k; see _split_epilogue_s
        if batch != 1 or k % t.split_k:
            return None
        batch, k = t.split_k, k // t.split_k
    regs = registers(t)
    smem = shared_bytes(t)
    if t.invalid() or regs > hw.max_registers_per_thread or smem > hw.shared_mem_per_block:
        return None
    bps = blocks_per_sm(hw, t.threads, regs, smem)
    if bps == 0:
        return None
    cal = hw.calibration
    gm, gn, kp = -(-m // t.block_m), -(-n // t.block_n), -(-k // t.block_k) * t.block_k
    blocks = batch * gm * gn
    waves = -(-blocks // (hw.sm_count * bps))
    resident = min(bps, -(-blocks // hw.sm_count))
    # Tensor rate: a sub-core needs several independent MMAs in flight to hide the mma.sync latency.
    in_flight = resident * t.warps / 4 * (t.warp_m // MMA) * (t.warp_n // 8)
    ilp = min(1.0, in_flight / cal.mma_in_flight)
    rate_sm = hw.flops(dtype, True) * cal.mma_sync_fraction / hw.sm_count
    block_flops = 2.0 * t.block_m * t.block_n * kp
    steps = kp // t.block_k
    # Each reduction step also costs its barriers, the wait for its copies and its address arithmetic.
    compute_s = resident * block_flops / (rate_sm * ilp) + steps * cal.step_cycles / hw.clock_hz
    # Shared memory: operand tiles written once per step and the staged write-back at its bandwidth; the
    # warps' fragment loads (ldmatrix) at ldmatrix_cycles each, which the warp tile sets (fragment_loads).
    # The fragment pipeline overlaps them with the MMAs: the slower of the two bounds the loop.
    shared_bw = hw.level("shared").bandwidth_Bps / hw.sm_count
    ldmatrix_s = t.warps * fragment_loads(t) * (kp // MMA) * ldmatrix_cycles(hw) / hw.clock_hz
    staged = (t.block_m + t.block_n) * kp * 2 + 2 * t.block_m * t.block_n * 4
    shared_s = resident * (ldmatrix_s + staged / shared_bw)
    if t.stages == 1:  # the one-stage loop waits for each step's tiles before its MMAs, in series
        compute_s += steps * hw.level("dram").latency_cycles / hw.clock_hz
    grid = Grid(
        (batch, m, n, k), t.block_m, t.block_n, t.block_k, t.stages, t.warps, blocks, resident, waves, gather
    )
    total, bound = time_and_bound(grid, {"compute": compute_s, "shared": shared_s}, hw)
    if t.split_k > 1:
        total += _split_epilogue_s(t.split_k, m, n, hw)
    return TensorCoreCost(total, bound, blocks, bps, waves)


@dataclass(frozen=True, slots=True)
class Grid:
    """What the memory terms of a block-tiled GEMM need: its shape, block tile, pipeline and occupancy."""

    dims: tuple[int, int, int, int]
    block_m: int
    block_n: int
    block_k: int
    stages: int
    warps: int
    blocks: int
    resident: int  # blocks per SM in a full wave
    waves: int
    gather: bool = False  # operands gathered element by element (no asynchronous vector copies)


def time_and_bound(
    g: Grid, sm_terms: dict[str, float], hw: HwProfile, l2_fraction: float | None = None
) -> tuple[float, str]:
    """The kernel's predicted time and the term that bounds it: the slowest of the per-SM terms of a wave
    (``sm_terms``: the instruction's compute and shared-memory terms; L2, latency and bytes in flight here)
    times the waves, or DRAM over the whole grid, plus the launch.

    Shared by both tensor-core instructions (``mma.sync``, ``wgmma``): they move the same tiles through L2
    and DRAM, at ``l2_fraction`` of the L2 bandwidth (default the profile's ``l2_fraction``; TMA copies have
    their own).
    """
    batch, m, n, k = g.dims
    cal = hw.calibration
    kp = -(-k // g.block_k) * g.block_k
    tile_bytes = (g.block_m + g.block_n) * kp * 2
    l2_bw = hw.level("l2").bandwidth_Bps * (cal.l2_fraction if l2_fraction is None else l2_fraction)
    l2_s = g.resident * tile_bytes / (l2_bw / hw.sm_count)
    # DRAM: C once; A once (a wave sweeps whole rows of blocks); B once per wave unless it stays in L2.
    a_bytes, b_bytes, c_bytes = 2 * batch * m * k, 2 * batch * k * n, 2 * batch * m * n
    b_reads = 1 if b_bytes <= hw.l2_bytes // 2 else g.waves
    # A grid smaller than the GPU streams from DRAM with only its SMs' load units: split-k's reason to be.
    sm_share = min(1.0, g.blocks / hw.sm_count)
    dram_bw = hw.level("dram").bandwidth_Bps * cal.dram_fraction * sm_share
    dram_s = (a_bytes + b_reads * b_bytes + c_bytes) / dram_bw
    # Latency: a pipelined loop overlaps the copies with the MMAs; only its filling steps are exposed.
    global_lat = hw.level("dram").latency_cycles
    latency_s = g.stages * global_lat / hw.clock_hz
    # Little's law: the operand bytes in flight (one tile per pipeline stage ahead, at most what the block's
    # warps keep outstanding) over the memory latency.
    per_warp = cal.gather_flight_bytes if g.gather and cal.gather_flight_bytes > 0 else cal.warp_flight_bytes
    ahead = min(max(1, g.stages - 1) * (g.block_m + g.block_n) * g.block_k * 2, g.warps * per_warp)
    flight_s = g.resident * tile_bytes * global_lat / (g.resident * ahead * hw.clock_hz)
    terms = {**sm_terms, "l2": l2_s, "latency": latency_s, "in_flight": flight_s}
    bound = max(terms, key=lambda name: terms[name])
    wave_s = terms[bound]
    if dram_s > g.waves * wave_s:
        bound, body = "dram", dram_s
    else:
        body = g.waves * wave_s
    return cal.launch_overhead_s + body, bound


def _split_epilogue_s(split: int, m: int, n: int, hw: HwProfile) -> float:
    """The split-k kernel's extra cost: its float32 partials written and read back, and the adding kernel."""
    cal = hw.calibration
    partials = 2 * split * m * n * 4 + 2 * m * n
    return cal.launch_overhead_s + partials / (hw.level("dram").bandwidth_Bps * cal.dram_fraction)

"""Analytic cost model: predicted kernel time of a schedule on a hardware profile, with no measurement.

Every search method (Markov construction, Roller, Optuna, random) is scored by :func:`predict_schedule_time`, so this
one function defines what "better" means in the benchmark. The model, per thread block and per wave:

- occupancy: resident blocks per SM from threads, registers (allocated per warp) and shared memory;
- wave quantization: ``waves = ceil(blocks / (SMs * blocks_per_SM))``, each wave as slow as a full one;
- per SM and wave, the slowest of: compute (peak FLOP/s scaled by lane use and ILP/latency hiding, or the issue
  slots of all instructions: math, shared-memory loads, the cooperative global->shared copy with 16-byte
  vectors where aligned, whichever is slower), shared-memory traffic (times the bank-conflict degree of the
  warp's access),
  L2 traffic (global->shared loads, rounded up to 32-byte sectors), register-operand traffic, and the latency
  chain of one block (one global round trip and two barriers per reduction chunk plus its own instruction
  stream);
- DRAM traffic over the whole kernel: data shared by the blocks of one wave is fetched from DRAM once (they
  run in lockstep over the reduction, so their shared slabs hit in L2); nothing is assumed to survive in L2
  across waves unless all inputs fit in half of L2;
- plus a constant launch overhead.

Assumptions, stated once: scalar (non-vectorized) shared-memory loads by CUDA-core kernels; tensor cores
(``mma.sync`` m16n8k16 class) are used when the dtype is float16/bfloat16, the profile has a tensor-core peak
for it, the workload is a two-input contraction (each input has a spatial axis the other lacks, both share a
reduction axis), and the schedule's tiles are MMA-shaped: a full warp per block at least, a warp tile of at
least 16 x 8 outputs, at least 4 accumulators per thread and a reduction chunk of at least 16. Tensor-core
fragments are loaded per warp (ldmatrix) from a conflict-free (swizzled) layout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from gensorage.errors import ScheduleError
from gensorage.hw.profile import HwProfile
from gensorage.markov.schedule import Schedule
from gensorage.markov.space import SHARED_RESERVED_PER_BLOCK, AccessInfo, ScheduleSpace, space_for
from gensorage.workloads.workload import Workload

LAUNCH_OVERHEAD_S = 2e-6  # kernel launch + tail as seen by a device-side timer

# The model prices the code gensorage emits. ``gensorage.codegen.lower_schedule`` emits CUDA-core FMA loops that
# accumulate 16-bit inputs in float32 (no mma/wgmma), so tensor cores stay off and 16-bit math is priced at the
# float32 CUDA-core peak. Flip this only together with a lowering that emits MMA instructions.
EMITS_TENSOR_CORES = False
SCHEDULERS_PER_SM = 4  # warp schedulers per SM on every NVIDIA GPU since Maxwell
FMA_DEPENDENT_CYCLES = (
    4  # cycles before a dependent FMA can issue; hidden by warps x independent accumulators
)
MMA_DEPENDENT_CYCLES = 16  # same for one warp-wide mma.sync
SYNC_CYCLES = 20  # one __syncthreads with all warps arriving together
TENSOR_CORE_DTYPES = frozenset({"float16", "bfloat16"})


@dataclass(frozen=True, slots=True)
class CostBreakdown:
    """The terms :func:`predict_schedule_time` combines (seconds unless named otherwise)."""

    blocks: int
    threads_per_block: int
    blocks_per_sm: int
    waves: int
    tensor_cores: bool
    compute_s: float  # per wave
    shared_s: float  # per wave
    l2_s: float  # per wave
    register_s: float  # per wave
    latency_s: float  # per wave
    dram_s: float  # whole kernel
    bank_conflict: float  # mean conflict degree of the shared-memory fragment loads
    total_s: float


def predict_schedule_time(workload: Workload, hw: HwProfile, schedule: Schedule) -> float:
    """Predicted execution time of ``schedule`` for ``workload`` on ``hw``, in seconds.

    Parameters
    ----------
    workload, hw, schedule
        The loop nest, the GPU profile and the tiling to score.

    Returns
    -------
    float
        Seconds; ``math.inf`` when the schedule is malformed or does not fit the GPU (threads per block,
        registers per thread or per SM, shared memory per block or per SM).
    """
    b = breakdown(workload, hw, schedule)
    return math.inf if b is None else b.total_s


def breakdown(workload: Workload, hw: HwProfile, schedule: Schedule) -> CostBreakdown | None:
    """The terms of :func:`predict_schedule_time`, or ``None`` when the schedule does not fit."""
    return space_breakdown(space_for(workload, hw), schedule)


def space_time(space: ScheduleSpace, schedule: Schedule) -> float:
    """:func:`predict_schedule_time` for callers that already hold the space."""
    b = space_breakdown(space, schedule)
    return math.inf if b is None else b.total_s


# ----------------------------------------------------------------------------------------- occupancy
def blocks_per_sm(hw: HwProfile, threads: int, registers: int, shared: int) -> int:
    """Resident blocks per SM allowed by threads, registers (per-warp allocation) and shared memory."""
    warps = -(-threads // hw.warp_size)
    limit = min(hw.max_blocks_per_sm, hw.max_threads_per_sm // (warps * hw.warp_size))
    regs_per_warp = -(-registers * hw.warp_size // 256) * 256  # allocated in units of 256 per warp
    limit = min(limit, hw.registers_per_sm // (regs_per_warp * warps))
    if shared > 0:
        limit = min(limit, hw.shared_mem_per_sm // (shared + SHARED_RESERVED_PER_BLOCK))
    return max(0, limit)


# ------------------------------------------------------------------------------------- tensor cores
@lru_cache(maxsize=64)
def _mma_groups(space: ScheduleSpace) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(M-like axes, N-like axes) when the workload is a two-input contraction, else None."""
    if not EMITS_TENSOR_CORES or space.workload.dtype not in TENSOR_CORE_DTYPES or len(space.inputs) != 2:
        return None
    dtype = space.workload.dtype
    try:
        if space.hw.flops(dtype, True) <= space.hw.flops(dtype, False):
            return None
    except KeyError:
        return None
    a, b = space.inputs
    spatial, reduce = set(space.spatial), set(space.reduce)
    m = tuple(sorted((a.axes_used - b.axes_used) & spatial))
    n = tuple(sorted((b.axes_used - a.axes_used) & spatial))
    if not m or not n or not (a.axes_used & b.axes_used & reduce):
        return None
    return m, n


def uses_tensor_cores(space: ScheduleSpace, s: Schedule, threads: int) -> bool:
    """Whether the schedule's tiles are MMA-shaped on a workload and dtype tensor cores can run."""
    groups = _mma_groups(space)
    if groups is None or threads < space.hw.warp_size:
        return False
    t0, t1 = s.tiles[0], s.tiles[1]
    if math.prod(t0[a] for a in space.spatial) < 4:
        return False
    if math.prod(t1[a] for a in space.reduce) < 16:
        return False
    lanes = space.warp_lanes(s)
    wm = math.prod(lanes[a] * t0[a] for a in groups[0])
    wn = math.prod(lanes[a] * t0[a] for a in groups[1])
    return (wm >= 16 and wn >= 8) or (wm >= 8 and wn >= 16)


# ------------------------------------------------------------------------------------ bank conflicts
def bank_conflict(space: ScheduleSpace, s: Schedule, t: AccessInfo) -> int:
    """Conflict degree of the first warp's load of its first register-fragment element of ``t``.

    The block tile of ``t`` sits row-major in shared memory; lane ``l`` holds thread coordinates (last spatial
    axis fastest) and along axis ``a`` starts at ``thread * T_0 / vthreads``. The degree is the largest number
    of distinct 4-byte words that fall in one bank (same word = broadcast, no conflict).
    """
    hw = space.hw
    t0, t1, v = s.tiles[0], s.tiles[1], s.vthreads
    dims = tuple(
        min(size, 1 + sum(c * (t1[a] - 1) for a, c in row)) for size, row in zip(t.shape, t.dims, strict=True)
    )
    strides = [1] * len(dims)
    for d in range(len(dims) - 2, -1, -1):
        strides[d] = strides[d + 1] * dims[d + 1]
    per_axis = {a: -(-t1[a] // t0[a]) for a in space.spatial}
    threads = math.prod(per_axis.values())
    words_per_bank: dict[int, set[int]] = {}
    bank_bytes = hw.bank_width_bytes
    for lane in range(min(threads, hw.warp_size)):
        rest = lane
        offset = {}
        for a in reversed(space.spatial):
            offset[a] = (rest % per_axis[a]) * (t0[a] // v[a])
            rest //= per_axis[a]
        linear = 0
        for d, row in enumerate(t.dims):
            idx = sum(c * offset.get(a, 0) for a, c in row)
            linear += min(idx, dims[d] - 1) * strides[d]
        word = linear * t.elem_bytes // bank_bytes
        words_per_bank.setdefault(word % hw.shared_banks, set()).add(word)
    return max((len(w) for w in words_per_bank.values()), default=1)


# ----------------------------------------------------------------------------------------- traffic
def _sector_efficiency(space: ScheduleSpace, t: AccessInfo, tile: tuple[int, ...]) -> float:
    """Useful fraction of the 32-byte sectors a block's tile of ``t`` occupies in global memory."""
    run = 1
    for d in range(len(t.shape) - 1, -1, -1):
        span = min(t.shape[d], 1 + sum(c * (tile[a] - 1) for a, c in t.dims[d]))
        run *= span
        if span < t.shape[d]:
            break
    nbytes = run * t.elem_bytes
    sector = space.hw.transaction_bytes
    return nbytes / (-(-nbytes // sector) * sector)


def _vector_width(space: ScheduleSpace, t: AccessInfo, tile: tuple[int, ...]) -> int:
    """Elements per load of the cooperative copy: the lowering vectorizes (up to 16 bytes) where the tile's
    contiguous run and the tensor's rows are multiples of the vector, else it copies element by element."""
    run = space.tensor_elems_dim(t, -1, tile)
    vec = max(1, 16 // t.elem_bytes)
    while vec > 1 and (run % vec or t.shape[-1] % vec):
        vec //= 2
    return vec


def _wave_tile(space: ScheduleSpace, s: Schedule, blocks_in_wave: int) -> tuple[int, ...]:
    """The iteration-space region one wave of blocks covers (blocks launched with the last axis fastest)."""
    t1 = s.tiles[1]
    region = list(space.extents)
    rest = blocks_in_wave
    for a in reversed(space.spatial):
        n = -(-space.extents[a] // t1[a])
        take = min(n, rest)
        region[a] = min(space.extents[a], take * t1[a])
        rest = max(1, -(-rest // take))
    return tuple(region)


def _dram_bytes(space: ScheduleSpace, s: Schedule, waves: int, wave_blocks: int, l2_loads: int) -> int:
    out = space.output
    out_bytes = space.tensor_elems(out, space.extents) * out.elem_bytes
    compulsory = sum(space.tensor_elems(t, space.extents) * t.elem_bytes for t in space.inputs)
    if compulsory <= space.hw.l2_bytes // 2:
        return compulsory + out_bytes
    region = _wave_tile(space, s, wave_blocks)
    per_wave = sum(space.tensor_elems(t, region) * t.elem_bytes for t in space.inputs)
    return max(compulsory, min(l2_loads, waves * per_wave)) + out_bytes


# ------------------------------------------------------------------------------------------- model
def space_breakdown(space: ScheduleSpace, s: Schedule) -> CostBreakdown | None:
    """:func:`breakdown` on a prebuilt space."""
    if not space.fits(s):
        return None
    hw = space.hw
    res = space.resources(s)
    bps = blocks_per_sm(hw, res.threads, res.registers_per_thread, res.shared_bytes)
    if bps == 0:
        return None
    t0, t1 = s.tiles[0], s.tiles[1]
    blocks = math.prod(-(-space.extents[a] // t1[a]) for a in space.spatial)
    waves = -(-blocks // (hw.sm_count * bps))
    resident = min(bps, -(-blocks // hw.sm_count))  # blocks per SM in a full wave
    warps = -(-res.threads // hw.warp_size)
    tc = uses_tensor_cores(space, s, res.threads)

    padded = 1.0
    for a, e in enumerate(space.extents):
        padded *= -(-e // t1[a]) * -(-t1[a] // t0[a]) * t0[a] / e
    block_flops = space.workload.flops * padded / blocks
    chunks = math.prod(-(-space.extents[a] // t1[a]) for a in space.reduce)  # reduction chunks per block
    steps = math.prod(space.tile_counts(s, 0)[a] for a in space.reduce)  # register steps per thread

    # Shared-memory reads (bytes per block, conflicts included) and the instructions issuing them.
    reg_loads, lds_instr, conflicts = _shared_reads(space, s, tc, res.threads, warps, steps)
    l1_traffic = space.tensor_traffic(s, 1)
    shared_writes = sum(b for t, b in l1_traffic if not t.is_output) / blocks
    l2_bytes = sum(b / _sector_efficiency(space, t, t1) for t, b in l1_traffic) / blocks
    # Cooperative global->shared copy: one load and one store instruction per vector and thread.
    fetch_vectors = sum(
        n * (chunks if t.uses_reduce else 1) / _vector_width(space, t, t1)
        for t, n in zip(space.inputs, space.elems(t1), strict=False)
    )
    fetch_instr = 2 * math.ceil(fetch_vectors / res.threads)

    # Compute: the FLOP rate the block shape sustains, and the issue slots all its instructions take.
    thread_fmas = block_flops / res.threads / 2
    peak_sm = _peak(hw, space.workload.dtype, tc) / hw.sm_count
    lane_eff = res.threads / (warps * hw.warp_size)
    warps_per_scheduler = resident * warps / SCHEDULERS_PER_SM
    acc = math.prod(t0[a] for a in space.spatial)
    if tc:
        ilp_eff = min(1.0, warps_per_scheduler * max(1.0, acc / 4) / MMA_DEPENDENT_CYCLES)
        math_instr = thread_fmas / 64  # one m16n8k16 mma.sync = 16*8*16 multiply-adds per warp, 64 per thread
    else:
        ilp_eff = min(1.0, warps_per_scheduler * acc / FMA_DEPENDENT_CYCLES)
        # Packed types (half2) do several multiply-adds per lane and instruction; read it off the peak.
        per_instr = max(1.0, peak_sm / hw.clock_hz / 2 / (SCHEDULERS_PER_SM * hw.warp_size))
        math_instr = thread_fmas / per_instr
    thread_instr = math_instr + lds_instr + fetch_instr
    flop_s = block_flops / (peak_sm * lane_eff * ilp_eff)
    issue_s = warps * thread_instr / (SCHEDULERS_PER_SM * hw.clock_hz)
    compute_s = resident * max(flop_s, issue_s)

    shared_bw = hw.level("shared").bandwidth_Bps / hw.sm_count
    shared_s = resident * (reg_loads + shared_writes) / shared_bw
    l2_s = resident * l2_bytes / (hw.level("l2").bandwidth_Bps / hw.sm_count)
    reg_bytes = 0.0 if tc else 1.5 * block_flops * space.acc_bytes  # 3 operands per FMA = 2 flops
    register_s = resident * reg_bytes / (hw.level("register").bandwidth_Bps / hw.sm_count)

    total_l2 = l2_bytes * blocks
    dram = _dram_bytes(space, s, waves, min(blocks, hw.sm_count * bps), int(total_l2))
    dram_s = dram / hw.level("dram").bandwidth_Bps

    # Latency chain of one block: per reduction chunk a global round trip, a shared load and two barriers,
    # plus its own instruction stream (a warp issues at most one instruction per cycle).
    l2_lat, dram_lat = hw.level("l2").latency_cycles, hw.level("dram").latency_cycles
    miss = min(1.0, dram / total_l2) if total_l2 > 0 else 1.0
    global_lat = l2_lat + miss * (dram_lat - l2_lat)
    per_chunk = global_lat + hw.level("shared").latency_cycles + 2 * SYNC_CYCLES
    latency_s = (chunks * per_chunk + thread_instr) / hw.clock_hz

    wave_s = max(compute_s, shared_s, l2_s, register_s, latency_s)
    total = LAUNCH_OVERHEAD_S + max(waves * wave_s, dram_s)
    mean_conflict = sum(conflicts) / len(conflicts) if conflicts else 1.0
    return CostBreakdown(
        blocks=blocks,
        threads_per_block=res.threads,
        blocks_per_sm=bps,
        waves=waves,
        tensor_cores=tc,
        compute_s=compute_s,
        shared_s=shared_s,
        l2_s=l2_s,
        register_s=register_s,
        latency_s=latency_s,
        dram_s=dram_s,
        bank_conflict=mean_conflict,
        total_s=total,
    )


def _shared_reads(
    space: ScheduleSpace, s: Schedule, tc: bool, threads: int, warps: int, steps: int
) -> tuple[float, float, list[int]]:
    """(bytes read from shared memory per block incl. conflicts, load instructions per thread, degrees).

    CUDA cores: every thread loads its own fragment of each input per register step, one scalar load per
    element. Tensor cores: a warp loads the fragments of its warp tile once per step with 16-byte ldmatrix rows.
    """
    t0 = s.tiles[0]
    reads, instr = 0.0, 0.0
    conflicts: list[int] = []
    if tc:
        lanes = space.warp_lanes(s)
        warp_tile = tuple(t0[a] if space.is_reduce[a] else lanes[a] * t0[a] for a in range(len(t0)))
        for t in space.inputs:
            n = (steps if t.uses_reduce else 1) * space.tensor_elems(t, warp_tile) * t.elem_bytes
            reads += warps * n
            instr += n / (space.hw.warp_size * 16)
        return reads, instr, conflicts
    for t, elems in zip(space.inputs, space.elems(t0), strict=False):
        n = (steps if t.uses_reduce else 1) * elems
        deg = bank_conflict(space, s, t)
        conflicts.append(deg)
        reads += threads * n * t.elem_bytes * deg
        instr += n
    return reads, instr, conflicts


def _peak(hw: HwProfile, dtype: str, tensor_cores: bool) -> float:
    # Without tensor cores the emitted code computes 16-bit inputs in float32 (see EMITS_TENSOR_CORES).
    compute_dtype = dtype if tensor_cores or dtype not in TENSOR_CORE_DTYPES else "float32"
    try:
        return hw.flops(compute_dtype, tensor_cores)
    except KeyError:
        raise ScheduleError(f"hardware profile {hw.name} has no peak FLOP/s for dtype {dtype}") from None

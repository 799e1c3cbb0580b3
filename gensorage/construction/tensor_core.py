"""Construction of tensor-core matmul kernels: Gensor's Markov chain over the levels of an MMA kernel.

The state is a :class:`~gensorage.codegen.tensor_core.TensorCoreTiles` (block tile, warp tile, reduction step,
pipeline stages). An action doubles or halves one level or adds or removes a stage; its benefit is the drop of
the predicted time (:func:`predict_tensor_core_time`). From the smallest kernel (one warp, one 16 x 16 tile,
one stage) a chain moves with probability proportional to the benefit of each improving action (greedily at
temperature 0) until no action improves; a few chains with different seeds run and the best state wins. Like
the CUDA-core construction it measures nothing, and it is a pure function of (shape, dtype, profile, seed).

The cost model prices what :mod:`gensorage.codegen.tensor_core` emits: ``mma.sync`` at the profile's tensor
rate times the fraction of it that warp-level MMA reaches on the device (``mma_sync_fraction``), occupancy from
registers, shared memory and threads, wave quantization, the bytes each level moves (the operand tiles every
block re-reads from L2, the ldmatrix traffic from shared memory, DRAM traffic with L2 reuse within a wave),
one exposed global round trip per reduction step when the loop is not pipelined, and the launch overhead.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import assert_never

from gensorage.codegen.tensor_core import MMA, WARP, TensorCoreTiles, mma_dtype, shared_bytes
from gensorage.codegen.wgmma import WG_M, WgmmaTiles, covers_operands
from gensorage.construction.schedule import MAX_CARRY_FACTOR, warm_starts_active
from gensorage.construction.wgmma import (
    predict_wgmma_time,
    tma_available,
    wgmma_available,
    wgmma_fits,
    wgmma_neighbours,
)
from gensorage.errors import ScheduleError
from gensorage.hw.profile import HwProfile
from gensorage.markov.cost_model import blocks_per_sm

CHAINS = 24
WARM_CHAINS = 4  # random chains from the carried tiles at a new shape (beside the two greedy chains)
MAX_STEPS = 64
TIE = 0.02  # predicted times this close count as equal
PLATEAU_WEIGHT = 0.05  # a plateau move's weight relative to the best improving move
MAX_TILE = 256
MAX_STAGES = 4
MAX_SPLIT_K = 8
MAX_BLOCK_K = 64  # the measured range of the calibration (benchmarks/results/gpu_suite-h200-*.json)
REGISTER_OVERHEAD = 40  # addresses, loop counters and pipeline bookkeeping per thread (ptxas reports)


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


def predict_tensor_core_time(
    dims: tuple[int, int, int, int], tiles: TensorCoreTiles, hw: HwProfile, dtype: str = "float16"
) -> TensorCoreCost | None:
    """Predicted time of the tensor-core kernel for ``(batch, m, n, k)``; None when it cannot run on ``hw``."""
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
    # Shared memory: operand tiles written once per step, ldmatrix reads per warp, the staged write-back.
    ldmatrix = t.warps * (t.warp_m + t.warp_n) * kp * 2
    staged = (t.block_m + t.block_n) * kp * 2 + 2 * t.block_m * t.block_n * 4
    shared_s = resident * (ldmatrix + staged) / (hw.level("shared").bandwidth_Bps / hw.sm_count)
    if t.stages == 1:  # the one-stage loop waits for each step's tiles before its MMAs, in series
        compute_s += steps * hw.level("dram").latency_cycles / hw.clock_hz
    grid = Grid((batch, m, n, k), t.block_m, t.block_n, t.block_k, t.stages, t.warps, blocks, resident, waves)
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
    ahead = min(
        max(1, g.stages - 1) * (g.block_m + g.block_n) * g.block_k * 2, g.warps * cal.warp_flight_bytes
    )
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


def epilogue_s(extra_bytes: int, elements: int, steps: int, hw: HwProfile) -> float:
    """What a matmul's epilogue adds to its GEMM kernel (:mod:`gensorage.ugraph.optimize.fuse_epilogues`): its
    extra operands read once (at the DRAM fraction GEMM kernels reach) and one float32 op per step and output
    element on the CUDA cores. No launch and no round trip of the product: the separate kernels' cost it saves.
    The same for every tiling, so it does not change which tiles the construction picks."""
    dram = hw.level("dram").bandwidth_Bps * hw.calibration.dram_fraction
    return extra_bytes / dram + steps * elements / hw.flops("float32")


def neighbours(
    t: TensorCoreTiles, dims: tuple[int, int, int, int], split: bool = True
) -> list[TensorCoreTiles]:
    """The states one action away that fit the shape: one level doubled or halved, one stage more or less,
    split-k doubled or halved (unless ``split`` is False)."""
    out = []
    for name in ("block_m", "block_n", "block_k", "warp_m", "warp_n"):
        v = getattr(t, name)
        out += [replace(t, **{name: v * 2}), replace(t, **{name: v // 2})]
    out += [replace(t, stages=t.stages + 1), replace(t, stages=t.stages - 1)]
    if split:
        out += [replace(t, split_k=t.split_k * 2), replace(t, split_k=max(1, t.split_k // 2))]
    return [n for n in out if n != t and fits(n, dims)]


def fits(t: TensorCoreTiles, dims: tuple[int, int, int, int]) -> bool:
    """Whether the construction's space holds ``t`` for this shape (tile limits, k step, pipelining, split)."""
    batch, m, n, k = dims
    if t.split_k > 1:
        # Split-k serves 2-D matmuls whose reduction divides into whole splits of at least one k step.
        if batch != 1 or t.split_k > MAX_SPLIT_K or k % t.split_k or (k // t.split_k) % t.block_k:
            return False
        if n % t.block_n:  # no pad_einsum for the slices: n and each slice divide into whole tiles
            return False
        k //= t.split_k
    limits = (t.block_m <= max(MMA, _round16(m)), t.block_n <= max(MMA, _round16(n)))
    return (
        t.invalid() is None
        and all(limits)
        and max(t.block_m, t.block_n) <= MAX_TILE
        and t.block_k <= min(MAX_BLOCK_K, max(MMA, _round16(k)))
        and t.stages <= min(MAX_STAGES, max(1, -(-k // t.block_k)))
        and (t.stages >= 2 or k <= t.block_k)  # a loop of several steps is pipelined
    )


def _round16(x: int) -> int:
    return -(-x // MMA) * MMA


#: A state of the construction: an ``mma.sync`` kernel's tiles or a ``wgmma`` kernel's.
Tiles = TensorCoreTiles | WgmmaTiles


def predict_tiles_time(
    dims: tuple[int, int, int, int], tiles: Tiles, hw: HwProfile, dtype: str = "float16"
) -> TensorCoreCost | None:
    """The predicted time of either instruction's kernel (None: it cannot run on ``hw``)."""
    match tiles:
        case TensorCoreTiles():
            return predict_tensor_core_time(dims, tiles, hw, dtype)
        case WgmmaTiles():
            got = predict_wgmma_time(dims, tiles, hw, dtype)
            return None if got is None else TensorCoreCost(*got)
        case _:
            assert_never(tiles)


def _moves(
    t: Tiles,
    dims: tuple[int, int, int, int],
    split: bool,
    wgmma: bool,
    tma: bool,
    sms: int = 0,
    layout: str = "nn",
) -> list[Tiles]:
    """The states one action away: the instruction's own levels, and the switch to the other instruction
    (the nearest tiles it has) when ``wgmma`` is in the space (its TMA variant when ``tma`` is too)."""
    match t:
        case TensorCoreTiles():
            out: list[Tiles] = list(neighbours(t, dims, split))
            if wgmma:
                w = WgmmaTiles(min(2, max(1, t.block_m // 64)), min(256, max(64, t.block_n)), t.stages)
                out += [w] if wgmma_fits(w, dims) else []
            return out
        case WgmmaTiles():
            back = TensorCoreTiles(t.block_m, t.block_n, 64, 64, 64, t.stages, layout=layout)
            return [*wgmma_neighbours(t, dims, tma, sms), *([back] if fits(back, dims) else [])]
        case _:
            assert_never(t)


def _chain(
    dims: tuple[int, int, int, int],
    hw: HwProfile,
    dtype: str,
    rng: random.Random | None,
    split: bool,
    wgmma: bool = False,
    start: Tiles | None = None,
    tma: bool = False,
    layout: str = "nn",
) -> list[tuple[float, Tiles]]:
    """One Markov chain from ``start`` (default: the smallest kernel); returns the states it visited with their
    predicted times.

    The greedy chain (``rng`` None) takes the largest benefit and stops at the first local optimum. A random
    chain moves with probability proportional to the benefit and also crosses plateaus (moves that change no
    predicted time, such as a warp tile under an L2-bound block tile) with a small weight, for at most
    ``MAX_STEPS`` moves.
    """
    state: Tiles = start or TensorCoreTiles(
        MMA, MMA, MMA, MMA, MMA, 1 if dims[3] <= MMA else 2, layout=layout
    )
    cost = predict_tiles_time(dims, state, hw, dtype)
    if cost is None:
        return []
    time_s = cost.total_s
    visited = [(time_s, state)]
    for _ in range(MAX_STEPS):
        moves = []
        for nxt in _moves(state, dims, split, wgmma, tma, hw.sm_count if tma else 0, layout):
            c = predict_tiles_time(dims, nxt, hw, dtype)
            if c is not None and c.total_s <= time_s:
                moves.append((time_s - c.total_s, c.total_s, nxt))
        better = [m for m in moves if m[0] > 0]
        if rng is None:  # the greedy chain: the largest benefit
            if not better:
                break
            _, time_s, state = max(better, key=lambda b: (b[0], b[2].describe()))
        else:
            if not moves:
                break
            floor = PLATEAU_WEIGHT * max([m[0] for m in better], default=time_s)
            _, time_s, state = rng.choices(moves, weights=[max(m[0], floor) for m in moves])[0]
        visited.append((time_s, state))
    return visited


def construct_tensor_core(
    dims: tuple[int, int, int, int],
    hw: HwProfile,
    dtype: str = "float16",
    seed: int = 0,
    split: bool = True,
    layout: str = "nn",
) -> tuple[TensorCoreTiles, TensorCoreCost]:
    """The ``mma.sync`` tiles Gensor's construction picks for a ``(batch, m, n, k)`` matmul, with their
    predicted cost (:func:`construct_matmul_tiles` with wgmma in the space as well).

    ``split=False`` keeps split-k out of the space (the implicit GEMM of a convolution has no split path).
    ``layout``: which operands are stored transposed (:attr:`TensorCoreTiles.layout`; it sizes the shared
    tiles).
    Memoised per process; inside :func:`~gensorage.construction.schedule.warm_starts`, a shape not constructed
    yet starts its chains from the tiles of the nearest constructed shape (:func:`_warm`).

    Raises
    ------
    ScheduleError
        No tensor-core kernel fits ``hw`` (or its profile has no tensor-core rate for ``dtype``).
    """
    if warm_starts_active():
        hit = _warm(dims, hw, dtype, seed, split, layout)
        if hit is not None:
            return hit
    best, cost = _construct(dims, hw, dtype, seed, split, False, layout=layout)
    assert isinstance(best, TensorCoreTiles)
    _remember(dims, hw, dtype, seed, split, best)
    return best, cost


def construct_matmul_tiles(
    dims: tuple[int, int, int, int],
    hw: HwProfile,
    dtype: str = "float16",
    seed: int = 0,
    tma: bool = False,
    layout: str = "nn",
) -> tuple[Tiles, TensorCoreCost]:
    """The tiles the construction picks when the instruction is a level of the state too: ``wgmma`` kernels
    on profiles that have it (:func:`~gensorage.construction.wgmma.wgmma_available`), ``mma.sync`` ones
    (split-k included) elsewhere and where they are predicted faster (decode-sized M). ``layout`` "nt": B is
    stored ``[N, K]`` (wgmma reads it K-major, mma.sync tiles carry the layout); "tn"/"tt" have no wgmma
    kernel.

    ``tma`` adds the warp-specialised TMA wgmma kernels (and their deeper rings) where the profile prices
    them (:func:`~gensorage.construction.wgmma.tma_available`); they take 2-D operands.

    Raises
    ------
    ScheduleError
        As :func:`construct_tensor_core`.
    """
    # TMA loads read an N-major B only: a K-major one ("nt") runs the cp.async wgmma kernel.
    tma = tma and tma_available(hw) and layout == "nn"
    return _construct(
        dims, hw, dtype, seed, True, wgmma_available(hw) and layout in ("nn", "nt"), tma, layout
    )


def construct_predefined_matmul(
    a: tuple[int, ...],
    b: tuple[int, ...],
    out: tuple[int, ...],
    a_dtype: str,
    b_dtype: str,
    hw: HwProfile,
    seed: int = 0,
    layout: str = "nn",
) -> tuple[Tiles, TensorCoreCost] | None:
    """The tiles of a pre-defined matmul kernel op of these (logical) shapes and dtypes, with operands stored
    as ``layout`` says (:attr:`~gensorage.codegen.tensor_core.TensorCoreTiles.layout`); None: not on tensor
    cores.

    Both instructions (:func:`construct_matmul_tiles`) where the wgmma kernel takes the operands as they are
    (two equal 16-bit dtypes, shapes :func:`~gensorage.codegen.wgmma.covers_operands`, A not transposed: B
    N-major or K-major; TMA loads with 2-D operands and an N-major B), ``mma.sync``
    (:func:`construct_tensor_core`) otherwise. One function for the code generator and the µGraph cost model,
    so both see the same kernel.
    """
    mma = mma_dtype(a_dtype, b_dtype)
    if mma is None:
        return None
    dims = (math.prod(out[:-2]), out[-2], out[-1], a[-1])
    try:
        if a_dtype == b_dtype == mma and covers_operands(a, b, out) and layout in ("nn", "nt"):
            # TMA loads take 2-D operands; the kernel's host code encodes their tensor maps.
            tma = len(a) == len(b) == len(out) == 2
            return construct_matmul_tiles(dims, hw, mma, seed, tma=tma, layout=layout)
        return construct_tensor_core(dims, hw, mma, seed, layout=layout)
    except ScheduleError:
        return None


@lru_cache(maxsize=256)
def _construct(
    dims: tuple[int, int, int, int],
    hw: HwProfile,
    dtype: str,
    seed: int,
    split: bool,
    wgmma: bool,
    tma: bool = False,
    layout: str = "nn",
) -> tuple[Tiles, TensorCoreCost]:
    try:
        hw.flops(dtype, True)
    except KeyError:
        raise ScheduleError(f"hardware profile {hw.name} has no tensor-core rate for {dtype}") from None
    found = _chain(dims, hw, dtype, None, split, wgmma, tma=tma, layout=layout)
    for c in range(CHAINS - 1):
        found += _chain(dims, hw, dtype, random.Random(seed * 1000 + c), split, wgmma, tma=tma, layout=layout)
    return _pick(found, dims, hw, dtype)


def _pick(
    found: list[tuple[float, Tiles]], dims: tuple[int, int, int, int], hw: HwProfile, dtype: str
) -> tuple[Tiles, TensorCoreCost]:
    """The best of the states the chains visited (ties broken by :func:`_tie_break`)."""
    if not found:
        raise ScheduleError(f"no tensor-core kernel fits {hw.name} for matmul {dims}")
    fastest = min(t for t, _ in found)
    # In the chains' visiting order, not a set's: ties left by _tie_break go to the first visited, the same in
    # every process (a set of tiles with a str field iterates in a hash-seeded order).
    near = list(dict.fromkeys(s for t, s in found if t <= fastest * (1 + TIE)))
    costs = {s: predict_tiles_time(dims, s, hw, dtype) for s in near}
    best = max(near, key=lambda s: _tie_break(s, costs[s], hw))
    cost = costs[best]
    assert cost is not None
    return best, cost


def _tie_break(t: Tiles, cost: TensorCoreCost | None, hw: HwProfile) -> tuple[float, ...]:
    """The preference among states the model predicts within ``TIE`` of each other.

    Memory-bound (the DRAM bound leaves many states equal): the most warps resident over the whole GPU (the
    most copies in flight; on the H200, one-warp blocks of small-M GEMMs measured up to 1.6x slower than
    four-warp ones the model priced the same), then ``mma.sync`` before wgmma, then the predicted time, then
    wider and deeper tiles.
    Otherwise: the largest block tile (the most reuse per byte from L2), then the fewest stages (for wgmma:
    the fewest shared-memory reads, TMA loads, the most stages, two wgmma groups in flight, one block per tile).
    """
    assert cost is not None
    if cost.bound == "dram":
        # mma.sync first among equals: on the H200's DRAM-bound decode GEMMs it beat wgmma (64-row blocks).
        mma_sync = isinstance(t, TensorCoreTiles)
        return (_resident_warps(t, cost, hw), mma_sync, -cost.total_s, t.block_n, t.stages)
    if isinstance(t, WgmmaTiles):
        # At equal block tiles the H200 ran faster with fewer shared-memory reads (128x256 over 256x128: each
        # warpgroup reads all of B), a deeper ring (1.34x from 2 to 3 stages) and two wgmma groups in flight.
        # TMA loads before cp.async ones: where both are priced alike (bound by L2), the TMA kernel's other
        # terms (its MMA rate, no per-step issue floor) are the faster ones.
        reads = t.warpgroups * (WG_M + t.block_n)
        return (t.block_m * t.block_n, -reads, t.tma, t.stages, t.in_flight, -t.persistent, -cost.total_s)
    return (t.block_m * t.block_n, -t.stages, -cost.total_s)


def _resident_warps(t: Tiles, cost: TensorCoreCost | None, hw: HwProfile) -> int:
    assert cost is not None
    return min(cost.blocks, hw.sm_count * cost.blocks_per_sm) * t.warps


def tensor_core_flops(dims: tuple[int, int, int, int]) -> int:
    return 2 * math.prod(dims)


# ------------------------------------------------------------------------------------- warm starts
# Shape class (profile, dtype, seed, split) -> (batch, m, n, k) -> the tiles constructed there (cold or warm);
# warm answers are kept apart from the pure memo (they depend on what was constructed before).
_KNOWN: dict[tuple[object, ...], dict[tuple[int, int, int, int], TensorCoreTiles]] = {}
_WARM: dict[tuple[object, ...], tuple[TensorCoreTiles, TensorCoreCost]] = {}
_MEMO_LIMIT = 1024


def _remember(
    dims: tuple[int, int, int, int], hw: HwProfile, dtype: str, seed: int, split: bool, t: TensorCoreTiles
) -> None:
    if sum(len(v) for v in _KNOWN.values()) >= _MEMO_LIMIT:
        _KNOWN.clear()
        _WARM.clear()
    _KNOWN.setdefault((hw, dtype, seed, split, t.layout), {})[dims] = t


def _warm(
    dims: tuple[int, int, int, int], hw: HwProfile, dtype: str, seed: int, split: bool, layout: str = "nn"
) -> tuple[TensorCoreTiles, TensorCoreCost] | None:
    """The construction at ``dims`` from the tiles of the nearest constructed shape within
    ``MAX_CARRY_FACTOR`` on every dim: a greedy and ``WARM_CHAINS`` random chains from them, and the greedy
    chain from the smallest kernel; None where there is no such shape or its tiles do not carry over."""
    key = (dims, hw, dtype, seed, split, layout)
    if key in _WARM:
        return _WARM[key]
    known = _KNOWN.get((hw, dtype, seed, split, layout))
    if not known or dims in known:  # constructed cold already: the memoised cold answer
        return None
    near = min(known, key=lambda d: sum(abs(math.log(a / b)) for a, b in zip(dims, d, strict=True)))
    if any(max(a, b) > MAX_CARRY_FACTOR * min(a, b) for a, b in zip(dims, near, strict=True)):
        return None
    start = next(
        (t for t in _carried(known[near], dims) if predict_tensor_core_time(dims, t, hw, dtype)), None
    )
    if start is None:
        return None
    found = _chain(dims, hw, dtype, None, split, layout=layout)
    found += _chain(dims, hw, dtype, None, split, start=start)
    for c in range(WARM_CHAINS):
        found += _chain(dims, hw, dtype, random.Random(seed * 1000 + c), split, start=start)
    best, cost = _pick(found, dims, hw, dtype)
    assert isinstance(best, TensorCoreTiles)  # no wgmma in this space
    _WARM[key] = best, cost
    _remember(dims, hw, dtype, seed, split, _WARM[key][0])
    return _WARM[key]


def _carried(t: TensorCoreTiles, dims: tuple[int, int, int, int]) -> Iterator[TensorCoreTiles]:
    """``t`` at ``dims``: tiles halved until they fit the new extents, then without split-k, if they fit."""
    _, m, n, k = dims
    bm, bn, bk = t.block_m, t.block_n, t.block_k
    while bm > max(MMA, _round16(m)):
        bm //= 2
    while bn > max(MMA, _round16(n)):
        bn //= 2
    while bk > max(MMA, _round16(k)):
        bk //= 2
    stages = max(1 if k <= bk else 2, min(t.stages, MAX_STAGES, -(-k // bk)))  # several steps: pipelined
    c = replace(t, block_m=bm, block_n=bn, block_k=bk, warp_m=min(t.warp_m, bm), warp_n=min(t.warp_n, bn))
    for cand in (replace(c, stages=stages), replace(c, stages=stages, split_k=1)):
        if fits(cand, dims):
            yield cand

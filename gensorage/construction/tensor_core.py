"""Construction of tensor-core matmul kernels: Gensor's Markov chain over the levels of an MMA kernel.

The state is a :class:`~gensorage.codegen.tensor_core.TensorCoreTiles` (block tile, warp tile, reduction step,
pipeline stages). An action doubles or halves one level or adds or removes a stage; its benefit is the drop of
the predicted time (:func:`predict_tensor_core_time`). From the smallest kernel (one warp, one 16 x 16 tile,
one stage) a chain moves with probability proportional to the benefit of each improving action (greedily at
temperature 0) until no action improves; a few chains with different seeds run and the best state wins. Like
the CUDA-core construction it measures nothing, and it is a pure function of (shape, dtype, profile, seed).

The cost model (:mod:`gensorage.construction.tensor_core_cost`) prices what
:mod:`gensorage.codegen.tensor_core` emits; states it prices alike are told apart by a stated rule
(:func:`_tie_break`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import replace
from functools import lru_cache
from typing import assert_never

from gensorage.codegen.tensor_core import MMA, TensorCoreTiles, mma_dtype
from gensorage.codegen.wgmma import WG_M, WgmmaTiles, covers_operands
from gensorage.construction.schedule import MAX_CARRY_FACTOR, warm_starts_active
from gensorage.construction.tensor_core_cost import TensorCoreCost, predict_tensor_core_time
from gensorage.construction.wgmma import (
    predict_wgmma_time,
    tma_available,
    wgmma_available,
    wgmma_fits,
    wgmma_neighbours,
)
from gensorage.errors import ScheduleError
from gensorage.hw.profile import HwProfile

CHAINS = 24
WARM_CHAINS = 4  # random chains from the carried tiles at a new shape (beside the two greedy chains)
MAX_STEPS = 64
TIE = 0.02  # predicted times this close count as equal
PLATEAU_WEIGHT = 0.05  # a plateau move's weight relative to the best improving move
MAX_TILE = 256
MAX_STAGES = 4
MAX_SPLIT_K = 8
MAX_BLOCK_K = 64  # the measured range of the calibration (benchmarks/results/gpu_suite-h200-*.json)


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
    dims: tuple[int, int, int, int],
    tiles: Tiles,
    hw: HwProfile,
    dtype: str = "float16",
    gather: bool = False,
) -> TensorCoreCost | None:
    """The predicted time of either instruction's kernel (None: it cannot run on ``hw``); ``gather``: the
    ``mma.sync`` kernel of a convolution's implicit GEMM (:func:`predict_tensor_core_time`)."""
    match tiles:
        case TensorCoreTiles():
            return predict_tensor_core_time(dims, tiles, hw, dtype, gather)
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


class _Space:
    """The construction's space at one shape: each state's predicted cost and moves, computed once.

    The chains of one construction revisit the same states (the 96 chains of a decoder layer's four wgmma
    constructions predicted 33,000 states, most of them many times over), and both are pure functions of the
    state here, so memoising them changes no chain's path: only its time."""

    def __init__(
        self,
        dims: tuple[int, int, int, int],
        hw: HwProfile,
        dtype: str,
        split: bool,
        wgmma: bool = False,
        tma: bool = False,
        layout: str = "nn",
        gather: bool = False,
    ) -> None:
        self.dims, self.hw, self.dtype, self.split = dims, hw, dtype, split
        self.wgmma, self.tma, self.layout, self.gather = wgmma, tma, layout, gather
        self._costs: dict[Tiles, TensorCoreCost | None] = {}
        self._moves: dict[Tiles, list[Tiles]] = {}

    def cost(self, t: Tiles) -> TensorCoreCost | None:
        if t not in self._costs:
            self._costs[t] = predict_tiles_time(self.dims, t, self.hw, self.dtype, self.gather)
        return self._costs[t]

    def moves(self, t: Tiles) -> list[Tiles]:
        if t not in self._moves:
            sms = self.hw.sm_count if self.tma else 0
            self._moves[t] = _moves(t, self.dims, self.split, self.wgmma, self.tma, sms, self.layout)
        return self._moves[t]


def _chain(space: _Space, rng: random.Random | None, start: Tiles | None = None) -> list[tuple[float, Tiles]]:
    """One Markov chain over ``space`` from ``start`` (default: the smallest kernel); returns the states it
    visited with their predicted times.

    The greedy chain (``rng`` None) takes the largest benefit and stops at the first local optimum. A random
    chain moves with probability proportional to the benefit and also crosses plateaus (moves that change no
    predicted time, such as a warp tile under an L2-bound block tile) with a small weight, for at most
    ``MAX_STEPS`` moves.
    """
    dims = space.dims
    state: Tiles = start or TensorCoreTiles(
        MMA, MMA, MMA, MMA, MMA, 1 if dims[3] <= MMA else 2, layout=space.layout
    )
    cost = space.cost(state)
    if cost is None:
        return []
    time_s = cost.total_s
    visited = [(time_s, state)]
    for _ in range(MAX_STEPS):
        moves = []
        for nxt in space.moves(state):
            c = space.cost(nxt)
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
    gather: bool = False,
) -> tuple[TensorCoreTiles, TensorCoreCost]:
    """The ``mma.sync`` tiles Gensor's construction picks for a ``(batch, m, n, k)`` matmul, with their
    predicted cost (:func:`construct_matmul_tiles` with wgmma in the space as well).

    ``split=False`` keeps split-k out of the space (the implicit GEMM of a convolution has no split path);
    ``gather=True`` prices its operands as gathered element by element (:func:`predict_tensor_core_time`).
    ``layout``: which operands are stored transposed (:attr:`TensorCoreTiles.layout`; it sizes the shared
    tiles).
    Memoised per process; inside :func:`~gensorage.construction.schedule.warm_starts`, a shape not constructed
    yet starts its chains from the tiles of the nearest constructed shape (:func:`_warm`).

    Raises
    ------
    ScheduleError
        No tensor-core kernel fits ``hw`` (or its profile has no tensor-core rate for ``dtype``).
    """
    if gather:  # a convolution: no warm start from (nor for) the GEMMs
        best, cost = _construct(dims, hw, dtype, seed, split, False, layout=layout, gather=True)
        assert isinstance(best, TensorCoreTiles)
        return best, cost
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

    Both instructions (:func:`construct_matmul_tiles`) where the wgmma kernel takes the operands (shapes
    :func:`~gensorage.codegen.wgmma.covers_operands`, A not transposed: B N-major or K-major; TMA loads with
    2-D operands of one 16-bit dtype and an N-major B), ``mma.sync`` (:func:`construct_tensor_core`)
    otherwise. Operands of other dtypes than the MMA's (a float32 one with a 16-bit one) are converted in the
    copies to shared memory by either kernel, priced at the MMA dtype as ``mma.sync`` prices them. One function
    for the code generator and the µGraph cost model, so both see the same kernel.
    """
    mma = mma_dtype(a_dtype, b_dtype)
    if mma is None:
        return None
    dims = (math.prod(out[:-2]), out[-2], out[-1], a[-1])
    try:
        if covers_operands(a, b, out) and layout in ("nn", "nt"):
            # TMA loads take 2-D operands (the kernel's host code encodes their tensor maps) and copy bytes:
            # an operand converted to the MMA dtype runs the cp.async wgmma kernel.
            tma = len(a) == len(b) == len(out) == 2 and a_dtype == b_dtype == mma
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
    gather: bool = False,
) -> tuple[Tiles, TensorCoreCost]:
    try:
        hw.flops(dtype, True)
    except KeyError:
        raise ScheduleError(f"hardware profile {hw.name} has no tensor-core rate for {dtype}") from None
    space = _Space(dims, hw, dtype, split, wgmma, tma, layout, gather)
    found = _chain(space, None)
    for c in range(CHAINS - 1):
        found += _chain(space, random.Random(seed * 1000 + c))
    return _pick(found, space)


def preferred(
    states: list[Tiles],
    dims: tuple[int, int, int, int],
    hw: HwProfile,
    dtype: str = "float16",
    gather: bool = False,
) -> Tiles:
    """The state the construction prefers among ``states`` (in this order) that fit ``hw``: the fastest
    predicted, ties within ``TIE`` broken as the chains' pick is (:func:`_tie_break`)."""
    space = _Space(dims, hw, dtype, split=False, gather=gather)  # costs only: no moves are asked
    costs = [(space.cost(s), s) for s in states]
    return _pick([(c.total_s, s) for c, s in costs if c is not None], space)[0]


def _pick(found: list[tuple[float, Tiles]], space: _Space) -> tuple[Tiles, TensorCoreCost]:
    """The best of the states the chains visited over ``space`` (ties broken by :func:`_tie_break`)."""
    if not found:
        raise ScheduleError(f"no tensor-core kernel fits {space.hw.name} for matmul {space.dims}")
    fastest = min(t for t, _ in found)
    # In the chains' visiting order, not a set's: ties left by _tie_break go to the first visited, the same in
    # every process (a set of tiles with a str field iterates in a hash-seeded order).
    near = list(dict.fromkeys(s for t, s in found if t <= fastest * (1 + TIE)))
    costs = {s: space.cost(s) for s in near}
    best = max(near, key=lambda s: _tie_break(s, costs[s], space.hw))
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
    return (t.block_m * t.block_n, -t.stages, _strip(t), -cost.total_s)


def _strip(t: TensorCoreTiles) -> bool:
    """Whether the block's warps form one strip along its longer side (each warp spans the shorter one).

    Measured, not derived: among warp tiles the model prices alike (fragment loads hidden under the MMAs),
    the H200 ran the strip fastest in 23 of the 30 warp-tile groups that timed a strip and another tile
    (calibrate_tensor_core.py's groups of benchmarks/results; the rest of each group 5 % slower at the
    median, from 10 % faster to 15 % slower): 32x128 in 256x128 blocks, 128x32 in 128x256 and 128x128 ones.
    The losses are 64x64 (k/v at 4096, bfloat16, 10 %) and 64x32 (k/v, 9 %)."""
    if t.block_m > t.block_n:
        return t.warp_n == t.block_n
    if t.block_n > t.block_m:
        return t.warp_m == t.block_m
    return t.warp_m == t.block_m or t.warp_n == t.block_n


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
    space = _Space(dims, hw, dtype, split, layout=layout)
    found = _chain(space, None)
    found += _chain(space, None, start)
    for c in range(WARM_CHAINS):
        found += _chain(space, random.Random(seed * 1000 + c), start)
    best, cost = _pick(found, space)
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

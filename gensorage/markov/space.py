"""The schedule space of a workload on a hardware profile (Gensor §IV-A, the ETIR state space).

A state is a :class:`~gensorage.markov.schedule.Schedule`: per axis a register tile ``T_0``, a shared-memory
(thread-block) tile ``T_1`` and the full extent ``T_2``, plus virtual threads per spatial axis. This module
knows which tile sizes are legal, what each level's tiles occupy (footprint ``F``), how much data each level
moves (traffic ``Q``), and whether a schedule fits the hardware's thread / register / shared-memory limits.
The benefit formulas, the cost model and every search method read these same numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from gensorage.dtypes import dtype_bytes
from gensorage.errors import ScheduleError
from gensorage.hw.profile import HwProfile
from gensorage.markov.schedule import Schedule
from gensorage.workloads.workload import Workload

NUM_LEVELS = 3  # registers (0), shared memory / thread block (1), full extent (2)
LAST = NUM_LEVELS - 1
# Profile memory level that holds each tile level's data; L2 is a hardware-managed cache, no tiling level.
LEVEL_MEMORY: tuple[str, ...] = ("register", "shared", "dram")
MAX_VTHREAD = (
    8  # largest virtual-thread count per axis (TVM's usual bound; more only inflates the index math)
)
# Registers a kernel needs besides its tiles (loop counters, base addresses, predicates). nvcc -Xptxas -v on
# simple TVM GPU kernels reports roughly 16-30 registers before any tile is kept in registers.
REGISTER_OVERHEAD = 16
REGISTER_GRANULE = 8  # registers are allocated per thread in multiples of 8 (256 per warp)
SHARED_RESERVED_PER_BLOCK = 1024  # bytes the CUDA runtime reserves per resident block (sm_80+)
_MEMO_LIMIT = 200_000  # entries per memo table before it is dropped (bounds memory on long searches)


def accumulator_bytes(dtype: str) -> int:
    """Bytes of an accumulator register: sub-32-bit types accumulate in 32 bits (fp16 -> fp32 accumulate)."""
    return max(4, dtype_bytes(dtype))


@dataclass(frozen=True, slots=True)
class AccessInfo:
    """One tensor access compiled for fast footprint arithmetic."""

    name: str
    is_output: bool
    elem_bytes: int
    shape: tuple[int, ...]
    dims: tuple[tuple[tuple[int, int], ...], ...]  # per tensor dim: (axis position, |coefficient|)
    axes_used: frozenset[int]
    uses_reduce: bool


@dataclass(frozen=True, slots=True)
class Resources:
    """What one thread block of a schedule needs."""

    threads: int
    registers_per_thread: int
    shared_bytes: int


def _candidates(extent: int) -> tuple[int, ...]:
    """Legal tile sizes for an axis: powers of two up to the extent and every divisor of the extent."""
    out = {d for d in range(1, math.isqrt(extent) + 1) if extent % d == 0}
    out |= {extent // d for d in out}
    p = 1
    while p <= extent:
        out.add(p)
        p *= 2
    return tuple(sorted(out))


def _compile_access(
    wl: Workload, access_index: int, axis_pos: dict[str, int], reduce: frozenset[int]
) -> AccessInfo:
    acc = wl.accesses[access_index]
    dims: list[tuple[tuple[int, int], ...]] = []
    for terms in acc.index:
        row: list[tuple[int, int]] = []
        for name, coef in terms:
            if name not in axis_pos:
                raise ScheduleError(f"{wl.name}: tensor {acc.tensor} is indexed by unknown axis {name!r}")
            if coef != 0:
                row.append((axis_pos[name], abs(coef)))
        dims.append(tuple(row))
    used = frozenset(a for row in dims for a, _ in row)
    return AccessInfo(
        name=acc.tensor,
        is_output=acc.is_output,
        elem_bytes=acc.elem_bytes or dtype_bytes(acc.dtype),
        shape=tuple(acc.shape),
        dims=tuple(dims),
        axes_used=used,
        uses_reduce=bool(used & reduce),
    )


class ScheduleSpace:
    """Legal schedules of ``workload`` on ``hw`` and the per-level quantities the tuner reasons with.

    Obtain one with :func:`space_for` (cached per workload and profile).
    """

    def __init__(self, workload: Workload, hw: HwProfile) -> None:
        if not workload.axes:
            raise ScheduleError(f"{workload.name}: a workload needs at least one loop axis")
        if not any(a.is_output for a in workload.accesses):
            raise ScheduleError(f"{workload.name}: a workload needs an output access")
        self.workload = workload
        self.hw = hw
        self.axes: tuple[str, ...] = tuple(a.name for a in workload.axes)
        self.extents: tuple[int, ...] = tuple(a.extent for a in workload.axes)
        if min(self.extents) < 1:
            raise ScheduleError(f"{workload.name}: axis extents must be positive, got {self.extents}")
        self.is_reduce: tuple[bool, ...] = tuple(a.kind == "reduce" for a in workload.axes)
        self.spatial: tuple[int, ...] = tuple(i for i, r in enumerate(self.is_reduce) if not r)
        self.reduce: tuple[int, ...] = tuple(i for i, r in enumerate(self.is_reduce) if r)
        pos = {n: i for i, n in enumerate(self.axes)}
        red = frozenset(self.reduce)
        tensors = tuple(_compile_access(workload, i, pos, red) for i in range(len(workload.accesses)))
        self.inputs: tuple[AccessInfo, ...] = tuple(t for t in tensors if not t.is_output)
        self.output: AccessInfo = next(t for t in tensors if t.is_output)
        self.tensors: tuple[AccessInfo, ...] = (*self.inputs, self.output)
        self.candidates: tuple[tuple[int, ...], ...] = tuple(_candidates(e) for e in self.extents)
        self._legal = tuple(frozenset(c) for c in self.candidates)
        self.acc_bytes = accumulator_bytes(workload.dtype)
        # Memo tables: the walks and the cost model revisit the same tiles many times.
        self._elems: dict[tuple[int, ...], tuple[int, ...]] = {}
        self._fits: dict[tuple[object, ...], bool] = {}
        self._traffic: dict[tuple[object, ...], int] = {}
        self._hw_fits: dict[tuple[object, ...], bool] = {}
        self._reg_bytes: dict[tuple[int, ...], int] = {}
        self._shared_bytes: dict[tuple[int, ...], int] = {}

    # ----------------------------------------------------------------------------------------- states
    def initial(self) -> Schedule:
        """The paper's unscheduled start: every tile 1 below the full extent, no virtual threads, level 0."""
        ones = tuple(1 for _ in self.axes)
        return Schedule(axes=self.axes, tiles=(ones, ones, self.extents), vthreads=ones, level=0)

    def make(
        self,
        t0: tuple[int, ...],
        t1: tuple[int, ...],
        vthreads: tuple[int, ...] | None = None,
        level: int = LAST,
    ) -> Schedule:
        """A schedule from register and block tiles (no legality check; see :meth:`fits`)."""
        v = vthreads if vthreads is not None else tuple(1 for _ in self.axes)
        return Schedule(
            axes=self.axes, tiles=(tuple(t0), tuple(t1), self.extents), vthreads=tuple(v), level=level
        )

    def well_formed(self, s: Schedule) -> bool:
        """Tile order, candidate membership and virtual-thread legality (no hardware limits)."""
        return 0 <= s.level <= LAST and self._tiles_ok(s)

    def _tiles_ok(self, s: Schedule) -> bool:
        if s.axes != self.axes or len(s.tiles) != NUM_LEVELS or s.tiles[LAST] != self.extents:
            return False
        if len(s.vthreads) != len(self.axes) or any(len(t) != len(self.axes) for t in s.tiles):
            return False
        for a, ext in enumerate(self.extents):
            t0, t1, v = s.tiles[0][a], s.tiles[1][a], s.vthreads[a]
            if not 1 <= t0 <= t1 <= ext or t0 not in self._legal[a] or t1 not in self._legal[a]:
                return False
            if v < 1 or v & (v - 1) or t0 % v or v > MAX_VTHREAD or (self.is_reduce[a] and v != 1):
                return False
        return True

    # ------------------------------------------------------------------------------- footprints (F)
    @staticmethod
    def tensor_elems(t: AccessInfo, tile: tuple[int, ...]) -> int:
        """Elements of ``t`` touched by one tile: per dim the span of its affine index, capped by the dim."""
        n = 1
        for size, row in zip(t.shape, t.dims, strict=True):
            span = 1
            for a, c in row:
                span += c * (tile[a] - 1)
            n *= min(size, span)
        return n

    @staticmethod
    def tensor_elems_dim(t: AccessInfo, dim: int, tile: tuple[int, ...]) -> int:
        """Extent of dimension ``dim`` of ``t`` that one tile touches (the span of its index, capped)."""
        return min(t.shape[dim], 1 + sum(c * (tile[a] - 1) for a, c in t.dims[dim]))

    def elems(self, tile: tuple[int, ...]) -> tuple[int, ...]:
        """:meth:`tensor_elems` of every tensor (inputs in order, then the output) for ``tile``, memoized."""
        hit = self._elems.get(tile)
        if hit is None:
            if len(self._elems) > _MEMO_LIMIT:
                self._elems.clear()
            hit = self._elems[tile] = tuple(self.tensor_elems(t, tile) for t in self.tensors)
        return hit

    def register_bytes(self, t0: tuple[int, ...]) -> int:
        """Per-thread register footprint F_0: input fragments of the register tile plus the accumulators."""
        hit = self._reg_bytes.get(t0)
        if hit is None:
            if len(self._reg_bytes) > _MEMO_LIMIT:
                self._reg_bytes.clear()
            e = self.elems(t0)
            inputs = sum(n * t.elem_bytes for n, t in zip(e, self.inputs, strict=False))
            hit = self._reg_bytes[t0] = inputs + e[-1] * self.acc_bytes
        return hit

    def shared_bytes(self, t1: tuple[int, ...]) -> int:
        """Per-block shared-memory footprint F_1: the input tiles staged per reduction step.

        The output tile is accumulated in registers and written straight to global memory, so it takes no
        shared memory.
        """
        hit = self._shared_bytes.get(t1)
        if hit is None:
            if len(self._shared_bytes) > _MEMO_LIMIT:
                self._shared_bytes.clear()
            e = self.elems(t1)
            hit = self._shared_bytes[t1] = sum(n * t.elem_bytes for n, t in zip(e, self.inputs, strict=False))
        return hit

    def footprint(self, s: Schedule, level: int) -> int:
        """F at ``level`` in bytes (0: per thread in registers, 1: per block in shared memory)."""
        if level == 0:
            return self.register_bytes(s.tiles[0])
        if level == 1:
            return self.shared_bytes(s.tiles[1])
        raise ValueError(f"no footprint at level {level}")

    # ---------------------------------------------------------------------------------- traffic (Q)
    def tile_counts(self, s: Schedule, level: int) -> tuple[int, ...]:
        """How many level-``level`` tiles cover each axis over the whole kernel (edge tiles padded)."""
        t1 = s.tiles[1]
        blocks = tuple(-(-e // b) for e, b in zip(self.extents, t1, strict=True))
        if level == 1:
            return blocks
        if level == 0:
            return tuple(n * -(-b // r) for n, b, r in zip(blocks, t1, s.tiles[0], strict=True))
        raise ValueError(f"no tile counts at level {level}")

    def tensor_traffic(self, s: Schedule, level: int) -> tuple[tuple[AccessInfo, int], ...]:
        """Bytes each tensor moves between ``level`` and the level above it, over the whole kernel.

        Loop order (what the lowering emits): spatial tiles outermost, reduction chunks inside, the output
        accumulated in registers. An input that depends on a reduction axis is reloaded for every (spatial
        tile, reduction chunk) pair; one that does not is loaded once per spatial tile; the output tile is
        written once per spatial tile. No reuse across spatial tiles is assumed at this level (that is L2's
        job, which the cost model accounts for separately).
        """
        counts = self.tile_counts(s, level)
        n_sp = math.prod(counts[a] for a in self.spatial)
        n_red = math.prod(counts[a] for a in self.reduce)
        out: list[tuple[AccessInfo, int]] = []
        for t, n in zip(self.tensors, self.elems(s.tiles[level]), strict=True):
            loads = n_sp * (n_red if t.uses_reduce else 1)
            out.append((t, loads * n * t.elem_bytes))
        return tuple(out)

    def traffic(self, s: Schedule, level: int) -> int:
        """Q at ``level``: total bytes loaded into (and stored out of) that level's tiles (memoized)."""
        key = (s.tiles, level)
        hit = self._traffic.get(key)
        if hit is None:
            if len(self._traffic) > _MEMO_LIMIT:
                self._traffic.clear()
            hit = self._traffic[key] = sum(b for _, b in self.tensor_traffic(s, level))
        return hit

    # --------------------------------------------------------------------------- hardware resources
    def threads(self, s: Schedule) -> int:
        return math.prod(-(-s.tiles[1][a] // s.tiles[0][a]) for a in self.spatial)

    def resources(self, s: Schedule) -> Resources:
        regs = -(-self.register_bytes(s.tiles[0]) // 4) + REGISTER_OVERHEAD
        regs = -(-regs // REGISTER_GRANULE) * REGISTER_GRANULE
        return Resources(
            threads=self.threads(s), registers_per_thread=regs, shared_bytes=self.shared_bytes(s.tiles[1])
        )

    def fits_resources(self, r: Resources) -> bool:
        hw = self.hw
        if r.threads > hw.max_threads_per_block:
            return False
        if r.registers_per_thread > hw.max_registers_per_thread:
            return False
        warps = -(-r.threads // hw.warp_size)
        if r.registers_per_thread * warps * hw.warp_size > hw.registers_per_sm:
            return False
        if r.shared_bytes > hw.shared_mem_per_block:
            return False
        return r.shared_bytes + SHARED_RESERVED_PER_BLOCK <= hw.shared_mem_per_sm

    def fits_hardware(self, s: Schedule) -> bool:
        """:meth:`fits` for a schedule known to be well formed (the successors :mod:`actions` builds)."""
        key = (s.tiles[0], s.tiles[1])
        hit = self._hw_fits.get(key)
        if hit is None:
            if len(self._hw_fits) > _MEMO_LIMIT:
                self._hw_fits.clear()
            hit = self._hw_fits[key] = self.fits_resources(self.resources(s))
        return hit

    def fits(self, s: Schedule) -> bool:
        """Whether ``s`` is a legal schedule of this workload that one SM can run (threads, registers, shared)."""
        key = (s.axes, s.tiles, s.vthreads)
        hit = self._fits.get(key)
        if hit is None:
            if len(self._fits) > _MEMO_LIMIT:
                self._fits.clear()
            hit = self._fits[key] = self._tiles_ok(s) and self.fits_resources(self.resources(s))
        return hit and 0 <= s.level <= LAST

    # ------------------------------------------------------------------------------------- helpers
    def max_vthread(self, t0: int) -> int:
        """Largest legal virtual-thread count for a register tile of ``t0`` (a power of two dividing it)."""
        return min(t0 & -t0, MAX_VTHREAD)

    def warp_lanes(self, s: Schedule) -> tuple[int, ...]:
        """Lanes of the first warp along each axis (0 for reduction axes); the last spatial axis is fastest."""
        lanes = [0] * len(self.axes)
        rest = self.hw.warp_size
        for a in reversed(self.spatial):
            n = -(-s.tiles[1][a] // s.tiles[0][a])
            take = min(n, rest)
            lanes[a] = take
            rest = max(1, rest // take)
        return tuple(lanes)


@lru_cache(maxsize=64)
def space_for(workload: Workload, hw: HwProfile) -> ScheduleSpace:
    """The (cached) :class:`ScheduleSpace` of ``workload`` on ``hw``."""
    return ScheduleSpace(workload, hw)

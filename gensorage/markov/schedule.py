"""The ETIR schedule state of Gensor (§III): tile sizes per memory level per axis, virtual threads, level.

Levels are numbered from the innermost: level 0 is the register tile (T_0, what one thread computes),
level 1 the shared-memory tile (T_1, what one thread block computes / stages per reduction step), and the
outermost level L = ``len(tiles) - 1`` holds the full extents (T_L = the axis extent). For a spatial axis,
the grid has ceil(extent / T_1) blocks along it and a block has T_1 / T_0 threads along it; for a reduction
axis, T_1 is the chunk staged in shared memory per step and T_0 the chunk reduced per thread step.
``vthreads[a]`` splits the register tile of spatial axis ``a`` into that many strided virtual threads.

Exact convention the tuner guarantees for every schedule it returns (``gensorage.markov.space.ScheduleSpace.fits``):

- ``tiles`` has ``L + 1 = 3`` rows on a GPU (registers, shared memory, full extent) and ``tiles[L]`` equals the
  axis extents; for every axis ``1 <= T_0 <= T_1 <= extent``. ``T_0`` need not divide ``T_1``: an axis then has
  ``ceil(T_1 / T_0)`` threads per block and the edge threads / blocks are guarded (wasted work, counted by the
  cost model).
- Threads per block = prod over spatial axes of ``ceil(T_1 / T_0)``; the last spatial axis is the fastest-varying
  one (``threadIdx.x`` and, for the grid, ``blockIdx.x``). Reduction axes get no threads.
- ``vthreads[a]`` is a power of two that divides ``T_0`` of spatial axis ``a`` (1 for reduction axes): along ``a``
  the block tile is laid out as ``[vthreads, threads, T_0 / vthreads]``, so a thread owns ``vthreads`` strided
  chunks of ``T_0 / vthreads`` elements, the chunks ``threads * T_0 / vthreads`` apart.
- ``level`` is where the Markov construction stands: 0 while the register tile is being refined, 1 while the
  shared-memory tile is, and ``L`` once the construction is finished. It does not change what the schedule
  computes or how it is lowered.
"""

from __future__ import annotations

from dataclasses import dataclass

from gensorage.errors import ScheduleError


@dataclass(frozen=True, slots=True)
class Schedule:
    axes: tuple[str, ...]  # axis names, in the workload's axis order
    tiles: tuple[tuple[int, ...], ...]  # tiles[level][axis], level 0 = registers ... level L = full extent
    vthreads: tuple[int, ...]  # per axis (1 for reduction axes)
    level: int  # current memory level of the construction (the level the next action refines)

    def tile(self, level: int, axis: str) -> int:
        return self.tiles[level][self.axes.index(axis)]

    def to_json(self) -> dict[str, object]:
        return {
            "axes": list(self.axes),
            "tiles": [list(t) for t in self.tiles],
            "vthreads": list(self.vthreads),
            "level": self.level,
        }

    @staticmethod
    def from_json(data: dict[str, object]) -> Schedule:
        """Inverse of :meth:`to_json`; raises :class:`ScheduleError` on malformed data."""
        try:
            axes = tuple(str(a) for a in _items(data["axes"]))
            tiles = tuple(tuple(_int(x) for x in _items(t)) for t in _items(data["tiles"]))
            vthreads = tuple(_int(v) for v in _items(data["vthreads"]))
            level = _int(data["level"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ScheduleError(f"malformed schedule JSON: {exc!r}") from None
        return Schedule(axes=axes, tiles=tiles, vthreads=vthreads, level=level)


def _items(x: object) -> list[object]:
    if not isinstance(x, list | tuple):
        raise TypeError(f"expected a list, got {type(x).__name__}")
    return list(x)


def _int(x: object) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"expected an integer, got {x!r}")
    return x

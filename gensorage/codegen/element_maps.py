"""How a phase of a graph-defined kernel deals the elements of a block tensor to the block's threads."""

from __future__ import annotations

from dataclasses import dataclass

from gensorage.codegen.block_mma import MmaTiling
from gensorage.construction.block_threads import MatmulTiling


@dataclass(frozen=True, slots=True)
class Cyclic:
    """Elements dealt cyclically: slot ``e`` of thread ``tx`` is flat element ``e * threads + tx`` of ``space``;
    the value written has ``shape`` (``space`` projected by broadcasting, stored where the projection is
    the first element)."""

    space: tuple[int, ...]
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Tiled:
    """The constructor's register tiling of a matmul with batch dims ``batch`` (slot = step, then register)."""

    tiling: MatmulTiling
    batch: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Fragments:
    """A tensor-core matmul's accumulator fragments (slot = step, then register; see
    :mod:`gensorage.codegen.block_mma`)."""

    tiling: MmaTiling


@dataclass(frozen=True, slots=True)
class RowFragments:
    """Per-row values of a tensor-core matmul's rows (an online ``softmax_sum`` beside its P·V): slot = step,
    then this lane's row tile ``r`` (rows ``g`` and ``g + 8`` of each MMA row tile); the first lane of each
    row's group in the warp tiles of the first columns holds the value (see :mod:`.online_mma`)."""

    tiling: MmaTiling


ElementMap = Cyclic | Tiled | Fragments | RowFragments

__all__ = ["Cyclic", "ElementMap", "Fragments", "RowFragments", "Tiled"]

"""Schedule construction for the pipeline: the one entry point into Gensor's Markov construction.

Everything that sizes a kernel from the hardware profile goes through this package, never through the tuner's
front door (:func:`gensorage.tune`, which adds a store and baselines for users tuning one operator):

- :func:`construct_schedule` — the memoised call into :func:`gensorage.markov.construct` for a loop nest;
  inside :func:`warm_starts`, a new shape of a constructed nest walks from the nearest constructed shape;
- :mod:`.block_threads` — threads per block of a graph-defined kernel and the register/block tiling of its
  dominant matmul (the code generator);
- :mod:`.kernel_sizes` — grid sizes and trip count of a graph-defined kernel at new shapes (re-instantiation).
"""

from __future__ import annotations

from gensorage.construction.block_threads import (
    MatmulTiling,
    ThreadChoice,
    fallback_threads,
    matmul_tiling,
    matmul_workload,
    widen_block_tile,
)
from gensorage.construction.kernel_sizes import SizeLattice, kernel_sizes
from gensorage.construction.schedule import construct_schedule, warm_starts

__all__ = [
    "MatmulTiling",
    "SizeLattice",
    "ThreadChoice",
    "construct_schedule",
    "fallback_threads",
    "kernel_sizes",
    "matmul_tiling",
    "matmul_workload",
    "warm_starts",
    "widen_block_tile",
]

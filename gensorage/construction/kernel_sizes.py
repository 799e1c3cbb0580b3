"""Grid sizes and for-loop trip count of one graph-defined kernel at given shapes (re-instantiation).

The candidates are the Markov construction's sizes for the block graph's loop nest (as the search sizes a
verified structure: :func:`.block_sizes.constructed_sizes`, nearest legal options
first) and a lattice of legal values per variable (every grid dim, then the trip count), all of it when it has
at most :data:`EXHAUSTIVE_LIMIT` points, else a steepest-descent walk from a given start and random restarts.
The µGraph cost model picks among the candidates that are valid and fit the GPU; ties go to the candidate tried
first (the start, then the construction's proposals). The model charges a block its tiles' memory plan, which
the emitted kernel can exceed (padded rows, float32 accumulators): given a launch check, the best-priced
candidates are checked in order and the first that launches is kept (up to :data:`FIT_TRIES` of them).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from gensorage.construction.block_sizes import constructed_sizes, size_options
from gensorage.errors import GensorageError
from gensorage.hw.profile import HwProfile
from gensorage.ugraph.ir import BlockGraph, GraphDefinedOp, KernelGraph, Ref, TensorSpec
from gensorage.ugraph.shapes import TensorInfo, block_shapes
from gensorage.ugraph.validate import validate

CostFn = Callable[[KernelGraph], float]
#: Why a kernel graph cannot launch on the GPU (one line), or None (:func:`gensorage.codegen.kernel_fit.launch_problem`).
FitFn = Callable[[KernelGraph], str | None]
#: Block graphs for (grid, trip count); raises a GensorageError where the sizes do not fit the structure.
BuildFn = Callable[[tuple[int, ...], int], BlockGraph]

#: Grid/loop assignments of one kernel evaluated exhaustively when there are at most this many.
EXHAUSTIVE_LIMIT = 2048
#: Otherwise: random restarts of the descent walk (the first start is the lattice's own start).
WALK_RESTARTS = 6
#: The best-priced candidates checked against the launch limits before the construction gives up.
FIT_TRIES = 16


@dataclass(frozen=True, slots=True)
class SizeLattice:
    """Candidate values per variable (the grid dims, then the for-loop trip count) and where a walk starts."""

    values: tuple[tuple[int, ...], ...]
    start: tuple[int, ...]

    @property
    def size(self) -> int:
        return math.prod(len(v) for v in self.values)


def divisors(n: int, *, limit: int) -> tuple[int, ...]:
    """The divisors of ``n`` up to ``limit``, ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return tuple(sorted({x for d in small for x in (d, n // d) if x <= limit}))


def nearest(values: Sequence[int], target: float) -> int:
    """The value closest to ``target`` on a log scale (the smaller on ties)."""
    return min(values, key=lambda v: (abs(math.log(v) - math.log(max(target, 1e-9))), v))


def single_op_graph(op: GraphDefinedOp, args: Sequence[TensorInfo]) -> KernelGraph:
    """A kernel graph of just ``op`` (reading its own inputs ``args``), to validate and price it alone."""
    specs = tuple(TensorSpec(f"in{i}", a.shape, a.dtype) for i, a in enumerate(args))
    return KernelGraph(specs, (op,), tuple(Ref(len(specs), o) for o in range(len(op.block.savers))))


@dataclass(slots=True)
class _Evaluator:
    """Prices (grid..., trip count) points once each, remembering the best valid block graph."""

    build: BuildFn
    args: tuple[TensorInfo, ...]
    hw: HwProfile
    cost: CostFn
    seen: dict[tuple[int, ...], tuple[float, BlockGraph | None]] = field(default_factory=dict)
    last_error: str | None = None

    def __call__(self, point: tuple[int, ...]) -> float:
        if point not in self.seen:
            self.seen[point] = self._evaluate(point)
        return self.seen[point][0]

    def _evaluate(self, point: tuple[int, ...]) -> tuple[float, BlockGraph | None]:
        grid, forloop = point[:-1], point[-1]
        try:
            block = self.build(grid, forloop)
            sub = self.sub(block)
            validate(sub, self.hw)
            t = float(self.cost(sub))
        except GensorageError as exc:
            self.last_error = str(exc)
            return math.inf, None
        if not math.isfinite(t):
            self.last_error = f"the cost model gives no finite time for grid {list(grid)}, loop {forloop}"
            return math.inf, None
        return t, block

    def best(self) -> tuple[float, BlockGraph | None]:
        return min(self.seen.values(), key=lambda v: v[0], default=(math.inf, None))

    def ranked(self) -> list[BlockGraph]:
        """The valid block graphs, cheapest first (ties: the one tried first)."""
        valid = [(t, b) for t, b in self.seen.values() if b is not None]
        return [b for _, b in sorted(valid, key=lambda v: v[0])]

    def sub(self, block: BlockGraph) -> KernelGraph:
        return single_op_graph(GraphDefinedOp(block, tuple(Ref(i) for i in range(len(self.args)))), self.args)

    def first_fitting(self, fits: FitFn) -> BlockGraph | None:
        """The cheapest block graph that launches (of the :data:`FIT_TRIES` cheapest); reasons of the others
        go to ``last_error``."""
        for block in self.ranked()[:FIT_TRIES]:
            why = fits(self.sub(block))
            if why is None:
                return block
            self.last_error = f"grid {list(block.grid)}, loop {block.forloop} does not launch: {why}"
        return None


def kernel_sizes(
    build: BuildFn,
    args: tuple[TensorInfo, ...],
    lattice: SizeLattice,
    hw: HwProfile,
    cost: CostFn,
    rng: np.random.Generator,
    seed: int = 0,
    fits: FitFn | None = None,
) -> tuple[BlockGraph | None, str | None]:
    """The block graph ``build`` makes at the sizes the cost model prefers (see the module docstring); with
    ``fits``, the cheapest of them that launches.

    Returns the block graph, or None with the last reason a candidate was refused when none is valid.
    """
    evaluate = _Evaluator(build, args, hw, cost)
    evaluate(lattice.start)
    for point in _markov_points(evaluate, hw, seed):
        evaluate(point)
    if lattice.size <= EXHAUSTIVE_LIMIT:
        for point in itertools.product(*lattice.values):
            evaluate(point)
    else:
        starts = [lattice.start] + [
            tuple(int(rng.choice(v)) for v in lattice.values) for _ in range(WALK_RESTARTS - 1)
        ]
        for s in starts:
            _descend(s, lattice, evaluate)
    block = evaluate.best()[1] if fits is None else evaluate.first_fitting(fits)
    return block, None if block is not None else evaluate.last_error


def _markov_points(evaluate: _Evaluator, hw: HwProfile, seed: int) -> list[tuple[int, ...]]:
    """(grid..., trip count) points the Markov construction proposes for the kernel at these shapes.

    The loop nest needs the block's tiles, so it is built from a valid point already evaluated; with none, or
    when the construction finds nothing, there are no proposals.
    """
    _, base = evaluate.best()
    if base is None:
        return []
    args = evaluate.args
    shapes = [a.shape for a in args]
    try:
        sub = single_op_graph(GraphDefinedOp(base, tuple(Ref(i) for i in range(len(shapes)))), args)
        info = block_shapes(sub, 0, base, args)
        target = constructed_sizes(base, shapes, info, args[0].dtype, hw, seed, {})
        if target is None:
            return []
        return [(*grid, f) for grid, f in size_options(base, shapes, target)]
    except GensorageError:
        return []


def _descend(start: tuple[int, ...], lattice: SizeLattice, evaluate: _Evaluator) -> None:
    """Steepest descent over the lattice: move one variable to a neighbouring value while it helps."""
    point = start
    value = evaluate(point)
    while True:
        best_point, best_value = point, value
        for v, vals in enumerate(lattice.values):
            i = vals.index(point[v])
            for k in (i - 1, i + 1):
                if 0 <= k < len(vals):
                    cand = point[:v] + (vals[k],) + point[v + 1 :]
                    c = evaluate(cand)
                    if c < best_value:
                        best_point, best_value = cand, c
        if best_point == point:
            return
        point, value = best_point, best_value


__all__ = [
    "EXHAUSTIVE_LIMIT",
    "FIT_TRIES",
    "WALK_RESTARTS",
    "BuildFn",
    "CostFn",
    "FitFn",
    "SizeLattice",
    "divisors",
    "kernel_sizes",
    "nearest",
    "single_op_graph",
]

"""The pipeline's one entry point into construction (gensorage.construction)."""

from __future__ import annotations

import itertools
import math

import numpy as np

from gensorage.construction import SizeLattice, construct_schedule, kernel_sizes, matmul_workload
from gensorage.construction.kernel_sizes import divisors, nearest, single_op_graph
from gensorage.errors import GensorageError
from gensorage.hw import load_profile
from gensorage.markov import construct
from gensorage.ugraph.cost import predict_ugraph_time
from gensorage.ugraph.examples import gated_mlp
from gensorage.ugraph.ir import BlockGraph, GraphDefinedOp, Ref
from gensorage.ugraph.shapes import TensorInfo
from gensorage.ugraph.validate import validate

H100 = load_profile("h100")


def test_construct_schedule_is_the_construction_memoised() -> None:
    wl = matmul_workload(1, 64, 128, 32, "float16")
    s = construct_schedule(wl, H100, seed=3)
    assert s == construct(wl, H100, seed=3).schedule
    assert construct_schedule(wl, H100, seed=3) is s


def test_divisors_and_nearest() -> None:
    assert divisors(12, limit=6) == (1, 2, 3, 4, 6)
    assert nearest((1, 2, 4, 8), 3.0) == 4 and nearest((1, 16), 3.0) == 1  # on a log scale


def test_kernel_sizes_keeps_the_cheapest_valid_point_of_a_small_lattice() -> None:
    # Law: on a lattice small enough to walk whole, the result is the cheapest point that validates, the
    # first tried on ties (the start, then the construction's proposals, then the lattice in order).
    _, g = gated_mlp(m=8, k=64, n=96)
    op = g.ops[0]
    assert isinstance(op, GraphDefinedOp)
    args = tuple(TensorInfo(s.shape, s.dtype) for s in g.inputs)

    def build(grid: tuple[int, ...], forloop: int) -> BlockGraph:
        return BlockGraph(grid, forloop, op.block.nodes)

    def price(grid: tuple[int, ...], forloop: int) -> float:
        try:
            sub = single_op_graph(GraphDefinedOp(build(grid, forloop), tuple(Ref(i) for i in range(3))), args)
            validate(sub, H100)
        except GensorageError:
            return math.inf
        return predict_ugraph_time(sub, H100)

    lattice = SizeLattice((divisors(96, limit=96), divisors(64, limit=64)), (3, 4))
    block, error = kernel_sizes(
        build, args, lattice, H100, lambda sub: predict_ugraph_time(sub, H100), np.random.default_rng(0)
    )
    assert block is not None and error is None
    best = min(price(grid, f) for grid, f in (((gd,), f) for gd, f in itertools.product(*lattice.values)))
    assert price(block.grid, block.forloop) == best


def test_kernel_sizes_says_why_when_nothing_fits() -> None:
    _, g = gated_mlp(m=8, k=64, n=96)
    args = tuple(TensorInfo(s.shape, s.dtype) for s in g.inputs)

    def build(grid: tuple[int, ...], forloop: int) -> BlockGraph:
        raise GensorageError(f"grid {grid} does not fit")

    block, error = kernel_sizes(
        build, args, SizeLattice(((1, 2), (1,)), (1, 1)), H100, lambda sub: 1.0, np.random.default_rng(0)
    )
    assert block is None and error is not None and "does not fit" in error

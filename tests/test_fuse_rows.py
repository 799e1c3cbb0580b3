"""Row fusion (gensorage.ugraph.optimize.fuse_rows): what it groups, what it leaves alone, and its kernels
against float64 through the interpreter, the llvm twin and the field twin."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gensorage.codegen.block_reduce import reduce_lanes
from gensorage.codegen.field_twin import check_field_twin
from gensorage.codegen.module import compile_ugraph
from gensorage.hw import load_profile
from gensorage.opset import Op
from gensorage.program import Program, list_configs, load_config
from gensorage.superopt.search_shapes import derive_search_shapes
from gensorage.ugraph import from_program
from gensorage.ugraph.ir import (
    BlockOp,
    GraphDefinedOp,
    InputIterator,
    KernelOp,
    OutputSaver,
    Ref,
    ThreadGraph,
    ThreadOp,
)
from gensorage.ugraph.optimize.fuse_rows import find_groups, fuse_rows
from gensorage.verify.equivalent import equivalent

HW = load_profile("h200")


def _kinds(op: GraphDefinedOp) -> list[str]:
    names = {InputIterator: "it", ThreadGraph: "tg", OutputSaver: "save"}
    return [names.get(type(n)) or n.op.value for n in op.block.nodes]  # type: ignore[union-attr]


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b)) / max(float(np.linalg.norm(b)), 1e-300)


# ------------------------------------------------------------------------------------------------ programs


def ntrans(b: int, d: int, dtype: str = "float32") -> Program:
    p = Program("ntrans")
    h, x, alpha = p.input("H", (b, d), dtype), p.input("X", (b, d), dtype), p.input("alpha", (d,), dtype)
    hn = p.div(h, p.sqrt(p.sum(p.mul(h, h), dim=1)))
    u = p.add(x, p.mul(alpha, p.sub(hn, x)))
    p.output(p.div(u, p.sqrt(p.sum(p.mul(u, u), dim=1))))
    return p


def rmsnorm(b: int, h: int, dtype: str = "float32") -> Program:
    p = Program("rmsnorm")
    x, g = p.input("X", (b, h), dtype), p.input("G", (h,), dtype)
    p.output(p.div(p.mul(x, g), p.sqrt(p.scale(p.sum(p.mul(x, x), dim=1), 1.0 / h))))
    return p


def softmax(rows: tuple[int, ...], d: int, dtype: str = "float32") -> Program:
    """A stable softmax, the row maximum kept (keepdim) and also returned without the row dim."""
    p = Program("softmax")
    s = p.input("S", (*rows, d), dtype)
    last = len(rows)
    e = p.exp(p.sub(p.scale(s, 0.5), p.max(p.scale(s, 0.5), dim=last, keepdim=True)))
    p.output(p.div(e, p.sum(e, dim=last)))
    p.output(p.max(s, dim=last))
    return p


def colnorm(b: int, d: int, n: int, dtype: str = "float32") -> Program:
    """QKNorm's keys (stored transposed): each column normalised over the middle dim; its maximum is returned
    without that dim."""
    p = Program("colnorm")
    k = p.input("K", (b, d, n), dtype)
    p.output(p.div(k, p.sqrt(p.scale(p.sum(p.mul(k, k), dim=1), 1.0 / d))))
    p.output(p.max(k, dim=1))
    return p


# ---------------------------------------------------------------------------------------------- the rewrite


def test_ntrans_is_one_kernel_of_three_levels() -> None:
    g = fuse_rows(from_program(load_config("ntrans")), HW)
    (op,) = g.ops
    assert isinstance(op, GraphDefinedOp) and op.block.grid == (8,) and op.block.forloop == 1
    assert _kinds(op) == ["it", "it", "it", "tg", "sum", "tg", "sum", "tg", "save"]
    alpha = op.block.nodes[2]
    assert isinstance(alpha, InputIterator) and alpha.imap == (
        None,
    )  # the [d] vector: every block reads it all


def test_rmsnorm_fuses_around_the_matmul() -> None:
    g = fuse_rows(from_program(load_config("rmsnorm")), HW)
    fused, mm = g.ops
    assert isinstance(fused, GraphDefinedOp) and _kinds(fused) == ["it", "it", "tg", "sum", "tg", "save"]
    assert isinstance(mm, KernelOp) and mm.op is Op.MATMUL and mm.inputs[0].node == len(g.inputs)


def test_softmax_levels_and_short_rows_share_a_block() -> None:
    g = fuse_rows(from_program(softmax((2, 256), 64)), HW)
    (op,) = g.ops
    assert isinstance(op, GraphDefinedOp)
    assert _kinds(op) == ["it", "tg", "max", "max", "tg", "sum", "tg", "save", "save"]
    # 512 rows of 64: several rows per block, the grid over both leading dims
    assert op.block.grid == (2, 64)


def test_qknorm_normalises_queries_and_keys_in_one_kernel_each() -> None:
    g = fuse_rows(from_program(load_config("qknorm")), HW)
    assert [type(op).__name__ for op in g.ops] == ["GraphDefinedOp"] * 2 + [
        "KernelOp",
        "GraphDefinedOp",
        "KernelOp",
    ]
    keys = g.ops[1]
    assert isinstance(keys, GraphDefinedOp) and _kinds(keys) == ["it", "tg", "sum", "tg", "save"]
    # K [2, 64, 4096] normalised over dim 1: blocks split dims 0 and 2, 32 columns each
    it = keys.block.nodes[0]
    assert isinstance(it, InputIterator) and it.imap == (0, 2) and keys.block.grid == (2, 128)


def test_groups_left_alone() -> None:
    # reductions over two different dims
    p = Program("two_dims")
    x = p.input("X", (8, 16), "float32")
    p.output(p.add(p.sum(x, dim=0), p.sum(x, dim=1)))
    g = from_program(p)
    assert all(len(grp.members) < 3 for grp in find_groups(g))
    # a path through a matmul between two element-wise ops (the group would not be convex)
    p = Program("through_matmul")
    x, w = p.input("X", (8, 16), "float32"), p.input("W", (16, 16), "float32")
    a = p.exp(x)
    p.output(p.add(a, p.matmul(a, w)))
    g = from_program(p)
    assert find_groups(g) == [] and fuse_rows(g, HW) == g


def test_a_reduced_row_is_not_read_inside_the_group() -> None:
    # max without keepdim is [16]: broadcast against a row [16, 16] it aligns with the row, not the rows, so
    # the product stays out of the group (the maximum and the relu, siblings, still share a kernel)
    p = Program("dropped_dim")
    x = p.input("X", (16, 16), "float32")
    m, r = p.max(x, dim=1), p.relu(x)
    p.output(p.mul(r, m))
    g = from_program(p)
    (grp,) = find_groups(g)
    assert grp.members == (1, 2)
    xs = [np.random.default_rng(0).standard_normal((16, 16))]
    assert _rel(fuse_rows(g, HW).run(*xs)[0], p.run(*xs)[0]) < 1e-12


# -------------------------------------------------------------------------------------------- the kernels


def _draw(p: Program, magnitude: float, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(t.shape) * magnitude + (0.5 if t.ndim == 1 else 0.0) for t in p.inputs]


def _check(p: Program, magnitude: float, seed: int, tol: float = 2e-5) -> None:
    g = fuse_rows(from_program(p), HW)
    assert any(isinstance(op, GraphDefinedOp) for op in g.ops)
    xs = _draw(p, magnitude, seed)
    ref = p.run(*xs)
    for got, want in zip(g.run(*xs), ref, strict=True):
        assert _rel(got, want) < 1e-12
    twin = compile_ugraph(g, HW, "llvm").run(*[x.astype(np.float32) for x in xs])
    for got, want in zip(twin, ref, strict=True):
        assert _rel(got, want) < tol


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    b=st.integers(1, 12),
    d=st.sampled_from([1, 3, 16, 40, 64, 100, 256, 1000, 4096]),
    log_mag=st.floats(-3, 3),
    seed=st.integers(0, 2**16),
)
@example(b=2, d=4096, log_mag=3.0, seed=0)  # a row over all the block's warps: their partials combined
def test_ntrans_and_rmsnorm_kernels_match_float64(b: int, d: int, log_mag: float, seed: int) -> None:
    _check(ntrans(b, d), 10.0**log_mag, seed)
    _check(rmsnorm(b, d), 10.0**log_mag, seed)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(st.integers(1, 9), min_size=1, max_size=3).map(tuple),
    d=st.sampled_from([2, 7, 32, 64, 129, 512, 2048]),
    log_mag=st.floats(-2, 2),
    seed=st.integers(0, 2**16),
)
@example(rows=(3,), d=2048, log_mag=2.0, seed=0)
def test_softmax_kernel_matches_float64(rows: tuple[int, ...], d: int, log_mag: float, seed: int) -> None:
    _check(softmax(rows, d), 10.0**log_mag, seed, tol=1e-5)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    b=st.integers(1, 4),
    d=st.sampled_from([2, 8, 64, 100]),
    n=st.sampled_from([1, 5, 32, 96, 4096]),
    log_mag=st.floats(-3, 3),
    seed=st.integers(0, 2**16),
)
@example(b=2, d=64, n=4096, log_mag=1.0, seed=0)  # qknorm's keys
def test_column_reductions_match_float64(b: int, d: int, n: int, log_mag: float, seed: int) -> None:
    _check(colnorm(b, d, n), 10.0**log_mag, seed)


@pytest.mark.parametrize("b,d", [(3, 5), (2, 300), (1, 4096)])
def test_field_twin_of_row_kernels(b: int, d: int) -> None:
    # d = 300 and 4096: the warps' partials combined after the lanes (more than a warp per row)
    p = ntrans(b, d)
    g = fuse_rows(from_program(p), HW)
    assert check_field_twin(g, p, trials=1, seed=3, hw=HW)


def test_reduce_lanes() -> None:
    assert reduce_lanes(1, 4096, 1024) == 1024
    assert reduce_lanes(4, 64, 256) == 64
    assert reduce_lanes(8, 3, 256) == 1  # a short loop beats the barriers
    assert reduce_lanes(2, 100, 96) == 32
    assert reduce_lanes(1024, 4096, 1024) == 1  # enough results for every thread: serial


# --------------------------------------------------------------------------------------- bundled programs


@pytest.mark.parametrize("name", [c.stem for c in list_configs()])
def test_bundled_programs_fused_direct_is_equivalent(name: str) -> None:
    small = derive_search_shapes(load_config(name)).program
    g = fuse_rows(from_program(small), HW)
    assert equivalent(small, g, 1e-6, seed=0)
    xs = small.random_inputs(seed=1)
    for got, want in zip(g.run(*xs), small.run(*xs), strict=True):
        assert _rel(got, want) < 1e-12


@pytest.mark.parametrize("name", ["ntrans", "qknorm", "mha_prefill"])
def test_bundled_programs_fused_direct_llvm_twin(name: str) -> None:
    small = derive_search_shapes(load_config(name)).program
    g = fuse_rows(from_program(small), HW)
    xs = small.random_inputs(seed=2)
    got = compile_ugraph(g, HW, "llvm").run(*xs)
    for a, b in zip(got, small.run(*[x.astype(np.float64) for x in xs]), strict=True):
        # float16 programs: rounding of the stored intermediates, and of a float32 operand (qknorm's normalised
        # rows) converted to bfloat16 for a tensor-core matmul, which the twin rounds as the GPU does (2^-9).
        assert _rel(a, b) < 4e-3


def test_a_wrong_fused_kernel_is_rejected() -> None:
    p = rmsnorm(4, 16)
    g = fuse_rows(from_program(p), HW)
    op = g.ops[0]
    assert isinstance(op, GraphDefinedOp)
    nodes = list(op.block.nodes)
    tg = nodes[4]
    assert isinstance(tg, ThreadGraph) and tg.ops[0].op is Op.SCALE
    nodes[4] = dataclasses.replace(tg, ops=(ThreadOp(Op.SCALE, (Ref(0),), (("factor", 0.5),)), *tg.ops[1:]))
    block = dataclasses.replace(op.block, nodes=tuple(nodes))
    bad = dataclasses.replace(g, ops=(dataclasses.replace(op, block=block),))
    assert not equivalent(p, bad, 1e-6, seed=0)
    assert isinstance(nodes[3], BlockOp)


def test_a_row_over_shared_memory_is_left_alone() -> None:
    # rows of 2^18 float32 elements do not fit a block's shared memory (no looped row kernel yet)
    p = Program("long_rows")
    x = p.input("X", (4, 1 << 18), "float16")
    p.output(p.div(p.exp(x), p.sum(p.exp(x), dim=1)))
    g = from_program(p)
    assert find_groups(g) and fuse_rows(g, HW) == g
    assert len(fuse_rows(from_program(softmax((4,), 1 << 12)), HW).ops) == 1

"""The slice op (RoPE's rotate_half): shapes and bounds as Python slices them, one-line errors, the ``.gsp`` round
trip, both verification tiers, the pre-defined kernel on the CPU (llvm) and for CUDA, and the search's refusal.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import gensorage
from gensorage.codegen.module import run_cpu
from gensorage.errors import ProgramError, UnsupportedOpError
from gensorage.exhaustive.spec import SearchSpec
from gensorage.hw import load_profile
from gensorage.opset import Op, flops, infer_shape
from gensorage.program import Program, dump_program, parse_program
from gensorage.ugraph import KernelGraph, from_program
from gensorage.ugraph.cost import kernel_costs
from gensorage.ugraph.ir import KernelOp
from gensorage.verify import equivalent


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENSORAGE_HOME", str(tmp_path / "home"))


def _rotate_half(dtype: str = "float32", shape: tuple[int, ...] = (2, 3, 8)) -> Program:
    """``x·x + cat(-x2, x1)`` with ``x1, x2`` the halves of the last dim (LLaMA's rotate_half)."""
    p = Program(name=f"rotate_half_{dtype}")
    x = p.input("X", shape, dtype)
    h = shape[-1] // 2
    rotated = p.concat([p.scale(p.slice(x, -1, h, shape[-1]), -1.0), p.slice(x, -1, 0, h)], -1)
    p.output(p.add(p.mul(x, x), rotated))
    return p


def _numpy_rotate_half(x: np.ndarray) -> np.ndarray:
    h = x.shape[-1] // 2
    return x * x + np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


# ------------------------------------------------------------------------------------------ shapes, errors


@pytest.mark.parametrize(
    ("start", "stop", "window"),
    [(2, 6, (2, 6)), (-3, 100, (5, 8)), (-100, -6, (0, 2)), (0, 8, (0, 8)), (7, 8, (7, 8))],
)
def test_bounds_are_normalised_like_python(start: int, stop: int, window: tuple[int, int]) -> None:
    assert infer_shape(Op.SLICE, [(3, 8)], (("dim", 1), ("start", start), ("stop", stop))) == (
        3,
        len(range(8)[start:stop]),
    )
    p = Program()
    y = p.slice(p.input("X", (3, 8)), -1, start, stop)
    assert y.shape == (3, window[1] - window[0])
    assert dict(p.nodes[y.id].attrs) == {"dim": 1, "start": window[0], "stop": window[1]}  # stored normalised
    assert flops(Op.SLICE, [(3, 8)], y.shape) == 0  # a layout op


def test_numpy_integer_bounds_are_plain_ints() -> None:
    p = Program()
    y = p.slice(p.input("X", (3, 8)), np.int64(1), np.int64(2), np.int32(5))  # type: ignore[arg-type]
    assert p.nodes[y.id].attrs == (("dim", 1), ("start", 2), ("stop", 5))
    assert all(type(v) is int for _, v in p.nodes[y.id].attrs)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda p, x: p.slice(x, 1, 5, 5), r"^slice: slice \[5:5\] of a dim of size 8 is empty"),
        (lambda p, x: p.slice(x, 1, 6, 2), r"^slice: slice \[6:2\] of a dim of size 8 is empty"),
        (lambda p, x: p.slice(x, 0, 3, 9), r"^slice: slice \[3:9\] of a dim of size 3 is empty"),
        (lambda p, x: p.slice(x, 2, 0, 1), r"^slice: dim 2 out of range"),
        (lambda p, x: p.slice(x, 1, 0.5, 2), r"^slice: 'start' must be an integer, got 0.5"),
        (lambda p, x: p.slice(x, 1, 0, True), r"^slice: 'stop' must be an integer, got True"),
        (lambda p, x: p.slice(x, 1, None, 2), r"^slice: 'start' must be an integer, got None"),
    ],
)
def test_bad_slices_are_one_line_errors(call: object, match: str) -> None:
    p = Program()
    x = p.input("X", (3, 8))
    with pytest.raises(ProgramError, match=match) as info:
        call(x=x, p=p)  # type: ignore[operator]
    assert "\n" not in str(info.value)


def test_gsp_round_trip() -> None:
    text = (
        "program rh\ninput X [2, 8] float32\nA = slice(X, dim=-1, start=-4, stop=99)\nB = slice(X, 1, 0, 4)\n"
    )
    p = parse_program(text + "output A, B\n")
    assert "A = slice(X, dim=1, start=4, stop=8)" in dump_program(p)
    q = parse_program(dump_program(p))
    assert q.key() == p.key() and dump_program(q) == dump_program(p)
    x = np.arange(16.0).reshape(2, 8)
    a, b = q.run(x)
    np.testing.assert_array_equal(a, x[:, 4:])
    np.testing.assert_array_equal(b, x[:, :4])
    with pytest.raises(ProgramError, match="slice: slice"):
        parse_program("input X [2, 8] float32\nA = slice(X, dim=1, start=3, stop=3)\noutput A\n")


# ------------------------------------------------------------------------------------ every arithmetic


@settings(max_examples=25, deadline=None)
@given(
    x=hnp.arrays(
        np.float64,
        st.tuples(st.integers(1, 3), st.integers(2, 9)),
        elements=st.floats(-1e6, 1e6, allow_nan=False, allow_subnormal=False),
    ),
    data=st.data(),
)
def test_slice_is_numpy_slicing(x: np.ndarray, data: st.DataObject) -> None:
    dim = data.draw(st.integers(-2, 1))
    n = x.shape[dim]
    start = data.draw(st.integers(-n - 2, n - 1))
    stop = data.draw(st.integers(-n - 2, n + 2))
    window = np.moveaxis(np.moveaxis(x, dim, 0)[start:stop], 0, dim)
    p = Program()
    t = p.input("X", x.shape, "float32")
    if window.size == 0:
        with pytest.raises(ProgramError):
            p.slice(t, dim, start, stop)
        return
    p.output(p.slice(t, dim, start, stop))
    np.testing.assert_array_equal(p.run(x)[0], window)


def test_verification_tells_windows_apart() -> None:
    p = _rotate_half()
    assert equivalent(p, from_program(p), seed=0).tier == 1
    swapped = Program(name="swapped")  # the halves the other way round: another function
    x = swapped.input("X", (2, 3, 8), "float32")
    rotated = swapped.concat(
        [swapped.slice(x, -1, 0, 4), swapped.scale(swapped.slice(x, -1, 4, 8), -1.0)], -1
    )
    swapped.output(swapped.add(swapped.mul(x, x), rotated))
    assert not equivalent(p, swapped, seed=0)
    g = from_program(p)
    shifted = KernelGraph(  # the first window moved by one: the same shapes, wrong elements
        g.inputs,
        tuple(
            KernelOp(Op.SLICE, o.inputs, (("dim", 2), ("start", 3), ("stop", 7)))
            if isinstance(o, KernelOp) and o.op is Op.SLICE and dict(o.attrs)["start"] == 4
            else o
            for o in g.ops
        ),
        g.outputs,
    )
    assert shifted != g
    assert not equivalent(p, shifted, seed=0)
    exp_form = Program(name="exp")  # exp's law in the second tier: exp(s - s') over a window = exp(s)/exp(s')
    y = exp_form.input("X", (2, 8), "float32")
    exp_form.output(exp_form.exp(exp_form.sub(exp_form.slice(y, 1, 0, 4), exp_form.slice(y, 1, 4, 8))))
    other = Program(name="exp_div")
    z = other.input("X", (2, 8), "float32")
    other.output(other.div(other.exp(other.slice(z, 1, 0, 4)), other.exp(other.slice(z, 1, 4, 8))))
    r = equivalent(exp_form, other, seed=0)
    assert r and r.tier == 2


# ------------------------------------------------------------------------------- kernels and the search


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_llvm_kernel_matches_numpy(dtype: str) -> None:
    p = _rotate_half(dtype, (2, 3, 16))
    x = np.random.default_rng(4).uniform(-30, 30, (2, 3, 16))
    (out,) = run_cpu(from_program(p), load_profile("h100"), x.astype(np.float32))
    tol = 1e-6 if dtype == "float32" else 2e-2
    ref = p.run(x)[0]
    np.testing.assert_allclose(ref, _numpy_rotate_half(x), rtol=1e-12)  # the reference is the numpy slicing
    assert np.max(np.abs(np.asarray(out, np.float64) - ref)) <= tol * np.max(np.abs(ref))


def test_cost_moves_the_window_only() -> None:
    p = Program(name="window")
    x = p.input("X", (64, 256), "float16")
    p.output(p.slice(x, 1, 32, 96))  # a quarter of X, copied
    (cost,) = kernel_costs(from_program(p), load_profile("h100"))
    assert cost.flops == 0 and cost.dram_bytes == 2 * (64 * 64 * 2)  # read the window, write it


def test_fast_mode_runs_on_the_cpu_and_full_mode_keeps_the_direct_ugraph() -> None:
    p = _rotate_half("float32")
    x = np.random.default_rng(5).uniform(-4, 4, (2, 3, 8)).astype(np.float32)
    fast = gensorage.superoptimize(p, hw="h100", mode="fast", progress=False)
    np.testing.assert_allclose(
        fast.run(x, target="cpu")[0], _numpy_rotate_half(x.astype(np.float64)), rtol=1e-5
    )
    full = gensorage.superoptimize(p, hw="h100", mode="full", progress=False, use_store=False)
    assert full.fallback_reason is not None and "does not take slice" in full.fallback_reason
    np.testing.assert_allclose(
        full.run(x, target="cpu")[0], _numpy_rotate_half(x.astype(np.float64)), rtol=1e-5
    )
    with pytest.raises(
        UnsupportedOpError, match="^search spec: program 'rotate_half_float32': the search does"
    ):
        SearchSpec(program=p, hw="h100")


def test_cuda_source_for_sm_90() -> None:
    from gensorage.codegen.cuda_build import cubin_unavailable_reason
    from gensorage.codegen.module import build_cubin, build_cuda

    g = from_program(_rotate_half("bfloat16", (1, 4, 128)))
    hw = load_profile("h100")
    assert "__global__" in build_cuda(g, hw)
    if cubin_unavailable_reason() is not None:
        pytest.skip(cubin_unavailable_reason())
    assert build_cubin(g, hw)

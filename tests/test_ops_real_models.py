"""The ops real models write: max, transpose, add_scalar, and the softmax / RMSNorm composites built from them.

From the builder (shapes, one-line errors) through the ``.gsp`` format, every arithmetic (float64 properties with
drawn magnitudes, the field verifier), the search, and the generated kernels on the CPU (llvm) and for CUDA.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import gensorage
from gensorage.cli import main
from gensorage.codegen.module import run_cpu
from gensorage.dtypes import numpy_dtype
from gensorage.errors import ProgramError
from gensorage.exhaustive.run.runner import run_search
from gensorage.exhaustive.spec import SearchSpec
from gensorage.hw import load_profile
from gensorage.opset import Op, flops, freeze_attrs, infer_shape
from gensorage.program import Program, config_dir, dump_program, parse_program
from gensorage.ugraph import KernelGraph, from_program
from gensorage.ugraph.ir import KernelOp
from gensorage.verify import equivalent


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENSORAGE_HOME", str(tmp_path / "home"))


def _rounded(x: np.ndarray, dtype: str) -> np.ndarray:
    """``x`` as the kernels receive it (rounded to ``dtype``), back in float64: the reference's input."""
    return x.astype(numpy_dtype(dtype)).astype(np.float64)


def _rel(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(out, np.float64) - ref)) / np.max(np.abs(ref)))


# ------------------------------------------------------------------------------------------ shapes, errors


def test_shapes_and_flops() -> None:
    assert infer_shape(Op.MAX, [(3, 5)], (("dim", 1), ("keepdim", False))) == (3,)
    assert infer_shape(Op.MAX, [(3, 5)], (("dim", 0), ("keepdim", True))) == (1, 5)
    assert infer_shape(Op.TRANSPOSE, [(2, 3, 4)], (("dim0", 0), ("dim1", 2))) == (4, 3, 2)
    assert infer_shape(Op.ADD_SCALAR, [(2, 3)], (("value", 1e-6),)) == (2, 3)
    assert flops(Op.MAX, [(3, 5)], (3,)) == 15  # one per element reduced
    assert flops(Op.TRANSPOSE, [(3, 5)], (5, 3)) == 0  # a layout op
    assert flops(Op.ADD_SCALAR, [(3, 5)], (3, 5)) == 15


def test_builder_normalises_and_defaults() -> None:
    p = Program()
    x = p.input("X", (2, 3, 4), "float32")
    assert p.max(x, -1).shape == (2, 3)  # keepdim defaults to False, like torch.amax
    a, b = p.transpose(x, -1, 0), p.transpose(x, 2, 0)
    assert p.nodes[a.id].attrs == p.nodes[b.id].attrs == (("dim0", 2), ("dim1", 0))
    plus, plus_left, minus = p.add(x, 1), p.add(1.5, x), p.sub(x, 2)
    assert p.nodes[plus.id].op is Op.ADD_SCALAR
    assert p.nodes[plus_left.id].attrs == (("value", 1.5),)
    assert p.nodes[minus.id].attrs == (("value", -2.0),)
    assert p.softmax(x, 1).shape == x.shape and p.rms_norm(x).shape == x.shape


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda p, x: p.softmax(x, 2), r"^softmax: dim 2 out of range"),
        (lambda p, x: p.max(x, -3), r"^max: dim -3 out of range"),
        (lambda p, x: p.transpose(x, 0, 2), r"^transpose: dim 2 out of range"),
        (lambda p, x: p.rms_norm(x, eps=-1e-6), r"^rms_norm: eps must be a finite number >= 0"),
        (lambda p, x: p.rms_norm(x, eps=float("inf")), r"^rms_norm: eps"),
        (lambda p, x: p.add(x, float("nan")), r"^add_scalar: the scalar must be a finite number"),
        (lambda p, x: p.sub(x, float("inf")), r"^sub: the scalar must be a finite number"),
        (lambda p, x: p.max(x, 0, keepdim=1), r"^max: keepdim must be true or false"),
    ],
)
def test_bad_input_is_a_one_line_error(build: object, match: str) -> None:
    p = Program()
    x = p.input("X", (4, 8))
    with pytest.raises(ProgramError, match=match) as err:
        build(p, x)  # type: ignore[operator]
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------------------ float64 properties

_LOGITS = hnp.arrays(
    np.float64,
    st.tuples(st.integers(1, 4), st.integers(1, 9)),
    elements=st.floats(-100, 100, allow_nan=False),
)


def _one_op(build: object, shape: tuple[int, ...]) -> Program:
    p = Program()
    x = p.input("X", shape, "float32")
    p.output(build(p, x))  # type: ignore[operator]
    return p


@settings(max_examples=60, deadline=None)
@given(_LOGITS, st.floats(-1000, 1000, allow_nan=False))
def test_softmax_rows_sum_to_one_and_ignore_a_row_constant(x: np.ndarray, shift: float) -> None:
    p = _one_op(lambda p, t: p.softmax(t, -1), x.shape)
    (y,) = p.run(x)
    assert np.all(np.isfinite(y)) and np.all(y >= 0)
    np.testing.assert_allclose(y.sum(axis=-1), 1.0, rtol=1e-12)
    (z,) = p.run(x + shift)
    np.testing.assert_allclose(z, y, rtol=1e-9, atol=1e-300)
    at_max = np.take_along_axis(y, np.argmax(x, axis=-1)[:, None], axis=-1)
    np.testing.assert_array_equal(at_max[:, 0], y.max(axis=-1))  # the largest logit gets the largest weight


@settings(max_examples=60, deadline=None)
@given(_LOGITS, st.integers(0, 1))
def test_max_bounds_every_element(x: np.ndarray, dim: int) -> None:
    (m,) = _one_op(lambda p, t: p.max(t, dim, keepdim=True), x.shape).run(x)
    assert np.all(m >= x) and np.all(np.any(m == x, axis=dim))


@settings(max_examples=40, deadline=None)
@given(
    hnp.arrays(
        np.float64, hnp.array_shapes(min_dims=2, max_dims=4, max_side=4), elements=st.floats(-1e6, 1e6)
    ),
    st.data(),
)
def test_transpose_twice_is_identity(x: np.ndarray, data: st.DataObject) -> None:
    d0, d1 = (data.draw(st.integers(-x.ndim, x.ndim - 1)) for _ in range(2))
    (y,) = _one_op(lambda p, t: p.transpose(p.transpose(t, d0, d1), d1, d0), x.shape).run(x)
    np.testing.assert_array_equal(y, x)
    (z,) = _one_op(lambda p, t: p.transpose(t, d0, d1), x.shape).run(x)
    np.testing.assert_array_equal(z, np.swapaxes(x, d0, d1))


@settings(max_examples=40, deadline=None)
@given(_LOGITS, st.floats(1e-8, 1e-2))
def test_rms_norm_has_unit_mean_square(x: np.ndarray, eps: float) -> None:
    (y,) = _one_op(lambda p, t: p.rms_norm(t, eps), x.shape).run(x)
    ms = np.mean(x * x, axis=-1, keepdims=True)
    np.testing.assert_allclose(y, x / np.sqrt(ms + eps), rtol=1e-12)


# ------------------------------------------------------------------------------------ verification


def _normed(order: str) -> Program:
    """x/sqrt(sum(x·x) + eps) of Xᵀ, transposing first or last (the same function)."""
    p = Program()
    x = p.input("X", (3, 5), "float32")
    if order == "first":
        t = p.transpose(x, 0, 1)
        p.output(p.div(t, p.sqrt(p.add(p.sum(p.mul(t, t), 1), 1e-6))))
    else:
        n = p.div(x, p.sqrt(p.add(p.sum(p.mul(x, x), 0), 1e-6)))
        p.output(p.transpose(n, 1, 0))
    return p


def test_equivalent_handles_add_scalar_and_transpose() -> None:
    assert equivalent(_normed("first"), _normed("last"), seed=0)
    other = Program()
    x = other.input("X", (3, 5), "float32")
    t = other.transpose(x, 0, 1)
    other.output(other.div(t, other.sqrt(other.add(other.sum(other.mul(t, t), 1), 2e-6))))  # another eps
    assert not equivalent(_normed("first"), other, seed=0)
    g = from_program(_normed("first"))
    wrong = KernelGraph(  # the transpose replaced by a reshape to the same shape: a wrong layout
        g.inputs,
        tuple(
            KernelOp(Op.RESHAPE, o.inputs, freeze_attrs({"shape": (5, 3)}))
            if isinstance(o, KernelOp) and o.op is Op.TRANSPOSE
            else o
            for o in g.ops
        ),
        g.outputs,
    )
    assert not equivalent(_normed("first"), wrong, seed=0)


def test_softmax_verifies_in_both_tiers() -> None:
    stable = _one_op(lambda p, t: p.softmax(t, -1), (2, 4))
    assert equivalent(stable, from_program(stable), seed=0).tier == 1  # same form: no exp law needed
    papers = _one_op(lambda p, t: p.div(p.exp(t), p.sum(p.exp(t), dim=-1)), (2, 4))
    # exp(x - m) / Σ exp(x - m) = exp(x) / Σ exp(x) needs exp(a - b) = exp(a) / exp(b): the second tier.
    r = equivalent(stable, papers, seed=0)
    assert r and r.tier == 2
    assert not equivalent(stable, _one_op(lambda p, t: p.softmax(t, 0), (2, 4)), seed=0)


# ------------------------------------------------------------------------------- end to end on the CPU


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_softmax_transpose_add_scalar_fast_mode_on_the_cpu(dtype: str) -> None:
    """Logits up to ±100 through the direct µGraph's kernels (llvm): finite, within 2e-2 of float64."""
    p = Program(name=f"sm_{dtype}")
    x = p.input("X", (4, 128), dtype)
    p.output(p.add(p.transpose(p.softmax(x, -1), 0, 1), 0.5))
    p.output(p.max(x, 0))
    x_in = _rounded(np.random.default_rng(1).uniform(-100, 100, (4, 128)), dtype)
    x_in[:, 7] = 100.0  # a sink logit in every row
    res = gensorage.superoptimize(p, hw="h100", mode="fast", progress=False)
    for out, ref in zip(res.run(x_in, target="cpu"), p.run(x_in), strict=True):
        assert np.all(np.isfinite(np.asarray(out, np.float64)))
        assert _rel(out, ref) < 2e-2


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_rms_norm_fast_mode_on_the_cpu(dtype: str) -> None:
    p = Program(name=f"rms_{dtype}")
    x = p.input("X", (4, 256), dtype)
    p.output(p.rms_norm(x, 1e-6))
    x_in = _rounded(np.random.default_rng(2).uniform(-8, 8, (4, 256)), dtype)
    res = gensorage.superoptimize(p, hw="h100", mode="fast", progress=False)
    (out,) = res.run(x_in, target="cpu")
    assert np.all(np.isfinite(np.asarray(out, np.float64))) and _rel(out, p.run(x_in)[0]) < 2e-2


def test_rms_norm_of_a_massive_activation_in_float16() -> None:
    # Σx² of |x| = 300 overflows float16: the precision policy keeps the squares and their sum in float32.
    p = Program(name="rms_massive")
    x = p.input("X", (2, 256), "float16")
    p.output(p.rms_norm(x, 1e-6))
    x_in = _rounded(np.random.default_rng(3).standard_normal((2, 256)), "float16")
    x_in[:, 5] = 300.0
    (out,) = gensorage.superoptimize(p, hw="h100", mode="fast", progress=False).run(x_in, target="cpu")
    assert _rel(out, p.run(x_in)[0]) < 2e-2


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_bundled_stable_attention_direct_ugraph_survives_a_sink_logit_of_100(dtype: str) -> None:
    # The bundled GQA program (stable softmax, K as [kv heads, keys, dim]) in the given dtype; one key per kv
    # head points along a query of its group, so that query's logit is 100 and the others' are drawn around it.
    text = (config_dir() / "gqa_specdec.gsp").read_text().replace(" float16", f" {dtype}")
    p = parse_program(text, {"kv": 2, "g": 2, "s": 4, "n": 64, "d": 16})
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal(t.shape) * rng.uniform(0.5, 3.0) for t in p.inputs)
    lead = q[::2, 0, :]  # the first query of each kv head's group
    k[:, 9, :] = lead * 100.0 * 4.0 / np.sum(lead * lead, axis=-1, keepdims=True)  # q·k / √16 = 100
    xs = [_rounded(x, dtype) for x in (q, k, v)]
    (out,) = run_cpu(from_program(p), load_profile("h100"), *xs)
    (want,) = p.run(*xs)
    scores = np.einsum("hsd,hnd->hsn", xs[0], np.repeat(xs[1], 2, axis=0)) / 4.0
    assert 90.0 < scores.max() < 110.0  # the sink survived the rounding to the dtype
    assert np.all(np.isfinite(np.asarray(out, np.float64))) and _rel(out, want) < 2e-2


def test_full_mode_fuses_an_add_scalar_and_runs_right() -> None:
    p = Program(name="add_exp")
    x = p.input("X", (4, 16), "float32")
    p.output(p.exp(p.add(p.scale(x, 0.5), 1.0)))
    sr = run_search(
        SearchSpec(program=p, hw="h100", max_kernel_ops=1, max_block_ops=3, max_grid_dims=1),
        checkpoint=None,
        workers=1,
        progress=False,
    )
    assert sr.complete and sr.candidates and len(sr.candidates[0].ugraph.ops) == 1
    x_in = np.random.default_rng(4).uniform(-4, 4, (4, 16))
    out = run_cpu(sr.candidates[0].ugraph, load_profile("h100"), x_in)
    np.testing.assert_allclose(out[0], p.run(x_in)[0], rtol=1e-5)


@pytest.mark.parametrize("what", ["transpose", "max"])
def test_full_mode_with_transpose_and_max_runs_right(what: str) -> None:
    """A search over them finishes without error; max's candidates cannot be verified yet (no field semantics),
    so full mode answers with the direct µGraph, which is right."""
    p = Program(name=f"full_{what}")
    x, w = p.input("X", (4, 8), "float32"), p.input("W", (4, 8), "float32")
    y = (
        p.matmul(p.transpose(x, 0, 1), w)
        if what == "transpose"
        else p.exp(p.sub(x, p.max(x, 1, keepdim=True)))
    )
    p.output(y)
    res = gensorage.superoptimize(p, hw="h100", mode="full", preset="default", progress=False)
    ins = [np.random.default_rng(5).uniform(-30, 30, t.shape) for t in p.inputs]
    out = res.run(*ins[: len(p.inputs)], target="cpu")
    np.testing.assert_allclose(out[0], p.run(*ins)[0], rtol=1e-4, atol=1e-5)


def test_cuda_source_compiles_for_sm_90() -> None:
    from gensorage.codegen.cuda_build import cubin_unavailable_reason
    from gensorage.codegen.module import build_cubin, build_cuda

    p = Program(name="cuda_ops")
    x = p.input("X", (4, 128), "bfloat16")
    p.output(p.add(p.transpose(p.softmax(x, -1), 0, 1), 1e-6))
    p.output(p.max(x, 0))
    hw = load_profile("h100")
    src = build_cuda(from_program(p), hw)
    assert "__global__" in src and "max" in src
    if cubin_unavailable_reason() is not None:
        pytest.skip(cubin_unavailable_reason())
    assert build_cubin(from_program(p), hw)


# ------------------------------------------------------------------------------------- .gsp and the CLI

GSP = """program real_ops
param t = 4
param h = 64
input X [t, h] float32
P = softmax(X, dim=-1)
M = max(X, dim=1, keepdim=true)
T = transpose(P, 0, 1)
N = rms_norm(X, eps=1e-5)
O = add(T, 1e-6)
output O, M, N
"""


def test_gsp_round_trip_keeps_the_key() -> None:
    p = parse_program(GSP)
    q = parse_program(dump_program(p))
    assert q.key() == p.key() and q.structure_key() == p.structure_key()
    x = np.random.default_rng(6).uniform(-50, 50, (4, 64))
    for a, b in zip(p.run(x), q.run(x), strict=True):
        np.testing.assert_array_equal(a, b)


def test_cli_runs_a_gsp_file_using_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "real_ops.gsp"
    path.write_text(GSP)
    code = main(["superopt", str(path), "--mode", "fast", "--no-store", "--quiet"])
    out = capsys.readouterr()
    assert code in (0, 1) and "kernel(s)" in out.out, out.err


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("Y = softmax(X, dim=3)", "softmax: dim 3 out of range"),
        ("Y = rms_norm(X, eps=-1)", "rms_norm: eps must be a finite number >= 0"),
        ("Y = max(X, 1, keepdim=1)", "max: 'keepdim' must be true or false"),
        ("Y = add(X, 1e999)", "beyond the range of floats"),
        ("Y = transpose(X, 0, 5)", "transpose: dim 5 out of range"),
    ],
)
def test_cli_bad_file_is_one_line_nonzero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, match: str
) -> None:
    bad = tmp_path / "bad.gsp"
    bad.write_text(f"input X [4, 8] float32\n{line}\noutput Y\n")
    code = main(["superopt", str(bad), "--mode", "fast", "--no-store"])
    err = capsys.readouterr().err.strip()
    assert code != 0 and err.startswith("gensorage: error:") and match in err and "\n" not in err

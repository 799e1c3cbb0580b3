"""The ``tanh``, ``log`` and ``clamp`` ops: builder and ``.gsp`` text, the float64 interpreter, verification as
uninterpreted functions (a clamp is one function per pair of bounds), the search's view of them, and the llvm
kernels (element-wise and as a GEMM's epilogue) against float64 at drawn magnitudes and specials; the CUDA text
compiles where nvcc can build it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gensorage
from gensorage.codegen.cuda_build import cubin_unavailable_reason, ptx_and_resources
from gensorage.codegen.field_twin import check_field_twin
from gensorage.codegen.module import compile_ugraph
from gensorage.codegen.scalar import FieldScalar, Val
from gensorage.codegen.tir_text import Writer
from gensorage.errors import ConfigError, NotLaxError, ProgramError
from gensorage.exhaustive.expr import abstract_expr as ae
from gensorage.exhaustive.expr.expr_arith import EXPR, ExprValue
from gensorage.exhaustive.opcatalog import catalog, shape_free_term
from gensorage.hw import load_profile
from gensorage.opset import Op, apply, freeze_attrs
from gensorage.program import Program, dump_program, parse_program
from gensorage.ugraph import from_program
from gensorage.ugraph.optimize.fuse_epilogues import fuse_epilogues, has_epilogue
from gensorage.verify.equivalent import equivalent
from gensorage.verify.field import FieldArith
from gensorage.verify.uninterpreted import UninterpretedArith

HW = load_profile("h100")
SPECIAL = [0.0, -0.0, math.inf, -math.inf, math.nan]
#: Relative error of a kernel's result against float64 of its (rounded) input: a few roundings of the dtype.
REL = {"float32": 1e-6, "float16": 1e-3, "bfloat16": 8e-3}


def _unary_program(dtype: str = "float32", n: int = 48) -> Program:
    p = Program("unary")
    x = p.input("x", [n], dtype)
    p.output(p.tanh(x))
    p.output(p.log(x))
    p.output(p.clamp(x, min=-0.5, max=2.0))
    p.output(p.clamp(x, max=-1e-3))
    return p


def _drawn(values: list[float], magnitude: float, specials: list[tuple[int, float]]) -> np.ndarray:
    x = np.array(values, dtype=np.float64) * 10.0**magnitude
    for i, v in specials:
        x[i] = v
    return x


# ------------------------------------------------------------------------------------------ builder, text, interpreter


def test_interpreter_matches_numpy_with_torch_specials() -> None:
    x = np.array([0.0, -0.0, 1e-6, -1e-4, 0.3, -2.0, 50.0, math.inf, -math.inf, math.nan] * 4 + [1.0] * 8)
    with np.errstate(all="ignore"):
        tanh, log, clamped, upper = _unary_program().run(x)
        assert np.array_equal(tanh, np.tanh(x), equal_nan=True)
        assert np.array_equal(log, np.log(x), equal_nan=True)
    assert np.signbit(tanh[1]) and log[0] == -math.inf and log[1] == -math.inf and np.isnan(log[5])
    want = np.where(np.isnan(x), np.nan, np.minimum(np.maximum(x, -0.5), 2.0))
    assert np.array_equal(clamped, want, equal_nan=True)
    assert np.isnan(upper[9]) and upper[7] == -1e-3 and upper[8] == -math.inf


def test_text_round_trip_and_positional_bounds() -> None:
    p = _unary_program()
    text = dump_program(p)
    assert "clamp(x, max=2.0, min=-0.5)" in text and "clamp(x, max=-0.001)" in text
    assert parse_program(text).key() == p.key()
    q = parse_program("input x [4] float32\ny = clamp(tanh(x), -1, 0.5)\nz = log(y)\noutput z")
    assert [(n.op, dict(n.attrs)) for n in q.nodes[1:]] == [
        (Op.TANH, {}),
        (Op.CLAMP, {"min": -1.0, "max": 0.5}),
        (Op.LOG, {}),
    ]


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        ("clamp(x, 2, 1)", ProgramError, "'min' 2.0 is greater than 'max' 1.0"),
        ("clamp(x)", ProgramError, "needs 'min', 'max' or both"),
        ("clamp(x, min=true)", ConfigError, "boolean"),
        ("clamp(x, min=x)", ConfigError, "tensor"),
        ("clamp(x, lo=1)", ProgramError, "unknown argument"),
        ("tanh(x, 1)", ConfigError, "too many arguments"),
    ],
)
def test_bad_clamps_are_one_line_errors(call: str, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message) as info:
        parse_program(f"input x [4] float32\ny = {call}\noutput y")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("bounds", [{"min": "0"}, {"max": math.nan}, {"min": math.inf}, {"max": True}])
def test_builder_refuses_non_numeric_or_non_finite_bounds(bounds: dict[str, object]) -> None:
    p = Program()
    x = p.input("x", [4], "float32")
    with pytest.raises(ProgramError, match="clamp: '(min|max)' must be a finite number"):
        p.clamp(x, **bounds)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ verification


def _pair(build_a: object, build_b: object, shapes: list[list[int]]) -> tuple[Program, Program]:
    out = []
    for build in (build_a, build_b):
        p = Program()
        xs = [p.input(f"x{i}", s, "float32") for i, s in enumerate(shapes)]
        p.output(build(p, *xs))  # type: ignore[operator]
        out.append(p)
    return out[0], out[1]


EQUAL = {
    "clamp of a reordered sum": (
        lambda p, x, w, b: p.clamp(p.add(p.matmul(x, w), b), min=0.0, max=6.0),
        lambda p, x, w, b: p.clamp(p.add(b, p.matmul(x, w)), min=0.0, max=6.0),
    ),
    "tanh times log, commuted": (
        lambda p, x, w, b: p.mul(p.tanh(p.matmul(x, w)), p.log(b)),
        lambda p, x, w, b: p.mul(p.log(b), p.tanh(p.matmul(x, w))),
    ),
    "log_softmax split at the sum": (
        lambda p, x, w, b: _log_softmax(p, p.matmul(x, w)),
        lambda p, x, w, b: _log_softmax(p, p.matmul(x, w), split=True),
    ),
}
DIFFERENT = {
    "other clamp bounds": (
        lambda p, x, w, b: p.clamp(p.matmul(x, w), min=0.0, max=6.0),
        lambda p, x, w, b: p.clamp(p.matmul(x, w), min=0.0, max=5.0),
    ),
    "clamp's bound dropped": (
        lambda p, x, w, b: p.clamp(p.matmul(x, w), min=0.0, max=6.0),
        lambda p, x, w, b: p.clamp(p.matmul(x, w), min=0.0),
    ),
    "clamp as relu": (
        lambda p, x, w, b: p.clamp(p.matmul(x, w), min=0.0),
        lambda p, x, w, b: p.relu(p.matmul(x, w)),
    ),
    "clamp moved past a matmul": (
        lambda p, x, w, b: p.matmul(p.clamp(x, min=-1.0, max=1.0), w),
        lambda p, x, w, b: p.clamp(p.matmul(x, w), min=-1.0, max=1.0),
    ),
    "log of a product": (
        lambda p, x, w, b: p.log(p.mul(p.matmul(x, w), b)),
        lambda p, x, w, b: p.add(p.log(p.matmul(x, w)), p.log(b)),
    ),
    "tanh for a scaled sigmoid": (
        lambda p, x, w, b: p.tanh(p.matmul(x, w)),
        lambda p, x, w, b: p.sub(p.scale(p.silu(p.matmul(x, w)), 2.0), 1.0),
    ),
}
SHAPES = [[4, 8], [8, 6], [4, 6]]


def _log_softmax(p: Program, x: gensorage.program.Tensor, split: bool = False) -> gensorage.program.Tensor:
    s = p.sub(x, p.max(x, -1, keepdim=True))
    e = p.exp(s)
    total = (
        p.sum(p.sum(e, -1, keepdim=True, group=3), -1, keepdim=True) if split else p.sum(e, -1, keepdim=True)
    )
    return p.sub(s, p.log(total))


@pytest.mark.parametrize("name", sorted(EQUAL))
def test_reordered_programs_verify_equal(name: str) -> None:
    a, b = _pair(*EQUAL[name], SHAPES)
    assert equivalent(a, b, seed=1)


@pytest.mark.parametrize("name", sorted(DIFFERENT))
def test_wrong_rewrites_are_rejected(name: str) -> None:
    a, b = _pair(*DIFFERENT[name], SHAPES)
    assert not equivalent(a, b, seed=1)


def test_clamps_are_keyed_per_bound_pair_in_both_fields() -> None:
    """Equal bounds give one function on both sides (same keys), other bounds another, in both tiers; the field
    twin's kernels have no key for a clamp and refuse it in one line."""
    rng = np.random.default_rng(3)
    uf = UninterpretedArith(4, rng)
    x = uf.random_input((5,))
    again = UninterpretedArith(4, np.random.default_rng(8), keys=uf.keys)
    assert uf.equal(uf.clamp(x, 0.0, 1.0), again.clamp(x, 0.0, 1.0)).all()
    assert not uf.equal(uf.clamp(x, 0.0, 1.0), uf.clamp(x, 0.0, 2.0)).any()
    assert not uf.equal(uf.clamp(x, None, 1.0), uf.activation("tanh", x)).any()
    fa = FieldArith(4, rng)
    y = fa.random_input((5,))
    assert fa.equal(fa.clamp(y, -1.0, None), FieldArith(4, rng, keys=fa.keys).clamp(y, -1.0, None)).all()
    assert not fa.equal(fa.clamp(y, -1.0, None), fa.clamp(y, -2.0, None)).any()
    assert not fa.equal(fa.activation("log", y), fa.activation("tanh", y)).any()

    with pytest.raises(NotLaxError, match="clamp has no finite-field kernel"):
        FieldScalar(fa.p, fa.q).op(Writer(), Op.CLAMP, freeze_attrs({"min": 0.0}), [Val(("a", "b"), "int64")])


# ------------------------------------------------------------------------------------------ search


def test_search_sees_each_clamp_as_its_own_function_and_drops_the_bounds_in_expressions() -> None:
    p = Program()
    x = p.input("x", [4, 8], "float32")
    y = p.clamp(p.tanh(x), min=0.0, max=0.5)
    p.output(p.add(p.log(p.clamp(x, min=0.25)), y))
    variants = catalog(p)
    clamps = [dict(v.attrs) for v in variants if v.op is Op.CLAMP]
    assert clamps == [{"max": 0.5, "min": 0.0}, {"min": 0.25}]
    assert {v.op for v in variants} >= {Op.TANH, Op.LOG, Op.CLAMP}
    t = ae.var("x")
    for op in (Op.TANH, Op.LOG, Op.CLAMP):
        want = apply(op, EXPR, [ExprValue((4, 8), t)], freeze_attrs({"min": 1.0} if op is Op.CLAMP else {}))
        assert shape_free_term(op, [t]) is want.term is ae.fn(op.value, t)


def test_fast_mode_runs_a_program_holding_them() -> None:
    p = Program("fast")
    x = p.input("x", [8, 16], "float16")
    w = p.input("w", [16, 8], "float16")
    h = p.matmul(x, w)
    p.output(p.add(p.tanh(h), p.log(p.clamp(h, min=0.125, max=4.0))))
    res = gensorage.superoptimize(p, hw="h100", mode="fast", use_store=False, progress=False)
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal(t.shape).astype(np.float16) for t in p.inputs]
    (got,) = res.run(*xs, target="cpu")
    (want,) = p.run(*xs)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=4e-3, atol=4e-3)


def test_full_mode_fuses_them_into_one_verified_kernel() -> None:
    """The search takes the new ops (catalog from the program): tanh, clamp and log after a matmul become one
    graph-defined kernel (four direct ones), verified in the first tier, right on the llvm build."""
    p = Program("full")
    x = p.input("x", [8, 16], "float16")
    w = p.input("w", [16, 8], "float16")
    p.output(p.log(p.clamp(p.tanh(p.matmul(x, w)), min=0.125)))
    res = gensorage.superoptimize(
        p, hw="h100", mode="full", time_budget_s=120, use_store=False, progress=False
    )
    assert len(res.best.ops) == 1 and res.equivalence
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal(t.shape).astype(np.float16) for t in p.inputs]
    (got,) = res.run(*xs, target="cpu")
    np.testing.assert_allclose(got.astype(np.float64), p.run(*xs)[0], rtol=4e-3, atol=4e-3)


# ------------------------------------------------------------------------------------------ kernels


def _check(got: np.ndarray, want: np.ndarray, dtype: str) -> None:
    got = got.astype(np.float64)
    assert np.array_equal(np.isnan(got), np.isnan(want)), (got, want)
    inf = np.isinf(want)
    assert np.array_equal(got[inf], want[inf]) and not np.isinf(got[~inf]).any(), (got, want)
    fin = np.isfinite(want)
    # values below the dtype's normal range are compared absolutely (their relative spacing is coarser)
    tiny = {"float32": 1.2e-38, "float16": 6.1e-5, "bfloat16": 1.2e-38}[dtype]
    err = np.abs(got[fin] - want[fin])
    assert (err <= REL[dtype] * np.maximum(np.abs(want[fin]), tiny)).all(), (got, want)
    zero = want == 0
    assert np.array_equal(np.signbit(got[zero]), np.signbit(want[zero])), (got, want)


@pytest.fixture(scope="module")
def unary_kernels() -> dict[str, object]:
    return {dt: compile_ugraph(from_program(_unary_program(dt)), HW, "llvm") for dt in REL}


@pytest.mark.parametrize("dtype", sorted(REL))
@settings(max_examples=25, deadline=None)
@given(
    values=st.lists(st.floats(min_value=-1.0, max_value=1.0), min_size=48, max_size=48),
    magnitude=st.floats(min_value=-6.0, max_value=3.0),
    specials=st.lists(st.tuples(st.integers(0, 47), st.sampled_from(SPECIAL)), max_size=6),
)
def test_llvm_kernels_match_float64(
    unary_kernels: dict[str, object],
    dtype: str,
    values: list[float],
    magnitude: float,
    specials: list[tuple[int, float]],
) -> None:
    """tanh (correctly rounded near 0, odd: tanh(−0) = −0), log (NaN below 0, −inf at ±0) and clamp (NaN kept,
    exact) against float64 of the rounded inputs, at magnitudes 1e-6 to 1e3 with 0, −0, ±inf and NaN."""
    from gensorage.dtypes import numpy_dtype

    x = _drawn(values, magnitude, specials).astype(numpy_dtype(dtype))
    got = unary_kernels[dtype].run(x)  # type: ignore[attr-defined]
    with np.errstate(all="ignore"):
        want = _unary_program(dtype).run(x.astype(np.float64))
    for name, g, w in zip(("tanh", "log", "clamp", "clamp_max"), got, want, strict=True):
        assert g.dtype == x.dtype, name
        # what the dtype holds of the float64 value: the kernel rounds once on store
        _check(g, w.astype(x.dtype).astype(np.float64) if dtype != "float32" else w, dtype)


def test_tanh_near_zero_is_accurate_in_float32(unary_kernels: dict[str, object]) -> None:
    """TIR's own tanh on llvm cancels near 0 (1.4e-2 relative at 1e-5); the emitted form is within 1e-7."""
    x = np.geomspace(1e-30, 20.0, 48).astype(np.float32) * np.where(np.arange(48) % 2, -1, 1).astype(
        np.float32
    )
    got = unary_kernels["float32"].run(x)[0].astype(np.float64)  # type: ignore[attr-defined]
    want = np.tanh(x.astype(np.float64))
    assert float(np.max(np.abs(got - want) / np.abs(want))) <= 1e-7


def _mlp(dtype: str) -> Program:
    p = Program("act")
    x = p.input("x", [32, 64], dtype)
    w = p.input("w", [64, 64], dtype)
    # one chain (an epilogue folds a product read once): log is -inf where tanh is clamped to 0
    p.output(p.log(p.clamp(p.tanh(p.matmul(x, w)), min=0.0, max=0.5)))
    return p


@pytest.mark.parametrize("fused", [True, False], ids=["epilogue", "own-kernel"])
def test_gemm_epilogue_and_own_kernels_match_float64_and_build_for_cuda(fused: bool) -> None:
    program = _mlp("float32")
    g = from_program(program)
    g = fuse_epilogues(g) if fused else g
    compiled = compile_ugraph(g, HW, "llvm", seed=0)
    assert any(has_epilogue(op) for op in compiled.ugraph.ops) == fused
    rng = np.random.default_rng(11)
    xs = [rng.standard_normal(t.shape).astype(np.float32) * 0.3 for t in program.inputs]
    xs[0][2, 7] = np.nan
    got = compiled.run(*xs, target="cpu")
    with np.errstate(all="ignore"):
        want = program.run(*xs)
    for g_, w in zip(got, want, strict=True):
        assert np.array_equal(np.isnan(g_), np.isnan(w)) and np.array_equal(np.isinf(g_), np.isinf(w))
        # compared after exp: log turns the product's float32 rounding near 0 into a large absolute error
        fin = np.isfinite(w)
        np.testing.assert_allclose(np.exp(g_[fin]), np.exp(w[fin]), rtol=1e-5, atol=1e-6)
    if cubin_unavailable_reason() is None:
        src = compile_ugraph(g, HW, "cuda", seed=0).cuda_source()
        assert ptx_and_resources(src, "sm_90a") is not None


def test_field_twin_of_tanh_and_log_kernels_agrees_and_a_clamp_is_refused() -> None:
    """The generated kernels in field mode hash tanh and log with the keys of :class:`FieldArith` (the kernel's
    parameter buffer holds one per named activation); a clamp has no key there and is refused in one line."""
    p = Program("twin")
    x = p.input("x", [8, 16], "float32")
    w = p.input("w", [16, 8], "float32")
    p.output(p.mul(p.tanh(p.matmul(x, w)), p.log(p.matmul(x, w))))
    assert check_field_twin(from_program(p), p, trials=1, seed=3, hw=HW)
    q = Program("twin_clamp")
    y = q.input("y", [8, 16], "float32")
    q.output(q.clamp(y, max=1.0))
    with pytest.raises(NotLaxError, match="clamp"):
        check_field_twin(from_program(q), q, trials=1, seed=3, hw=HW)

"""The .gsp text form: grammar, parameters, round trip, and one-line located errors."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gensorage.errors import ConfigError, GensorageError, ProgramError, UnsupportedOpError
from gensorage.opset import Op
from gensorage.program import Program, dump_program, load_program, parse_program

RMSNORM = """\
# comment
program rmsnorm_matmul
param b = 16            # named integer parameters
param d = 4096
input X [b, d] float16
input G [d]
input W [d, d/8]
S = sum(mul(X, X), dim=1)             # nested calls allowed
R = sqrt(scale(S, 1/d))               # scalar multiply
Y = div(mul(X, G), R)
O = matmul(Y, W)
output O
"""


def test_parse_example_with_overrides() -> None:
    p = parse_program(RMSNORM, params={"b": 2, "d": 16})
    assert p.name == "rmsnorm_matmul"
    assert p.params == {"b": 2, "d": 16}
    assert [(t.name, t.shape, t.dtype) for t in p.inputs] == [
        ("X", (2, 16), "float16"),
        ("G", (16,), "float16"),
        ("W", (16, 2), "float16"),
    ]
    assert [t.shape for t in p.outputs] == [(2, 2)]
    scale = next(n for n in p.nodes if n.op is Op.SCALE)
    assert dict(scale.attrs)["factor"] == 1 / 16
    rng = np.random.default_rng(0)
    x, g, w = rng.standard_normal((2, 16)), rng.standard_normal(16), rng.standard_normal((16, 2))
    expected = (x * g / np.sqrt((x * x).sum(axis=1, keepdims=True) / 16)) @ w
    np.testing.assert_allclose(p.run(x, g, w)[0], expected, rtol=1e-12)


def test_default_params_and_shapes() -> None:
    p = parse_program(RMSNORM)
    assert p.params == {"b": 16, "d": 4096}
    assert p.outputs[0].shape == (16, 512)


def test_derived_params_follow_overrides() -> None:
    text = "param h = 8\nparam g = h/2\ninput X [g, h]\nY = exp(X)\noutput Y\n"
    assert parse_program(text).inputs[0].shape == (4, 8)
    assert parse_program(text, {"h": 4}).inputs[0].shape == (2, 4)
    assert parse_program(text, {"g": 3}).inputs[0].shape == (3, 8)


def test_infix_operators_and_numbers() -> None:
    text = """
    input A [2, 3] float32
    input B [3]    float32
    C = (A + B) * A - A / B
    D = -A * 2 / 4
    E = mul(0.5, A)
    F = div(A, 4)
    output C, D, E, F
    """
    p = parse_program(text)
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((2, 3)), rng.standard_normal(3) + 4
    c, d, e, f = p.run(a, b)
    np.testing.assert_allclose(c, (a + b) * a - a / b)
    np.testing.assert_allclose(d, -a * 2 / 4)
    np.testing.assert_allclose(e, a * 0.5)
    np.testing.assert_allclose(f, a / 4)
    assert all(t.dtype == "float32" for t in p.outputs)
    assert [n.op for n in p.nodes if n.name in ("E", "F")] == [Op.SCALE, Op.SCALE]


def test_positional_and_keyword_attributes() -> None:
    text = """
    param n = 4
    input X [2, n*2]
    A = sum(X, 1, false)
    B = sum(X, dim=1, group=n)
    C = repeat(X, 0, 3)
    D = reshape(X, [n*2, 2])
    E = reshape(X, shape=[4, 4])
    F = concat(X, X, dim=0)
    G = concat([X, X, X], 1)
    H = scale(X, factor=-1e-05)
    output A, B, C, D, E, F, G, H
    """
    p = parse_program(text)
    assert [t.shape for t in p.outputs] == [(2,), (2, 2), (6, 8), (8, 2), (4, 4), (4, 8), (2, 24), (2, 8)]
    h = p.nodes[p.tensor("H").id]
    assert dict(h.attrs)["factor"] == -1e-05


def test_statement_may_span_lines_inside_brackets() -> None:
    text = "input X [2,\n   3]\nY = add(X,\n        X)   # comment\n\noutput Y"
    p = parse_program(text)
    assert p.outputs[0].shape == (2, 3)


def test_nested_names_avoid_later_statement_names() -> None:
    # The nested mul gets a generated name; it must not take 't3', which a later statement claims.
    text = "input X [2]\nY = exp(mul(X, X))\nt3 = relu(Y)\nt2 = relu(t3)\noutput t2"
    p = parse_program(text)
    assert [t.name for t in p.outputs] == ["t2"]
    assert len({n.name for n in p.nodes}) == len(p.nodes)


def test_load_program_uses_file_stem(tmp_path: Path) -> None:
    f = tmp_path / "my_prog.gsp"
    f.write_text("input X [2]\nY = exp(X)\noutput Y\n")
    assert load_program(f).name == "my_prog"
    with pytest.raises(ConfigError, match="cannot read"):
        load_program(tmp_path / "missing.gsp")


# ------------------------------------------------------------------ errors carry file:line


@pytest.mark.parametrize(
    ("text", "error", "pattern"),
    [
        (
            "input X [2]\nY = layer_norm(X)\noutput Y",
            UnsupportedOpError,
            r"^f\.gsp:2: unsupported op 'layer_norm' \(known ops: matmul",
        ),
        (
            "param d = 6\ninput X [d/4]\noutput X",
            ConfigError,
            r"^f\.gsp:2: dimension d/4 of input 'X' must be an integer, got 3/2",
        ),
        ("input X [2, 0]\noutput X", ConfigError, r"^f\.gsp:1: .*must be positive"),
        ("input X [2, q]\noutput X", ConfigError, r"^f\.gsp:1: undefined name 'q'"),
        ("input X [2]\n\nY = exp(Z)\noutput Y", ConfigError, r"^f\.gsp:3: undefined name 'Z'"),
        ("input X [2]\nY = exp(X)\noutput Z", ConfigError, r"^f\.gsp:3: output: undefined tensor 'Z'"),
        ("input X [2]\nX = exp(X)\noutput X", ConfigError, r"^f\.gsp:2: duplicate name 'X'"),
        ("param X = 2\ninput X [2]\noutput X", ConfigError, r"^f\.gsp:2: duplicate name 'X'"),
        ("input X [2]\nY = exp(X)\n", ConfigError, r"^f\.gsp:\d+: program has no 'output' statement"),
        ("input X [2]\nY = exp(X) $\noutput Y", ConfigError, r"^f\.gsp:2: unexpected character '\$'"),
        ("input X [2]\nY = = exp(X)\noutput Y", ConfigError, r"^f\.gsp:2: expected a value"),
        ("input X [2]\nY exp(X)\noutput Y", ConfigError, r"^f\.gsp:2: expected '='"),
        ("input X [2]\nY = exp(X\noutput Y", ConfigError, r"^f\.gsp:\d+: expected ',' or '\)'"),
        ("input X [2] float8\noutput X", ConfigError, r"^f\.gsp:1: input 'X': unknown dtype 'float8'"),
        (
            "input X [2, 3]\nY = matmul(X, X)\noutput Y",
            ProgramError,
            r"^f\.gsp:2: matmul: inner dims differ.*\[2, 3\], \[2, 3\]",
        ),
        (
            "input X [2] float16\ninput Z [2] float32\nY = add(X, Z)\noutput Y",
            ProgramError,
            r"^f\.gsp:3: add: inputs mix dtypes",
        ),
        (
            "input X [2]\nY = 1 / X\noutput Y",
            ConfigError,
            r"^f\.gsp:2: .*a number cannot be divided by a tensor",
        ),
        ("input X [2]\nY = X\noutput Y", ConfigError, r"^f\.gsp:2: .*aliases are not supported"),
        ("param n = 2\nY = n * 3\noutput Y", ConfigError, r"^f\.gsp:2: 'Y' must be a tensor computation"),
        (
            "input X [2]\nY = sum(X, dim=true)\noutput Y",
            ConfigError,
            r"^f\.gsp:2: sum: 'dim' must be an integer",
        ),
        (
            "input X [2]\nY = sum(X, keepdim=1, dim=0)\noutput Y",
            ConfigError,
            r"^f\.gsp:2: sum: 'keepdim' must be true or false",
        ),
        ("input X [2]\nY = exp(X, 3)\noutput Y", ConfigError, r"^f\.gsp:2: exp: too many arguments"),
        (
            "input X [2]\nY = repeat(X, dim=0, times=2, dim=0)\noutput Y",
            ConfigError,
            r"^f\.gsp:2: repeat: argument 'dim' given twice",
        ),
        ("input X [2]\nY = repeat(X, dim=0)\noutput Y", ProgramError, r"^f\.gsp:2: repeat: missing argument"),
        ("input X [4/0]\noutput X", ConfigError, r"^f\.gsp:1: division by zero"),
        ("input input [2]\noutput input", ConfigError, r"^f\.gsp:1: 'input' is a keyword"),
        (
            "input X [2]\nprogram late\nY = exp(X)\noutput Y",
            ConfigError,
            r"^f\.gsp:2: 'program' must be the first",
        ),
        (
            "param p = 1.5\ninput X [2]\noutput X",
            ConfigError,
            r"^f\.gsp:1: parameter 'p' must be an integer, got 3/2",
        ),
        ("hello world\n", ConfigError, r"^f\.gsp:1: expected '=' after 'hello'"),
        ("input X []\noutput X", ConfigError, r"^f\.gsp:1: input 'X' needs at least one dimension"),
        ("42\n", ConfigError, r"^f\.gsp:1: expected a statement"),
    ],
)
def test_parse_errors_are_located(text: str, error: type[GensorageError], pattern: str) -> None:
    with pytest.raises(error, match=pattern) as info:
        parse_program(text, source="f.gsp")
    assert type(info.value) is error
    assert "\n" not in str(info.value)


def test_unknown_override_is_rejected() -> None:
    with pytest.raises(ConfigError, match=r"unknown parameter\(s\) zz \(known: b, d\)"):
        parse_program(RMSNORM, params={"zz": 1}, source="f.gsp")


def test_errors_report_the_file_path(tmp_path: Path) -> None:
    f = tmp_path / "bad.gsp"
    f.write_text("input X [2]\n\n\nY = nope(X)\noutput Y\n")
    with pytest.raises(UnsupportedOpError, match=rf"^{f}:4: unsupported op 'nope'"):
        load_program(f)


# ------------------------------------------------------------------ round trip


def test_dump_renames_non_identifier_and_keyword_names() -> None:
    p = Program("has spaces")
    a = p.input("my input", (2,))
    b = p.input("t0", (2,))
    p.output(p.add(a, b, name="output"))
    text = dump_program(p)
    q = parse_program(text)
    assert q.key() == p.key()
    assert len({n.name for n in q.nodes}) == 3
    np.testing.assert_array_equal(q.run(np.ones(2), np.ones(2))[0], [2.0, 2.0])


_DTYPES = st.sampled_from(["float16", "bfloat16", "float32", "float64"])
_SHAPES = st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple)
_NAMES = st.one_of(st.none(), st.sampled_from(["x", "y z", "input", "t5", "out_1", "ä"]))


@st.composite
def programs(draw: st.DrawFn) -> Program:
    """Random small well-formed programs: every op of the op set may appear, with random attributes."""
    p = Program(draw(st.sampled_from(["rand", "r 2"])))
    dtype = draw(_DTYPES)
    pool = [p.input(f"in{i}", draw(_SHAPES), dtype) for i in range(draw(st.integers(1, 3)))]
    for _ in range(draw(st.integers(1, 8))):
        op = draw(st.sampled_from(list(Op)))
        pick = st.sampled_from(pool)
        name = draw(_NAMES)
        if name is not None and name in {n.name for n in p.nodes}:
            name = None
        x = draw(pick)
        if x.ndim == 0 and op in (Op.SUM, Op.MAX, Op.TRANSPOSE, Op.SLICE, Op.RESHAPE, Op.REPEAT, Op.CONCAT):
            continue  # a fully reduced scalar has no dim to pick
        try:
            if op in (Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MATMUL):
                t = getattr(p, op.value)(x, draw(pick), name=name)
            elif op is Op.SCALE:
                t = p.scale(x, draw(st.floats(-4, 4, allow_nan=False)), name=name)
            elif op is Op.ADD_SCALAR:
                t = p.add(x, draw(st.floats(-1e6, 1e6, allow_nan=False)), name=name)
            elif op is Op.MAX:
                dim = draw(st.integers(-x.ndim, x.ndim - 1))
                t = p.max(x, dim, keepdim=draw(st.booleans()), name=name)
            elif op is Op.TRANSPOSE:
                dims = st.integers(-x.ndim, x.ndim - 1)
                t = p.transpose(x, draw(dims), draw(dims), name=name)
            elif op is Op.SLICE:
                bounds = st.integers(-6, 6)
                t = p.slice(x, draw(st.integers(-x.ndim, x.ndim - 1)), draw(bounds), draw(bounds), name=name)
            elif op is Op.SUM:
                dim = draw(st.integers(-x.ndim, x.ndim - 1))
                group = draw(st.one_of(st.none(), st.integers(1, 4)))
                t = p.sum(x, dim, keepdim=draw(st.booleans()), group=group, name=name)
            elif op is Op.RESHAPE:
                t = p.reshape(x, draw(st.permutations(x.shape)), name=name)
            elif op is Op.REPEAT:
                t = p.repeat(x, draw(st.integers(0, x.ndim - 1)), draw(st.integers(1, 3)), name=name)
            elif op is Op.CONCAT:
                t = p.concat([x, draw(pick)], draw(st.integers(0, x.ndim - 1)), name=name)
            else:
                t = getattr(p, op.value)(x, name=name)
        except ProgramError:
            continue  # an ill-shaped draw: the builder refused it, which is its job
        pool.append(t)
    outs = draw(st.lists(st.sampled_from(pool[-3:]), min_size=1, max_size=2, unique_by=lambda t: t.id))
    for t in outs:
        p.output(t)
    return p


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.integers(0, 2**32 - 1))
def test_round_trip_keeps_key_and_outputs(p: Program, seed: int) -> None:
    text = dump_program(p)
    q = parse_program(text)
    assert q.key() == p.key()
    assert q.structure_key() == p.structure_key()
    assert [(n.op, n.inputs, n.attrs, n.shape, n.dtype) for n in q.nodes] == [
        (n.op, n.inputs, n.attrs, n.shape, n.dtype) for n in p.nodes
    ]
    assert dump_program(q) == text  # the dump is a fixed point
    inputs = p.random_inputs(seed)
    for a, b in zip(p.run(*inputs), q.run(*inputs), strict=True):
        np.testing.assert_array_equal(a, b)


def test_scale_factors_round_trip_exactly() -> None:
    for factor in (1 / 3, 1 / math.sqrt(128), -2.5e-300, 1e16, 0.1, 7.0, -0.0):
        p = Program()
        p.output(p.scale(p.input("X", (2,)), factor))
        q = parse_program(dump_program(p))
        assert dict(q.nodes[1].attrs)["factor"] == factor
        assert dump_program(q) == dump_program(p)  # -0.0 is stored as 0.0, so its text is a fixed point too


_FRAGMENTS = st.sampled_from(
    [
        "input",
        "output",
        "param",
        "program",
        "X",
        "Y",
        "[",
        "]",
        "(",
        ")",
        ",",
        "=",
        "+",
        "-",
        "*",
        "/",
        "2",
        "0",
        "1.5",
        "\n",
        " ",
        "exp",
        "sum",
        "dim",
        "true",
        "matmul",
        "#",
        "concat",
        "repeat",
        "reshape",
        "scale",
        "$",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.lists(_FRAGMENTS, max_size=40).map("".join), st.text(max_size=60)))
def test_any_text_parses_or_raises_a_gensorage_error(text: str) -> None:
    try:
        p = parse_program(text, source="fuzz")
    except GensorageError as exc:
        assert str(exc).startswith("fuzz") and "\n" not in str(exc)
    else:
        assert p.outputs


def test_deep_nesting_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="nested too deeply"):
        parse_program("input X [2]\nY = " + "exp(" * 5000 + "X" + ")" * 5000 + "\noutput Y")

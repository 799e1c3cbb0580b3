"""The Program builder: shape/dtype checking, float64 semantics of every op, evaluation and identity keys."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from scipy import special

from gensorage.arith import Float64Arith
from gensorage.errors import ProgramError, UnsupportedOpError
from gensorage.opset import Op
from gensorage.program import Node, Program, Tensor

RNG = np.random.default_rng(1234)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape)


def run1(p: Program, *arrays: np.ndarray) -> np.ndarray:
    (out,) = p.run(*arrays)
    return out


# ------------------------------------------------------------------ builder checks


def test_shape_mismatch_names_op_and_shapes() -> None:
    p = Program()
    a = p.input("A", (4, 8))
    b = p.input("B", (4, 8))
    with pytest.raises(ProgramError, match=r"matmul.*inner dims.*\[4, 8\], \[4, 8\]"):
        p.matmul(a, b)
    c = p.input("C", (3,))
    with pytest.raises(ProgramError, match=r"add.*broadcast.*\[4, 8\], \[3\]"):
        p.add(a, c)
    with pytest.raises(ProgramError, match=r"reshape.*\[5, 5\]"):
        p.reshape(a, (5, 5))
    with pytest.raises(ProgramError, match=r"concat.*\[4, 8\], \[3\]"):
        p.concat([a, c], dim=0)


def test_bad_dims_are_rejected() -> None:
    p = Program()
    a = p.input("A", (4, 8))
    with pytest.raises(ProgramError, match=r"sum: dim 2 out of range.*\[4, 8\]"):
        p.sum(a, dim=2)
    with pytest.raises(ProgramError, match=r"repeat: dim -3"):
        p.repeat(a, dim=-3, times=2)
    with pytest.raises(ProgramError, match=r"repeat: 'times'"):
        p.repeat(a, dim=0, times=0)
    with pytest.raises(ProgramError, match=r"sum: group 3 must divide"):
        p.sum(a, dim=1, group=3)
    with pytest.raises(ProgramError, match=r"concat: needs at least 2"):
        p.concat([a], dim=0)


def test_dtype_mixing_is_rejected() -> None:
    p = Program()
    a = p.input("A", (4, 4), "float16")
    b = p.input("B", (4, 4), "float32")
    with pytest.raises(ProgramError, match=r"mul: inputs mix dtypes float16, float32"):
        p.mul(a, b)
    with pytest.raises(ProgramError, match="unsupported dtype"):
        p.input("C", (4,), "int8")
    c = p.input("C", (4, 4), "bfloat16")
    assert p.exp(c).dtype == "bfloat16"


def test_foreign_unknown_and_duplicate_tensors() -> None:
    p, q = Program("p"), Program("q")
    a = p.input("A", (2, 2))
    b = q.input("A", (2, 2))
    with pytest.raises(ProgramError, match="belongs to another program"):
        p.add(a, b)
    with pytest.raises(ProgramError, match="unknown tensor"):
        p.exp(Tensor(7, "ghost", (2, 2), "float16", a.owner))
    with pytest.raises(ProgramError, match="expected a Tensor"):
        p.exp(np.zeros((2, 2)))  # type: ignore[arg-type]
    with pytest.raises(ProgramError, match="duplicate tensor name 'A'"):
        p.input("A", (3,))
    with pytest.raises(ProgramError, match="duplicate tensor name 'A'"):
        p.exp(a, name="A")
    with pytest.raises(ProgramError, match="shape must be"):
        p.input("Z", (2, 0))
    with pytest.raises(ProgramError, match="shape must be"):
        p.input("Z", ())


def test_generated_names_are_unique() -> None:
    p = Program()
    a = p.input("t1", (2,))
    b = p.exp(a)
    c = p.exp(b)
    names = [n.name for n in p.nodes]
    assert len(set(names)) == len(names) == 3
    assert c.name != "t1"


def test_apply_by_name() -> None:
    p = Program()
    a = p.input("A", (2, 6))
    assert p.apply("sum", [a], {"dim": 1, "keepdim": False}).shape == (2,)
    assert p.apply(Op.REPEAT, [a], {"dim": 0, "times": 3}).shape == (6, 6)
    with pytest.raises(UnsupportedOpError, match="known ops: matmul"):
        p.apply("softmax", [a])
    with pytest.raises(ProgramError, match="unknown argument"):
        p.apply("exp", [a], {"dim": 1})
    with pytest.raises(ProgramError, match="missing argument"):
        p.apply("repeat", [a], {"dim": 0})


# ------------------------------------------------------------------ introspection


def test_inputs_nodes_outputs() -> None:
    p = Program("intro")
    w = p.input("W", (3, 4), "float32")
    x = p.input("X", (2, 3), "float32")
    h = p.matmul(x, w, name="H")
    y = p.relu(h)
    p.output(y)
    p.output(h)
    assert [t.name for t in p.inputs] == ["W", "X"]
    assert [(t.shape, t.dtype) for t in p.inputs] == [((3, 4), "float32"), ((2, 3), "float32")]
    assert [t.name for t in p.outputs] == [y.name, "H"]
    nodes = p.nodes
    assert [n.id for n in nodes] == list(range(4))
    assert nodes[0] == Node(0, None, (), (), (3, 4), "float32", "W")
    assert nodes[2].op is Op.MATMUL and nodes[2].inputs == (x.id, w.id) and nodes[2].shape == (2, 4)
    assert nodes[3].op is Op.RELU and nodes[3].inputs == (2,)
    assert p.tensor("H") == h and p.tensor(3) == y
    with pytest.raises(ProgramError, match="already an output"):
        p.output(h)


# ------------------------------------------------------------------ float64 semantics, each op vs numpy


def test_matmul_batch_broadcast() -> None:
    p = Program()
    a = p.input("A", (2, 1, 3, 4))
    b = p.input("B", (5, 4, 6))
    p.output(p.matmul(a, b))
    x, y = rand(2, 1, 3, 4), rand(5, 4, 6)
    out = run1(p, x, y)
    assert out.shape == (2, 5, 3, 6)
    for i in range(2):
        for j in range(5):
            np.testing.assert_allclose(out[i, j], x[i, 0] @ y[j], rtol=1e-12)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_binary_broadcast(op: str) -> None:
    p = Program()
    a = p.input("A", (3, 1, 4))
    b = p.input("B", (5, 1))
    p.output(getattr(p, op)(a, b))
    x, y = rand(3, 1, 4), rand(5, 1) + 3.0
    expected = np.empty((3, 5, 4))
    for i in range(3):
        for j in range(5):
            for k in range(4):
                u, v = x[i, 0, k], y[j, 0]
                expected[i, j, k] = {"add": u + v, "sub": u - v, "mul": u * v, "div": u / v}[op]
    np.testing.assert_allclose(run1(p, x, y), expected, rtol=1e-14)


def test_unary_ops_and_activations() -> None:
    p = Program()
    a = p.input("A", (7,))
    for f in (p.exp, p.sqrt, p.relu, p.silu, p.gelu):
        p.output(f(a))
    p.output(p.scale(a, -2.5))
    p.output(p.mul(a, 0.5))
    p.output(p.mul(3, a))
    x = np.array([-3.0, -1.0, -0.25, 0.0, 0.5, 1.0, 2.0])
    exp_, sqrt_, relu_, silu_, gelu_, sc, half, triple = p.run(x)
    np.testing.assert_allclose(exp_, [np.e**v for v in x], rtol=1e-14)
    assert np.all(np.isnan(sqrt_[:3])) and np.allclose(sqrt_[3:], [0.0, 0.5**0.5, 1.0, 2**0.5])
    np.testing.assert_array_equal(relu_, [0, 0, 0, 0, 0.5, 1.0, 2.0])
    np.testing.assert_allclose(silu_, [v / (1 + np.exp(-v)) for v in x], rtol=1e-14)
    np.testing.assert_allclose(gelu_, [v * 0.5 * (1 + special.erf(v / 2**0.5)) for v in x], rtol=1e-14)
    np.testing.assert_allclose(sc, x * -2.5)
    np.testing.assert_allclose(half, x / 2)
    np.testing.assert_allclose(triple, x * 3)
    ops = [n.op for n in p.nodes[1:]]
    assert ops[-3:] == [Op.SCALE, Op.SCALE, Op.SCALE]


def test_sum_keepdim_and_group() -> None:
    p = Program()
    a = p.input("A", (2, 6, 3))
    p.output(p.sum(a, dim=1))
    p.output(p.sum(a, dim=-1, keepdim=False))
    p.output(p.sum(a, dim=1, group=3))
    p.output(p.sum(a, dim=1, group=6))  # a group of the whole dim is a full reduction
    x = rand(2, 6, 3)
    keep, drop, grouped, full = p.run(x)
    assert (
        keep.shape == (2, 1, 3)
        and drop.shape == (2, 6)
        and grouped.shape == (2, 2, 3)
        and full.shape == (2, 1, 3)
    )
    for i in range(2):
        for k in range(3):
            assert keep[i, 0, k] == pytest.approx(sum(x[i, j, k] for j in range(6)))
            assert grouped[i, 0, k] == pytest.approx(x[i, 0, k] + x[i, 1, k] + x[i, 2, k])
            assert grouped[i, 1, k] == pytest.approx(x[i, 3, k] + x[i, 4, k] + x[i, 5, k])
        for j in range(6):
            assert drop[i, j] == pytest.approx(x[i, j, 0] + x[i, j, 1] + x[i, j, 2])
    np.testing.assert_array_equal(full, keep)


def test_repeat_concat_reshape() -> None:
    p = Program()
    a = p.input("A", (2, 3))
    b = p.input("B", (2, 1))
    p.output(p.repeat(a, dim=0, times=3))
    p.output(p.concat([a, b, a], dim=-1))
    p.output(p.reshape(a, (3, 2)))
    x, y = rand(2, 3), rand(2, 1)
    rep, cat, resh = p.run(x, y)
    assert [list(r) for r in rep] == [list(x[0])] * 3 + [list(x[1])] * 3  # each row repeated consecutively
    assert [list(r) for r in cat] == [list(x[i]) + [y[i, 0]] + list(x[i]) for i in range(2)]
    flat = [v for row in x for v in row]
    assert [list(r) for r in resh] == [flat[0:2], flat[2:4], flat[4:6]]


# ------------------------------------------------------------------ evaluation


class CountingArith(Float64Arith):
    def __init__(self) -> None:
        self.exp_calls = 0

    def exp(self, a: np.ndarray) -> np.ndarray:
        self.exp_calls += 1
        return super().exp(a)


def test_evaluate_only_what_outputs_need() -> None:
    p = Program()
    a = p.input("A", (3,))
    p.exp(a)  # dead
    p.output(p.relu(a))
    arith = CountingArith()
    (out,) = p.evaluate(arith, [np.array([-1.0, 0.0, 2.0])])
    assert arith.exp_calls == 0
    np.testing.assert_array_equal(out, [0.0, 0.0, 2.0])
    assert p.live_ids() == [0, 2]


def test_evaluate_accepts_mapping_and_checks_it() -> None:
    p = Program()
    a = p.input("A", (2,))
    b = p.input("B", (2,))
    p.output(p.sub(a, b))
    (out,) = p.evaluate(Float64Arith(), {"B": np.ones(2), "A": np.full(2, 3.0)})
    np.testing.assert_array_equal(out, [2.0, 2.0])
    with pytest.raises(ProgramError, match="missing"):
        p.evaluate(Float64Arith(), {"A": np.ones(2)})
    with pytest.raises(ProgramError, match=r"input 'B' has shape \[3\], expected \[2\]"):
        p.evaluate(Float64Arith(), [np.ones(2), np.ones(3)])


def test_run_checks_arguments() -> None:
    p = Program("chk")
    a = p.input("A", (2, 3))
    p.output(p.exp(a))
    with pytest.raises(ProgramError, match=r"takes 1 input\(s\) \(A\), got 2"):
        p.run(np.ones((2, 3)), np.ones((2, 3)))
    with pytest.raises(ProgramError, match=r"input 'A' has shape \[3, 2\], expected \[2, 3\]"):
        p.run(np.ones((3, 2)))
    with pytest.raises(ProgramError, match="not numeric"):
        p.run([["a", "b", "c"], ["d", "e", "f"]])
    out = run1(p, np.zeros((2, 3), dtype=np.float16))  # cast to float64
    assert out.dtype == np.float64 and np.all(out == 1.0)


def test_program_without_outputs_cannot_run() -> None:
    p = Program("empty")
    p.input("A", (2,))
    with pytest.raises(ProgramError, match="has no outputs"):
        p.run(np.ones(2))
    with pytest.raises(ProgramError, match="has no outputs"):
        p.evaluate(Float64Arith(), [np.ones(2)])


# ------------------------------------------------------------------ identity keys


def _rmsnorm(order: Sequence[str], n: int = 8, names: bool = False) -> Program:
    p = Program("rms" if names else "other")
    x = p.input("X" if names else "in0", (4, n))
    g = p.input("G" if names else "in1", (n,))
    parts = {}
    for step in order:  # the two independent branches may be built in either order
        if step == "norm":
            parts["r"] = p.sqrt(p.scale(p.sum(p.mul(x, x), dim=1), 1 / n), name="R" if names else None)
        else:
            parts["xg"] = p.mul(x, g)
    p.output(p.div(parts["xg"], parts["r"]))
    return p


def test_key_ignores_names_and_build_order() -> None:
    a = _rmsnorm(["norm", "gain"], names=True)
    b = _rmsnorm(["gain", "norm"], names=False)
    assert a.key() == b.key()
    assert a.structure_key() == b.structure_key()
    x, g = rand(4, 8), rand(8)
    np.testing.assert_allclose(run1(a, x, g), run1(b, x, g))


def test_key_ignores_dead_nodes() -> None:
    a = _rmsnorm(["norm", "gain"])
    b = _rmsnorm(["norm", "gain"])
    b.exp(b.inputs[0])
    assert a.key() == b.key()


def test_key_sees_shapes_ops_attrs_dtypes_topology() -> None:
    base = _rmsnorm(["norm", "gain"]).key()
    assert _rmsnorm(["norm", "gain"], n=16).key() != base
    variants = []
    for variant in range(5):
        p = Program()
        x = p.input("X", (4, 8), "float32" if variant == 1 else "float16")
        y = p.input("Y", (4, 8), "float32" if variant == 1 else "float16")
        z = p.add(y, x) if variant == 2 else p.add(x, y)
        z = p.sum(z, dim=0 if variant == 3 else 1)
        p.output(p.scale(z, 2.0 if variant == 4 else 3.0))
        variants.append(p.key())
    assert len(set(variants)) == 5


def test_structure_key_ignores_sizes_but_not_ranks() -> None:
    small = _rmsnorm(["norm", "gain"], n=8)
    large = _rmsnorm(["norm", "gain"], n=4096)
    assert small.key() != large.key()
    assert small.structure_key() == large.structure_key()
    p = Program()
    x = p.input("X", (4, 8, 1))
    g = p.input("G", (8, 1))
    p.output(p.div(p.mul(x, g), p.sqrt(p.scale(p.sum(p.mul(x, x), dim=1), 1 / 8))))
    assert p.structure_key() != small.structure_key()


def test_numpy_integer_attributes_are_canonical() -> None:
    def build(k: int | np.integer) -> Program:
        p = Program()
        x = p.input("X", (2, 4))
        p.output(
            p.sum(p.repeat(x, dim=np.int64(0) if isinstance(k, np.integer) else 0, times=k), dim=1, group=k)
        )  # type: ignore[arg-type]
        return p

    assert build(np.int64(2)).key() == build(2).key()
    assert all(type(v) in (int, bool) for n in build(np.int64(2)).nodes for _, v in n.attrs)

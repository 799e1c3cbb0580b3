"""Abstract-expression terms (interning, constructors) and the expression arithmetic (Table 1)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gensorage.arith import Float64Arith
from gensorage.exhaustive.expr import abstract_expr as ae
from gensorage.exhaustive.expr.abstract_expr import expr_of
from gensorage.exhaustive.expr.canon import Canon
from gensorage.exhaustive.expr.expr_arith import ExprArith, ExprValue
from gensorage.program import Program
from gensorage.ugraph import examples

X, Y, Z, W = (ae.var(n) for n in "XYZW")


def v(shape: tuple[int, ...], t: ae.Term) -> ExprValue:
    return ExprValue(shape, t)


# ----------------------------------------------------------------------------------------------- terms


def test_interning_gives_identical_objects() -> None:
    a = ae.sum(8, ae.mul(ae.exp(X), ae.div(Y, ae.sqrt(Z))))
    b = ae.sum(8, ae.mul(ae.exp(ae.var("X")), ae.div(ae.var("Y"), ae.sqrt(ae.var("Z")))))
    assert a is b
    assert hash(a) == hash(b)
    assert ae.div(X, Y) is not ae.div(Y, X)
    assert ae.fn("relu", X) is not ae.fn("silu", X)


def test_commutative_constructors_ignore_argument_order() -> None:
    assert ae.add(X, Y) is ae.add(Y, X)
    assert ae.mul(X, ae.exp(Y)) is ae.mul(ae.exp(Y), X)


def test_sum_size_laws_are_applied_by_the_constructor() -> None:
    assert ae.sum(1, X) is X
    assert ae.sum(4, ae.sum(16, X)) is ae.sum(64, X)
    assert ae.max_r(1, X) is X
    assert ae.max_r(2, ae.max_r(3, X)) is ae.max_r(6, X)
    assert ae.sum(2, ae.max_r(3, X)).k == 2  # different reductions never merge
    with pytest.raises(ValueError):
        ae.sum(0, X)


def test_cat_is_a_flat_set() -> None:
    assert ae.cat(X, Y) is ae.cat(Y, X)
    assert ae.cat(X, X) is X
    assert ae.cat(ae.cat(X, Y), Z) is ae.cat(X, ae.cat(Z, Y))
    assert ae.cat(X, Y).args == tuple(sorted((X, Y), key=lambda t: t.uid))


def test_printing_and_subterms() -> None:
    t = ae.div(ae.sum(64, ae.mul(X, Y)), ae.fn("silu", X))
    assert str(ae.sum(64, ae.mul(X, Y))) in {"sum(64, mul(X, Y))", "sum(64, mul(Y, X))"}
    assert "silu(X)" in str(t)
    subs = list(t.subterms())
    assert subs[-1] is t and set(subs) >= {X, Y, ae.mul(X, Y), ae.fn("silu", X)}
    assert t.size == len(subs) == 6


def test_pickle_reinterns() -> None:
    t = ae.sum(8, ae.mul(ae.exp(X), Y))
    assert pickle.loads(pickle.dumps(t)) is t


# ----------------------------------------------------------------------------------------------- arithmetic


def test_table1_rules_on_direct_calls() -> None:
    ar = ExprArith()
    x, y = v((4, 8), X), v((8, 6), Y)
    assert ar.matmul(x, y).term is ae.sum(8, ae.mul(X, Y))
    assert ar.matmul(x, y).shape == (4, 6)
    assert ar.reduce_sum(x, 1, True).term is ae.sum(8, X)
    assert ar.reduce_sum(x, 0, False).shape == (8,)
    assert ar.reduce_max(x, 1, True).term is ae.max_r(8, X)
    assert ar.add(x, v((4, 1), Z)).term is ae.add(X, Z)
    assert ar.sub(x, v((4, 1), Z)).term is ae.add(X, Z)  # signs abstracted away
    assert ar.div(x, v((4, 1), Z)).term is ae.div(X, Z)
    assert ar.exp(x).term is ae.exp(X) and ar.sqrt(x).term is ae.sqrt(X)
    assert ar.activation("gelu", x).term is ae.fn("gelu", X)
    assert ar.scale(x, 0.125).term is X
    assert ar.reshape(x, (2, 16)).term is X and ar.reshape(x, (2, 16)).shape == (2, 16)
    assert ar.repeat(x, 0, 3).shape == (12, 8) and ar.repeat(x, 0, 3).term is X
    assert ar.slice(x, 1, 2, 6).term is X and ar.slice(x, 1, 2, 6).shape == (4, 4)


@pytest.mark.parametrize("r", [1, 2, 7])
@pytest.mark.parametrize("kind,ctor", [("sum", ae.sum), ("max", ae.max_r)])
def test_accumulating_r_iterations_counts(r: int, kind: str, ctor: object) -> None:
    ar = ExprArith()
    tile = ar.matmul(v((4, 8), X), v((8, 6), Y))
    acc = None
    for _ in range(r):
        acc = ar.accumulate(acc, tile, kind)  # type: ignore[arg-type]
    assert acc is not None
    assert acc.term is ctor(r, ae.sum(8, ae.mul(X, Y)))  # type: ignore[operator]
    assert acc.shape == (4, 6)
    assert ar.accumulate_times(tile, r, kind) == acc  # type: ignore[arg-type]


def test_accumulating_different_terms_adds_their_counts() -> None:
    ar = ExprArith()
    acc = None
    for t in (X, Y, X, X):
        acc = ar.accumulate(acc, v((2, 2), t), "sum")
    assert acc is not None and acc.term is ae.add(ae.sum(3, X), Y)


def test_concatenating_tiles_of_one_term_gives_the_term() -> None:
    ar = ExprArith()
    tiles = [v((2, 4), ae.exp(X))] * 5
    out = ar.concat(tiles, 0)
    assert out.term is ae.exp(X) and out.shape == (10, 4) and out.layout is None


def test_concat_keeps_a_layout_and_slices_see_their_pieces() -> None:
    ar = ExprArith()
    c = ar.concat([v((2, 4), X), v((3, 4), Y)], 0)
    assert c.term is ae.cat(X, Y) and c.shape == (5, 4)
    assert ar.slice(c, 0, 0, 2).term is X
    assert ar.slice(c, 0, 2, 5).term is Y
    assert ar.slice(c, 0, 1, 3).term is ae.cat(X, Y)
    assert ar.exp(c).term is ae.cat(ae.exp(X), ae.exp(Y))
    # elementwise with an unlaid-out operand: piece by piece
    assert ar.mul(c, v((5, 4), Z)).term is ae.cat(ae.mul(X, Z), ae.mul(Y, Z))
    # a sum over the concatenated dim adds the pieces' partial sums
    assert ar.reduce_sum(c, 0, True).term is ae.add(ae.sum(2, X), ae.sum(3, Y))
    assert ar.reduce_sum(c, 1, True).term is ae.cat(ae.sum(4, X), ae.sum(4, Y))


def test_matmul_over_a_concatenated_inner_dim_is_lora() -> None:
    """``(X ‖ X A)(W ‖ B) = X W + (X A) B``: same term as the unconcatenated program."""
    ar = ExprArith()
    m, k, n, r = 4, 8, 6, 2
    x, w, a, b = v((m, k), X), v((k, n), W), v((k, r), ae.var("A")), v((r, n), ae.var("B"))
    xa = ar.matmul(x, a)
    fused = ar.matmul(ar.concat([x, xa], 1), ar.concat([w, b], 0))
    plain = ar.add(ar.matmul(x, w), ar.matmul(xa, b))
    assert fused.term is plain.term
    assert fused.shape == (m, n)


def test_mismatched_layouts_refine() -> None:
    ar = ExprArith()
    a = ar.concat([v((2, 3), X), v((4, 3), Y)], 0)
    b = ar.concat([v((3, 3), Z), v((3, 3), W)], 0)
    out = ar.add(a, b)
    assert out.term is ae.cat(ae.add(X, Z), ae.add(Y, Z), ae.add(Y, W))
    assert out.shape == (6, 3)


def test_program_and_float_evaluation_agree_on_shapes() -> None:
    p = Program("t")
    x = p.input("X", (4, 8))
    y = p.input("Y", (8, 6))
    s = p.matmul(x, y)
    p.output(p.div(p.exp(s), p.sum(p.exp(s), dim=1)))
    (t,) = expr_of(p)
    e = ae.exp(ae.sum(8, ae.mul(X, Y)))
    assert t is ae.div(e, ae.sum(6, e))
    (f,) = p.evaluate(Float64Arith(), [np.ones((4, 8)), np.ones((8, 6))])
    (ev,) = p.evaluate(ExprArith(), [v((4, 8), X), v((8, 6), Y)])
    assert ev.shape == f.shape


def test_group_sum_is_sum_of_group_size() -> None:
    p = Program("g")
    x = p.input("X", (4, 12))
    p.output(p.sum(x, dim=1, group=3))
    assert expr_of(p) == [ae.sum(3, X)]


@pytest.mark.parametrize("name", sorted(examples.EXAMPLES))
def test_example_ugraphs_have_their_programs_expression(name: str) -> None:
    """Each hand-built µGraph is A_eq-equal to its program (Theorem 1's premise), via the literal evaluator."""
    prog, graph = examples.EXAMPLES[name]()
    canon = Canon()
    assert [canon.nf(t) for t in expr_of(graph)] == [canon.nf(t) for t in expr_of(prog)]


def test_expr_of_rejects_other_objects() -> None:
    with pytest.raises(TypeError):
        expr_of(42)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=6))
def test_concat_then_slice_back_returns_each_part(sizes: list[int]) -> None:
    ar = ExprArith()
    terms = [ae.var(f"P{i}") for i in range(len(sizes))]
    c = ar.concat([v((s, 3), t) for s, t in zip(sizes, terms, strict=True)], 0)
    assert c.shape == (sum(sizes), 3)
    start = 0
    for s, t in zip(sizes, terms, strict=True):
        assert ar.slice(c, 0, start, start + s).term is t
        start += s

"""Constant factors and reduction coefficients: the laws the two rules rely on, and that neither prunes a verified
candidate."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from search_walk import candidates_and_states

from gensorage import opset
from gensorage.arith import Float64Arith
from gensorage.exhaustive import SearchSpec, search_serial
from gensorage.exhaustive.expr import abstract_expr as ae
from gensorage.exhaustive.expr.canon import Canon
from gensorage.exhaustive.opcatalog import keeps_scaled, reads_scaled
from gensorage.exhaustive.rules import ruleset
from gensorage.exhaustive.rules.constants import ExpConstants, const_of
from gensorage.exhaustive.rules.reductions import generated, top_coefficients
from gensorage.exhaustive.walk import SearchContext
from gensorage.opset import Op, freeze_attrs
from gensorage.program import Program, load_config
from gensorage.ugraph.ir import BlockOp, GraphDefinedOp

F64 = Float64Arith()
# Operators a factor moves through (the barriers exp, silu and gelu give 1.0 whatever the argument carries).
LINEAR_LIKE = [
    Op.ADD,
    Op.SUB,
    Op.MUL,
    Op.DIV,
    Op.SQRT,
    Op.RELU,
    Op.MATMUL,
    Op.SUM,
    Op.MAX,
    Op.REPEAT,
    Op.CONCAT,
]
ATTRS = {
    Op.SUM: freeze_attrs({"dim": 1}),
    Op.MAX: freeze_attrs({"dim": 1, "keepdim": True}),
    Op.REPEAT: freeze_attrs({"dim": 0, "times": 2}),
    Op.CONCAT: freeze_attrs({"dim": 0}),
}


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(LINEAR_LIKE),
    st.floats(0.1, 10.0),
    st.floats(0.1, 10.0),
    st.booleans(),
    st.integers(0, 2**31 - 1),
)
def test_a_factor_comes_out_of_the_operator_as_const_of_says(
    op: Op, a: float, b: float, equal: bool, seed: int
) -> None:
    # op(a·x, b·y) == c·op(x, y) with c = const_of(op, [a, b]) whenever c is not None (mixed).
    rng = np.random.default_rng(seed)
    x, y = rng.uniform(0.5, 2.0, (3, 3)), rng.uniform(0.5, 2.0, (3, 3))
    if equal:
        b = a
    arity = 2 if op in (Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MATMUL, Op.CONCAT) else 1
    factors, args = [a, b][:arity], [x, y][:arity]
    attrs = ATTRS.get(op, ())
    c = const_of(op, attrs, factors)
    if c is None:
        assert op in (Op.ADD, Op.SUB, Op.CONCAT) and not math.isclose(a, b)
        return
    scaled = opset.apply(op, F64, [f * v for f, v in zip(factors, args, strict=True)], attrs)
    plain = opset.apply(op, F64, args, attrs)
    # Absolute slack at the operands' scale: a difference of nearly equal terms (sub, add of opposite signs)
    # cancels, and its relative error then says nothing (a=b=3, x[0,0] - y[0,0] = 3e-5 gave 2.7e-12).
    scale = max(factors) * max(float(np.abs(v).max()) for v in args)
    np.testing.assert_allclose(scaled, c * plain, rtol=1e-12, atol=1e-13 * scale)


def test_barriers_and_scales() -> None:
    assert const_of(Op.SCALE, freeze_attrs({"factor": 0.5}), [1.0]) == 0.5
    assert const_of(Op.EXP, (), [0.5]) == 1.0 and const_of(Op.EXP, (), [None]) == 1.0
    assert const_of(Op.SQRT, (), [-1.0]) is None  # sqrt(-x) is no multiple of sqrt(x)
    assert const_of(Op.MUL, (), [None, 2.0]) is None
    assert const_of(Op.MAX, freeze_attrs({"dim": 1}), [-1.0]) is None  # max(-x) is -min(x)


def test_who_reads_a_scale_result() -> None:
    # Non-linear unary operators, and a maximum of a positive multiple only; a maximum's result is one again.
    assert reads_scaled(Op.EXP, [-2.0]) and reads_scaled(Op.MAX, [0.5])
    assert not reads_scaled(Op.MAX, [-0.5]) and not reads_scaled(Op.MAX, [None])
    assert not reads_scaled(Op.SUM, [0.5]) and not reads_scaled(Op.MUL, [0.5, 1.0])
    assert keeps_scaled(Op.SCALE, False) and keeps_scaled(Op.MAX, True)
    assert not keeps_scaled(Op.MAX, False) and not keeps_scaled(Op.EXP, True)


def _max_of_scaled(factor: float) -> Program:
    p = Program("max_of_scaled")
    p.output(p.max(p.scale(p.input("X", (3, 4)), factor), 1, keepdim=True))
    return p


@pytest.mark.parametrize("factor", [0.5, -0.5])
def test_a_max_reads_a_scale_result_of_a_positive_factor_only(factor: float) -> None:
    # max(c·x) = c·max(x) for c > 0: the search computes max(scale(X)) as written (a maximum reading the scale's
    # result). For c < 0 (max(-x) is -min(x)) no maximum reads the scale's result, and no µGraph of the space
    # computes the program: the scale cannot move past the maximum.
    spec = SearchSpec(
        program=_max_of_scaled(factor),
        max_kernel_ops=1,
        max_block_ops=2,
        max_grid_dims=1,
        max_block_outputs=1,
    )
    found = search_serial(spec).candidates
    reads = []
    for c in found:
        (op,) = c.ugraph.ops
        assert isinstance(op, GraphDefinedOp)
        nodes = op.block.nodes
        reads += [
            n.inputs[0].node
            for n in nodes
            if isinstance(n, BlockOp)
            and n.op is Op.MAX
            and getattr(nodes[n.inputs[0].node], "op", None) is Op.SCALE
        ]
    assert bool(reads) == (factor > 0) and bool(found) == (factor > 0)


def _softmax(scale: float | None) -> Program:
    p = Program("softmax")
    x = p.input("X", (3, 4))
    e = p.exp(x if scale is None else p.scale(x, scale))
    p.output(p.div(e, p.sum(e, dim=1)))
    return p


def test_program_factors() -> None:
    attention = load_config("mha_incdec_papers", {"h": 2, "n": 6, "d": 5})
    canon = Canon()
    got = ExpConstants(attention, canon)
    ((cls, factors),) = got.allowed.items()
    assert factors is not None and math.isclose(next(iter(factors)), 1 / math.sqrt(5))
    assert got.factor_marks == {cls}
    exp_qk = ae.exp(ae.sum(5, ae.mul(ae.var("Q"), ae.var("K"))))
    assert got.admits(exp_qk, 1 / math.sqrt(5)) and not got.admits(exp_qk, 1.0)
    assert got.admits(exp_qk, None)  # mixed: never pruned
    assert got.admits(ae.exp(ae.var("V")), 1.0)  # a class the program has not: not restricted here
    plain = ExpConstants(_softmax(None), canon)
    assert list(plain.allowed.values()) == [frozenset({1.0})] and not plain.factor_marks
    # exp(2·X + Y): no single factor can be pulled out of the argument, so nothing is restricted.
    p = Program("mixed")
    x, y = p.input("X", (3, 4)), p.input("Y", (3, 4))
    p.output(p.exp(p.add(p.scale(x, 2.0), y)))
    mixed = ExpConstants(p, canon)
    assert list(mixed.allowed.values()) == [None] and mixed.admits(
        ae.exp(ae.add(ae.var("X"), ae.var("Y"))), 1.0
    )


def test_not_applied_without_the_expression_filter() -> None:
    assert SearchContext(SearchSpec(program=_softmax(0.5), expr_filter=False)).rules.constants is None
    assert SearchContext(SearchSpec(program=_softmax(0.5), prune=False)).rules.constants is None
    assert SearchContext(SearchSpec(program=_softmax(0.5))).rules.constants is not None


class _Off(ExpConstants):
    """The rule switched off: every factor admitted, no scale counted by the needed-operator bound."""

    def __init__(self, program: Program, canon: Canon) -> None:
        super().__init__(program, canon)
        self.factor_marks = frozenset()

    def admits(self, term: ae.Term, arg: float | None) -> bool:
        return True


def _exp_matmul_scaled() -> Program:
    p = Program("exp_matmul_scaled")
    p.output(p.exp(p.scale(p.matmul(p.input("X", (2, 3)), p.input("W", (3, 5))), 0.5)))
    return p


@pytest.mark.parametrize(
    "program, kernels, block_ops",
    [
        (_softmax(0.5), 2, 2),
        (_exp_matmul_scaled(), 2, 2),
    ],
)
def test_the_rule_prunes_no_verified_candidate(
    program: Program, kernels: int, block_ops: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same search with the rule switched off finds exactly the same candidates and walks more states.
    spec = SearchSpec(
        program=program, max_kernel_ops=kernels, max_block_ops=block_ops, max_grid_dims=1, max_block_outputs=1
    )

    with_rule, states_with = candidates_and_states(spec)
    monkeypatch.setattr(ruleset, "ExpConstants", _Off)
    without_rule, states_without = candidates_and_states(spec)
    assert with_rule == without_rule and with_rule
    assert states_with < states_without


# ------------------------------------------------------------------------------- reductions


def test_top_coefficients_and_products() -> None:
    canon = Canon()
    q, k, v = ae.var("Q"), ae.var("K"), ae.var("V")
    attention = ae.expr_of(load_config("mha_incdec_papers", {"h": 2, "n": 6, "d": 5}))[0]
    assert top_coefficients(canon.nf(attention)) == {6}  # (6·V·exp(5·Q·K)) / (6·exp(5·Q·K)): 5 is inside exp
    assert top_coefficients(canon.nf(ae.div(ae.sum(3, q), ae.div(ae.sum(5, k), ae.sum(7, v))))) == {3, 5, 7}
    assert top_coefficients(canon.nf(ae.mul(ae.sum(3, q), ae.sum(7, k)))) == {21}
    assert top_coefficients(canon.nf(ae.add(q, k))) is None  # two monomials: add is not covered
    assert generated(1, frozenset()) and generated(12, frozenset({2, 3})) and generated(8, frozenset({2}))
    assert not generated(16, frozenset({8})) and not generated(5, frozenset({2, 3}))


def test_reductions_needed() -> None:
    program = load_config("mha_incdec_papers", {"h": 2, "n": 6, "d": 5})
    red = SearchContext(SearchSpec(program=program)).rules.reductions
    assert red is not None and red.required == {6}
    q, k, v = ae.var("Q"), ae.var("K"), ae.var("V")
    qk = ae.sum(5, ae.mul(q, k))
    assert red.needed([qk, v])  # Q Kᵀ and V: the sums over the keys are still to make
    assert not red.needed([ae.sum(6, ae.exp(qk)), v])  # the denominator's sum is there: 6 = 6
    # A sum offers each of its monomials' coefficients (adding never makes one): Q + K has only 1s.
    assert red.needed([ae.add(q, k), v])
    assert not red.needed([ae.add(ae.sum(6, ae.exp(qk)), q), v])
    for op, off in (("add", True), ("concat", True), ("sub", False)):
        ops = ("matmul", op, "exp", "sum", "div", "scale")
        rules = SearchContext(SearchSpec(program=program, ops=ops)).rules
        assert (rules.reductions is None) is off


def _stable_softmax() -> Program:
    p = Program("stable_softmax")
    x = p.input("X", (3, 4))
    e = p.exp(p.sub(x, p.max(x, dim=1, keepdim=True)))
    p.output(p.div(e, p.sum(e, dim=1)))
    return p


def _matmul_exp() -> Program:
    p = Program("matmul_exp")
    p.output(p.matmul(p.exp(p.scale(p.input("X", (2, 3)), 0.5)), p.input("W", (3, 5))))
    return p


@pytest.mark.parametrize(
    "program, kernels, block_ops, nodes",
    [
        (_softmax(0.5), 2, 2, None),
        (_matmul_exp(), 2, 2, 3),
        # sub in the op set (the rule applies: adding never makes a coefficient): 29,450 states against 29,496
        (_stable_softmax(), 1, 4, None),
    ],
)
def test_the_reduction_rule_prunes_no_verified_candidate(
    program: Program, kernels: int, block_ops: int, nodes: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = SearchSpec(
        program=program,
        max_kernel_ops=kernels,
        max_block_ops=block_ops,
        max_block_nodes=nodes,
        max_grid_dims=1,
        max_block_outputs=1,
    )
    # The tie rule (see ties) prunes these prefixes too: off in both runs, so this measures the reduction rule.
    monkeypatch.setattr(ruleset.TieRule, "for_search", staticmethod(lambda *a: None))

    with_rule, states_with = candidates_and_states(spec)
    monkeypatch.setattr(ruleset.Reductions, "for_search", classmethod(lambda cls, *a: None))
    without_rule, states_without = candidates_and_states(spec)
    assert with_rule == without_rule and with_rule
    assert states_with < states_without

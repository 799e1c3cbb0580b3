"""Bounds: term counts and degrees through programs and µGraphs, the Lax check, trial counts."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from gensorage.errors import NotLaxError, VerificationError
from gensorage.program import Program, Tensor
from gensorage.ugraph import from_program
from gensorage.ugraph.examples import flash_attention
from gensorage.verify.bounds import (
    VARIABLE,
    Bound,
    BoundsArith,
    _reshape_distinct,
    bound_add,
    bound_div,
    bound_exp,
    bound_mul,
    bound_sum,
    difference,
)
from gensorage.verify.equivalent import plan
from gensorage.verify.mersenne import M61
from gensorage.verify.primes import DEFAULT_P, DEFAULT_Q
from gensorage.verify.trials import format_count, plan_trials


def program(shapes: list[tuple[int, ...]], body: Callable[..., Tensor]) -> Program:
    p = Program()
    xs = [p.input(f"x{i}", s, "float32") for i, s in enumerate(shapes)]
    p.output(body(p, *xs))
    return p


def bound_of(p: object) -> Bound:
    arith = BoundsArith()
    (out,) = p.evaluate(arith, [arith.variable(t.shape) for t in p.inputs])  # type: ignore[attr-defined]
    return out.bound


def softmax_av(p: Program, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    e = p.exp(p.matmul(q, k))
    return p.div(p.matmul(e, v), p.sum(e, dim=1))


def softmax_then_av(p: Program, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    e = p.exp(p.matmul(q, k))
    return p.matmul(p.div(e, p.sum(e, dim=1)), v)


ATTN = [(4, 8), (8, 6), (6, 5)]  # Q K -> [4, 6]; six keys per row


# ------------------------------------------------------------------------------------------------- rules


def test_polynomial_degrees() -> None:
    b = bound_of(program([(3, 4), (4, 5), (5, 2)], lambda p, x, y, z: p.matmul(p.matmul(x, y), z)))
    assert (b.dn, b.dd, b.kn, b.kd, b.has_exp) == (3, 0, 1, 1, False)
    b = bound_of(program([(3, 4), (3, 4)], lambda p, x, y: p.div(p.mul(x, x), p.add(x, y))))
    assert (b.dn, b.dd) == (2, 1)
    # a sum of fractions with *different* denominators multiplies them out
    b = bound_of(program([(3, 4), (3, 4)], lambda p, x, y: p.sum(p.div(x, y), dim=1)))
    assert (b.dn, b.dd) == (1 + 3 * 1, 4)
    # ... while a common (broadcast) denominator is kept once
    b = bound_of(program([(3, 4), (3, 1)], lambda p, x, y: p.sum(p.div(x, y), dim=1)))
    assert (b.dn, b.dd) == (1, 1)


def test_exp_term_counts_for_softmax() -> None:
    n = ATTN[1][1]
    a = bound_of(program(ATTN, softmax_av))
    b = bound_of(program(ATTN, softmax_then_av))
    assert (a.kn, a.kd) == (n, n)
    assert (b.kn, b.kd) == (n, n)  # the row sum is shared across the matmul's inner dim
    assert difference(a, b).k == 2 * n * n
    assert a.eh == 2 and a.eu == 0 and a.has_exp


def test_sum_rule_is_repeated_addition() -> None:
    base = bound_div(bound_exp(VARIABLE), bound_add(VARIABLE, bound_exp(VARIABLE)))
    acc = base
    for _ in range(3):
        acc = bound_add(acc, base)
    closed = bound_sum(base, 4)
    assert (closed.kn, closed.kd, closed.dn, closed.dd) == (acc.kn, acc.kd, acc.dn, acc.dd)
    assert (closed.eh, closed.eu) == (acc.eh, acc.eu)
    assert closed.wn == pytest.approx(acc.wn) and closed.wd == pytest.approx(acc.wd)


def test_mul_and_div_rules() -> None:
    e = bound_exp(VARIABLE)
    two = bound_add(e, e)
    assert (two.kn, two.kd) == (2, 1)
    m = bound_mul(two, two)
    assert (m.kn, m.kd) == (4, 1)
    d = bound_div(two, bound_add(two, e))
    assert (d.kn, d.kd, d.nexp, d.dexp) == (2, 3, True, True)


def test_lax_check_names_the_op() -> None:
    # The second tier's Lax check; the first tier takes any nesting (exp is a fresh variable there).
    nested = program([(2, 3)], lambda p, x: p.exp(p.exp(x)))
    with pytest.raises(NotLaxError, match="two exps on one path through exp"):
        plan(nested, program([(2, 3)], lambda p, x: x), tier=2)
    assert plan(nested, nested).method == "uninterpreted"
    with pytest.raises(NotLaxError, match="two exps on one path"):
        plan(
            program([(2, 3)], lambda p, x: x),
            program([(2, 3)], lambda p, x: p.exp(p.sum(p.mul(p.exp(x), x), dim=1))),
            tier=2,
        )
    # exp of an activation of an exp is Lax (the activation is an uninterpreted fresh value)
    plan(
        program([(2, 3)], lambda p, x: p.exp(p.relu(p.exp(x)))),
        program([(2, 3)], lambda p, x: p.exp(p.relu(p.exp(x)))),
        tier=2,
    )


def test_reshape_distinct_denominators() -> None:
    # heads × head_dim merged: as many denominators as heads when they do not vary along head_dim
    assert _reshape_distinct((4, 6), (4, 1), (24,)) == (4,)
    assert _reshape_distinct((4, 6), (1, 6), (24,)) == (6,)
    assert _reshape_distinct((2, 3, 4), (1, 1, 4), (6, 4)) == (1, 4)
    assert _reshape_distinct((4, 1), (1, 1), (1, 4)) == (1, 1)
    # A split axis: the denominator need not factor over the parts with the old count. Three denominators along
    # 24 elements, g(i) = i // 8, split as (4, 6): the rows b -> (6a + b) // 8 are 000000, 001111, 111122 and
    # 222222, four different rows, so no map of a with three values determines them. Each part gets its size.
    assert _reshape_distinct((24,), (3,), (4, 6)) == (4, 6)
    assert len({tuple((6 * a + b) // 8 for b in range(6)) for a in range(4)}) == 4
    assert _reshape_distinct((24,), (1,), (4, 6)) == (
        1,
        1,
    )  # one denominator: it factors with every map constant
    assert _reshape_distinct((2, 12), (2, 3), (2, 3, 4)) == (2, 3, 4)  # a split beside a kept axis


def test_microgaph_bounds_run_through_the_same_walk() -> None:
    p, g = flash_attention()
    bp, bg = bound_of(p), bound_of(g)
    assert bp.has_exp and bg.has_exp
    kv = 12
    assert (bp.kn, bp.kd) == (kv, kv)
    assert (bg.kn, bg.kd) == (kv, kv)  # loop accumulators sum kv/forloop terms forloop times
    assert bound_of(from_program(p)) == bp


# -------------------------------------------------------------------------------------------- trial counts


def test_schwartz_zippel_count() -> None:
    a = program([(3, 4), (4, 5)], lambda p, x, y: p.matmul(x, y))
    tp = plan(a, a, 1e-9, tier=2)
    assert tp.method == "schwartz-zippel" and tp.degree == 2
    eps = 2 / DEFAULT_P
    assert tp.per_trial == pytest.approx(eps)
    assert tp.required == math.ceil(math.log(1e-9) / math.log(eps))
    assert tp.achieved_delta(tp.required) <= 1e-9 < tp.achieved_delta(tp.required - 1) or tp.required == 1


def test_lax_counts_take_the_larger_theorem() -> None:
    a = program(ATTN, softmax_av)
    b = program(ATTN, softmax_then_av)
    delta = 1e-6
    tp = plan(a, b, delta, tier=2)
    k = 2 * 6 * 6
    assert tp.method == "lax-theorem" and tp.k == k
    assert tp.trials_first_paper == math.ceil(k * math.log(1 / delta))
    assert tp.trials_later_paper == math.ceil(k * k / math.log(DEFAULT_Q) * math.log(1 / delta))
    assert tp.required == max(tp.trials_first_paper, tp.trials_later_paper)
    assert tp.achieved_delta(tp.required) <= delta * 1.000001
    assert tp.achieved_delta(tp.required // 2) > delta
    assert not any("d·k^4 < q" in n for n in tp.notes)  # 2 · 72^4 < q: the first paper's condition holds
    wide = [(4, 8), (8, 16), (16, 5)]
    tp = plan(program(wide, softmax_av), program(wide, softmax_then_av), delta, tier=2)
    assert tp.k == 2 * 16 * 16 and any("d·k^4 < q" in n for n in tp.notes)


def test_first_tier_count_is_a_collision_term_plus_schwartz_zippel() -> None:
    a, b = program(ATTN, softmax_av), program(ATTN, softmax_then_av)
    tp = plan(a, b, 1e-9)
    # exp applied to the 4·6 scores of each side, arguments of degree 2; the sums' common denominators
    # cross-multiplied give a difference numerator of degree 2 in the fresh exp values and V.
    m = 2 * (4 * 6)
    collide = m * (m - 1) / 2 * 2 / M61
    assert tp.method == "uninterpreted" and tp.required == 1
    assert tp.per_trial is not None and collide < tp.per_trial < collide + 10 / M61
    wide = [(64, 128), (128, 4096), (4096, 128)]
    tp = plan(program(wide, softmax_av), program(wide, softmax_then_av), 1e-9)
    assert tp.required == 2 and tp.per_trial is not None and 1e-9 < tp.per_trial < 1e-5


def test_plan_rejects_bad_delta() -> None:
    d = difference(VARIABLE, VARIABLE)
    for bad in (0.0, 1.0, -1.0, 2.0):
        with pytest.raises(VerificationError, match="delta"):
            plan_trials(d, bad, DEFAULT_P, DEFAULT_Q)


def test_degenerate_event_enters_the_per_trial_bound() -> None:
    d = difference(VARIABLE, VARIABLE)
    plain = plan_trials(d, 1e-30, 23, 11)
    conditioned = plan_trials(d, 1e-30, 23, 11, divisor_degree_p=1, divisor_degree_q=1)
    assert conditioned.per_trial is not None and plain.per_trial is not None
    assert conditioned.per_trial == pytest.approx((1 / 23) / (1 - 1 / 23 - 1 / 11))
    assert conditioned.required > plain.required
    with pytest.raises(VerificationError, match="degenerate"):
        plan_trials(d, 1e-9, 23, 11, divisor_degree_p=12)


def test_format_count() -> None:
    assert format_count(12345) == "12345"
    assert format_count(1122047622738912) == "1.12e15"
    assert format_count(1 << 1024).endswith("e308")

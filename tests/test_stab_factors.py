"""Factors of stabilisers (rules/constants.py, docs/search.md): a ``stab`` atom carries the factor of the ``exp``
that made it, so a rescale ``exp(m_i − M)`` of the unscaled scores' maxima is no rescale of a softmax of the scaled
scores; the online-softmax accumulators' ``exp(s − max s)`` is checked like an ``exp`` operator's; and the law
(the same candidates with the rule switched off, in more states)."""

from __future__ import annotations

import math

import pytest
from test_rediscovery import _guided_path, stable_decode_spec

from gensorage.exhaustive import SearchSpec, Task, run_task
from gensorage.exhaustive.expr import abstract_expr as ae
from gensorage.exhaustive.expr.canon import Canon
from gensorage.exhaustive.expr.expr_arith import EXPR, ExprValue, online_exponent
from gensorage.exhaustive.results import ugraph_key
from gensorage.exhaustive.rules import constants
from gensorage.exhaustive.rules.constants import ExpConstants
from gensorage.exhaustive.walk import Walk
from gensorage.opset import Op
from gensorage.ugraph.ir import KernelOp

C = 1 / math.sqrt(5)  # the stable decode program's 1/√d
S = ae.sum(5, ae.mul(ae.var("Q"), ae.var("K")))  # the scores Q·Kᵀ (d = 5), factors dropped


def _rescale(splits: int = 2) -> ae.Term:
    """FlashDecoding's combine exponent ``exp(m_i − M)``: each split's maximum against the maximum over splits."""
    m = ae.max_r(3, S)
    return ae.exp(ae.add(m, ae.max_r(splits, m)))


def test_a_stabiliser_carries_its_exps_factor(monkeypatch: pytest.MonkeyPatch) -> None:
    canon = Canon()
    scaled = ExpConstants(stable_decode_spec(True).program, canon)
    ((factors),) = scaled.stab_factors.values()
    assert factors is not None and math.isclose(next(iter(factors)), C)
    # The program has no exp of the rescale's class (stab atoms only), so only the stabiliser's factor decides:
    # maxima of the scaled scores (factor c) are admitted, of the unscaled ones (1) not; mixed never pruned.
    assert canon.nf(_rescale()) not in scaled.allowed
    assert (
        scaled.admits(_rescale(), C)
        and not scaled.admits(_rescale(), 1.0)
        and scaled.admits(_rescale(), None)
    )
    assert not scaled.admits(_rescale(4), 1.0)  # however many splits
    # A maximum the program's exp never stabilise by is not restricted.
    assert scaled.admits(ae.exp(ae.max_r(3, ae.var("V"))), 1.0)
    # With 1/√d folded into Q the program's stabilisers carry no factor: the unscaled rescale is FlashDecoding's.
    folded = ExpConstants(stable_decode_spec(False).program, canon)
    assert folded.admits(_rescale(), 1.0) and not folded.admits(_rescale(), C)
    monkeypatch.setattr(constants, "STAB_FACTORS", False)
    assert scaled.admits(_rescale(), 1.0)


def test_the_online_exponent_is_the_accumulators() -> None:
    # The exp an online accumulator takes, summed over the keys, is its softmax_sum's expression.
    canon = Canon()
    s = ExprValue((2, 1, 3), S)
    for loop in (1, 2):
        got = EXPR.online_softmax_times(s, None, loop, "softmax_sum").term
        assert canon.nf(got) == canon.nf(ae.sum(3 * loop, online_exponent(S, 3 * loop)))


def _kernel_ops(w: Walk) -> list[tuple[Op, tuple[int, ...]]] | None:
    """The pre-defined kernel operators so far, or ``None`` once a graph-defined kernel is open or done."""
    if w.state.block is not None or not all(isinstance(o, KernelOp) for o in w.state.ops):
        return None
    return [(o.op, tuple(r.node for r in o.inputs)) for o in w.state.ops]  # type: ignore[union-attr]


def _below_kt_and_qk(spec: SearchSpec) -> tuple[int, ...]:
    """The node whose kernel graph is ``K``'s transpose and a pre-defined ``Q·Kᵀ``: below it the later kernels
    exponentiate the unscaled scores' maxima in some µGraphs, and three candidates verify."""
    want = [(Op.TRANSPOSE, (1,)), (Op.MATMUL, (0, 3))]
    return _guided_path(spec, lambda w: _kernel_ops(w) == want[:1], lambda w: _kernel_ops(w) == want)


# The rule's ablation (a whole search run twice, 13 s idle): the slow run; the rule's own checks stay default.
@pytest.mark.slow
def test_switching_the_rule_off_finds_the_same_candidates_in_more_states(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = stable_decode_spec(True, stable_only=True)
    path = _below_kt_and_qk(spec)

    def walk() -> tuple[list[str], int]:
        res = run_task(spec, Task(0, path, True), reuse_subtrees=False)
        assert res.complete
        return sorted(ugraph_key(c.ugraph) for c in res.candidates), res.stats.states

    with_rule, states_with = walk()
    monkeypatch.setattr(constants, "STAB_FACTORS", False)
    without_rule, states_without = walk()
    assert with_rule == without_rule and with_rule
    assert states_with < states_without

"""The element-count cap: only reductions shrink a tensor, each by a coefficient the outputs bound; the rule
prunes no µGraph equal to the program."""

from __future__ import annotations

import math

import pytest
from search_walk import candidates_and_states

from gensorage.exhaustive import SearchSpec
from gensorage.exhaustive.dim_strategy import load_dim_strategy
from gensorage.exhaustive.expr import abstract_expr as ae
from gensorage.exhaustive.expr.canon import Canon
from gensorage.exhaustive.opcatalog import catalog
from gensorage.exhaustive.rules.element_counts import ElementCaps
from gensorage.exhaustive.walk import SearchContext
from gensorage.opset import Op
from gensorage.program import Program, load_config


def _caps(program: Program, ops: list[Op] | None = None) -> ElementCaps | None:
    numels = [math.prod(t.shape) for t in program.outputs]
    return ElementCaps.for_search(Canon(), ae.expr_of(program), numels, catalog(program, ops))


def test_caps_of_attention() -> None:
    # (n·V·exp(d·Q·K)) / (n·exp(d·Q·K)) with n = 6 keys, d = 5, an output of 2·1·5 = 10 elements.
    program = load_config("mha_incdec_papers", {"h": 2, "n": 6, "d": 5})
    caps = _caps(program)
    assert caps is not None
    out = math.prod(program.outputs[0].shape)
    q, k, v = ae.var("Q"), ae.var("K"), ae.var("V")
    e = ae.exp(ae.sum(5, ae.mul(q, k)))
    assert caps.cap(v) == 6 * out  # V is summed over the 6 keys, no more
    assert caps.cap(ae.sum(2, ae.mul(e, v))) == 3 * out  # a partial numerator: 3 keys' worth of sums left
    assert caps.cap(ae.sum(6, ae.mul(e, v))) == out  # the whole numerator: nothing left to reduce
    assert caps.cap(ae.mul(v, v)) == 0  # no output monomial holds V twice
    # A quotient's numerator bounds it; its denominator does not matter.
    assert caps.cap(ae.div(ae.sum(2, ae.mul(e, v)), ae.sum(6, e))) == 3 * out
    # exp(...) is also in the denominator and Q, K inside exp: the rule says nothing about them.
    assert caps.cap(e) is None and caps.cap(q) is None and caps.cap(ae.sum(5, ae.mul(q, k))) is None
    assert caps.admits(6 * out, v) and not caps.admits(6 * out + 1, v) and caps.admits(10**9, q)


def test_not_applied_with_add_or_concat() -> None:
    p = Program("add")
    x, y = p.input("X", (2, 3)), p.input("Y", (2, 3))
    p.output(p.exp(p.add(x, y)))
    assert _caps(p) is None
    q = Program("exp")
    q.output(q.exp(q.input("X", (2, 3))))
    assert _caps(q) is not None
    assert _caps(q, [Op.EXP, Op.ADD]) is None and _caps(q, [Op.EXP, Op.CONCAT]) is None
    assert _caps(q, [Op.EXP, Op.SUB]) is not None  # sub keeps monomials apart: see the module docstring
    assert (
        SearchContext(SearchSpec(program=q, expr_filter=False)).rules.element_caps is None
    )  # it speaks about A_eq outputs


def test_a_lone_maximum_says_nothing() -> None:
    # Stable attention's normal form has no max atom (exp(S − max S) is exp(S)·stab(S)): a split's maximum
    # m = max(7, S) reaches the output only as stab(S), so the rule must not cap it (it would cap it at 0).
    program = load_config("mha_incdec", {"b": 1, "h": 2, "s": 1, "n": 14, "d": 5})
    caps = _caps(program, [Op.TRANSPOSE, Op.MATMUL, Op.SCALE, Op.MAX, Op.SUB, Op.EXP, Op.DIV])
    assert caps is not None
    q, k, v = ae.var("Q"), ae.var("K"), ae.var("V")
    s = ae.sum(5, ae.mul(q, k))
    m = ae.max_r(7, s)
    assert caps.cap(m) is None and caps.cap(ae.max_r(2, m)) is None
    assert caps.cap(ae.add(s, m)) is None  # S − m: a lone maximum beside S
    out = math.prod(program.outputs[0].shape)
    assert caps.cap(v) == 14 * out  # V is still capped: summed over the 14 keys, no more
    assert caps.cap(ae.mul(m, v)) == 0  # a maximum beside another atom is no lone one: it stays, and no
    # output monomial holds a max atom


GQA = {"kv": 2, "g": 2, "n": 4, "d": 2}


@pytest.mark.parametrize(
    ("program", "kw"),
    [
        # 9.3 k states against 10.6 k
        (
            load_config("gqa_incdec_papers", GQA),
            {
                "max_block_ops": 6,
                "max_block_nodes": 6,
                "max_grid_dims": 1,
                "max_block_outputs": 2,
                "dims": load_dim_strategy("attention"),
            },
        ),
        # 64 k states against 93 k
        pytest.param(
            load_config("gqa_incdec_papers", GQA),
            {
                "max_block_ops": 6,
                "max_block_nodes": 6,
                "max_grid_dims": 2,
                "max_block_outputs": 2,
                "dims": load_dim_strategy("attention"),
            },
            marks=pytest.mark.slow,
        ),
        # 71 k states against 212 k
        pytest.param(
            load_config("gated_mlp", {"t": 3, "k": 4, "f": 5}),
            {"max_block_ops": 4, "max_grid_dims": 1},
            marks=pytest.mark.slow,
        ),
        # With sub in the op set (the rule applies since it only puts monomials side by side): 197 k states
        # against 246 k, 69 candidates, ~2 minutes.
        pytest.param(
            load_config("gqa_incdec_papers", GQA),
            {
                "max_block_ops": 6,
                "max_block_nodes": 6,
                "max_grid_dims": 1,
                "max_block_outputs": 2,
                "dims": load_dim_strategy("attention"),
                "ops": ("div", "exp", "matmul", "repeat", "scale", "sub", "sum"),
            },
            marks=pytest.mark.slow,
        ),
    ],
)
def test_the_rule_prunes_no_verified_candidate(
    program: Program, kw: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same search with the cap switched off (kernel tensors and block tensors alike) finds exactly the
    # same candidates and walks more states.
    spec = SearchSpec(program=program, max_kernel_ops=2, **kw)  # type: ignore[arg-type]
    with_rule, states_with = candidates_and_states(spec)
    monkeypatch.setattr(ElementCaps, "admits", lambda *a: True)
    without_rule, states_without = candidates_and_states(spec)
    assert with_rule == without_rule and with_rule
    assert states_with < states_without

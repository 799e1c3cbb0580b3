"""The occurrence budget: counts are A_eq invariants on add-free terms, and the rule prunes no equivalent µGraph."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from search_walk import candidates_and_states

from gensorage.exhaustive import SearchSpec
from gensorage.exhaustive.expr import abstract_expr as ae
from gensorage.exhaustive.expr.canon import Canon, Elem
from gensorage.exhaustive.opcatalog import catalog
from gensorage.exhaustive.rules import ruleset
from gensorage.exhaustive.rules.occurrences import OccurrenceBudget
from gensorage.exhaustive.walk import SearchContext
from gensorage.program import Program, load_config

NAMES = ("Q", "K", "V")


def _elem_count(e: Elem, inside: bool = True) -> tuple[int, ...]:
    """Variable occurrences read off a canonical normal form (no add: one monomial per fraction); ``inside``
    False: an atom's arguments (of exp, sqrt) are not entered."""
    out = [0, 0, 0]
    for den, poly in e.parts:
        if den is not None:
            out = [a + b for a, b in zip(out, _elem_count(den, inside), strict=True)]
        for (_, atoms), mult in poly:
            for atom in atoms:
                got = [1 if atom.kind == "var" and atom.name == n else 0 for n in NAMES]
                for arg in atom.args if inside else ():
                    got = [a + b for a, b in zip(got, _elem_count(arg), strict=True)]
                out = [a + mult * b for a, b in zip(out, got, strict=True)]
    return tuple(out)


add_free = st.recursive(
    st.sampled_from(NAMES).map(ae.var),
    lambda inner: st.one_of(
        st.tuples(inner, inner).map(lambda ab: ae.mul(*ab)),
        st.tuples(inner, inner).map(lambda ab: ae.div(*ab)),
        inner.map(ae.exp),
        inner.map(ae.sqrt),
        st.tuples(st.integers(1, 6), inner).map(lambda kt: ae.sum(*kt)),
    ),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(add_free)
def test_counts_are_those_of_the_canonical_normal_form(t: ae.Term) -> None:
    # The oracle decides A_eq by normal forms, so counts read off the normal form are class invariants; the
    # budget counts the term itself, which must agree.
    occ = OccurrenceBudget(NAMES, [])
    assert occ.count(t) == _elem_count(Canon().nf(t))


@settings(max_examples=200, deadline=None)
@given(add_free, add_free)
def test_an_operator_adds_its_operands_counts(a: ae.Term, b: ae.Term) -> None:
    occ = OccurrenceBudget(NAMES, [])
    both = tuple(x + y for x, y in zip(occ.count(a), occ.count(b), strict=True))
    assert occ.count(ae.mul(a, b)) == occ.count(ae.div(a, b)) == both
    assert occ.count(ae.sum(4, ae.mul(a, a))) == tuple(2 * x for x in occ.count(a))


def test_counts_of_attention() -> None:
    program = load_config("mha_incdec_papers", {"h": 2, "n": 6, "d": 5})
    occ = OccurrenceBudget.for_search([t.name for t in program.inputs], ae.expr_of(program), catalog(program))
    assert occ is not None and dict(zip(occ.index, occ.target, strict=True)) == {"Q": 2, "K": 2, "V": 1}
    assert occ.fits(occ.target, []) and not occ.fits(occ.target, [ae.var("V")])


def test_not_applied_where_add_or_concat_can_appear() -> None:
    p = Program("add")
    x, y = p.input("X", (2, 3)), p.input("Y", (2, 3))
    p.output(p.exp(p.add(x, y)))
    assert OccurrenceBudget.for_search(["X", "Y"], ae.expr_of(p), catalog(p)) is None
    q = Program("exp")
    q.output(q.exp(q.input("X", (2, 3))))
    assert OccurrenceBudget.for_search(["X"], ae.expr_of(q), catalog(q)) is not None
    from gensorage.opset import Op

    assert OccurrenceBudget.for_search(["X"], ae.expr_of(q), catalog(q, [Op.EXP, Op.SUB])) is None
    assert (
        SearchContext(SearchSpec(program=q, expr_filter=False)).rules.occurrences is None
    )  # it speaks about A_eq outputs


def _exp_matmul() -> Program:
    p = Program("exp_matmul")
    p.output(p.matmul(p.exp(p.input("X", (2, 3))), p.input("W", (3, 4))))
    return p


@pytest.mark.parametrize(
    "program, kernels, block_ops",
    [
        (_exp_matmul(), 2, 1),
        pytest.param(_exp_matmul(), 3, 1, marks=pytest.mark.slow),  # 40 s: 11.6 k states against 149 k
    ],
)
def test_the_rule_prunes_no_verified_candidate(
    program: Program, kernels: int, block_ops: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same search with the rule switched off finds exactly the same candidates and walks more states.
    spec = SearchSpec(program=program, max_kernel_ops=kernels, max_block_ops=block_ops, max_grid_dims=1)

    with_rule, states_with = candidates_and_states(spec)
    monkeypatch.setattr(ruleset.OccurrenceBudget, "for_search", classmethod(lambda cls, *a: None))
    without_rule, states_without = candidates_and_states(spec)
    assert with_rule == without_rule and with_rule
    assert states_with < states_without


# ------------------------------------------------------------------------------ outside marks


@settings(max_examples=300, deadline=None)
@given(add_free)
def test_outside_counts_are_those_of_the_canonical_normal_form(t: ae.Term) -> None:
    occ = OccurrenceBudget(NAMES, [])
    assert occ.outside(t) == _elem_count(Canon().nf(t), inside=False)


def _attention_budget() -> OccurrenceBudget:
    program = load_config("mha_incdec_papers", {"h": 2, "n": 6, "d": 5})
    occ = OccurrenceBudget.for_search([t.name for t in program.inputs], ae.expr_of(program), catalog(program))
    assert occ is not None
    return occ


def test_outside_counts_of_attention() -> None:
    occ = _attention_budget()
    assert dict(zip(occ.index, occ.target_outside, strict=True)) == {"Q": 0, "K": 0, "V": 1}
    assert occ.mark_moves == ((1, 1, 0),)  # exp's argument has Q and K outside marks


def test_completable_last_kernels_of_attention() -> None:
    occ = _attention_budget()
    q, k, v = ae.var("Q"), ae.var("K"), ae.var("V")
    s = ae.sum(5, ae.mul(q, k))
    e = ae.exp(s)
    # Softmax then V from the scores: they are read twice (numerator and denominator), so one exp operator may
    # make both exp nodes; from their exp, none is needed.
    assert occ.completable([v, s], [v, s]) == 1
    assert occ.completable([v, e], [v, e]) == 0
    # E is there, but the scores beside it must still go under an exp of their own.
    assert occ.completable([v, e, s], [v, e, s]) == 1
    # A raw Q beside V and E: Q must go under an exp whose argument needs a K outside marks; none has one.
    assert occ.completable([q, v, e], [q, v, e]) is None
    # K beside partial scores: reading anything again overshoots Q's or K's count.
    assert occ.completable([v, k, ae.sum(2, ae.mul(q, k))], [v, k, ae.sum(2, ae.mul(q, k))]) is None
    # Two copies of the scores use the whole count: two exp operators are needed, one per copy.
    assert occ.completable([v, s, s], [v, s]) == 2
    # Too much V.
    assert occ.completable([v, v, s], [v, s]) is None
    # A scaled tensor ends under a mark (only exp, sqrt or an activation may read it): scaled scores may, a
    # scaled V may not (V occurs outside every exp in the output).
    assert occ.completable([v, s], [v, s], under_marks=[s]) == 1
    assert occ.completable([v, s], [v, s], under_marks=[v]) is None


GQA = {"kv": 2, "g": 2, "n": 4, "d": 2}


@pytest.mark.parametrize(
    ("program", "grid"),
    [
        (load_config("gqa_incdec_papers", GQA), 1),  # 10.7 k states against 11.3 k
        pytest.param(
            load_config("gqa_incdec_papers", GQA), 2, marks=pytest.mark.slow
        ),  # 60 s: 93.1 k against 102.0 k
    ],
)
def test_the_outside_rule_prunes_no_verified_candidate(
    program: Program, grid: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A last kernel whose outputs cannot have the program's counts outside marks (or need more exp operators
    # than it has room for) is pruned: the same candidates with and without the rule, fewer states with it.
    from gensorage.exhaustive.dim_strategy import load_dim_strategy

    spec = SearchSpec(
        program=program,
        max_kernel_ops=2,
        max_block_ops=6,
        max_block_nodes=6,
        max_grid_dims=grid,
        max_block_outputs=2,
        dims=load_dim_strategy("attention"),
    )
    with_rule, states_with = candidates_and_states(spec)
    monkeypatch.setattr(OccurrenceBudget, "completable", lambda *a: 0)  # at last-kernel headers and blocks
    without_rule, states_without = candidates_and_states(spec)
    assert with_rule == without_rule and with_rule
    assert states_with < states_without

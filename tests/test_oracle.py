"""The subexpression oracle: paper examples, Theorem 1's prefix property, LoRA, pruning, timeouts, caching, and
agreement of the normal-form procedure with Z3 on Table 2's axioms."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gensorage.errors import ProgramError
from gensorage.exhaustive.expr import abstract_expr as ae
from gensorage.exhaustive.expr.abstract_expr import Term, expr_of
from gensorage.exhaustive.expr.axioms import Theory, Z3Subexpr
from gensorage.exhaustive.expr.canon import Canon, Undecided, divide_all, divisors
from gensorage.exhaustive.expr.expr_arith import ExprArith, ExprValue
from gensorage.exhaustive.expr.oracle import SubexprOracle
from gensorage.opset import Op, freeze_attrs
from gensorage.program import Program
from gensorage.ugraph import examples
from gensorage.ugraph.evaluate import evaluate
from gensorage.ugraph.ir import (
    Accumulator,
    BlockGraph,
    BlockOp,
    GraphDefinedOp,
    InputIterator,
    KernelGraph,
    OutputSaver,
    Ref,
    TensorSpec,
)

X, Y, Z, W, V = (ae.var(n) for n in "XYZWV")


def keeps(targets: list[Term], *queries: Term) -> list[bool]:
    o = SubexprOracle(targets)
    return [o.is_subexpr(q) for q in queries]


class Recording(ExprArith):
    """An ExprArith that remembers the term of every value it produces: every edge and tile, and each
    accumulator's final state (its states after fewer iterations are no µGraph edge: Table 1 defines the
    accumulator's expression over the whole loop)."""

    def __init__(self) -> None:
        self._seen: list[Term] = []
        self._acc: dict[int, ExprValue] = {}

    @property
    def seen(self) -> list[Term]:
        return self._seen + [a.term for a in self._acc.values()]

    def accumulate(self, acc: ExprValue | None, x: ExprValue, kind: Any) -> ExprValue:
        out = super().accumulate(acc, x, kind)
        if acc is not None:
            self._acc.pop(id(acc), None)
        self._acc[id(out)] = out
        return out


def _recorded(name: str) -> Callable[..., Any]:
    base = getattr(ExprArith, name)

    def method(self: Recording, *args: Any) -> Any:
        out = base(self, *args)
        self._seen.append(out.term)
        return out

    return method


for _name in (
    "add",
    "sub",
    "mul",
    "div",
    "exp",
    "sqrt",
    "scale",
    "activation",
    "matmul",
    "reduce_sum",
    "reduce_max",
    "reshape",
    "repeat",
    "concat",
    "slice",
):
    setattr(Recording, _name, _recorded(_name))


# ----------------------------------------------------------------------------------------------- the paper


def test_paper_example_xz_plus_yz() -> None:
    """§4.3: for X·Z + Y·Z a prefix computing X·Y is pruned, one computing X + Y is kept."""
    p = Program("xz_yz")
    x, y, z = p.input("X", (8, 8)), p.input("Y", (8, 8)), p.input("Z", (8, 8))
    p.output(p.add(p.matmul(x, z), p.matmul(y, z)))
    target = expr_of(p)
    o = SubexprOracle(target)
    assert o.is_subexpr(ae.sum(8, ae.mul(X, Y))) is False  # X·Y
    assert o.is_subexpr(ae.add(X, Y)) is True  # X + Y
    assert o.is_subexpr(ae.sum(8, ae.mul(ae.add(X, Y), Z))) is True  # (X + Y)·Z, the whole program
    assert o.is_subexpr(ae.sum(4, ae.mul(X, Z))) is True  # a k-split partial product
    assert o.is_subexpr(ae.sum(3, ae.mul(X, Z))) is False  # 3 does not divide 8
    assert o.is_subexpr(ae.exp(X)) is False
    assert o.stats.z3_calls == 0


def _fig6() -> tuple[Program, KernelGraph]:
    """A Fig. 6-style subgraph of attention: O = exp(I1 I2) / Σ exp(I1 I2), 64x64, one graph-defined op.

    Grid 4 over I1's rows, a 4-iteration loop over the inner dim (tiles of 16), then exp, row sum, div.
    """
    p = Program("fig6")
    i1, i2 = p.input("I1", (64, 64)), p.input("I2", (64, 64))
    e = p.exp(p.matmul(i1, i2))
    p.output(p.div(e, p.sum(e, dim=1)))
    r = Ref
    nodes = (
        InputIterator(0, (0,), 1),  # #0 I1 tile [16, 16]
        InputIterator(1, (None,), 0),  # #1 I2 tile [16, 64]
        BlockOp(Op.MATMUL, (r(0), r(1))),  # #2 [16, 64]
        Accumulator(r(2)),  # #3
        BlockOp(Op.EXP, (r(3),)),  # #4
        BlockOp(Op.SUM, (r(4),), freeze_attrs({"dim": 1, "keepdim": True})),  # #5
        BlockOp(Op.DIV, (r(4), r(5))),  # #6
        OutputSaver(r(6), (0,)),
    )
    op = GraphDefinedOp(BlockGraph((4,), 4, nodes), (r(0), r(1)))
    return p, KernelGraph((TensorSpec("I1", (64, 64)), TensorSpec("I2", (64, 64))), (op,), (r(2),))


def test_fig6_attention_subgraph_expressions() -> None:
    prog, graph = _fig6()
    i1, i2 = ae.var("I1"), ae.var("I2")
    rec = Recording()
    (out,) = evaluate(graph, rec, [ExprValue((64, 64), i1), ExprValue((64, 64), i2)])
    tile = ae.sum(16, ae.mul(i1, i2))
    acc = ae.sum(64, ae.mul(i1, i2))  # sum(4, sum(16, .)) = sum(64, .)
    e = ae.exp(acc)
    assert {tile, acc, e, ae.sum(64, e)} <= set(rec.seen)
    assert out.term is ae.div(e, ae.sum(64, e))
    assert expr_of(prog) == [out.term]
    o = SubexprOracle(expr_of(prog))
    assert all(o.is_subexpr(t) for t in rec.seen)
    assert not o.is_subexpr(ae.sum(64, ae.mul(ae.exp(i1), i2)))  # exp in the wrong place


# ----------------------------------------------------------------------------------------------- Theorem 1


# FlashDecoding's stable combine rescales each split by exp(m_i − M): its partials (relative to the splits'
# maxima) and the rescale are kept by the stabiliser laws (expr/axioms.py).
@pytest.mark.parametrize("name", [*sorted(examples.EXAMPLES), "flash_attention2", "flash_decoding_stable"])
def test_every_edge_of_the_example_ugraphs_is_kept(name: str) -> None:
    """GQA, RMSNorm, LoRA, FlashAttention-2, ...: every tile, partial and edge the literal evaluation computes
    is kept."""
    prog, graph = {**examples.EXAMPLES, **examples.ONLINE_EXAMPLES}[name]()
    rec = Recording()
    evaluate(graph, rec, [ExprValue(s.shape, ae.var(s.name)) for s in graph.inputs])
    o = SubexprOracle(expr_of(prog))
    pruned = [str(t) for t in dict.fromkeys(rec.seen) if not o.is_subexpr(t)]
    assert not pruned
    assert o.stats.z3_calls == 0


def test_stable_softmax_split_partials_and_rescale_kept_unrelated_pruned() -> None:
    """Stable attention at decode: a split's maximum, its partials relative to it and the rescale
    ``exp(m_i − M)`` are subexpressions (by the stabiliser laws), and Z3 proves each from the axioms; ``exp``
    of the wrong things still is none."""
    n, s, d = 24, 3, 4
    q, k, v = ae.var("Q"), ae.var("K"), ae.var("V")
    scores = ae.sum(d, ae.mul(q, k))
    big_m, m_i = ae.max_r(n, scores), ae.max_r(n // s, scores)
    e = ae.exp(ae.add(scores, big_m))
    target = ae.sum(n, ae.mul(v, ae.div(e, ae.sum(n, e))))
    e_i = ae.exp(ae.add(scores, m_i))
    o_i, l_i = ae.sum(n // s, ae.mul(e_i, v)), ae.sum(n // s, e_i)
    w = ae.exp(ae.add(m_i, big_m))
    kept = [
        m_i,
        ae.max_r(s, m_i),
        ae.add(scores, m_i),
        ae.add(m_i, big_m),
        e_i,
        o_i,
        l_i,
        w,
        ae.mul(o_i, w),
        ae.sum(s, ae.mul(l_i, w)),
        ae.div(ae.sum(s, ae.mul(o_i, w)), ae.sum(s, ae.mul(l_i, w))),
    ]
    # exp(scores) is kept: exp(S)·stab(S) has it as a factor (the unstable form, rescaled afterwards)
    pruned = [ae.exp(v), ae.exp(q), ae.mul(e_i, scores), ae.exp(ae.add(v, m_i)), ae.add(v, m_i)]
    o = SubexprOracle([target])
    assert [o.is_subexpr(t) for t in kept] == [True] * len(kept)
    assert [o.is_subexpr(t) for t in pruned] == [False] * len(pruned)
    assert o.stats.z3_calls == 0
    # Z3 proves those that need no split sum (it cannot invent sum(3, .) to write sum(24, x) = sum(3, sum(8, x)))
    z = Z3Subexpr([target], timeout_ms=5000)
    for t in [*kept[:5], w]:
        assert z.entails(t) is True, str(t)
    # the combine's output equals the program's under A_eq
    c = Canon()
    assert c.nf(kept[-1]) is c.nf(target)


_UNARY = ("exp", "sqrt", "relu", "silu", "gelu")
_BINARY = ("add", "sub", "mul", "div", "matmul")


def _random_program(rng: random.Random, steps: int) -> Program:
    p = Program("rand")
    pool = [p.input(n, (4, 4)) for n in ("A", "B", "C")]
    pool.append(p.input("D", (4, 1)))
    for _ in range(steps):
        for _attempt in range(8):
            kind = rng.random()
            try:
                if kind < 0.3:
                    t = getattr(p, rng.choice(_UNARY))(rng.choice(pool))
                elif kind < 0.75:
                    t = getattr(p, rng.choice(_BINARY))(rng.choice(pool), rng.choice(pool))
                elif kind < 0.85:
                    x = rng.choice(pool)
                    t = p.sum(x, dim=rng.randrange(x.ndim))
                elif kind < 0.9:
                    t = p.scale(rng.choice(pool), 0.5)
                elif kind < 0.95:
                    a, b = rng.choice(pool), rng.choice(pool)
                    t = p.concat([a, b], dim=rng.randrange(a.ndim))
                else:
                    x = rng.choice(pool)
                    t = p.repeat(x, 0, 2) if rng.random() < 0.5 else p.reshape(x, (x.shape[1], x.shape[0]))
            except ProgramError:
                continue
            pool.append(t)
            break
    return p


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.integers(1, 9))
def test_theorem1_prefix_property_on_random_programs(seed: int, steps: int) -> None:
    """Every intermediate tensor's expression is a subexpression of the output's (and of each consumer's)."""
    p = _random_program(random.Random(seed), steps)
    nodes = p.nodes
    for n in nodes:
        p.output(p.tensor(n.id))
    values = p.evaluate(ExprArith(), [ExprValue(t.shape, ae.var(t.name)) for t in p.inputs])
    assert [v.shape for v in values] == [n.shape for n in nodes]  # the arithmetic's shapes are the program's
    terms = [v.term for v in values]
    assert terms == expr_of(p)
    ancestors = {nodes[-1].id}
    for n in reversed(nodes):
        if n.id in ancestors:
            ancestors.update(n.inputs)
    o = SubexprOracle([terms[-1]])
    assert all(o.is_subexpr(terms[i]) for i in ancestors)
    for n in nodes:  # each op's inputs are subexpressions of its output
        if n.op is not None:
            local = SubexprOracle([terms[n.id]])
            assert all(local.is_subexpr(terms[i]) for i in n.inputs)


# ----------------------------------------------------------------------------------------------- LoRA, pruning


def test_lora_concat_matmul_equivalence() -> None:
    prog, graph = examples.lora()
    (pt,), (gt,) = expr_of(prog), expr_of(graph)
    assert pt is gt
    canon = Canon()
    x, w, a, b = (ae.var(n) for n in "XWAB")
    m, k, n, r = 4, 8, 12, 2
    ar = ExprArith()
    xv, wv, av, bv = (ExprValue(s, t) for s, t in (((m, k), x), ((k, n), w), ((k, r), a), ((r, n), b)))
    fused = ar.matmul(ar.concat([xv, ar.matmul(xv, av)], 1), ar.concat([wv, bv], 0))
    assert canon.nf(fused.term) is canon.nf(pt)
    o = SubexprOracle([pt])
    xa = ae.sum(k, ae.mul(x, a))
    assert o.is_subexpr(ae.cat(x, xa)) and o.is_subexpr(ae.cat(w, b))  # the concatenations themselves
    assert not o.is_subexpr(ae.cat(x, ae.exp(w)))  # a part that is no subexpression sinks the cat
    assert not o.is_subexpr(ae.sum(k, ae.mul(w, b)))


def test_rmsnorm_pieces_kept_and_unrelated_pruned() -> None:
    prog, _ = examples.rmsnorm_matmul()
    (target,) = expr_of(prog)
    x, g, w = ae.var("X"), ae.var("G"), ae.var("W")
    o = SubexprOracle([target])
    sq = ae.sum(16, ae.mul(x, x))
    kept = [
        sq,
        ae.sum(4, ae.mul(x, x)),
        ae.sqrt(sq),
        ae.mul(x, g),
        ae.sum(16, ae.mul(ae.mul(x, g), w)),
        ae.div(ae.mul(x, g), ae.sqrt(sq)),
        ae.div(ae.sum(4, ae.mul(w, ae.mul(x, g))), ae.sqrt(sq)),
        # the abstraction cannot tell these from useful pieces: (X W) * G and (X / sqrt) * G W re-associate
        ae.sum(16, ae.mul(x, w)),
        ae.div(x, ae.sqrt(sq)),
    ]
    pruned = [
        ae.exp(x),
        ae.sqrt(x),
        ae.mul(ae.sqrt(sq), x),
        ae.div(ae.sqrt(sq), x),
        ae.sum(16, ae.mul(g, g)),
        ae.sum(16, ae.mul(w, w)),
        ae.sqrt(ae.sum(4, ae.mul(x, x))),
    ]
    assert [o.is_subexpr(t) for t in kept] == [True] * len(kept)
    assert [o.is_subexpr(t) for t in pruned] == [False] * len(pruned)


def test_gqa_pieces_kept_and_unrelated_pruned() -> None:
    prog, _ = examples.gqa()
    (target,) = expr_of(prog)  # kv_len 24, head_dim 8
    q, k, v = ae.var("Q"), ae.var("K"), ae.var("V")
    s = ae.sum(8, ae.mul(q, k))
    e = ae.exp(s)
    o = SubexprOracle([target])
    kept = [s, e, ae.sum(4, e), ae.sum(12, ae.mul(e, v)), ae.div(e, ae.sum(24, e)), ae.sum(3, ae.sum(4, e))]
    pruned = [
        ae.sum(8, ae.mul(q, v)),
        ae.exp(q),
        ae.sum(24, ae.mul(k, v)),
        ae.sum(5, e),
        ae.exp(e),
        ae.div(ae.sum(24, ae.mul(e, v)), ae.sum(12, e)),
        ae.sqrt(s),
        ae.fn("silu", s),
        ae.max_r(24, e),
    ]
    assert [o.is_subexpr(t) for t in kept] == [True] * len(kept)
    assert [o.is_subexpr(t) for t in pruned] == [False] * len(pruned)
    assert o.stats.timeouts == 0


def test_multiple_targets_keep_pieces_of_any() -> None:
    o = SubexprOracle([ae.exp(X), ae.sqrt(Y)])
    assert o.is_subexpr(X) and o.is_subexpr(Y)
    assert not o.is_subexpr(ae.cat(X, Y))  # each part must be below the same target
    assert not o.is_subexpr(ae.mul(X, Y))


# ----------------------------------------------------------------------------------------------- timeouts, cache


def test_timeout_never_prunes() -> None:
    """A query Z3 cannot settle within its limit is kept and counted (here: Z3 alone, 1 ms)."""
    target = ae.add(ae.sum(8, ae.mul(X, Z)), ae.sum(8, ae.mul(Y, Z)))
    o = SubexprOracle([target], timeout_ms=1, use_fast_path=False)
    assert o.decide(ae.sum(8, ae.mul(X, Y))) is None  # not entailed, but Z3 can only give up
    assert o.is_subexpr(ae.sum(8, ae.mul(X, Y))) is True
    assert o.stats.timeouts == 1 and o.stats.z3_calls == 1 and o.stats.cache_hits == 1


def test_undecided_by_normal_forms_goes_to_z3_and_is_kept() -> None:
    """Division by a sum of fractions over different denominators is left to Z3; the answer keeps the prefix."""
    den = ae.add(ae.div(X, Y), ae.div(Z, W))
    q = ae.div(V, den)
    target = ae.div(V, ae.mul(den, ae.var("U")))
    o = SubexprOracle([target], timeout_ms=500)
    assert o.entails_fast(q) is None
    assert o.is_subexpr(q) is True  # entailed (d = U); Z3 proves it or times out — either way kept
    assert o.stats.z3_calls == 1


def test_a_monomial_over_unlike_monomials_is_decided_without_z3() -> None:
    """The split-KV decode search's queries divide the program's one-monomial denominator by ``stab·(S + m)``:
    no quotient exists (nothing cancels, and without ``stab`` atoms the divisor's monomials differ), so the
    normal forms refute them, where they used to go to Z3 and time out (seconds each)."""
    n, d = 14, 5
    q, k, v = ae.var("Q"), ae.var("K"), ae.var("V")
    scores = ae.sum(d, ae.mul(q, k))
    big_m = ae.max_r(n, scores)
    e = ae.exp(ae.add(scores, big_m))
    target = ae.sum(n, ae.mul(v, ae.div(e, ae.sum(n, e))))
    dead = ae.div(ae.div(ae.mul(v, ae.exp(big_m)), ae.exp(big_m)), ae.add(scores, big_m))
    o = SubexprOracle([target])
    assert o.entails_fast(dead) is False
    assert o.is_subexpr(dead) is False and o.stats.z3_calls == 0


_STAB_POLYS = st.lists(
    st.tuples(st.integers(1, 3), st.lists(st.sampled_from(["X", "Y", "sZ", "sW"]), max_size=3)),
    min_size=1,
    max_size=3,
)


def _poly(c: Canon, monos: list[tuple[int, list[str]]]) -> Any:
    """A polynomial of the canonical model over X, Y and the stab atoms of Z and W."""
    out = None
    for coef, names in monos:
        mono = None
        for name in names or ["X"]:
            f = c.of_atom(c.atom("stab", (c.nf(ae.var(name[1])),))) if name[0] == "s" else c.nf(ae.var(name))
            mono = f if mono is None else c.mul(mono, f)
        mono = c.sum(coef, mono) if coef > 1 else mono
        out = mono if out is None else c.add(out, mono)
    return out


@settings(max_examples=200, deadline=None)
@given(_STAB_POLYS, _STAB_POLYS)
@example([(1, ["X"]), (1, ["X", "sZ"])], [(1, ["sZ"])])  # two monomials over which one monomial divides
def test_divide_all_never_refutes_a_product(p: list[Any], q: list[Any]) -> None:
    """``divide_all`` says "no quotient" only where there is none: for ``num = den·q`` it is undecided or lists
    a quotient (idempotent ``stab`` atoms make ``(X + stab·X)·stab = 2·stab·X``, one monomial over two)."""
    c = _CANON
    den, quo = _poly(c, p), _poly(c, q)
    got = divide_all(c, c.mul(den, quo), den)
    assert isinstance(got, Undecided) or got


def test_a_normal_form_too_big_to_expand_goes_to_z3() -> None:
    """(X+Y+Z+W)^64 has ~48k monomials: beyond MAX_MONOMIALS the query is left to Z3 (and kept if it gives up)."""
    q = ae.add(ae.add(X, Y), ae.add(Z, W))
    for _ in range(6):
        q = ae.mul(q, q)
    o = SubexprOracle([ae.exp(ae.mul(X, Y))], timeout_ms=50)
    assert o.entails_fast(q) is None
    assert o.is_subexpr(q) is True
    assert o.stats.z3_calls == 1 and o.stats.decided_fast == 0


def test_divisors() -> None:
    assert divisors(1) == [1] and divisors(12) == [1, 2, 3, 4, 6, 12] and divisors(49) == [1, 7, 49]


def test_cache_hits_by_term_and_by_normal_form() -> None:
    target = ae.add(ae.sum(8, ae.mul(X, Z)), ae.sum(8, ae.mul(Y, Z)))
    o = SubexprOracle([target])
    q1 = ae.mul(ae.add(X, Y), Z)
    q2 = ae.add(ae.mul(X, Z), ae.mul(Y, Z))  # A_eq-equal, a different term
    assert o.is_subexpr(q1) and o.is_subexpr(q1) and o.is_subexpr(q2)
    assert (o.queries, o.cache_hits, o.stats.decided_fast, o.timeouts) == (3, 2, 1, 0)
    assert o.solve_time_s >= 0.0


def test_constructor_validation() -> None:
    with pytest.raises(ValueError):
        SubexprOracle([])
    with pytest.raises(ValueError):
        SubexprOracle([X], timeout_ms=0)


# ----------------------------------------------------------------------------------------------- vs Z3 / axioms

_LEAVES = st.sampled_from([X, Y, Z])


def _extend(kids: st.SearchStrategy[Term]) -> st.SearchStrategy[Term]:
    sizes = st.sampled_from([2, 3, 4, 6])
    return st.one_of(
        st.tuples(kids, kids).map(lambda p: ae.add(*p)),
        st.tuples(kids, kids).map(lambda p: ae.mul(*p)),
        st.tuples(kids, kids).map(lambda p: ae.div(*p)),
        st.tuples(sizes, kids).map(lambda p: ae.sum(*p)),
        kids.map(ae.exp),
        kids.map(ae.sqrt),
        kids.map(lambda t: ae.fn("relu", t)),
        st.tuples(sizes, kids).map(lambda p: ae.max_r(*p)),
        st.tuples(kids, kids).map(lambda p: ae.cat(*p)),
        # a max-subtracting exp, as a softmax and its rescales write it (the stabiliser laws)
        st.tuples(kids, sizes, kids).map(lambda p: ae.exp(ae.add(p[0], ae.max_r(p[1], p[2])))),
    )


TERMS = st.recursive(_LEAVES, _extend, max_leaves=7)


@st.composite
def target_and_query(draw: st.DrawFn) -> tuple[Term, Term]:
    t = draw(TERMS)
    if draw(st.booleans()):
        q = draw(st.sampled_from(list(t.subterms())))  # often entailed, sometimes after a size change
        if draw(st.booleans()):
            q = ae.sum(draw(st.sampled_from([2, 3])), q)
    else:
        q = draw(TERMS)
    return t, q


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(target_and_query())
def test_normal_forms_agree_with_z3(tq: tuple[Term, Term]) -> None:
    """Whenever Z3 answers (unsat = entailed, sat = refuted) the normal-form procedure gives the same answer."""
    t, q = tq
    fast = SubexprOracle([t]).entails_fast(q)
    z = Z3Subexpr([t], timeout_ms=60).entails(q)
    if z is not None:
        assert fast is z


@pytest.mark.slow
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(target_and_query())
def test_normal_forms_agree_with_z3_many(tq: tuple[Term, Term]) -> None:
    t, q = tq
    fast = SubexprOracle([t]).entails_fast(q)
    z = Z3Subexpr([t], timeout_ms=200).entails(q)
    if z is not None:
        assert fast is z


_CANON = Canon()
SIZES = st.integers(-3, 6)


@settings(max_examples=150, deadline=None)
@given(TERMS, TERMS, TERMS, SIZES, SIZES)
def test_canonical_model_satisfies_a_eq(x: Term, y: Term, z: Term, i: int, j: int) -> None:
    """Every A_eq axiom instance (all integers) holds in the model, so different normal forms are not A_eq-equal."""
    c = _CANON
    nx, ny, nz = c.nf(x), c.nf(y), c.nf(z)
    add, mul, div, sm = c.add, c.mul, c.div, c.sum
    assert add(nx, ny) is add(ny, nx) and mul(nx, ny) is mul(ny, nx)
    assert add(nx, add(ny, nz)) is add(add(nx, ny), nz)
    assert mul(nx, mul(ny, nz)) is mul(mul(nx, ny), nz)
    assert add(mul(nx, nz), mul(ny, nz)) is mul(add(nx, ny), nz)
    assert add(div(nx, nz), div(ny, nz)) is div(add(nx, ny), nz)
    assert mul(nx, div(ny, nz)) is div(mul(nx, ny), nz)
    assert div(div(nx, ny), nz) is div(nx, mul(ny, nz))
    assert sm(1, nx) is nx
    assert sm(i, sm(j, nx)) is sm(i * j, nx)
    assert sm(i, add(nx, ny)) is add(sm(i, nx), sm(i, ny))
    assert sm(i, mul(nx, ny)) is mul(sm(i, nx), ny)
    assert sm(i, div(nx, ny)) is div(sm(i, nx), ny)
    if i > 0 and j > 0:
        assert c.max_r(i, c.max_r(j, nx)) is c.max_r(i * j, nx)
    assert c.cat([nx, c.cat([ny, nz])]) is c.cat([c.cat([nx, ny]), nz]) and c.cat([nx, nx]) is nx
    # the stabiliser laws (sizes >= 2: max(1, y) is y)
    if i >= 2:
        stab = c.of_atom(c.atom("stab", (ny,)))
        my = c.max_r(i, ny)
        if ny.atom is None or ny.atom.kind != "max":  # (a max's base is its own argument: max(i, max(j, y)))
            assert c.exp(add(nx, my)) is mul(c.exp(nx), stab)
            assert c.exp(my) is stab
            assert mul(stab, stab) is stab


@settings(max_examples=120, deadline=None)
@given(TERMS, TERMS, st.integers(2, 6))
def test_a_sub_instances_are_kept(x: Term, y: Term, i: int) -> None:
    """Each A_sub axiom (and extension) instance holds: the relation contains the least one."""
    for target, sub in [
        (ae.add(x, y), x),
        (ae.add(x, y), y),
        (ae.mul(x, y), x),
        (ae.mul(x, y), y),
        (ae.div(x, y), x),
        (ae.div(x, y), y),
        (ae.exp(x), x),
        (ae.sum(i, x), x),
        (x, x),
        (ae.sqrt(x), x),
        (ae.fn("gelu", x), x),
        (ae.max_r(i, x), x),
        (ae.cat(x, y), x),
    ]:
        assert SubexprOracle([target]).entails_fast(sub) is True, (str(sub), str(target))
    # the concatenation rule: x ⊑ add(x, y) and y ⊑ add(x, y), so cat(x, y) ⊑ add(x, y)
    assert SubexprOracle([ae.add(x, y)]).entails_fast(ae.cat(x, y)) is True


_CONTEXTS: list[Callable[[Term, Term, int], Term]] = [
    lambda t, o, i: ae.add(t, o),
    lambda t, o, i: ae.mul(o, t),
    lambda t, o, i: ae.div(t, o),
    lambda t, o, i: ae.div(o, t),
    lambda t, o, i: ae.sum(i, t),
    lambda t, o, i: ae.exp(t),
    lambda t, o, i: ae.sqrt(t),
    lambda t, o, i: ae.max_r(i, t),
    lambda t, o, i: ae.cat(o, t),
]


@settings(max_examples=120, deadline=None)
@given(TERMS, st.lists(st.tuples(st.integers(0, len(_CONTEXTS) - 1), TERMS, st.integers(2, 4)), max_size=4))
def test_transitivity_through_context_chains(a: Term, chain: list[tuple[int, Term, int]]) -> None:
    t = a
    for c, other, i in chain:
        t = _CONTEXTS[c](t, other, i)
    assert SubexprOracle([t]).entails_fast(a) is True


def test_z3_encoding_proves_a_distributed_prefix() -> None:
    th = Theory()
    # A_sub: sqrt, the six unary functions (relu, silu, gelu, tanh, log, clamp), max, cat twice
    assert len(th.a_eq()) == 13 + 5 + 3 and len(th.a_sub()) == 8 + 10 + 2
    z = Z3Subexpr([ae.add(ae.sum(8, ae.mul(X, Z)), ae.sum(8, ae.mul(Y, Z)))], timeout_ms=2000)
    assert z.entails(ae.add(X, Y)) is True
    assert z.entails(ae.mul(ae.add(X, Y), Z)) is True
    assert z.entails(ae.sum(8, ae.mul(ae.add(Y, X), Z))) is True


def test_z3_declares_new_functions_on_the_fly() -> None:
    z = Z3Subexpr([ae.fn("softplus", X)], timeout_ms=2000)
    assert z.entails(X) is True
    assert math.isfinite(z.timeout_ms)

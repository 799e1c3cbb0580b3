"""The first verification tier: Z_M61 arithmetic, uninterpreted functions, max as a multiset function, tiers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gensorage.program import Program
from gensorage.ugraph.examples import EXAMPLES
from gensorage.verify import UninterpretedArith, blas, equivalent, float_check, plan
from gensorage.verify import mersenne as m61
from gensorage.verify.mersenne import M61
from gensorage.verify.shared import SharedArith
from gensorage.verify.uninterpreted import UFValue

# ------------------------------------------------------------------------------------------ Z_M61 arithmetic

# Residues drawn by magnitude: near 0, near 2^31 and 2^32 (the split points), near p, and anywhere.
residue = st.one_of(
    st.integers(0, 2**16),
    st.integers(2**31 - 2**10, 2**32 + 2**10),
    st.integers(M61 - 2**16, M61 - 1),
    st.integers(0, M61 - 1),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(residue, residue), min_size=1, max_size=16))
def test_elementwise_ops_match_python_integers(pairs: list[tuple[int, int]]) -> None:
    a = np.array([x for x, _ in pairs], dtype=np.uint64)
    b = np.array([y for _, y in pairs], dtype=np.uint64)
    for op, ref in ((m61.add, int.__add__), (m61.sub, int.__sub__), (m61.mul, int.__mul__)):
        assert [int(v) for v in op(a, b)] == [ref(x, y) % M61 for x, y in pairs]


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 40), st.integers(1, 5), st.sampled_from([0, 2**16, M61 - 1]), st.integers(0, 2**32))
def test_sum_and_matmul_match_python_integers(k: int, n: int, base: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = (
        rng.integers(0, 2**20, size=(2, 3, k), dtype=np.int64).astype(np.uint64) + np.uint64(base)
    ) % np.uint64(M61)
    y = rng.integers(0, M61, size=(1, k, n), dtype=np.uint64)
    got = m61.matmul(x, y)
    xo, yo = x.astype(object), y.astype(object)
    assert (got.astype(object) == (xo @ yo[0]) % M61).all()
    assert (m61.sum_axis(x, 2, False).astype(object) == xo.sum(axis=2) % M61).all()


def test_matmul_is_exact_at_the_largest_residues() -> None:
    k = 70000  # beyond one float64 limb product's exact range is chunked: K < 2^21 stays exact
    x = np.full((1, 1, k), M61 - 1, dtype=np.uint64)
    assert int(m61.matmul(x, x.reshape(1, k, 1))[0, 0, 0]) == k * (M61 - 1) ** 2 % M61


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from([1, 3, 17, 2049, 4097]),
    st.integers(1, 3),
    st.integers(1, 3),
    st.sampled_from([0, 2**21 - 1, 2**32 - 1, M61 - 2**20]),
    st.integers(0, 2**32),
)
def test_every_limb_plan_is_exact(k: int, rows: int, cols: int, base: int, seed: int) -> None:
    """Each plan matmul chooses from (and a plan with 1-element chunks, which folds its sums on the way)."""
    rng = np.random.default_rng(seed)
    x = (rng.integers(0, 2**20, size=(2, rows, k), dtype=np.uint64) + np.uint64(base)) % np.uint64(M61)
    y = rng.integers(0, M61, size=(k, cols), dtype=np.uint64)
    want = (x.astype(object) @ y.astype(object)) % M61
    tiny = m61.LimbPlan(m61.plans(k)[0].x_widths, m61.plans(k)[0].y_widths, 1)
    for lp in [*m61.plans(k), tiny]:
        assert (m61.matmul(x, y, lp).astype(object) == want).all(), lp


def test_single_threaded_restores_the_thread_count() -> None:
    fn = blas._set_local()
    if fn is None:
        pytest.skip("numpy is not linked to an OpenBLAS with openblas_set_num_threads_local")
    before = fn(2)
    try:
        with blas.single_threaded():
            assert fn(1) == 1  # inside: one thread
        assert fn(2) == 2  # restored on exit
    finally:
        fn(before)


# ------------------------------------------------------------------------------------------ test programs


@dataclass(frozen=True)
class Spec:
    shape: tuple[int, ...]
    dtype: str = "float32"


@dataclass(frozen=True)
class Fn:
    """A program written directly against the Arith protocol (max programs before ``Program.max`` exists)."""

    shapes: Sequence[tuple[int, ...]]
    body: Callable[..., Any]

    @property
    def inputs(self) -> list[Spec]:
        return [Spec(tuple(s)) for s in self.shapes]

    def evaluate(self, arith: Any, values: list[Any]) -> list[Any]:
        out = self.body(arith, *values)
        return list(out) if isinstance(out, tuple) else [out]


def softmax(a: Any, s: Any, m: Any) -> Any:
    e = a.exp(a.sub(s, m))
    return a.div(e, a.reduce_sum(e, 1, True))


def row_max(a: Any, s: Any) -> Any:
    return a.reduce_max(s, 1, True)


def chunked_max(a: Any, s: Any, chunks: int = 2) -> Any:
    """The running max of a max-accumulator over ``chunks`` column tiles (each tile reduced first)."""
    n = a.shape(s)[1] // chunks
    acc = None
    for c in range(chunks):
        acc = a.accumulate(acc, a.reduce_max(a.slice(s, 1, c * n, (c + 1) * n), 1, True), "max")
    return acc


def elementwise_max(a: Any, s: Any) -> Any:
    """A max-accumulator over single columns (raw elements, no per-tile reduction)."""
    acc = None
    for c in range(a.shape(s)[1]):
        acc = a.accumulate(acc, a.slice(s, 1, c, c + 1), "max")
    return acc


def online_softmax_av(a: Any, s: Any, v: Any) -> Any:
    """FlashAttention-2's online softmax over two key tiles: running max, rescaled sum and output."""
    n = a.shape(s)[1] // 2
    m = out = total = None
    for c in range(2):
        tile = a.slice(s, 1, c * n, (c + 1) * n)
        new = a.accumulate(m, a.reduce_max(tile, 1, True), "max")
        e = a.exp(a.sub(tile, new))
        pv, rowsum = a.matmul(e, a.slice(v, 0, c * n, (c + 1) * n)), a.reduce_sum(e, 1, True)
        if m is None:
            out, total = pv, rowsum
        else:
            r = a.exp(a.sub(m, new))
            out, total = a.add(a.mul(out, r), pv), a.add(a.mul(total, r), rowsum)
        m = new
    return a.div(out, total)


def plain_softmax_av(a: Any, s: Any, v: Any) -> Any:
    e = a.exp(s)
    return a.div(a.matmul(e, v), a.reduce_sum(e, 1, True))


# ------------------------------------------------------------------------------------------ first tier


def test_attention_reordering_passes_the_first_tier_in_one_trial() -> None:
    # exp(S)V / Σexp(S) against (exp(S)/Σexp(S))V at 2 heads × 8 queries × 16 keys: ~2.6·10^5 trials in the
    # second tier (k = 2n² = 512), one here.
    def attention(reorder: bool) -> Fn:
        def body(a: Any, q: Any, k: Any, v: Any) -> Any:
            e = a.exp(a.scale(a.matmul(q, k), 0.25))
            s = a.reduce_sum(e, 2, True)
            return a.matmul(a.div(e, s), v) if reorder else a.div(a.matmul(e, v), s)

        return Fn([(2, 8, 16), (2, 16, 16), (2, 16, 16)], body)

    r = equivalent(attention(False), attention(True), 1e-9, seed=0)
    assert r and r.tier == 1 and r.trials == r.required_trials == 1 and r.achieved_delta <= 1e-9
    assert plan(attention(False), attention(True), tier=2).required > 10**5


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_paper_ugraphs_pass_the_first_tier_in_at_most_two_trials(name: str) -> None:
    prog, graph = EXAMPLES[name]()
    r = equivalent(prog, graph, 1e-9, seed=1)
    assert r and r.tier == 1 and r.trials == r.required_trials <= 2 and r.achieved_delta <= 1e-9


@pytest.mark.parametrize("maximum", [chunked_max, elementwise_max])
def test_max_accumulators_agree_with_one_row_max(maximum: Callable[..., Any]) -> None:
    shapes = [(3, 8)]
    a = Fn(shapes, lambda ar, s: softmax(ar, s, row_max(ar, s)))
    b = Fn(shapes, lambda ar, s: softmax(ar, s, maximum(ar, s)))
    r = equivalent(a, b, 1e-9, seed=0)
    assert r and r.tier == 1 and r.trials <= 2


def test_max_over_a_dim_of_one_is_the_element() -> None:
    a = Fn([(3, 1)], lambda ar, s: ar.exp(ar.reduce_max(s, 1, False)))
    b = Fn([(3, 1)], lambda ar, s: ar.exp(ar.reshape(s, (3,))))
    assert equivalent(a, b, seed=0).tier == 1


@pytest.mark.parametrize(
    "wrong",
    [
        lambda ar, s: ar.reduce_max(ar.slice(s, 1, 0, 4), 1, True),  # half the row
        lambda ar, s: ar.reshape(ar.reduce_max(s, 0, False), (1, 8)),  # the wrong axis
        lambda ar, s: ar.reduce_sum(s, 1, True),  # not a max at all
        lambda ar, s: ar.reduce_max(
            ar.concat([s, s], 1), 1, True
        ),  # idempotence is not used (a false rejection)
    ],
)
def test_a_different_max_is_rejected_by_the_first_tier(wrong: Callable[..., Any]) -> None:
    a = Fn([(3, 8)], lambda ar, s: ar.sub(s, row_max(ar, s)))
    b = Fn([(3, 8)], lambda ar, s: ar.sub(s, wrong(ar, s)))
    r = equivalent(a, b, seed=0)
    assert not r and r.tier == 1 and r.counterexample is not None and r.counterexample.a[1] is None


def test_first_tier_uses_no_law_of_exp() -> None:
    ar = UninterpretedArith(4, np.random.default_rng(0))
    x, y = ar.random_input((5,)), ar.random_input((5,))
    assert not ar.equal(ar.exp(ar.add(x, y)), ar.mul(ar.exp(x), ar.exp(y))).any()
    # a function of its argument's value: equal arguments, equal results
    assert ar.equal(ar.exp(ar.add(x, y)), ar.exp(ar.add(y, x))).all()


# ------------------------------------------------------------------------------------------ second tier


def test_exp_law_identities_go_to_the_second_tier() -> None:
    shapes = [(2, 3)]
    a = Fn(shapes, lambda ar, x: ar.exp(ar.add(x, x)))
    b = Fn(shapes, lambda ar, x: ar.mul(ar.exp(x), ar.exp(x)))
    r = equivalent(a, b, 1e-9, seed=0)
    assert r and r.tier == 2 and r.method == "lax-theorem"
    # a real difference with exp is still rejected, by both tiers, with a counterexample
    c = Fn(shapes, lambda ar, x: ar.mul(ar.exp(x), ar.exp(ar.scale(x, 2.0))))
    r = equivalent(a, c, 1e-9, seed=0)
    assert not r and r.tier == 2 and r.counterexample is not None


def test_online_softmax_rescale_is_accepted_by_the_second_tier_with_max_free() -> None:
    shapes = [(2, 4), (4, 3)]
    stable = Fn(shapes, online_softmax_av)
    papers = Fn(shapes, plain_softmax_av)
    r = equivalent(stable, papers, 1e-6, seed=0)
    assert r and r.tier == 2
    wrong = Fn(shapes, lambda ar, s, v: ar.matmul(softmax(ar, s, row_max(ar, s)), ar.scale(v, 2.0)))
    r = equivalent(stable, wrong, 1e-6, seed=0)
    assert not r and r.counterexample is not None


# ------------------------------------------------------------------------------------------ stability


def test_float_check_confirms_the_subtracted_max_bounds_its_row() -> None:
    shapes = [(4, 16)]
    ref = Fn(shapes, lambda ar, s: softmax(ar, s, row_max(ar, s)))
    for maximum in (row_max, chunked_max, elementwise_max):
        good = float_check(ref, Fn(shapes, lambda ar, s, f=maximum: softmax(ar, s, f(ar, s))), scale=30.0)
        assert good and good.max_subtractions >= 1 and good.unbounded_max == 0
    # Equal as functions (max is free for equality), but the subtracted value does not bound the row.
    half = Fn(shapes, lambda ar, s: softmax(ar, s, ar.reduce_max(ar.slice(s, 1, 0, 8), 1, True)))
    bad = float_check(ref, half, scale=30.0)
    assert not bad and bad.max_subtractions == 1 and bad.unbounded_max == 1


# ------------------------------------------------------------------------------------------ shared evaluation


class _Counting(UninterpretedArith):
    matmuls = 0

    def matmul(self, a, b):  # type: ignore[no-untyped-def]
        self.matmuls += 1
        return super().matmul(a, b)


def _attention(reorder: bool) -> Program:
    p = Program("attention")
    q, k, v = p.input("Q", (2, 3, 4)), p.input("K", (2, 4, 5)), p.input("V", (2, 5, 4))
    e = p.exp(p.scale(p.matmul(q, k), 0.5))
    s = p.sum(e, dim=2)
    p.output(p.matmul(p.div(e, s), v) if reorder else p.div(p.matmul(e, v), s))
    return p


def test_shared_arith_computes_common_steps_once_with_the_same_residues() -> None:
    a, b = _attention(False), _attention(True)
    plain = _Counting(2, np.random.default_rng(0))
    inputs = [plain.random_input(t.shape) for t in a.inputs]
    want = [a.evaluate(plain, inputs)[0], b.evaluate(plain, inputs)[0]]
    assert plain.matmuls == 4
    counting = _Counting(2, np.random.default_rng(0), keys=plain.keys)
    shared = SharedArith(counting)
    got = [a.evaluate(shared, inputs)[0], b.evaluate(shared, inputs)[0]]
    assert counting.matmuls == 3  # Q·K once for both sides
    assert all(np.array_equal(x.data, y.data) for x, y in zip(got, want, strict=True))
    assert np.array_equal(got[0].data, got[1].data)  # the two sides agree (an identity)


def test_shared_arith_shares_a_matmul_by_content_and_only_equal_content() -> None:
    counting = _Counting(1, np.random.default_rng(1))
    shared = SharedArith(counting)
    x, w = counting.random_input((3, 4)), counting.random_input((4, 2))
    first = shared.matmul(x, w)
    copy = UFValue(x.data.copy())  # another object holding the same residues (a fused kernel's result)
    assert shared.matmul(copy, w) is first and counting.matmuls == 1
    changed = UFValue(x.data.copy())
    changed.data[0, 0, 0] ^= np.uint64(1)
    assert shared.matmul(changed, w) is not first and counting.matmuls == 2
    with_digest = UFValue(x.data.copy(), np.zeros((1, 3, 4), dtype=np.uint64))  # a max result: other state
    shared.matmul(with_digest, w)
    assert counting.matmuls == 3
    assert shared.add(x, x) is not shared.add(copy, copy)  # other operations: by identity, as before


def test_a_content_key_collision_costs_a_recomputation_not_a_wrong_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gensorage.verify import shared as shared_module

    monkeypatch.setattr(shared_module, "_content", lambda arg: "every value collides")
    counting = _Counting(1, np.random.default_rng(2))
    shared = SharedArith(counting)
    x, y, w = counting.random_input((3, 4)), counting.random_input((3, 4)), counting.random_input((4, 2))
    first = shared.matmul(x, w)
    other = shared.matmul(y, w)
    assert counting.matmuls == 2 and np.array_equal(other.data, counting.matmul(y, w).data)
    assert shared.matmul(UFValue(x.data.copy()), w) is first  # equal content still hits


def test_a_large_operand_is_keyed_by_a_sample_and_a_difference_off_it_still_counts() -> None:
    from gensorage.verify import shared as shared_module

    counting = _Counting(1, np.random.default_rng(3))
    shared = SharedArith(counting)
    x, w = (
        counting.random_input((3, 2 * shared_module.SAMPLE + 1)),
        counting.random_input((2 * shared_module.SAMPLE + 1, 2)),
    )
    first = shared.matmul(x, w)
    changed = UFValue(x.data.copy())
    changed.data[0, 1, 1] ^= np.uint64(1)  # an element between two sampled ones
    key = shared_module._content
    assert key(changed) == key(x)  # the sample misses it: the keys collide ...
    got = shared.matmul(changed, w)
    assert got is not first and counting.matmuls == 2  # ... and the byte comparison catches it
    assert np.array_equal(got.data, counting.matmul(changed, w).data)
    assert shared.matmul(UFValue(x.data.copy()), w) is first  # equal content still hits

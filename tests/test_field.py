"""FieldArith: primes, ring laws, inverse, exp homomorphism, sqrt, exact matmul/sums, layout ops, Lax errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gensorage.errors import NotLaxError
from gensorage.verify.field import FieldArith, FieldValue, check_moduli, field_constant, rational_of
from gensorage.verify.primes import DEFAULT_P, DEFAULT_Q, find_safe_prime_pair, is_prime

P, Q = DEFAULT_P, DEFAULT_Q
T = 5  # trials per value in these tests


def arith(seed: int = 0, trials: int = T, **kw: int) -> FieldArith:
    return FieldArith(trials, np.random.default_rng(seed), **kw)


def as_int(v: FieldValue, comp: int) -> np.ndarray:
    return v.data[comp].astype(object)


# ------------------------------------------------------------------------------------------------- primes


def test_default_primes_are_the_documented_safe_pair() -> None:
    assert is_prime(P) and is_prime(Q)
    assert P == 2 * Q + 1 and (P - 1) % Q == 0
    assert P % 4 == 3 and Q % 4 == 3
    assert Q > 10**9 and P < 2**31 and P * P < 2**62
    assert find_safe_prime_pair(2**30) == (P, Q)
    assert P > 167 * 1000  # far larger than Mirage's p = 167


@given(st.integers(0, 20000))
def test_is_prime_matches_trial_division(n: int) -> None:
    naive = n >= 2 and all(n % d for d in range(2, math.isqrt(n) + 1))
    assert is_prime(n) == naive


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (561, False),  # Carmichael
        (2047, False),  # strong pseudoprime to base 2
        (3215031751, False),  # strong pseudoprime to bases 2, 3, 5, 7
        (3825123056546413051, False),  # strong pseudoprime to bases 2..23
        (2**61 - 1, True),
        (2**64 - 59, True),  # largest prime below 2^64
        ((2**32 + 15) * (2**31 - 1), False),
    ],
)
def test_is_prime_hard_cases(n: int, expected: bool) -> None:
    assert is_prime(n) == expected


def test_check_moduli_rejects_bad_pairs() -> None:
    with pytest.raises(ValueError, match="prime"):
        check_moduli(21, 5)
    with pytest.raises(ValueError, match="divide"):
        check_moduli(23, 7)
    with pytest.raises(ValueError, match="3 \\(mod 4\\)"):
        check_moduli(11, 5)  # 11 ≡ 3 but 5 ≡ 1 (mod 4)
    check_moduli(23, 11)


def test_omega_is_a_nontrivial_qth_root_of_unity() -> None:
    a = arith(trials=200)
    assert all(int(w) != 1 and pow(int(w), Q, P) == 1 for w in a.omega)
    assert len(set(a.omega.tolist())) > 190  # one independent draw per trial


# ----------------------------------------------------------------------------------------------- ring laws

residues = st.lists(st.tuples(st.integers(0, P - 1), st.integers(0, Q - 1)), min_size=T * 3, max_size=T * 3)


def value_of(a: FieldArith, pairs: list[tuple[int, int]]) -> FieldValue:
    arr = np.array(pairs, dtype=np.int64).reshape(T, 3, 2)
    return a.value(arr[..., 0], arr[..., 1])


@settings(max_examples=60, deadline=None)
@given(residues, residues, residues)
def test_ring_laws(xs: list[tuple[int, int]], ys: list[tuple[int, int]], zs: list[tuple[int, int]]) -> None:
    a = arith()
    x, y, z = value_of(a, xs), value_of(a, ys), value_of(a, zs)
    for comp, m in ((0, P), (1, Q)):
        xi, yi = as_int(x, comp), as_int(y, comp)
        assert (as_int(a.add(x, y), comp) == (xi + yi) % m).all()
        assert (as_int(a.sub(x, y), comp) == (xi - yi) % m).all()
        assert (as_int(a.mul(x, y), comp) == (xi * yi) % m).all()
        assert (as_int(a.mul(a.add(x, y), z), comp) == as_int(a.add(a.mul(x, z), a.mul(y, z)), comp)).all()
    assert a.equal(a.add(x, y), a.add(y, x)).all()
    assert a.equal(a.sub(a.add(x, y), y), x).all()


@settings(max_examples=60, deadline=None)
@given(residues, residues)
def test_division_is_multiplication_by_the_inverse(
    xs: list[tuple[int, int]], ys: list[tuple[int, int]]
) -> None:
    a = arith()
    x, y = value_of(a, xs), value_of(a, ys)
    q = a.div(x, y)
    zero = ((y.data[0] == 0) | (y.data[1] == 0)).reshape(T, -1).any(axis=1)
    assert (a.degenerate == zero).all()
    ok = ~zero
    assert a.equal(a.mul(q, y), x)[ok].all()
    for comp, m in ((0, P), (1, Q)):
        yi = as_int(y, comp)
        inv = np.vectorize(lambda v, m=m: pow(int(v), -1, m) if v else 0, otypes=[object])(yi)
        assert (as_int(q, comp) == (as_int(x, comp) * inv) % m).all()


def test_zero_divisor_marks_only_its_trial_degenerate() -> None:
    a = arith(trials=3)
    num = a.random_input((2, 2))
    den = a.random_input((2, 2))
    den.data[0, 1, 0, 1] = 0
    a.div(num, den)
    assert a.degenerate.tolist() == [False, True, False]
    # A zero q residue of a tainted divisor is filler, not a zero divisor.
    b = arith(trials=2)
    e = b.exp(b.random_input((3,)))
    assert e.data[1].max() == 0 and e.tainted
    b.div(b.random_input((3,)), e)
    assert not b.degenerate.any()


# ---------------------------------------------------------------------------------------------------- exp


@settings(max_examples=40, deadline=None)
@given(residues, residues)
def test_exp_is_a_homomorphism(xs: list[tuple[int, int]], ys: list[tuple[int, int]]) -> None:
    a = arith()
    x, y = value_of(a, xs), value_of(a, ys)
    lhs = a.exp(a.add(x, y))
    rhs = a.mul(a.exp(x), a.exp(y))
    assert a.equal(lhs, rhs).all()
    # and it is ω^(x_q) with this trial's ω
    for t in range(T):
        for i in range(3):
            assert int(a.exp(x).data[0, t, i]) == pow(int(a.omega[t]), int(x.data[1, t, i]), P)


@pytest.mark.parametrize("elements", [1, 40, 600, 5000])
def test_exp_limb_widths_agree_with_pow(elements: int) -> None:
    a = arith(trials=3)
    x = a.random_input((elements,))
    e = a.exp(x)
    for t in range(3):
        for i in (0, elements // 2, elements - 1):
            assert int(e.data[0, t, i]) == pow(int(a.omega[t]), int(x.data[1, t, i]), P)


def test_second_exp_on_a_path_is_not_lax() -> None:
    a = arith()
    x = a.random_input((2,))
    once = a.add(a.exp(x), x)
    with pytest.raises(NotLaxError, match="two exps on one path through exp"):
        a.exp(once)
    # an activation in between makes a fresh value: exp is allowed again
    a.exp(a.activation("relu", once))


# --------------------------------------------------------------------------------------------------- sqrt


@settings(max_examples=40, deadline=None)
@given(residues)
def test_sqrt_of_a_square(xs: list[tuple[int, int]]) -> None:
    a = arith()
    x = value_of(a, xs)
    sq = a.mul(x, x)  # a quadratic residue in both fields
    r = a.sqrt(sq)
    assert a.equal(a.mul(r, r), sq).all()
    # multiplicative for all inputs, residues or not: sqrt(xy) = sqrt(x) sqrt(y)
    y = a.sqrt(a.add(x, sq))
    assert a.equal(a.sqrt(a.mul(x, sq)), a.mul(a.sqrt(x), a.sqrt(sq))).all()
    assert y.shape == x.shape


def test_sqrt_of_a_non_residue_is_the_root_of_minus_x() -> None:
    a = arith(trials=1)
    # -1 is a non-residue mod p ≡ 3 (mod 4)
    x = a.value(np.array([[P - 1]]), np.array([[Q - 1]]))
    r = a.sqrt(x)
    assert int(r.data[0, 0, 0]) ** 2 % P == 1 and int(r.data[1, 0, 0]) ** 2 % Q == 1


# -------------------------------------------------------------------------------------------------- scale


@pytest.mark.parametrize("factor", [0.5, 0.125, -3.0, 1 / 3, 0.08838834764831845, 1e-7, 0.0])
def test_scale_uses_the_exact_rational(factor: float) -> None:
    r = rational_of(factor)
    assert r.denominator <= 10**9
    for m in (P, Q):
        c = field_constant(factor, m)
        assert c * r.denominator % m == r.numerator % m
    a = arith()
    x = a.random_input((4,))
    y = a.scale(x, factor)
    assert (as_int(y, 0) == as_int(x, 0) * field_constant(factor, P) % P).all()
    assert (as_int(y, 1) == as_int(x, 1) * field_constant(factor, Q) % Q).all()


def test_scales_compose_like_rationals() -> None:
    a = arith()
    x = a.random_input((3, 2))
    assert a.equal(a.scale(a.scale(x, 0.5), 0.25), a.scale(x, 0.125)).all()
    assert a.equal(a.scale(a.scale(x, 1 / 3), 3.0), x).all()
    assert not a.equal(a.scale(x, 0.5), x).any()


# ----------------------------------------------------------------------------------------------- activations


def test_activation_is_a_keyed_function_of_the_value() -> None:
    a = arith()
    x = a.random_input((4, 3))
    y = a.random_input((4, 3))
    assert a.equal(a.activation("relu", a.add(x, y)), a.activation("relu", a.add(y, x))).all()
    assert not a.equal(a.activation("relu", x), a.activation("relu", y)).any()
    assert not a.equal(a.activation("relu", x), a.activation("silu", x)).any()
    # the result is untainted and uniform-looking in both components
    r = a.activation("gelu", a.exp(x))
    assert not r.tainted and r.data[1].max() > 0
    # a second arithmetic with the same keys gives the same function
    b = FieldArith(T, np.random.default_rng(9), keys=a.keys)
    assert (b.activation("relu", x).data == a.activation("relu", x).data).all()


# ----------------------------------------------------------------------------------------- matmul and sums


def reference_matmul(x: np.ndarray, y: np.ndarray, m: int) -> np.ndarray:
    return np.matmul(x.astype(object), y.astype(object)) % m


@pytest.mark.parametrize("path", ["direct", "limbs"])
@pytest.mark.parametrize(
    ("sa", "sb"), [((3, 4), (4, 5)), ((2, 3, 4), (4, 2)), ((1, 3, 4), (2, 4, 3)), ((3, 4), (2, 2, 4, 1))]
)
def test_matmul_matches_big_integer_arithmetic(
    sa: tuple[int, ...], sb: tuple[int, ...], path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gensorage.verify.field as field

    monkeypatch.setattr(field, "_SMALL_MATMUL", 1 << 30 if path == "direct" else 0)
    a = arith()
    x, y = a.random_input(sa), a.random_input(sb)
    z = a.matmul(x, y)
    assert z.shape == np.broadcast_shapes(sa[:-2], sb[:-2]) + (sa[-2], sb[-1])
    for comp, m in ((0, P), (1, Q)):
        for t in range(T):
            assert (
                z.data[comp, t].astype(object) == reference_matmul(x.data[comp, t], y.data[comp, t], m)
            ).all()


def test_matmul_and_sum_do_not_overflow_at_large_k() -> None:
    k = 65536
    a = arith(trials=2)
    x, y = a.random_input((2, k)), a.random_input((k, 2))
    # worst case for overflow: every residue at its maximum in some rows
    x.data[0, 0, 0, :] = P - 1
    y.data[0, 0, :, 0] = P - 1
    z = a.matmul(x, y)
    s = a.reduce_sum(x, 1, keepdims=False)
    for comp, m in ((0, P), (1, Q)):
        for t in range(2):
            for i in range(2):
                row = [int(v) for v in x.data[comp, t, i]]
                assert int(s.data[comp, t, i]) == sum(row) % m
                for j in range(2):
                    col = [int(v) for v in y.data[comp, t, :, j]]
                    assert int(z.data[comp, t, i, j]) == sum(r * c for r, c in zip(row, col, strict=True)) % m


def test_matmul_chunks_an_inner_dim_beyond_the_exact_float_range(monkeypatch: pytest.MonkeyPatch) -> None:
    import gensorage.verify.field as field

    monkeypatch.setattr(field, "_MATMUL_CHUNK", 16)  # force several chunks on a small K
    monkeypatch.setattr(field, "_SMALL_MATMUL", 0)
    a = arith(trials=2)
    x, y = a.random_input((3, 50)), a.random_input((50, 2))
    z = a.matmul(x, y)
    for comp, m in ((0, P), (1, Q)):
        for t in range(2):
            assert (
                z.data[comp, t].astype(object) == reference_matmul(x.data[comp, t], y.data[comp, t], m)
            ).all()


def test_reduce_sum_and_accumulate() -> None:
    a = arith()
    x = a.random_input((3, 4))
    for axis in (0, 1):
        for keep in (True, False):
            s = a.reduce_sum(x, axis, keep)
            ref = x.data.astype(object).sum(axis=axis + 2, keepdims=keep)
            assert (s.data[0].astype(object) == ref[0] % P).all() and (
                s.data[1].astype(object) == ref[1] % Q
            ).all()
    acc = a.accumulate(None, x, "sum")
    acc = a.accumulate(acc, x, "sum")
    assert a.equal(acc, a.add(x, x)).all()
    # max is a function of the flattened multiset (tests/test_uninterpreted.py has the laws in both tiers)
    m = a.accumulate(a.accumulate(None, a.slice(x, 1, 0, 2), "max"), a.slice(x, 1, 2, 4), "max")
    assert a.equal(a.reduce_max(a.reshape(x, (3, 2, 2)), 1, False), m).all()


# ---------------------------------------------------------------------------------------------- layout ops


def test_layout_ops_act_on_logical_axes() -> None:
    a = arith()
    x = a.random_input((2, 3, 4))
    y = a.random_input((2, 1, 4))
    ref = x.data
    assert (a.reshape(x, (6, 4)).data == ref.reshape(2, T, 6, 4)).all()
    assert (a.repeat(x, 1, 2).data == np.repeat(ref, 2, axis=3)).all()
    assert (a.concat([x, y], 1).data == np.concatenate([ref, y.data], axis=3)).all()
    assert (a.slice(x, 2, 1, 3).data == ref[:, :, :, :, 1:3]).all()
    assert a.shape(a.add(x, y)) == (2, 3, 4)  # broadcasting of logical dims
    assert a.shape(a.mul(x, a.random_input((4,)))) == (2, 3, 4)  # rank alignment after the trial axis
    assert a.concat([a.exp(y), y], 1).tainted


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 1001])
def test_batch_inverse_matches_python(n: int) -> None:
    from gensorage.verify.limbs import batch_inverse

    rng = np.random.default_rng(n)
    x = np.stack([rng.integers(0, P, n), rng.integers(0, Q, n)])
    x[0, 0] = 0  # zero maps to zero (the trial is degenerate anyway)
    m = np.array([[P], [Q]], dtype=np.int64)
    inv = batch_inverse(x, (P, Q), lambda a, b: a * b % m)
    for c, m in ((0, P), (1, Q)):
        for i in range(n):
            v = int(x[c, i])
            assert int(inv[c, i]) == (pow(v, -1, m) if v else 0)

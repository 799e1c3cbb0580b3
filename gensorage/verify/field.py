"""Finite-field arithmetic for the probabilistic identity test (Mirage Table 3, later version with sqrt).

A value is a pair of residues ``(x_p, x_q)`` in ``Z_p × Z_q`` with ``q | p - 1`` for every element, held for
many independent trials at once: :attr:`FieldValue.data` is an int64 array of shape ``(2, T, *logical_shape)``
(component, trial, logical dims). Every op is vectorised over both components and all trials.

- add / sub / mul: componentwise mod p and mod q.
- div: multiply by the modular inverse (Montgomery batch inversion over a product tree: one Python
  ``pow(v, -1, m)`` per component and ~3 multiplications per element). A zero divisor element makes that *trial*
  degenerate (the event E of the theorems): :attr:`FieldArith.degenerate` is set for it and the caller discards
  the trial. The q component of a divisor is checked only while it is meaningful (see "taint" below).
- exp: ``(ω^(x_q) mod p, —)`` with one random ``ω ≠ 1`` of multiplicative order q per trial. The result has no
  meaningful Z_q value, so the value is *tainted*: its q component is zero filler, and a second exp on a tainted
  value (two exps on one path) raises :class:`~gensorage.errors.NotLaxError`. Taint propagates to everything
  computed from a tainted value.
- sqrt: ``x^((m+1)/4) mod m`` per component (p ≡ q ≡ 3 mod 4). For a quadratic residue this is a square root;
  for a non-residue it is the square root of ``-x``. Either way it is a deterministic function of ``x`` (and a
  multiplicative one), so equivalent programs still agree.
- scale(f): multiply by the exact rational ``Fraction(f).limit_denominator(10**9)`` mapped into both fields; the
  same float factor gives the same field constant on both sides. add_scalar(c): add that constant of ``c``.
- relu / silu / gelu / tanh / log and clamp (outside the Lax fragment; a clamp is one function per pair of
  bounds): an *uninterpreted function*. The result is a keyed
  pseudo-random function (splitmix64) of the input's p residue, giving a fresh untainted ``(p, q)`` pair. Equal
  inputs give equal outputs, so programs that agree for *every* function in the activation's place are accepted;
  that implies agreement for the real activation. Only ``x_p`` is hashed: ``x_q`` is filler once a value is
  tainted, and whether a value is tainted may differ between equivalent programs.
- matmul / reduce_sum: exact. Matmul splits both operands into 16-bit limbs and multiplies limbs in float64
  BLAS (exact while K · (2^16 - 1)^2 < 2^53, i.e. K < 2^21; longer K is chunked), then recombines mod m.
- reduce_max / accumulate(max): an uninterpreted function of the flattened multiset of the elements' p residues
  (:mod:`gensorage.verify.maxset`), giving a fresh untainted pair like an activation. The value of a softmax does
  not depend on what is subtracted from its row, so any function in max's place keeps softmax identities
  (docs/verification.md).
- reshape / repeat / transpose / concat / slice: act on the logical axes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction

import numpy as np

from gensorage.arith import AccumKind, Activation
from gensorage.errors import NotLaxError, VerificationError
from gensorage.opset import clamp_symbol
from gensorage.verify import maxset
from gensorage.verify.limbs import batch_inverse, limb_products
from gensorage.verify.maxset import mix64, symbol_key
from gensorage.verify.primes import DEFAULT_P, DEFAULT_Q, is_prime

# Largest inner dimension one float64 limb product can sum exactly: K * (2^16 - 1)^2 < 2^53.
_MATMUL_CHUNK = 1 << 21
_LIMB = 16
# Below this many scalar products per component (trials · batch · rows · inner · cols) matmul multiplies
# directly.
_SMALL_MATMUL = 1 << 14
# exp splits the exponent e < 2^30 into limbs and gathers ω^limb from one table per limb.
_EXP_BITS = 30
_SCALE_MAX_DENOMINATOR = 10**9
ACTIVATION_KINDS: tuple[Activation, ...] = ("relu", "silu", "gelu", "tanh", "log")
#: Symbols with a hash key per check: the activations, the clamps' base key (one symbol per pair of bounds,
#: derived by :func:`gensorage.verify.maxset.symbol_key`), and max (digests) and its elements.
KEYED: tuple[str, ...] = ACTIVATION_KINDS + ("clamp", "max", "max-element")


class FieldValue:
    """Residues ``data[0] ∈ Z_p`` and ``data[1] ∈ Z_q`` (int64, shape ``(2, T, *shape)``), plus the taint flag.

    ``tainted`` is True when some exp lies on a path into this value: then ``data[1]`` is filler and must not
    be used (not exponentiated again, not compared). ``digest`` identifies the multisets of max results.
    """

    __slots__ = ("data", "digest", "tainted")

    def __init__(self, data: np.ndarray, tainted: bool = False, digest: np.ndarray | None = None) -> None:
        self.data = data
        self.tainted = tainted
        #: Multiset digests of max results (:mod:`gensorage.verify.maxset`), shape ``(T, *shape)``, or None.
        self.digest = digest

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape[2:]  # type: ignore[no-any-return]

    @property
    def trials(self) -> int:
        return int(self.data.shape[1])

    def __repr__(self) -> str:
        return f"FieldValue(shape={self.shape}, trials={self.trials}, tainted={self.tainted})"


def rational_of(factor: float) -> Fraction:
    """The exact rational a scale factor stands for: ``Fraction(factor).limit_denominator(10**9)``."""
    return Fraction(factor).limit_denominator(_SCALE_MAX_DENOMINATOR)


def field_constant(factor: float, m: int) -> int:
    """``factor`` as an element of ``Z_m`` (via :func:`rational_of`); ``m`` must not divide the denominator."""
    r = rational_of(factor)
    if r.denominator % m == 0:
        raise VerificationError(
            f"scale factor {factor!r} = {r} has a denominator divisible by the modulus {m}"
        )
    return r.numerator * pow(r.denominator, -1, m) % m


def check_moduli(p: int, q: int) -> None:
    """Raise ``ValueError`` unless p, q are primes ≡ 3 (mod 4), ``q | p - 1`` and ``p < 2^31``."""
    if not (is_prime(p) and is_prime(q)):
        raise ValueError(f"p={p} and q={q} must both be prime")
    if (p - 1) % q:
        raise ValueError(f"q={q} must divide p-1={p - 1}")
    if p % 4 != 3 or q % 4 != 3:
        raise ValueError(f"p={p} and q={q} must be ≡ 3 (mod 4) for square roots by a single power")
    if p >= 1 << 31:
        raise ValueError(f"p={p} must be below 2^31 so products of residues fit in int64")


class FieldArith:
    """The :class:`gensorage.arith.Arith` of ``Z_p × Z_q`` over ``trials`` independent random trials.

    Parameters
    ----------
    trials : int
        Number of trials T held in every value (the leading axis after the component axis).
    rng : numpy.random.Generator
        Source of ω (one per trial), of the inputs drawn by :meth:`random_input`, and of activation keys when
        ``keys`` is not given.
    p, q : int
        The moduli (default: the safe-prime pair of :mod:`gensorage.verify.primes`).
    keys : mapping, optional
        Per-activation hash keys; pass the same keys to every arithmetic whose results are compared.
    """

    name = "field"
    #: Exact: a value's residues do not depend on how elements are batched, so the µGraph evaluator may stack a
    #: grid's blocks (:mod:`gensorage.ugraph.stacked`).
    stacks_blocks = True

    def __init__(
        self,
        trials: int,
        rng: np.random.Generator,
        *,
        p: int = DEFAULT_P,
        q: int = DEFAULT_Q,
        keys: Mapping[str, int] | None = None,
    ) -> None:
        check_moduli(p, q)
        if trials < 1:
            raise ValueError(f"trials must be positive, got {trials}")
        self.p, self.q, self.trials, self.rng = p, q, trials, rng
        # ω = g^((p-1)/q) for g uniform in [2, p-2]; g ≠ ±1 is exactly what makes ω ≠ 1.
        g = rng.integers(2, p - 1, size=trials, dtype=np.int64)
        self.omega = _powmod(g, (p - 1) // q, p)
        #: Per trial: some divisor element was zero (the trial must be discarded).
        self.degenerate = np.zeros(trials, dtype=bool)
        if keys is None:
            keys = {k: int(rng.integers(0, 2**63)) for k in KEYED}
        self.keys = dict(keys)
        self._mods: dict[int, np.ndarray] = {}
        self._scale_cache: dict[float, np.ndarray] = {}
        self._exp_tables: dict[int, list[np.ndarray]] = {}
        self._offsets: dict[tuple[int, int], np.ndarray] = {}

    # ------------------------------------------------------------------------------------ construction

    def mod(self, ndim: int) -> np.ndarray:
        """``[p, q]`` shaped ``(2, 1, ..., 1)`` to broadcast against a value of ``ndim`` logical dims."""
        m = self._mods.get(ndim)
        if m is None:
            m = np.array([self.p, self.q], dtype=np.int64).reshape((2,) + (1,) * (ndim + 1))
            self._mods[ndim] = m
        return m

    def random_input(self, shape: Sequence[int]) -> FieldValue:
        """A value uniform in ``Z_p × Z_q`` per element and trial."""
        shape = tuple(int(s) for s in shape)
        data = np.empty((2, self.trials) + shape, dtype=np.int64)
        data[0] = self.rng.integers(0, self.p, size=(self.trials,) + shape, dtype=np.int64)
        data[1] = self.rng.integers(0, self.q, size=(self.trials,) + shape, dtype=np.int64)
        return FieldValue(data)

    def value(self, p_part: np.ndarray, q_part: np.ndarray) -> FieldValue:
        """A value from explicit residues of shape ``(T, *shape)`` (reduced mod p and mod q)."""
        pp = np.asarray(p_part, dtype=np.int64)
        qq = np.asarray(q_part, dtype=np.int64)
        if pp.shape != qq.shape or pp.ndim < 1 or pp.shape[0] != self.trials:
            raise ValueError(
                f"residue arrays must both have shape (T={self.trials}, ...), got {pp.shape}, {qq.shape}"
            )
        return FieldValue(np.stack([pp % self.p, qq % self.q]))

    def equal(self, a: FieldValue, b: FieldValue) -> np.ndarray:
        """Per trial: do ``a`` and ``b`` agree everywhere? (q components only where both are untainted.)"""
        return self.mismatch(a, b).reshape(self.trials, -1).any(axis=1) == 0

    def mismatch(self, a: FieldValue, b: FieldValue) -> np.ndarray:
        """Boolean ``(T, *shape)``: where ``a`` and ``b`` differ."""
        if a.shape != b.shape:
            raise ValueError(f"cannot compare values of shapes {a.shape} and {b.shape}")
        diff = a.data[0] != b.data[0]
        if not (a.tainted or b.tainted):
            diff |= a.data[1] != b.data[1]
        return diff

    # ------------------------------------------------------------------------------------ helpers

    def _align(self, a: FieldValue, b: FieldValue) -> tuple[np.ndarray, np.ndarray, int]:
        """Both data arrays with equal logical rank (singleton dims inserted after the trial axis)."""
        ra, rb = a.data.ndim - 2, b.data.ndim - 2
        x, y = a.data, b.data
        if ra < rb:
            x = x.reshape(x.shape[:2] + (1,) * (rb - ra) + x.shape[2:])
        elif rb < ra:
            y = y.reshape(y.shape[:2] + (1,) * (ra - rb) + y.shape[2:])
        return x, y, max(ra, rb)

    def _pow(self, x: np.ndarray, exps: tuple[int, int]) -> np.ndarray:
        """``x[c] ** exps[c] mod m_c`` per component by square-and-multiply (exponents are public constants).

        Both components go through one loop over the exponent bits (a bit set in both exponents costs one
        multiplication of the stacked array), in place, to keep the number of numpy calls low.
        """
        m = self.mod(x.ndim - 2)
        mods = (self.p, self.q)
        base = x % m
        acc = np.ones_like(base)
        ep, eq = exps
        while ep or eq:
            bp, bq = ep & 1, eq & 1
            if bp and bq:
                np.multiply(acc, base, out=acc)
                np.remainder(acc, m, out=acc)
            elif bp or bq:
                c = 0 if bp else 1
                np.multiply(acc[c], base[c], out=acc[c])
                np.remainder(acc[c], mods[c], out=acc[c])
            ep, eq = ep >> 1, eq >> 1
            if ep or eq:
                np.multiply(base, base, out=base)
                np.remainder(base, m, out=base)
        return acc

    def _trial_offsets(self, width: int, ndim: int) -> np.ndarray:
        """``t · 2^width`` for trial t, shaped to broadcast over a ``(T, ...)`` array of ``ndim`` dims."""
        key = (width, ndim)
        off = self._offsets.get(key)
        if off is None:
            off = (np.arange(self.trials, dtype=np.int64) << width).reshape((-1,) + (1,) * (ndim - 1))
            self._offsets[key] = off
        return off

    def _exp_tables_for(self, width: int) -> list[np.ndarray]:
        """``tables[j][t, i] = ω_t^(i · 2^(width·j)) mod p`` for the limbs of a 30-bit exponent (by doubling)."""
        tables = self._exp_tables.get(width)
        if tables is None:
            p = self.p
            tables = []
            step = self.omega.reshape(-1, 1)  # ω^(2^(width·j)), advanced by squaring
            for _ in range(-(-_EXP_BITS // width)):
                tab = np.ones((self.trials, 1), dtype=np.int64)
                power = step
                for _ in range(width):
                    tab = np.concatenate([tab, tab * power % p], axis=1)
                    power = power * power % p
                tables.append(tab)
                step = power
            self._exp_tables[width] = tables
        return tables

    # ------------------------------------------------------------------------------------ Arith protocol

    def shape(self, a: FieldValue) -> tuple[int, ...]:
        return a.shape

    def add(self, a: FieldValue, b: FieldValue) -> FieldValue:
        x, y, nd = self._align(a, b)
        return FieldValue((x + y) % self.mod(nd), a.tainted or b.tainted)

    def sub(self, a: FieldValue, b: FieldValue) -> FieldValue:
        x, y, nd = self._align(a, b)
        return FieldValue((x - y) % self.mod(nd), a.tainted or b.tainted)

    def mul(self, a: FieldValue, b: FieldValue) -> FieldValue:
        x, y, nd = self._align(a, b)
        return FieldValue(x * y % self.mod(nd), a.tainted or b.tainted)

    def div(self, a: FieldValue, b: FieldValue) -> FieldValue:
        zero = b.data[0] == 0
        if not b.tainted:
            zero |= b.data[1] == 0
        self.degenerate |= zero.reshape(self.trials, -1).any(axis=1)
        m = self.mod(0)  # shape (2, 1): one modulus per row of the flattened residues
        flat = b.data.reshape(2, -1)
        inv = batch_inverse(flat, (self.p, self.q), lambda x, y: x * y % m).reshape(b.data.shape)
        return self.mul(a, FieldValue(inv, b.tainted))

    def exp(self, a: FieldValue) -> FieldValue:
        if a.tainted:
            raise NotLaxError(
                "not in the Lax fragment: two exps on one path through exp (its input already depends on an exp)"
            )
        e = a.data[1]
        width = _limb_width(e.size // self.trials)
        tables = self._exp_tables_for(width)
        offset = self._trial_offsets(width, e.ndim)
        mask = (1 << width) - 1
        out = np.zeros_like(a.data)
        acc = out[0]
        tables[0].take(offset + (e & mask), out=acc)
        for j in range(1, len(tables)):
            np.multiply(acc, tables[j].take(offset + ((e >> (width * j)) & mask)), out=acc)
            np.remainder(acc, self.p, out=acc)
        return FieldValue(out, True)

    def sqrt(self, a: FieldValue) -> FieldValue:
        return FieldValue(self._pow(a.data, ((self.p + 1) // 4, (self.q + 1) // 4)), a.tainted)

    def _constant(self, x: float) -> np.ndarray:
        """``[x mod p, x mod q]`` (via :func:`field_constant`), memoised."""
        c = self._scale_cache.get(x)
        if c is None:
            c = np.array([field_constant(x, self.p), field_constant(x, self.q)], dtype=np.int64)
            self._scale_cache[x] = c
        return c

    def scale(self, a: FieldValue, factor: float) -> FieldValue:
        nd = a.data.ndim - 2
        c = self._constant(factor).reshape((2,) + (1,) * (nd + 1))
        return FieldValue(a.data * c % self.mod(nd), a.tainted)

    def add_scalar(self, a: FieldValue, value: float) -> FieldValue:
        # A tainted value's q component is filler: adding to it keeps it filler, as add does.
        nd = a.data.ndim - 2
        c = self._constant(value).reshape((2,) + (1,) * (nd + 1))
        return FieldValue((a.data + c) % self.mod(nd), a.tainted)

    def activation(self, kind: Activation, a: FieldValue) -> FieldValue:
        key = self.keys.get(kind)
        if key is None:
            raise NotLaxError(f"activation '{kind}' has no finite-field substitute")
        return self._function(key, a)

    def clamp(self, a: FieldValue, lo: float | None, hi: float | None) -> FieldValue:
        base = self.keys.get("clamp")
        if base is None:
            raise NotLaxError("clamp has no finite-field substitute (no key)")
        return self._function(int(symbol_key(base, clamp_symbol(lo, hi))), a)

    def _function(self, key: int, a: FieldValue) -> FieldValue:
        h = mix64(a.data[0].astype(np.uint64) + np.uint64(key))
        h2 = mix64(h ^ np.uint64(0x9E3779B97F4A7C15))
        out = np.stack([(h % np.uint64(self.p)).astype(np.int64), (h2 % np.uint64(self.q)).astype(np.int64)])
        return FieldValue(out, False)

    def matmul(self, a: FieldValue, b: FieldValue) -> FieldValue:
        x, y, nd = self._align(a, b)
        m = self.mod(nd)
        k = x.shape[-1]
        batch = math.prod(max(u, v) for u, v in zip(x.shape[1:-2], y.shape[1:-2], strict=True))
        if batch * x.shape[-2] * k * y.shape[-1] <= _SMALL_MATMUL:
            # Tiny products (search-size tiles): one broadcast multiply is cheaper than the limb split's
            # dozen numpy calls. Each product < 2^62 is reduced before the sum of k < 2^32 residues.
            prod = x[..., :, :, None] * y[..., None, :, :] % m[..., None]
            return FieldValue(prod.sum(axis=-2) % m, a.tainted or b.tainted)
        acc: np.ndarray | None = None
        for start in range(0, k, _MATMUL_CHUNK):
            part = _limb_matmul(
                x[..., start : start + _MATMUL_CHUNK], y[..., start : start + _MATMUL_CHUNK, :], m
            )
            acc = part if acc is None else (acc + part) % m
        assert acc is not None
        return FieldValue(acc, a.tainted or b.tainted)

    def reduce_sum(self, a: FieldValue, axis: int, keepdims: bool) -> FieldValue:
        # Residues are < 2^31, so any sum of fewer than 2^32 of them fits in int64.
        s = np.sum(a.data, axis=axis + 2, keepdims=keepdims)
        return FieldValue(s % self.mod(s.ndim - 2), a.tainted)

    def _contributions(self, a: FieldValue) -> np.ndarray:
        # Only x_p is hashed: x_q is filler after an exp (as for activations).
        return maxset.contributions(a.data[0], a.digest, np.uint64(self.keys["max-element"]))

    def _max_of(self, digest: np.ndarray) -> FieldValue:
        key = np.uint64(self.keys["max"])
        out = np.stack(
            [
                (maxset.keyed_hash(digest, key) % np.uint64(self.p)).astype(np.int64),
                (maxset.keyed_hash(digest, ~key) % np.uint64(self.q)).astype(np.int64),
            ]
        )
        return FieldValue(out, False, digest)

    def reduce_max(self, a: FieldValue, axis: int, keepdims: bool) -> FieldValue:
        if a.shape[axis] == 1:  # max({s}) = s
            return a if keepdims else self.reshape(a, a.shape[:axis] + a.shape[axis + 1 :])
        return self._max_of(maxset.reduce_digest(self._contributions(a), axis + 1, keepdims))

    def accumulate(self, acc: FieldValue | None, x: FieldValue, kind: AccumKind) -> FieldValue:
        if acc is None:
            return x
        if kind == "sum":
            return self.add(acc, x)
        ca, cx = np.broadcast_arrays(self._contributions(acc), self._contributions(x))
        return self._max_of(maxset.merge(ca, cx))

    def reshape(self, a: FieldValue, shape: tuple[int, ...]) -> FieldValue:
        new = a.data.shape[1:2] + tuple(shape)
        digest = maxset.layout(a.digest, lambda d: d.reshape(new))
        return FieldValue(a.data.reshape((2,) + new), a.tainted, digest)

    def repeat(self, a: FieldValue, axis: int, times: int) -> FieldValue:
        digest = maxset.layout(a.digest, lambda d: np.repeat(d, times, axis=axis + 1))
        return FieldValue(np.repeat(a.data, times, axis=axis + 2), a.tainted, digest)

    def transpose(self, a: FieldValue, axis0: int, axis1: int) -> FieldValue:
        digest = maxset.layout(a.digest, lambda d: np.swapaxes(d, axis0 + 1, axis1 + 1))
        return FieldValue(np.swapaxes(a.data, axis0 + 2, axis1 + 2), a.tainted, digest)

    def concat(self, parts: Sequence[FieldValue], axis: int) -> FieldValue:
        data = np.concatenate([v.data for v in parts], axis=axis + 2)
        digest = maxset.concat([v.digest for v in parts], [v.data.shape[1:] for v in parts], axis + 1)
        return FieldValue(data, any(v.tainted for v in parts), digest)

    def slice(self, a: FieldValue, axis: int, start: int, stop: int) -> FieldValue:
        index = (slice(None),) * (axis + 1) + (slice(start, stop),)
        digest = maxset.layout(a.digest, lambda d: d[index])
        return FieldValue(a.data[(slice(None),) + index], a.tainted, digest)


def _limb_width(elements: int) -> int:
    """Exponent limb width for exp on ``elements`` values per trial.

    Tables (L · 2^w entries per trial, L = ceil(30 / w) limbs) are built once per arithmetic and reused by
    every exp of the evaluation (a µGraph calls exp once per block and iteration), so their cost is spread
    over a few calls; each element costs L gathers and L - 1 multiplications.
    """

    def cost(w: int) -> float:
        limbs = -(-_EXP_BITS // w)
        return limbs * (1 << w) / 8 + elements * (2 * limbs - 1)

    return min((4, 5, 6, 8, 10), key=cost)


def _powmod(x: np.ndarray, e: int, m: int) -> np.ndarray:
    """``x ** e mod m`` elementwise for residues ``x < m < 2^31`` (square-and-multiply on a public exponent)."""
    base = x % m
    acc = np.ones_like(base)
    while e:
        if e & 1:
            acc = acc * base % m
        e >>= 1
        if e:
            base = base * base % m
    return acc


def _limb_matmul(x: np.ndarray, y: np.ndarray, m: np.ndarray) -> np.ndarray:
    """``x @ y mod m`` for residues < 2^31 and inner dim ≤ 2^21, exactly, via two 16-bit limbs in float64 BLAS."""
    c0, c1, c2 = limb_products(x, y, 2)
    r32 = np.array([(1 << 32) % int(v) for v in m.ravel()], dtype=np.int64).reshape(m.shape)
    # (c2 mod m)·(2^32 mod m) < 2^62, (c1 mod m)·2^16 < 2^47, c0 < 2^53: the sum stays below 2^63.
    return ((c2 % m) * r32 + (c1 % m) * (1 << _LIMB) + c0) % m


__all__ = [
    "ACTIVATION_KINDS",
    "KEYED",
    "FieldArith",
    "FieldValue",
    "check_moduli",
    "field_constant",
    "rational_of",
]

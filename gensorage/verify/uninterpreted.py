"""The first verification tier: one large prime field with exp, sqrt, activations and max uninterpreted.

:class:`UninterpretedArith` is the :class:`gensorage.arith.Arith` of ``Z_M61`` (``M61 = 2^61 - 1``) over ``T``
independent trials: a value holds uint64 residues of shape ``(T, *shape)``.

- add / sub / mul / scale / matmul / reduce_sum: exact field arithmetic (:mod:`gensorage.verify.mersenne`);
  scale factors are the rationals of :func:`gensorage.verify.field.rational_of` mapped into the field.
- div: multiplication by the batch inverse; a zero divisor element makes the trial degenerate (discarded).
- exp, sqrt, relu / silu / gelu / tanh / log, and clamp (one function per pair of bounds): *random functions* — a keyed hash of the argument's residue, with one key per
  function symbol and trial, shared by both sides. No law of the function is used (not even
  ``exp(a + b) = exp(a)·exp(b)``), so every op stays a deterministic function of its arguments: a pass proves
  equality for every function in each symbol's place, hence for the real one.
- reduce_max / accumulate(max): a random function of the flattened multiset (:mod:`gensorage.verify.maxset`).

Why it scales: a trial's false-accept probability is about ``(number of function arguments)² / 2^61`` plus a
degree over ``2^61`` (no exponential-term counts), so one or two trials reach δ = 10⁻⁹ (docs/verification.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from gensorage.arith import AccumKind, Activation
from gensorage.opset import clamp_symbol
from gensorage.verify import maxset, mersenne
from gensorage.verify.field import field_constant
from gensorage.verify.limbs import batch_inverse

#: The uninterpreted function symbols with a hash key each ("max" hashes digests, "max-element" elements).
#: "clamp" is the base key of the clamps, one symbol per pair of bounds (:func:`gensorage.opset.clamp_symbol`).
SYMBOLS: tuple[str, ...] = (
    "exp",
    "sqrt",
    "relu",
    "silu",
    "gelu",
    "tanh",
    "log",
    "clamp",
    "max",
    "max-element",
)


class UFValue:
    """Residues in ``Z_M61`` (uint64, shape ``(T, *shape)``) and, for max results, their multiset digests."""

    __slots__ = ("data", "digest")

    def __init__(self, data: np.ndarray, digest: np.ndarray | None = None) -> None:
        self.data = data
        self.digest = digest

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape[1:]  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"UFValue(shape={self.shape}, trials={self.data.shape[0]})"


class UninterpretedArith:
    """The :class:`gensorage.arith.Arith` of ``Z_M61`` with uninterpreted functions, over ``trials`` trials.

    Parameters
    ----------
    trials : int
        Number of independent trials held in every value.
    rng : numpy.random.Generator
        Source of the inputs drawn by :meth:`random_input` and of the function keys when ``keys`` is None.
    keys : mapping, optional
        Per symbol, one uint64 key per trial; pass the same keys to every arithmetic whose results are compared.
    """

    name = "uninterpreted"
    #: Exact: a value's residues do not depend on how elements are batched, so the µGraph evaluator may stack a
    #: grid's blocks (:mod:`gensorage.ugraph.stacked`).
    stacks_blocks = True
    p = mersenne.M61

    def __init__(
        self, trials: int, rng: np.random.Generator, *, keys: Mapping[str, np.ndarray] | None = None
    ) -> None:
        if trials < 1:
            raise ValueError(f"trials must be positive, got {trials}")
        self.trials, self.rng = trials, rng
        if keys is None:
            keys = {s: rng.integers(0, 2**63, size=trials, dtype=np.uint64) for s in SYMBOLS}
        self.keys = dict(keys)
        #: Per trial: some divisor element was zero (the trial must be discarded).
        self.degenerate = np.zeros(trials, dtype=bool)
        self._scale_cache: dict[float, np.uint64] = {}

    # ------------------------------------------------------------------------------------ construction

    def random_input(self, shape: Sequence[int]) -> UFValue:
        """A value uniform in ``Z_M61`` per element and trial."""
        size = (self.trials,) + tuple(int(s) for s in shape)
        # The top 61 bits of raw 64-bit draws are uniform on [0, 2^61); the one value ≥ M61 (the largest, so one
        # max() finds it) is redrawn.
        raw = self.rng.bit_generator.random_raw(size)
        np.right_shift(raw, np.uint64(3), out=raw)
        while raw.size and raw.max() == np.uint64(mersenne.M61):
            bad = raw == np.uint64(mersenne.M61)
            raw[bad] = self.rng.bit_generator.random_raw(int(bad.sum())) >> np.uint64(3)
        return UFValue(raw)

    def value(self, residues: np.ndarray) -> UFValue:
        """A value from explicit residues of shape ``(T, *shape)`` (reduced mod M61)."""
        r = np.asarray(residues)
        if r.ndim < 1 or r.shape[0] != self.trials:
            raise ValueError(f"residues must have shape (T={self.trials}, ...), got {r.shape}")
        return UFValue(np.asarray(np.asarray(r, dtype=object) % mersenne.M61, dtype=np.uint64))

    def equal(self, a: UFValue, b: UFValue) -> np.ndarray:
        """Per trial: do ``a`` and ``b`` agree everywhere?"""
        return self.mismatch(a, b).reshape(self.trials, -1).any(axis=1) == 0

    def mismatch(self, a: UFValue, b: UFValue) -> np.ndarray:
        """Boolean ``(T, *shape)``: where ``a`` and ``b`` differ."""
        if a.shape != b.shape:
            raise ValueError(f"cannot compare values of shapes {a.shape} and {b.shape}")
        return a.data != b.data  # type: ignore[no-any-return]

    # ------------------------------------------------------------------------------------ helpers

    def _key(self, symbol: str, ndim: int) -> np.ndarray:
        key = self.keys.get(symbol)
        if key is None:  # a clamp's symbol: derived from the family's key (computed once per arithmetic)
            key = self.keys[symbol] = maxset.symbol_key(self.keys["clamp"], symbol)
        return key.reshape((-1,) + (1,) * ndim)

    def _align(self, a: UFValue, b: UFValue) -> tuple[np.ndarray, np.ndarray]:
        """Both data arrays with equal logical rank (singleton dims inserted after the trial axis)."""
        x, y = a.data, b.data
        if x.ndim < y.ndim:
            x = x.reshape(x.shape[:1] + (1,) * (y.ndim - x.ndim) + x.shape[1:])
        elif y.ndim < x.ndim:
            y = y.reshape(y.shape[:1] + (1,) * (x.ndim - y.ndim) + y.shape[1:])
        return x, y

    def _apply(self, symbol: str, a: UFValue) -> UFValue:
        return UFValue(maxset.keyed_hash(a.data, self._key(symbol, a.data.ndim - 1)))

    def _max_of(self, digest: np.ndarray) -> UFValue:
        return UFValue(maxset.keyed_hash(digest, self._key("max", digest.ndim - 1)), digest)

    def _contributions(self, a: UFValue) -> np.ndarray:
        return maxset.contributions(a.data, a.digest, self._key("max-element", a.data.ndim - 1))

    # ------------------------------------------------------------------------------------ Arith protocol

    def shape(self, a: UFValue) -> tuple[int, ...]:
        return a.shape

    def add(self, a: UFValue, b: UFValue) -> UFValue:
        return UFValue(mersenne.add(*self._align(a, b)))

    def sub(self, a: UFValue, b: UFValue) -> UFValue:
        return UFValue(mersenne.sub(*self._align(a, b)))

    def mul(self, a: UFValue, b: UFValue) -> UFValue:
        return UFValue(mersenne.mul(*self._align(a, b)))

    def div(self, a: UFValue, b: UFValue) -> UFValue:
        zero = b.data == 0
        self.degenerate |= zero.reshape(self.trials, -1).any(axis=1)
        inv = batch_inverse(b.data.reshape(1, -1), (mersenne.M61,), mersenne.mul).reshape(b.data.shape)
        return self.mul(a, UFValue(inv))

    def exp(self, a: UFValue) -> UFValue:
        return self._apply("exp", a)

    def sqrt(self, a: UFValue) -> UFValue:
        return self._apply("sqrt", a)

    def _constant(self, x: float) -> np.uint64:
        c = self._scale_cache.get(x)
        if c is None:
            c = self._scale_cache[x] = np.uint64(field_constant(x, mersenne.M61))
        return c

    def scale(self, a: UFValue, factor: float) -> UFValue:
        return UFValue(mersenne.mul(a.data, self._constant(factor)))

    def add_scalar(self, a: UFValue, value: float) -> UFValue:
        return UFValue(mersenne.add(a.data, np.full_like(a.data, self._constant(value))))

    def activation(self, kind: Activation, a: UFValue) -> UFValue:
        return self._apply(kind, a)

    def clamp(self, a: UFValue, lo: float | None, hi: float | None) -> UFValue:
        return self._apply(clamp_symbol(lo, hi), a)

    def matmul(self, a: UFValue, b: UFValue) -> UFValue:
        return UFValue(mersenne.matmul(*self._align(a, b)))

    def reduce_sum(self, a: UFValue, axis: int, keepdims: bool) -> UFValue:
        return UFValue(mersenne.sum_axis(a.data, axis + 1, keepdims))

    def reduce_max(self, a: UFValue, axis: int, keepdims: bool) -> UFValue:
        if a.shape[axis] == 1:  # max({s}) = s
            return a if keepdims else self.reshape(a, a.shape[:axis] + a.shape[axis + 1 :])
        return self._max_of(maxset.reduce_digest(self._contributions(a), axis + 1, keepdims))

    def accumulate(self, acc: UFValue | None, x: UFValue, kind: AccumKind) -> UFValue:
        if acc is None:
            return UFValue(x.data.copy(), None if x.digest is None else x.digest.copy())
        if kind == "sum":
            return self.add(acc, x)
        ca, cx = np.broadcast_arrays(self._contributions(acc), self._contributions(x))
        return self._max_of(maxset.merge(ca, cx))

    def reshape(self, a: UFValue, shape: tuple[int, ...]) -> UFValue:
        new = a.data.shape[:1] + tuple(shape)
        return UFValue(a.data.reshape(new), maxset.layout(a.digest, lambda d: d.reshape(new)))

    def repeat(self, a: UFValue, axis: int, times: int) -> UFValue:
        return UFValue(
            np.repeat(a.data, times, axis=axis + 1),
            maxset.layout(a.digest, lambda d: np.repeat(d, times, axis=axis + 1)),
        )

    def transpose(self, a: UFValue, axis0: int, axis1: int) -> UFValue:
        return UFValue(
            np.swapaxes(a.data, axis0 + 1, axis1 + 1),
            maxset.layout(a.digest, lambda d: np.swapaxes(d, axis0 + 1, axis1 + 1)),
        )

    def concat(self, parts: Sequence[UFValue], axis: int) -> UFValue:
        data = np.concatenate([v.data for v in parts], axis=axis + 1)
        digest = maxset.concat([v.digest for v in parts], [v.data.shape for v in parts], axis + 1)
        return UFValue(data, digest)

    def slice(self, a: UFValue, axis: int, start: int, stop: int) -> UFValue:
        index = (slice(None),) * (axis + 1) + (slice(start, stop),)
        return UFValue(a.data[index], maxset.layout(a.digest, lambda d: d[index]))


__all__ = ["SYMBOLS", "UFValue", "UninterpretedArith"]

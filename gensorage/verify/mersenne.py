"""Exact arithmetic modulo the Mersenne prime ``M61 = 2^61 - 1`` on numpy uint64 arrays.

The first verification tier (:mod:`gensorage.verify.uninterpreted`) works in one large prime field, so that a
single trial already has a false-accept probability near ``1/p``. A Mersenne modulus makes reduction two shifts
and a mask (``2^61 ≡ 1``), and multiplying by ``2^k`` a 61-bit rotation.

- :func:`mul`: 31-bit halves give three partial products below ``2^62``; folded with ``2^61 ≡ 1`` their sum
  stays below ``2^64``, then one :func:`reduce`.
- :func:`sum_axis`: low 32 and high 29 bits are summed separately (exact below ``2^32`` terms) and recombined.
- :func:`matmul`: 16-bit limbs multiplied in float64 BLAS (the limb scheme of :mod:`gensorage.verify.field`,
  with four limbs instead of two), batched so the limb copies stay within a memory budget.
"""

from __future__ import annotations

import math

import numpy as np

from gensorage.verify.limbs import limb_products

#: The modulus, ``2^61 - 1`` (prime).
M61 = (1 << 61) - 1
_M = np.uint64(M61)
_LOW31 = np.uint64((1 << 31) - 1)
_LOW30 = np.uint64((1 << 30) - 1)
_LOW32 = np.uint64((1 << 32) - 1)
# A 61-bit residue is four 16-bit limbs (the top one 13 bits).
LIMBS = 4
# Bytes of float64 limb copies one batched matmul chunk may hold.
_CHUNK_BYTES = 64 << 20


def reduce(x: np.ndarray) -> np.ndarray:
    """``x mod M61`` for any uint64 ``x`` (fold the bits above 61 once, then one conditional subtraction)."""
    x = (x & _M) + (x >> np.uint64(61))
    return np.where(x >= _M, x - _M, x)


def rotate(x: np.ndarray, k: int) -> np.ndarray:
    """``x · 2^k mod M61`` for reduced ``x``: a 61-bit rotation left by ``k mod 61``."""
    k %= 61
    if k == 0:
        return x
    return ((x << np.uint64(k)) & _M) | (x >> np.uint64(61 - k))


def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return reduce(a + b)


def sub(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return reduce(a + (_M - b))


def mul(a: np.ndarray, b: np.ndarray | np.uint64) -> np.ndarray:
    """``a · b mod M61`` for reduced ``a``, ``b`` (broadcasting)."""
    ah, al = a >> np.uint64(31), a & _LOW31
    bh, bl = b >> np.uint64(31), b & _LOW31
    mid = ah * bl + al * bh  # < 2^62; mid · 2^31 = (mid >> 30) · 2^61 + (mid & low30) · 2^31
    # ah·bh · 2^62 ≡ 2·ah·bh < 2^61; (mid >> 30) < 2^32; (mid & low30) << 31 < 2^61; al·bl < 2^62: sum < 2^64.
    t = ((ah * bh) << np.uint64(1)) + (mid >> np.uint64(30)) + ((mid & _LOW30) << np.uint64(31)) + al * bl
    return reduce(t)


def sum_axis(a: np.ndarray, axis: int, keepdims: bool) -> np.ndarray:
    """Σ of reduced residues along ``axis`` mod M61, exact for fewer than 2^32 terms."""
    lo = np.asarray(np.sum(a & _LOW32, axis=axis, keepdims=keepdims, dtype=np.uint64))
    hi = np.asarray(np.sum(a >> np.uint64(32), axis=axis, keepdims=keepdims, dtype=np.uint64))
    return add(rotate(reduce(hi), 32), reduce(lo))


def constant(value: int) -> np.uint64:
    """A Python integer as a reduced uint64 residue."""
    return np.uint64(value % M61)


def _recombine(parts: list[np.ndarray]) -> np.ndarray:
    """``Σ_s parts[s] · 2^(16 s) mod M61`` for integer parts below 2^63."""
    acc: np.ndarray | None = None
    for s, c in enumerate(parts):
        term = rotate(reduce(c.astype(np.uint64)), 16 * s)
        acc = term if acc is None else acc + term  # at most 7 terms below 2^61: no overflow
    assert acc is not None
    return reduce(acc)


def _limb_matmul(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``x @ y mod M61`` for 3-d ``(B, r, K)`` and ``(B, K, c)``, K ≤ 2^21."""
    return _recombine(limb_products(x, y, LIMBS))


def matmul(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``x @ y mod M61`` (numpy matmul broadcasting of the leading dims), exact at any inner size.

    The inner dim is chunked at 2^21 (limb products must stay below 2^53); the broadcast batch is chunked so
    that the float64 limb copies of one chunk stay near 64 MiB.
    """
    batch = np.broadcast_shapes(x.shape[:-2], y.shape[:-2])
    rows, k, cols = x.shape[-2], x.shape[-1], y.shape[-1]
    xb = np.broadcast_to(x, batch + (rows, k)).reshape(-1, rows, k)
    yb = np.broadcast_to(y, batch + (k, cols)).reshape(-1, k, cols)
    per_item = 8 * LIMBS * (rows * k + k * cols + LIMBS * rows * cols)
    step = max(1, _CHUNK_BYTES // max(1, per_item))
    kstep = 1 << 21
    out = np.empty((xb.shape[0], rows, cols), dtype=np.uint64)
    for b0 in range(0, xb.shape[0], step):
        acc: np.ndarray | None = None
        for k0 in range(0, k, kstep):
            part = _limb_matmul(xb[b0 : b0 + step, :, k0 : k0 + kstep], yb[b0 : b0 + step, k0 : k0 + kstep])
            acc = part if acc is None else add(acc, part)
        assert acc is not None
        out[b0 : b0 + step] = acc
    return out.reshape(batch + (rows, cols))


def log2_modulus() -> float:
    return math.log2(M61)


__all__ = [
    "LIMBS",
    "M61",
    "add",
    "constant",
    "log2_modulus",
    "matmul",
    "mul",
    "reduce",
    "rotate",
    "sub",
    "sum_axis",
]

"""Exact arithmetic modulo the Mersenne prime ``M61 = 2^61 - 1`` on numpy uint64 arrays.

The first verification tier (:mod:`gensorage.verify.uninterpreted`) works in one large prime field, so that a
single trial already has a false-accept probability near ``1/p``. A Mersenne modulus makes reduction two shifts
and a mask (``2^61 ≡ 1``), and multiplying by ``2^k`` a 61-bit rotation.

- :func:`mul`: 31-bit halves give three partial products below ``2^62``; folded with ``2^61 ≡ 1`` their sum
  stays below ``2^64``, then one :func:`reduce`.
- :func:`sum_axis`: low 32 and high 29 bits are summed separately (exact below ``2^32`` terms) and recombined.
- :func:`matmul`: limbs multiplied in float64 BLAS (the limb scheme of :mod:`gensorage.verify.field`), with
  the limb widths chosen per shape (:func:`plans`): three 21-bit limbs a side when both operands are large, a
  large operand's two 32-bit words against narrow limbs of a small one for skinny products (decode attention).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from gensorage.verify.blas import single_threaded
from gensorage.verify.limbs import split

#: The modulus, ``2^61 - 1`` (prime).
M61 = (1 << 61) - 1
_M = np.uint64(M61)
_LOW31 = np.uint64((1 << 31) - 1)
_LOW30 = np.uint64((1 << 30) - 1)
_LOW32 = np.uint64((1 << 32) - 1)
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


# --------------------------------------------------------------------------------------------- matmul

#: Products of limbs are summed in float64, exact below 2^53: limb widths wx + wy plus log2 of the inner chunk
#: must not exceed this.
_EXACT_BITS = 53
# Cost model of a limb plan, in element passes (one numpy pass over one uint64 element): a limb copied from a
# word view costs one, a shifted and masked limb three; a pass is worth this many flops of float64 GEMM.
_FLOPS_PER_PASS = 64


@dataclass(frozen=True, slots=True)
class LimbPlan:
    """How :func:`matmul` splits its operands: limb widths of x and of y, and the inner-dim chunk."""

    x_widths: tuple[int, ...]
    y_widths: tuple[int, ...]
    kstep: int

    def cost(self, batch: int, rows: int, k: int, cols: int) -> float:
        """Estimated element passes for a ``(batch, rows, k) @ (batch, k, cols)`` product."""

        def split(n: int, widths: tuple[int, ...]) -> float:
            return n * sum(1 if w in (16, 32) else 3 for w in widths)

        lx, ly = len(self.x_widths), len(self.y_widths)
        chunks = -(-k // self.kstep)
        gemm = 2 * lx * ly * batch * rows * k * cols / _FLOPS_PER_PASS
        recombine = batch * rows * cols * (lx * ly * chunks + 5 * (lx + ly))
        return (
            split(batch * rows * k, self.x_widths) + split(batch * k * cols, self.y_widths) + gemm + recombine
        )


def _widths(width: int) -> tuple[int, ...]:
    """61 bits as limbs of ``width`` bits (the last one the rest)."""
    n = -(-61 // width)
    return (width,) * (n - 1) + (61 - width * (n - 1),)


def plans(k: int) -> list[LimbPlan]:
    """The limb plans :func:`matmul` chooses from for inner size ``k``, each exact (``wx + wy + log2 kstep ≤ 53``).

    Three 21-bit limbs on each side (9 limb products, chunks of 2^11) suit products whose operands are both
    large; for a skinny product, the large operand in its two 32-bit words (copied, not shifted) and the small
    one in as many narrow limbs as exactness needs.
    """
    kstep = min(max(k, 1), 1 << 12)
    kbits = (kstep - 1).bit_length()
    narrow = _widths(_EXACT_BITS - 32 - kbits)
    wide = (32, 29)
    sym = min(max(k, 1), 1 << (_EXACT_BITS - 42))
    return [
        LimbPlan(_widths(21), _widths(21), sym),
        LimbPlan(wide, narrow, kstep),
        LimbPlan(narrow, wide, kstep),
        LimbPlan(_widths(16), _widths(16), min(max(k, 1), 1 << (_EXACT_BITS - 32))),
    ]


def _offsets(widths: tuple[int, ...]) -> np.ndarray:
    return np.cumsum((0,) + widths[:-1])


def _place(g: np.ndarray, s: int) -> np.ndarray:
    """A value ≡ ``g · 2^s`` (mod M61) below ``2^61 + (g >> (61 - s))``, for any uint64 ``g`` and 0 ≤ s < 61.

    ``g = lo + hi·2^(61-s)`` with ``lo < 2^(61-s)``: ``g·2^s = lo·2^s + hi·2^61 ≡ lo·2^s + hi``.
    """
    if s == 0:
        return g
    lo = np.left_shift(g, np.uint64(s))
    np.bitwise_and(lo, _M, out=lo)
    return np.add(lo, np.right_shift(g, np.uint64(61 - s)), out=lo)


@lru_cache(maxsize=64)
def _groups(plan: LimbPlan) -> tuple[tuple[int, tuple[tuple[int, int], ...]], ...]:
    """The limb pairs ``(i, j)`` of each shift ``s_i + t_j mod 61``, by shift."""
    groups: dict[int, list[tuple[int, int]]] = {}
    for i, si in enumerate(_offsets(plan.x_widths)):
        for j, tj in enumerate(_offsets(plan.y_widths)):
            groups.setdefault(int(si + tj) % 61, []).append((i, j))
    return tuple((s, tuple(m)) for s, m in sorted(groups.items()))


def _recombine(products: np.ndarray, plan: LimbPlan, rows: int, cols: int, units: int) -> np.ndarray:
    """``Σ_ij c_ij · 2^(s_i + t_j) mod M61`` from the limb products ``c`` (uint64, each below ``units · 2^53``).

    Products of equal shift (mod 61) are added first (kept below 8·2^53 = 2^56, else reduced), so each shift
    costs one placement; placed terms (each below 2^61 + 2^56) are folded every seven additions.
    """
    lx, ly = len(plan.x_widths), len(plan.y_widths)
    terms = products.reshape(products.shape[0], lx, rows, ly, cols)
    out: np.ndarray | None = None
    pending = 0
    for s, members in _groups(plan):
        g = terms[:, members[0][0], :, members[0][1], :]
        for i, j in members[1:]:
            g = g + terms[:, i, :, j, :]
        if len(members) * units > 8:
            g = reduce(g)
        term = _place(g, s)
        if out is None:
            out = np.array(term, copy=True)
        else:
            if pending == 7:
                out, pending = (out & _M) + (out >> np.uint64(61)), 0
            np.add(out, term, out=out)
        pending += 1
    assert out is not None
    return reduce(out)


def _chunk_product(x: np.ndarray, y: np.ndarray, plan: LimbPlan) -> np.ndarray:
    """``x @ y mod M61`` for 3-d ``(B, r, K)`` and ``(B, K, c)``: limb products in float64, then recombined."""
    rows, k, cols = x.shape[-2], x.shape[-1], y.shape[-1]
    xl, yl = split(x, plan.x_widths, -2), split(y, plan.y_widths, -1)
    widest = max(len(m) for _, m in _groups(plan))
    acc: np.ndarray | None = None
    units = 0  # acc < units · 2^53
    for k0 in range(0, k, plan.kstep):
        c = np.matmul(xl[..., k0 : k0 + plan.kstep], yl[..., k0 : k0 + plan.kstep, :])
        # Each entry is an integer below 2^53; convert before adding, as a float64 sum would round.
        part = c.astype(np.uint64)
        acc = part if acc is None else np.add(acc, part, out=acc)
        units += 1
        if (units + 1) * widest > 2048:  # one more chunk could overflow a group's sum: reduce (below 2^61)
            acc, units = reduce(acc), 256
    assert acc is not None
    return _recombine(acc, plan, rows, cols, units)


#: Products with at least this many rows and columns use BLAS's threads. Skinny ones (a decode step's few rows)
#: measured 5-100x slower with two threads on a loaded 2-core machine; a 512-row prefill product ran 1.8x
#: faster with two threads on an idle one (1.36 s -> 0.75 s per check) and no slower on a loaded one.
THREADED_FROM = 64
#: ... and at least this many scalar products (batch · rows · inner · cols). Small square ones (a 100-token
#: layer's (100 × 64) @ (64 × 128), under a millisecond on one thread) took 10-40 ms each with two threads
#: inside a check on the loaded 2-core machine, where threads woken between numpy calls wait for a core: the
#: 100-token equivalence check spent 0.96 s of 1.38 s in 36 such products.
THREADED_WORK = 1 << 27


def matmul(x: np.ndarray, y: np.ndarray, plan: LimbPlan | None = None) -> np.ndarray:
    """``x @ y mod M61`` (numpy matmul broadcasting of the leading dims), exact at any inner size.

    The limb plan is ``plan`` or the cheapest of :func:`plans` by :meth:`LimbPlan.cost`; the broadcast batch is chunked so
    that the float64 limb copies of one chunk stay near 64 MiB. A skinny product (fewer than
    :data:`THREADED_FROM` rows or columns) or a small one (fewer than :data:`THREADED_WORK` scalar products)
    runs BLAS single-threaded (:func:`gensorage.verify.blas.single_threaded`); a large one uses BLAS's threads.
    """
    batch = np.broadcast_shapes(x.shape[:-2], y.shape[:-2])
    rows, k, cols = x.shape[-2], x.shape[-1], y.shape[-1]
    items = math.prod(batch)
    if plan is None:
        plan = min(plans(k), key=lambda p: p.cost(items, rows, k, cols))
    xb = np.broadcast_to(x, batch + (rows, k)).reshape(-1, rows, k)
    yb = np.broadcast_to(y, batch + (k, cols)).reshape(-1, k, cols)
    lx, ly = len(plan.x_widths), len(plan.y_widths)
    per_item = 8 * (lx * rows * k + ly * k * cols + 2 * lx * ly * rows * cols)
    step = max(1, _CHUNK_BYTES // max(1, per_item))
    out = np.zeros((xb.shape[0], rows, cols), dtype=np.uint64)
    if k == 0:  # an empty sum
        return out.reshape(batch + (rows, cols))
    threaded = min(rows, cols) >= THREADED_FROM and items * rows * k * cols >= THREADED_WORK
    with contextlib.nullcontext() if threaded else single_threaded():
        for b0 in range(0, xb.shape[0], step):
            out[b0 : b0 + step] = _chunk_product(xb[b0 : b0 + step], yb[b0 : b0 + step], plan)
    return out.reshape(batch + (rows, cols))


def log2_modulus() -> float:
    return math.log2(M61)


__all__ = [
    "LimbPlan",
    "M61",
    "add",
    "constant",
    "log2_modulus",
    "matmul",
    "mul",
    "plans",
    "reduce",
    "rotate",
    "sub",
    "sum_axis",
]

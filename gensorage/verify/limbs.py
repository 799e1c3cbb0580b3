"""Limb matmul and batch inversion shared by both fields (``Z_p × Z_q`` and ``Z_M61``).

- :func:`split`: residues as float64 limbs of any widths (the first tier's matmul chooses them per shape).
- :func:`limb_products`: split residues into 16-bit limbs, multiply the stacked limbs in one float64 BLAS
  matmul (exact while every entry is below 2^53), and return the sums of limb products grouped by shift; each
  field recombines them with its own reduction.
- :func:`batch_inverse`: Montgomery's trick on a product tree, with the field's own modular multiplication.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

LIMB = 16


def limbs(x: np.ndarray, axis: int, count: int) -> np.ndarray:
    """The ``count`` 16-bit limbs of non-negative int64 / uint64 ``x`` (low first) stacked along ``axis``
    (-1 or -2), as float64.

    The limbs are read through a little-endian uint16 view of ``x`` and written straight into the float result
    (one strided pass per limb, no integer temporaries), which dominates the cost at paper shapes.
    """
    n = x.shape[axis]
    shape = list(x.shape)
    shape[axis] = count * n
    out = np.empty(shape, dtype=np.float64)
    words = np.ascontiguousarray(x, dtype=x.dtype.newbyteorder("<")).view("<u2").reshape(x.shape + (4,))
    for j in range(count):
        part = out[..., j * n : (j + 1) * n] if axis == -1 else out[..., j * n : (j + 1) * n, :]
        np.copyto(part, words[..., j], casting="unsafe")
    return out


def split(x: np.ndarray, widths: Sequence[int], axis: int) -> np.ndarray:
    """The limbs of uint64 ``x`` (low first; limb j holds the ``widths[j]`` bits above the earlier limbs, the last
    one every bit left) stacked along ``axis`` (-1 or -2), as float64.

    A limb that is a whole aligned 16- or 32-bit word is copied straight from a little-endian view (one strided
    pass); any other limb costs a shift, a mask and a conversion.
    """
    n = x.shape[axis]
    shape = list(x.shape)
    shape[axis] = len(widths) * n
    out = np.empty(shape, dtype=np.float64)
    words: dict[int, np.ndarray] = {}
    tmp: np.ndarray | None = None
    start = 0
    for j, w in enumerate(widths):
        part = out[..., j * n : (j + 1) * n] if axis == -1 else out[..., j * n : (j + 1) * n, :]
        last = j == len(widths) - 1
        word = next((b for b in (32, 16) if start % b == 0 and (w == b or (last and start + b == 64))), 0)
        if word:
            if word not in words:
                xc = np.ascontiguousarray(x, dtype=x.dtype.newbyteorder("<"))
                words[word] = xc.view(f"<u{word // 8}").reshape(x.shape + (64 // word,))
            np.copyto(part, words[word][..., start // word], casting="unsafe")
        else:
            tmp = np.right_shift(x, np.uint64(start), out=tmp)
            if not last:
                np.bitwise_and(tmp, np.uint64((1 << w) - 1), out=tmp)
            np.copyto(part, tmp, casting="unsafe")
        start += w
    return out


def limb_products(x: np.ndarray, y: np.ndarray, count: int) -> list[np.ndarray]:
    """``c[s] = Σ_{i+j=s} x_i @ y_j`` (int64) for the ``count`` limbs of ``x`` and ``y``; ``x @ y = Σ c[s]·2^(16s)``.

    One matmul of ``[x_0; …; x_{count-1}] @ [y_0, …, y_{count-1}]`` yields every limb product; each entry is a
    sum of K products below 2^32, exact in float64 while K < 2^21, and each ``c[s]`` sums at most ``count`` of
    them (below 2^55).
    """
    rows, cols = x.shape[-2], y.shape[-1]
    c = np.matmul(limbs(x, -2, count), limbs(y, -1, count)).astype(np.int64)
    out: list[np.ndarray] = []
    for s in range(2 * count - 1):
        acc: np.ndarray | None = None
        for i in range(max(0, s - count + 1), min(s, count - 1) + 1):
            block = c[..., i * rows : (i + 1) * rows, (s - i) * cols : (s - i + 1) * cols]
            acc = block if acc is None else acc + block
        assert acc is not None
        out.append(acc)
    return out


Mul = Callable[[np.ndarray, np.ndarray], np.ndarray]


def batch_inverse(x: np.ndarray, mods: Sequence[int], mul: Mul) -> np.ndarray:
    """Inverses of the residues in row c of ``x`` (shape ``(len(mods), n)``) modulo ``mods[c]``; 0 maps to 0.

    ``mul(a, b)`` multiplies rows modulo their moduli. Montgomery's trick on a product tree: multiply pairs up to
    one product per row, invert that with Python's ``pow(v, -1, m)``, and walk back down (the inverse of a left
    child is the parent's inverse times the right child). About 3n modular multiplications and 8·log2(n) numpy
    calls, against ~45n multiplications and ~100 calls for Fermat's ``y^(m-2)``.
    """
    rows = len(mods)
    zero = x == 0
    level = np.where(zero, np.ones(1, dtype=x.dtype), x)
    levels: list[np.ndarray] = []
    while level.shape[1] > 1:
        if level.shape[1] % 2:
            level = np.concatenate([level, np.ones((rows, 1), dtype=x.dtype)], axis=1)
        levels.append(level)
        level = mul(level[:, 0::2], level[:, 1::2])
    inv = np.array([[pow(int(level[c, 0]), -1, mods[c])] for c in range(rows)], dtype=x.dtype)
    for lvl in reversed(levels):
        inv = inv[:, : lvl.shape[1] // 2]  # drop the inverse of a padding 1
        out = np.empty_like(lvl)
        out[:, 0::2] = mul(inv, lvl[:, 1::2])
        out[:, 1::2] = mul(inv, lvl[:, 0::2])
        inv = out
    inv = inv[:, : x.shape[1]]
    inv[zero] = 0
    return inv


__all__ = ["LIMB", "batch_inverse", "limb_products", "limbs", "split"]

"""Max as an uninterpreted function of the multiset it reduces, shared by both verification tiers.

Neither field has an order, so ``max`` is evaluated as a random function of the *flattened multiset* of
elements it is taken over: ``max(S) = G(σ(S))`` with the digest ``σ(S) = Σ_{s ∈ S} r(s) mod M61`` for keyed
random functions ``r`` (of an element's residue) and ``G``. Every max result carries its digest, so a max over
elements that are themselves max results merges their multisets instead of hashing them again:

- ``max(max(S), max(T)) = max(S ⊎ T)`` — a max-accumulator over loop iterations, a max over partial maxima of a
  split row and one max over the whole row all give the same value (associativity, commutativity);
- ``max({s}) = s`` — a max over a dim of size 1, and the first value of an accumulator, are the element itself.

Idempotence (``max(x, x) = x``) is *not* respected: a program that relies on it (a max over a repeated tensor)
is rejected, never wrongly accepted. Soundness: the real max is a function of the multiset obeying both rules
above, so programs equal for every function in max's place are equal for the real max (docs/verification.md).

A digest array has the value's logical shape (with the trial axis); :data:`RAW` marks elements that are not max
results. Arithmetic on a value drops its digest; layout ops move digests with their elements.
"""

from __future__ import annotations

import hashlib

import numpy as np

from gensorage.verify import mersenne

#: Digest of an element that is not a max result (above every residue).
RAW = np.uint64(1 << 63)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def mix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser on uint64 arrays (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def symbol_key(base: np.ndarray | int, symbol: str) -> np.ndarray:
    """The key of a function symbol of a family (one clamp per pair of bounds) from the family's ``base`` key:
    ``base`` mixed with a hash of the symbol's name, so both sides of a check derive the same key and distinct
    symbols get keys as unrelated as independent draws."""
    salt = int.from_bytes(hashlib.blake2b(symbol.encode(), digest_size=8).digest(), "little")
    with np.errstate(over="ignore"):  # wrapping multiplies (numpy warns on 0-d ones)
        return mix64(np.asarray(base, dtype=np.uint64) ^ np.uint64(salt))


def keyed_hash(x: np.ndarray, key: np.ndarray | np.uint64) -> np.ndarray:
    """A keyed pseudo-random function of uint64 ``x`` into ``Z_M61`` (the random oracle of the proofs).

    The top 61 bits of the hash, reduced: every residue but 0 has one preimage and 0 two, so the values are
    within a factor 1 + 2^-60 of uniform (reducing all 64 bits would make some residues 9/8 as likely).
    """
    return (mix64(mix64(x ^ key) + _GOLDEN) >> np.uint64(3)) % np.uint64(mersenne.M61)


def contributions(residues: np.ndarray, digest: np.ndarray | None, key: np.ndarray | np.uint64) -> np.ndarray:
    """Each element's share of a digest: its own digest if it is a max result, else ``r(element)``."""
    h = keyed_hash(residues.astype(np.uint64, copy=False), key)
    return h if digest is None else np.where(digest == RAW, h, digest)


def reduce_digest(contrib: np.ndarray, axis: int, keepdims: bool) -> np.ndarray:
    """σ of the multisets along ``axis`` (the trial axis is axis 0 of ``contrib``; ``axis`` counts it)."""
    return mersenne.sum_axis(contrib, axis, keepdims)


def merge(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """σ(S ⊎ T) from σ(S) and σ(T)."""
    return mersenne.add(a, b)


def layout(digest: np.ndarray | None, fn: object) -> np.ndarray | None:
    """Apply a layout function to a digest (None stays None)."""
    return None if digest is None else fn(digest)  # type: ignore[operator]


def concat(digests: list[np.ndarray | None], shapes: list[tuple[int, ...]], axis: int) -> np.ndarray | None:
    """Digests of a concatenation (trial axis first; ``axis`` counts it); None when no part has one."""
    if all(d is None for d in digests):
        return None
    parts = [
        np.full(s, RAW, dtype=np.uint64) if d is None else d for d, s in zip(digests, shapes, strict=True)
    ]
    return np.concatenate(parts, axis=axis)


__all__ = ["RAW", "concat", "contributions", "keyed_hash", "layout", "merge", "mix64", "reduce_digest"]

"""The probe sizes a block-graph structure is searched at: grid dims' block counts and the loop's trip count.

Two strategies (``SearchSpec.schedule``):

``"enumerate"`` (Mirage)
    Every power-of-two size that divides the dims it splits is tried; each verified µGraph at each size is a
    candidate, and the cost model ranks them.

``"markov"`` (Gensor's construction)
    The block-graph *structure* is searched at probe sizes (every divisor of the split dims, so shape and
    expression checks see a real tile; a structure found at several probes is kept once). Once a structure is
    verified, its sizes are constructed (:mod:`gensorage.construction.block_sizes`), and the sized µGraph is
    validated and verified again.
"""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=4096)
def size_candidates(extent: int, mode: str, hints: tuple[int, ...] = ()) -> tuple[int, ...]:
    """Sizes >= 2 to split a dim of ``extent`` into (a grid dim's block count or the loop's trip count).

    ``"enumerate"``: every power of two dividing ``extent``. ``"markov"`` (probe sizes for the structure search):
    the smallest prime factor (a real split that keeps the tile as large as possible), ``extent`` itself (a
    tile of one, which is what broadcasting against a size-1 dim needs) and every ``hint`` dividing ``extent``
    (the extents of the other inputs' dims: the sizes at which this input's tile lines up with another's).
    """
    if extent < 2:
        return ()
    if mode == "enumerate":
        out = []
        p = 2
        while p <= extent:
            if extent % p == 0:
                out.append(p)
            p *= 2
        return tuple(out)
    smallest = next(d for d in range(2, extent + 1) if extent % d == 0)
    return tuple(sorted({smallest, extent} | {h for h in hints if h >= 2 and extent % h == 0}))


def loop_candidates(extent: int, mode: str) -> tuple[int, ...]:
    """For-loop trip counts for a dim of ``extent``: as :func:`size_candidates` (enumerate), or just the smallest
    prime factor as the probe (markov: the trip count is constructed later, and a loop tile of one is never needed
    to line shapes up)."""
    cands = size_candidates(extent, mode)
    return cands if mode == "enumerate" else cands[:1]


__all__ = ["loop_candidates", "size_candidates"]

"""Which input dims a block tensor's dims index, and which input dims it has summed over.

Used for one pruning rule of the *last* kernel operator (the one whose outputs are the program's outputs): a
block graph may not reduce over an input dim that a grid dim splits. Each block would then sum over its chunk of
that dim only, and nothing after the last kernel combines the blocks' partial sums, so an output element would
depend on a part of the values the program sums over: no such µGraph is equivalent to a program without grouped
sums (the abstraction, like ``A_eq``, assumes no cancellation). Split reductions stay legal in earlier kernels
(FlashDecoding's split-KV kernel is one).

An *origin* is ``(iterator, input dim)``. A tensor's provenance is one origin set per dim (a broadcast dim joins
its operands' sets) plus the set of origins reduced on its way; reshape, concat and grouped sums make it opaque
(None), which switches the rule off downstream.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from gensorage.opset import (
    BINARY_ELEMENTWISE,
    REDUCTIONS,
    UNARY_ELEMENTWISE,
    Attrs,
    Op,
    Shape,
    attr,
    transposed,
)

Origins = frozenset[tuple[int, int]]
Dims = tuple[Origins, ...]
Provenance = tuple[Dims, Origins] | None

EMPTY: Origins = frozenset()


@lru_cache(maxsize=1024)
def of_iterator(i: int, ndim: int) -> Provenance:
    return tuple(frozenset({(i, d)}) for d in range(ndim)), EMPTY


def _broadcast(a: Dims, b: Dims, sa: Shape, sb: Shape) -> Dims:
    """Origins of a broadcast result: an operand dim of size 1 stretched over the other's adds nothing (its one
    element is repeated, not indexed)."""
    n = max(len(a), len(b))
    out = []
    for k in range(n, 0, -1):
        x = a[-k] if k <= len(a) else EMPTY
        y = b[-k] if k <= len(b) else EMPTY
        nx = sa[-k] if k <= len(sa) else 1
        ny = sb[-k] if k <= len(sb) else 1
        if nx == 1 and ny > 1:
            x = EMPTY
        elif ny == 1 and nx > 1:
            y = EMPTY
        out.append(x | y)
    return tuple(out)


def of_op(op: Op, attrs: Attrs, ins: Sequence[Provenance], shapes: Sequence[Shape]) -> Provenance:
    """Provenance of ``op``'s result (None when an operand is opaque or the op scrambles dims)."""
    if any(p is None for p in ins):
        return None
    dims = [p[0] for p in ins]  # type: ignore[index]
    reduced = EMPTY.union(*(p[1] for p in ins))  # type: ignore[index]
    if op in UNARY_ELEMENTWISE or op is Op.REPEAT:
        return dims[0], reduced
    if op is Op.TRANSPOSE:
        return transposed(dims[0], attr(attrs, "dim0"), attr(attrs, "dim1")), reduced
    if op in BINARY_ELEMENTWISE:
        return _broadcast(dims[0], dims[1], shapes[0], shapes[1]), reduced
    if op is Op.MATMUL:
        a, b = dims
        batch = _broadcast(a[:-2], b[:-2], shapes[0][:-2], shapes[1][:-2])
        if shapes[0][-1] > 1:
            reduced = reduced | a[-1] | b[-2]
        return (*batch, a[-2], b[-1]), reduced
    if op in REDUCTIONS and attr(attrs, "group") is None:
        d = attr(attrs, "dim")
        reduced = reduced | dims[0][d]
        if attr(attrs, "keepdim", op is Op.SUM):
            return dims[0][:d] + (EMPTY,) + dims[0][d + 1 :], reduced
        return dims[0][:d] + dims[0][d + 1 :], reduced
    return None


def splits_reduced(p: Provenance, split: Origins) -> bool:
    """Whether ``p`` has summed over an origin in ``split`` (the grid-split input dims)."""
    return p is not None and not p[1].isdisjoint(split)


__all__ = ["EMPTY", "Dims", "Origins", "Provenance", "of_iterator", "of_op", "splits_reduced"]

"""Canonical ranks of operators (Mirage §4.1): each µGraph is generated in exactly one operator order.

Mirage gives operator ``o_i`` the rank ``(I_i, t_i)`` — its input indices and type — and generates only graphs
whose operators appear in increasing rank. Compared lexicographically *as written*, input lists do not always
admit such an order: after ``a = f(1, 2)`` at index 3, ``b = g(0, 3)`` must follow ``a`` (it reads it) but
``(0, 3) < (1, 2)``. So the input list is compared by its indices sorted in *decreasing* order first:

    key(o) = (sorted(I, reverse=True), I, type code, attribute key)

With this key every DAG has exactly one topological order of increasing keys (the greedy order that always
places the smallest available key): an operator that becomes available when ``o`` is placed reads ``o``'s
output, the largest index so far, so its key's first entry exceeds every key placed before; an operator that
was available earlier and was passed over has a larger key than the one chosen. Uniqueness: in an increasing
order, a smaller available key would have to be placed later with a larger key, which cannot be. Identical
operators (same inputs, type and attributes) have equal keys and cannot both appear: they compute the same
tensor, so dropping the copy loses no µGraph worth finding.

Indices are tensor indices: a graph's inputs first, then every operator's outputs in order (``(node, out)``
pairs flattened, which preserves their order).
"""

from __future__ import annotations

from collections.abc import Sequence

RankKey = tuple[tuple[int, ...], tuple[int, ...], int, object]

# Type codes of the nodes that are not pre-defined operators (after every OpVariant code).
ACCUMULATOR_CODE = 1_000
GRAPH_DEFINED_CODE = 2_000


def rank_key(inputs: Sequence[int], code: int, attr_key: object = ()) -> RankKey:
    """The canonical rank of an operator reading tensor indices ``inputs``."""
    ins = tuple(inputs)
    return (tuple(sorted(ins, reverse=True)), ins, code, attr_key)


def head_key(inputs: Sequence[int], code: int) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """The rank without its attribute key (known before a graph-defined operator's block graph is)."""
    ins = tuple(inputs)
    return (tuple(sorted(ins, reverse=True)), ins, code)


def follows(prev: RankKey | None, key: RankKey) -> bool:
    """Whether an operator of rank ``key`` may follow one of rank ``prev`` (strictly increasing)."""
    return prev is None or _lt(prev, key)


def head_may_follow(prev: RankKey | None, head: tuple[tuple[int, ...], tuple[int, ...], int]) -> bool:
    """Whether some attribute key could make ``head`` follow ``prev`` (its head is not smaller)."""
    return prev is None or prev[:3] <= head


def _lt(a: RankKey, b: RankKey) -> bool:
    if a[:3] != b[:3]:
        return a[:3] < b[:3]
    return _attr_lt(a[3], b[3])


def _attr_lt(a: object, b: object) -> bool:
    # Attribute keys are tuples of plain values or strings; fall back to their repr for mixed types.
    try:
        return bool(a < b)  # type: ignore[operator]
    except TypeError:
        return repr(a) < repr(b)


__all__ = [
    "ACCUMULATOR_CODE",
    "GRAPH_DEFINED_CODE",
    "RankKey",
    "follows",
    "head_key",
    "head_may_follow",
    "rank_key",
]

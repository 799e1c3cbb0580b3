"""The online-softmax accumulators (FlashAttention-2): one loop step, written with :class:`Arith` primitives.

Per iteration, with score tile ``s`` (rows, keys last) and value tile ``v``:
``m' = max(m, rowmax(s))``, ``l' = l·exp(m − m') + Σ exp(s − m')``, ``o' = o·exp(m − m') + exp(s − m')·v``.
The state is ``(m, acc)``; the first iteration starts from ``m = rowmax(s)`` (the running maximum of no score is
−∞, which no field has). Written with primitives, the step means the same in every arithmetic that has no
method of its own for it: float64 numerics, both verification tiers (the first evaluates ``exp`` as a random
function, so it sees the rescale as a different program, and the second knows ``exp(a + b) = exp(a)·exp(b)``,
which telescopes the rescale), bounds and the float check. An arithmetic that abstracts the loop instead (the
search's abstract expressions) defines ``online_softmax(state, s, v, kind)`` and returns its own state.
"""

from __future__ import annotations

from typing import Any, TypeVar

from gensorage.arith import Arith
from gensorage.ugraph.ir import AccumKind

V = TypeVar("V")


def online_step(arith: Arith[V], state: Any, s: V, v: V | None, kind: AccumKind) -> Any:
    """The state after one more iteration (``state`` None before the first)."""
    own = getattr(arith, "online_softmax", None)
    if own is not None:
        return own(state, s, v, kind)
    keys = len(arith.shape(s)) - 1  # a non-negative axis: arithmetics keep trial axes in front
    tile_max = arith.reduce_max(s, keys, True)
    m = tile_max if state is None else arith.accumulate(state[0], tile_max, "max")
    p = arith.exp(arith.sub(s, m))
    part = arith.reduce_sum(p, keys, True) if kind == "softmax_sum" else arith.matmul(p, v)  # type: ignore[arg-type]
    if state is None:
        return (m, part)
    rescale = arith.exp(arith.sub(state[0], m))
    return (m, arith.add(arith.mul(state[1], rescale), part))


def online_result(arith: Arith[V], state: Any) -> V:
    """The accumulator's value after the loop (the sum relative to the row's full maximum)."""
    own = getattr(arith, "online_softmax_result", None)
    if own is not None:
        return own(state)  # type: ignore[no-any-return]
    return state[1]  # type: ignore[no-any-return]


__all__ = ["online_result", "online_step"]

"""The tiles of all blocks of a grid stacked along one leading axis, computed on together.

:class:`StackedArith` wraps an :class:`gensorage.arith.Arith`: its values are the inner arithmetic's values with
one extra leading axis, the block index, and every method applies the wrapped method to all blocks at once
(axes shifted by one, ranks aligned after the block axis so that numpy broadcasting inside a tile is
unchanged). The µGraph evaluator uses it to run a block graph's body once per for-loop iteration instead of once
per block and iteration (:func:`gensorage.ugraph.evaluate.run_block_graph`).

Why this computes the same values: every op of a block graph acts on each block's tiles alone, and each wrapped
op acts on each index of the leading axis alone (elementwise ops, matmul's batch dims, reductions and layout ops
along tile axes). So block ``b`` of a stacked result is the op applied to block ``b`` of the stacked arguments.
For exact arithmetics (the finite fields) that is equality of every residue; float64 is never stacked (BLAS and
numpy's summation order may depend on how an array is batched), so its results stay bit-identical.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, TypeVar

from gensorage.arith import AccumKind, Activation, Arith

V = TypeVar("V")


def can_stack(arith: object) -> bool:
    """Whether ``arith`` declares that batching does not change its results (``stacks_blocks = True``)."""
    return bool(getattr(arith, "stacks_blocks", False))


class StackedArith(Generic[V]):
    """The :class:`gensorage.arith.Arith` of per-block tiles stacked along a leading axis of ``inner`` values."""

    def __init__(self, inner: Arith[V]) -> None:
        self.inner = inner
        self.name = f"stacked-{inner.name}"

    # ------------------------------------------------------------------------------------ stacking

    def stack(self, tiles: Sequence[V]) -> V:
        """One stacked value from the tiles of every block (in block order)."""
        shape = self.inner.shape(tiles[0])
        rows = [self.inner.reshape(t, (1,) + shape) for t in tiles]
        return rows[0] if len(rows) == 1 else self.inner.concat(rows, 0)

    def unstack(self, x: V) -> list[V]:
        """The tile of every block of a stacked value (in block order)."""
        shape = self.inner.shape(x)
        return [self.inner.reshape(self.inner.slice(x, 0, b, b + 1), shape[1:]) for b in range(shape[0])]

    def _rank(self, a: V, ndim: int) -> V:
        """``a`` with singleton tile axes inserted in front so its tile has ``ndim`` axes (numpy broadcasting)."""
        shape = self.inner.shape(a)
        missing = ndim - (len(shape) - 1)
        if missing <= 0:
            return a
        return self.inner.reshape(a, shape[:1] + (1,) * missing + shape[1:])

    def _align(self, a: V, b: V) -> tuple[V, V]:
        ndim = max(len(self.shape(a)), len(self.shape(b)))
        return self._rank(a, ndim), self._rank(b, ndim)

    # ------------------------------------------------------------------------------------ Arith protocol

    def shape(self, a: V) -> tuple[int, ...]:
        return self.inner.shape(a)[1:]

    def add(self, a: V, b: V) -> V:
        return self.inner.add(*self._align(a, b))

    def sub(self, a: V, b: V) -> V:
        return self.inner.sub(*self._align(a, b))

    def mul(self, a: V, b: V) -> V:
        return self.inner.mul(*self._align(a, b))

    def div(self, a: V, b: V) -> V:
        return self.inner.div(*self._align(a, b))

    def exp(self, a: V) -> V:
        return self.inner.exp(a)

    def sqrt(self, a: V) -> V:
        return self.inner.sqrt(a)

    def scale(self, a: V, factor: float) -> V:
        return self.inner.scale(a, factor)

    def add_scalar(self, a: V, value: float) -> V:
        return self.inner.add_scalar(a, value)

    def activation(self, kind: Activation, a: V) -> V:
        return self.inner.activation(kind, a)

    def clamp(self, a: V, lo: float | None, hi: float | None) -> V:
        return self.inner.clamp(a, lo, hi)

    def matmul(self, a: V, b: V) -> V:
        return self.inner.matmul(*self._align(a, b))

    def reduce_sum(self, a: V, axis: int, keepdims: bool) -> V:
        return self.inner.reduce_sum(a, axis + 1, keepdims)

    def reduce_max(self, a: V, axis: int, keepdims: bool) -> V:
        return self.inner.reduce_max(a, axis + 1, keepdims)

    def accumulate(self, acc: V | None, x: V, kind: AccumKind) -> V:
        return self.inner.accumulate(acc, x, kind)

    def reshape(self, a: V, shape: tuple[int, ...]) -> V:
        return self.inner.reshape(a, self.inner.shape(a)[:1] + tuple(shape))

    def repeat(self, a: V, axis: int, times: int) -> V:
        return self.inner.repeat(a, axis + 1, times)

    def transpose(self, a: V, axis0: int, axis1: int) -> V:
        return self.inner.transpose(a, axis0 + 1, axis1 + 1)

    def concat(self, parts: Sequence[V], axis: int) -> V:
        return self.inner.concat(parts, axis + 1)

    def slice(self, a: V, axis: int, start: int, stop: int) -> V:
        return self.inner.slice(a, axis + 1, start, stop)


__all__ = ["StackedArith", "can_stack"]

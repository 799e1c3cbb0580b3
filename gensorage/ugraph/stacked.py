"""The tiles of all blocks of a grid stacked along one leading axis, computed on together.

:class:`StackedArith` wraps an :class:`gensorage.arith.Arith`: its values are the inner arithmetic's values with
one extra leading axis, the block index, and every method applies the wrapped method to all blocks at once
(axes shifted by one, ranks aligned after the block axis so that numpy broadcasting inside a tile is
unchanged). The µGraph evaluator uses it to run a block graph's body once per for-loop iteration instead of once
per block and iteration (:func:`gensorage.ugraph.evaluate.run_block_graph`). :func:`stacked_tiles` cuts every
block's tile of an iterator out of its whole input into such a value, and :func:`assemble_stacked` lays a
saver's stacked tiles out into its output, each with a handful of layout ops however large the grid.

Why this computes the same values: every op of a block graph acts on each block's tiles alone, and each wrapped
op acts on each index of the leading axis alone (elementwise ops, matmul's batch dims, reductions and layout ops
along tile axes). So block ``b`` of a stacked result is the op applied to block ``b`` of the stacked arguments.
The tiles and the assembly are layout ops (reshape, repeat, axis swaps), which move values without computing
on them. For exact arithmetics (the finite fields) that is equality of every residue; float64 is never stacked (BLAS and
numpy's summation order may depend on how an array is batched), so its results stay bit-identical.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Generic, TypeVar

from gensorage.arith import AccumKind, Activation, Arith
from gensorage.errors import UGraphError

V = TypeVar("V")


def can_stack(arith: object) -> bool:
    """Whether ``arith`` declares that batching does not change its results (``stacks_blocks = True``)."""
    return bool(getattr(arith, "stacks_blocks", False))


class StackedArith(Generic[V]):
    """The :class:`gensorage.arith.Arith` of per-block tiles stacked along a leading axis of ``inner`` values."""

    def __init__(self, inner: Arith[V]) -> None:
        self.inner = inner
        self.name = f"stacked-{inner.name}"

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


Label = tuple[str, int]  # ("g", grid dim) or ("t", tile dim): what an axis of a value being re-laid-out holds


def _permute(arith: Arith[V], x: V, labels: list[Label], order: Sequence[Label]) -> V:
    """``x`` with its axes (named by ``labels``, updated in place) moved into ``order``, by pairwise swaps."""
    for pos, want in enumerate(order):
        at = labels.index(want)
        if at != pos:
            x = arith.transpose(x, pos, at)
            labels[pos], labels[at] = labels[at], labels[pos]
    return x


def stacked_tiles(arith: Arith[V], x: V, imap: Sequence[int | None], grid: Sequence[int]) -> V:
    """Every block's tile of ``x`` under ``imap``, stacked along a new leading axis in block order (x major).

    The same values as cutting each block's tile out with slices (x, y, z in order, each splitting what the
    previous left) and stacking them, written as one reshape, a repeat per replica grid dim and axis swaps:
    data dim ``d`` split by grid dims ``g1 < g2 …`` is ``(n_g1, n_g2, …, rest)`` in row-major order, so block
    ``(b_g1, b_g2, …)``'s chunk is index ``(b_g1, b_g2, …)`` of the split axes.
    """
    shape = arith.shape(x)
    split: list[int] = []
    labels: list[Label] = []
    for g, d in enumerate(imap):
        if d is None:  # a replica: every block along g reads the whole dim, so g is a new axis, repeated
            split.append(1)
            labels.append(("g", g))
    tile: list[int] = []
    for d, size in enumerate(shape):
        parts = 1
        for g, n in enumerate(grid):
            if imap[g] == d:
                split.append(n)
                labels.append(("g", g))
                parts *= n
        if size % parts:
            raise UGraphError(f"cannot split a dim of size {size} into {parts} equal parts")
        tile.append(size // parts)
        split.append(size // parts)
        labels.append(("t", d))
    if tuple(split) != tuple(shape):
        x = arith.reshape(x, tuple(split))
    for g, d in enumerate(imap):
        if d is None and grid[g] > 1:
            x = arith.repeat(x, labels.index(("g", g)), grid[g])
    order = [("g", g) for g in range(len(grid))] + [("t", d) for d in range(len(shape))]
    x = _permute(arith, x, labels, order)
    stacked = (math.prod(grid), *tile)
    return x if tuple(arith.shape(x)) == stacked else arith.reshape(x, stacked)


def assemble_stacked(arith: Arith[V], x: V, grid: Sequence[int], omap: Sequence[int]) -> V:
    """The output whose blocks' tiles are stacked in ``x`` (block order, x major): the tiles of the blocks along
    grid dim ``g`` side by side along output dim ``omap[g]`` (the inverse of :func:`stacked_tiles`'s split)."""
    tile = tuple(arith.shape(x)[1:])
    labels: list[Label] = [("g", g) for g in range(len(grid))] + [("t", d) for d in range(len(tile))]
    x = arith.reshape(x, (*grid, *tile))
    order: list[Label] = []
    out: list[int] = []
    for d, size in enumerate(tile):
        along = [g for g, od in enumerate(omap) if od == d]
        order += [("g", g) for g in along] + [("t", d)]
        out.append(size * math.prod(grid[g] for g in along))
    x = _permute(arith, x, labels, order)
    return x if tuple(arith.shape(x)) == tuple(out) else arith.reshape(x, tuple(out))


def loop_tiles(arith: Arith[V], x: V, loop: int, fmap: int | None) -> V:
    """Every iteration's tile of stacked tiles ``x`` (leading axis: ``B`` blocks), stacked along the leading axis
    as ``B · loop`` entries, block major: iteration ``i`` of block ``b`` is entry ``b · loop + i``. With ``fmap``
    iteration ``i`` takes chunk ``i`` of ``loop`` along tile dim ``fmap``; without, every iteration the whole tile.
    """
    shape = arith.shape(x)
    blocks, tile = shape[0], list(shape[1:])
    if fmap is None:
        x = arith.repeat(arith.reshape(x, (blocks, 1, *tile)), 1, loop)
    else:
        if tile[fmap] % loop:
            raise UGraphError(f"cannot split a dim of size {tile[fmap]} into {loop} equal parts")
        tile[fmap] //= loop
        labels: list[Label] = [("g", 0)] + [("t", d) for d in range(len(tile))]
        labels.insert(fmap + 1, ("g", 1))
        x = arith.reshape(x, (*shape[: fmap + 1], loop, *tile[fmap:]))
        x = _permute(arith, x, labels, [("g", 0), ("g", 1)] + [("t", d) for d in range(len(tile))])
    return arith.reshape(x, (blocks * loop, *tile))


def loop_sum(arith: Arith[V], x: V, loop: int) -> V:
    """The sum over the iterations of :func:`loop_tiles`-stacked values: ``(B · loop, …)`` to ``(B, …)``."""
    shape = arith.shape(x)
    return arith.reduce_sum(arith.reshape(x, (shape[0] // loop, loop, *shape[1:])), 1, False)


def loop_concat(arith: Arith[V], x: V, loop: int, fmap: int) -> V:
    """The iterations of :func:`loop_tiles`-stacked values side by side along tile dim ``fmap``, in order."""
    shape = arith.shape(x)
    tile = shape[1:]
    labels: list[Label] = [("g", 0), ("g", 1)] + [("t", d) for d in range(len(tile))]
    x = arith.reshape(x, (shape[0] // loop, loop, *tile))
    order: list[Label] = [("g", 0)] + [("t", d) for d in range(len(tile))]
    order.insert(fmap + 1, ("g", 1))
    x = _permute(arith, x, labels, order)
    out = list(tile)
    out[fmap] *= loop
    return arith.reshape(x, (shape[0] // loop, *out))


__all__ = [
    "StackedArith",
    "assemble_stacked",
    "can_stack",
    "loop_concat",
    "loop_sum",
    "loop_tiles",
    "stacked_tiles",
]

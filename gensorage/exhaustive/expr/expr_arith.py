"""An :class:`gensorage.arith.Arith` whose values are abstract expressions, so the generic program and µGraph
evaluators compute Table 1 (see :mod:`gensorage.exhaustive.expr.abstract_expr` for the rules and their reasons).

A value is an :class:`ExprValue`: the logical shape, the term, and two pieces of bookkeeping the term alone
cannot carry:

- ``layout``: where a value is a concatenation along one dim, which term occupies which index range. Ops that
  act independently along that dim are applied piece by piece (a tile cut from the pieces sees only its
  pieces), and a matmul or sum *over* that dim adds the pieces' partial reductions. Adjacent pieces with one
  term merge, so the tiles of one term concatenated across blocks give back that term.
- ``acc``: the state of a for-loop accumulator — how many iterations contributed which term — so ``r``
  iterations of ``sum`` give ``sum(r, E)`` (not ``add(add(E, E), ...)``) and of ``max`` give ``max_r(r, E)``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from gensorage.arith import AccumKind, Activation
from gensorage.errors import ProgramError
from gensorage.exhaustive.expr import abstract_expr as ae
from gensorage.exhaustive.expr.abstract_expr import Term
from gensorage.opset import broadcast_shapes, transposed

Shape = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Layout:
    """A concatenation along ``axis``: ``pieces`` are ``(size, term)`` in index order (>= 2, neighbours differ)."""

    axis: int
    pieces: tuple[tuple[int, Term], ...]


@dataclass(frozen=True, slots=True)
class ExprValue:
    """A tensor's abstract expression with its logical shape (see the module docstring for the rest)."""

    shape: Shape
    term: Term
    layout: Layout | None = None
    acc: tuple[tuple[AccumKind, Term, int], ...] | None = None


OnlineKind = Literal["softmax_sum", "softmax_matmul"]


@dataclass(frozen=True, slots=True)
class OnlineState:
    """An online-softmax accumulator's iterations: ``((scores term, values term or None), count)`` entries."""

    kind: OnlineKind
    scores: Shape
    values: Shape | None
    entries: tuple[tuple[tuple[Term, Term | None], int], ...]


def _with_dim(shape: Shape, axis: int, size: int) -> Shape:
    return shape[:axis] + (size,) + shape[axis + 1 :]


def _from_pieces(shape: Shape, axis: int, pieces: Sequence[tuple[int, Term]]) -> ExprValue:
    """A value laid out as ``pieces`` along ``axis``: neighbours with one term merge; one piece is unlaid-out."""
    merged: list[tuple[int, Term]] = []
    for size, t in pieces:
        if merged and merged[-1][1] is t:
            merged[-1] = (merged[-1][0] + size, t)
        else:
            merged.append((size, t))
    if len(merged) == 1:
        return ExprValue(shape, merged[0][1])
    return ExprValue(shape, ae.cat(*(t for _, t in merged)), Layout(axis, tuple(merged)))


def _split(v: ExprValue, axis: int) -> list[tuple[int, int, ExprValue]]:
    """``(start, stop, piece)`` of ``v`` along ``axis`` (one piece, ``v`` itself, if not laid out along it)."""
    if v.layout is None or v.layout.axis != axis:
        return [(0, v.shape[axis], v)]
    out: list[tuple[int, int, ExprValue]] = []
    start = 0
    for size, t in v.layout.pieces:
        out.append((start, start + size, ExprValue(_with_dim(v.shape, axis, size), t)))
        start += size
    return out


def _plain(v: ExprValue) -> ExprValue:
    return v if v.acc is None else ExprValue(v.shape, v.term, v.layout)


class ExprArith:
    """Arithmetic of abstract expressions; values are :class:`ExprValue`."""

    name = "expr"

    def shape(self, a: ExprValue) -> Shape:
        return a.shape

    # ------------------------------------------------------------------ elementwise

    def add(self, a: ExprValue, b: ExprValue) -> ExprValue:
        return self._binary(a, b, ae.add)

    def sub(self, a: ExprValue, b: ExprValue) -> ExprValue:
        return self._binary(a, b, ae.add)  # signs are abstracted away, like scale factors

    def mul(self, a: ExprValue, b: ExprValue) -> ExprValue:
        return self._binary(a, b, ae.mul)

    def div(self, a: ExprValue, b: ExprValue) -> ExprValue:
        return self._binary(a, b, ae.div)

    def exp(self, a: ExprValue) -> ExprValue:
        return self._unary(a, ae.exp)

    def sqrt(self, a: ExprValue) -> ExprValue:
        return self._unary(a, ae.sqrt)

    def scale(self, a: ExprValue, factor: float) -> ExprValue:
        return _plain(a)  # constants are not part of the abstraction (see abstract_expr)

    def add_scalar(self, a: ExprValue, value: float) -> ExprValue:
        return _plain(a)  # likewise: x + c has the expression of x

    def activation(self, kind: Activation, a: ExprValue) -> ExprValue:
        return self._unary(a, functools.partial(ae.fn, kind))

    def clamp(self, a: ExprValue, lo: float | None, hi: float | None) -> ExprValue:
        # The bounds are dropped like scale's and add_scalar's constants (see abstract_expr).
        return self._unary(a, functools.partial(ae.fn, "clamp"))

    def _unary(self, a: ExprValue, f: Callable[[Term], Term]) -> ExprValue:
        if a.layout is None:
            return ExprValue(a.shape, f(a.term))
        return _from_pieces(a.shape, a.layout.axis, [(s, f(t)) for s, t in a.layout.pieces])

    def _binary(self, a: ExprValue, b: ExprValue, f: Callable[[Term, Term], Term]) -> ExprValue:
        out = broadcast_shapes(a.shape, b.shape)
        if out is None:
            raise ProgramError(f"shapes {list(a.shape)} and {list(b.shape)} do not broadcast")
        if a.layout is None and b.layout is None:
            return ExprValue(out, f(a.term, b.term))
        # Apply piece by piece along the laid-out dim of one operand, cutting the other to match; recursion
        # refines until neither operand is laid out (pieces only get smaller, so it ends).
        first, other = (a, b) if a.layout is not None else (b, a)
        assert first.layout is not None
        o = first.layout.axis + len(out) - len(first.shape)
        results = []
        for start, stop, piece in _split(first, first.layout.axis):
            cut = self._cut_broadcast(other, o, len(out), start, stop)
            results.append(self._binary(piece, cut, f) if first is a else self._binary(cut, piece, f))
        return self.concat(results, o)

    def _cut_broadcast(self, v: ExprValue, out_axis: int, out_ndim: int, start: int, stop: int) -> ExprValue:
        """Range ``[start, stop)`` of output dim ``out_axis`` as seen by operand ``v`` (broadcast dims stay)."""
        axis = out_axis - (out_ndim - len(v.shape))
        if axis < 0 or v.shape[axis] == 1:
            return v
        return self.slice(v, axis, start, stop)

    # ------------------------------------------------------------------ reductions

    def matmul(self, a: ExprValue, b: ExprValue) -> ExprValue:
        if len(a.shape) < 2 or len(b.shape) < 2 or a.shape[-1] != b.shape[-2]:
            raise ProgramError(f"matmul: shapes {list(a.shape)} and {list(b.shape)} do not multiply")
        batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
        if batch is None:
            raise ProgramError(f"matmul: batch dims of {list(a.shape)} and {list(b.shape)} do not broadcast")
        out = batch + (a.shape[-2], b.shape[-1])
        na, nb, n = len(a.shape), len(b.shape), len(out)
        if a.layout is None and b.layout is None:
            return ExprValue(out, ae.sum(a.shape[-1], ae.mul(a.term, b.term)))
        if a.layout is not None:
            ax = a.layout.axis
            if ax == na - 1:  # inner dim: partial products over the pieces, added
                return self._inner_pieces(a, b, na - 1, nb - 2, first_is_a=True)
            o = ax + n - na
            cut_b = (lambda s, e: b) if ax == na - 2 else (lambda s, e: self._cut_broadcast(b, o, n, s, e))
            return self.concat([self.matmul(p, cut_b(s, e)) for s, e, p in _split(a, ax)], o)
        assert b.layout is not None
        ax = b.layout.axis
        if ax == nb - 2:
            return self._inner_pieces(b, a, nb - 2, na - 1, first_is_a=False)
        o = ax + n - nb
        cut_a = (lambda s, e: a) if ax == nb - 1 else (lambda s, e: self._cut_broadcast(a, o, n, s, e))
        return self.concat([self.matmul(cut_a(s, e), p) for s, e, p in _split(b, ax)], o)

    def _inner_pieces(
        self, v: ExprValue, w: ExprValue, v_axis: int, w_axis: int, *, first_is_a: bool
    ) -> ExprValue:
        partials = []
        for s, e, p in _split(v, v_axis):
            q = self.slice(w, w_axis, s, e)
            partials.append(self.matmul(p, q) if first_is_a else self.matmul(q, p))
        return functools.reduce(self.add, partials)

    def reduce_sum(self, a: ExprValue, axis: int, keepdims: bool) -> ExprValue:
        return self._reduce(a, axis, keepdims, ae.sum, self.add)

    def reduce_max(self, a: ExprValue, axis: int, keepdims: bool) -> ExprValue:
        # The max of a concatenation is the max of the pieces' maxima; with no binary max term, their cat.
        return self._reduce(a, axis, keepdims, ae.max_r, self._cat_terms)

    def _cat_terms(self, a: ExprValue, b: ExprValue) -> ExprValue:
        return ExprValue(a.shape, ae.cat(a.term, b.term))

    def _reduce(
        self,
        a: ExprValue,
        axis: int,
        keepdims: bool,
        red: Callable[[int, Term], Term],
        combine: Callable[[ExprValue, ExprValue], ExprValue],
    ) -> ExprValue:
        axis = _axis(axis, len(a.shape))
        out = _with_dim(a.shape, axis, 1) if keepdims else a.shape[:axis] + a.shape[axis + 1 :]
        lay = a.layout
        if lay is None:
            return ExprValue(out, red(a.shape[axis], a.term))
        if lay.axis == axis:
            parts = [ExprValue(out, red(e - s, p.term)) for s, e, p in _split(a, axis)]
            return functools.reduce(combine, parts)
        new_axis = lay.axis - (1 if not keepdims and axis < lay.axis else 0)
        return _from_pieces(out, new_axis, [(s, red(a.shape[axis], t)) for s, t in lay.pieces])

    def accumulate(self, acc: ExprValue | None, x: ExprValue, kind: AccumKind) -> ExprValue:
        entries: list[tuple[AccumKind, Term, int]] = []
        if acc is not None:
            entries = list(acc.acc) if acc.acc is not None else [(kind, acc.term, 1)]
        for i, (k, t, n) in enumerate(entries):
            if k == kind and t is x.term:
                entries[i] = (k, t, n + 1)
                break
        else:
            entries.append((kind, x.term, 1))
        return ExprValue(x.shape, _accumulated(entries), None, tuple(entries))

    def accumulate_times(self, x: ExprValue, times: int, kind: AccumKind) -> ExprValue:
        """What ``times`` calls of :meth:`accumulate` on the same tile give, in one step (for a generator that
        derives an accumulator's expression without running the loop)."""
        if times < 1:
            raise ProgramError(f"an accumulator needs at least one iteration, got {times}")
        entries: tuple[tuple[AccumKind, Term, int], ...] = ((kind, x.term, times),)
        return ExprValue(x.shape, _accumulated(entries), None, entries)

    def online_softmax(
        self, state: OnlineState | None, s: ExprValue, v: ExprValue | None, kind: OnlineKind
    ) -> OnlineState:
        """One iteration of an online-softmax accumulator (``gensorage.ugraph.online_softmax``), abstracted as
        the plain form: the state counts the iterations per (scores, values) term pair."""
        pair = (s.term, None if v is None else v.term)
        entries = list(state.entries) if state is not None else []
        for i, (t, n) in enumerate(entries):
            if t == pair:
                entries[i] = (t, n + 1)
                break
        else:
            entries.append((pair, 1))
        return OnlineState(kind, s.shape, None if v is None else v.shape, tuple(entries))

    def online_softmax_result(self, state: OnlineState) -> ExprValue:
        """The accumulator after the loop: ``Σ exp(s − m)`` (times ``v``) over every key seen, ``m`` the maximum
        over every key (the full row's, as the plain form subtracts)."""
        keys = state.scores[-1]
        maxima = [ae.max_r(n * keys, s) for (s, _), n in state.entries]
        m = maxima[0] if len(maxima) == 1 else ae.cat(*maxima)
        parts = []
        for (s, v), n in state.entries:
            p = ae.exp(ae.add(s, m))  # with one entry: online_exponent(s, n * keys)
            parts.append(ae.sum(n * keys, p if v is None else ae.mul(p, v)))
        if state.values is None:
            shape = state.scores[:-1] + (1,)
        else:
            shape = state.scores[:-1] + state.values[-1:]
        return ExprValue(shape, ae.add_all(parts))

    def online_softmax_times(
        self, s: ExprValue, v: ExprValue | None, times: int, kind: OnlineKind
    ) -> ExprValue:
        """What ``times`` iterations on the same tiles give, in one step (as :meth:`accumulate_times`)."""
        if times < 1:
            raise ProgramError(f"an accumulator needs at least one iteration, got {times}")
        pair = (s.term, None if v is None else v.term)
        state = OnlineState(kind, s.shape, None if v is None else v.shape, ((pair, times),))
        return self.online_softmax_result(state)

    # ------------------------------------------------------------------ data movement

    def reshape(self, a: ExprValue, shape: tuple[int, ...]) -> ExprValue:
        shape = tuple(shape)
        lay = a.layout
        if lay is None:
            return ExprValue(shape, a.term)
        ax, nd = lay.axis, len(a.shape)
        if shape[: ax + 1] == a.shape[: ax + 1]:  # the dims up to the laid-out one are untouched
            return ExprValue(shape, a.term, lay)
        tail = nd - ax
        if len(shape) >= tail and shape[len(shape) - tail :] == a.shape[ax:]:  # ... or the dims from it on
            return ExprValue(shape, a.term, Layout(len(shape) - tail, lay.pieces))
        return ExprValue(shape, a.term)  # the layout is scrambled; the term (cat of the pieces) stays

    def repeat(self, a: ExprValue, axis: int, times: int) -> ExprValue:
        axis = _axis(axis, len(a.shape))
        shape = _with_dim(a.shape, axis, a.shape[axis] * times)
        lay = a.layout
        if lay is not None and lay.axis == axis:  # numpy.repeat keeps each piece contiguous, `times` as long
            return ExprValue(shape, a.term, Layout(axis, tuple((s * times, t) for s, t in lay.pieces)))
        return ExprValue(shape, a.term, lay)

    def transpose(self, a: ExprValue, axis0: int, axis1: int) -> ExprValue:
        nd = len(a.shape)
        axis0, axis1 = _axis(axis0, nd), _axis(axis1, nd)
        shape = transposed(a.shape, axis0, axis1)
        lay = a.layout
        if lay is None or lay.axis not in (axis0, axis1):
            return ExprValue(shape, a.term, lay)
        return ExprValue(shape, a.term, Layout(axis1 if lay.axis == axis0 else axis0, lay.pieces))

    def concat(self, parts: Sequence[ExprValue], axis: int) -> ExprValue:
        if not parts:
            raise ProgramError("concat needs at least one part")
        axis = _axis(axis, len(parts[0].shape))
        shape = _with_dim(parts[0].shape, axis, sum(p.shape[axis] for p in parts))
        first = parts[0]
        if (
            first.layout is not None
            and first.layout.axis != axis
            and all(p.term is first.term and p.layout == first.layout for p in parts)
        ):
            return ExprValue(shape, first.term, first.layout)  # identical tiles laid out across another dim
        pieces: list[tuple[int, Term]] = []
        for p in parts:
            if p.layout is not None and p.layout.axis == axis:
                pieces.extend(p.layout.pieces)
            else:
                pieces.append((p.shape[axis], p.term))
        return _from_pieces(shape, axis, pieces)

    def slice(self, a: ExprValue, axis: int, start: int, stop: int) -> ExprValue:
        axis = _axis(axis, len(a.shape))
        if not 0 <= start < stop <= a.shape[axis]:
            raise ProgramError(f"slice [{start}, {stop}) out of range for dim {axis} of {list(a.shape)}")
        shape = _with_dim(a.shape, axis, stop - start)
        lay = a.layout
        if lay is None or lay.axis != axis:
            return ExprValue(shape, a.term, lay)
        pieces = [
            (min(e, stop) - max(s, start), p.term) for s, e, p in _split(a, axis) if s < stop and e > start
        ]
        return _from_pieces(shape, axis, pieces)


def online_exponent(s: Term, keys: int) -> Term:
    """The ``exp(s − max s)`` an online-softmax accumulator of scores ``s`` takes over ``keys`` keys in all (the
    loop's iterations times the tile's keys), as :meth:`ExprArith.online_softmax_result` writes it."""
    return ae.exp(ae.add(s, ae.max_r(keys, s)))


def _axis(axis: int, ndim: int) -> int:
    if not -ndim <= axis < ndim:
        raise ProgramError(f"axis {axis} out of range for a {ndim}-d value")
    return axis % ndim


def _accumulated(entries: Sequence[tuple[AccumKind, Term, int]]) -> Term:
    """The term of an accumulator: ``sum(n, t)`` per summed term (added), ``max_r(n, t)`` per max'ed one."""
    sums = [ae.sum(n, t) for k, t, n in entries if k == "sum"]
    maxes = [ae.max_r(n, t) for k, t, n in entries if k == "max"]
    if not maxes:
        return ae.add_all(sums)
    if not sums and len(maxes) == 1:
        return maxes[0]
    return ae.cat(*(sums + maxes))


#: The arithmetic every search uses (it holds no state).
EXPR = ExprArith()


__all__ = ["EXPR", "ExprArith", "ExprValue", "Layout", "OnlineState", "online_exponent"]

"""Arithmetics: what a value is and how each primitive computes on it.

Programs and µGraphs are evaluated by one generic interpreter each, parameterised by an :class:`Arith`. The
float64 arithmetic here gives numerics; the finite-field arithmetic (``gensorage.verify.field``) gives the
probabilistic identity test; abstract arithmetics (bounds, abstract expressions) reuse the same walk. Values are
opaque to the interpreters: they only call these methods, so a wrong imap or fmap changes the answer in every
arithmetic alike.

Shapes are logical shapes (no batch/trial dimensions, which an arithmetic may keep internally in front).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, Literal, Protocol, TypeVar

import numpy as np

V = TypeVar("V")

Activation = Literal["relu", "silu", "gelu", "tanh", "log"]
AccumKind = Literal["sum", "max"]


class Arith(Protocol, Generic[V]):
    """Primitive operations on values of type ``V``; binary elementwise ops broadcast like numpy."""

    name: str

    def shape(self, a: V) -> tuple[int, ...]: ...

    def add(self, a: V, b: V) -> V: ...
    def sub(self, a: V, b: V) -> V: ...
    def mul(self, a: V, b: V) -> V: ...
    def div(self, a: V, b: V) -> V: ...
    def exp(self, a: V) -> V: ...
    def sqrt(self, a: V) -> V: ...
    def scale(self, a: V, factor: float) -> V: ...
    def add_scalar(self, a: V, value: float) -> V: ...
    def activation(self, kind: Activation, a: V) -> V: ...
    def clamp(self, a: V, lo: float | None, hi: float | None) -> V: ...

    def matmul(self, a: V, b: V) -> V: ...
    def reduce_sum(self, a: V, axis: int, keepdims: bool) -> V: ...
    def reduce_max(self, a: V, axis: int, keepdims: bool) -> V: ...
    def accumulate(self, acc: V | None, x: V, kind: AccumKind) -> V: ...

    def reshape(self, a: V, shape: tuple[int, ...]) -> V: ...
    def repeat(self, a: V, axis: int, times: int) -> V: ...
    def transpose(self, a: V, axis0: int, axis1: int) -> V: ...
    def concat(self, parts: Sequence[V], axis: int) -> V: ...
    def slice(self, a: V, axis: int, start: int, stop: int) -> V: ...


def clamp_float(a: np.ndarray, lo: float | None, hi: float | None) -> np.ndarray:
    """torch's clamp on a float array: ``min(max(a, lo), hi)`` where NaN stays NaN (``np.maximum`` propagates it)."""
    out = np.asarray(a)
    if lo is not None:
        out = np.maximum(out, lo)
    if hi is not None:
        out = np.minimum(out, hi)
    return out


class Float64Arith:
    """Exact-as-possible reference numerics: every value is a float64 ``numpy.ndarray``."""

    name = "float64"

    def shape(self, a: np.ndarray) -> tuple[int, ...]:
        return tuple(int(s) for s in a.shape)

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.add(a, b)

    def sub(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.subtract(a, b)

    def mul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.multiply(a, b)

    def div(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.divide(a, b)

    def exp(self, a: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            return np.exp(a)

    def sqrt(self, a: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            return np.sqrt(a)

    def scale(self, a: np.ndarray, factor: float) -> np.ndarray:
        return a * float(factor)

    def add_scalar(self, a: np.ndarray, value: float) -> np.ndarray:
        return a + float(value)

    def activation(self, kind: Activation, a: np.ndarray) -> np.ndarray:
        # Imported here: scipy takes ~0.4 s to import, which every spawned search worker would pay at start.
        from scipy import special

        if kind == "relu":
            return np.maximum(a, 0.0)
        if kind == "silu":
            return a * special.expit(a)
        if kind == "gelu":  # exact (erf) GELU, torch's default
            return 0.5 * a * (1.0 + special.erf(a / np.sqrt(2.0)))
        if kind == "tanh":
            return np.tanh(a)
        if kind == "log":  # torch's: NaN below 0, -inf at ±0
            with np.errstate(divide="ignore", invalid="ignore"):
                return np.log(a)
        raise ValueError(kind)

    def clamp(self, a: np.ndarray, lo: float | None, hi: float | None) -> np.ndarray:
        return clamp_float(a, lo, hi)

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.matmul(a, b)

    def reduce_sum(self, a: np.ndarray, axis: int, keepdims: bool) -> np.ndarray:
        return np.sum(a, axis=axis, keepdims=keepdims)

    def reduce_max(self, a: np.ndarray, axis: int, keepdims: bool) -> np.ndarray:
        return np.max(a, axis=axis, keepdims=keepdims)

    def accumulate(self, acc: np.ndarray | None, x: np.ndarray, kind: AccumKind) -> np.ndarray:
        if acc is None:
            return np.array(x, dtype=np.float64, copy=True)
        return acc + x if kind == "sum" else np.maximum(acc, x)

    def reshape(self, a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return np.reshape(a, shape)

    def repeat(self, a: np.ndarray, axis: int, times: int) -> np.ndarray:
        return np.repeat(a, times, axis=axis)

    def transpose(self, a: np.ndarray, axis0: int, axis1: int) -> np.ndarray:
        return np.swapaxes(a, axis0, axis1)

    def concat(self, parts: Sequence[np.ndarray], axis: int) -> np.ndarray:
        return np.concatenate(list(parts), axis=axis)

    def slice(self, a: np.ndarray, axis: int, start: int, stop: int) -> np.ndarray:
        index = [slice(None)] * a.ndim
        index[axis] = slice(start, stop)
        return a[tuple(index)]

"""One evaluation of what both sides of a check compute alike.

:func:`gensorage.verify.equivalent` evaluates both sides on the same inputs in the same arithmetic. Two programs
that differ only in their last steps (attention with the division before or after the product with V) compute
the same scores, exps and sums: :class:`SharedArith` memoises every operation on the identity of its argument
values, so the second side reuses the first side's results instead of recomputing them.

Why the verdict cannot change: every operation of a verification arithmetic is a deterministic function of its
arguments and of the arithmetic's keys (fixed for the batch), and values are never modified in place, so a
memoised result holds exactly the residues a recomputation would. The memo keeps its arguments alive, so an
``id`` is never reused while the memo exists. Matmuls (:data:`BY_CONTENT`) are memoised on their arguments'
content instead (every slot of a value; arrays keyed by a hash of a sample of their elements, and a hit compared
byte for byte before it is used, so a collision costs a recomputation, never a wrong value), so a µGraph whose
fused kernel recomputes a value the program side already has shares the products that follow it, and what follows
them by identity.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np

#: The value-to-value methods of :class:`gensorage.arith.Arith` (``shape`` and drawing inputs are not memoised).
MEMOISED = frozenset(
    {
        "add",
        "sub",
        "mul",
        "div",
        "exp",
        "sqrt",
        "scale",
        "add_scalar",
        "activation",
        "clamp",
        "matmul",
        "reduce_sum",
        "reduce_max",
        "accumulate",
        "reshape",
        "repeat",
        "transpose",
        "concat",
        "slice",
    }
)
#: Operations memoised on the *content* of their argument values as well: a µGraph's fused kernel computes the
#: same residues as the program's ops in other objects, and a matmul costs far more than reading its operands.
BY_CONTENT = frozenset({"matmul"})
_PLAIN = (bool, int, float, str, type(None))
#: Elements of an array that its content key hashes (:func:`_sample`).
SAMPLE = 4096


def _key(arg: Any) -> Any:
    if isinstance(arg, _PLAIN):
        return arg
    if isinstance(arg, list | tuple):
        return tuple(_key(a) for a in arg)
    return ("value", id(arg))


def _content(arg: Any) -> Any:
    """A key of everything a value holds (its slots; arrays by dtype, shape and a hash of their bytes), or its
    identity without slots. Keys may collide: a hit is confirmed by :func:`_same` before it is used."""
    if isinstance(arg, _PLAIN):
        return arg
    if isinstance(arg, np.ndarray):
        return (arg.dtype.str, arg.shape, hashlib.blake2b(_sample(arg).data, digest_size=16).digest())
    slots = getattr(type(arg), "__slots__", None)
    if slots is None:
        return ("value", id(arg))
    return (type(arg), tuple(_content(getattr(arg, name)) for name in slots))


def _sample(a: np.ndarray) -> np.ndarray:
    """All of a small array; of a large one, :data:`SAMPLE` elements spread evenly over it. The key only has to
    tell different values apart cheaply: hashing every byte of a 4,096-key attention's K and V took 0.77 of the
    1.7 s a check took, and :func:`_same` decides every hit anyway."""
    if a.size <= SAMPLE:
        return np.ascontiguousarray(a)
    flat = np.linspace(0, a.size - 1, SAMPLE, dtype=np.int64)
    return np.ascontiguousarray(a[np.unravel_index(flat, a.shape)])


def _same(x: Any, y: Any) -> bool:
    """Whether two arguments hold the same content exactly (what :func:`_content` keys)."""
    if x is y:
        return True  # values are never modified in place
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        return (
            isinstance(x, np.ndarray)
            and isinstance(y, np.ndarray)
            and x.dtype == y.dtype
            and x.shape == y.shape
            and bool(np.array_equal(x, y))
        )
    slots = getattr(type(x), "__slots__", None)
    if slots is None or isinstance(x, _PLAIN):
        return x is y or (isinstance(x, _PLAIN) and type(x) is type(y) and x == y)
    return type(x) is type(y) and all(_same(getattr(x, n), getattr(y, n)) for n in slots)


class SharedArith:
    """``inner`` with each Arith operation computed once per distinct (operation, arguments)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._memo: dict[Any, tuple[tuple[Any, ...], Any]] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in MEMOISED:
            return attr
        return self._memoised(name, attr)

    def _memoised(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        by_content = name in BY_CONTENT

        def call(*args: Any) -> Any:
            key = (name, *map(_content if by_content else _key, args))
            hit = self._memo.get(key)
            if hit is not None:
                if not by_content or all(_same(a, b) for a, b in zip(hit[0], args, strict=True)):
                    return hit[1]
                return method(*args)  # a hash collision: computed, not memoised
            out = method(*args)
            self._memo[key] = (args, out)
            return out

        return call


__all__ = ["BY_CONTENT", "MEMOISED", "SharedArith"]

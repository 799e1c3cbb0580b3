"""The numerical-stability float test (Mirage, later version, §5: "numerical stability").

The finite-field test says two programs compute the same real function; it says nothing about rounding,
overflow or underflow. :func:`float_check` evaluates a reference ``a`` in float64 and a candidate ``b`` with
every intermediate rounded to the programs' dtype (float16, bfloat16, float32; simulated with numpy), on random
normal inputs scaled so exp stays far from overflow, and reports the error. The search uses it to reject
numerically unstable candidates.

The simulation rounds every op's result to the dtype (as storing each intermediate in that dtype would) while
computing the op itself in float64, so matmul and reductions model fp32 accumulation with a rounded result;
real kernels may differ in the order of accumulation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gensorage.arith import AccumKind, Activation, Float64Arith
from gensorage.errors import VerificationError

#: Default relative tolerance (normwise: max |b - a| / max |a|) per dtype.
DEFAULT_RTOL = {"float16": 2e-2, "bfloat16": 1e-1, "float32": 1e-4, "float64": 1e-10}


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """``x`` rounded to ``dtype`` (round to nearest even) and returned as float64."""
    if dtype == "float64":
        return np.asarray(x, dtype=np.float64)
    if dtype in ("float32", "float16"):
        with np.errstate(over="ignore"):
            return np.asarray(x).astype(dtype).astype(np.float64)
    if dtype == "bfloat16":
        with np.errstate(over="ignore"):
            bits = np.asarray(x, dtype=np.float32).view(np.uint32)
        # Round the low 16 bits away, to nearest even; NaN keeps a payload bit so it stays NaN.
        rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(
            0xFFFF0000
        )
        rounded = np.where(np.isnan(bits.view(np.float32)), bits | np.uint32(0x00400000), rounded)
        return rounded.astype(np.uint32).view(np.float32).astype(np.float64)
    raise VerificationError(f"cannot simulate dtype {dtype!r} (known: {', '.join(DEFAULT_RTOL)})")


class RoundingArith(Float64Arith):
    """Float64 numerics with every computed value rounded to ``dtype`` (layout ops need no rounding).

    It also checks stability of max subtraction, which the identity test cannot see (max is a free function
    there): every ``x − m`` where ``m`` is a max result (a reduce_max or max-accumulator, possibly reshaped,
    repeated, sliced or concatenated) counts in :attr:`max_subtractions`, and those where some ``x > m`` (the
    subtracted value does not bound its row, so ``exp(x − m)`` may overflow) in :attr:`unbounded`.
    """

    def __init__(self, dtype: str) -> None:
        round_to(np.zeros(1), dtype)  # validates the dtype
        self.dtype = dtype
        self.name = f"rounded-{dtype}"
        self.max_subtractions = 0
        self.unbounded = 0
        # id -> array for max results; the array is held so its id cannot be reused while tracked.
        self._maxes: dict[int, np.ndarray] = {}

    def _r(self, x: np.ndarray) -> np.ndarray:
        return round_to(x, self.dtype)

    def _is_max(self, x: np.ndarray) -> bool:
        return id(x) in self._maxes

    def _tag(self, x: np.ndarray, tagged: bool = True) -> np.ndarray:
        if tagged:
            self._maxes[id(x)] = x
        return x

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self._r(super().add(a, b))

    def sub(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if self._is_max(b):
            self.max_subtractions += 1
            with np.errstate(invalid="ignore"):
                self.unbounded += bool(np.any(np.asarray(a) > np.asarray(b)))
        return self._r(super().sub(a, b))

    def mul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self._r(super().mul(a, b))

    def div(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self._r(super().div(a, b))

    def exp(self, a: np.ndarray) -> np.ndarray:
        return self._r(super().exp(a))

    def sqrt(self, a: np.ndarray) -> np.ndarray:
        return self._r(super().sqrt(a))

    def scale(self, a: np.ndarray, factor: float) -> np.ndarray:
        return self._r(super().scale(a, factor))

    def add_scalar(self, a: np.ndarray, value: float) -> np.ndarray:
        return self._r(super().add_scalar(a, value))

    def activation(self, kind: Activation, a: np.ndarray) -> np.ndarray:
        return self._r(super().activation(kind, a))

    def clamp(self, a: np.ndarray, lo: float | None, hi: float | None) -> np.ndarray:
        return self._r(super().clamp(a, lo, hi))

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self._r(super().matmul(a, b))

    def reduce_sum(self, a: np.ndarray, axis: int, keepdims: bool) -> np.ndarray:
        return self._r(super().reduce_sum(a, axis, keepdims))

    def reduce_max(self, a: np.ndarray, axis: int, keepdims: bool) -> np.ndarray:
        return self._tag(self._r(super().reduce_max(a, axis, keepdims)))

    def accumulate(self, acc: np.ndarray | None, x: np.ndarray, kind: AccumKind) -> np.ndarray:
        return self._tag(self._r(super().accumulate(acc, x, kind)), kind == "max")

    def reshape(self, a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return self._tag(super().reshape(a, shape), self._is_max(a))

    def repeat(self, a: np.ndarray, axis: int, times: int) -> np.ndarray:
        return self._tag(super().repeat(a, axis, times), self._is_max(a))

    def transpose(self, a: np.ndarray, axis0: int, axis1: int) -> np.ndarray:
        return self._tag(super().transpose(a, axis0, axis1), self._is_max(a))

    def concat(self, parts: Sequence[np.ndarray], axis: int) -> np.ndarray:
        return self._tag(super().concat(parts, axis), all(self._is_max(x) for x in parts))

    def slice(self, a: np.ndarray, axis: int, start: int, stop: int) -> np.ndarray:
        return self._tag(super().slice(a, axis, start, stop), self._is_max(a))


@dataclass(frozen=True, slots=True)
class FloatCheck:
    """Outcome of :func:`float_check`; truthy when the candidate is within tolerance.

    Attributes
    ----------
    ok : bool
        Every output of ``b`` in ``dtype`` is finite and within ``atol + rtol · max|a|`` of ``a`` in float64
        (per output).
    max_rel_error : float
        max over outputs of ``max|b_dtype - a_64| / max|a_64|`` (normwise relative error of the candidate).
    max_abs_error : float
        max over outputs of ``max|b_dtype - a_64|``.
    reference_rel_error : float
        The same error of the reference ``a`` evaluated in ``dtype`` (what rounding alone costs).
    float64_rel_error : float
        ``b`` vs ``a``, both in float64 (non-zero beyond ~1e-12 means they are not the same function).
    dtype : str
    rtol, atol : float
    nonfinite : bool
        Some output of ``b`` in ``dtype`` is inf or NaN where the reference is finite.
    max_subtractions : int
        Subtractions ``x − m`` in ``b`` with ``m`` a max result (a stable softmax's ``exp(x − max)``).
    unbounded_max : int
        Those where ``m`` did not bound ``x`` (some ``x > m``): the candidate subtracts a value that is not
        its row's max, so ``exp(x − m)`` can overflow although the identity test (max free) accepts it.
    """

    ok: bool
    max_rel_error: float
    max_abs_error: float
    reference_rel_error: float
    float64_rel_error: float
    dtype: str
    rtol: float
    atol: float
    nonfinite: bool
    max_subtractions: int = 0
    unbounded_max: int = 0

    def __bool__(self) -> bool:
        return self.ok


def _errors(ref: Sequence[np.ndarray], got: Sequence[np.ndarray]) -> list[tuple[float, float]]:
    """Per output: (max |got - ref|, max |ref|) over the elements where ``ref`` is finite (inf if ``got`` is not)."""
    out: list[tuple[float, float]] = []
    for r, g in zip(ref, got, strict=True):
        finite = np.isfinite(r)
        scale = float(np.max(np.abs(r[finite]), initial=0.0))
        if not np.all(np.isfinite(g[finite])):
            out.append((float("inf"), scale))
            continue
        out.append((float(np.max(np.abs(g[finite] - r[finite]), initial=0.0)), scale))
    return out


def _relative(errors: list[tuple[float, float]]) -> float:
    return max((e / s if s > 0 else e for e, s in errors), default=0.0)


def _dtype_of(obj: Any) -> str:
    dtypes = {str(getattr(t, "dtype", "float64")) for t in obj.inputs}
    # Mixed input dtypes: simulate the narrowest, the one rounding hurts most.
    for d in ("bfloat16", "float16", "float32", "float64"):
        if d in dtypes:
            return d
    return "float64"


def float_check(
    a: Any,
    b: Any,
    seed: int = 0,
    rtol: float | None = None,
    atol: float = 0.0,
    *,
    dtype: str | None = None,
    scale: float | None = None,
) -> FloatCheck:
    """Compare candidate ``b`` evaluated in low precision with reference ``a`` in float64.

    Parameters
    ----------
    a, b : Program or KernelGraph
        Same input shapes by position.
    seed : int
        Seed of the random normal inputs.
    rtol : float, optional
        Normwise relative tolerance; default by dtype (:data:`DEFAULT_RTOL`).
    atol : float
        Absolute tolerance added to ``rtol · max|a|``.
    dtype : str, optional
        Precision to simulate; default: the narrowest dtype among ``b``'s inputs.
    scale : float, optional
        Standard deviation of every input; default ``1/sqrt(last dim)`` per input, which keeps matmul results
        O(1) so exp neither overflows nor underflows.

    Returns
    -------
    FloatCheck
        Truthy when ``b`` is finite, within tolerance, and every max it subtracts bounds what it is subtracted
        from (stability of ``exp(x − max)``, which equality alone does not establish).
    """
    shapes_a = [tuple(t.shape) for t in a.inputs]
    shapes_b = [tuple(t.shape) for t in b.inputs]
    if shapes_a != shapes_b:
        raise VerificationError(f"float_check: input shapes differ ({shapes_a} vs {shapes_b})")
    dt = dtype or _dtype_of(b)
    tol = DEFAULT_RTOL.get(dt, 1e-2) if rtol is None else rtol
    rng = np.random.default_rng(seed)
    inputs = [
        rng.standard_normal(s) * (scale if scale is not None else 1.0 / np.sqrt(s[-1])) for s in shapes_a
    ]
    ref = [np.asarray(x, dtype=np.float64) for x in a.evaluate(Float64Arith(), inputs)]
    same = [np.asarray(x, dtype=np.float64) for x in b.evaluate(Float64Arith(), inputs)]
    low_inputs = [round_to(x, dt) for x in inputs]
    rounding = RoundingArith(dt)
    got = [np.asarray(x) for x in b.evaluate(rounding, low_inputs)]
    ref_low = [np.asarray(x) for x in a.evaluate(RoundingArith(dt), low_inputs)]
    errors = _errors(ref, got)
    nonfinite = any(e == float("inf") for e, _ in errors)
    ok = not nonfinite and rounding.unbounded == 0 and all(e <= atol + tol * s for e, s in errors)
    absolute = max((e for e, _ in errors), default=0.0)
    return FloatCheck(
        ok,
        _relative(errors),
        absolute,
        _relative(_errors(ref, ref_low)),
        _relative(_errors(ref, same)),
        dt,
        tol,
        atol,
        nonfinite,
        rounding.max_subtractions,
        rounding.unbounded,
    )


__all__ = ["DEFAULT_RTOL", "FloatCheck", "RoundingArith", "float_check", "round_to"]

"""A matmul's epilogue (:func:`gensorage.opset.epilogue`) as a TIR expression of its float32 product.

The TE-built GEMM kernels (:mod:`gensorage.codegen.predefined_matmul`: mma.sync through the tensor-core
schedule, and its llvm and field twins) compute their write-back block ``D`` from the accumulator ``C``; with an
epilogue, ``D`` applies the steps there, on the float32 value, before the cast to the output dtype, so the
schedule's ``reverse_compute_inline`` folds them into the store with the cast. Float steps follow
:class:`~gensorage.codegen.scalar.FloatScalar` (same formulas); in field mode (one modulus per kernel) the steps
of the Lax fragment's expressions (:data:`FIELD_STEPS`) are residue arithmetic; a kernel whose epilogue has
other steps in field mode is not built here (the caller runs those steps as kernels of their own).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gensorage.codegen.scalar import TANH_SERIES, TANH_SMALL
from gensorage.errors import UnsupportedOpError
from gensorage.opset import EpilogueStep, Op, attr, clamp_bounds

#: Epilogue steps the field twin computes inside a TE-built GEMM kernel (each a residue expression).
FIELD_STEPS = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.SCALE, Op.ADD_SCALAR})


#: Extra-operand parameters a hand-written GEMM PrimFunc declares (the unused ones are dropped after parsing).
SLOTS = 4


@dataclass(frozen=True, slots=True)
class KernelEpilogue:
    """A matmul's epilogue as a GEMM kernel runs it: its steps, its extra operands' shapes and dtypes (as the
    kernel declares them) and the output's batch dims (flattened into one in the kernel's view, ``()`` for a
    2-D matmul)."""

    steps: tuple[EpilogueStep, ...]
    extra: tuple[tuple[tuple[int, ...], str], ...]
    batch: tuple[int, ...] = ()

    def slots(self, field: bool) -> list[tuple[tuple[int, ...], str]]:
        """The :data:`SLOTS` extra parameters' shapes and dtypes (int64 residues in field mode)."""
        used = [(shape, "int64" if field else dt) for shape, dt in self.extra]
        return used + [((1,), "int64" if field else "float32")] * (SLOTS - len(used))

    def value(self, product: Any, extra: Sequence[Any], ix: tuple[Any, ...], modulus: int | None) -> Any:
        """The last step's value at output index ``ix`` (``(b, i, j)`` in the kernel's view, or ``(i, j)``) from
        the accumulated ``product`` (float32, or a residue mod ``modulus``), reading the ``extra`` buffers."""
        acc = "float32" if modulus is None else "int64"
        loaded = [
            e[extra_index(self.batch, shape, ix)].astype(acc)
            for e, (shape, _) in zip(extra[: len(self.extra)], self.extra, strict=True)
        ]
        return epilogue_value(self.steps, [product, *loaded], modulus, acc)


def extra_index(batch: tuple[int, ...], shape: tuple[int, ...], ix: tuple[Any, ...]) -> tuple[Any, ...]:
    """Index into an extra operand of ``shape`` (numpy-broadcast against the output) at output index ``ix``
    (``(b, i, j)`` with the ``batch`` dims flattened into ``b``, or ``(i, j)``)."""
    from tvm import tirx

    full: list[Any] = list(ix[-2:])
    if batch:
        for d in reversed(range(len(batch))):
            full.insert(0, tirx.floormod(tirx.floordiv(ix[0], math.prod(batch[d + 1 :])), batch[d]))
    lead = len(full) - len(shape)
    return tuple(tirx.const(0, "int32") if n == 1 else full[lead + d] for d, n in enumerate(shape))


def with_extras(func: Any, used: int) -> Any:
    """A hand-written GEMM PrimFunc declared ``(A, B, C, <others>, E0 .. E{SLOTS-1})`` as ``(A, B, E0 ..
    E{used-1}, C, <others>)``: the extra operands after B, as the kernel's parameters list them; the unused
    slots (never read) dropped."""
    from tvm import tirx

    params = list(func.params)
    fixed, slots = params[: len(params) - SLOTS], params[len(params) - SLOTS :]
    order = fixed[:2] + slots[:used] + fixed[2:]
    return tirx.PrimFunc(order, func.body, func.ret_type, func.attrs)


def field_steps_only(steps: Sequence[EpilogueStep]) -> bool:
    """Whether every step is one the field twin computes inside the kernel."""
    return all(Op(name) in FIELD_STEPS for name, _, _ in steps)


def epilogue_value(steps: Sequence[EpilogueStep], values: list[Any], modulus: int | None, dtype: str) -> Any:
    """The last step's value; ``values`` holds the product (of ``dtype``: float32, or an int64 residue mod
    ``modulus``) and the extra operands' loaded values (already converted to it)."""
    vals = list(values)
    for name, args, attrs in steps:
        x = [vals[i] for i in args]
        vals.append(
            _float(Op(name), x, attrs, dtype) if modulus is None else _field(Op(name), x, attrs, modulus)
        )
    return vals[-1]


def _float(op: Op, x: list[Any], attrs: Any, dt: str) -> Any:
    from tvm import tirx

    def c(v: float) -> Any:
        return tirx.const(v, dt)

    match op:
        case Op.ADD:
            return x[0] + x[1]
        case Op.SUB:
            return x[0] - x[1]
        case Op.MUL:
            return x[0] * x[1]
        case Op.DIV:
            return x[0] / x[1]
        case Op.EXP:
            return tirx.exp(x[0])
        case Op.SQRT:
            return tirx.sqrt(x[0])
        case Op.SCALE:
            return x[0] * c(float(attr(attrs, "factor")))
        case Op.ADD_SCALAR:
            return x[0] + c(float(attr(attrs, "value")))
        case Op.RELU:  # as FloatScalar's: NaN stays NaN (tirx.max would give 0)
            return tirx.if_then_else(x[0] < c(0.0), c(0.0), x[0])
        case Op.SILU:
            return x[0] / (c(1.0) + tirx.exp(c(0.0) - x[0]))
        case Op.GELU:
            return c(0.5) * x[0] * (c(1.0) + tirx.erf(x[0] * c(1.0 / math.sqrt(2.0))))
        case Op.TANH:
            return _tanh(x[0], dt)
        case Op.LOG:
            return tirx.log(x[0])
        case Op.CLAMP:  # selects, as FloatScalar's: NaN stays NaN
            lo, hi = clamp_bounds(attrs)
            v = x[0]
            if lo is not None:
                v = tirx.if_then_else(v < c(float(lo)), c(float(lo)), v)
            if hi is not None:
                v = tirx.if_then_else(v > c(float(hi)), c(float(hi)), v)
            return v
        case _:
            raise UnsupportedOpError(f"epilogue step '{op.value}' is not element-wise")


def _tanh(x: Any, dt: str) -> Any:
    """FloatScalar's tanh (:data:`~gensorage.codegen.scalar.TANH_SERIES`, in float64) as a TIR expression."""
    from tvm import tirx

    def c(v: float) -> Any:
        return tirx.const(v, "float64")

    d = x if dt == "float64" else x.astype("float64")
    sq = d * d
    poly = c(TANH_SERIES[-1])
    for k in reversed(TANH_SERIES[:-1]):
        poly = c(k) + sq * poly
    e = tirx.exp(c(-2.0) * tirx.abs(d))
    big = (c(1.0) - e) / (c(1.0) + e)
    out = tirx.if_then_else(
        tirx.abs(d) < c(TANH_SMALL), d * poly, tirx.if_then_else(d < c(0.0), c(0.0) - big, big)
    )
    return out if dt == "float64" else out.astype(dt)


def _field(op: Op, x: list[Any], attrs: Any, m: int) -> Any:
    from tvm import tirx

    from gensorage.verify.field import field_constant

    mod = tirx.const(m, "int64")

    def r(e: Any) -> Any:
        return tirx.truncmod(e, mod)

    match op:
        case Op.ADD:
            return r(x[0] + x[1])
        case Op.SUB:
            return r(x[0] - x[1] + mod)
        case Op.MUL:
            return r(x[0] * x[1])
        case Op.SCALE:
            return r(x[0] * tirx.const(field_constant(float(attr(attrs, "factor")), m), "int64"))
        case Op.ADD_SCALAR:
            return r(x[0] + tirx.const(field_constant(float(attr(attrs, "value")), m), "int64"))
        case _:
            raise UnsupportedOpError(f"epilogue step '{op.value}' has no residue expression in a GEMM kernel")


__all__ = [
    "FIELD_STEPS",
    "SLOTS",
    "KernelEpilogue",
    "epilogue_value",
    "extra_index",
    "field_steps_only",
    "with_extras",
]

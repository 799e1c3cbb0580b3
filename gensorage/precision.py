"""The precision policy: which dtype each intermediate tensor of a µGraph is stored in.

Kernels always compute in float32 (accumulators, exp, sqrt, div, reductions: see
:mod:`gensorage.codegen.scalar`). What a policy decides is the dtype a value is *stored* in between operators: in
global memory between kernels, in shared memory between block operators.

``"float32"`` (the default)
    Follows torch autocast's float32 list: the results of ``exp`` (softmax's numerator), ``sum`` (sums and
    means), ``sqrt``, ``div`` and squares (``mul(x, x)``, autocast's ``pow``) are stored in float32 when the
    program's dtype is narrower, since float16 overflows at 65504 (exp(11.1), 256²) and bfloat16 keeps 8
    significant bits of a sum. Every other operator stores the widest dtype among its inputs (numpy's
    promotion), so a value derived from a float32 intermediate stays float32 until it is a program output.
``"storage"``
    Every tensor is stored in the program's dtype, as the program's own types say (fewer bytes, but a large
    logit or activation overflows float16).

Program outputs keep the program's dtype under both policies: the operator that writes one casts on store.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from gensorage.errors import ConfigError
from gensorage.opset import Op

Precision = Literal["float32", "storage"]
PRECISIONS: tuple[str, ...] = ("float32", "storage")
DEFAULT_PRECISION: Precision = "float32"

# torch autocast's float32 list, restricted to our operators (a square is its pow(x, 2)).
FLOAT32_OPS = frozenset({Op.EXP, Op.SUM, Op.SQRT, Op.DIV})

# Floating dtypes by width; float16 and bfloat16 promote to float32 together (neither holds the other).
_RANK = {"bfloat16": 1, "float16": 1, "float32": 2, "float64": 3}


def check_precision(name: object) -> Precision:
    """``name`` as a :data:`Precision`; anything else is a one-line :class:`ConfigError` listing the known ones."""
    if name not in PRECISIONS:
        raise ConfigError(f"unknown precision {name!r} (known: {', '.join(PRECISIONS)})")
    return name  # type: ignore[return-value]


def promote(dtypes: Sequence[str]) -> str:
    """The widest of ``dtypes`` (numpy's promotion among float types); float16 with bfloat16 gives float32."""
    if not dtypes:
        return "float32"
    first = dtypes[0]
    if all(d == first for d in dtypes):
        return first
    widest = max(dtypes, key=lambda d: _RANK.get(d, 2))
    if _RANK.get(widest, 2) == 1:  # float16 and bfloat16 mixed
        return "float32"
    return widest


def is_square(op: Op, inputs: Sequence[object]) -> bool:
    """Whether an operator with these input references multiplies a value by itself."""
    return op is Op.MUL and len(inputs) == 2 and inputs[0] == inputs[1]


def stored_dtype(op: Op, dtypes: Sequence[str], square: bool, precision: str) -> str:
    """The dtype ``op``'s result is stored in under ``precision``, given its inputs' stored dtypes."""
    widest = promote(dtypes)
    if precision == "storage" or not (op in FLOAT32_OPS or square):
        return widest
    return widest if _RANK.get(widest, 2) >= _RANK["float32"] else "float32"


__all__ = [
    "DEFAULT_PRECISION",
    "FLOAT32_OPS",
    "PRECISIONS",
    "Precision",
    "check_precision",
    "is_square",
    "promote",
    "stored_dtype",
]

"""The precision policy: which dtype each intermediate tensor of a µGraph is stored in.

Kernels always compute in float32 (accumulators, exp, sqrt, div, reductions: see
:mod:`gensorage.codegen.scalar`). What a policy decides is the dtype a value is *stored* in between operators: in
global memory between kernels, in shared memory between block operators.

``"float32"`` (the default)
    Follows torch autocast's float32 list: the results of ``exp`` (softmax's numerator), ``sum`` (sums and
    means), ``sqrt``, ``div``, ``log`` (a log-softmax's normaliser) and squares (``mul(x, x)``, autocast's ``pow``) are stored in float32 when the
    program's dtype is narrower, since float16 overflows at 65504 (exp(11.1), 256²) and bfloat16 keeps 8
    significant bits of a sum. Every other operator stores the widest dtype among its inputs (numpy's
    promotion), so a value derived from a float32 intermediate stays float32 until it is a program output.
    Loop accumulators follow the same rule: a running sum is a sum, and a running max is stored in float32
    too, since an online softmax subtracts it inside exp, where its rounding would scale every term.
``"storage"``
    Every tensor is stored in the program's dtype, as the program's own types say (fewer bytes, but a large
    logit or activation overflows float16).

Program outputs keep the program's dtype under both policies: the operator that writes one casts on store.

Under ``"float32"`` a value the graph's structure bounds to [0, 1] is stored in the program's dtype even when its
operator is on the list (:func:`value_range`): a stable softmax's ``exp(x − max(x))`` and its probabilities
``e / Σ e``; likewise a norm's normalised value ``x / sqrt(c·Σ x² + ε)``, at most ``1/√c`` (``√n``) in
magnitude. float16 holds those safely, and the matmul that reads them keeps its 16-bit operands. A value at
most one operand in magnitude (``x / (c + e)``, ``c ≥ 1``, ``e ≥ 0``: GELU's tanh form) is stored in that
operand's dtype, and ``a / (a + b)`` of two non-negative values (a sigmoid) in the program's. The operands
of ``exp`` go the other way: a value that flows only into ``exp`` (the scores, ``S − max S``, the maxima; see
:mod:`gensorage.ugraph.exp_operands`) is stored in float32, since ``exp`` makes its absolute rounding error a
relative one (a bfloat16 logit of 100 is off by up to 0.25). And a bfloat16 program's float32 intermediate that
only matmuls read is stored in bfloat16 (:mod:`gensorage.ugraph.matmul_operands`): the matmul rounds it so anyway.
Attention's ``(E·V) / Σ E`` (``E`` an exp's result) is stored in ``V``'s dtype, which holds a convex combination
of its rows, and its numerator ``E·V`` in float32, as a sum (:mod:`gensorage.ugraph.convex_rows`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from gensorage.errors import ConfigError
from gensorage.opset import Attrs, Op, attr

Precision = Literal["float32", "storage"]
PRECISIONS: tuple[str, ...] = ("float32", "storage")
DEFAULT_PRECISION: Precision = "float32"

# torch autocast's float32 list, restricted to our operators (a square is its pow(x, 2)).
FLOAT32_OPS = frozenset({Op.EXP, Op.SUM, Op.SQRT, Op.DIV, Op.LOG})

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


#: What a reference's producer is (its operator, the references it reads, its attributes), None for a value that
#: is not an operator's result at this level (an input, an iterator, a thread graph's output).
Producer = Callable[[Any], "tuple[Op, tuple[Any, ...], Attrs] | None"]
NONPOSITIVE, NONNEGATIVE, UNIT, NORMALISED = "nonpositive", "nonnegative", "unit", "normalised"
AT_LEAST_ONE, SHRINKS = "at_least_one", "shrinks"
# float16's largest finite value: a normalised value's bound must stay below it (bfloat16's is larger).
FLOAT16_MAX = 65504.0


def value_range(
    op: Op, refs: Sequence[Any], attrs: Attrs, producer: Producer, ranges: Mapping[Any, str]
) -> str | None:
    """What the structure proves of ``op``'s result: ``"nonpositive"``, ``"nonnegative"``, ``"unit"`` (in
    [0, 1]), ``"normalised"`` (a norm's ``x / rms(x)``, within float16's range), ``"at_least_one"``, ``"shrinks"``
    (at most ``refs[0]`` in magnitude, element by element) or None.

    ``ranges`` holds what was proved of earlier references. The rules: ``x − max(x)`` (max along a dim, kept) is
    non-positive; ``relu`` and ``exp`` are non-negative; a scale keeps a sign or flips it by its factor's; exp of a
    non-positive value is in (0, 1]; ``e / Σ e`` of a non-negative ``e`` in [0, 1] is in [0, 1] (each term is at
    most the sum), and so is ``a / (a + b)`` of two non-negative values (a sigmoid as the torch front end lowers it);
    ``x / sqrt(c·Σ x² + ε)`` (sums kept, ``c > 0``, ``ε ≥ 0``) is at most ``1/√c`` in magnitude (``x_i²`` is one
    of the sum's terms), so RMSNorm's and LayerNorm's normalised value (``c = 1/n``: ``√n``) and an L2 norm's
    (``c = 1``: 1, also with the root clamped from below and repeated, as ``F.normalize`` lowers it) are within
    float16's range; a non-negative value plus a constant ``c ≥ 1`` is at least 1, and ``x`` divided by such a
    value shrinks ``x`` (GELU's tanh form ``x / (1 + exp(−2u))``: its result fits wherever ``x`` does).
    """
    match op:
        case Op.SUB:
            m = producer(refs[1])
            if m is not None and m[0] is Op.MAX and m[1] == (refs[0],) and attr(m[2], "keepdim", False):
                return NONPOSITIVE
        case Op.RELU:
            return NONNEGATIVE
        case Op.SCALE:
            return _scaled(ranges.get(refs[0]), float(attr(attrs, "factor")))
        case Op.EXP:
            return UNIT if ranges.get(refs[0]) == NONPOSITIVE else NONNEGATIVE
        case Op.ADD_SCALAR:
            if ranges.get(refs[0]) in (NONNEGATIVE, UNIT) and float(attr(attrs, "value")) >= 1:
                return AT_LEAST_ONE
        case Op.DIV:
            return _divided(refs, producer, ranges)
        case _:
            return None
    return None


def _scaled(found: str | None, factor: float) -> str | None:
    """The sign a scale by ``factor`` leaves of a value of range ``found`` (a value in [0, 1] is non-negative)."""
    sign = {NONPOSITIVE: -1, NONNEGATIVE: 1, UNIT: 1}.get(found or "")
    if sign is None:
        return None
    if factor == 0:  # zero is non-positive, and exp(0) is 1
        return NONPOSITIVE
    return NONNEGATIVE if sign * factor > 0 else NONPOSITIVE


def _divided(refs: Sequence[Any], producer: Producer, ranges: Mapping[Any, str]) -> str | None:
    """:func:`value_range` of ``refs[0] / refs[1]``."""
    s = producer(refs[1])
    if ranges.get(refs[0]) == UNIT and s is not None and s[0] is Op.SUM and s[1] == (refs[0],):
        return UNIT if attr(s[2], "keepdim", True) and attr(s[2], "group") is None else None
    if (
        s is not None
        and s[0] is Op.ADD
        and refs[0] in s[1]
        and all(ranges.get(r) in (NONNEGATIVE, UNIT) for r in s[1])
    ):
        return UNIT
    if ranges.get(refs[1]) == AT_LEAST_ONE:
        return SHRINKS
    return NORMALISED if _normalises(refs, producer) else None


def _normalises(refs: Sequence[Any], producer: Producer) -> bool:
    """Whether ``refs[0] / refs[1]`` is ``x / sqrt(c·Σ x² + ε)`` with a bound ``1/√c`` below float16's largest.
    The root may be clamped from below and repeated (``F.normalize``'s ``clamp_min(ε)`` and ``expand_as``): a lower
    clamp only raises it, and a repeat that broadcasts against ``x`` copies its kept dims."""
    root = producer(refs[1])
    while root is not None and (
        root[0] is Op.REPEAT or (root[0] is Op.CLAMP and attr(root[2], "max") is None)
    ):
        root = producer(root[1][0])
    inner = producer(root[1][0]) if root is not None and root[0] is Op.SQRT else None
    if inner is not None and inner[0] is Op.ADD_SCALAR and float(attr(inner[2], "value")) >= 0:
        inner = producer(inner[1][0])
    if inner is not None and inner[0] is Op.SCALE:  # c = the factor; without a scale, c = 1 (an L2 norm)
        if not float(attr(inner[2], "factor")) > FLOAT16_MAX**-2:
            return False
        inner = producer(inner[1][0])
    sums, node = 0, inner
    while (
        node is not None
        and node[0] is Op.SUM
        and attr(node[2], "keepdim", True)
        and attr(node[2], "group") is None
    ):
        sums, node = sums + 1, producer(node[1][0])
    return sums > 0 and node is not None and is_square(node[0], node[1]) and node[1][0] == refs[0]


__all__ = [
    "AT_LEAST_ONE",
    "NONNEGATIVE",
    "SHRINKS",
    "DEFAULT_PRECISION",
    "FLOAT16_MAX",
    "NONPOSITIVE",
    "NORMALISED",
    "UNIT",
    "Producer",
    "FLOAT32_OPS",
    "PRECISIONS",
    "Precision",
    "check_precision",
    "is_square",
    "promote",
    "stored_dtype",
    "value_range",
]

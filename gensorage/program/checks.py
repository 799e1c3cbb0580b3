"""Argument checks of the :class:`~gensorage.program.Program` builder (one-line :class:`ProgramError`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from gensorage.errors import ProgramError
from gensorage.opset import Op, Shape

if TYPE_CHECKING:
    from gensorage.program.program import Tensor


def shape_str(shape: Shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def check_shape(what: str, shape: Any) -> Shape:
    if isinstance(shape, int | np.integer) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        raise ProgramError(f"{what}: shape must be a sequence of positive integers, got {shape!r}") from None
    if not dims or not all(
        isinstance(d, int | np.integer) and not isinstance(d, bool) and d > 0 for d in dims
    ):
        raise ProgramError(f"{what}: shape must be a non-empty sequence of positive integers, got {shape!r}")
    return tuple(int(d) for d in dims)


def check_dim(op: Op | str, dim: Any, ndim: int, shapes: Sequence[Shape]) -> int:
    if not isinstance(dim, int | np.integer) or isinstance(dim, bool) or not -ndim <= dim < ndim:
        shown = ", ".join(shape_str(s) for s in shapes)
        raise ProgramError(
            f"{op if isinstance(op, str) else op.value}: dim {dim!r} out of range for a {ndim}-d tensor (input shapes {shown})"
        )
    return int(dim) % ndim


def attr_text(v: Any) -> str:
    """An attribute as ``.gsp`` text (float ``repr`` round-trips exactly; the tokenizer reads 1e-05 and 0.125)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, tuple):
        return "[" + ", ".join(str(x) for x in v) + "]"
    return repr(v)


def is_number(x: Any) -> bool:
    return isinstance(x, int | float | np.integer | np.floating) and not isinstance(x, bool)


def finite_number(what: str, x: Any) -> float:
    if not is_number(x) or not math.isfinite(float(x)):
        raise ProgramError(f"{what}: the scalar must be a finite number, got {x!r}")
    return float(x)


def one_input(op: Op, inputs: Sequence[Tensor]) -> Tensor:
    if len(inputs) != 1:
        raise ProgramError(f"{op.value}: expects 1 input, got {len(inputs)}")
    return inputs[0]


def only_attrs(op: Op, attrs: Mapping[str, Any], allowed: set[str], required: set[str]) -> None:
    unknown = sorted(set(attrs) - allowed)
    if unknown:
        ok = ", ".join(sorted(allowed)) or "none"
        raise ProgramError(f"{op.value}: unknown argument(s) {', '.join(unknown)} (allowed: {ok})")
    missing = sorted(required - set(attrs))
    if missing:
        raise ProgramError(f"{op.value}: missing argument(s) {', '.join(missing)}")

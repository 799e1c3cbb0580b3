"""Lowering rules of the element-wise functions built from other ops (GELU's tanh form, sigmoid, abs,
log_softmax) and of the clamps (scalar bounds).

Each form is chosen so that no intermediate overflows at any finite input and ±inf give torch's limits (an
``exp`` of a large positive value would give ``inf − inf`` or ``inf / inf``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch.fx as fx

from gensorage.errors import UnsupportedOpError
from gensorage.program import Tensor
from gensorage.torch.fx_args import node_args as _args
from gensorage.torch.fx_args import node_kwargs as _kw
from gensorage.torch.fx_args import scalar_arg as _scalar

if TYPE_CHECKING:
    from gensorage.torch.lowering import Lowering, Value


def gelu(lw: Lowering, node: fx.Node) -> Value:
    """The exact (erf) form, or GPT-2's tanh form as ``x · sigmoid(2u) = x / (1 + exp(−2u))`` with
    ``u = √(2/π)(x + 0.044715 x³)`` (0.5 · (1 + tanh u) = sigmoid(2u); exp of a large −2u is inf, and x / inf = 0,
    as the limit is)."""
    x = lw.tensor(_args(node)[0])
    approximate = _kw(node).get("approximate", "none")
    if approximate == "none":
        return lw.p.gelu(x)
    if approximate != "tanh":
        raise UnsupportedOpError(f"{node.name}: gelu approximation {approximate!r}")
    u = lw.p.add(x, lw.p.scale(lw.p.mul(lw.p.mul(x, x), x), 0.044715))
    e = lw.p.exp(lw.p.scale(u, -2.0 * math.sqrt(2.0 / math.pi)))
    return lw.p.div(x, lw.p.add(e, 1.0))


def exp_pair(lw: Lowering, x: Tensor, k: float) -> tuple[Tensor, Tensor]:
    """``(exp(−k·relu(−x)), exp(−k·relu(x)))``, that is ``exp(k·x) / exp(k·r)`` and ``1 / exp(k·r)`` with
    ``r = max(x, 0)``: both exps are at most 1, so neither overflows at any x, and at ±inf they are 1 and 0
    (``exp(x − relu(x))`` would be ``exp(inf − inf)``, NaN)."""
    a = lw.p.exp(lw.p.scale(lw.p.relu(lw.p.scale(x, -1.0)), -k))
    b = lw.p.exp(lw.p.scale(lw.p.relu(x), -k))
    return a, b


def sigmoid(lw: Lowering, node: fx.Node) -> Value:
    """``a / (a + b)`` of :func:`exp_pair` (``1 / (1 + exp(−x))`` would need a constant numerator, and
    ``x / x`` is no constant): 1 at +inf and 0 at −inf, as torch."""
    a, b = exp_pair(lw, lw.tensor(_args(node)[0]), 1.0)
    return lw.p.div(a, lw.p.add(a, b))


def log_softmax(lw: Lowering, node: fx.Node) -> Value:
    """``s − log Σ exp(s)`` with ``s = x − max(x)`` along ``dim`` (the stable form, torch's own: every exp is at
    most 1 and the sum at least 1, so nothing overflows and the log is finite)."""
    x, dim = _args(node)[:2]
    if len(_args(node)) > 2 and _args(node)[2]:
        raise UnsupportedOpError(f"{node.name}: log_softmax with half_to_float")
    t = lw.tensor(x)
    s = lw.p.sub(t, lw.p.max(t, dim, keepdim=True))
    return lw.p.sub(s, lw.p.log(lw.p.sum(lw.p.exp(s), dim, keepdim=True)))


#: Per clamp-like overload, the argument (after the tensor) giving its lower and its upper bound, each with its
#: default; None where the overload has no such argument.
CLAMP_ARGS: dict[str, tuple[tuple[str | None, float | None], tuple[str | None, float | None]]] = {
    "aten.clamp.default": (("min", None), ("max", None)),
    "aten.clamp_min.default": (("min", None), (None, None)),
    "aten.clamp_max.default": ((None, None), ("max", None)),
    "aten.hardtanh.default": (("min_val", -1.0), ("max_val", 1.0)),
}


def clamp(lw: Lowering, node: fx.Node) -> Value:
    """A clamp to scalar bounds (clamp, clamp_min, clamp_max, hardtanh). Bounds with ``min > max`` (torch then
    gives ``max`` everywhere) or that are not finite numbers stay in torch."""
    spec = CLAMP_ARGS[str(node.target)]
    names = [n for n, _ in spec if n is not None]
    given = dict(zip(names, _args(node)[1:], strict=False)) | dict(_kw(node))
    lo, hi = (None if n is None or (b := given.get(n, d)) is None else _scalar(node, b) for n, d in spec)
    if lo is not None and hi is not None and lo > hi:
        raise UnsupportedOpError(f"{node.name}: clamp with min {lo} > max {hi}")
    return lw.p.clamp(lw.tensor(_args(node)[0]), lo, hi)


def abs_(lw: Lowering, node: fx.Node) -> Value:
    return absolute(lw, lw.tensor(_args(node)[0]))


def absolute(lw: Lowering, x: Tensor) -> Tensor:
    """``|x|`` as ``relu(x) + relu(−x)``: one of the two is 0, so the sum is exact (inf at ±inf)."""
    return lw.p.add(lw.p.relu(x), lw.p.relu(lw.p.scale(x, -1.0)))


__all__ = ["CLAMP_ARGS", "abs_", "absolute", "clamp", "exp_pair", "gelu", "log_softmax", "sigmoid"]

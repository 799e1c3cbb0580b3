"""Lowering rules of the element-wise functions built from ``exp`` and ``relu``: GELU's tanh form, sigmoid,
tanh and abs.

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


def tanh(lw: Lowering, node: fx.Node) -> Value:
    """``(a − b) / (a + b)`` of :func:`exp_pair` at ``k = 2``: ±1 at ±inf, no overflow. Near 0 the difference
    of two exps near 1 is off by a float32 rounding of 1 (about 6e-8 absolute, a large relative error at
    |x| < 1e-4; the front end's check is relative to the largest value, and a dedicated op would give every
    layer of the IR one more operator for it)."""
    a, b = exp_pair(lw, lw.tensor(_args(node)[0]), 2.0)
    return lw.p.div(lw.p.sub(a, b), lw.p.add(a, b))


def abs_(lw: Lowering, node: fx.Node) -> Value:
    """``relu(x) + relu(−x)``: one of the two is 0, so the sum is exact (inf at ±inf)."""
    x = lw.tensor(_args(node)[0])
    return lw.p.add(lw.p.relu(x), lw.p.relu(lw.p.scale(x, -1.0)))


__all__ = ["abs_", "exp_pair", "gelu", "sigmoid", "tanh"]

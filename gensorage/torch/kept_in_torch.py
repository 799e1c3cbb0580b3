"""The aten ops kept in torch on purpose, each with what the IR lacks to express it exactly.

Their rules raise :class:`~gensorage.errors.UnsupportedOpError` with the reason, which the report shows; the
partition then leaves the op to torch, so the answer stays right.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch.fx as fx

from gensorage.errors import UnsupportedOpError

if TYPE_CHECKING:
    from gensorage.torch.lowering import Lowering, Value


def stays_in_torch(why: str) -> Callable[[Lowering, fx.Node], Value]:
    """A rule for an op the IR cannot express exactly: the op stays in torch, with ``why`` in the report."""

    def rule(lw: Lowering, node: fx.Node) -> Value:
        raise UnsupportedOpError(f"{node.target}: {why}")

    return rule


_CLAMP = (
    "needs an element-wise min/max with a constant: relu(x − c) + c rounds by up to half a unit of c, and the "
    "exact max over a pair (x, c) takes about 4 more kernels than the op it replaces"
)

#: Ops kept in torch on purpose, each with what the IR lacks (docs/how-it-works.md lists them).
IN_TORCH: dict[str, str] = {
    "aten._log_softmax.default": "log_softmax needs log, which no IR op computes",
    "aten.log.default": "no IR op computes log",
    "aten.clamp.default": _CLAMP,
    "aten.clamp_min.default": _CLAMP,
    "aten.clamp_max.default": _CLAMP,
    "aten.masked_fill.Scalar": "a select by a boolean mask (no IR op selects; an additive −inf mask is NaN "
    "where x is +inf or NaN, where torch gives the fill)",
    "aten.masked_fill.Tensor": "a select by a boolean mask (no IR op selects)",
    "aten.where.self": "a select by a boolean mask (no IR op selects; an additive mask is NaN where the "
    "other branch is infinite)",
    "aten.where.ScalarOther": "a select by a boolean mask (no IR op selects)",
    "aten.where.ScalarSelf": "a select by a boolean mask (no IR op selects)",
}


__all__ = ["IN_TORCH", "stays_in_torch"]

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


_TENSOR_BOUNDS = (
    "a clamp to tensor bounds (the IR's clamp takes scalar bounds; no IR op selects element-wise)"
)

#: Ops kept in torch on purpose, each with what the IR lacks (docs/how-it-works.md lists them).
IN_TORCH: dict[str, str] = {
    "aten.clamp.Tensor": _TENSOR_BOUNDS,
    "aten.clamp_min.Tensor": _TENSOR_BOUNDS,
    "aten.clamp_max.Tensor": _TENSOR_BOUNDS,
    "aten.masked_fill.Scalar": "a select by a boolean mask (no IR op selects; an additive −inf mask is NaN "
    "where x is +inf or NaN, where torch gives the fill)",
    "aten.masked_fill.Tensor": "a select by a boolean mask (no IR op selects)",
    "aten.where.self": "a select by a boolean mask (no IR op selects; an additive mask is NaN where the "
    "other branch is infinite)",
    "aten.where.ScalarOther": "a select by a boolean mask (no IR op selects)",
    "aten.where.ScalarSelf": "a select by a boolean mask (no IR op selects)",
}


__all__ = ["IN_TORCH", "stays_in_torch"]

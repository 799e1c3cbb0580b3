"""The lowering rule of ``torch.linalg.vector_norm`` (``F.normalize``, ``x.norm(dim=...)``) of order 1, 2 or inf.

Order 2 is ``sqrt(Σ x²)``, order 1 ``Σ |x|``, order inf ``max |x|`` over the dims asked for (every dim by default).
The kernels compute in float32 (the precision policy), so a float16 or bfloat16 input's squares do not overflow
where torch's own float32 accumulation does not.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch.fx as fx

from gensorage.errors import UnsupportedOpError
from gensorage.torch.activations import absolute
from gensorage.torch.fx_args import node_args, node_kwargs, reduced_dims

if TYPE_CHECKING:
    from gensorage.torch.lowering import Lowering, Value

ORDERS = (1, 2, math.inf)


def vector_norm(lw: Lowering, node: fx.Node) -> Value:
    """``aten.linalg_vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None)``."""
    args, kw = node_args(node), node_kwargs(node)
    x = lw.tensor(args[0])
    order = args[1] if len(args) > 1 else kw.get("ord", 2)
    dim = args[2] if len(args) > 2 else kw.get("dim")
    keepdim = bool(args[3] if len(args) > 3 else kw.get("keepdim", False))
    if kw.get("dtype") is not None:
        raise UnsupportedOpError(f"{node.name}: a vector norm with a dtype conversion")
    if isinstance(order, bool) or order not in ORDERS:
        raise UnsupportedOpError(
            f"{node.name}: a vector norm of order {order!r} (gensorage lowers 1, 2 and inf)"
        )
    y = lw.p.mul(x, x) if order == 2 else absolute(lw, x)
    for d in reduced_dims(dim, x.ndim):
        y = lw.p.max(y, d, keepdim=True) if order == math.inf else lw.p.sum(y, d, keepdim=True)
    if order == 2:
        y = lw.p.sqrt(y)
    if not keepdim:
        y = lw.p.reshape(y, lw.shape(node))
    return y


__all__ = ["ORDERS", "vector_norm"]

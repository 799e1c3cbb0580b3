"""The arguments of an FX node as the lowering rules read them."""

from __future__ import annotations

import math
from typing import Any

import torch.fx as fx

from gensorage.errors import UnsupportedOpError


def node_args(node: fx.Node) -> tuple[Any, ...]:
    """A node's positional arguments (FX types them as every possible argument; rules check what they use)."""
    return tuple(node.args)


def node_kwargs(node: fx.Node) -> dict[str, Any]:
    return dict(node.kwargs)


def scalar_arg(node: fx.Node, x: Any) -> float:
    """A scalar argument of ``node`` as a float; anything but a finite number stays in torch."""
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
        raise UnsupportedOpError(f"{node.name}: scalar argument {x!r} is not a finite number")
    return float(x)


def reduced_dims(x: Any, ndim: int) -> list[int]:
    """A reduction's ``dim`` argument as sorted non-negative dims (``None`` or empty: every dim, as torch reads
    it)."""
    dims = [x] if isinstance(x, int) else list(x or range(ndim))
    return sorted({d % ndim for d in dims})


__all__ = ["node_args", "node_kwargs", "reduced_dims", "scalar_arg"]

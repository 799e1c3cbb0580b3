"""The arguments of an FX node as the lowering rules read them."""

from __future__ import annotations

from typing import Any

import torch.fx as fx


def node_args(node: fx.Node) -> tuple[Any, ...]:
    """A node's positional arguments (FX types them as every possible argument; rules check what they use)."""
    return tuple(node.args)


def node_kwargs(node: fx.Node) -> dict[str, Any]:
    return dict(node.kwargs)


__all__ = ["node_args", "node_kwargs"]

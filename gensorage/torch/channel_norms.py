"""The lowering rules of the norms over channels (dim 1 of ``[N, C, *spatial]``): BatchNorm in eval mode and
GroupNorm, as convolutional models (a ViT's or ResNet's stem, a diffusion UNet) apply them after a convolution.

Both are torch multi-output ops whose extra outputs (the batch statistics) serve training only: a graph that
reads them stays in torch. Each normalises as torch's CPU kernels do, ``(x − mean) · (1 / sqrt(var + eps))``
with the biased variance, then scales and shifts per channel.
"""

from __future__ import annotations

import math
import operator
from typing import TYPE_CHECKING, Any

import torch.fx as fx

from gensorage.errors import UnsupportedOpError
from gensorage.program import Tensor
from gensorage.torch.fx_args import node_args, scalar_arg

if TYPE_CHECKING:
    from gensorage.torch.lowering import Lowering, Value

#: The aten ops lowered here; their outputs after the first are batch statistics.
CHANNEL_NORMS = ("aten._native_batch_norm_legit_no_training.default", "aten.native_group_norm.default")


def _only_output_0(node: fx.Node, what: str) -> None:
    if any(u.target is not operator.getitem or node_args(u)[1] != 0 for u in node.users):
        raise UnsupportedOpError(f"{node.name}: {what}'s batch statistics are used (training graph)")


def _affine(lw: Lowering, y: Tensor, weight: Any, bias: Any) -> Tensor:
    """``y · weight + bias``, both per channel (either may be absent)."""
    per_channel = (y.shape[1],) + (1,) * (y.ndim - 2)
    if weight is not None:
        y = lw.p.mul(y, lw.p.reshape(lw.tensor(weight), per_channel))
    if bias is not None:
        y = lw.p.add(y, lw.p.reshape(lw.tensor(bias), per_channel))
    return y


def batch_norm_eval(lw: Lowering, node: fx.Node) -> Value:
    """``aten._native_batch_norm_legit_no_training(x, weight, bias, running_mean, running_var, momentum, eps)``:
    ``(x − running_mean) / sqrt(running_var + eps) · weight + bias`` per channel."""
    _only_output_0(node, "batch_norm")
    x, weight, bias, mean, var = (node_args(node)[i] for i in range(5))
    eps = scalar_arg(node, node_args(node)[6])
    x = lw.tensor(x)
    if x.ndim < 2:
        raise UnsupportedOpError(f"{node.name}: batch_norm of a {x.ndim}-d tensor")
    per_channel = (x.shape[1],) + (1,) * (x.ndim - 2)
    centred = lw.p.sub(x, lw.p.reshape(lw.tensor(mean), per_channel))
    std = lw.p.sqrt(lw.p.add(lw.p.reshape(lw.tensor(var), per_channel), eps))
    return _affine(lw, lw.p.div(centred, std), weight, bias)


def group_norm(lw: Lowering, node: fx.Node) -> Value:
    """``aten.native_group_norm(x, weight, bias, N, C, HxW, groups, eps)``: each sample's channels in ``groups``
    groups, each group normalised over its channels and positions, then scaled and shifted per channel."""
    _only_output_0(node, "group_norm")
    x, weight, bias = (node_args(node)[i] for i in range(3))
    groups, eps = node_args(node)[6], scalar_arg(node, node_args(node)[7])
    x = lw.tensor(x)
    if x.ndim < 2 or type(groups) is not int or x.shape[1] % groups:
        raise UnsupportedOpError(f"{node.name}: group_norm of {list(x.shape)} in {groups} groups")
    size = math.prod(x.shape[1:]) // groups
    g = lw.p.reshape(x, (x.shape[0], groups, size))
    centred = lw.p.sub(g, lw.p.scale(lw.p.sum(g, 2, keepdim=True), 1.0 / size))
    var = lw.p.scale(lw.p.sum(lw.p.mul(centred, centred), 2, keepdim=True), 1.0 / size)
    y = lw.p.div(centred, lw.p.sqrt(lw.p.add(var, eps)))
    return _affine(lw, lw.p.reshape(y, x.shape), weight, bias)


__all__ = ["CHANNEL_NORMS", "batch_norm_eval", "group_norm"]

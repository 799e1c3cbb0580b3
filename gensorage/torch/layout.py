"""Lowering rules of the layout ops: views, transposes, broadcasts, slices, splits and concatenation.

They move or rename elements and compute nothing; a subgraph of these alone stays in torch
(:data:`gensorage.torch.lowering.LAYOUT_RULES`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx

from gensorage.errors import UnsupportedOpError
from gensorage.opset import Op, attr
from gensorage.program import Tensor
from gensorage.torch.fx_args import node_args as _args
from gensorage.torch.fx_args import node_kwargs as _kw

if TYPE_CHECKING:
    from gensorage.torch.lowering import Lowering, Value


@dataclass(frozen=True, slots=True)
class Parts:
    """The tensors of a list-valued layout op (``split``, ``unbind``), each a slice; ``getitem`` picks one."""

    of: tuple[Tensor, ...]


def reshape(lw: Lowering, node: fx.Node) -> Value:
    x = lw.tensor(_args(node)[0])
    shape = lw.shape(node)
    return x if shape == x.shape else lw.p.reshape(x, shape)


def identity(lw: Lowering, node: fx.Node) -> Value:
    if _kw(node).get("memory_format") not in (None, torch.contiguous_format, torch.preserve_format):
        raise UnsupportedOpError(f"{node.name}: memory format {_kw(node)['memory_format']}")
    return lw.value(_args(node)[0])


def transpose(lw: Lowering, node: fx.Node) -> Value:
    x = lw.tensor(_args(node)[0])
    if x.ndim < 2:
        return x
    d0, d1 = _args(node)[1:3] if len(_args(node)) >= 3 else (0, 1)
    return x if d0 % x.ndim == d1 % x.ndim else lw.p.transpose(x, d0, d1)


def permute(lw: Lowering, node: fx.Node) -> Value:
    """A permutation as a sequence of swaps (selection sort on where each dim must end up)."""
    x = lw.tensor(_args(node)[0])
    perm = [d % x.ndim for d in _args(node)[1]]  # type: ignore[union-attr]
    current = list(range(x.ndim))
    for i, want in enumerate(perm):
        j = current.index(want)
        if j != i:
            x = lw.p.transpose(x, i, j)
            current[i], current[j] = current[j], current[i]
    return x


def expand(lw: Lowering, node: fx.Node) -> Value:
    """Broadcasting size-1 dims as repeats (new leading dims first appear as size 1 by a reshape)."""
    x = lw.tensor(_args(node)[0])
    target = lw.shape(node)
    if len(target) > x.ndim:
        x = lw.p.reshape(x, (1,) * (len(target) - x.ndim) + x.shape)
    for d, (have, want) in enumerate(zip(x.shape, target, strict=True)):
        if have != want:
            x = lw.p.repeat(x, d, want)
    return x


def broadcast_source(lw: Lowering, t: Tensor, other: Tensor) -> Tensor:
    """``t`` with the repeats :func:`expand` made of its size-1 dims undone where broadcasting against ``other``
    gives the same values (``x / norm.expand_as(x)``, as ``F.normalize`` writes it): the divisor then stays in the
    row kernel that computed it, and its range proof sees the norm (gensorage.precision, "normalised")."""
    want = torch.broadcast_shapes(t.shape, other.shape)
    node = lw.p.nodes[t.id]
    while node.op is Op.REPEAT:
        src = lw.p.tensor(node.inputs[0])
        if (
            src.shape[int(attr(node.attrs, "dim"))] != 1
            or torch.broadcast_shapes(src.shape, other.shape) != want
        ):
            break
        t, node = src, lw.p.nodes[src.id]
    return t


def repeat_interleave(lw: Lowering, node: fx.Node) -> Value:
    x = lw.tensor(_args(node)[0])
    times = _args(node)[1] if len(_args(node)) > 1 else _kw(node).get("repeats")
    dim = _args(node)[2] if len(_args(node)) > 2 else _kw(node).get("dim")
    if not isinstance(times, int) or dim is None:
        raise UnsupportedOpError(f"{node.name}: repeat_interleave needs an int count and a dim")
    return lw.p.repeat(x, dim, times)


def slice_(lw: Lowering, node: fx.Node) -> Value:
    """``x[..., start:end:step]`` along ``dim`` (a window covering the whole dim is ``x`` itself; a step > 1:
    :func:`_strided`)."""
    x = lw.tensor(_args(node)[0])
    names = ("dim", "start", "end", "step")
    given = {**dict(zip(names, _args(node)[1:], strict=False)), **_kw(node)}
    dim, start, end, step = given.get("dim", 0), given.get("start"), given.get("end"), given.get("step", 1)
    if not all(v is None or type(v) is int for v in (dim, start, end, step)):
        raise UnsupportedOpError(f"{node.name}: slice needs int bounds and step, got {start}:{end}:{step}")
    d = dim % x.ndim  # type: ignore[operator]
    lo, hi, k = slice(start, end, step).indices(x.shape[d])
    if k != 1:
        return _strided(lw, node, x, d, range(lo, hi, k))
    return x if (lo, hi) == (0, x.shape[d]) else lw.p.slice(x, d, lo, hi)


def _strided(lw: Lowering, node: fx.Node, x: Tensor, d: int, picked: range) -> Tensor:
    """Every ``k``-th element along ``d`` (GPT-J's rotary reads ``x[..., ::2]`` and ``x[..., 1::2]``): a window
    of ``m · k`` elements reshaped to ``m`` rows of ``k``, the column of the picked ones sliced out, reshaped back.
    The window starts at most ``k − 1`` before the first picked element, and must fit in the dim (``x[::3]`` of 8
    elements stays in torch: 3 rows of 3 do not fit)."""
    n, m, k = x.shape[d], len(picked), picked.step
    if m == 1:
        return _window(lw, x, d, picked.start, picked.start + 1)
    first = min(picked.start, n - m * k)
    if not m or first < max(0, picked.start - k + 1):
        raise UnsupportedOpError(
            f"{node.name}: no window of {m} x {k} elements holds the slice {picked.start}::{k} of {n}"
        )
    col, rows = picked.start - first, _window(lw, x, d, first, first + m * k)
    grid = lw.p.reshape(rows, x.shape[:d] + (m, k) + x.shape[d + 1 :])
    return lw.p.reshape(lw.p.slice(grid, d + 1, col, col + 1), x.shape[:d] + (m,) + x.shape[d + 1 :])


def split(lw: Lowering, node: fx.Node) -> Value:
    """``split`` (equal sizes, the last one short; also what ``chunk`` becomes) and ``split_with_sizes``: the
    parts as slices (a fused qkv projection split into q, k and v)."""
    x = lw.tensor(_args(node)[0])
    sizes = _args(node)[1] if len(_args(node)) > 1 else _kw(node).get("split_size")
    dim = _args(node)[2] if len(_args(node)) > 2 else _kw(node).get("dim", 0)
    if not isinstance(dim, int) or not all(type(n) is int and n > 0 for n in _listed(sizes)):
        raise UnsupportedOpError(f"{node.name}: split needs int sizes and dim, got {sizes}, {dim}")
    d, ends = dim % x.ndim, [0]
    while ends[-1] < x.shape[d]:
        step = sizes if isinstance(sizes, int) else sizes[len(ends) - 1]  # type: ignore[index]
        ends.append(min(ends[-1] + step, x.shape[d]))
    if isinstance(sizes, list | tuple) and (len(sizes) != len(ends) - 1 or ends[-1] != sum(sizes)):
        raise UnsupportedOpError(f"{node.name}: split sizes {list(sizes)} do not add up to {x.shape[d]}")
    return Parts(tuple(_window(lw, x, d, lo, hi) for lo, hi in zip(ends, ends[1:], strict=False)))


def _listed(x: Any) -> list[Any]:
    return list(x) if isinstance(x, list | tuple) else [x]


def _window(lw: Lowering, x: Tensor, d: int, lo: int, hi: int) -> Tensor:
    return x if (lo, hi) == (0, x.shape[d]) else lw.p.slice(x, d, lo, hi)


def unbind(lw: Lowering, node: fx.Node) -> Value:
    """The slices along ``dim`` with that dim dropped (``q, k, v = qkv.permute(2, 0, 3, 1, 4)``)."""
    x = lw.tensor(_args(node)[0])
    d = (_args(node)[1] if len(_args(node)) > 1 else _kw(node).get("dim", 0)) % x.ndim
    shape = x.shape[:d] + x.shape[d + 1 :]
    if not shape:
        raise UnsupportedOpError(f"{node.name}: unbind of a 1-d tensor into scalars")
    return Parts(tuple(lw.p.reshape(_window(lw, x, d, i, i + 1), shape) for i in range(x.shape[d])))


def select(lw: Lowering, node: fx.Node) -> Value:
    """``x.select(dim, i)`` (``x[:, i]``): a slice of one, reshaped without that dim."""
    x = lw.tensor(_args(node)[0])
    dim, index = _args(node)[1:3]
    if not isinstance(dim, int) or not isinstance(index, int):
        raise UnsupportedOpError(f"{node.name}: select needs an int dim and index")
    d = dim % x.ndim
    i = index % x.shape[d]
    return lw.p.reshape(_window(lw, x, d, i, i + 1), lw.shape(node))


def cat(lw: Lowering, node: fx.Node) -> Value:
    parts = [lw.tensor(x) for x in _args(node)[0]]  # type: ignore[union-attr]
    dim = _args(node)[1] if len(_args(node)) > 1 else _kw(node).get("dim", 0)
    return parts[0] if len(parts) == 1 else lw.p.concat(parts, dim)  # type: ignore[arg-type]


def stack(lw: Lowering, node: fx.Node) -> Value:
    """``torch.stack(parts, dim)``: each part reshaped to the result's shape with a 1 at ``dim`` (a 0-d part is
    ``(1,)`` in a Program, so its own shape cannot say where), then concatenated along ``dim``."""
    parts = [lw.tensor(x) for x in _args(node)[0]]  # type: ignore[union-attr]
    out = lw.shape(node)
    d = (_args(node)[1] if len(_args(node)) > 1 else _kw(node).get("dim", 0)) % len(out)  # type: ignore[operator]
    one = out[:d] + (1,) + out[d + 1 :]
    ones = [x if x.shape == one else lw.p.reshape(x, one) for x in parts]
    return ones[0] if len(ones) == 1 else lw.p.concat(ones, d)


__all__ = [
    "Parts",
    "broadcast_source",
    "cat",
    "expand",
    "identity",
    "permute",
    "repeat_interleave",
    "reshape",
    "select",
    "slice_",
    "split",
    "stack",
    "transpose",
    "unbind",
]

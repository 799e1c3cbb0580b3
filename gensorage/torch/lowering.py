"""aten → :class:`~gensorage.program.Program`: one lowering rule per aten operator of decoder blocks.

The graph comes from torch's own capture (dynamo, then AOTAutograd's functional aten graph), so every node has a
static ``meta["val"]`` (a fake tensor) giving its shape and dtype. A rule turns one node into Program ops; a node
no rule covers, or one whose arguments a rule cannot express (a boolean mask, ``pow(x, 5)``, a symbolic shape,
float64), raises :class:`~gensorage.errors.UnsupportedOpError` with a one-line reason and stays in torch.

``rsqrt``/``reciprocal`` produce a :class:`Recip` (a value not yet divided) so that ``x * rsqrt(v)`` becomes
``x / sqrt(v)``, the form the Program's ``rms_norm`` has; a reciprocal used any other way is materialised as
``s / (s * s)``.

A lowering may need a tensor the graph does not hold (the causal mask of ``scaled_dot_product_attention``): it
becomes an extra program input, built by :class:`Extra` from the shapes alone, so the Program stays the
definition of what the kernels compute.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from gensorage.errors import ProgramError, UnsupportedOpError
from gensorage.program import Program, Tensor
from gensorage.torch.activations import CLAMP_ARGS, abs_, clamp, gelu, log_softmax, sigmoid
from gensorage.torch.channel_norms import CHANNEL_NORMS, batch_norm_eval, group_norm
from gensorage.torch.fx_args import node_args as _args
from gensorage.torch.fx_args import node_kwargs as _kw
from gensorage.torch.fx_args import reduced_dims
from gensorage.torch.fx_args import scalar_arg as _scalar
from gensorage.torch.kept_in_torch import IN_TORCH, stays_in_torch
from gensorage.torch.layout import (
    Parts,
    broadcast_source,
    cat,
    expand,
    identity,
    permute,
    repeat_interleave,
    reshape,
    select,
    slice_,
    split,
    stack,
    transpose,
    unbind,
)
from gensorage.torch.sdpa_ops import SDPA_ARGS
from gensorage.torch.vector_norm import vector_norm

#: The dtypes gensorage kernels take (torch name → gensorage name).
DTYPES: dict[torch.dtype, str] = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
}


@dataclass(frozen=True, slots=True)
class Recip:
    """``1 / of``, not yet divided: ``x * Recip(s)`` lowers to ``x / s``."""

    of: Tensor


@dataclass(frozen=True, slots=True)
class Extra:
    """A program input the graph does not hold: the additive causal mask (0 on and below the diagonal, -inf
    above, top-left aligned like torch's ``is_causal``) of shape ``(rows, cols)``."""

    rows: int
    cols: int

    def make(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        keep = torch.ones(self.rows, self.cols, dtype=torch.bool, device=device).tril()
        zero = torch.zeros((), dtype=dtype, device=device)
        return torch.where(keep, zero, torch.tensor(-math.inf, dtype=dtype, device=device))


Value = Tensor | Recip | Parts
Rule = Callable[["Lowering", fx.Node], Value]


class Lowering:
    """Lowers the nodes of one FX graph, in order, into ``program``.

    ``env`` maps graph nodes to program values; a node's argument not in ``env`` becomes a program input
    (placeholders, and the outputs of nodes that stay in torch) named after the node.
    """

    def __init__(self, program: Program) -> None:
        self.p = program
        self.env: dict[fx.Node, Value] = {}
        self.dtype: str | None = None
        self.boundary: list[fx.Node] = []  # the graph values that will be inputs, when known before lowering
        self.widened: frozenset[str] = frozenset()  # 16-bit dtypes of inputs a mixed subgraph casts up
        self.inputs: list[fx.Node] = []
        self.extras: list[tuple[Tensor, Extra]] = []

    def lower(self, node: fx.Node) -> Value:
        """Lower ``node`` (its tensor arguments lowered or declared as inputs first) and remember its value."""
        rule = RULES.get(_target_name(node))
        if (
            rule is None and getattr(node.target, "__module__", None) == "_operator"
        ):  # sizes of symbolic shapes
            name = getattr(node.target, "__name__", "?")
            raise UnsupportedOpError(f"Python's operator.{name} on sizes (symbolic shapes)")
        if rule is None:
            raise UnsupportedOpError(f"{_target_name(node)}: no gensorage lowering")
        _check_val(node)
        if self.dtype is None and not self.boundary:  # probed alone: its tensor arguments are its inputs
            self.boundary = [a for a in node.all_input_nodes if a not in self.env]
        try:
            value = rule(self, node)
        except ProgramError as exc:
            raise UnsupportedOpError(f"{_target_name(node)}: {exc}") from None
        self.env[node] = value
        return value

    def tensor(self, arg: Any) -> Tensor:
        """The program tensor of graph value ``arg`` (a reciprocal materialised)."""
        v = self.operand(arg)
        if isinstance(v, Recip):
            return self.p.div(v.of, self.p.mul(v.of, v.of))
        return v

    def operand(self, arg: Any) -> Tensor | Recip:
        """The value of ``arg`` as an operand of arithmetic (a list of tensors is not one)."""
        v = self.value(arg)
        if isinstance(v, Parts):
            raise UnsupportedOpError(f"{arg.name}: a list of {len(v.of)} tensors used as one tensor")
        return v

    def value(self, arg: Any) -> Value:
        if not isinstance(arg, fx.Node):
            raise UnsupportedOpError(f"expected a tensor argument, got {type(arg).__name__} {arg!r}")
        if arg not in self.env:
            self.env[arg] = self._input(arg)
        return self.env[arg]

    def extra(self, spec: Extra) -> Tensor:
        for t, s in self.extras:
            if s == spec:
                return t
        assert self.dtype is not None  # an extra is built for an op whose operands set the dtype
        t = self.p.input(f"extra{len(self.extras)}", (spec.rows, spec.cols), self.dtype)
        self.extras.append((t, spec))
        return t

    def _input(self, node: fx.Node) -> Tensor:
        """A program input for ``node``, in the subgraph's dtype (:meth:`_home`): a 16-bit value in a float32
        subgraph enters the kernels cast up, exactly, as torch's type promotion converts it."""
        shape, dtype = _check_val(node)
        if self.dtype is None:
            if node.op == "placeholder" and not self.boundary:  # a subgraph: its placeholders are its inputs
                self.boundary = list(node.graph.find_nodes(op="placeholder"))
            self.dtype, self.widened = _home(self.boundary or [node])
        dtype = _declared(node, dtype)
        if dtype != self.dtype and self.dtype != "float32":
            raise UnsupportedOpError(f"{node.name}: dtype {dtype} mixed with {self.dtype} in one subgraph")
        self.inputs.append(node)
        return self.p.input(f"in{len(self.inputs) - 1}", shape, self.dtype)

    def shape(self, arg: Any) -> tuple[int, ...]:
        return _check_val(arg)[0]


def _declared(node: fx.Node, dtype: str) -> str:
    """The dtype ``node`` (a value of ``dtype``) enters the kernels in: a float32 value that every user casts to
    one narrower dtype is declared in that dtype (the kernels get it cast on entry, the rounding torch's cast
    does)."""
    casts = [u for u in node.users if _target_name(u) == "aten._to_copy.default"]
    narrowed = {_dtype_of(u) for u in casts}
    if dtype == "float32" and casts and len(casts) == len(node.users) and len(narrowed) == 1:
        return narrowed.pop() or dtype
    return dtype


def _home(boundary: list[fx.Node]) -> tuple[str, frozenset[str]]:
    """The Program's dtype for a subgraph whose inputs are ``boundary``: theirs when they agree, else float32;
    and the 16-bit dtypes it casts up (none when they agree).

    Mixed operands compute in float32, as torch's type promotion does (a 16-bit tensor times a float32 one is a
    float32 product; float16 with bfloat16 is float32 too), so the 16-bit inputs of a mixed subgraph are cast up
    on entry, which is exact; rounding a float32 input to 16 bits would not be."""
    dtypes = set()
    for n in boundary:
        try:
            dtypes.add(_declared(n, _check_val(n)[1]))
        except UnsupportedOpError:
            continue  # not a tensor gensorage takes: its own lowering says why
    if len(dtypes) == 1:
        return dtypes.pop(), frozenset()
    return "float32", frozenset(dtypes - {"float32"})


def _target_name(node: fx.Node) -> str:
    if node.op != "call_function":
        return f"{node.op} {node.target}"
    t = node.target
    return "getitem" if t is operator.getitem else str(t)


def _dtype_of(node: fx.Node) -> str | None:
    """The gensorage dtype of ``node``'s tensor value, None for another dtype or no tensor."""
    val = node.meta.get("val")
    return DTYPES.get(val.dtype) if isinstance(val, torch.Tensor) else None


def _check_val(node: fx.Node) -> tuple[tuple[int, ...], str]:
    """Static shape and gensorage dtype of ``node``'s value, or the reason it has none."""
    val = node.meta.get("val")
    if isinstance(val, tuple | list) and node.op == "call_function" and _target_name(node) in MULTI_OUTPUT:
        val = (
            val[0] if val else None
        )  # every part of a split has the dtype of the first; getitem checks its own
    if not isinstance(val, torch.Tensor):
        raise UnsupportedOpError(f"{node.name}: not a single tensor")
    if val.dtype not in DTYPES:
        raise UnsupportedOpError(
            f"{node.name}: dtype {val.dtype} (gensorage takes float32, float16, bfloat16)"
        )
    if not all(isinstance(d, int) for d in val.shape):
        raise UnsupportedOpError(f"{node.name}: symbolic shape {list(val.shape)}")
    if 0 in val.shape:
        raise UnsupportedOpError(f"{node.name}: shape {list(val.shape)} (an empty dim)")
    return program_shape(tuple(int(d) for d in val.shape)), DTYPES[val.dtype]


def program_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The Program's shape of a torch value of ``shape``: a 0-d value (a mean over every dim) is ``(1,)``, which
    broadcasts as it does."""
    return shape or (1,)


# ---------------------------------------------------------------------------------------------- elementwise


def _binary(op: str) -> Rule:
    def rule(lw: Lowering, node: fx.Node) -> Value:
        a, b = _args(node)[:2]
        if _kw(node).get("alpha", 1) != 1 or len(_args(node)) > 2:
            raise UnsupportedOpError(f"{node.name}: alpha other than 1")
        if op == "mul":
            return _mul(lw, node, a, b)
        if op == "div":
            return _div(lw, node, a, b)
        xa = lw.tensor(a) if isinstance(a, fx.Node) else _scalar(node, a)
        xb = lw.tensor(b) if isinstance(b, fx.Node) else _scalar(node, b)
        return lw.p.add(xa, xb) if op == "add" else lw.p.sub(xa, xb)

    return rule


def _div(lw: Lowering, node: fx.Node, a: Any, b: Any) -> Value:
    """``x / c`` is a scale, ``x / rsqrt(v)`` a product, ``1 / x`` a reciprocal."""
    if not isinstance(b, fx.Node):
        if _scalar(node, b) == 0.0:
            raise UnsupportedOpError(f"{node.name}: division by the scalar 0")
        return lw.p.scale(lw.tensor(a), 1.0 / _scalar(node, b))
    vb = lw.operand(b)
    if isinstance(vb, Recip):
        return lw.p.mul(lw.tensor(a), vb.of)
    if not isinstance(a, fx.Node):
        if _scalar(node, a) != 1.0:
            raise UnsupportedOpError(f"{node.name}: a scalar other than 1 divided by a tensor")
        return Recip(vb)
    x = lw.tensor(a)
    return lw.p.div(x, broadcast_source(lw, vb, x))


def _mul(lw: Lowering, node: fx.Node, a: Any, b: Any) -> Value:
    if not isinstance(a, fx.Node):
        a, b = b, a
    if not isinstance(b, fx.Node):
        va = lw.operand(a)
        factor = _scalar(node, b)
        return Recip(va.of) if isinstance(va, Recip) and factor == 1.0 else lw.p.scale(lw.tensor(a), factor)
    va, vb = lw.operand(a), lw.operand(b)
    if isinstance(vb, Recip) and not isinstance(va, Recip):
        return lw.p.div(va, vb.of)
    if isinstance(va, Recip) and not isinstance(vb, Recip):
        return lw.p.div(vb, va.of)
    return lw.p.mul(lw.tensor(a), lw.tensor(b))


def _unary(fn: Callable[[Program, Tensor], Tensor]) -> Rule:
    def rule(lw: Lowering, node: fx.Node) -> Value:
        return fn(lw.p, lw.tensor(_args(node)[0]))

    return rule


def _rsqrt(lw: Lowering, node: fx.Node) -> Value:
    return Recip(lw.p.sqrt(lw.tensor(_args(node)[0])))


def _reciprocal(lw: Lowering, node: fx.Node) -> Value:
    return Recip(lw.tensor(_args(node)[0]))


def _pow(lw: Lowering, node: fx.Node) -> Value:
    """Integer exponents from −4 to 4 as products (a square is ``mul(x, x)``, stored in float32 by the
    precision policy; a negative power is the reciprocal of the positive one), ±0.5 as square roots."""
    x, e = _args(node)[:2]
    if e in (0.5, -0.5):
        root = lw.p.sqrt(lw.tensor(x))
        return root if e > 0 else Recip(root)
    if isinstance(e, bool) or not isinstance(e, int | float) or e != int(e) or not 1 <= abs(e) <= 4:
        raise UnsupportedOpError(f"{node.name}: pow with exponent {e!r} (supported: ±1 to ±4, ±0.5)")
    t = lw.tensor(x)
    square = lw.p.mul(t, t)
    power = {1: t, 2: square, 3: lw.p.mul(square, t), 4: lw.p.mul(square, square)}[abs(int(e))]
    return power if e > 0 else Recip(power)


def _rsub(lw: Lowering, node: fx.Node) -> Value:
    """``other − x`` (``1.0 - mask``)."""
    x, other = _args(node)[:2]
    if _kw(node).get("alpha", 1) != 1 or len(_args(node)) > 2:
        raise UnsupportedOpError(f"{node.name}: alpha other than 1")
    return lw.p.sub(lw.tensor(other) if isinstance(other, fx.Node) else _scalar(node, other), lw.tensor(x))


def _to_copy(lw: Lowering, node: fx.Node) -> Value:
    """A cast between the subgraph's dtype and float32 (``x.float()`` … ``.to(x.dtype)``, as models write around
    norms and softmax) changes nothing: kernels compute in float32, and the precision policy stores what float16
    or bfloat16 cannot hold in float32 as torch autocast does. In a subgraph that mixes dtypes (a float32 Program)
    a cast between float32 and the dtypes it casts up on entry is nothing too. Any other cast, or a change of
    device or layout, stays in torch."""
    (src,) = _args(node)[:1]
    if set(_kw(node)) - {"dtype", "layout", "device"} or _kw(node).get("layout") not in (None, torch.strided):
        raise UnsupportedOpError(f"{node.name}: a copy other than a dtype cast ({sorted(_kw(node))})")
    want, have = node.meta["val"], getattr(src, "meta", {}).get("val")
    if not isinstance(have, torch.Tensor) or want.device != have.device:
        raise UnsupportedOpError(f"{node.name}: a copy to another device")
    home = lw.dtype  # None while probing one node alone: the subgraph's dtype is not known yet
    value = lw.value(src)
    cast = {_dtype_of(src), _dtype_of(node)}
    if home is None and "float32" in cast and None not in cast:
        narrow = want.dtype if want.dtype != torch.float32 else None
        if narrow is None or _has_ancestor_of(src, narrow):  # a narrowing cast undoes an earlier widening one
            return value
    if home is not None and cast <= {home, "float32", *lw.widened}:
        return value
    within = f"a {home} subgraph" if home else "a graph without that narrower dtype before"
    raise UnsupportedOpError(f"{node.name}: cast from {have.dtype} to {want.dtype} in {within}")


def _has_ancestor_of(node: fx.Node, dtype: torch.dtype) -> bool:
    seen, todo = set(), [node]
    while todo:
        n = todo.pop()
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor) and val.dtype == dtype:
            return True
        seen.add(n)
        todo.extend(a for a in n.all_input_nodes if a not in seen)
    return False


# ---------------------------------------------------------------------------------------------- reductions


def _reduce(kind: str) -> Rule:
    def rule(lw: Lowering, node: fx.Node) -> Value:
        x = lw.tensor(_args(node)[0])
        dims = reduced_dims(_args(node)[1] if len(_args(node)) > 1 else _kw(node).get("dim"), x.ndim)
        keepdim = bool(_args(node)[2] if len(_args(node)) > 2 else _kw(node).get("keepdim", False))
        if _kw(node).get("dtype") is not None:
            raise UnsupportedOpError(f"{node.name}: a reduction with a dtype conversion")
        count = 1
        for d in dims:
            count *= x.shape[d]
            x = lw.p.max(x, d, keepdim=True) if kind == "amax" else lw.p.sum(x, d, keepdim=True)
        if kind == "mean":
            x = lw.p.scale(x, 1.0 / count)
        if not keepdim:
            x = lw.p.reshape(x, lw.shape(node))
        return x

    return rule


def _var(lw: Lowering, node: fx.Node) -> Value:
    """``Σ (x − mean)² / (n − correction)`` over ``dim`` (torch's default correction is 1, Bessel's)."""
    x = lw.tensor(_args(node)[0])
    dims = reduced_dims(_args(node)[1] if len(_args(node)) > 1 else _kw(node).get("dim"), x.ndim)
    correction = _kw(node).get("correction")
    correction = 1 if correction is None else correction
    count = math.prod(x.shape[d] for d in dims)
    if not count > _scalar(node, correction):
        raise UnsupportedOpError(f"{node.name}: variance of {count} values with correction {correction}")
    mean = x
    for d in dims:
        mean = lw.p.sum(mean, d, keepdim=True)
    centred = lw.p.sub(x, lw.p.scale(mean, 1.0 / count))
    v = lw.p.mul(centred, centred)
    for d in dims:
        v = lw.p.sum(v, d, keepdim=True)
    v = lw.p.scale(v, 1.0 / (count - correction))
    return v if _kw(node).get("keepdim", False) else lw.p.reshape(v, lw.shape(node))


def _layer_norm(lw: Lowering, node: fx.Node) -> Value:
    """``(x − mean) / sqrt(var + eps) · weight + bias`` over the trailing ``normalized_shape`` dims (the biased
    variance, as torch's); only the normalised output may be used (mean and rstd are for training)."""
    if any(u.target is not operator.getitem or _args(u)[1] != 0 for u in node.users):
        raise UnsupportedOpError(f"{node.name}: layer_norm's mean or rstd is used (training graph)")
    x, shape, weight, bias, eps = _args(node)[:5]
    x = lw.tensor(x)
    dims = list(range(x.ndim - len(shape), x.ndim))
    count = math.prod(x.shape[d] for d in dims)

    def mean(t: Tensor) -> Tensor:
        for d in dims:
            t = lw.p.sum(t, d, keepdim=True)
        return lw.p.scale(t, 1.0 / count)

    centred = lw.p.sub(x, mean(x))
    y = lw.p.div(centred, lw.p.sqrt(lw.p.add(mean(lw.p.mul(centred, centred)), _scalar(node, eps))))
    if weight is not None:
        y = lw.p.mul(y, lw.tensor(weight))
    if bias is not None:
        y = lw.p.add(y, lw.tensor(bias))
    return y


def _softmax(lw: Lowering, node: fx.Node) -> Value:
    x, dim = _args(node)[:2]
    if len(_args(node)) > 2 and _args(node)[2]:
        raise UnsupportedOpError(f"{node.name}: softmax with half_to_float")
    return lw.p.softmax(lw.tensor(x), dim)


# ---------------------------------------------------------------------------------------------- matmul


def _matmul(lw: Lowering, node: fx.Node) -> Value:
    a, b = (lw.tensor(x) for x in _args(node)[:2])
    if a.ndim < 2 or b.ndim < 2:
        raise UnsupportedOpError(f"{node.name}: a matrix-vector product")
    return lw.p.matmul(a, b)


def _addmm(lw: Lowering, node: fx.Node) -> Value:
    """``beta · input + alpha · (a @ b)``: addmm (a linear with bias) and baddbmm (ALiBi's scores). With beta 0
    the input is ignored, NaN in it included, as torch does."""
    bias, a, b = _args(node)[:3]
    beta, alpha = _kw(node).get("beta", 1), _kw(node).get("alpha", 1)
    product = lw.p.matmul(lw.tensor(a), lw.tensor(b))
    if alpha != 1:
        product = lw.p.scale(product, _scalar(node, alpha))
    if beta == 0:
        return product
    t = lw.tensor(bias)
    return lw.p.add(product, t if beta == 1 else lw.p.scale(t, _scalar(node, beta)))


def _sdpa(lw: Lowering, node: fx.Node) -> Value:
    """``softmax(q kᵀ · scale + mask) v``; GQA (fewer K/V heads) repeats each K/V head."""
    users = list(node.users)  # an item other than the output is fine while nothing reads it
    if any(u.target is not operator.getitem or (_args(u)[1] != 0 and u.users) for u in users):
        raise UnsupportedOpError(f"{node.name}: attention's log-sum-exp is used (training graph)")
    name = _target_name(node)
    args = dict(zip(SDPA_ARGS[name], _args(node), strict=False)) | dict(_kw(node))
    if args.get("dropout_p", 0.0) != 0.0:
        raise UnsupportedOpError(f"{node.name}: attention with dropout")
    q, k, v = (lw.tensor(args[n]) for n in ("query", "key", "value"))
    if q.ndim < 3 or k.ndim != q.ndim or v.ndim != q.ndim:
        raise UnsupportedOpError(f"{node.name}: attention operands of ranks {q.ndim}, {k.ndim}, {v.ndim}")
    if k.shape[-3] != q.shape[-3]:
        if q.shape[-3] % k.shape[-3]:
            raise UnsupportedOpError(f"{node.name}: {q.shape[-3]} query heads over {k.shape[-3]} K/V heads")
        k = lw.p.repeat(k, -3, q.shape[-3] // k.shape[-3])
        v = lw.p.repeat(v, -3, q.shape[-3] // v.shape[-3])
    scale = args.get("scale")
    s = lw.p.matmul(q, lw.p.transpose(k, -1, -2))
    s = lw.p.scale(s, 1.0 / math.sqrt(q.shape[-1]) if scale is None else _scalar(node, scale))
    mask = args.get("attn_mask", args.get("attn_bias"))
    if mask is not None:
        s = lw.p.add(s, lw.tensor(mask))
    if args.get("is_causal", False):
        s = lw.p.add(s, lw.extra(Extra(q.shape[-2], k.shape[-2])))
    return lw.p.matmul(lw.p.softmax(s, -1), v)


def _getitem(lw: Lowering, node: fx.Node) -> Value:
    src, index = _args(node)
    if isinstance(src, fx.Node) and _target_name(src) in SPLITS and isinstance(index, int):
        parts = lw.env[src] if src in lw.env else lw.lower(src)  # alone (probed): the split lowers with it
        assert isinstance(parts, Parts)
        return parts.of[index]
    if not isinstance(src, fx.Node) or _target_name(src) not in MULTI_OUTPUT or index != 0:
        raise UnsupportedOpError(f"{node.name}: item {index} of a multi-output op")
    return lw.value(src)


#: List-valued layout ops: ``getitem`` takes any of their parts.
SPLITS = frozenset({"aten.split.Tensor", "aten.split_with_sizes.default", "aten.unbind.int"})
MULTI_OUTPUT = frozenset(
    {
        *SPLITS,
        *(n for n in SDPA_ARGS if n != "aten.scaled_dot_product_attention.default"),
        "aten.native_layer_norm.default",
        *CHANNEL_NORMS,
    }
)

#: One rule per aten overload (the key is ``str(overload)``).
RULES: dict[str, Rule] = {
    "aten.add.Tensor": _binary("add"),
    "aten.add.Scalar": _binary("add"),
    "aten.sub.Tensor": _binary("sub"),
    "aten.sub.Scalar": _binary("sub"),
    "aten.mul.Tensor": _binary("mul"),
    "aten.mul.Scalar": _binary("mul"),
    "aten.div.Tensor": _binary("div"),
    "aten.div.Scalar": _binary("div"),
    "aten.rsub.Scalar": _rsub,
    "aten.rsub.Tensor": _rsub,
    "aten.neg.default": _unary(lambda p, x: p.scale(x, -1.0)),
    "aten.exp.default": _unary(Program.exp),
    "aten.sqrt.default": _unary(Program.sqrt),
    "aten.rsqrt.default": _rsqrt,
    "aten.reciprocal.default": _reciprocal,
    "aten.pow.Tensor_Scalar": _pow,
    "aten.relu.default": _unary(Program.relu),
    "aten.silu.default": _unary(Program.silu),
    "aten.sigmoid.default": sigmoid,
    "aten.tanh.default": _unary(Program.tanh),
    "aten.log.default": _unary(Program.log),
    "aten._log_softmax.default": log_softmax,
    **{name: clamp for name in CLAMP_ARGS},
    "aten.abs.default": abs_,
    "aten.gelu.default": gelu,
    "aten.sum.dim_IntList": _reduce("sum"),
    "aten.mean.dim": _reduce("mean"),
    "aten.mean.default": _reduce("mean"),
    "aten.sum.default": _reduce("sum"),
    "aten.amax.default": _reduce("amax"),
    "aten.var.correction": _var,
    "aten.linalg_vector_norm.default": vector_norm,
    "aten._softmax.default": _softmax,
    "aten.native_layer_norm.default": _layer_norm,
    **dict(zip(CHANNEL_NORMS, (batch_norm_eval, group_norm), strict=True)),
    "aten.softmax.int": _softmax,
    "aten.mm.default": _matmul,
    "aten.bmm.default": _matmul,
    "aten.matmul.default": _matmul,
    "aten.addmm.default": _addmm,
    "aten.baddbmm.default": _addmm,
    **{name: _sdpa for name in SDPA_ARGS},
    "getitem": _getitem,
    "aten.view.default": reshape,
    "aten._unsafe_view.default": reshape,
    "aten.reshape.default": reshape,
    "aten.unsqueeze.default": reshape,
    "aten.squeeze.dim": reshape,
    "aten.squeeze.dims": reshape,
    "aten.clone.default": identity,
    "aten._to_copy.default": _to_copy,
    "aten.alias.default": identity,
    "aten.detach.default": identity,  # a training graph saves values for backward through it
    "aten.t.default": transpose,
    "aten.transpose.int": transpose,
    "aten.permute.default": permute,
    "aten.expand.default": expand,
    "aten.repeat_interleave.self_int": repeat_interleave,
    "aten.cat.default": cat,
    "aten.stack.default": stack,
    "aten.slice.Tensor": slice_,
    "aten.select.int": select,
    "aten.split.Tensor": split,
    "aten.split_with_sizes.default": split,
    "aten.unbind.int": unbind,
    **{name: stays_in_torch(why) for name, why in IN_TORCH.items()},
}

_MOVES = (reshape, identity, transpose, permute, expand, _getitem, cat, stack, slice_, select, split, unbind)
#: Rules that only move or rename elements (a cast to or from float32 is no op in a Program): a subgraph made of
#: these alone is left to torch (no kernel to gain).
LAYOUT_RULES = frozenset(n for n, r in RULES.items() if r in (*_MOVES, _to_copy))

__all__ = ["DTYPES", "LAYOUT_RULES", "RULES", "Extra", "Lowering", "Parts", "Recip", "program_shape"]

"""The tensor operators shared by programs and µGraphs: names, attributes, shape inference, semantics.

Data (:class:`Op`, attribute tuples) is kept apart from behaviour (:func:`infer_shape`, :func:`apply`). Attributes
are stored as a sorted tuple of ``(name, value)`` pairs so nodes that hold them stay hashable.

Semantics (numpy conventions):

- ``matmul``: the last two dims multiply, leading dims broadcast (``numpy.matmul`` with ndim >= 2).
- ``add``/``sub``/``mul``/``div``: elementwise with numpy broadcasting.
- ``exp``/``sqrt``/``relu``/``silu``/``gelu``/``tanh``/``log``: elementwise; ``gelu`` is the exact erf form;
  ``log`` of a negative is NaN and ``log(±0) = -inf`` (as torch).
- ``clamp(min, max)``: elementwise ``min(max(x, min), max)`` with scalar bounds, either (not both) absent; NaN
  stays NaN (as torch); ``min <= max``.
- ``scale(factor)``: multiply by a scalar constant; ``add_scalar(value)``: add a scalar constant.
- ``sum(dim, keepdim=True, group=None)``: sum along ``dim``; with ``group=g`` every ``g`` consecutive elements
  are summed (the dim shrinks by a factor ``g``, Mirage's Sum(d_r, k_r)); ``keepdim=False`` drops a fully
  reduced dim.
- ``max(dim, keepdim=False)``: maximum along ``dim`` (``keepdim=False`` drops the dim, like ``torch.amax``).
- ``transpose(dim0, dim1)``: swap two dims (a layout op: the elements are unchanged, only where they sit).
- ``reshape(shape)``: row-major reshape, same element count.
- ``repeat(dim, times)``: ``numpy.repeat`` along ``dim`` — each slice repeated ``times`` times consecutively
  (what GQA's K/V head replication needs: query head i reads K head i // times).
- ``concat(dim)``: concatenation of all inputs along ``dim``.

A µGraph's ``matmul`` may carry an *epilogue* (attribute ``epilogue``, :mod:`gensorage.ugraph.optimize.fuse_epilogues`
puts it there): element-wise steps applied to the product before it is stored. Its inputs after the two operands
are the epilogue's extra operands, each broadcasting to the product's shape. Each step is ``(op, args, attrs)``:
an element-wise op name, indices into the values so far (0 the product, ``1 .. e`` the extra operands, then one
per step) and its attributes; the matmul's result is the last step's value, of the product's shape.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any, TypeVar, assert_never

from gensorage.arith import Arith
from gensorage.errors import ProgramError, UnsupportedOpError

V = TypeVar("V")
Shape = tuple[int, ...]
Attrs = tuple[tuple[str, Any], ...]


class Op(StrEnum):
    MATMUL = "matmul"
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    EXP = "exp"
    SQRT = "sqrt"
    SCALE = "scale"
    RELU = "relu"
    SILU = "silu"
    GELU = "gelu"
    TANH = "tanh"
    LOG = "log"
    CLAMP = "clamp"
    SUM = "sum"
    MAX = "max"
    ADD_SCALAR = "add_scalar"
    TRANSPOSE = "transpose"
    SLICE = "slice"
    RESHAPE = "reshape"
    REPEAT = "repeat"
    CONCAT = "concat"


BINARY_ELEMENTWISE = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.DIV})
UNARY_ELEMENTWISE = frozenset(
    {Op.EXP, Op.SQRT, Op.SCALE, Op.ADD_SCALAR, Op.RELU, Op.SILU, Op.GELU, Op.TANH, Op.LOG, Op.CLAMP}
)
ELEMENTWISE = BINARY_ELEMENTWISE | UNARY_ELEMENTWISE
ACTIVATIONS = frozenset({Op.RELU, Op.SILU, Op.GELU})
#: Unary functions computed by :meth:`gensorage.arith.Arith.activation` (its ``kind`` is the op's name).
UNARY_FUNCTIONS = ACTIVATIONS | {Op.TANH, Op.LOG}
#: Ops that move elements without computing (zero flops).
LAYOUT = frozenset({Op.RESHAPE, Op.REPEAT, Op.CONCAT, Op.TRANSPOSE, Op.SLICE})
#: Ops that reduce along one dim (one flop per element reduced).
REDUCTIONS = frozenset({Op.SUM, Op.MAX})
# Ops outside the Lax fragment (verified by treating them as uninterpreted functions; see gensorage.verify).
# A clamp is one function per pair of bounds (see :func:`clamp_symbol`); it is not linear.
NON_LAX = UNARY_FUNCTIONS | {Op.CLAMP}
ARITY: Mapping[Op, int | None] = {
    **{op: 2 for op in BINARY_ELEMENTWISE},
    **{op: 1 for op in UNARY_ELEMENTWISE},
    Op.MATMUL: 2,
    Op.SUM: 1,
    Op.MAX: 1,
    Op.TRANSPOSE: 1,
    Op.SLICE: 1,
    Op.RESHAPE: 1,
    Op.REPEAT: 1,
    Op.CONCAT: None,  # two or more
}

#: Layout ops whose attributes are all required (by name).
REQUIRED_ATTRS: Mapping[Op, tuple[str, ...]] = {
    Op.RESHAPE: ("shape",),
    Op.REPEAT: ("dim", "times"),
    Op.TRANSPOSE: ("dim0", "dim1"),
    Op.SLICE: ("dim", "start", "stop"),
}


def parse_op(name: str) -> Op:
    """The :class:`Op` called ``name``; an unknown name is an :class:`UnsupportedOpError` listing the known ones."""
    try:
        return Op(name)
    except ValueError:
        known = ", ".join(o.value for o in Op)
        raise UnsupportedOpError(f"unsupported op '{name}' (known ops: {known})") from None


def freeze_attrs(attrs: Mapping[str, Any] | None) -> Attrs:
    """Attributes as a sorted tuple of pairs, lists (nested ones too) turned into tuples (hashable, canonical)."""
    if not attrs:
        return ()
    return tuple(sorted((k, _frozen(v)) for k, v in attrs.items()))


def _frozen(v: Any) -> Any:
    """``v`` with every list or tuple in it a tuple (an epilogue's steps nest: steps of args and attrs)."""
    return tuple(_frozen(x) for x in v) if isinstance(v, list | tuple) else v


#: An epilogue step: element-wise op name, indices of the values it reads, its attributes.
EpilogueStep = tuple[str, tuple[int, ...], Attrs]


def epilogue(attrs: Attrs) -> tuple[EpilogueStep, ...]:
    """A matmul's epilogue steps (see the module docstring); empty when it has none."""
    return tuple(attr(attrs, "epilogue", ()))


def _epilogue_shape(op: Op, shapes: Sequence[Shape], attrs: Attrs, product: Shape) -> Shape:
    """Check the epilogue of a matmul whose product has shape ``product`` (extra operands ``shapes[2:]``)."""
    steps = epilogue(attrs)
    if len(shapes) < 2 or not steps:
        raise _fail(op, shapes, f"expects 2 inputs (more only with an epilogue), got {len(shapes)}")
    if any(broadcast_shapes(product, e) != product for e in shapes[2:]):
        raise _fail(
            op, shapes, f"an extra epilogue operand does not broadcast to the product's {list(product)}"
        )
    values = [product, *shapes[2:]]
    for n, step in enumerate(steps):
        if not (isinstance(step, tuple) and len(step) == 3):
            raise _fail(op, shapes, f"epilogue step {n} is not (op, args, attrs): {step!r}")
        name, args, step_attrs = step
        sop = parse_op(str(name))
        if sop not in ELEMENTWISE or any(not isinstance(i, int) or not 0 <= i < len(values) for i in args):
            raise _fail(
                op,
                shapes,
                f"epilogue step {n} ({name} of {list(args)}) is not element-wise on earlier values",
            )
        values.append(infer_shape(sop, [values[i] for i in args], freeze_attrs(dict(step_attrs))))
        if values[-1] != product:
            raise _fail(
                op, shapes, f"epilogue step {n} ({name}) does not keep the product's shape {list(product)}"
            )
    return product


def attr(attrs: Attrs, name: str, default: Any = None) -> Any:
    for k, v in attrs:
        if k == name:
            return v
    return default


def broadcast_shapes(a: Shape, b: Shape) -> Shape | None:
    """numpy broadcast of two shapes, or None if they do not broadcast."""
    out: list[int] = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and x != 1 and y != 1:
            return None
        out.append(max(x, y))
    return tuple(reversed(out))


def _fail(op: Op, shapes: Sequence[Shape], why: str) -> ProgramError:
    shown = ", ".join(str(list(s)) for s in shapes)
    return ProgramError(f"{op.value}: {why} (input shapes {shown})")


def _norm_dim(op: Op, shapes: Sequence[Shape], dim: Any, ndim: int) -> int:
    if not isinstance(dim, int) or isinstance(dim, bool) or not -ndim <= dim < ndim:
        raise _fail(op, shapes, f"dim {dim!r} out of range for a {ndim}-d tensor")
    return dim % ndim


def infer_shape(op: Op, shapes: Sequence[Shape], attrs: Attrs = ()) -> Shape:
    """Output shape of ``op`` on inputs of ``shapes``; a mismatch raises :class:`ProgramError` naming op and shapes."""
    arity = ARITY[op]
    if op is Op.MATMUL and (epilogue(attrs) or len(shapes) > 2):
        return _epilogue_shape(op, shapes, attrs, _matmul_shape(op, shapes[:2]))
    if arity is not None and len(shapes) != arity:
        raise _fail(op, shapes, f"expects {arity} input(s), got {len(shapes)}")
    if any(d <= 0 for s in shapes for d in s):
        raise _fail(op, shapes, "every dimension must be positive")
    if op in BINARY_ELEMENTWISE:
        out = broadcast_shapes(shapes[0], shapes[1])
        if out is None:
            raise _fail(op, shapes, "shapes do not broadcast")
        return out
    if op in UNARY_ELEMENTWISE:
        if op is Op.SCALE and not isinstance(attr(attrs, "factor"), int | float):
            raise _fail(op, shapes, "needs a numeric 'factor'")
        if op is Op.ADD_SCALAR and not _finite(attr(attrs, "value")):
            raise _fail(op, shapes, f"'value' must be a finite number, got {attr(attrs, 'value')!r}")
        if op is Op.CLAMP:
            _check_clamp(op, shapes, attrs)
        return shapes[0]
    match op:
        case Op.MATMUL:
            return _matmul_shape(op, shapes)
        case Op.SUM:
            return _sum_shape(op, shapes, attrs)
        case Op.MAX:
            s = shapes[0]
            dim = _norm_dim(op, shapes, attr(attrs, "dim"), len(s))
            keepdim = attr(attrs, "keepdim", False)
            if not isinstance(keepdim, bool):
                raise _fail(op, shapes, f"keepdim must be true or false, got {keepdim!r}")
            return s[:dim] + ((1,) if keepdim else ()) + s[dim + 1 :]
        case Op.TRANSPOSE:
            s = shapes[0]
            d0 = _norm_dim(op, shapes, attr(attrs, "dim0"), len(s))
            d1 = _norm_dim(op, shapes, attr(attrs, "dim1"), len(s))
            return transposed(s, d0, d1)
        case Op.SLICE:
            s = shapes[0]
            dim = _norm_dim(op, shapes, attr(attrs, "dim"), len(s))
            start, stop = slice_bounds(op, shapes, s[dim], attr(attrs, "start"), attr(attrs, "stop"))
            return s[:dim] + (stop - start,) + s[dim + 1 :]
        case Op.RESHAPE:
            new = attr(attrs, "shape")
            if not isinstance(new, tuple) or not new or not all(isinstance(d, int) and d > 0 for d in new):
                raise _fail(op, shapes, f"bad target shape {new!r}")
            if math.prod(new) != math.prod(shapes[0]):
                raise _fail(op, shapes, f"cannot reshape to {list(new)}: element counts differ")
            return new
        case Op.REPEAT:
            s = shapes[0]
            dim = _norm_dim(op, shapes, attr(attrs, "dim"), len(s))
            times = attr(attrs, "times")
            if not isinstance(times, int) or times < 1:
                raise _fail(op, shapes, f"'times' must be a positive integer, got {times!r}")
            return s[:dim] + (s[dim] * times,) + s[dim + 1 :]
        case Op.CONCAT:
            return _concat_shape(op, shapes, attrs)
        case _:
            raise _fail(op, shapes, "unhandled op")


def transposed(t: tuple[V, ...], dim0: int, dim1: int) -> tuple[V, ...]:
    """``t`` with entries ``dim0`` and ``dim1`` swapped (a shape, or anything indexed by dim)."""
    out = list(t)
    out[dim0], out[dim1] = out[dim1], out[dim0]
    return tuple(out)


def reshape_groups(a: Shape, b: Shape) -> list[tuple[list[int], list[int]]] | None:
    """How a row-major reshape from ``a`` to ``b`` pairs their dims: groups (dims of ``a``, dims of ``b``) of equal
    size product, in order, dims of size 1 left out; None when the products never meet (no such reshape)."""
    ia = [i for i, d in enumerate(a) if d != 1]
    ib = [j for j, d in enumerate(b) if d != 1]
    groups: list[tuple[list[int], list[int]]] = []
    x = y = 0
    while x < len(ia) and y < len(ib):
        ins, outs = [ia[x]], [ib[y]]
        pa, pb = a[ia[x]], b[ib[y]]
        x, y = x + 1, y + 1
        while pa != pb:
            if pa < pb and x < len(ia):
                pa *= a[ia[x]]
                ins.append(ia[x])
                x += 1
            elif pb < pa and y < len(ib):
                pb *= b[ib[y]]
                outs.append(ib[y])
                y += 1
            else:
                return None
        groups.append((ins, outs))
    return groups if x == len(ia) and y == len(ib) else None


def slice_bounds(op: Op, shapes: Sequence[Shape], size: int, start: Any, stop: Any) -> tuple[int, int]:
    """``start`` and ``stop`` normalised as Python slices them on a dim of ``size`` (negative counts from the end,
    oversized clamps); an empty result or a non-integer bound is a :class:`ProgramError`."""
    for name, v in (("start", start), ("stop", stop)):
        if isinstance(v, bool) or not hasattr(v, "__index__") or isinstance(v, float):
            raise _fail(op, shapes, f"'{name}' must be an integer, got {v!r}")
    lo, hi, _ = slice(operator.index(start), operator.index(stop)).indices(size)
    if hi <= lo:
        raise _fail(op, shapes, f"slice [{start}:{stop}] of a dim of size {size} is empty")
    return lo, hi


def _check_clamp(op: Op, shapes: Sequence[Shape], attrs: Attrs) -> None:
    unknown = sorted(k for k, _ in attrs if k not in ("min", "max"))
    if unknown:
        raise _fail(op, shapes, f"unknown attribute(s) {', '.join(unknown)} (clamp takes min and max)")
    lo, hi = clamp_bounds(attrs)
    for name, v in (("min", lo), ("max", hi)):
        if v is not None and not _finite(v):
            raise _fail(op, shapes, f"'{name}' must be a finite number or absent, got {v!r}")
    if lo is None and hi is None:
        raise _fail(op, shapes, "needs 'min', 'max' or both")
    if lo is not None and hi is not None and lo > hi:
        raise _fail(op, shapes, f"'min' {lo!r} is greater than 'max' {hi!r}")


def clamp_bounds(attrs: Attrs) -> tuple[float | None, float | None]:
    """A clamp's ``(min, max)``, None where absent (as given: checked by :func:`infer_shape`)."""
    return attr(attrs, "min"), attr(attrs, "max")


def clamp_symbol(lo: float | None, hi: float | None) -> str:
    """The uninterpreted function symbol of a clamp to ``[lo, hi]``: one per pair of bounds, so verification never
    identifies clamps with different bounds (``repr`` of the floats is exact, so equal bounds give one symbol)."""
    return f"clamp[{_bound_text(lo)},{_bound_text(hi)}]"


def _bound_text(v: float | None) -> str:
    return "none" if v is None else repr(float(v))


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _matmul_shape(op: Op, shapes: Sequence[Shape]) -> Shape:
    a, b = shapes
    if len(a) < 2 or len(b) < 2:
        raise _fail(op, shapes, "both operands need at least 2 dims")
    if a[-1] != b[-2]:
        raise _fail(op, shapes, f"inner dims differ ({a[-1]} vs {b[-2]})")
    batch = broadcast_shapes(a[:-2], b[:-2])
    if batch is None:
        raise _fail(op, shapes, "batch dims do not broadcast")
    return batch + (a[-2], b[-1])


def _sum_shape(op: Op, shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    s = shapes[0]
    dim = _norm_dim(op, shapes, attr(attrs, "dim"), len(s))
    keepdim = attr(attrs, "keepdim", True)
    group = attr(attrs, "group")
    if group is None or group == s[dim]:
        return s[:dim] + ((1,) if keepdim else ()) + s[dim + 1 :]
    if not isinstance(group, int) or group < 1 or s[dim] % group:
        raise _fail(op, shapes, f"group {group!r} must divide dim {dim} of size {s[dim]}")
    if not keepdim:
        raise _fail(op, shapes, "keepdim=False needs a full reduction")
    return s[:dim] + (s[dim] // group,) + s[dim + 1 :]


def _concat_shape(op: Op, shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    if len(shapes) < 2:
        raise _fail(op, shapes, "needs at least 2 inputs")
    first = shapes[0]
    dim = _norm_dim(op, shapes, attr(attrs, "dim"), len(first))
    for s in shapes[1:]:
        if len(s) != len(first) or any(
            x != y for i, (x, y) in enumerate(zip(s, first, strict=True)) if i != dim
        ):
            raise _fail(op, shapes, f"all inputs must match except along dim {dim}")
    return first[:dim] + (sum(s[dim] for s in shapes),) + first[dim + 1 :]


def apply(op: Op, arith: Arith[V], inputs: Sequence[V], attrs: Attrs = ()) -> V:
    """Compute ``op`` on ``inputs`` in ``arith`` (shapes are assumed checked by :func:`infer_shape`)."""
    match op:
        case Op.ADD:
            return arith.add(inputs[0], inputs[1])
        case Op.SUB:
            return arith.sub(inputs[0], inputs[1])
        case Op.MUL:
            return arith.mul(inputs[0], inputs[1])
        case Op.DIV:
            return arith.div(inputs[0], inputs[1])
        case Op.EXP:
            return arith.exp(inputs[0])
        case Op.SQRT:
            return arith.sqrt(inputs[0])
        case Op.SCALE:
            return arith.scale(inputs[0], float(attr(attrs, "factor")))
        case Op.ADD_SCALAR:
            return arith.add_scalar(inputs[0], float(attr(attrs, "value")))
        case Op.RELU | Op.SILU | Op.GELU | Op.TANH | Op.LOG:
            return arith.activation(op.value, inputs[0])  # type: ignore[arg-type]
        case Op.CLAMP:
            lo, hi = clamp_bounds(attrs)
            return arith.clamp(inputs[0], _float_or_none(lo), _float_or_none(hi))
        case Op.MATMUL:
            return apply_epilogue(arith, arith.matmul(inputs[0], inputs[1]), inputs[2:], attrs)
        case Op.SUM:
            return _apply_sum(arith, inputs[0], attrs)
        case Op.MAX:
            x = inputs[0]
            dim = int(attr(attrs, "dim")) % len(arith.shape(x))
            return arith.reduce_max(x, dim, bool(attr(attrs, "keepdim", False)))
        case Op.TRANSPOSE:
            x = inputs[0]
            nd = len(arith.shape(x))
            return arith.transpose(x, int(attr(attrs, "dim0")) % nd, int(attr(attrs, "dim1")) % nd)
        case Op.SLICE:
            x = inputs[0]
            dim = int(attr(attrs, "dim")) % len(arith.shape(x))
            lo, hi, _ = slice(int(attr(attrs, "start")), int(attr(attrs, "stop"))).indices(
                arith.shape(x)[dim]
            )
            return arith.slice(x, dim, lo, hi)
        case Op.RESHAPE:
            return arith.reshape(inputs[0], tuple(attr(attrs, "shape")))
        case Op.REPEAT:
            x = inputs[0]
            dim = int(attr(attrs, "dim")) % len(arith.shape(x))
            return arith.repeat(x, dim, int(attr(attrs, "times")))
        case Op.CONCAT:
            dim = int(attr(attrs, "dim")) % len(arith.shape(inputs[0]))
            return arith.concat(inputs, dim)
        case _:
            assert_never(op)


def _float_or_none(v: Any) -> float | None:
    return None if v is None else float(v)


def apply_epilogue(arith: Arith[V], product: V, extra: Sequence[V], attrs: Attrs) -> V:
    """A matmul's epilogue (see the module docstring) applied to its ``product`` with the ``extra`` operands."""
    values = [product, *extra]
    for name, args, step_attrs in epilogue(attrs):
        values.append(apply(Op(name), arith, [values[i] for i in args], step_attrs))
    return values[-1]


def _apply_sum(arith: Arith[V], x: V, attrs: Attrs) -> V:
    shape = arith.shape(x)
    dim = int(attr(attrs, "dim")) % len(shape)
    keepdim = bool(attr(attrs, "keepdim", True))
    group = attr(attrs, "group")
    if group is None or group == shape[dim]:
        return arith.reduce_sum(x, dim, keepdim)
    # Group sum: split dim into (n/group, group) and reduce the inner factor.
    split = shape[:dim] + (shape[dim] // group, group) + shape[dim + 1 :]
    return arith.reduce_sum(arith.reshape(x, split), dim + 1, False)


def flops(op: Op, in_shapes: Sequence[Shape], out: Shape) -> int:
    """Floating-point operations of one application (2 per multiply-add of a matmul, one per element summed by a
    ``sum`` or ``max``, none for layout operators, one per output element otherwise)."""
    if op is Op.MATMUL:  # an epilogue's steps (not seen here) add one flop per output element each
        return 2 * math.prod(out) * in_shapes[0][-1]
    if op in LAYOUT:
        return 0
    if op in REDUCTIONS:
        return math.prod(in_shapes[0])
    return math.prod(out)


def check_supported(op_name: str) -> Op:
    """Alias of :func:`parse_op` for callers validating user input."""
    return parse_op(op_name)


__all__ = [
    "ACTIVATIONS",
    "ARITY",
    "BINARY_ELEMENTWISE",
    "ELEMENTWISE",
    "EpilogueStep",
    "LAYOUT",
    "REDUCTIONS",
    "NON_LAX",
    "UNARY_ELEMENTWISE",
    "UNARY_FUNCTIONS",
    "clamp_bounds",
    "clamp_symbol",
    "apply_epilogue",
    "epilogue",
    "Attrs",
    "Op",
    "Shape",
    "apply",
    "attr",
    "broadcast_shapes",
    "check_supported",
    "flops",
    "freeze_attrs",
    "infer_shape",
    "parse_op",
    "reshape_groups",
    "transposed",
]

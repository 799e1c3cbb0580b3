"""The float64 numpy reference of a workload analysed from a user's TE / TIR block (:mod:`.analysis`): the
block's expression interpreted over the whole iteration space (in chunks of the first spatial axis) and reduced,
with no TVM build; and what the analysis and the interpreter share (the analysed nest, expression helpers)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gensorage.errors import ProgramError, UnsupportedOpError

REDUCERS: dict[str, tuple[Callable[..., np.ndarray], Callable[[Any, Any], Any]]] = {
    "sum": (np.sum, np.add),
    "prod": (np.prod, np.multiply),
    "max": (np.max, np.maximum),
    "min": (np.min, np.minimum),
}
MATH_CALLS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "tirx.exp": np.exp,
    "tirx.exp2": np.exp2,
    "tirx.log": np.log,
    "tirx.log2": np.log2,
    "tirx.log10": np.log10,
    "tirx.sqrt": np.sqrt,
    "tirx.rsqrt": lambda x: 1.0 / np.sqrt(x),
    "tirx.tanh": np.tanh,
    "tirx.sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "tirx.sin": np.sin,
    "tirx.cos": np.cos,
    "tirx.fabs": np.abs,
    "tirx.floor": np.floor,
    "tirx.ceil": np.ceil,
    "tirx.trunc": np.trunc,
    "tirx.round": np.round,
    "tirx.nearbyint": np.round,
}
IF_THEN_ELSE = "prim.if_then_else"
_CHUNK_ELEMENTS = 1 << 22  # bound on the temporaries of the reference interpreter (x 8 bytes each)


@dataclass(frozen=True, slots=True)
class Param:
    var: Any
    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True, slots=True)
class Nest:
    """The analysed block: iterators in block order and the pieces of its reduction update."""

    iter_vars: tuple[Any, ...]
    names: tuple[str, ...]
    extents: tuple[int, ...]
    kinds: tuple[str, ...]
    out: Param
    out_perm: tuple[int, ...]  # out_perm[d] = position (in block order) of the iterator indexing output dim d
    reducer: str
    init: float
    expr: Any  # the update expression without the accumulator
    block_name: str


def children(expr: Any) -> list[Any]:
    """The direct sub-expressions of a TIR expression."""
    from tvm import ir, tirx

    if isinstance(expr, ir.prim.expr.BinaryOpExpr | ir.prim.expr.CmpExpr) or isinstance(
        expr, tirx.And | tirx.Or
    ):
        return [expr.a, expr.b]
    if isinstance(expr, tirx.Not):
        return [expr.a]
    if isinstance(expr, tirx.Cast):
        return [expr.value]
    if isinstance(expr, tirx.Select):
        return [expr.condition, expr.true_value, expr.false_value]
    if isinstance(expr, ir.expr.Call):
        return list(expr.args)
    if isinstance(expr, ir.expr.TensorLoad):
        return list(expr.indices)
    return []


def is_float(expr: Any) -> bool:
    """Whether a TIR expression computes in a float dtype."""
    return str(getattr(expr, "ty", "")).startswith(("float", "bfloat"))


def check_interpretable(expr: Any, ivars: tuple[Any, ...]) -> None:
    """Reject, at analysis time, expression nodes the reference interpreter cannot evaluate."""
    from tvm import ir, tirx

    ok_types = (
        ir.prim.expr.BinaryOpExpr,
        ir.prim.expr.CmpExpr,
        tirx.And,
        tirx.Or,
        tirx.Not,
        tirx.Cast,
        tirx.Select,
        ir.expr.TensorLoad,
        tirx.IntImm,
        tirx.FloatImm,
    )
    if isinstance(expr, ir.expr.Call):
        if expr.op.name != IF_THEN_ELSE and expr.op.name not in MATH_CALLS:
            raise UnsupportedOpError(f"call to {expr.op.name} is not supported in a workload expression")
    elif isinstance(expr, tirx.Var):
        if not any(expr.same_as(v) for v in ivars):
            raise UnsupportedOpError(f"free variable {expr.name} in the block expression")
    elif isinstance(expr, ir.prim.expr.BinaryOpExpr) and type(expr).__name__ in (
        "LShift",
        "RShift",
        "BitwiseAnd",
        "BitwiseOr",
        "BitwiseXor",
    ):
        raise UnsupportedOpError(f"bitwise operation {type(expr).__name__} is not supported")
    elif not isinstance(expr, ok_types):
        raise UnsupportedOpError(f"expression node {type(expr).__name__} is not supported")
    for c in children(expr):
        check_interpretable(c, ivars)


class _Interp:
    """Evaluates a block expression over a grid of iterator values (numpy broadcasting, float64 data)."""

    def __init__(self, env: dict[str, np.ndarray], buffers: dict[str, np.ndarray]) -> None:
        self.env = env
        self.buffers = buffers

    def eval(self, e: Any) -> Any:
        from tvm import ir, tirx

        if isinstance(e, tirx.IntImm):
            return np.int64(e.value)
        if isinstance(e, tirx.FloatImm):
            return np.float64(e.value)
        if isinstance(e, tirx.Var):
            return self.env[str(e.name)]
        if isinstance(e, ir.expr.TensorLoad):
            return self._load(e)
        if isinstance(e, tirx.Cast):
            return self._cast(self.eval(e.value), str(e.ty))
        if isinstance(e, tirx.Select):
            return np.where(self.eval(e.condition), self.eval(e.true_value), self.eval(e.false_value))
        if isinstance(e, ir.expr.Call):
            args = [self.eval(a) for a in e.args]
            if e.op.name == IF_THEN_ELSE:
                return np.where(args[0], args[1], args[2])
            return MATH_CALLS[e.op.name](np.asarray(args[0], dtype=np.float64))
        if isinstance(e, tirx.Not):
            return np.logical_not(self.eval(e.a))
        return self._binary(type(e).__name__, self.eval(e.a), self.eval(e.b), is_float(e))

    def _load(self, e: Any) -> np.ndarray:
        arr = self.buffers[str(e.source.name)]
        idx = np.broadcast_arrays(*[np.asarray(self.eval(i), dtype=np.int64) for i in e.indices])
        # Out-of-range indices only occur in branches an if_then_else discards; clip so the gather is defined.
        clipped = tuple(np.clip(ix, 0, n - 1) for ix, n in zip(idx, arr.shape, strict=True))
        return arr[clipped]

    @staticmethod
    def _cast(v: Any, dtype: str) -> Any:
        if dtype.startswith(("float", "bfloat")):
            return np.asarray(v, dtype=np.float64)
        if dtype == "bool":
            return np.asarray(v) != 0
        return np.trunc(v).astype(np.int64)

    @staticmethod
    def _binary(op: str, a: Any, b: Any, is_float: bool) -> Any:
        simple: dict[str, Callable[[Any, Any], Any]] = {
            "Add": np.add,
            "Sub": np.subtract,
            "Mul": np.multiply,
            "Min": np.minimum,
            "Max": np.maximum,
            "FloorDiv": np.floor_divide,
            "FloorMod": np.mod,
            "EQ": np.equal,
            "NE": np.not_equal,
            "LT": np.less,
            "LE": np.less_equal,
            "GT": np.greater,
            "GE": np.greater_equal,
            "And": np.logical_and,
            "Or": np.logical_or,
        }
        if op in simple:
            return simple[op](a, b)
        if op == "Div":
            return np.true_divide(a, b) if is_float else np.trunc(np.true_divide(a, b)).astype(np.int64)
        if op == "Mod":
            return np.fmod(a, b)
        raise UnsupportedOpError(f"expression node {op} is not supported")


def interpret(nest: Nest, in_params: list[Param], arrays: Sequence[Any]) -> np.ndarray:
    if len(arrays) != len(in_params):
        raise ProgramError(
            f"reference takes {len(in_params)} arrays ({', '.join(p.name for p in in_params)}), "
            f"got {len(arrays)}"
        )
    buffers = {}
    for p, a in zip(in_params, arrays, strict=True):
        arr = np.asarray(a, dtype=np.float64)
        if arr.shape != p.shape:
            raise ProgramError(f"input {p.name} has shape {arr.shape}, expected {p.shape}")
        buffers[p.name] = arr
    n = len(nest.extents)
    spatial = [i for i, k in enumerate(nest.kinds) if k == "spatial"]
    reduce_pos = tuple(i for i, k in enumerate(nest.kinds) if k == "reduce")
    # Output dims in spatial-block order -> output order.
    perm = [spatial.index(p) for p in nest.out_perm]
    out = np.empty(nest.out.shape, dtype=np.float64)
    first = spatial[0]
    per_slice = max(1, math.prod(nest.extents) // nest.extents[first])
    chunk = max(1, _CHUNK_ELEMENTS // per_slice)
    reduce_fn, combine = REDUCERS[nest.reducer]
    names = [str(v.name) for v in nest.iter_vars]
    for start in range(0, nest.extents[first], chunk):
        stop = min(start + chunk, nest.extents[first])
        env = {}
        shape = []
        for i, (nm, ext) in enumerate(zip(names, nest.extents, strict=True)):
            values = np.arange(start, stop) if i == first else np.arange(ext)
            env[nm] = values.reshape([-1 if j == i else 1 for j in range(n)])
            shape.append(len(values))
        value = np.broadcast_to(np.asarray(_Interp(env, buffers).eval(nest.expr), dtype=np.float64), shape)
        reduced = combine(nest.init, reduce_fn(value, axis=reduce_pos))
        sl: list[slice] = [slice(None)] * len(perm)
        sl[nest.out_perm.index(first)] = slice(start, stop)
        out[tuple(sl)] = np.transpose(reduced, perm)
    return out


__all__ = [
    "IF_THEN_ELSE",
    "MATH_CALLS",
    "REDUCERS",
    "Nest",
    "Param",
    "check_interpretable",
    "children",
    "interpret",
    "is_float",
]

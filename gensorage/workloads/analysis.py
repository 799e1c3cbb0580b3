"""Workloads from computations a user brings: a TE compute (:func:`from_te`) or a TIR PrimFunc
(:func:`from_prim_func`).

What can be analysed: a function whose body is one block (besides the implicit root) under plain serial
loops, with spatial and reduction iterators bound one-to-one to those loops, whose update is
``out[s...] = out[s...] (+ | * | max | min) expr`` with a constant init, where the output is indexed by the
spatial iterators (each once) and every input load is affine in the iterators with integer coefficients. Axes
are the block iterators (``v_`` prefix dropped), spatial then reduce; accesses come from the loads'
``tvm.sym.detect_linear_equation`` decomposition. Anything else raises :class:`UnsupportedOpError`.

``reference`` of such a workload interprets the block's expression with numpy in float64 over the whole
iteration space (in chunks of the first spatial axis) and reduces it, so it needs no TVM build
(:mod:`.tir_reference`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from gensorage.errors import UnsupportedOpError, first_line
from gensorage.workloads.data import SUPPORTED_DTYPES
from gensorage.workloads.tir_reference import (
    IF_THEN_ELSE,
    Nest,
    Param,
    check_interpretable,
    children,
    interpret,
    is_float,
)
from gensorage.workloads.workload import Access, Axis, Workload


def _tvm() -> Any:
    import tvm

    return tvm


# ---------------------------------------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------------------------------------


def from_te(inputs: Sequence[Any], output: Any, name: str | None = None) -> Workload:
    """Workload of a TE computation: ``output`` computed from the placeholders ``inputs``.

    Parameters
    ----------
    inputs
        The ``te.placeholder`` tensors, in the order the built function should take them.
    output
        The ``te.compute`` tensor (one reduction, e.g. ``te.sum``).
    name
        Workload name; defaults to the output's op name.

    Returns
    -------
    Workload
        See :func:`from_prim_func`.

    Raises
    ------
    UnsupportedOpError
        The computation is not a single affine reduction block (see the module docstring).
    """
    from tvm import te

    given = list(inputs)
    for ph in _placeholders(output):
        if not any(ph.same_as(t) for t in given):
            raise UnsupportedOpError(
                f"placeholder {ph.op.name} used by {output.op.name} is not among the inputs"
            )
    try:
        func = te.create_prim_func([*given, output])
    except Exception as exc:  # TVM reports a missing placeholder etc. as its own error types
        raise UnsupportedOpError(
            f"cannot make a PrimFunc from the TE computation: {first_line(exc)}"
        ) from exc
    return from_prim_func(func, name=name or str(output.op.name))


def _placeholders(tensor: Any) -> list[Any]:
    """The placeholder tensors a TE tensor depends on."""
    from tvm import te

    if isinstance(tensor.op, te.PlaceholderOp):
        return [tensor]
    out: list[Any] = []
    for t in getattr(tensor.op, "input_tensors", []):
        out += [p for p in _placeholders(t) if not any(p.same_as(q) for q in out)]
    return out


def from_prim_func(func: Any, name: str | None = None) -> Workload:
    """Workload of a TIR PrimFunc with one reduction block (inputs first, output last).

    Parameters
    ----------
    func
        A ``tvm.tirx.PrimFunc`` (or an ``IRModule`` holding exactly one).
    name
        Workload name; defaults to the block's name.

    Returns
    -------
    Workload
        Axes and accesses read from the block; ``flops`` = floating-point operations of one update (the
        reduction's combine included, casts and index arithmetic excluded) x the iteration count; ``dtype`` =
        the inputs' dtype; ``params`` = the axis extents plus ``sig``, a hash of the function text that keeps
        ``key()`` distinct between different computations of the same name and loop nest; ``build`` returns
        ``func``; ``reference`` interprets it with numpy in float64.

    Raises
    ------
    UnsupportedOpError
        Several blocks, already-scheduled loops, a non-affine index, symbolic shapes, an unsupported dtype or
        expression node, or a block that is not a reduction.
    """
    func = _as_prim_func(func)
    params = _buffer_params(func)
    realize, loops = _single_block(func)
    nest = _analyse_block(realize, loops, params)
    inputs = _input_accesses(nest, params)
    out_acc = Access(
        tensor=nest.out.name,
        shape=nest.out.shape,
        dtype=nest.out.dtype,
        index=tuple(((nest.names[p], 1),) for p in nest.out_perm),
        offset=tuple(0 for _ in nest.out.shape),
        is_output=True,
    )
    axes = tuple(
        Axis(n, e, "spatial")
        for n, e, k in zip(nest.names, nest.extents, nest.kinds, strict=True)
        if k == "spatial"
    )
    axes += tuple(
        Axis(n, e, "reduce")
        for n, e, k in zip(nest.names, nest.extents, nest.kinds, strict=True)
        if k == "reduce"
    )
    flops = (1 + _count_flops(nest.expr)) * math.prod(nest.extents)
    dtypes = {a.dtype for a in inputs}
    dtype = inputs[0].dtype if len(dtypes) != 1 else dtypes.pop()
    sig = int(hashlib.sha256(func.script().encode()).hexdigest()[:12], 16)
    in_params = [p for p in params if p.name != nest.out.name]

    def build() -> Any:
        return func

    def reference(*arrays: Any) -> np.ndarray:
        return interpret(nest, in_params, arrays)

    return Workload(
        name=name or nest.block_name,
        params=tuple((a.name, a.extent) for a in axes) + (("sig", sig),),
        axes=axes,
        accesses=(*inputs, out_acc),
        flops=int(flops),
        dtype=dtype,
        build=build,
        reference=reference,
    )


# ---------------------------------------------------------------------------------------------------------
# Structure: parameters, the single block, its loops
# ---------------------------------------------------------------------------------------------------------


def _as_prim_func(func: Any) -> Any:
    tvm = _tvm()
    if isinstance(func, tvm.IRModule):
        funcs = [f for _, f in func.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
        if len(funcs) != 1:
            raise UnsupportedOpError(f"expected an IRModule with one PrimFunc, found {len(funcs)}")
        return funcs[0]
    if not isinstance(func, tvm.tirx.PrimFunc):
        raise UnsupportedOpError(f"expected a tvm.tirx.PrimFunc, got {type(func).__name__}")
    return func


def _buffer_params(func: Any) -> list[Param]:
    from tvm.tirx.buffer import BufferType

    IntImm = _tvm().tirx.IntImm
    out = []
    for p in func.params:
        ty = getattr(p, "ty", None)
        if not isinstance(ty, BufferType):
            raise UnsupportedOpError(
                f"parameter {p.name} is not a buffer; scalar parameters are not supported"
            )
        if not all(isinstance(s, IntImm) for s in ty.shape):
            raise UnsupportedOpError(
                f"buffer {p.name} has a symbolic shape {list(ty.shape)}; only static shapes are supported"
            )
        dtype = str(ty.dtype)
        if dtype not in SUPPORTED_DTYPES:
            raise UnsupportedOpError(
                f"buffer {p.name} has dtype {dtype}; supported: {', '.join(SUPPORTED_DTYPES)}"
            )
        out.append(Param(p, str(p.name), tuple(int(s) for s in ty.shape), dtype))
    return out


def _single_block(func: Any) -> tuple[Any, tuple[Any, ...]]:
    """The one non-root block realize of ``func`` and the loops around it."""
    found: list[tuple[Any, tuple[Any, ...]]] = []
    _walk(func.body, (), found, top=True)
    if not found:
        raise UnsupportedOpError("the function has no computation block")
    if len(found) > 1:
        names = ", ".join(r.block.name_hint for r, _ in found)
        raise UnsupportedOpError(
            f"the function has {len(found)} blocks ({names}); only a single reduction block "
            "is supported (inline producers or pass the reduction alone)"
        )
    return found[0]


def _walk(
    stmt: Any, loops: tuple[Any, ...], found: list[tuple[Any, tuple[Any, ...]]], *, top: bool = False
) -> None:
    from tvm import s_tir, tirx

    if isinstance(stmt, s_tir.SBlockRealize):
        block = stmt.block
        if top and not loops and not block.iter_vars and block.name_hint == "root":
            _walk(block.body, loops, found)
        else:
            found.append((stmt, loops))
    elif isinstance(stmt, tirx.For):
        if int(stmt.kind) != 0 or stmt.thread_binding is not None:
            raise UnsupportedOpError(
                f"loop {stmt.loop_var.name} is already scheduled (not a plain serial loop)"
            )
        _walk(stmt.body, (*loops, stmt), found)
    elif isinstance(stmt, tirx.SeqStmt):
        for s in stmt.seq:
            _walk(s, loops, found)
    else:
        raise UnsupportedOpError(f"unsupported statement {type(stmt).__name__} outside a block")


def _int(expr: Any) -> int | None:
    IntImm = _tvm().tirx.IntImm
    return int(expr.value) if isinstance(expr, IntImm) else None


def _check_bindings(realize: Any, loops: tuple[Any, ...]) -> None:
    """Every block iterator must be bound to its own loop, running from 0 over the iterator's extent."""
    if _int(realize.predicate) != 1:
        raise UnsupportedOpError(
            "the block has a predicate (already scheduled); pass the unscheduled function"
        )
    used: set[int] = set()
    for iv, value in zip(realize.block.iter_vars, realize.iter_values, strict=True):
        pos = next((i for i, lp in enumerate(loops) if value.same_as(lp.loop_var)), None)
        if pos is None or pos in used:
            raise UnsupportedOpError(
                f"block iterator {iv.var.name} is not bound to a loop of its own "
                "(already scheduled?); pass the unscheduled function"
            )
        used.add(pos)
        lp = loops[pos]
        if (
            _int(lp.min) != 0
            or _int(lp.extent) != _int(iv.dom.extent)
            or lp.step is not None
            and _int(lp.step) != 1
        ):
            raise UnsupportedOpError(
                f"loop {lp.loop_var.name} does not run over iterator {iv.var.name}'s domain"
            )
    if len(used) != len(loops):
        raise UnsupportedOpError("the block sits under loops that bind no iterator")


def _axis_name(var_name: str) -> str:
    # te.create_prim_func names block iterators "v_<loop>"; the axis is the loop's name.
    return var_name[2:] if var_name.startswith("v_") and len(var_name) > 2 else var_name


def _iterators(block: Any) -> tuple[tuple[str, ...], tuple[int, ...], tuple[str, ...]]:
    names, extents, kinds = [], [], []
    for iv in block.iter_vars:
        kind = {0: "spatial", 2: "reduce"}.get(int(iv.iter_type))
        if kind is None:
            raise UnsupportedOpError(f"block iterator {iv.var.name} is neither spatial nor a reduction")
        extent = _int(iv.dom.extent)
        if _int(iv.dom.min) != 0 or extent is None or extent < 1:
            raise UnsupportedOpError(
                f"block iterator {iv.var.name} has domain {iv.dom}; expected [0, n) with a static n"
            )
        names.append(_axis_name(str(iv.var.name)))
        extents.append(extent)
        kinds.append(kind)
    if len(set(names)) != len(names):
        raise UnsupportedOpError(f"block iterator names {names} are not distinct")
    if "reduce" not in kinds:
        raise UnsupportedOpError("the block has no reduction iterator; only reductions are supported")
    return tuple(names), tuple(extents), tuple(kinds)


# ---------------------------------------------------------------------------------------------------------
# The reduction update
# ---------------------------------------------------------------------------------------------------------


def _analyse_block(realize: Any, loops: tuple[Any, ...], params: list[Param]) -> Nest:
    from tvm import tirx

    block = realize.block
    _check_bindings(realize, loops)
    names, extents, kinds = _iterators(block)
    if len(block.alloc_buffers) or len(block.match_buffers):
        raise UnsupportedOpError("the block allocates or matches buffers; not supported")
    body, init = block.body, block.init
    if not isinstance(body, tirx.BufferStore):
        raise UnsupportedOpError("the block body is not a single buffer store")
    if not isinstance(init, tirx.BufferStore) or not init.buffer.same_as(body.buffer):
        raise UnsupportedOpError("the block has no init of its output; only reductions are supported")
    out = next((p for p in params if p.var.same_as(body.buffer)), None)
    if out is None:
        raise UnsupportedOpError("the block writes a buffer that is not a function parameter")
    if not params[-1].var.same_as(out.var):
        raise UnsupportedOpError(f"the output buffer {out.name} must be the last parameter")
    ivars = tuple(iv.var for iv in block.iter_vars)
    out_perm = _output_perm(body.indices, ivars, kinds, extents, out)
    reducer, expr = _split_update(body.value, out, body.indices)
    init_value = _const(init.value)
    if init_value is None or not _same_indices(init.indices, body.indices):
        raise UnsupportedOpError("the reduction init is not a constant store to the output element")
    check_interpretable(expr, ivars)
    return Nest(ivars, names, extents, kinds, out, out_perm, reducer, init_value, expr, str(block.name_hint))


def _output_perm(
    indices: Sequence[Any],
    ivars: tuple[Any, ...],
    kinds: tuple[str, ...],
    extents: tuple[int, ...],
    out: Param,
) -> tuple[int, ...]:
    perm = []
    for idx in indices:
        pos = next((i for i, v in enumerate(ivars) if idx.same_as(v)), None)
        if pos is None or kinds[pos] != "spatial":
            raise UnsupportedOpError(f"output {out.name} index {idx} is not a spatial iterator")
        perm.append(pos)
    spatial = [i for i, k in enumerate(kinds) if k == "spatial"]
    if sorted(perm) != spatial:
        raise UnsupportedOpError(f"output {out.name} must be indexed by each spatial iterator exactly once")
    if tuple(extents[p] for p in perm) != out.shape:
        raise UnsupportedOpError(f"output {out.name} shape {out.shape} does not match the iterator extents")
    return tuple(perm)


def _same_indices(a: Sequence[Any], b: Sequence[Any]) -> bool:
    return len(a) == len(b) and all(x.same_as(y) for x, y in zip(a, b, strict=True))


def _const(expr: Any) -> float | None:
    from tvm import tirx

    return float(expr.value) if isinstance(expr, tirx.IntImm | tirx.FloatImm) else None


def _split_update(value: Any, out: Param, indices: Sequence[Any]) -> tuple[str, Any]:
    """Recognise ``out = out (op) expr`` and return (reducer name, expr)."""
    from tvm import ir, tirx

    kind = {tirx.Add: "sum", tirx.Mul: "prod", tirx.Max: "max", tirx.Min: "min"}.get(type(value))
    if kind is not None:
        for acc, other in ((value.a, value.b), (value.b, value.a)):
            if (
                isinstance(acc, ir.expr.TensorLoad)
                and acc.source.same_as(out.var)
                and _same_indices(acc.indices, indices)
            ):
                return kind, other
    raise UnsupportedOpError(
        f"the update of {out.name} is not 'out = out + | * | max | min expr' over the same element"
    )


# ---------------------------------------------------------------------------------------------------------
# Accesses and flops
# ---------------------------------------------------------------------------------------------------------


def _loads(expr: Any) -> list[Any]:
    from tvm import ir

    out = [expr] if isinstance(expr, ir.expr.TensorLoad) else []
    for c in children(expr):
        out += _loads(c)
    return out


def _affine(
    idx: Any, ivars: tuple[Any, ...], names: tuple[str, ...], tensor: str
) -> tuple[tuple[tuple[str, int], ...], int]:
    from tvm import sym

    coeffs = [_int(c) for c in sym.detect_linear_equation(idx, list(ivars))]
    ints = [c for c in coeffs if c is not None]
    if len(coeffs) != len(ivars) + 1 or len(ints) != len(coeffs):
        raise UnsupportedOpError(
            f"index {idx} of {tensor} is not affine in the loop axes with integer coefficients"
        )
    terms = tuple((n, c) for n, c in zip(names, ints[:-1], strict=True) if c)
    return terms, ints[-1]


def _input_accesses(nest: Nest, params: list[Param]) -> list[Access]:
    seen: dict[str, Access] = {}
    for load in _loads(nest.expr):
        p = next((q for q in params if q.var.same_as(load.source)), None)
        if p is None:
            raise UnsupportedOpError(f"the block reads {load.source}, which is not a function parameter")
        if p is nest.out:
            raise UnsupportedOpError(f"the update reads the output {p.name} outside the accumulation")
        dims = [_affine(i, nest.iter_vars, nest.names, p.name) for i in load.indices]
        acc = Access(
            tensor=p.name,
            shape=p.shape,
            dtype=p.dtype,
            index=tuple(d[0] for d in dims),
            offset=tuple(d[1] for d in dims),
        )
        if p.name in seen and seen[p.name] != acc:
            raise UnsupportedOpError(
                f"tensor {p.name} is read with two different index patterns; "
                "one access per tensor is supported"
            )
        seen[p.name] = acc
    accesses = []
    for p in params[:-1]:
        if p.name not in seen:
            raise UnsupportedOpError(f"parameter {p.name} is never read by the block")
        accesses.append(seen[p.name])
    return accesses


def _count_flops(expr: Any) -> int:
    """Floating-point operations in one evaluation of ``expr`` (casts, loads and index math are free)."""
    from tvm import ir, tirx

    if isinstance(expr, ir.expr.Call) and expr.op.name == IF_THEN_ELSE:
        return _count_flops(expr.args[0]) + max(_count_flops(expr.args[1]), _count_flops(expr.args[2]))
    if isinstance(expr, tirx.Select):
        return _count_flops(expr.condition) + max(
            _count_flops(expr.true_value), _count_flops(expr.false_value)
        )
    if isinstance(expr, ir.expr.TensorLoad):
        return 0
    own = 1 if (isinstance(expr, ir.prim.expr.BinaryOpExpr | ir.expr.Call) and is_float(expr)) else 0
    return own + sum(_count_flops(c) for c in children(expr))

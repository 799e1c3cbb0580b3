"""JSON form of a µGraph: plain JSON types, versioned, round-trip exact.

Document::

    {"format": "gensorage.ugraph", "version": 1,
     "inputs": [{"name": "X", "shape": [16, 64], "dtype": "float16"}, ...],
     "ops": [{"kind": "op", "op": "matmul", "inputs": [[0, 0], [1, 0]], "attrs": {}},
             {"kind": "graph", "inputs": [[0, 0], ...],
              "block": {"grid": [8, 2], "forloop": 4, "nodes": [
                  {"kind": "iterator", "input": 0, "imap": [0, null], "fmap": 1},
                  {"kind": "op", "op": "sum", "inputs": [[0, 0]], "attrs": {"dim": 1, "keepdim": true}},
                  {"kind": "thread", "inputs": [[1, 0]], "ops": [{"op": "exp", "inputs": [[0, 0]], "attrs": {}}],
                   "outputs": [[1, 0]]},
                  {"kind": "accumulator", "input": [2, 0], "accum": "sum", "fmap": null},
                  {"kind": "saver", "input": [3, 0], "omap": [0, 1]}]}}],
     "outputs": [[2, 0]]}

Refs are ``[node, out]`` pairs in the index spaces of :mod:`gensorage.ugraph.ir`. :func:`from_json` checks the
document's structure and types (not validity: use :func:`gensorage.ugraph.validate.validate`) and raises
:class:`UGraphError` naming the offending field, e.g. ``ops[1].block.nodes[0].imap[1]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gensorage.errors import UGraphError
from gensorage.opset import Attrs, Op, freeze_attrs
from gensorage.precision import DEFAULT_PRECISION, PRECISIONS
from gensorage.ugraph.ir import (
    ACCUM_KINDS,
    Accumulator,
    BlockGraph,
    BlockNode,
    BlockOp,
    GraphDefinedOp,
    InputIterator,
    KernelGraph,
    KernelNode,
    KernelOp,
    OutputSaver,
    Ref,
    TensorSpec,
    ThreadGraph,
    ThreadOp,
)

FORMAT = "gensorage.ugraph"
VERSION = 1

# ----------------------------------------------------------------------------------------------- writing


def _ref(r: Ref) -> list[int]:
    return [r.node, r.out]


def _attrs(attrs: Attrs) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in attrs}


def _op(op: Op, inputs: tuple[Ref, ...], attrs: Attrs) -> dict[str, Any]:
    return {"op": op.value, "inputs": [_ref(r) for r in inputs], "attrs": _attrs(attrs)}


def _block_node(n: BlockNode) -> dict[str, Any]:
    match n:
        case InputIterator():
            return {"kind": "iterator", "input": n.input, "imap": list(n.imap), "fmap": n.fmap}
        case BlockOp():
            return {"kind": "op", **_op(n.op, n.inputs, n.attrs)}
        case ThreadGraph():
            return {
                "kind": "thread",
                "inputs": [_ref(r) for r in n.inputs],
                "ops": [_op(t.op, t.inputs, t.attrs) for t in n.ops],
                "outputs": [_ref(r) for r in n.outputs],
            }
        case Accumulator():
            out = {"kind": "accumulator", "input": _ref(n.input), "accum": n.kind, "fmap": n.fmap}
            return out if n.values is None else {**out, "values": _ref(n.values)}
        case OutputSaver():
            return {"kind": "saver", "input": _ref(n.input), "omap": list(n.omap)}
    raise UGraphError(f"not a block node: {type(n).__name__}")


def _kernel_node(n: KernelNode) -> dict[str, Any]:
    if isinstance(n, KernelOp):
        return {"kind": "op", **_op(n.op, n.inputs, n.attrs)}
    b = n.block
    return {
        "kind": "graph",
        "inputs": [_ref(r) for r in n.inputs],
        "block": {"grid": list(b.grid), "forloop": b.forloop, "nodes": [_block_node(x) for x in b.nodes]},
    }


def to_json(g: KernelGraph) -> dict[str, Any]:
    """``g`` as a JSON-ready dict (lists, dicts, str, int, float, bool, None only)."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "inputs": [{"name": s.name, "shape": list(s.shape), "dtype": s.dtype} for s in g.inputs],
        "ops": [_kernel_node(n) for n in g.ops],
        "outputs": [_ref(r) for r in g.outputs],
        "precision": g.precision,
    }


# ----------------------------------------------------------------------------------------------- reading


def _get(d: Any, key: str, where: str) -> Any:
    if not isinstance(d, Mapping):
        raise UGraphError(f"{where or 'the document'}: expected an object, got {type(d).__name__}")
    if key not in d:
        raise UGraphError(f"{where}.{key}: missing" if where else f"{key}: missing")
    return d[key]


def _int(v: Any, where: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise UGraphError(f"{where}: expected an integer, got {v!r}")
    return v


def _opt_int(v: Any, where: str) -> int | None:
    return None if v is None else _int(v, where)


def _list(v: Any, where: str) -> list[Any]:
    if not isinstance(v, list):
        raise UGraphError(f"{where}: expected a list, got {type(v).__name__}")
    return v


def _str(v: Any, where: str) -> str:
    if not isinstance(v, str):
        raise UGraphError(f"{where}: expected a string, got {v!r}")
    return v


def _read_ref(v: Any, where: str) -> Ref:
    items = _list(v, where)
    if len(items) != 2:
        raise UGraphError(f"{where}: a reference is [node, out], got {v!r}")
    return Ref(_int(items[0], f"{where}[0]"), _int(items[1], f"{where}[1]"))


def _refs(v: Any, where: str) -> tuple[Ref, ...]:
    return tuple(_read_ref(x, f"{where}[{i}]") for i, x in enumerate(_list(v, where)))


def _read_op(d: Any, where: str) -> tuple[Op, tuple[Ref, ...], Attrs]:
    name = _str(_get(d, "op", where), f"{where}.op")
    try:
        op = Op(name)
    except ValueError:
        raise UGraphError(f"{where}.op: unknown op {name!r}") from None
    attrs = _get(d, "attrs", where)
    if not isinstance(attrs, Mapping) or not all(isinstance(k, str) for k in attrs):
        raise UGraphError(f"{where}.attrs: expected an object")
    for k, val in attrs.items():
        ok = (
            val is None
            or isinstance(val, int | float | str | bool)
            or (
                isinstance(val, list)
                and all(isinstance(x, int | float) and not isinstance(x, bool) for x in val)
            )
        )
        if not ok and not (k == "epilogue" and _nested(val)):  # a matmul's epilogue steps nest lists
            raise UGraphError(f"{where}.attrs.{k}: unsupported value {val!r}")
    return op, _refs(_get(d, "inputs", where), f"{where}.inputs"), freeze_attrs(dict(attrs))


def _nested(val: Any) -> bool:
    """Whether ``val`` is a number, string or (nested) list of them (shape inference checks the form)."""
    if isinstance(val, list):
        return all(_nested(x) for x in val)
    return isinstance(val, int | float | str)


def _read_block_node(d: Any, where: str) -> BlockNode:
    kind = _str(_get(d, "kind", where), f"{where}.kind")
    if kind == "iterator":
        imap = tuple(
            _opt_int(x, f"{where}.imap[{i}]")
            for i, x in enumerate(_list(_get(d, "imap", where), f"{where}.imap"))
        )
        return InputIterator(
            _int(_get(d, "input", where), f"{where}.input"),
            imap,
            _opt_int(_get(d, "fmap", where), f"{where}.fmap"),
        )
    if kind == "op":
        op, ins, attrs = _read_op(d, where)
        return BlockOp(op, ins, attrs)
    if kind == "thread":
        ops = tuple(
            ThreadOp(*_read_op(x, f"{where}.ops[{i}]"))
            for i, x in enumerate(_list(_get(d, "ops", where), f"{where}.ops"))
        )
        return ThreadGraph(
            _refs(_get(d, "inputs", where), f"{where}.inputs"),
            ops,
            _refs(_get(d, "outputs", where), f"{where}.outputs"),
        )
    if kind == "accumulator":
        accum = _str(_get(d, "accum", where), f"{where}.accum")
        if accum not in ACCUM_KINDS:
            raise UGraphError(f"{where}.accum: expected one of {', '.join(ACCUM_KINDS)}, got {accum!r}")
        values = d.get("values")
        return Accumulator(
            _read_ref(_get(d, "input", where), f"{where}.input"),
            accum,  # type: ignore[arg-type]
            _opt_int(_get(d, "fmap", where), f"{where}.fmap"),
            None if values is None else _read_ref(values, f"{where}.values"),
        )
    if kind == "saver":
        omap = tuple(
            _int(x, f"{where}.omap[{i}]")
            for i, x in enumerate(_list(_get(d, "omap", where), f"{where}.omap"))
        )
        return OutputSaver(_read_ref(_get(d, "input", where), f"{where}.input"), omap)
    raise UGraphError(f"{where}.kind: unknown block node kind {kind!r}")


def _read_kernel_node(d: Any, where: str) -> KernelNode:
    kind = _str(_get(d, "kind", where), f"{where}.kind")
    if kind == "op":
        op, ins, attrs = _read_op(d, where)
        return KernelOp(op, ins, attrs)
    if kind != "graph":
        raise UGraphError(f"{where}.kind: unknown kernel op kind {kind!r}")
    b = _get(d, "block", where)
    bw = f"{where}.block"
    grid = tuple(_int(x, f"{bw}.grid[{i}]") for i, x in enumerate(_list(_get(b, "grid", bw), f"{bw}.grid")))
    nodes = tuple(
        _read_block_node(x, f"{bw}.nodes[{i}]")
        for i, x in enumerate(_list(_get(b, "nodes", bw), f"{bw}.nodes"))
    )
    block = BlockGraph(grid, _int(_get(b, "forloop", bw), f"{bw}.forloop"), nodes)
    return GraphDefinedOp(block, _refs(_get(d, "inputs", where), f"{where}.inputs"))


def _read_input(d: Any, where: str) -> TensorSpec:
    shape = tuple(
        _int(x, f"{where}.shape[{i}]") for i, x in enumerate(_list(_get(d, "shape", where), f"{where}.shape"))
    )
    return TensorSpec(
        _str(_get(d, "name", where), f"{where}.name"), shape, _str(_get(d, "dtype", where), f"{where}.dtype")
    )


def from_json(data: Any) -> KernelGraph:
    """The µGraph a :func:`to_json` document describes; a malformed one is a :class:`UGraphError`."""
    fmt = _get(data, "format", "")
    if fmt != FORMAT:
        raise UGraphError(f"format: expected {FORMAT!r}, got {fmt!r}")
    version = _get(data, "version", "")
    if version != VERSION:
        raise UGraphError(f"version: unsupported version {version!r} (this gensorage reads {VERSION})")
    inputs = tuple(
        _read_input(x, f"inputs[{i}]") for i, x in enumerate(_list(_get(data, "inputs", ""), "inputs"))
    )
    ops = tuple(_read_kernel_node(x, f"ops[{i}]") for i, x in enumerate(_list(_get(data, "ops", ""), "ops")))
    precision = data.get("precision", DEFAULT_PRECISION)  # documents written before the policy existed
    if precision not in PRECISIONS:
        raise UGraphError(f"precision: expected one of {', '.join(PRECISIONS)}, got {precision!r}")
    return KernelGraph(inputs, ops, _refs(_get(data, "outputs", ""), "outputs"), precision)


__all__ = ["FORMAT", "VERSION", "from_json", "to_json"]

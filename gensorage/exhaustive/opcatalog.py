"""The operators the search may add, with every attribute it tries, and fast shape inference for them.

An :class:`OpVariant` is an operator type with fixed attributes (``sum`` over dim 1, ``scale`` by 0.125, ...).
Which variants exist is derived from the program (:func:`catalog`):

- operator types: those the program uses, plus ``sum`` when it has a ``matmul`` (partial products reduced in
  another kernel, split-K) and ``concat`` when it has a ``matmul`` and an ``add`` (``X W + Y B = (X‖Y)(W‖B)``,
  LoRA); :attr:`SearchSpec.ops` overrides the set;
- attributes that are sizes-free (``sum``'s dim, ``concat``'s dim) are tried on every dim; attributes that are
  constants of the program (``scale`` factors, ``add_scalar`` values, ``repeat`` counts, ``transpose`` dim
  pairs, ``reshape`` targets, ``sum`` groups) are taken from the program, since no other constant can appear in
  an equivalent µGraph of the op set; ``max`` is tried over every dim (keepdim) plus the program's own.

:func:`out_shape` is shape inference for a variant that returns None instead of raising: the search calls it
for every candidate operator, where exceptions would dominate the time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gensorage.exhaustive.expr import abstract_expr as ae
from gensorage.exhaustive.expr.abstract_expr import Term
from gensorage.opset import (
    BINARY_ELEMENTWISE,
    UNARY_ELEMENTWISE,
    UNARY_FUNCTIONS,
    Attrs,
    Op,
    Shape,
    attr,
    freeze_attrs,
    transposed,
)
from gensorage.program import Program

MAX_RANK = 8  # dims tried for dim-valued attributes (tensors of the op set have far fewer)

# Operator types in the order the search tries them; the position is the "type" part of an operator's rank.
TYPE_ORDER: tuple[Op, ...] = (
    Op.MATMUL,
    Op.ADD,
    Op.SUB,
    Op.MUL,
    Op.DIV,
    Op.EXP,
    Op.SQRT,
    Op.SCALE,
    Op.ADD_SCALAR,
    Op.RELU,
    Op.SILU,
    Op.GELU,
    Op.TANH,
    Op.LOG,
    Op.CLAMP,
    Op.SUM,
    Op.MAX,
    Op.REPEAT,
    Op.TRANSPOSE,
    Op.RESHAPE,
    Op.CONCAT,
)
COMMUTATIVE = frozenset({Op.ADD, Op.MUL})
# Operators the search adds as pre-defined kernel operators only (the block emitter has no transpose).
KERNEL_ONLY = frozenset({Op.TRANSPOSE})
# Operators a searched program may not use (see :func:`unsearched`).
NOT_SEARCHED = frozenset({Op.SLICE})
# The non-linear operators that may read a scale's result, besides a maximum of a positive one (see
# :func:`reads_scaled` and docs/search.md: a constant factor is moved along its linear chain to just before the
# next non-linear operator or the output). Adding a constant is not linear:
# ``c·x + v`` is no ``c·(x + v)``, so a scale cannot move past an add_scalar (an RMSNorm's mean + eps).
NONLINEAR_UNARY = frozenset(
    {Op.EXP, Op.SQRT, Op.ADD_SCALAR, Op.RELU, Op.SILU, Op.GELU, Op.TANH, Op.LOG, Op.CLAMP}
)


def reads_scaled(op: Op, factors: Sequence[float | None]) -> bool:
    """Whether ``op`` may read a scale's result (one of operands with constant ``factors``): a non-linear unary
    operator, or a maximum of a positive multiple (``max(c·x) = c·max(x)`` holds for ``c > 0`` only). A maximum's
    result is then a scale's result itself (:func:`keeps_scaled`), so the factor still ends at a non-linear
    operator or an output, and a stable softmax split across kernels (FlashDecoding) can save the maxima of the
    scaled scores that its exponentials subtract."""
    if op is Op.MAX:
        return all(c is not None and c > 0 for c in factors)
    return op in NONLINEAR_UNARY


def keeps_scaled(op: Op, read_scaled: bool) -> bool:
    """Whether ``op``'s result counts as a scale's result: a scale's, or a maximum's of one."""
    return op is Op.SCALE or (read_scaled and op is Op.MAX)


# x + x, x - x and x / x are 2x, 0 and 1: never what an equivalent µGraph needs an operator for.
SELF_USELESS = frozenset({Op.ADD, Op.SUB, Op.DIV})


@dataclass(frozen=True, slots=True)
class OpVariant:
    """An operator type with its attributes; ``code`` orders variants (the rank's type component)."""

    op: Op
    attrs: Attrs
    arity: int
    code: int


def program_ops(program: Program) -> frozenset[Op]:
    """Operator types the program's live nodes use."""
    return frozenset(n.op for i in program.live_ids() if (n := program.nodes[i]).op is not None)


def unsearched(program: Program) -> str | None:
    """Why the search cannot take ``program``, or None. A slice's window is an absolute range of its dim, which
    neither the abstract expressions nor a re-instantiation at other shapes model: such a program is refused (full
    mode keeps the direct µGraph) rather than searched unsoundly."""
    ops = sorted(o.value for o in program_ops(program) & NOT_SEARCHED)
    return (
        f"the search does not take {', '.join(ops)} (its window is no abstract expression)" if ops else None
    )


def stable_softmax_only(program: Program) -> bool:
    """Whether every ``sub`` and every ``exp`` of ``program`` is a stable softmax's (and it has one): each live
    ``sub`` subtracts a ``max`` of its own minuend (``x − max(x, dim)``) and only ``exp`` operators read it, and
    each live ``exp`` reads such a ``sub``. The restrictions ``sub_stabilises_only`` and ``exp_stabilised_only``
    then keep µGraphs of the program's own form (docs/search.md, "Limits derived from the program")."""
    nodes = program.nodes
    live = program.live_ids()
    readers: dict[int, list[Op]] = {}
    for i in live:
        n = nodes[i]
        for j in n.inputs:
            readers.setdefault(j, []).append(n.op)  # type: ignore[arg-type]
    outputs = {t.id for t in program.outputs}
    subs = 0
    for i in live:
        n = nodes[i]
        if n.op is Op.SUB:
            x, m = n.inputs
            if nodes[m].op is not Op.MAX or nodes[m].inputs != (x,) or i in outputs:
                return False
            if any(op is not Op.EXP for op in readers.get(i, [])):
                return False
            subs += 1
        elif n.op is Op.EXP and nodes[n.inputs[0]].op is not Op.SUB:
            return False
    return subs > 0


def program_op_signatures(program: Program) -> frozenset[object]:
    """The operators the program applies, each as its kind, attributes and operands (an input by its index),
    the operands of a ``repeat`` standing for it: a graph-defined kernel replicates instead (a grid dim its
    iterator does not map), as GQA's kernels read one ``K`` head for a group of query heads. A kernel's
    pre-defined operator is the program's own if it is one of these (``transpose(K)`` in attention)."""
    inputs = {t.id: i for i, t in enumerate(program.inputs)}
    sig: dict[int, object] = {}
    for node in program.nodes:
        if node.op is None:
            sig[node.id] = inputs[node.id]
        elif node.op is Op.REPEAT:
            sig[node.id] = sig[node.inputs[0]]
        else:
            sig[node.id] = node.op.value, node.attrs, tuple(sig[i] for i in node.inputs)
    return frozenset(s for s in sig.values() if isinstance(s, tuple))


def default_types(program: Program) -> frozenset[Op]:
    """The operator types searched when the spec names none (see the module docstring)."""
    used = set(program_ops(program))
    if Op.MATMUL in used:
        used.add(Op.SUM)
        if Op.ADD in used:
            used.add(Op.CONCAT)
    return frozenset(used)


def catalog(program: Program, types: Sequence[Op] | None = None) -> tuple[OpVariant, ...]:
    """Every operator variant the search tries, in rank order of their types."""
    allowed = frozenset(types) if types is not None else default_types(program)
    nodes = [program.nodes[i] for i in program.live_ids() if program.nodes[i].op is not None]
    out: list[OpVariant] = []

    def add(op: Op, attrs: dict[str, object], arity: int) -> None:
        out.append(OpVariant(op, freeze_attrs(attrs), arity, len(out)))

    for op in TYPE_ORDER:
        if op not in allowed:
            continue
        if op is Op.MATMUL or op in BINARY_ELEMENTWISE:
            add(op, {}, 2)
        elif op is Op.SCALE:
            for f in sorted({float(attr(n.attrs, "factor")) for n in nodes if n.op is Op.SCALE}):
                add(op, {"factor": f}, 1)
        elif op is Op.ADD_SCALAR:
            for c in sorted({float(attr(n.attrs, "value")) for n in nodes if n.op is Op.ADD_SCALAR}):
                add(op, {"value": c}, 1)
        elif op is Op.CLAMP:  # the program's bound pairs (a clamp is one function per pair)
            for bounds in sorted({n.attrs for n in nodes if n.op is Op.CLAMP}):
                add(op, dict(bounds), 1)
        elif op in UNARY_ELEMENTWISE:
            add(op, {}, 1)
        elif op is Op.MAX:
            for dim, keep in sorted(
                {(int(attr(n.attrs, "dim")), bool(attr(n.attrs, "keepdim"))) for n in nodes if n.op is Op.MAX}
                | {(d, True) for d in range(MAX_RANK)}
            ):
                add(op, {"dim": dim, "keepdim": keep}, 1)
        elif op is Op.TRANSPOSE:
            for d0, d1 in sorted(
                {
                    (int(attr(n.attrs, "dim0")), int(attr(n.attrs, "dim1")))
                    for n in nodes
                    if n.op is Op.TRANSPOSE
                }
            ):
                add(op, {"dim0": d0, "dim1": d1}, 1)
        elif op is Op.SUM:
            _sum_variants(nodes, add)
        elif op is Op.REPEAT:
            for dim, times in sorted(
                {(int(attr(n.attrs, "dim")), int(attr(n.attrs, "times"))) for n in nodes if n.op is Op.REPEAT}
            ):
                add(op, {"dim": dim, "times": times}, 1)
        elif op is Op.RESHAPE:
            for shape in sorted({tuple(attr(n.attrs, "shape")) for n in nodes if n.op is Op.RESHAPE}):
                add(op, {"shape": shape}, 1)
        elif op is Op.CONCAT:
            for dim in range(MAX_RANK):
                add(op, {"dim": dim}, 2)
    return tuple(out)


def _sum_variants(nodes: Sequence[object], add: object) -> None:
    """Full reductions over every dim (keepdim), plus the program's own grouped / keepdim=False sums."""
    extra: set[tuple[int, bool, int | None]] = set()
    for n in nodes:
        if getattr(n, "op", None) is Op.SUM:
            a = n.attrs  # type: ignore[attr-defined]
            keep, group = bool(attr(a, "keepdim", True)), attr(a, "group")
            if not keep or group is not None:
                extra.add((int(attr(a, "dim")), keep, group))
    for dim in range(MAX_RANK):
        add(Op.SUM, {"dim": dim, "keepdim": True}, 1)  # type: ignore[operator]
    for dim, keep, group in sorted(extra, key=lambda e: (e[0], e[1], e[2] or 0)):
        attrs: dict[str, object] = {"dim": dim, "keepdim": keep}
        if group is not None:
            attrs["group"] = group
        add(Op.SUM, attrs, 1)  # type: ignore[operator]


def broadcast(a: Shape, b: Shape) -> Shape | None:
    """numpy broadcast of two shapes, or None."""
    if a == b:
        return a
    na, nb = len(a), len(b)
    n = max(na, nb)
    out = [0] * n
    for i in range(1, n + 1):
        x = a[-i] if i <= na else 1
        y = b[-i] if i <= nb else 1
        if x != y and x != 1 and y != 1:
            return None
        out[n - i] = x if x != 1 else y
    return tuple(out)


def out_shape(v: OpVariant, shapes: Sequence[Shape]) -> Shape | None:
    """Output shape of ``v`` on ``shapes``, or None when the op does not apply (same rules as ``opset``)."""
    op = v.op
    if op in UNARY_ELEMENTWISE:
        return shapes[0]
    if op in BINARY_ELEMENTWISE:
        return broadcast(shapes[0], shapes[1])
    if op is Op.MATMUL:
        a, b = shapes
        if len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
            return None
        batch = broadcast(a[:-2], b[:-2])
        return None if batch is None else batch + (a[-2], b[-1])
    if op is Op.SUM:
        return _sum_shape(v.attrs, shapes[0])
    if op is Op.MAX:
        s, dim = shapes[0], attr(v.attrs, "dim")
        if dim >= len(s) or s[dim] == 1:
            return None  # the max of one element is the identity
        return s[:dim] + ((1,) if attr(v.attrs, "keepdim") else ()) + s[dim + 1 :]
    if op is Op.TRANSPOSE:
        s, d0, d1 = shapes[0], attr(v.attrs, "dim0"), attr(v.attrs, "dim1")
        return None if max(d0, d1) >= len(s) or d0 == d1 else transposed(s, d0, d1)
    if op is Op.REPEAT:
        s = shapes[0]
        dim, times = attr(v.attrs, "dim"), attr(v.attrs, "times")
        return None if dim >= len(s) else s[:dim] + (s[dim] * times,) + s[dim + 1 :]
    if op is Op.RESHAPE:
        new = attr(v.attrs, "shape")
        return new if _numel(new) == _numel(shapes[0]) and new != shapes[0] else None
    if op is Op.CONCAT:
        a, b = shapes
        dim = attr(v.attrs, "dim")
        if dim >= len(a) or len(a) != len(b):
            return None
        if any(x != y for i, (x, y) in enumerate(zip(a, b, strict=True)) if i != dim):
            return None
        return a[:dim] + (a[dim] + b[dim],) + a[dim + 1 :]
    return None


def _sum_shape(attrs: Attrs, s: Shape) -> Shape | None:
    dim = attr(attrs, "dim")
    if dim >= len(s) or s[dim] == 1:
        return None  # summing a dim of one element is the identity
    group = attr(attrs, "group")
    if group is None or group == s[dim]:
        return s[:dim] + ((1,) if attr(attrs, "keepdim", True) else ()) + s[dim + 1 :]
    if s[dim] % group:
        return None
    return s[:dim] + (s[dim] // group,) + s[dim + 1 :]


def _numel(s: Shape) -> int:
    n = 1
    for d in s:
        n *= d
    return n


def shape_free_term(op: Op, terms: Sequence[Term]) -> Term | None:
    """The abstract expression of ``op`` on operands with ``terms`` when it does not depend on their shapes
    (elementwise operators and layout changes; Table 1 as in :class:`~.expr_arith.ExprArith`), else None."""
    if op in (Op.SCALE, Op.ADD_SCALAR, Op.RESHAPE, Op.REPEAT, Op.TRANSPOSE):
        return terms[0]
    if op in (Op.ADD, Op.SUB):
        return ae.add(terms[0], terms[1])
    if op is Op.MUL:
        return ae.mul(terms[0], terms[1])
    if op is Op.DIV:
        return ae.div(terms[0], terms[1])
    if op is Op.EXP:
        return ae.exp(terms[0])
    if op is Op.SQRT:
        return ae.sqrt(terms[0])
    if op in UNARY_FUNCTIONS or op is Op.CLAMP:  # a clamp's bounds are dropped (as ExprArith does)
        return ae.fn(op.value, terms[0])
    return None


__all__ = [
    "COMMUTATIVE",
    "KERNEL_ONLY",
    "MAX_RANK",
    "NOT_SEARCHED",
    "NONLINEAR_UNARY",
    "SELF_USELESS",
    "TYPE_ORDER",
    "OpVariant",
    "broadcast",
    "catalog",
    "default_types",
    "keeps_scaled",
    "program_op_signatures",
    "out_shape",
    "unsearched",
    "program_ops",
    "reads_scaled",
    "shape_free_term",
    "stable_softmax_only",
]

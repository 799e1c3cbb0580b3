"""The for-loop accumulators a block-level node's children add, in rank order: a sum, a maximum, or a
concatenation along a dim of a loop-body tensor (unless ``SearchSpec.loop_concats`` is off, a restriction of the
space), and the online-softmax accumulators (FlashAttention-2): the rescaled ``Σ exp(s − m)`` of a score tensor
``s`` and the rescaled ``exp(s − m)·v`` of a score and a value tensor.

An accumulator's inputs vary across iterations (they depend on an fmap'd iterator: summing a loop-invariant
tile only multiplies it by the trip count). A ``scale`` result (read only by a non-linear unary operator or a
maximum of a positive multiple, see docs/search.md and :func:`~gensorage.exhaustive.opcatalog.reads_scaled`)
feeds only an online-softmax accumulator, which exponentiates it, or a running maximum, whose result is again a
scale's result. Checks, in order: the occurrence
budget for an input read again; at a tight bound, a concatenation (``pruned_expr``); the subexpression oracle in
an exact block graph (``pruned_expr``); shared memory (``pruned_memory``); the index-tie classes of a sum
(``pruned_expr``). The expression of an online-softmax accumulator is the plain form's with the row's full
maximum (``ExprArith.online_softmax_times``), so a µGraph using one is kept exactly when the same µGraph with
the plain form would be; its index ties are left unknown (never pruned). The ``exp(s − max s)`` it takes is checked
as an ``exp`` operator's (:mod:`gensorage.exhaustive.rules.constants`, ``pruned_expr``): the factor ``s`` carries.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from gensorage.dtypes import dtype_bytes
from gensorage.errors import ProgramError
from gensorage.exhaustive.expr.expr_arith import EXPR, ExprValue, online_exponent
from gensorage.exhaustive.expr.ties import Ties, loop_concat, loop_sum
from gensorage.exhaustive.opcatalog import reads_scaled
from gensorage.exhaustive.rules.constants import Const, const_of
from gensorage.exhaustive.rules.rule import NOT_TIGHT
from gensorage.exhaustive.walk.bindings import admitted, apply_binding, iterator_bindings, undo_binding
from gensorage.exhaustive.walk.operators import operands_read_again
from gensorage.exhaustive.walk.provenance import Provenance, of_op
from gensorage.exhaustive.walk.rank import ACCUMULATOR_CODE, RankKey, follows, rank_key
from gensorage.exhaustive.walk.search_state import AccumRec, BlockBuild, free_after, numel, ops_left
from gensorage.exhaustive.walk.stable_subs import block_sub_result, pending_block_sub
from gensorage.opset import Op, Shape, freeze_attrs, infer_shape

if TYPE_CHECKING:
    from gensorage.exhaustive.walk.walk import Walk


def accumulators(s: Walk, b: BlockBuild, tight: int = NOT_TIGHT) -> Iterator[None]:
    """Every accumulator child, in rank order; ``tight``: a concatenation, which adds no class, is pruned (see
    :mod:`gensorage.exhaustive.rules.ties`)."""
    for rec in _candidates(s, b):
        if rec.fmap is not None and tight != NOT_TIGHT:  # a concatenation adds no class (see TIGHT_KNOWN)
            s.counters.pruned_expr += 1
            continue
        yield from _push(s, b, rec)


def _candidates(s: Walk, b: BlockBuild) -> Iterator[AccumRec]:
    """The accumulators of loop-body tensors that may follow the last operator, before any expression check."""
    last = b.keys[-1] if b.keys else None
    low = last[0][0] if (last is not None and s.spec.canonical) else 0
    reads_ok = s.reads_checker()
    stable = s.spec.sub_stabilises_only
    pending_sub = pending_block_sub(b) if stable else None

    def open_to(rec: AccumRec) -> bool:
        ins = rec.inputs
        if stable and any(block_sub_result(b, i) for i in ins):
            return False  # only an exp reads a sub result (sub_stabilises_only)
        if pending_sub is not None and s.spec.canonical and max(ins) >= pending_sub:
            return False  # the pending sub result's exp could no longer follow it
        if s.spec.canonical and not follows(last, _key(rec)):
            return False
        return b.viable(free_after(b, ins), 0, ops_left(s.spec, b, 1)) and reads_ok(
            operands_read_again(s, b, ins)
        )

    body = [j for j in range(len(b.shape)) if b.shape[j] is not None and not b.post[j] and b.fdep[j]]
    for j in (j for j in body if j >= low):
        shape = b.shape[j]
        assert shape is not None
        kinds = [AccumRec(j, None, "softmax_sum")] if len(shape) >= 2 else []
        if not b.scaled[j]:
            kinds = [AccumRec(j, None), AccumRec(j, None, "max"), *kinds]
            if s.spec.loop_concats:  # a restriction of the space when off (docs/search.md)
                kinds += [AccumRec(j, d) for d in range(len(shape))]
        elif reads_scaled(Op.MAX, [b.const[j]]):
            kinds = [AccumRec(j, None, "max"), *kinds]
        yield from (rec for rec in kinds if open_to(rec))
    unbound = [i for i in range(len(b.inputs)) if b.shape[i] is None]
    for j in body:  # two inputs: their rank keys sort after every one-input key of the same larger input
        for v in sorted(body + unbound):
            if v == j or b.scaled[v] or max(j, v) < low:
                continue
            for _ in _bound(s, b, v):  # values only the accumulator reads (FlashAttention's V) bind here
                rec = AccumRec(j, None, "softmax_matmul", v)
                if _matmul_shape(b.shape[j], b.shape[v]) is not None and open_to(rec):
                    yield rec


def _bound(s: Walk, b: BlockBuild, i: int) -> Iterator[None]:
    """Yield once with tensor ``i`` bound: as it is, or (an unbound iterator) once per admitted binding that fits
    shared memory."""
    if b.shape[i] is not None:
        yield
        return
    bindings = iterator_bindings(s, b, i)
    elem = dtype_bytes(b.dtype[i])
    for bd, ok in zip(bindings, admitted(s, b, i, bindings), strict=True):
        if b.smem + numel(bd.tile) * elem > s.context.hw.shared_mem_per_block:
            s.counters.pruned_memory += 1
        elif ok:
            apply_binding(s, b, i, bd)
            try:
                yield
            finally:
                undo_binding(b, i, bd)


def _key(rec: AccumRec) -> RankKey:
    return rank_key(rec.inputs, ACCUMULATOR_CODE, (rec.code,))


def _matmul_shape(a: Shape | None, b: Shape | None) -> Shape | None:
    if a is None or b is None or len(a) < 2 or len(b) < 2:
        return None
    try:
        return infer_shape(Op.MATMUL, [a, b], ())
    except ProgramError:
        return None


def _push(s: Walk, b: BlockBuild, rec: AccumRec) -> Iterator[None]:
    """Push ``rec`` after its checks, yield once, pop."""
    forloop = b.forloop
    assert forloop is not None
    j = rec.input
    x, shape = b.val[j], b.shape[j]
    assert x is not None and shape is not None
    value, out, prov = _value(b, rec, x, shape, forloop)
    if s.spec.prune and b.exact and not s.context.oracle.is_subexpr(value.term):
        s.counters.pruned_expr += 1
        return
    constants = s.context.rules.constants
    if (
        s.spec.prune
        and b.exact
        and rec.kind in ("softmax_sum", "softmax_matmul")
        and constants is not None
        and not constants.admits(online_exponent(x.term, forloop * shape[-1]), b.const[j])
    ):  # its exp(s − max s) is an exp operator's expression (rules.constants)
        s.counters.pruned_expr += 1
        return
    if b.smem + numel(out) * dtype_bytes(b.dtype[j]) > s.context.hw.shared_mem_per_block:
        s.counters.pruned_memory += 1
        return
    ties: Ties | None = None
    xt, tie_rule = b.ties[j], s.context.rules.ties
    if xt is not None and tie_rule is not None and (rec.kind == "sum" or rec.fmap is not None):
        ties = loop_sum(xt) if rec.fmap is None else loop_concat(xt, forloop, rec.fmap)
        if rec.fmap is None and not tie_rule.admits(ties):
            s.counters.pruned_expr += 1
            return
    elif (
        tie_rule is not None
    ):  # unknown (never pruned), for a maximum and the online-softmax kinds: an operator
        ties = Ties(out, tuple(() for _ in out), known=False)  # reading it or a saver computes ties from it
    scaled = rec.kind == "max" and b.scaled[j]  # a running maximum of a scale's result is one (see opcatalog)
    s.state.push_block(rec, _key(rec), out, value, True, False, prov, _const(b, rec), scaled, ties)
    try:
        yield
    finally:
        s.state.pop_block()


def _const(b: BlockBuild, rec: AccumRec) -> Const:
    """The factor the result carries: an exp's is 1 (no factor passes through it), so an online ``Σ exp`` has
    none and an online ``exp·v`` has the values'."""
    if rec.kind == "softmax_sum":
        return 1.0
    if rec.values is not None:
        return const_of(Op.MATMUL, (), [1.0, b.const[rec.values]])
    return b.const[rec.input]


def _value(
    b: BlockBuild, rec: AccumRec, x: ExprValue, shape: Shape, forloop: int
) -> tuple[ExprValue, Shape, Provenance]:
    """The accumulator's expression after the loop, its tile shape and its provenance."""
    if rec.kind in ("softmax_sum", "softmax_matmul"):
        v = None if rec.values is None else b.val[rec.values]
        value = EXPR.online_softmax_times(x, v, forloop, rec.kind)  # type: ignore[arg-type]
        if v is None:
            attrs = freeze_attrs({"dim": len(shape) - 1, "keepdim": True})
            return value, value.shape, of_op(Op.SUM, attrs, [b.prov[rec.input]], [shape])
        vshape = b.shape[rec.values]  # type: ignore[index]
        provs = [b.prov[rec.input], b.prov[rec.values]]  # type: ignore[index]
        return value, value.shape, of_op(Op.MATMUL, (), provs, [shape, vshape])  # type: ignore[list-item]
    if rec.fmap is None:
        return EXPR.accumulate_times(x, forloop, rec.kind), shape, b.prov[rec.input]  # type: ignore[arg-type]
    d = rec.fmap
    out = shape[:d] + (shape[d] * forloop,) + shape[d + 1 :]
    return EXPR.concat([x] * forloop, d), out, None


__all__ = ["accumulators"]

"""The stable-softmax form of ``sub`` (``SearchSpec(sub_stabilises_only=True)``, a restriction of the space).

With the restriction a ``sub`` is admitted only as a stable softmax's ``x − max(x)``: its subtrahend's expression
is a maximum of its minuend's (``max_r(k, E)`` with minuend ``E``, or with minuend a smaller maximum
``max_r(j, E)`` of the same ``E``: FlashDecoding's combine subtracts the maximum over the splits from each
split's maximum), and only an ``exp`` reads its result (no saver, accumulator, other ``sub``, or later kernel), or a positive
``scale`` that only an ``exp`` reads (``exp(c·(x − max x))``: a constant factor's canonical place is just
before the next non-linear operator, so a softmax of scaled scores takes this form).
It is no pruning rule: it drops correct µGraphs (``S − m − m′`` chains, a saved difference, ``max(x) − x``);
docs/search.md ("Restrictions of the space") says which and why the presets that set it do.
"""

from __future__ import annotations

from gensorage.exhaustive.expr.abstract_expr import Term
from gensorage.exhaustive.opcatalog import OpVariant
from gensorage.exhaustive.walk.search_state import BlockBuild, BlockOpRec, SearchState
from gensorage.opset import Op, attr
from gensorage.ugraph.ir import KernelOp


def stabilises(minuend: Term, subtrahend: Term) -> bool:
    """Whether ``minuend − subtrahend`` subtracts a maximum of the minuend's expression (abstract expressions
    drop constants, so a maximum of the scaled scores stabilises the scaled scores too)."""
    if subtrahend.op != "max":
        return False
    row = subtrahend.args[0]
    return minuend is row or (minuend.op == "max" and minuend.args[0] is row and minuend.k < subtrahend.k)


def positive_scale(v: OpVariant) -> bool:
    """Whether ``v`` is a ``scale`` by a positive factor (the one operator that may stand between a stable
    softmax's ``sub`` and its ``exp``: a constant moves to just before the next non-linear operator)."""
    return v.op is Op.SCALE and float(attr(v.attrs, "factor", 0.0)) > 0


def _block_op(b: BlockBuild, i: int) -> BlockOpRec | None:
    j = i - len(b.inputs)
    rec = b.recs[j] if j >= 0 else None
    return rec if isinstance(rec, BlockOpRec) else None


def block_sub_only(b: BlockBuild, i: int) -> bool:
    """Whether block tensor ``i`` is the result of a block-level ``sub`` itself."""
    rec = _block_op(b, i)
    return rec is not None and rec.variant.op is Op.SUB


def block_sub_result(b: BlockBuild, i: int) -> bool:
    """Whether block tensor ``i`` is a difference to exponentiate: the result of a block-level ``sub``, or of a
    positive ``scale`` of one (only an ``exp`` may read it)."""
    rec = _block_op(b, i)
    if rec is None:
        return False
    return rec.variant.op is Op.SUB or (positive_scale(rec.variant) and block_sub_only(b, rec.inputs[0]))


def _kernel_op(st: SearchState, t: int) -> KernelOp | None:
    if t < st.n_inputs:
        return None
    op = st.ops[st.ref[t].node - st.n_inputs]
    return op if isinstance(op, KernelOp) else None


def kernel_sub_only(st: SearchState, t: int) -> bool:
    """Whether kernel tensor ``t`` is the result of a pre-defined ``sub`` itself."""
    op = _kernel_op(st, t)
    return op is not None and op.op is Op.SUB


def kernel_sub_result(st: SearchState, t: int) -> bool:
    """Whether kernel tensor ``t`` is a difference to exponentiate: the result of a pre-defined ``sub``, or of a
    pre-defined positive ``scale`` of one."""
    op = _kernel_op(st, t)
    if op is None:
        return False
    if op.op is Op.SUB:
        return True
    if op.op is not Op.SCALE or float(attr(op.attrs, "factor", 0.0)) <= 0:
        return False
    return kernel_sub_only(st, st.ref.index(op.inputs[0]))


def pending_block_sub(b: BlockBuild) -> int | None:
    """The lowest unconsumed block difference (:func:`block_sub_result`), if any: only a unary operator (an
    ``exp``, or a positive ``scale`` then an ``exp``) may read it, and in canonical order no operator whose
    largest operand is later can be followed by that one."""
    for i in range(len(b.inputs), len(b.shape)):
        if b.uses[i] == 0 and block_sub_result(b, i):
            return i
    return None


__all__ = [
    "block_sub_only",
    "block_sub_result",
    "kernel_sub_only",
    "kernel_sub_result",
    "pending_block_sub",
    "positive_scale",
    "stabilises",
]

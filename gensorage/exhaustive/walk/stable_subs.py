"""The stable-softmax form of ``sub`` (``SearchSpec(sub_stabilises_only=True)``, a restriction of the space).

With the restriction a ``sub`` is admitted only as a stable softmax's ``x − max(x)``: its subtrahend's expression
is a maximum of its minuend's (``max_r(k, E)`` with minuend ``E``, or with minuend a smaller maximum
``max_r(j, E)`` of the same ``E``: FlashDecoding's combine subtracts the maximum over the splits from each
split's maximum), and only an ``exp`` reads its result (no saver, accumulator, other ``sub``, or later kernel).
It is no pruning rule: it drops correct µGraphs (``S − m − m′`` chains, a saved difference, ``max(x) − x``);
docs/search.md ("Restrictions of the space") says which and why the presets that set it do.
"""

from __future__ import annotations

from gensorage.exhaustive.expr.abstract_expr import Term
from gensorage.exhaustive.walk.search_state import BlockBuild, BlockOpRec, SearchState
from gensorage.opset import Op
from gensorage.ugraph.ir import KernelOp


def stabilises(minuend: Term, subtrahend: Term) -> bool:
    """Whether ``minuend − subtrahend`` subtracts a maximum of the minuend's expression (abstract expressions
    drop constants, so a maximum of the scaled scores stabilises the scaled scores too)."""
    if subtrahend.op != "max":
        return False
    row = subtrahend.args[0]
    return minuend is row or (minuend.op == "max" and minuend.args[0] is row and minuend.k < subtrahend.k)


def block_sub_result(b: BlockBuild, i: int) -> bool:
    """Whether block tensor ``i`` is the result of a block-level ``sub``."""
    j = i - len(b.inputs)
    if j < 0:
        return False
    rec = b.recs[j]
    return isinstance(rec, BlockOpRec) and rec.variant.op is Op.SUB


def kernel_sub_result(st: SearchState, t: int) -> bool:
    """Whether kernel tensor ``t`` is the result of a pre-defined ``sub``."""
    if t < st.n_inputs:
        return False
    op = st.ops[st.ref[t].node - st.n_inputs]
    return isinstance(op, KernelOp) and op.op is Op.SUB


def pending_block_sub(b: BlockBuild) -> int | None:
    """The lowest unconsumed block ``sub`` result, if any: only an ``exp`` of it may read it, and in canonical
    order no operator whose largest operand is later can be followed by that ``exp``."""
    for i in range(len(b.inputs), len(b.shape)):
        if b.uses[i] == 0 and block_sub_result(b, i):
            return i
    return None


__all__ = ["block_sub_result", "kernel_sub_result", "pending_block_sub", "stabilises"]

"""Values each row of which is a convex combination of a tensor's rows: attention's ``(E·V) / Σ E``, ``E ≥ 0``;
and values each element of which lies between 0 and a tensor's: ``x / (e + c)``, ``e ≥ 0``, ``c ≥ 1``.

Under the ``"float32"`` policy a division is stored in float32 (autocast's list, :mod:`gensorage.precision`).
Where the division is ``(E·V) / Σ E`` with the sum over ``E``'s last dim (the matmul's reduction) and ``E``
non-negative (an ``exp``; or the online softmax's accumulators ``o`` and ``l`` of the same scores), each row of
the result is a convex combination of ``V``'s rows, so each element lies between ``V``'s least and greatest in its
column: the dtype ``V`` is stored in holds it, and a float16 one cannot overflow there. Storing it so rounds it
once, as eager attention stores its output in the program's dtype, and the matmul that reads it next (the
o-projection) keeps 16-bit operands instead of multiplying a float32 operand in bfloat16
(:func:`gensorage.codegen.tensor_core.mma_dtype`), which keeps 8 significant bits of the weight where float16
keeps 11.

The numerator ``E·V`` is no such combination: it sums up to one term per key, each ``E`` up to 1, so it can be as
large as the key count times ``V``'s largest (a float16 ``V`` of 20 over 4,096 keys of equal score: 81,920). It is
stored as a sum is, in float32 (:func:`weighted_sum`), where the float32 policy would otherwise store the matmul
of a float16 ``E`` (a stable softmax's, in (0, 1]) by a float16 ``V`` in float16.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gensorage import opset
from gensorage.opset import Op
from gensorage.precision import Producer
from gensorage.ugraph.ir import Accumulator, BlockOp, KernelOp, Ref

#: The node a reference's value comes from (None: an input, an iterator), and the rank of a reference's value.
NodeOf = Callable[[Ref], object]
RankOf = Callable[[Ref], int]


def convex_values(op: Op, refs: tuple[Ref, ...], node_of: NodeOf, rank_of: RankOf) -> Ref | None:
    """``V`` when ``op`` on ``refs`` is ``(E·V) / Σ E`` with ``E ≥ 0`` (see the module doc), else None."""
    if op is not Op.DIV or len(refs) != 2:
        return None
    num, den = node_of(refs[0]), node_of(refs[1])
    if isinstance(num, Accumulator) and isinstance(den, Accumulator):
        online = num.kind == "softmax_matmul" and den.kind == "softmax_sum"
        return num.values if online and num.input == den.input and num.fmap is den.fmap is None else None
    if not (isinstance(num, BlockOp | KernelOp) and isinstance(den, BlockOp | KernelOp)):
        return None
    if num.op is not Op.MATMUL or opset.epilogue(num.attrs) or den.op is not Op.SUM or len(num.inputs) != 2:
        return None
    e, v = num.inputs
    source = node_of(e)
    if den.inputs != (e,) or not isinstance(source, BlockOp | KernelOp) or source.op is not Op.EXP:
        return None
    dim, last = opset.attr(den.attrs, "dim"), rank_of(e) - 1
    keep, group = opset.attr(den.attrs, "keepdim", True), opset.attr(den.attrs, "group")
    return v if dim in (last, -1) and keep and group is None else None


def damped_values(op: Op, refs: Sequence[Any], producer: Producer) -> Any | None:
    """``x`` when ``op`` on ``refs`` is ``x / (e + c)`` with ``e`` an ``exp``'s result and ``c ≥ 1`` (GELU's tanh
    form as the torch front end writes it, ``x · sigmoid(2u)``): the divisor is at least 1, so each element lies
    between 0 and ``x``'s, and the dtype ``x`` is stored in holds it. Else None. ``producer`` as
    :func:`gensorage.precision.value_range` takes it (any level's references)."""
    den = producer(refs[1]) if op is Op.DIV and len(refs) == 2 else None
    if den is None or den[0] is not Op.ADD_SCALAR or not float(opset.attr(den[2], "value")) >= 1.0:
        return None
    source = producer(den[1][0])
    return refs[0] if source is not None and source[0] is Op.EXP else None


def weighted_sum(op: Op, refs: tuple[Ref, ...], node_of: NodeOf) -> bool:
    """Whether ``op`` on ``refs`` is ``E·V`` with ``E`` an ``exp``'s result: an unnormalised sum of ``V``'s rows."""
    source = node_of(refs[0]) if op is Op.MATMUL and refs else None
    return isinstance(source, BlockOp | KernelOp) and source.op is Op.EXP


__all__ = ["convex_values", "damped_values", "weighted_sum"]

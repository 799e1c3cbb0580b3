"""Where an ``add_scalar`` may be applied: to the class of an argument the program adds its constant to, up to sums.

Abstract expressions drop ``add_scalar`` (``x + v`` is ``E(x)``), so a search places an RMSNorm's epsilon on any
tensor: on ``X`` or ``W`` before the kernel that reads them, on ``x²``, on the matmul's result. All of those are
subexpressions of the program's output and equal it under ``A_eq``; verification rejects them one by one.

The *shift-aware* abstraction keeps ``add_v`` as a function with the laws of real arithmetic that move it: through
layout operators and tiles (``E`` keeps them), through a sum of ``k`` terms as ``add_{k·v}`` (a reduction, a
summing accumulator, a split reduction's partial sums) and through a scale by ``c`` as ``add_{c·v}``. No other law
moves it: ``(x + v)·y``, ``(x + v)/y``, ``sqrt(x + v)`` and a matmul's ``Σ (x + v)·y`` are no ``add`` of the
operation applied to ``x`` (``v·y`` is no constant), and without ``add``, ``sub``, ``concat`` and ``max`` nothing
else can reach it. Erasing ``add_v`` maps every law to an ``A_eq`` law or to ``x = x``, so terms equal in it are
equal under ``A_eq``.

Pushing each ``add_v`` outwards through the sums and scales around it, every ``add`` of a term applies to the
argument's class extended by those sums, and (no law mentions ``add`` otherwise) the set of those argument classes
is an invariant of the term's class. In the canonical model a sum of ``k`` terms multiplies every numerator
coefficient by ``k`` and a scale is dropped, so an argument's class extended by sums is the class itself with its
numerator coefficients multiplied: an argument is placed right exactly when its normal form is proportional to
that of an argument the program adds a constant to (:func:`core`). The walk prunes an ``add_scalar`` of any
other tensor (``pruned_expr``); this is exact for the shift-aware classes, as :mod:`.constants` is for the
constant-aware ones. Applied with ``prune`` and ``expr_filter`` where neither the program nor the op set has
``add``, ``sub``, ``concat``, ``max``, ``exp``, ``silu`` or ``gelu``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from gensorage.exhaustive.expr.abstract_expr import Term, var
from gensorage.exhaustive.expr.canon import Canon, Elem, TooBig
from gensorage.exhaustive.expr.expr_arith import EXPR, ExprValue
from gensorage.exhaustive.opcatalog import program_ops
from gensorage.exhaustive.rules.homogeneity import HOMOGENEOUS_OPS
from gensorage.opset import Op, apply
from gensorage.program import Program

#: The operators under which the laws above are all the laws that move an ``add_scalar``.
SHIFT_OPS = HOMOGENEOUS_OPS - {Op.MAX}

Core = frozenset[tuple[Elem | None, frozenset[tuple[tuple[int, tuple[int, ...]], int]]]]


def core(e: Elem) -> Core:
    """``e``'s normal form with its numerator coefficients divided by their common divisor: equal for two
    normal forms exactly when one is the other with every numerator coefficient multiplied by one factor."""
    g = 0
    for _, poly in e.parts:
        for (c, _), _ in poly:
            g = math.gcd(g, c)
    g = g or 1
    return frozenset(
        (den, frozenset(((c // g, tuple(a.uid for a in atoms)), mult) for (c, atoms), mult in poly))
        for den, poly in e.parts
    )


class ShiftPlaces:
    """The cores of the program's ``add_scalar`` arguments, and the check of an ``add_scalar`` against them."""

    def __init__(self, canon: Canon, cores: frozenset[Core]) -> None:
        self.canon = canon
        self.cores = cores
        self._memo: dict[Term, bool] = {}

    @staticmethod
    def for_search(program: Program, canon: Canon, ops: Iterable[Op]) -> ShiftPlaces | None:
        """The rule for a search of ``program`` over operators ``ops``, or None where it does not apply (see the
        module docstring; also where an argument's normal form is too big to name)."""
        if not frozenset(ops) | program_ops(program) <= SHIFT_OPS:
            return None
        values: dict[int, ExprValue] = {}
        cores: set[Core] = set()
        for i in program.live_ids():
            n = program.nodes[i]
            if n.op is None:
                values[i] = ExprValue(n.shape, var(n.name))
                continue
            values[i] = apply(n.op, EXPR, [values[j] for j in n.inputs], n.attrs)
            if n.op is Op.ADD_SCALAR:
                try:
                    cores.add(core(canon.nf(values[n.inputs[0]].term)))
                except TooBig:
                    return None
        return ShiftPlaces(canon, frozenset(cores)) if cores else None

    def admits(self, term: Term) -> bool:
        """Whether an ``add_scalar`` whose expression (its argument's) is ``term`` is placed right."""
        got = self._memo.get(term)
        if got is None:
            try:
                got = core(self.canon.nf(term)) in self.cores
            except TooBig:
                got = True
            self._memo[term] = got
        return got


__all__ = ["SHIFT_OPS", "ShiftPlaces", "core"]

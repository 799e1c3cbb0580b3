"""Constant factors through linear operators, and the factor an ``exp``'s argument must carry.

Abstract expressions drop ``scale`` (see :mod:`gensorage.exhaustive.expr.abstract_expr`), so ``exp(Q Kᵀ)`` and ``exp(Q Kᵀ / √d)`` are
one class, and a two-kernel search spends most of its time completing first kernels that exponentiate the
unscaled product: numerically wrong, rejected only when verified.

The constant-aware abstraction ``E_c`` keeps each ``scale`` as a factor, with the laws of real arithmetic that
move a constant through linear operators: ``sum(i, c·x) = c·sum(i, x)``, ``mul(c·x, y) = c·mul(x, y)``,
``div(c·x, y) = c·div(x, y)``, ``div(x, c·y) = (1/c)·div(x, y)``, ``add(c·x, c·y) = c·add(x, y)`` (and ``cat``,
``max`` for ``c > 0``), ``c·(d·x) = (cd)·x``, ``1·x = x``, ``sqrt(c·x) = √c·sqrt(x)`` and ``relu(c·x) = c·relu(x)``
for ``c > 0``. No law moves a constant through ``exp``, ``silu`` or ``gelu`` (``exp(c·x)`` is no constant
multiple of ``exp(x)``). Erasing the factors maps every law to an ``A_eq`` law or to ``x = x``, so two terms
equal under ``A_eq`` with these laws are equal under ``A_eq``.

Pushing factors outwards, the argument of each ``exp`` / ``silu`` / ``gelu`` carries one factor (or, below an
``add`` of differently scaled terms, none can be pulled out: *mixed*). As with :mod:`.needed_ops`, no law
mentions these functions, so the set of (class, factor) pairs of a term's ``exp``-rooted subterms is an
invariant of its class. A complete µGraph's output contains each of its operators' expressions, so in a µGraph
whose output equals the program's under the constant-aware laws, every ``exp`` whose (erased) class the program
has carries a factor one of the program's ``exp`` of that class carries. The search applies exactly that: an
``exp`` (``silu``, ``gelu``) operator whose argument's factor is none of the program's for its class is pruned,
which is exact for the µGraphs the expression filter keeps once it speaks about the constant-aware classes.

The stabiliser laws move a maximum summand of an ``exp``'s argument out as a ``stab`` atom; with factors they
keep the argument's (``exp(c·(x + max(k, y))) = exp(c·x)·stab_c(y)``), so the pairs (atom, factor) are an invariant
too, and an ``exp`` whose ``stab(y)`` the program's ``exp`` give only other factors is pruned as well: a rescale
``exp(m_i − M)`` of the unscaled scores' maxima where the program stabilises the scaled ones (``STAB_FACTORS``;
docs/search.md, "Factors of stabilisers").

Factors are tracked per tensor by :func:`const_of` (``1.0``: none; ``None``: mixed, never pruned). The
canonical placement of ``scale`` (its result is read only by a non-linear unary operator, by a maximum when the
factor is positive, or saved: :func:`~gensorage.exhaustive.opcatalog.reads_scaled`) decides where a factor is
applied; this module decides whether its value is right where it arrives.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import assert_never

from gensorage.exhaustive.expr.abstract_expr import Term, var
from gensorage.exhaustive.expr.canon import Canon, Elem, TooBig, stabs_of
from gensorage.exhaustive.expr.expr_arith import EXPR, ExprValue
from gensorage.opset import Attrs, Op, apply, attr
from gensorage.program import Program

Const = float | None  # the factor a tensor carries: 1.0 none, None mixed (unknown)
#: Whether a ``stab`` atom carries the factor of the ``exp`` that made it ("Factors of stabilisers" in
#: docs/search.md); a switch for the law test.
STAB_FACTORS = True
#: Functions no constant moves through: the rule applies to their arguments.
BARRIERS = frozenset({Op.EXP, Op.SILU, Op.GELU, Op.TANH, Op.LOG, Op.CLAMP})


def same(a: float, b: float) -> bool:
    """Equal factors (products of the program's constants, computed in different orders)."""
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)


def const_of(op: Op, attrs: Attrs, ins: Sequence[Const]) -> Const:
    """The factor of ``op``'s result given its operands' factors (see the module docstring)."""
    match op:
        case Op.EXP | Op.SILU | Op.GELU | Op.TANH | Op.LOG | Op.CLAMP:
            return 1.0
        case Op.SCALE:
            c = ins[0]
            return None if c is None else c * float(attr(attrs, "factor"))
        case Op.SQRT:
            c = ins[0]
            return math.sqrt(c) if c is not None and c > 0 else None
        case Op.RELU:
            c = ins[0]
            return c if c is not None and c > 0 else None
        case Op.MUL | Op.MATMUL:
            a, b = ins
            return None if a is None or b is None else a * b
        case Op.DIV:
            a, b = ins
            return None if a is None or b is None else a / b
        case Op.ADD | Op.SUB | Op.CONCAT:
            first = ins[0]
            if first is None or any(c is None or not same(c, first) for c in ins[1:]):
                return None
            return first
        case Op.ADD_SCALAR:  # c·x + v: no factor comes out (v/c is no constant of the program)
            c = ins[0]
            return 1.0 if c is not None and same(c, 1.0) else None
        case Op.MAX:  # max(c·x) = c·max(x) for c > 0 only
            c = ins[0]
            return c if c is not None and c > 0 else None
        case Op.SUM | Op.RESHAPE | Op.REPEAT | Op.TRANSPOSE | Op.SLICE:
            return ins[0]
        case _:
            assert_never(op)


def carries_factor(consts: Sequence[Const]) -> bool:
    """Whether some tensor carries a constant factor (or one that is not known): see
    :mod:`gensorage.exhaustive.rules.needed_ops`."""
    return any(c is None or not same(c, 1.0) for c in consts)


class ExpConstants:
    """The factors the program's ``exp`` / ``silu`` / ``gelu`` arguments carry, by the class of the function's
    term (erased normal form), and the check of an operator against them."""

    def __init__(self, program: Program, canon: Canon) -> None:
        self.canon = canon
        allowed: dict[Elem, set[float] | None] = {}
        stabs: dict[int, set[float] | None] = {}
        values: dict[int, ExprValue] = {}
        consts: dict[int, Const] = {}
        nodes = program.nodes
        for i in program.live_ids():
            n = nodes[i]
            if n.op is None:
                values[i], consts[i] = ExprValue(n.shape, var(n.name)), 1.0
                continue
            ins = [consts[j] for j in n.inputs]
            values[i] = apply(n.op, EXPR, [values[j] for j in n.inputs], n.attrs)
            consts[i] = const_of(n.op, n.attrs, ins)
            if n.op in BARRIERS:
                try:
                    cls = canon.nf(values[i].term)
                except TooBig:
                    continue  # a class the oracle cannot name is not restricted
                got = allowed.setdefault(cls, set())
                if got is not None:
                    allowed[cls] = None if ins[0] is None else got | {ins[0]}
                for st in _stabs(cls):
                    had = stabs.setdefault(st, set())
                    if had is not None:
                        stabs[st] = None if ins[0] is None else had | {ins[0]}
        self.allowed: dict[Elem, frozenset[float] | None] = {
            k: (None if v is None else frozenset(v)) for k, v in allowed.items()
        }
        #: The factors the program's ``exp`` give each ``stab`` atom (by the atom's uid): the factor of the
        #: ``exp``'s argument, whose maxima the atom stands for.
        self.stab_factors: dict[int, frozenset[float] | None] = {
            k: (None if v is None else frozenset(v)) for k, v in stabs.items()
        }
        #: Classes whose argument must carry a factor other than 1 (a scale is needed to make them).
        self.factor_marks: frozenset[Elem] = frozenset(
            k for k, v in self.allowed.items() if v is not None and not any(same(c, 1.0) for c in v)
        )

    def admits(self, term: Term, arg: Const) -> bool:
        """Whether an ``exp`` / ``silu`` / ``gelu`` operator with expression ``term`` may read an argument of
        factor ``arg``."""
        if arg is None:
            return True
        try:
            cls = self.canon.nf(term)
        except TooBig:
            return True
        allowed = self.allowed.get(cls)
        if allowed is not None and not any(same(arg, c) for c in allowed):
            return False
        # Each stab atom (all a rescale exp(m_i − M) is, a class the program has no exp of) must carry a factor
        # the program's exp give that atom.
        for st in _stabs(cls) if STAB_FACTORS else ():
            got = self.stab_factors.get(st)
            if got is not None and not any(same(arg, c) for c in got):
                return False
        return True


def _stabs(cls: Elem) -> tuple[int, ...]:
    """The uids of the ``stab`` atoms an ``exp``'s normal form multiplies its ``exp`` atom by (none where the
    normal form is no single monomial: a function other than ``exp``)."""
    if len(cls.parts) != 1 or cls.parts[0][0] is not None or len(cls.parts[0][1]) != 1:
        return ()
    (((_, atoms), _),) = cls.parts[0][1]
    return tuple(a.uid for a in stabs_of(atoms))


__all__ = ["BARRIERS", "STAB_FACTORS", "Const", "ExpConstants", "carries_factor", "const_of", "same"]

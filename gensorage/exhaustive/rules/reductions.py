"""Whether the last kernel operator still needs a reduction: coefficients no other operator can make.

In the oracle's canonical model a reduction of size ``k`` is a coefficient: ``sum(8, mul(Q, K))`` is ``8·Q·K``,
and attention's output is ``(16·V·exp(8·Q·K)) / (16·exp(8·Q·K))``. The normal form keeps every numerator's
coefficient and nests each denominator as a normal form of its own; it never cancels or adds coefficients:
adding (``add``, and ``sub``, which the abstraction reads as ``add``) puts the operands' monomials side by side
(a monomial twice has multiplicity 2, which is no coefficient 2: nothing in ``A_eq`` equates ``x + x`` with
``sum(2, x)``). So, over an op set without ``concat``:

* ``mul`` multiplies its operands' coefficients, ``div`` keeps the numerator's and makes the divisor (with its
  coefficients) part of the denominator, ``add`` and ``sub`` keep both operands' monomials, layout operators,
  ``scale``, iterator tiles, grid concatenation and concatenating accumulators keep them, and ``exp``, ``sqrt``,
  activations and ``max`` start a new atom whose coefficient outside is 1 (what is inside an atom never comes
  out: no axiom mentions these functions, and the stabiliser law moves a summand ``max(k, y)`` of an ``exp``'s
  argument into the atom ``stab(y)``, again with coefficient 1 outside);
* only a ``sum``, a ``matmul`` or a summing accumulator makes a coefficient that is not a product of
  coefficients already there.

The *top coefficients* of a normal form are its numerators' coefficients and, recursively, its denominators'.
If some top coefficient of the program's output is not a product of top coefficients of the tensors the last
kernel operator can read, its block graph needs at least one more reduction: an operator, or a node (an
accumulator) where the loop can supply it. Like :mod:`.needed_ops`, this speaks about outputs equal to the
program's under ``A_eq`` (``prune`` and ``expr_filter``) and is not applied inside block graphs with
concatenated inputs. The same argument covers ``add``; the rule stays off where the op set has one (searches
with ``add`` were not re-measured), as it does with ``concat`` (a ``cat`` atom's pieces come out of it).
"""

from __future__ import annotations

from collections.abc import Iterable

from gensorage.exhaustive.expr.abstract_expr import Term
from gensorage.exhaustive.expr.canon import Canon, Elem, TooBig
from gensorage.exhaustive.opcatalog import OpVariant
from gensorage.exhaustive.rules.rule import PRUNE, Bound, Prune, Site
from gensorage.opset import Op

#: Operators where the rule is off (see the module docstring).
ADDING_OPS = frozenset({Op.ADD, Op.CONCAT})


def top_coefficients(e: Elem, sums: bool = False) -> frozenset[int] | None:
    """The numerators' coefficients of ``e`` and, recursively, of its denominators; None unless every
    coefficient is an integer and, without ``sums``, every numerator one monomial of multiplicity one (the
    program's outputs; a tensor the last kernel reads may be a sum, each of whose coefficients it offers)."""
    out: set[int] = set()
    for den, poly in e.parts:
        if not sums and (len(poly) != 1 or poly[0][1] != 1):
            return None
        for (c, _), _mult in poly:
            if not isinstance(c, int):
                return None
            out.add(c)
        if den is not None:
            inner = top_coefficients(den, sums)
            if inner is None:
                return None
            out |= inner
    return frozenset(out)


def generated(c: int, by: frozenset[int]) -> bool:
    """Whether ``c`` is a product of elements of ``by`` (each usable any number of times; 1 is the empty
    product)."""
    if c == 1:
        return True
    return any(s > 1 and c % s == 0 and generated(c // s, by) for s in by)


class Reductions:
    """The program outputs' top coefficients, and the test for a set of available terms."""

    def __init__(self, canon: Canon, required: frozenset[int]) -> None:
        self.canon = canon
        self.required = required
        self._memo: dict[Term, frozenset[int] | None] = {}

    @classmethod
    def for_search(
        cls, canon: Canon, targets: Iterable[Term], variants: Iterable[OpVariant]
    ) -> Reductions | None:
        """The rule for a search over ``variants``, or None where it does not apply (adding operators, outputs
        whose numerators are not single monomials, or nothing to make)."""
        if any(v.op in ADDING_OPS for v in variants):
            return None
        required: set[int] = set()
        for t in targets:
            try:
                got = top_coefficients(canon.nf(t))
            except TooBig:
                return None
            if got is None:
                return None
            required |= got
        required.discard(1)
        return cls(canon, frozenset(required)) if required else None

    def coefficients(self, t: Term) -> frozenset[int] | None:
        """:func:`top_coefficients` of ``t``'s normal form, sums included (memoized; None where the rule cannot
        say)."""
        if t in self._memo:
            return self._memo[t]
        try:
            got = top_coefficients(self.canon.nf(t), sums=True)
        except TooBig:
            got = None
        self._memo[t] = got
        return got

    def needed(self, available: Iterable[Term]) -> bool:
        """Whether a reduction is needed to reach the outputs from the ``available`` terms."""
        have: set[int] = set()
        for t in available:
            got = self.coefficients(t)
            if got is None:
                return False
            have |= got
        by = frozenset(have)
        return not all(generated(c, by) for c in self.required)

    def check(self, site: Site, bound: Bound) -> Prune | None:
        """The node rule, at the last kernel operator: when the operators still needed leave no room for one more
        reduction, the site's tensors must already make every coefficient the outputs have."""
        if site.last and bound.need + 1 > site.reduction_room and self.needed(site.terms()):
            return PRUNE
        return None


__all__ = ["ADDING_OPS", "Reductions", "generated", "top_coefficients"]

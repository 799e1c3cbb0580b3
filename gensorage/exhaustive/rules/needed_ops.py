"""A lower bound on the operators the last kernel operator still needs, from marks no axiom can create.

Every axiom of ``A_eq`` (Table 2 and the extensions in :mod:`gensorage.exhaustive.expr.axioms`) is *regular* — its two sides have the same
variables — and none mentions ``sqrt`` or an activation ``fn``; the only ones that mention ``exp`` are the
stabiliser laws, which move a summand ``max(k, y)`` out of an ``exp`` as ``stab(y)``. So the marks are read off
the canonical normal form (:mod:`gensorage.exhaustive.expr.canon`), which is the same for every term of a class:
the ``exp``, ``sqrt`` and ``fn`` atoms occurring in it (an ``exp`` whose summands are all maxima is ``stab``
alone and has no ``exp`` atom). Likewise every axiom that mentions ``div`` has it on both sides, so
whether a term contains a ``div`` at all is a class invariant.

The output of a complete µGraph is made by its last kernel operator, and (with ``expr_filter``) must equal the
program's under ``A_eq``. In the abstraction each operator's expression is one constructor over its operands',
so an ``exp`` operator adds at most one new ``exp`` class (its own), a ``div`` operator may add the first ``div``,
and no other operator adds either. Hence the last kernel operator needs at least one ``exp`` / ``sqrt`` / ``fn``
operator per such class of the program's outputs that none of its available tensors has, plus one ``div`` if
none has a division: when that exceeds the operators its limits leave, no µGraph below the node can be
complete, and the subtree is pruned (exact; it removes only prefixes that cannot become complete).

With :mod:`.constants`, a missing ``exp`` class whose argument must carry a factor other than 1 also needs a
``scale`` operator, unless an available tensor already carries a factor: every factor a block graph makes starts
at a ``scale`` (every other operator keeps factors of 1 at 1), so when no available tensor carries one, at least
one more operator (a ``scale``) is needed.

An online-softmax accumulator (``softmax_sum``, ``softmax_matmul``) is no operator but makes an ``exp`` class of
the form ``exp(x + max(…))`` (a max-subtracting softmax's): such classes are not counted, since a loop may supply
them with no operator (the bound only gets lower, so it stays a bound).
"""

from __future__ import annotations

from collections.abc import Iterable

from gensorage.exhaustive.expr.abstract_expr import Term
from gensorage.exhaustive.expr.canon import Canon
from gensorage.exhaustive.rules.rule import PRUNE, Bound, Prune, Site
from gensorage.opset import UNARY_FUNCTIONS, Op

UNCREATABLE = frozenset({"exp", "sqrt", "fn"})
#: The operators whose expressions can add a mark (every other operator's marks are its operands').
MARK_OPS = frozenset({Op.EXP, Op.SQRT, Op.DIV, Op.CLAMP}) | UNARY_FUNCTIONS
DIV_MARK = "div"

Mark = object  # an interned normal form (a class) or DIV_MARK


class NeededOps:
    """Marks of terms (memoized per term; terms are interned) and the bound for a set of available terms."""

    def __init__(
        self, canon: Canon, targets: Iterable[Term], factor_marks: frozenset[Mark] = frozenset()
    ) -> None:
        self.canon = canon
        self._memo: dict[Term, frozenset[Mark]] = {}
        self._online: set[Mark] = set()  # exp classes an online-softmax accumulator can make
        self.target: frozenset[Mark] = frozenset().union(*(self.marks(t) for t in targets))
        self.factor_marks: frozenset[Mark] = factor_marks & self.target  # exp classes that need a scale first

    def marks(self, t: Term) -> frozenset[Mark]:
        """The classes of ``t``'s exp/sqrt/fn-rooted subterms, plus ``DIV_MARK`` if it contains a division."""
        got = self._memo.get(t)
        if got is not None:
            return got
        out: set[Mark] = set()
        for a in t.args:
            out |= self.marks(a)
        if t.op in UNCREATABLE:
            mark = self._exp_atom(t) if t.op == "exp" else self.canon.nf(t)
            if mark is not None:
                out.add(mark)
                if t.op == "exp" and any(x.op == "max" for x in t.args[0].subterms()):
                    self._online.add(mark)
        elif t.op == "div":
            out.add(DIV_MARK)
        got = self._memo[t] = frozenset(out)
        return got

    def _exp_atom(self, t: Term) -> Mark | None:
        """The class of the ``exp`` atom of ``t = exp(...)``'s normal form (the stabiliser laws move a summand
        ``max(k, y)`` out as ``stab(y)``: the ``exp`` atom is what every term of the class has), or None when
        the summands are all maxima (a rescale ``exp(m_i − M)``, which is ``stab`` alone)."""
        nf = self.canon.nf(t)
        for atom in nf.parts[0][1][0][0][1]:
            if atom.kind == "exp":
                return self.canon.of_atom(atom)
        return None

    def bound(
        self, available: Iterable[Term], factor_available: bool = True, marks: int = 0
    ) -> tuple[int, bool]:
        """At least this many operators are needed to reach the targets from ``available`` terms (one of them
        a ``scale``, if the flag says so); ``factor_available``: some available tensor carries a factor;
        ``marks``: a lower bound on the ``exp``, ``sqrt`` and activation operators still needed known otherwise
        (see :meth:`.occurrences.OccurrenceBudget.completable`)."""
        missing = set(self.target)
        for t in available:
            if not missing:
                break
            missing -= self.marks(t)
        missing -= self._online
        if not missing and not marks:
            return 0, False
        scale = not factor_available and not self.factor_marks.isdisjoint(missing)
        div = DIV_MARK in missing
        return max(len(missing) - div, marks) + div + scale, scale

    def check(self, site: Site, bound: Bound) -> Bound | Prune | None:
        """The node rule: the operators needed from the site's tensors (at least ``bound.marks``) must fit its
        operator room."""
        need, scale = self.bound(site.terms(), site.factor, bound.marks)
        if need > site.ops_room:
            return PRUNE
        if need == bound.need and scale == bound.scale:
            return None
        return Bound(bound.marks, need, scale, bound.tight)


__all__ = ["DIV_MARK", "MARK_OPS", "NeededOps"]

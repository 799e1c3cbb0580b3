"""How many elements a tensor may have: only a reduction shrinks a tensor, and each reduction is a coefficient.

Follow one element-count along a path of operators from a tensor ``X`` to a program output. An elementwise
operator's result has at least as many elements as each operand (broadcasting only adds), ``scale``, an
activation, ``exp``, ``sqrt`` and ``reshape`` keep the count, ``repeat``, a concatenating accumulator and a
replicated write only add; only a ``sum`` over an axis of size ``k``, a ``matmul`` contracting ``k`` and a
summing accumulator of ``k`` iterations divide it, by at most ``k``. A block graph is no exception: an input of
``N`` elements split by grid dims ``G_X`` (and a loop of ``F`` iterations if its fmap splits it) gives tiles of
``N / (G_X·F)``; a block writes ``n_out / G`` elements of an output with ``G >= G_X`` blocks; and a loop-split tile
reaches the output only through an accumulator, which multiplies by ``F``. So ``N_X <= n_out · P``, where ``P`` is
the product of the path's reduction sizes.

In the oracle's canonical model each such reduction multiplies the coefficient of every numerator monomial of its
operand by ``k`` (see :mod:`.reductions`); ``mul`` multiplies coefficients, ``div`` keeps the numerator's (the
divisor goes into the denominator), ``add`` and ``sub`` (an ``add`` in the abstraction) put monomials side by
side, and over an op set without ``concat`` nothing cancels or lowers a coefficient, nor drops an atom from a
monomial. A numerator monomial ``c·m`` of ``X`` (``m`` its atoms; ``X``'s own denominators do not matter)
therefore reaches the output as a monomial with atoms ``⊇ m`` and coefficient ``>= c·P`` -- at the output's top
level, unless the path puts it inside an ``exp``, ``sqrt``, activation or ``max`` atom or into a denominator,
where the output's normal form keeps it, or it is a lone maximum: a monomial ``1·max(k, y)`` that is a summand
of an ``exp``'s argument leaves it as ``stab(y)`` (the stabiliser law), and a ``max`` of it is ``max(k·j, y)``,
so its atom is nowhere in the output. A monomial with a coefficient above 1 or another atom beside the maximum
never becomes one (coefficients and atoms only grow), so ``X`` with such a monomial is the only exception and
the rule says nothing about it. An output equal to the program's under ``A_eq`` has the
program's normal form, so when no monomial inside an atom argument or a denominator of the program's outputs (at
any depth) contains ``m``, the path kept ``X``'s numerators at the top level and ``P <= C // c`` for a top-level
numerator monomial ``C·M`` of the output with ``M ⊇ m``. Every numerator monomial of ``X`` gets the same ``P``,
so ``P`` is at most the least of those bounds: ``X`` can have at most
``max over outputs of n_out · min over numerator monomials c·m of X of max{C // c : C·M top-level, M ⊇ m}``
elements.

Attention's ``V`` (``(16·V·exp(8·Q·K)) / (16·exp(8·Q·K))``) may be at most 16 times the output: a first kernel
that writes ``V`` replicated more than that (a copy per query head is exactly that much) is pruned with its
whole second-kernel subtree. Like :mod:`.reductions`, this speaks about outputs equal to the program's under
``A_eq`` (``prune`` and ``expr_filter``), is applied to exact values only (no concatenated layout), and stays
off with ``add`` in the op set (the argument covers it; those searches were not re-measured) and ``concat``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from gensorage.exhaustive.expr.abstract_expr import Term
from gensorage.exhaustive.expr.canon import Canon, Elem, TooBig
from gensorage.exhaustive.expr.oracle import gateways
from gensorage.exhaustive.opcatalog import OpVariant
from gensorage.exhaustive.rules.reductions import ADDING_OPS

Monomial = tuple[int, Counter[int]]  # (coefficient, atom uid -> multiplicity)


def _monomials(e: Elem) -> list[Monomial]:
    return [(c, Counter(a.uid for a in atoms)) for _, poly in e.parts for (c, atoms), _ in poly]


def _within(m: Counter[int], big: Counter[int]) -> bool:
    return all(big[a] >= n for a, n in m.items())


def _lone_max(e: Elem) -> bool:
    """Whether a numerator monomial of ``e`` is one ``max`` atom with coefficient 1 (see the module doc)."""
    return any(
        c == 1 and len(atoms) == 1 and atoms[0].kind == "max" for _, poly in e.parts for (c, atoms), _ in poly
    )


class ElementCaps:
    """The program outputs' top-level monomials and element counts, and the cap of a tensor's element count."""

    def __init__(
        self, canon: Canon, tops: Sequence[tuple[int, list[Monomial]]], inner: list[Counter[int]]
    ) -> None:
        self.canon = canon
        self.tops = tops  # per output: (element count, top-level numerator monomials)
        self.inner = inner
        self._memo: dict[Term, int | None] = {}

    @classmethod
    def for_search(
        cls, canon: Canon, targets: Sequence[Term], numels: Sequence[int], variants: Iterable[OpVariant]
    ) -> ElementCaps | None:
        """The rule for a search over ``variants`` whose outputs have ``targets`` and ``numels`` elements, or
        None where it does not apply (``add`` or ``concat`` in the op set, or outputs too big to normalise)."""
        if any(v.op in ADDING_OPS for v in variants):
            return None
        try:
            nfs = [canon.nf(t) for t in targets]
        except TooBig:
            return None
        # Every monomial inside an atom argument or a denominator of an output, at any depth.
        inner = [m for e in nfs for g in gateways(canon, e) if g is not e for _, m in _monomials(g)]
        return cls(canon, [(n, _monomials(e)) for n, e in zip(numels, nfs, strict=True)], inner)

    def cap(self, t: Term) -> int | None:
        """The most elements a tensor with expression ``t`` may have in a µGraph equal to the program, or None
        where the rule says nothing (a monomial that may end up inside an atom or a denominator)."""
        if t in self._memo:
            return self._memo[t]
        got = self._cap(t)
        self._memo[t] = got
        return got

    def _cap(self, t: Term) -> int | None:
        try:
            e = self.canon.nf(t)
        except TooBig:
            return None
        mine = _monomials(e)
        if _lone_max(e) or any(_within(m, big) for _, m in mine for big in self.inner):
            return None
        best = 0
        for numel, tops in self.tops:
            factor = min(
                (
                    max((c_top // c for c_top, top in tops if c_top >= c and _within(m, top)), default=0)
                    for c, m in mine
                ),
                default=0,
            )
            best = max(best, numel * factor)
        return best

    def admits(self, numel: int, t: Term) -> bool:
        """Whether a tensor of ``numel`` elements and expression ``t`` may be part of a µGraph equal to the
        program (see the module docstring)."""
        cap = self.cap(t)
        return cap is None or numel <= cap


__all__ = ["ElementCaps"]

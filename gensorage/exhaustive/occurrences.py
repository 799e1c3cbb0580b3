"""An exact bound on how often each program input can still be read: variable occurrences are conserved.

Count, for a term, how many times each variable occurs in it written out as a tree (``mul(Q, K)``: Q once, K once;
``mul(x, x)``: twice what ``x`` has). On terms without ``add``, ``cat`` and ``max`` every ``A_eq`` axiom has the
same count on both sides (commutativity and associativity of ``mul``, ``mul(x, div(y, z)) = div(mul(x, y), z)``,
``div(div(x, y), z) = div(x, mul(y, z))``, ``sum(1, x) = x``, the ``sum`` nesting and ``sum``-over-``mul``/``div``
laws); only distributivity and the other ``add`` laws and ``cat(x, x) = x`` change counts. Every axiom that
mentions ``add`` has it on both sides, so an output equal to a program output without ``add`` contains no ``add``
either, and is rewritten into it without ever using those axioms: it has exactly the program output's count.

In a µGraph every operator's term is one constructor over its operands' terms, so its count is the sum of its
operands' counts (with multiplicity). A complete µGraph consumes every tensor an operator produced except the
outputs, and reads every program input the program reads. So every tensor not consumed yet — a kernel tensor
nobody reads, a program input still to read, an unconsumed tensor or unused input iterator of the block graph in
progress — occurs in the outputs, at a position no other of them covers (none is inside another: that one would
have read it). Hence their counts add up to at most the outputs' count, which (with ``expr_filter``: outputs equal
to the program's under ``A_eq``) is the program outputs' count.

An operator whose operands are all unconsumed and distinct leaves that sum unchanged (the operands' counts move
into its result); one that reads a tensor already consumed, or one tensor twice, adds that tensor's count again.
The search checks exactly those operators (:meth:`OccurrenceBudget.fits`) and prunes the ones that push some
variable past the program's count: every µGraph below them would have an output with a different count. With
attention's output ``Q, K`` twice and ``V`` once, it is what stops a last kernel from reading ``Q`` again after the
first kernel has used it twice.

Applied only where no term the search builds can hold ``add``, ``cat`` or ``max``: the program's outputs have none
and the op set has no ``add``, ``sub`` or ``concat`` (inputs are plain; layouts, and so ``cat`` pieces, arise only
from concatenations), and, like :mod:`.needed_ops`, with ``prune`` and ``expr_filter``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from gensorage.exhaustive.abstract_expr import Term
from gensorage.exhaustive.opcatalog import OpVariant
from gensorage.opset import Op

if TYPE_CHECKING:
    from gensorage.exhaustive.search_state import SearchState

#: Term operators whose axioms change occurrence counts, and the operators that build them.
UNCOUNTABLE_TERMS = frozenset({"add", "cat", "max"})
UNCOUNTABLE_OPS = frozenset({Op.ADD, Op.SUB, Op.CONCAT})

Counts = tuple[int, ...]


class OccurrenceBudget:
    """Occurrence counts of terms (memoized; terms are interned) and the check of an operator against the
    program outputs' counts. Build it with :meth:`for_search`."""

    def __init__(self, names: Sequence[str], targets: Iterable[Term]) -> None:
        self.index = {n: i for i, n in enumerate(names)}
        self._zero: Counts = (0,) * len(names)
        self._memo: dict[Term, Counts] = {}
        self.target = self._zero
        for t in targets:
            self.target = _plus(self.target, self.count(t))

    @classmethod
    def for_search(cls, names: Sequence[str], targets: Sequence[Term],
                   variants: Iterable[OpVariant]) -> OccurrenceBudget | None:
        """The budget of a search over ``variants`` for ``targets``, or None where counts are not conserved."""
        if any(v.op in UNCOUNTABLE_OPS for v in variants):
            return None
        if any(s.op in UNCOUNTABLE_TERMS for t in targets for s in t.subterms()):
            return None
        return cls(names, targets)

    def count(self, t: Term) -> Counts:
        """How often each variable (in ``names`` order) occurs in ``t`` written out as a tree."""
        got = self._memo.get(t)
        if got is not None:
            return got
        if t.op == "var":
            out = list(self._zero)
            out[self.index[t.name]] = 1
            got = tuple(out)
        else:
            got = self._zero
            for a in t.args:
                got = _plus(got, self.count(a))
        self._memo[t] = got
        return got

    def pending(self, st: SearchState, required: Iterable[int]) -> Counts:
        """The counts of everything not consumed yet: kernel tensors nobody reads (program inputs among
        ``required`` only) outside the open block graph's inputs, and that block graph's unconsumed tensors
        (unused iterators included)."""
        b = st.block
        reading = set(b.inputs) if b is not None else set()
        req = set(required)
        total = self._zero
        for t in range(len(st.shape)):
            if st.uses[t] == 0 and t not in reading and (t >= st.n_inputs or t in req):
                total = _plus(total, self.count(st.val[t].term))
        if b is not None:
            m = len(b.inputs)
            for j in range(len(b.shape)):
                if b.uses[j] == 0:
                    term = st.val[b.inputs[j]].term if j < m else b.val[j].term  # type: ignore[union-attr]
                    total = _plus(total, self.count(term))
        return total

    def fits(self, pending: Counts, again: Iterable[Term]) -> bool:
        """Whether reading the terms ``again`` once more each (operands already consumed, or repeated) keeps
        every count within the program outputs'."""
        total = pending
        for t in again:
            total = _plus(total, self.count(t))
        return all(a <= b for a, b in zip(total, self.target, strict=True))


def read_again(ins: Sequence[int], counted: Callable[[int], bool], term: Callable[[int], Term]) -> list[Term]:
    """The terms of the operands ``ins`` an operator reads a further time: every read except the first of an
    operand whose count is already pending (``counted``: not consumed yet)."""
    seen: set[int] = set()
    out = []
    for i in ins:
        if i not in seen and counted(i):
            seen.add(i)
            continue
        out.append(term(i))
    return out


def _plus(a: Counts, b: Counts) -> Counts:
    return tuple(x + y for x, y in zip(a, b, strict=True))


__all__ = ["Counts", "OccurrenceBudget", "UNCOUNTABLE_OPS", "UNCOUNTABLE_TERMS", "read_again"]

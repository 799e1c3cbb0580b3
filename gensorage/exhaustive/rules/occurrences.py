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

Occurrences outside marks. Count separately the occurrences that lie under no ``exp``, ``sqrt`` or activation
``fn`` (the *outside* count). No axiom mentions those (see :mod:`.needed_ops`), so every axiom moves each of its
variables' subterms whole, at a position under no mark of its own: the outside count is an ``A_eq`` invariant too,
and an output equal to a program output has the program outputs' outside count. A future operator adds its
operands' outside counts, except a mark operator, which moves its argument's whole outside count inside; its term
is a mark-rooted subterm of the output, so (marks being invariant classes) its argument is in the class of the
argument of one of the program outputs' marks and has that argument's outside count. So the output tree of a
completion of the last kernel operator has as leaves tensors of its block graph as they are now (every pending one
at least once, any one again), and the output's outside count is the leaves' minus one mark argument's count per
mark operator above them. :meth:`OccurrenceBudget.completable` asks whether some multiset of leaves has exactly the
outputs' total count and an outside count that the outputs' plus a sum of mark arguments' counts makes up; where
none has, the node is pruned. It is what stops a last kernel that reads a raw ``Q`` beside ``V`` and
``exp(sum(mul(Q, K)))``: ``Q`` must end up under an ``exp``, whose argument needs a ``K`` outside one, and no tensor
of that block graph has it. A pending ``scale`` result, which only a mark operator may read, or a maximum whose
result is a scale's result again with the same counts, must be under a mark unless it is a whole output: its
outside count is among the moved ones.

Applied only where no term the search builds can hold ``add``, ``cat`` or ``max``: the program's outputs have none
and the op set has no ``add``, ``sub`` or ``concat`` (inputs are plain; layouts, and so ``cat`` pieces, arise only
from concatenations), and, like :mod:`.needed_ops`, with ``prune`` and ``expr_filter``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from gensorage.exhaustive.expr.abstract_expr import Term
from gensorage.exhaustive.opcatalog import OpVariant
from gensorage.exhaustive.rules.needed_ops import UNCREATABLE
from gensorage.exhaustive.rules.rule import PRUNE, Bound, LastSite, Prune, Site
from gensorage.opset import Op

if TYPE_CHECKING:
    from gensorage.exhaustive.walk.search_state import SearchState

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
        self._outside_memo: dict[Term, Counts] = {}
        self._complete_memo: dict[tuple[object, ...], int | None] = {}
        self._marks_memo: dict[Counts, int | None] = {}
        self.target = self._zero
        self.target_outside = self._zero
        self.output_counts = frozenset(self.count(t) for t in targets)
        for t in targets:
            self.target = _plus(self.target, self.count(t))
            self.target_outside = _plus(self.target_outside, self.outside(t))
        # The outside counts a mark operator can move inside: those of the program's mark arguments.
        moves = {self.outside(s.args[0]) for t in targets for s in t.subterms() if s.op in UNCREATABLE}
        self.mark_moves: tuple[Counts, ...] = tuple(sorted(moves - {self._zero}))

    @classmethod
    def for_search(
        cls, names: Sequence[str], targets: Sequence[Term], variants: Iterable[OpVariant]
    ) -> OccurrenceBudget | None:
        """The budget of a search over ``variants`` for ``targets``, or None where counts are not conserved."""
        if any(v.op in UNCOUNTABLE_OPS for v in variants):
            return None
        if any(s.op in UNCOUNTABLE_TERMS for t in targets for s in t.subterms()):
            return None
        return cls(names, targets)

    def count(self, t: Term) -> Counts:
        """How often each variable (in ``names`` order) occurs in ``t`` written out as a tree."""
        return self._fold(t, self._memo, frozenset())

    def outside(self, t: Term) -> Counts:
        """How often each variable occurs in ``t`` under no ``exp``, ``sqrt`` or activation (see above)."""
        return self._fold(t, self._outside_memo, UNCREATABLE)

    def _fold(self, t: Term, memo: dict[Term, Counts], stop: frozenset[str]) -> Counts:
        """Occurrences in ``t`` outside subterms rooted at an operator in ``stop`` (memoised in ``memo``)."""
        got = memo.get(t)
        if got is not None:
            return got
        got = self._zero
        if t.op == "var":
            out = list(self._zero)
            out[self.index[t.name]] = 1
            got = tuple(out)
        elif t.op not in stop:
            for a in t.args:
                got = _plus(got, self._fold(a, memo, stop))
        memo[t] = got
        return got

    def pending(self, st: SearchState, required: Iterable[int]) -> Counts:
        """The counts of everything not consumed yet: kernel tensors nobody reads (program inputs among
        ``required`` only) outside the open block graph's inputs, and that block graph's unconsumed tensors
        (unused iterators included)."""
        total = self._zero
        for term in pending_terms(st, required):
            total = _plus(total, self.count(term))
        return total

    def fits(self, pending: Counts, again: Iterable[Term]) -> bool:
        """Whether reading the terms ``again`` once more each (operands already consumed, or repeated) keeps
        every count within the program outputs'."""
        total = pending
        for t in again:
            total = _plus(total, self.count(t))
        return all(a <= b for a, b in zip(total, self.target, strict=True))

    def completable(
        self, pending: Sequence[Term], leaves: Iterable[Term], under_marks: Sequence[Term] = ()
    ) -> int | None:
        """Whether an output tree whose leaves are ``pending`` once each plus any of ``leaves`` (each any
        number of times) can have the outputs' total and outside counts, some mark operators above the leaves
        moving their arguments' outside counts inside (see the module docstring): None if not, else a lower
        bound on the mark operators (``exp``, ``sqrt``, activations) still to add. ``under_marks``: pending
        terms that must end under a mark (a scale's result, which only a non-linear unary operator or a
        maximum, whose result is one again, may read); their outside counts are moved. Memoised."""
        key = (
            tuple(sorted(t.uid for t in pending)),
            frozenset(t.uid for t in leaves),
            tuple(sorted(t.uid for t in under_marks)),
        )
        if key in self._complete_memo:
            return self._complete_memo[key]
        if len(self._complete_memo) >= MAX_MEMO:
            self._complete_memo.clear()
        got = self._complete_memo[key] = self._completable(pending, leaves, under_marks)
        return got

    def _completable(
        self, pending: Sequence[Term], leaves: Iterable[Term], under_marks: Sequence[Term]
    ) -> int | None:
        # Multisets of leaves read again, each with its fewest mark nodes; the answer is the least over them.
        total, out = self._zero, self._zero
        for t in pending:
            total, out = _plus(total, self.count(t)), _plus(out, self.outside(t))
        rest = _minus(self.target, total)
        if min(rest) < 0:
            return None
        # Leaves read again, where the pending ones leave room. Each has a count (the root of every tensor is
        # built from program inputs).
        extra = sorted({(self.count(t), self.outside(t)) for t in leaves if any(self.count(t))})
        best: list[int | None] = [None]
        # Each occurrence is moved by the innermost mark above it, if any: the moved count covers these.
        must = self._zero
        for t in under_marks:
            must = _plus(must, self.outside(t))

        def fill(k: int, rest: Counts, out: Counts, again: bool) -> bool:
            """Try the multisets of ``extra[k:]`` that make up ``rest``; True once one needs no mark bound."""
            if not any(rest):
                moved = _minus(out, self.target_outside)
                if min(_minus(moved, must)) < 0:
                    return False
                marks = self._marks(moved)
                if marks is None:
                    return False
                # Without leaves read again the tree repeats no subtree, so each mark node is an operator of
                # its own; with them, one mark operator may be read several times, but there is one at least.
                marks = min(marks, 1) if again else marks
                best[0] = marks if best[0] is None else min(best[0], marks)
                return marks == 0
            if k == len(extra):
                return False
            count, outside = extra[k]
            taken = False
            while True:  # extra[k] taken 0, 1, 2, ... times
                if fill(k + 1, rest, out, again or taken):
                    return True
                rest = _minus(rest, count)
                if min(rest) < 0:
                    return False
                out, taken = _plus(out, outside), True

        fill(0, rest, out, False)
        return best[0]

    def _marks(self, moved: Counts) -> int | None:
        """The fewest mark arguments' outside counts that sum to ``moved`` (None: no sum does)."""
        if min(moved) < 0:
            return None
        if moved in self._marks_memo:
            return self._marks_memo[moved]
        best = 0 if not any(moved) else None
        if best is None:
            for m in self.mark_moves:
                got = self._marks(_minus(moved, m))
                if got is not None and (best is None or got + 1 < best):
                    best = got + 1
        self._marks_memo[moved] = best
        return best

    def check(self, site: Site, bound: Bound) -> Bound | Prune | None:
        """The node rule, at the last kernel operator: its outputs must be able to have the program outputs'
        counts, outside marks too, with the site's tensors as the leaves of their trees; the bound gets the mark
        operators that takes at least. A pending scale result that is not a whole program output by its counts
        ends under a mark (only a non-linear unary operator, or a maximum whose result is one again, may read it)."""
        if not isinstance(site, LastSite):
            return None
        under = [t for t in site.scaled() if self.count(t) not in self.output_counts]
        got = self.completable(site.pending(), site.terms(), under)
        if got is None or got > site.ops_room:
            return PRUNE
        if got == bound.marks:
            return None
        return Bound(got, bound.need, bound.scale, bound.tight)


def pending_terms(st: SearchState, required: Iterable[int]) -> list[Term]:
    """The terms of everything not consumed yet: kernel tensors nobody reads (program inputs among ``required``
    only) outside the open block graph's inputs, and that block graph's unconsumed tensors (unused iterators
    included)."""
    b = st.block
    reading = set(b.inputs) if b is not None else set()
    req = set(required)
    out = [
        st.val[t].term
        for t in range(len(st.shape))
        if st.uses[t] == 0 and t not in reading and (t >= st.n_inputs or t in req)
    ]
    if b is not None:
        m = len(b.inputs)
        out.extend(
            st.val[b.inputs[j]].term if j < m else b.val[j].term  # type: ignore[union-attr]
            for j in range(len(b.shape))
            if b.uses[j] == 0
        )
    return out


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


def _minus(a: Counts, b: Counts) -> Counts:
    return tuple(x - y for x, y in zip(a, b, strict=True))


MAX_MEMO = 200_000  # entries of the completability memo before it starts afresh


__all__ = [
    "Counts",
    "OccurrenceBudget",
    "UNCOUNTABLE_OPS",
    "UNCOUNTABLE_TERMS",
    "pending_terms",
    "read_again",
]

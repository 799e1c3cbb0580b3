"""The index-tie rule: every class of a µGraph equal to the program is one of the program's, and each of the
program's classes takes a reduction of its own.

Classes (the atoms a reduction sums, see :mod:`gensorage.exhaustive.expr.ties`) are an invariant of the laws
behind ``A_eq``. A complete µGraph's output contains every operator's expression, so every class of a µGraph
equal to the program in this abstraction is one of the program's: the search prunes a reduction or sum
accumulator that makes another (:meth:`TieRule.admits`, checked on every new tensor). And every reduction makes
one class: the last kernel operator needs a reduction (an operator, or an accumulator) for each of the program's
classes that none of the tensors it reads has (:meth:`TieRule.check`, a node rule after the needed operators).

When the needed marks plus the missing classes take every node left, a child that adds neither a mark nor a
class is pruned at once unless one of its tensors has unknown ties (missing then counts 0). A repeat or a
concatenating accumulator adds neither, and keeps its operand's ties known, so such children are not generated:
with every tensor known (``TIGHT_KNOWN``), only where the operand is an iterator whose new tile has unknown ties;
with one unknown already (``TIGHT_ANY``: the missing count is 0 and the marks alone take every node), never.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from gensorage.errors import ProgramError
from gensorage.exhaustive.expr.ties import Atoms, Class, Links, TieArith, Ties, input_ties
from gensorage.exhaustive.rules.rule import NOT_TIGHT, PRUNE, TIGHT_ANY, TIGHT_KNOWN, Bound, Prune, Site
from gensorage.opset import Op
from gensorage.program import Program

#: Operators whose laws change classes (see expr.ties): with any of them the rule is off.
CLASS_CHANGING = frozenset({Op.ADD, Op.SUB, Op.CONCAT})
#: Operators that add no class and keep their operand's ties known: not generated when the room is used up.
NO_CLASS_OPS = frozenset({Op.REPEAT})
TIGHT_RULE = True  # tests switch it off to check that it keeps every candidate


class TieRule:
    """The program's reduction classes and ties, and the checks of a µGraph against them; ``arith`` computes a
    µGraph's ties, marking those the program's links do not admit."""

    def __init__(self, classes: frozenset[Class], links: Links | None = None) -> None:
        self.classes = classes
        self.links = links
        self.arith = TieArith(links)

    @staticmethod
    def for_search(program: Program, ops: Sequence[Op], stable_subs: bool = False) -> TieRule | None:
        """The rule for a search of ``program`` with operators ``ops``; None where it does not apply.

        ``stable_subs``: every ``sub`` of the program and of the searched µGraphs is a stable softmax's, read only
        by an ``exp`` (``SearchSpec.sub_stabilises_only`` on a program :func:`stable_softmax_only` accepts); then
        ``exp(x − m) = exp(x) / exp(m)`` rewrites every ``sub`` away without changing a tie, so ``sub`` changes
        no class (docs/search.md, "Index ties")."""
        changing = CLASS_CHANGING - {Op.SUB} if stable_subs else CLASS_CHANGING
        if any(op in changing for op in ops):
            return None
        made: list[Atoms] = []
        try:
            outs = program.evaluate(
                TieArith(record=made), [input_ties(i, t.shape) for i, t in enumerate(program.inputs)]
            )
        except ProgramError:
            return None
        if not all(o.known for o in outs):
            return None
        return TieRule(frozenset(c for o in outs for c in o.bound), Links(made))

    def missing(self, available: Iterable[Ties | None]) -> int:
        """How many of the program's classes no ``available`` tensor has (0 if one is unknown): a last kernel
        operator reading them needs one reduction for each, since a reduction adds one class."""
        have: set[Class] = set()
        for t in available:
            if t is None or not t.known:
                return 0
            have |= t.bound
        return len(self.classes - have)

    def admits(self, t: Ties) -> bool:
        """Whether every class of ``t`` is one of the program's and every tie one its links admit (an unknown
        tensor always passes)."""
        return not t.known or (t.aligned and t.bound <= self.classes)

    def check(self, site: Site, bound: Bound) -> Bound | Prune | None:
        """The node rule: the operators still needed plus one reduction per missing class must fit the
        reduction room; at the last kernel operator, a room they fill exactly makes the bound tight."""
        ties = site.ties()
        want, room = bound.need + self.missing(ties), site.reduction_room
        if want > room:
            return PRUNE
        if want == room and site.last and TIGHT_RULE:
            tight = TIGHT_KNOWN if all(t is not None and t.known for t in ties) else TIGHT_ANY
            return dataclasses.replace(bound, tight=tight)
        return None


__all__ = ["CLASS_CHANGING", "NOT_TIGHT", "NO_CLASS_OPS", "TIGHT_ANY", "TIGHT_KNOWN", "TIGHT_RULE", "TieRule"]

"""A search's pruning rules: each rule that applies to its program and op set, and the node rules in order.

Every rule here speaks about µGraphs whose outputs equal the program's under ``A_eq``, so a search has them only
with ``prune`` and ``expr_filter`` (:meth:`RuleSet.for_search`); each rule's ``for_search`` factory returns None
where the rule does not apply to the program or its op set (e.g. the occurrence budget with ``add``).

The node rules apply in this order, each seeing the bound the ones before it left:

1. occurrences (:mod:`.occurrences`): the last kernel operator's outputs must be able to have the program's
   variable occurrence counts; a lower bound on the mark operators still needed;
2. needed operators (:mod:`.needed_ops`): the operators that add the program's marks still missing must fit;
   additive constants (:mod:`.homogeneity`): one more, an ``add_scalar``, while none is applied to a program
   that is not homogeneous;
3. reductions (:mod:`.reductions`): a coefficient only a reduction makes needs room for one more reduction;
4. index ties (:mod:`.ties`): one reduction per reduction class no tensor has, after the operators still needed.

The other rules are checks on each new tensor, made by the walk where it makes the tensor (see
:mod:`gensorage.exhaustive.walk.operators`): the factor an ``exp``'s argument carries (:mod:`.constants`), the
tensor an ``add_scalar`` adds to (:mod:`.shift_places`), the
element count (:mod:`.element_counts`), the tie classes (:mod:`.ties`) and the occurrence budget of a tensor read
again (:mod:`.occurrences`), beside the subexpression oracle (:mod:`gensorage.exhaustive.expr.oracle`), which
the walk asks with ``prune`` alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gensorage.exhaustive.expr.abstract_expr import Term
from gensorage.exhaustive.expr.canon import Canon
from gensorage.exhaustive.opcatalog import OpVariant
from gensorage.exhaustive.rules.constants import ExpConstants
from gensorage.exhaustive.rules.element_counts import ElementCaps
from gensorage.exhaustive.rules.homogeneity import Homogeneity
from gensorage.exhaustive.rules.needed_ops import NeededOps
from gensorage.exhaustive.rules.occurrences import OccurrenceBudget
from gensorage.exhaustive.rules.reductions import Reductions
from gensorage.exhaustive.rules.rule import NodeRule
from gensorage.exhaustive.rules.shift_places import ShiftPlaces
from gensorage.exhaustive.rules.ties import TieRule
from gensorage.opset import Shape
from gensorage.program import Program


@dataclass(frozen=True, slots=True)
class RuleSet:
    """The rules of one search (None: the rule does not apply to it); ``nodes``: the node rules, in order."""

    constants: ExpConstants | None = None
    needed: NeededOps | None = None
    reductions: Reductions | None = None
    ties: TieRule | None = None
    occurrences: OccurrenceBudget | None = None
    element_caps: ElementCaps | None = None
    shifts: ShiftPlaces | None = None
    nodes: tuple[NodeRule, ...] = ()

    @staticmethod
    def for_search(
        program: Program,
        canon: Canon,
        targets: Sequence[Term],
        variants: Sequence[OpVariant],
        output_shapes: Sequence[Shape],
        stable_subs: bool = False,
    ) -> RuleSet:
        """The rules of a search of ``program`` (outputs ``targets``, normal forms in ``canon``) over
        ``variants``. The order of construction is the order the rules' normal forms enter ``canon``.
        ``stable_subs``: every ``sub`` is a stable softmax's (see :meth:`TieRule.for_search`)."""
        ops = [v.op for v in variants]
        constants = ExpConstants(program, canon)
        # The factors exp arguments must carry: an exp class that needs one needs a scale first.
        needed = NeededOps(canon, targets, constants.factor_marks)
        reductions = Reductions.for_search(canon, targets, variants)
        ties = TieRule.for_search(program, ops, stable_subs)
        occurrences = OccurrenceBudget.for_search([t.name for t in program.inputs], targets, variants)
        element_caps = ElementCaps.for_search(canon, targets, [math.prod(s) for s in output_shapes], variants)
        homogeneity = Homogeneity.for_search(program, ops)
        nodes: tuple[NodeRule | None, ...] = (
            occurrences,
            needed,
            homogeneity,
            reductions,
            ties,
        )  # the order of the docstring
        return RuleSet(
            constants,
            needed,
            reductions,
            ties,
            occurrences,
            element_caps,
            ShiftPlaces.for_search(program, canon, ops),
            tuple(r for r in nodes if r is not None),
        )


__all__ = ["RuleSet"]

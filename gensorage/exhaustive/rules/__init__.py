"""The pruning rules of the search, each a value with one interface, and the order the walk applies them.

- :mod:`.rule`: the node-rule interface (a rule answers None, a prune, or a tighter bound) and :func:`apply`;
- :mod:`.ruleset`: a search's rules and the ordered list of its node rules;
- one module per rule: :mod:`.occurrences`, :mod:`.needed_ops`, :mod:`.reductions`, :mod:`.ties` (node rules,
  in that order), :mod:`.constants` and :mod:`.element_counts` (checks on new tensors).
"""

from __future__ import annotations

from gensorage.exhaustive.rules.constants import ExpConstants
from gensorage.exhaustive.rules.element_counts import ElementCaps
from gensorage.exhaustive.rules.needed_ops import NeededOps
from gensorage.exhaustive.rules.occurrences import OccurrenceBudget
from gensorage.exhaustive.rules.reductions import Reductions
from gensorage.exhaustive.rules.rule import NO_BOUND, PRUNE, Bound, NodeRule, Prune, Site, apply
from gensorage.exhaustive.rules.ruleset import RuleSet
from gensorage.exhaustive.rules.ties import TieRule

__all__ = [
    "NO_BOUND",
    "PRUNE",
    "Bound",
    "ElementCaps",
    "ExpConstants",
    "NeededOps",
    "NodeRule",
    "OccurrenceBudget",
    "Prune",
    "Reductions",
    "RuleSet",
    "Site",
    "TieRule",
    "apply",
]

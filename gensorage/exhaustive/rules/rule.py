"""The interface of the node rules: what a rule sees of a node (:class:`Site`) and what it answers.

A *node rule* is consulted where a graph-defined operator is built: at each node of its block graph in progress,
and for the last kernel operator already at its header (the kernel tensors it will read). Like a dlight
``ScheduleRule``, it answers None where it does not apply or has nothing to add, and a verdict otherwise:

* :data:`PRUNE`: no µGraph below the node is complete and equal to the program; the walk counts the node as
  pruned (``pruned_expr``) and generates none of its children;
* a :class:`Bound`: what the rule learnt about the node's completions (operators and mark operators still
  needed, whether one is a scale, whether the reduction room is used up), for the rules after it and, at the
  last kernel operator's block graph, for the node's children.

The walk applies a search's rules in the order of its list (:func:`apply`), each seeing the bound the rules
before it left; the first :data:`PRUNE` ends it. A rule that does not apply to a search at all is not in the
list (see :mod:`.ruleset`). Every rule speaks about µGraphs whose outputs equal the
program's under ``A_eq`` (``prune`` and ``expr_filter``), and sees only nodes whose expressions are exact (no
input is a concatenation): the walk builds no site elsewhere.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gensorage.exhaustive.expr.abstract_expr import Term
from gensorage.exhaustive.expr.ties import Ties

#: A reduction room without a limit (no node limit on a block graph with a loop).
UNLIMITED = 1 << 30

# How the reduction room binds the children (see rules.ties): not at all; used up, every tensor's ties known;
# used up, some tensor's unknown.
NOT_TIGHT, TIGHT_KNOWN, TIGHT_ANY = 0, 1, 2


class Prune:
    """The verdict that prunes a node."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "PRUNE"


PRUNE = Prune()


@dataclass(frozen=True, slots=True)
class Bound:
    """What the rules know about the completions of a node.

    ``marks``: mark operators (``exp``, ``sqrt``, activations) still needed at least; ``need``: operators still
    needed at least (``scale``: one of them is a ``scale``; ``shift``: one is an ``add_scalar``); ``tight``:
    whether the operators still needed and the reductions still missing take the whole room (``NOT_TIGHT``,
    ``TIGHT_KNOWN`` or ``TIGHT_ANY``).
    """

    marks: int = 0
    need: int = 0
    scale: bool = False
    tight: int = NOT_TIGHT
    shift: bool = False


NO_BOUND = Bound()


class Site(ABC):
    """A node as the node rules see it: the tensors its completions may read, and the room they have.

    ``last``: the graph-defined operator is the last kernel operator the limits allow (so its outputs are the
    program's); ``ops_room``: the compute operators the completions may still add (with ``last`` False, those of
    every later kernel operator too); ``reduction_room``: the reductions they may still add (operators, or
    accumulators where a loop can supply one); ``factor``: some available tensor carries a constant factor;
    ``shifted``: the µGraph already applies an ``add_scalar`` somewhere (see :mod:`.homogeneity`).
    """

    __slots__ = ("factor", "last", "ops_room", "reduction_room", "shifted")

    # Set by each kind of site (the walk builds one per node; its terms and ties only on demand).
    last: bool
    ops_room: int
    reduction_room: int
    factor: bool
    shifted: bool

    @abstractmethod
    def terms(self) -> Sequence[Term]:
        """The expressions of the tensors available to the completions."""

    @abstractmethod
    def ties(self) -> Sequence[Ties | None]:
        """The index ties of the same tensors (None: unknown)."""


class LastSite(Site):
    """A site of the last kernel operator (``last`` is True): its outputs are the program's, so what is still
    pending must end up in them."""

    __slots__ = ()

    @abstractmethod
    def pending(self) -> Sequence[Term]:
        """The expressions of everything not consumed yet (each must occur in the outputs)."""

    @abstractmethod
    def scaled(self) -> Sequence[Term]:
        """The pending tensors that are results of a ``scale``, or maxima of one (read only by a mark or a
        maximum, or saved)."""


class NodeRule(Protocol):
    """A pruning rule applied at nodes (see the module docstring)."""

    def check(self, site: Site, bound: Bound) -> Bound | Prune | None:
        """None (does not apply, nothing to add), :data:`PRUNE`, or a tighter bound."""
        ...


def apply(rules: Sequence[NodeRule], site: Site) -> Bound | Prune:
    """The rules' verdict on ``site``, in order: :data:`PRUNE` from the first rule that prunes, else the bound
    they leave."""
    bound = NO_BOUND
    for rule in rules:
        got = rule.check(site, bound)
        if got is None:
            continue
        if isinstance(got, Prune):
            return got
        bound = got
    return bound


__all__ = [
    "NOT_TIGHT",
    "NO_BOUND",
    "PRUNE",
    "TIGHT_ANY",
    "TIGHT_KNOWN",
    "UNLIMITED",
    "Bound",
    "LastSite",
    "NodeRule",
    "Prune",
    "Site",
    "apply",
]

"""Block-graph generation (Algorithm 1, ``GenerateNextBlockOperator``) for the graph-defined operator in progress.

The children of a block-level search node are, in this order:

1. *finishing* the block graph — once every input iterator is used and every tensor is consumed except the ones
   to save (all after the for-loop when there is one), one output saver per unconsumed tensor, for every
   assignment of the grid dims to output dims (omap); this adds the graph-defined operator to the kernel graph
   (:mod:`.finishing`);
2. a new compute operator (every variant of the op set on every input tuple) in increasing canonical rank
   (:mod:`.operators`);
3. a for-loop accumulator (sum, or concatenation along a dim) of a loop-body tensor, also in rank order
   (:mod:`.accumulators`).

Before any child, the search's node rules (:mod:`gensorage.exhaustive.rules`) look at the node, in their order:
one may prune it (none of its children is generated), and at the last kernel operator the bound they leave
limits its children: while operators are still needed it cannot finish; when they take every operator left,
only operators that can add a mark are generated; when they fill the reduction room, only children that can add
a class.

Partitions are chosen lazily: an input iterator's imap (grid dim -> data dim or replica), fmap (loop -> data
dim or none) and, when first needed, a grid dim's size or the for-loop trip count are chosen when an operator
first reads the iterator, among the choices that give a valid tile (:mod:`.bindings`). This enumerates the same set of
(imap, fmap, block graph) combinations as choosing them all up front (Mirage's order), but a wrong partition
dies at the operator that reads it instead of being carried through every block graph. The grid's rank is
lazy too: a block graph opens with room for ``max_grid_dims`` dims, a dim exists once a binding splits an
input along it, and the finished graph has the dims that exist (at least one). So a block graph whose
bindings so far split one dim is one search state, not one per grid rank it may still reach (fixing the rank
up front walked each such state once for every rank).

Restrictions of the space, each removing only µGraphs a kept one dominates (see ``docs/search.md``): a grid dim
partitions at least one input (else all its blocks compute the same tile; here it holds by construction); one
input dim is split by at most one grid dim (two nested splits are one split of the product size); grid dims are
numbered in the order they are first split (permuting grid dims permutes blocks, not results;
:func:`.bindings.new_dims_canonical`); an accumulator's input varies across iterations (depends on an fmap'd
iterator; summing a loop-invariant tile only multiplies it by the trip count).
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING

from gensorage.exhaustive.expr.abstract_expr import Term
from gensorage.exhaustive.expr.ties import Ties
from gensorage.exhaustive.rules.constants import carries_factor
from gensorage.exhaustive.rules.needed_ops import MARK_OPS
from gensorage.exhaustive.rules.occurrences import pending_terms
from gensorage.exhaustive.rules.rule import NO_BOUND, UNLIMITED, Bound, LastSite, Prune, Site, apply
from gensorage.exhaustive.spec import SearchSpec
from gensorage.exhaustive.walk.accumulators import accumulators
from gensorage.exhaustive.walk.finishing import finish
from gensorage.exhaustive.walk.operators import operators
from gensorage.exhaustive.walk.search_state import BlockBuild, ops_left
from gensorage.opset import Op
from gensorage.ugraph.ir import GraphDefinedOp

if TYPE_CHECKING:
    from gensorage.exhaustive.walk.walk import Walk

# Operators a tight needed-operator budget admits (see rules.needed_ops), without and with a scale counted.
TIGHT = MARK_OPS
TIGHT_SCALE = MARK_OPS | {Op.SCALE}


def block_children(s: Walk) -> Generator[None, None, None]:
    """The children of a block-level node (see the module docstring); each is applied while it is yielded."""
    b = s.state.block
    assert b is not None
    left, left_after_accumulator = ops_left(s.spec, b), ops_left(s.spec, b, 1)
    bound = NO_BOUND
    rules = s.context.rules.nodes
    if rules:
        site = last_site(s, b, left) if b.last_kernel_op else earlier_site(s, b, left)
        if site is not None:
            got = apply(rules, site)
            if isinstance(got, Prune):
                s.counters.pruned_expr += 1
                return
            if site.last:  # an earlier site's room includes later kernels: its bound says nothing of this one
                bound = got
    need = bound.need
    if need == 0:
        yield from finish(s)
    if left > 0:
        only = tight_ops(bound) if need == left else None
        yield from operators(s, b, only=only, tight=bound.tight)
    if b.looped and b.forloop is not None and 0 <= left_after_accumulator and need <= left_after_accumulator:
        yield from accumulators(s, b, bound.tight)


def tight_ops(bound: Bound) -> frozenset[Op]:
    """The operators a bound that takes every operator left admits: those that add a mark, and a ``scale`` or an
    ``add_scalar`` when the bound counts one."""
    only = TIGHT_SCALE if bound.scale else TIGHT
    return only | {Op.ADD_SCALAR} if bound.shift else only


def last_site(s: Walk, b: BlockBuild, left: int) -> Site | None:
    """The last kernel operator's block graph as the node rules see it (None where its expressions are not
    exact)."""
    return _LastSite(s, b, left) if b.exact else None


def earlier_site(s: Walk, b: BlockBuild, left: int) -> Site | None:
    """A block graph before the last kernel operator as the node rules see it: the operators the program still
    needs, and with them the reductions of the classes no tensor has, must fit what this block graph and every
    later kernel operator can still add. Later kernel operators can read any kernel tensor, so every kernel
    tensor and every tensor of this block counts as available (a superset of what they will read, so the bounds
    stay lower bounds). Only with exact expressions, and where later kernel operators are bounded: by a node
    limit, or by ``max_block_graphs`` leaving them pre-defined (else None)."""
    if (s.spec.max_block_nodes is None and not predefined_after(s)) or not b.exact:
        return None
    if b.kernel_view is None:  # the kernel tensors do not change while the block is open
        st = s.state
        b.kernel_view = (
            all(v.layout is None for v in st.val),
            [v.term for v in st.val],
            carries_factor(st.const),
            list(st.ties),
        )
    if not b.kernel_view[0]:
        return None
    return _EarlierSite(s, b, left)


def predefined_after(s: Walk) -> bool:
    """Whether the block graph in progress is the last graph-defined operator ``max_block_graphs`` allows, so
    every later kernel operator is a pre-defined one (one operator, which is at most one reduction)."""
    limit = s.spec.max_block_graphs
    return limit is not None and sum(isinstance(op, GraphDefinedOp) for op in s.state.ops) + 1 >= limit


def reduction_room(spec: SearchSpec, b: BlockBuild, left: int) -> int:
    """Operators and accumulators the block graph may still add, where a reduction can be either (see
    :mod:`gensorage.exhaustive.rules.reductions`): with a loop and a node limit, the nodes left; else the
    operators left."""
    if not b.looped:
        return left
    nodes = spec.max_block_nodes
    return UNLIMITED if nodes is None else nodes - len(b.inputs) - len(b.recs)


def block_terms(s: Walk, b: BlockBuild) -> list[Term]:
    """The expressions of every tensor of the block graph in progress (an unbound iterator: its whole input)."""
    m = len(b.inputs)
    terms = [s.state.val[b.inputs[i]].term if b.val[i] is None else b.val[i].term for i in range(m)]  # type: ignore[union-attr]
    terms.extend(v.term for v in b.val[m:])  # type: ignore[union-attr]
    return terms


def block_ties(s: Walk, b: BlockBuild) -> list[Ties | None]:
    """The index ties of every tensor of the block graph in progress (an unbound iterator: its whole input's)."""
    m = len(b.inputs)
    return [s.state.ties[b.inputs[i]] if b.ties[i] is None else b.ties[i] for i in range(m)] + b.ties[m:]


class _LastSite(LastSite):
    """The last kernel operator's block graph in progress: its outputs are the program's, from its own tensors."""

    __slots__ = ("_b", "_s", "_terms")

    def __init__(self, s: Walk, b: BlockBuild, left: int) -> None:
        self.last = True
        self.ops_room = left
        self.reduction_room = reduction_room(s.spec, b, left)
        self.factor = carries_factor(b.const)
        self.shifted = s.shifted()
        self._s, self._b = s, b
        self._terms: list[Term] | None = None

    def terms(self) -> list[Term]:
        if self._terms is None:
            self._terms = block_terms(self._s, self._b)
        return self._terms

    def ties(self) -> list[Ties | None]:
        return block_ties(self._s, self._b)

    def pending(self) -> list[Term]:
        return pending_terms(self._s.state, self._s.context.required_inputs)

    def scaled(self) -> list[Term]:
        b = self._b
        return [
            b.val[j].term  # type: ignore[union-attr]
            for j in range(len(b.inputs), len(b.shape))
            if b.scaled[j] and b.uses[j] == 0
        ]


class _EarlierSite(Site):
    """A block graph before the last kernel operator, with every later kernel operator (see :func:`earlier_site`;
    each later one is a pre-defined operator when ``max_block_graphs`` leaves no other, one node; else it reads
    a tensor, so it has at most ``max_block_nodes - 1`` more nodes)."""

    __slots__ = ("_b", "_s")

    def __init__(self, s: Walk, b: BlockBuild, left: int) -> None:
        spec = s.spec
        nodes = spec.max_block_nodes
        assert b.kernel_view is not None
        later = spec.max_kernel_ops - len(s.state.ops) - 1
        if predefined_after(s):
            each_ops = each_node = 1
        else:
            assert nodes is not None
            each_ops, each_node = min(spec.max_block_ops, nodes - 1), nodes - 1
        self.last = False
        self.ops_room = left + later * each_ops
        self.reduction_room = reduction_room(spec, b, left) + later * each_node
        self.factor = b.kernel_view[2] or carries_factor(b.const)
        self.shifted = s.shifted()
        self._s, self._b = s, b

    def terms(self) -> Sequence[Term]:
        return [*self._b.kernel_view[1], *block_terms(self._s, self._b)]  # type: ignore[index]

    def ties(self) -> Sequence[Ties | None]:
        return [*self._b.kernel_view[3], *block_ties(self._s, self._b)]  # type: ignore[index]


__all__ = [
    "TIGHT",
    "TIGHT_SCALE",
    "block_children",
    "block_terms",
    "block_ties",
    "earlier_site",
    "last_site",
    "reduction_room",
    "tight_ops",
]

"""Block-graph generation (Algorithm 1, ``GenerateNextBlockOperator``) for the graph-defined operator in progress.

The children of a block-level search node are, in this order:

1. *finishing* the block graph — once every input iterator is used and every tensor is consumed except the ones
   to save (all after the for-loop when there is one), one output saver per unconsumed tensor, for every
   assignment of the grid dims to output dims (omap); this adds the graph-defined operator to the kernel graph;
2. a new compute operator (every variant of the op set on every input tuple) in increasing canonical rank;
3. a for-loop accumulator (sum, or concatenation along a dim) of a loop-body tensor, also in rank order.

Partitions are chosen lazily: an input iterator's imap (grid dim -> data dim or replica), fmap (loop -> data
dim or none) and, when first needed, a grid dim's size or the for-loop trip count are chosen when an operator
first reads the iterator, among the choices that give a valid tile. This enumerates the same set of
(imap, fmap, block graph) combinations as choosing them all up front (Mirage's order), but a wrong partition
dies at the operator that reads it instead of being carried through every block graph. The grid's rank is
lazy too: a block graph opens with room for ``max_grid_dims`` dims, a dim exists once a binding splits an
input along it, and the finished graph has the dims that exist (at least one). So a block graph whose
bindings so far split one dim is one search state, not one per grid rank it may still reach (fixing the rank
up front walked each such state once for every rank).

Restrictions of the space, each removing only µGraphs a kept one dominates (see ``docs/search.md``): a grid dim
partitions at least one input (else all its blocks compute the same tile; here it holds by construction); one
input dim is split by at most one grid dim (two nested splits are one split of the product size); grid dims are
numbered in the order they are first split (permuting grid dims permutes blocks, not results; :func:`new_dims_canonical`); an accumulator's
input varies across iterations (depends on an fmap'd iterator; summing a loop-invariant tile only multiplies it
by the trip count).
"""

from __future__ import annotations

import itertools
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from gensorage import opset
from gensorage.exhaustive.dim_strategy import DimStrategy, fits, imap_placements
from gensorage.exhaustive.expr.abstract_expr import Term
from gensorage.exhaustive.expr.expr_arith import ExprValue
from gensorage.exhaustive.expr.ties import Ties, holds_copies, loop_concat, loop_sum, saved_ties, tile_ties
from gensorage.exhaustive.rules.constants import BARRIERS, Const, const_of, same
from gensorage.exhaustive.rules.needed_ops import MARK_OPS
from gensorage.exhaustive.rules.occurrences import pending_terms, read_again
from gensorage.exhaustive.walk.opcatalog import (
    COMMUTATIVE,
    NONLINEAR_UNARY,
    SELF_USELESS,
    OpVariant,
    out_shape,
    shape_free_term,
)
from gensorage.exhaustive.walk.provenance import Provenance, of_iterator, of_op, splits_reduced
from gensorage.exhaustive.walk.rank import ACCUMULATOR_CODE, GRAPH_DEFINED_CODE, follows, rank_key
from gensorage.exhaustive.walk.schedule_sizes import loop_candidates, size_candidates
from gensorage.exhaustive.walk.search_state import EXPR, AccumRec, BlockBuild, BlockOpRec, free_after, numel
from gensorage.opset import Op, Shape
from gensorage.ugraph.evaluate import run_block_graph
from gensorage.ugraph.ir import (
    Accumulator,
    BlockGraph,
    BlockNode,
    BlockOp,
    GraphDefinedOp,
    InputIterator,
    OutputSaver,
    Ref,
)
from gensorage.ugraph.validate import dtype_bytes

if TYPE_CHECKING:
    from gensorage.exhaustive.walk.generator import Search

# Operators a tight needed-operator budget admits (see needed_ops), without and with a scale counted.
TIGHT = MARK_OPS
TIGHT_SCALE = MARK_OPS | {Op.SCALE}
UNLIMITED = 1 << 30


@dataclass(frozen=True, slots=True)
class Binding:
    """One way to partition an input: its maps, its tile, and the sizes it chooses (grid dims, trip count)."""

    imap: tuple[int | None, ...]
    fmap: int | None
    tile: Shape
    new_grid: tuple[tuple[int, int], ...]  # (grid dim, size) chosen by this binding
    new_forloop: int | None


@lru_cache(maxsize=64)
def imap_choices(ndim: int, r: int) -> tuple[tuple[int | None, ...], ...]:
    """Every imap of an ``ndim``-d input on an ``r``-d grid (replica first; one data dim per grid dim at most)."""
    opts: tuple[int | None, ...] = (None, *range(ndim))
    out = []
    for imap in itertools.product(opts, repeat=r):
        dims = [d for d in imap if d is not None]
        if len(dims) == len(set(dims)):
            out.append(imap)
    return tuple(out)


@lru_cache(maxsize=256)
def omap_choices(ndim: int, r: int) -> tuple[tuple[int, ...], ...]:
    """Every omap: an injective map of the ``r`` grid dims to output dims."""
    return tuple(itertools.permutations(range(ndim), r))


def block_children(s: Search) -> Generator[None, None, None]:
    """The children of a block-level node (see the module docstring); each is applied while it is yielded."""
    b = s.state.block
    assert b is not None
    # Operators the last kernel operator still needs at least (see needed_ops); 0 where the bound is not applied.
    need, scale = 0, False
    tight = NOT_TIGHT
    left, left_after_accumulator = ops_left(s, b), ops_left(s, b, 1)
    marks = 0
    if b.last_kernel_op and b.exact and s.occurrences is not None:
        got = _marks_needed(s, b)
        if got is None or got > left:
            s.counters.pruned_expr += 1
            return
        marks = got
    if b.last_kernel_op and b.exact and s.needed is not None:
        terms = _terms(s, b)
        need, scale = s.needed.bound(terms, carries_factor(b.const), marks)
        if need > left or (s.reductions is not None and need + 1 > _reduction_room(s, b, left)
                           and s.reductions.needed(terms)):
            s.counters.pruned_expr += 1
            return
        # Each reduction class no tensor has yet takes a reduction of its own (see ties).
        if s.ties is not None:
            ties = _ties(s, b)
            want, room = need + s.ties.missing(ties), _reduction_room(s, b, left)
            if want > room:
                s.counters.pruned_expr += 1
                return
            if want == room and TIGHT_RULE:
                tight = TIGHT_KNOWN if all(t is not None and t.known for t in ties) else TIGHT_ANY
    elif not b.last_kernel_op and s.needed is not None and _cannot_reach(s, b, left):
        s.counters.pruned_expr += 1
        return
    if need == 0:
        yield from _finish(s)
    if left > 0:
        yield from _operators(s, b, only=(TIGHT_SCALE if scale else TIGHT) if need == left else None, tight=tight)
    if b.looped and b.forloop is not None and 0 <= left_after_accumulator and need <= left_after_accumulator:
        yield from _accumulators(s, b, tight)


# When the needed marks plus the missing reduction classes take every node left (see ties), a child that adds
# neither a mark nor a class is pruned at once unless one of its tensors has unknown ties (missing then counts 0).
# A repeat or a concatenating accumulator adds neither, and keeps its operand's ties known, so such children are
# not generated: with every tensor known (TIGHT_KNOWN), only where the operand is an iterator whose new tile has
# unknown ties; with one unknown already (TIGHT_ANY: the missing count is 0 and the marks alone take every node),
# never.
NOT_TIGHT, TIGHT_KNOWN, TIGHT_ANY = 0, 1, 2
TIGHT_RULE = True  # tests switch it off to check that it keeps every candidate
NO_CLASS_OPS = frozenset({Op.REPEAT})


def _cannot_reach(s: Search, b: BlockBuild, left: int) -> bool:
    """For a block graph that is not the last kernel operator: whether the operators the program still needs
    (see needed_ops), and with them the reductions of the classes no tensor has (see ties), exceed what this
    block graph and every later kernel operator can still add. Later kernel operators can read any kernel
    tensor, so every kernel tensor and every tensor of this block counts as available (a superset of what
    they will read, so the bound stays a lower bound). Applied with a node limit and exact expressions only."""
    nodes = s.spec.max_block_nodes
    if nodes is None or not b.exact:
        return False
    if b.kernel_view is None:  # the kernel tensors do not change while the block is open
        st = s.state
        b.kernel_view = (all(v.layout is None for v in st.val), [v.term for v in st.val], carries_factor(st.const),
                         list(st.ties))
    exact, kernel_terms, kernel_factor, kernel_ties = b.kernel_view
    if not exact:
        return False
    later = s.spec.max_kernel_ops - len(s.state.ops) - 1  # each reads a tensor: at most nodes - 1 more nodes
    factor = kernel_factor or carries_factor(b.const)
    need = s.needed.bound([*kernel_terms, *_terms(s, b)], factor)[0]  # type: ignore[union-attr]
    if need > left + later * min(s.spec.max_block_ops, nodes - 1):
        return True
    if s.ties is None:
        return False
    missing = s.ties.missing([*kernel_ties, *_ties(s, b)])
    return need + missing > _reduction_room(s, b, left) + later * (nodes - 1)


def _marks_needed(s: Search, b: BlockBuild) -> int | None:
    """For the last kernel operator: None if its outputs cannot have the program outputs' occurrence counts,
    outside marks too, with this block graph's tensors as the leaves of their trees; else a lower bound on the
    mark operators it still needs (see :meth:`.occurrences.OccurrenceBudget.completable`)."""
    # A scale's result is read only by a non-linear unary operator (a mark) or saved (see opcatalog); one
    # that is not a whole program output by its counts ends under a mark.
    occ = s.occurrences
    assert occ is not None
    m = len(b.inputs)
    scaled = [b.val[j].term for j in range(m, len(b.shape))  # type: ignore[union-attr]
              if b.scaled[j] and b.uses[j] == 0]
    under = [t for t in scaled if occ.count(t) not in occ.output_counts]
    return occ.completable(pending_terms(s.state, s.required_inputs), _terms(s, b), under)


def _reduction_room(s: Search, b: BlockBuild, left: int) -> int:
    """Operators and accumulators the block graph may still add, where a reduction can be either (see
    :mod:`.reductions`): with a loop and a node limit, the nodes left; else the operators left."""
    if not b.looped:
        return left
    nodes = s.spec.max_block_nodes
    return UNLIMITED if nodes is None else nodes - len(b.inputs) - len(b.recs)


def _terms(s: Search, b: BlockBuild) -> list[Term]:
    """The expressions of every tensor of the block graph in progress (an unbound iterator: its whole input)."""
    m = len(b.inputs)
    terms = [s.state.val[b.inputs[i]].term if b.val[i] is None else b.val[i].term for i in range(m)]  # type: ignore[union-attr]
    terms.extend(v.term for v in b.val[m:])  # type: ignore[union-attr]
    return terms


def _ties(s: Search, b: BlockBuild) -> list[Ties | None]:
    """The index ties of every tensor of the block graph in progress (an unbound iterator: its whole input's)."""
    m = len(b.inputs)
    return [s.state.ties[b.inputs[i]] if b.ties[i] is None else b.ties[i] for i in range(m)] + b.ties[m:]


def ops_left(s: Search, b: BlockBuild, extra_nodes: int = 0) -> int:
    """Compute operators the block graph may still add (after ``extra_nodes`` more accumulators): the
    ``max_block_ops`` budget, and Mirage's ``max_block_nodes`` (iterators, operators and accumulators) if set."""
    left = s.spec.max_block_ops - b.n_ops
    nodes = s.spec.max_block_nodes
    if nodes is not None:
        left = min(left, nodes - len(b.inputs) - len(b.recs) - extra_nodes)
    return left


# ------------------------------------------------------------------------------------------ bindings


def _bindings(s: Search, b: BlockBuild, i: int) -> tuple[Binding, ...]:
    """Every way to bind iterator ``i`` given the sizes chosen so far (see :func:`binding_options`)."""
    key = (i, False, tuple(b.grid), b.forloop)
    got = b.bindings_memo.get(key)
    if got is None:
        got = b.bindings_memo[key] = binding_options(*_binding_args(s, b, i))
    return got  # type: ignore[return-value]


def _binding_groups(s: Search, b: BlockBuild, i: int) -> tuple[tuple[Shape, tuple[Binding, ...]], ...]:
    """:func:`_bindings` grouped by the tile they give, in first-seen order."""
    key = (i, True, tuple(b.grid), b.forloop)
    got = b.bindings_memo.get(key)
    if got is None:
        got = b.bindings_memo[key] = binding_groups(*_binding_args(s, b, i))
    return got  # type: ignore[return-value]


def _binding_args(s: Search, b: BlockBuild, i: int) -> tuple:  # type: ignore[type-arg]
    shape = s.state.shape[b.inputs[i]]
    hints = tuple(sorted({d for k, t in enumerate(b.inputs) if k != i for d in s.state.shape[t]}))
    splits = s.output_splits if b.last_kernel_op else None
    return (shape, b.r, tuple(b.grid), b.looped, b.forloop, s.spec.schedule, hints, splits, s.spec.canonical,
            s.spec.dims)


@lru_cache(maxsize=1 << 16)
def binding_options(shape: Shape, r: int, grid: tuple[int | None, ...], looped: bool, forloop: int | None,
                    mode: str, hints: tuple[int, ...], splits: frozenset[int] | None,
                    canonical: bool = False, dims: DimStrategy | None = None) -> tuple[Binding, ...]:
    """Every binding of an input of ``shape`` on an ``r``-d grid whose sizes so far are ``grid`` (None: not
    chosen), a pure function of its arguments and therefore cached: the search asks the same question for
    every operator that reads the iterator first. ``splits``: for the last kernel operator, the block counts
    that divide a program output dim (its blocks tile the outputs). ``canonical``: grid dims are numbered in
    the order they are first split (see :func:`new_dims_canonical`). ``dims``: only the imaps and fmaps the
    strategy lists (each imap on its own; :func:`_admitted` checks the iterators' imaps together)."""
    out: list[Binding] = []
    chosen_count = sum(1 for g in grid if g is not None)
    fmaps = dims.allowed_fmaps() if dims is not None else None
    for imap in imap_choices(len(shape), r):
        if dims is not None and not fits(dims, r, (imap,)):
            continue
        unknown = [g for g in range(r) if imap[g] is not None and grid[g] is None]
        if canonical and not new_dims_canonical(imap, unknown, chosen_count):
            continue
        if any(imap[g] is not None and grid[g] is not None and shape[imap[g]] % grid[g]  # type: ignore[index,operator]
               for g in range(r)):
            continue
        choices = [size_candidates(shape[imap[g]], mode, hints) for g in unknown]  # type: ignore[index]
        if splits is not None:
            choices = [tuple(c for c in cs if c in splits) for cs in choices]
        for sizes in itertools.product(*choices):
            chosen = dict(zip(unknown, sizes, strict=True))
            tile = list(shape)
            for g, d in enumerate(imap):
                if d is not None:
                    tile[d] //= chosen.get(g) or grid[g]  # type: ignore[operator]
            new_grid = tuple(chosen.items())
            if fmaps is None or None in fmaps:
                out.append(Binding(imap, None, tuple(tile), new_grid, None))
            if not looped:
                continue
            for d in range(len(tile)):
                if tile[d] < 2 or (fmaps is not None and d not in fmaps):
                    continue
                if forloop is not None:
                    if tile[d] % forloop == 0:
                        out.append(Binding(imap, d, _split(tile, d, forloop), new_grid, None))
                    continue
                for f in loop_candidates(tile[d], mode):
                    out.append(Binding(imap, d, _split(tile, d, f), new_grid, f))
    return tuple(out)


def new_dims_canonical(imap: tuple[int | None, ...], new: list[int], chosen_count: int) -> bool:
    """Grid dims permute blocks, not results, so one numbering per µGraph is kept: grid dims are numbered in
    the order bindings first split them (bindings happen in a fixed order: operators are added in canonical
    rank, and each binds its unbound operands in operand order), and the dims one binding introduces in the
    order of the data dims they split. So the dims chosen so far are always ``0 .. chosen_count - 1`` and the
    new ones must be the next ones, mapped to increasing data dims."""
    if new != list(range(chosen_count, chosen_count + len(new))):
        return False
    dims = [imap[g] for g in new]
    return all(a < b for a, b in itertools.pairwise(dims))  # type: ignore[operator]


@lru_cache(maxsize=1 << 16)
def binding_groups(*args: object) -> tuple[tuple[Shape, tuple[Binding, ...]], ...]:
    """:func:`binding_options` grouped by tile, in first-seen order."""
    groups: dict[Shape, list[Binding]] = {}
    for bd in binding_options(*args):  # type: ignore[arg-type]
        groups.setdefault(bd.tile, []).append(bd)
    return tuple((tile, tuple(bds)) for tile, bds in groups.items())


def _split(tile: list[int], d: int, parts: int) -> Shape:
    out = list(tile)
    out[d] //= parts
    return tuple(out)


def _apply_binding(s: Search, b: BlockBuild, i: int, bd: Binding) -> None:
    for g, size in bd.new_grid:
        b.grid[g] = size
    if bd.new_forloop is not None:
        b.forloop = bd.new_forloop
    b.imap[i] = bd.imap
    b.fmap[i] = bd.fmap
    b.shape[i] = bd.tile
    # The grid sizes of the dims bd splits and the trip count (when it has an fmap) follow from bd and forloop.
    key = (i, bd, b.forloop if bd.fmap is not None else None)
    got = b.bound_tiles.get(key)
    if got is None:
        got = b.bound_tiles[key] = _tile_of(s, b, i, bd)
    b.val[i], b.ties[i], b.prov[i] = got
    b.fdep[i] = bd.fmap is not None
    b.smem += numel(bd.tile) * dtype_bytes(b.dtype[i])


def _tile_of(s: Search, b: BlockBuild, i: int, bd: Binding) -> tuple[ExprValue, Ties | None, Provenance]:
    """Iterator ``i``'s tile under binding ``bd`` (already applied to the grid and loop): its expression, index
    ties and provenance."""
    value = s.state.val[b.inputs[i]]
    for g, d in enumerate(bd.imap):
        if d is not None:
            value = EXPR.slice(value, d, 0, value.shape[d] // b.grid[g])  # type: ignore[operator]
    if bd.fmap is not None:
        value = EXPR.slice(value, bd.fmap, 0, bd.tile[bd.fmap])
    kernel_ties = s.state.ties[b.inputs[i]]
    ties = None
    if kernel_ties is not None:
        ties = tile_ties(kernel_ties, bd.imap, bd.fmap, bd.tile, b.grid, b.forloop)  # type: ignore[arg-type]
    return value, ties, of_iterator(i, len(bd.tile))


def _undo_binding(b: BlockBuild, i: int, bd: Binding) -> None:
    b.smem -= numel(bd.tile) * dtype_bytes(b.dtype[i])
    for g, _ in bd.new_grid:
        b.grid[g] = None
    if bd.new_forloop is not None:
        b.forloop = None
    b.imap[i] = None
    b.fmap[i] = None
    b.shape[i] = None
    b.val[i] = None
    b.ties[i] = None
    b.fdep[i] = False
    b.prov[i] = None


def split_origins(b: BlockBuild) -> frozenset[tuple[int, int]]:
    """The (iterator, input dim) pairs a grid dim splits."""
    return frozenset((i, d) for i, imap in enumerate(b.imap) if imap is not None for d in imap if d is not None)


def _bind_then_apply(s: Search, b: BlockBuild, ins: tuple[int, ...], head: tuple[tuple[int, ...], tuple[int, ...]],
                     variants: list[OpVariant], post: bool, pending: tuple[int, ...],
                     known_tiles_pruned: bool = False) -> Iterator[None]:
    """Bind the iterators in ``pending`` (every combination of their options), then apply ``variants``.

    The last iterator's options are grouped by the tile they give: the operator's shape rules and the memory
    check depend only on the tiles, so a group no variant accepts, or whose tile does not fit, is skipped whole,
    and (for exact expressions) the variants' results are computed once per group. A binding whose imap no
    placement of the dim strategy admits together with the other iterators' is skipped before it is applied
    (see :func:`_admitted`). ``known_tiles_pruned``: see :data:`TIGHT_KNOWN`.
    """
    i, rest = pending[0], pending[1:]
    limit = s.hw.shared_mem_per_block
    elem = dtype_bytes(b.dtype[i])
    if rest:
        bindings = _bindings(s, b, i)
        for bd, ok in zip(bindings, _admitted(s, b, i, bindings), strict=True):
            if b.smem + numel(bd.tile) * elem > limit:
                s.counters.pruned_memory += 1
            elif ok:
                _apply_binding(s, b, i, bd)
                try:
                    yield from _bind_then_apply(s, b, ins, head, variants, post, rest, known_tiles_pruned)
                finally:
                    _undo_binding(b, i, bd)
        return
    counters = s.counters
    groups = _binding_groups(s, b, i)
    plan, trailing = _group_plan(s, b, i, ins, variants, groups)
    admitted = _admitted_groups(s, b, i, groups)
    for pruned_shape, g, valid in plan:
        counters.pruned_shape += pruned_shape
        tile, bindings = groups[g]
        if b.smem + numel(tile) * elem > limit:
            counters.pruned_memory += len(bindings)
            continue
        members = admitted[g]
        if not members:
            continue
        memo: dict[int, Applied] = {}
        if b.exact and s.state.val[b.inputs[i]].layout is None:  # type: ignore[union-attr]
            checked = _group_checked(s, b, ins, i, tile, valid, memo)
            counters.pruned_expr += (len(valid) - len(checked)) * len(members)
            if not checked:
                continue
            valid = checked
        for bd in members:
            _apply_binding(s, b, i, bd)
            try:
                yield from _apply_variants(s, b, ins, head, valid, post, memo, known_tiles_pruned)
            finally:
                _undo_binding(b, i, bd)
    counters.pruned_shape += trailing


def _group_checked(s: Search, b: BlockBuild, ins: tuple[int, ...], i: int, tile: Shape, valid: list[OpVariant],
                   memo: dict[int, Applied]) -> list[OpVariant]:
    """In an exact block graph, the variants on the tiles of a binding group that the budget allows and whose
    expression passes the checks, before any binding of the group is applied: an iterator's tile expression is
    its input's term with the tile's shape, whichever binding gives the tile. Fills ``memo`` as
    :func:`_apply_variants` would; variants the budget or a scaled operand excludes are left to it."""
    term = s.state.val[b.inputs[i]].term  # type: ignore[union-attr]
    values = [ExprValue(tile, term) if k == i else b.val[k] for k in ins]
    shapes = [tile if k == i else b.shape[k] for k in ins]
    provs = [of_iterator(i, len(tile)) if k == i else b.prov[k] for k in ins]
    reads_scaled = any(b.scaled[k] for k in ins)
    first_const = b.const[ins[0]]
    out = []
    for v in valid:
        if not s.allowed(v) or (reads_scaled and v.op not in NONLINEAR_UNARY):
            out.append(v)
            continue
        shape = out_shape(v, shapes)  # type: ignore[arg-type]
        assert shape is not None  # valid: the shape rules accept the group's tiles
        value = _expr(s, v, values)  # type: ignore[arg-type]
        if (not s.spec.prune or s.oracle.is_subexpr(value.term)) and _factor_ok(s, v, value.term, first_const):
            memo[v.code] = [shape, of_op(v.op, v.attrs, provs, shapes), value, True]  # type: ignore[arg-type]
            out.append(v)
    return out


def _expr(s: Search, v: OpVariant, values: Sequence[ExprValue]) -> ExprValue:
    """The expression of ``v`` on operands ``values``, memoised per process."""
    key = (v.code, *values)
    value = s.expr_memo.get(key)
    if value is None:
        value = opset.apply(v.op, EXPR, values, v.attrs)  # type: ignore[arg-type,misc]
        _remember(s.expr_memo, key, value)
    return value  # type: ignore[return-value]


Groups = tuple[tuple[Shape, tuple[Binding, ...]], ...]
# One entry of a group plan: the shape-pruned count of the groups skipped before it, the group's index, and the
# variants its tiles accept.
GroupEntry = tuple[int, int, list[OpVariant]]


def _group_plan(s: Search, b: BlockBuild, i: int, ins: tuple[int, ...], variants: list[OpVariant],
                groups: Groups) -> tuple[tuple[GroupEntry, ...], int]:
    """The binding groups of iterator ``i`` that some variant accepts, and the shape-pruned count of the groups
    after the last of them: a pure function of the groups, the variants and the other operands' tiles, memoised
    per process."""
    codes = tuple(v.code for v in variants)
    others = tuple(None if k == i else b.shape[k] for k in ins)
    key = (id(groups), codes, others)
    got = s.plan_memo.get(key)
    if got is not None and got[0] is groups:  # the groups object is held, so its id is not reused
        return got[1]  # type: ignore[return-value]
    plan: list[GroupEntry] = []
    skipped = 0
    for g, (tile, bindings) in enumerate(groups):
        shapes = tuple(tile if k == i else b.shape[k] for k in ins)
        valid = s.valid_variants(variants, shapes)  # type: ignore[arg-type]
        skipped += (len(variants) - len(valid)) * len(bindings)
        if valid:
            plan.append((skipped, g, valid))
            skipped = 0
    out = (tuple(plan), skipped)
    _remember(s.plan_memo, key, (groups, out))
    return out


def _admitted_groups(s: Search, b: BlockBuild, i: int, groups: Groups) -> tuple[tuple[Binding, ...], ...]:
    """Per group, the bindings of iterator ``i`` that the dim strategy admits with the other iterators' imaps
    (see :func:`_admitted`), memoised per process."""
    if s.spec.dims is None:
        return tuple(bds for _, bds in groups)
    dims = s.spec.dims
    others = _other_placements(dims, b, i)
    key = (id(groups), others)
    got = s.admit_memo.get(key)
    if got is not None and got[0] is groups:
        return got[1]  # type: ignore[return-value]
    out = tuple(tuple(bd for bd, ok in zip(bds, _admits(dims, b.r, others, bds), strict=True) if ok)
                for _, bds in groups)
    _remember(s.admit_memo, key, (groups, out))
    return out


def _remember(memo: dict[tuple[object, ...], Any], key: tuple[object, ...], value: object) -> None:
    if len(memo) >= MAX_PLAN_ENTRIES:
        memo.clear()
    memo[key] = value


MAX_PLAN_ENTRIES = 200_000  # entries of each walk memo (plans, admitted bindings, expressions) before it starts afresh


def _admitted(s: Search, b: BlockBuild, i: int, bindings: tuple[Binding, ...]) -> tuple[bool, ...]:
    """For each binding of iterator ``i``: whether some placement of the grid dims makes its imap and the other
    bound iterators' imaps listed ones (always, without a dim strategy)."""
    dims = s.spec.dims
    if dims is None:
        return (True,) * len(bindings)
    return _admits(dims, b.r, _other_placements(dims, b, i), bindings)


def _admits(dims: DimStrategy, r: int, others: int, bindings: tuple[Binding, ...]) -> tuple[bool, ...]:
    """Whether each binding's imap shares a placement with ``others`` (see :func:`_other_placements`)."""
    return tuple(bool(imap_placements(dims, r, bd.imap) & others) for bd in bindings)


def _other_placements(dims: DimStrategy, b: BlockBuild, i: int) -> int:
    """The placements under which every bound iterator but ``i`` has a listed imap (bits; see
    :func:`.dim_strategy.imap_placements`)."""
    out = -1
    for k, m in enumerate(b.imap):
        if k != i and m is not None:
            out &= imap_placements(dims, b.r, m)
    return out


# ----------------------------------------------------------------------------------------- operators


def input_tuples(v: OpVariant, n: int, low: int) -> Iterator[tuple[int, ...]]:
    """Input tuples of ``v`` whose largest index is at least ``low`` (the canonical rank can only grow)."""
    if v.arity == 1:
        for a in range(low, n):
            yield (a,)
        return
    for hi in range(low, n):
        for lo in range(hi + 1):
            if lo == hi and v.op in SELF_USELESS:
                continue
            yield (lo, hi)
            if lo != hi and v.op not in COMMUTATIVE:
                yield (hi, lo)


def operand_tuples(b: BlockBuild, low: int, need: int) -> Iterator[tuple[tuple[int, ...], tuple[int, ...]]]:
    """``(operands, operands sorted decreasingly)`` of every candidate operator: one or two tensors, the largest
    index at least ``low`` (the canonical rank only grows), at least ``need`` of them distinct and unconsumed
    (fewer could not let the block graph finish within its operator budget; see ``BlockBuild.viable``)."""
    n = len(b.shape)
    uses = b.uses
    if need <= 1:
        for a in range(low, n):
            if need <= 0 or uses[a] == 0:
                yield (a,), (a,)
    for hi in range(low, n):
        hi_free = uses[hi] == 0
        for lo in range(hi + 1):
            if need > 0:
                fresh = int(hi_free) + int(lo != hi and uses[lo] == 0)
                if fresh < need:
                    continue
            yield (lo, hi), (hi, lo)
            if lo != hi:
                yield (hi, lo), (hi, lo)


def variants_for(s: Search, ins: tuple[int, ...]) -> tuple[OpVariant, ...]:
    """The operator variants that take operand tuple ``ins`` (see :class:`~.generator.Search`)."""
    if len(ins) == 1:
        return s.unary
    if ins[0] == ins[1]:
        return s.binary_self
    return s.binary if ins[0] < ins[1] else s.binary_ordered


def _operators(s: Search, b: BlockBuild, only: frozenset[Op] | None = None, tight: int = NOT_TIGHT) -> Iterator[None]:
    """Every compute operator child; ``only``: the operator budget is exactly what the needed marks take, so
    only operators that can add one (exp, sqrt, activations, div; a scale when the bound counts one) may be
    added."""
    canonical = s.spec.canonical
    last = b.keys[-1] if b.keys else None
    low = last[0][0] if (last is not None and canonical) else 0
    # free' = free + 1 - (fresh operands) must stay <= max_outputs + operators left after this one.
    need = b.free + 1 - (b.max_outputs + ops_left(s, b) - 1)
    if need > 2:
        return
    last_head = last[:2] if (last is not None and canonical) else None
    reads_ok = s.reads_checker()
    uses = b.uses
    for ins, desc in operand_tuples(b, low, need):
        head = (desc, ins)
        min_code = -1
        if last_head is not None:
            if head < last_head:
                continue
            if head == last_head:
                min_code = last[2]  # type: ignore[index]
        post = b.post[ins[0]]
        if len(ins) == 2 and b.post[ins[1]] != post:
            continue
        # Reading only unconsumed, distinct operands reads nothing again (the common case: no check needed).
        again = uses[ins[0]] > 0 or (len(ins) == 2 and (ins[0] == ins[1] or uses[ins[1]] > 0))
        if again and not reads_ok(_read_again(s, b, ins)):
            continue
        variants = [v for v in variants_for(s, ins) if v.code > min_code and (only is None or v.op in only)]
        if not variants:
            continue
        pending = tuple(i for i in dict.fromkeys(ins) if b.shape[i] is None)
        if tight == TIGHT_ANY or (tight == TIGHT_KNOWN and not pending):
            kept = [v for v in variants if v.op not in NO_CLASS_OPS]
            s.counters.pruned_expr += len(variants) - len(kept)
            variants = kept
            if not variants:
                continue
        if pending and b.exact and s.spec.prune:
            variants = _shape_free_prefilter(s, b, ins, variants)
            if not variants:
                continue
        if pending:
            yield from _bind_then_apply(s, b, ins, head, variants, post, pending, tight == TIGHT_KNOWN)
        else:
            yield from _apply_variants(s, b, ins, head, variants, post)


def _tensor_term(s: Search, b: BlockBuild, i: int) -> Term:
    """The expression of block tensor ``i`` (an unbound iterator: its whole input's)."""
    v = b.val[i] if b.val[i] is not None else s.state.val[b.inputs[i]]
    return v.term  # type: ignore[union-attr]


def _factor_ok(s: Search, v: OpVariant, term: Term, arg: Const) -> bool:
    """Whether an operator's argument carries a factor the program's operator of its class does (only exp,
    silu and gelu are checked; see :mod:`.constants`)."""
    return v.op not in BARRIERS or s.exp_consts is None or s.exp_consts.admits(term, arg)


def carries_factor(consts: Sequence[Const]) -> bool:
    """Whether some tensor carries a constant factor (or one that is not known): see :mod:`.needed_ops`."""
    return any(c is None or not same(c, 1.0) for c in consts)


def _read_again(s: Search, b: BlockBuild, ins: tuple[int, ...]) -> list[Term]:
    """The operands ``ins`` reads a further time (see :func:`.occurrences.read_again`)."""
    return read_again(ins, lambda i: b.uses[i] == 0, lambda i: _tensor_term(s, b, i))


def _shape_free_prefilter(s: Search, b: BlockBuild, ins: tuple[int, ...],
                          variants: list[OpVariant]) -> list[OpVariant]:
    """Drop the variants whose expression does not depend on tile sizes and fails the oracle, before binding."""
    terms = [(b.val[i] if b.val[i] is not None else s.state.val[b.inputs[i]]).term for i in ins]  # type: ignore[union-attr]
    kept = []
    for v in variants:
        term = shape_free_term(v.op, terms)
        if term is not None and not s.oracle.is_subexpr(term):
            s.counters.pruned_expr += 1
            continue
        if term is not None and not _factor_ok(s, v, term, b.const[ins[0]]):
            s.counters.pruned_expr += 1
            continue
        kept.append(v)
    return kept


# What an operator variant gives on a binding group's tiles (see _apply_variants): its output shape, provenance,
# and, once computed, its expression and whether it passes the expression checks.
Applied = list  # [Shape, Provenance, ExprValue | None, bool]


def _apply_variants(s: Search, b: BlockBuild, ins: tuple[int, ...], head: tuple[tuple[int, ...], tuple[int, ...]],
                    variants: list[OpVariant], post: bool, memo: dict[int, Applied] | None = None,
                    known_tiles_pruned: bool = False) -> Iterator[None]:
    """Push each variant on operands ``ins`` that passes the checks. ``memo`` is shared by the bindings of one
    binding group: their operands have the same tiles, provenance and constant factors (only imaps, fmaps and
    index ties differ), so a variant's output shape and provenance, and in an exact block graph its expression
    and the checks on it, are computed once per group. ``known_tiles_pruned``: a repeat whose operands' ties are
    all known is pruned (see :data:`TIGHT_KNOWN`)."""
    counters = s.counters
    limit = s.hw.shared_mem_per_block
    shapes = [b.shape[i] for i in ins]
    values = [b.val[i] for i in ins]
    fdep = any(b.fdep[i] for i in ins)
    elem = dtype_bytes(b.dtype[ins[0]])
    reads_scaled = any(b.scaled[i] for i in ins)
    consts = [b.const[i] for i in ins]
    split = s.split_origins(b) if (b.last_kernel_op and s.split_rule) else None
    exact_prune = s.spec.prune and b.exact
    known = known_tiles_pruned and all((t := b.ties[i]) is not None and t.known for i in ins)
    caps = s.element_caps if exact_prune else None
    spread = _spread(b, fdep) if caps is not None else 1
    for v in variants:
        if not s.allowed(v):
            continue
        if reads_scaled and v.op not in NONLINEAR_UNARY:
            continue
        if known and v.op in NO_CLASS_OPS:
            counters.pruned_expr += 1
            continue
        got = memo.get(v.code) if memo is not None else None
        if got is None:
            out = out_shape(v, shapes)  # type: ignore[arg-type]
            if out is None:
                counters.pruned_shape += 1
                continue
            got = [out, of_op(v.op, v.attrs, [b.prov[i] for i in ins], shapes), None, True]  # type: ignore[arg-type]
            if memo is not None:
                memo[v.code] = got
        out, prov, value, keep = got
        if split and splits_reduced(prov, split):
            counters.pruned_shape += 1
            continue
        if value is None:
            value = _expr(s, v, values)  # type: ignore[arg-type]
            keep = not exact_prune or s.oracle.is_subexpr(value.term)
            keep = keep and (not b.exact or _factor_ok(s, v, value.term, consts[0]))
            if b.exact:  # elsewhere a tile's expression depends on more than its shape (see the module docstring)
                got[2], got[3] = value, keep
        if not keep or (caps is not None and not caps.admits(numel(out) * spread, value.term)):
            counters.pruned_expr += 1
            continue
        if b.smem + numel(out) * elem > limit:
            counters.pruned_memory += 1
            continue
        ties = None
        if s.ties is not None:
            ties = opset.apply(v.op, s.ties.arith, [b.ties[i] for i in ins], v.attrs)  # type: ignore[misc]
            if not s.ties.admits(ties):
                counters.pruned_expr += 1
                continue
        s.state.push_block(BlockOpRec(v, ins), (*head, v.code, ()), out, value, post, fdep, prov,
                           const_of(v.op, v.attrs, consts), v.op is Op.SCALE, ties)
        s.spend(v, 1)
        try:
            yield
        finally:
            s.spend(v, -1)
            s.state.pop_block()


def _spread(b: BlockBuild, fdep: bool) -> int:
    """What a block tensor's element count is multiplied by on its way to a kernel tensor, at least: the grid
    sizes chosen so far, and the trip count for a tensor that varies across iterations (it is accumulated); see
    :mod:`.element_counts`."""
    out = 1
    for size in b.grid:
        if size is not None:
            out *= size
    if fdep and b.forloop is not None:
        out *= b.forloop
    return out


def _accumulators(s: Search, b: BlockBuild, tight: int = NOT_TIGHT) -> Iterator[None]:
    last = b.keys[-1] if b.keys else None
    low = last[0][0] if (last is not None and s.spec.canonical) else 0
    forloop = b.forloop
    assert forloop is not None
    limit = s.hw.shared_mem_per_block
    reads_ok = s.reads_checker()
    for j in range(low, len(b.shape)):
        shape = b.shape[j]
        if shape is None or b.post[j] or not b.fdep[j] or b.scaled[j]:
            continue
        if not b.viable(free_after(b, (j,)), 0, ops_left(s, b, 1)):
            continue
        if not reads_ok(_read_again(s, b, (j,))):
            continue
        for fmap in (None, *range(len(shape))):
            key = rank_key((j,), ACCUMULATOR_CODE, (-1 if fmap is None else fmap,))
            if s.spec.canonical and not follows(last, key):
                continue
            if fmap is not None and tight != NOT_TIGHT:  # a concatenation adds no class (see TIGHT_KNOWN)
                s.counters.pruned_expr += 1
                continue
            x = b.val[j]
            assert x is not None
            if fmap is None:
                value = None
                for _ in range(forloop):
                    value = EXPR.accumulate(value, x, "sum")
                out = shape
            else:
                value = EXPR.concat([x] * forloop, fmap)
                out = shape[:fmap] + (shape[fmap] * forloop,) + shape[fmap + 1:]
            assert value is not None
            if s.spec.prune and b.exact and not s.oracle.is_subexpr(value.term):
                s.counters.pruned_expr += 1
                continue
            if b.smem + numel(out) * dtype_bytes(b.dtype[j]) > limit:
                s.counters.pruned_memory += 1
                continue
            ties = None
            xt = b.ties[j]
            if xt is not None and s.ties is not None:
                ties = loop_sum(xt) if fmap is None else loop_concat(xt, forloop, fmap)
                if fmap is None and not s.ties.admits(ties):
                    s.counters.pruned_expr += 1
                    continue
            s.state.push_block(AccumRec(j, fmap), key, out, value, True, False, b.prov[j] if fmap is None else None,
                               b.const[j], ties=ties)
            try:
                yield
            finally:
                s.state.pop_block()


# ------------------------------------------------------------------------------------------ finishing


def live_dims(b: BlockBuild) -> tuple[int, ...]:
    """The grid dims that exist: those a binding has split an input along (see the module docstring)."""
    return tuple(g for g, size in enumerate(b.grid) if size is not None)


def live_imaps(b: BlockBuild) -> tuple[tuple[int | None, ...], ...]:
    """The iterators' imaps over the existing grid dims only (every iterator bound)."""
    live = live_dims(b)
    return tuple(tuple(m[g] for g in live) for m in b.imap)  # type: ignore[index]


def block_nodes(b: BlockBuild) -> list[BlockNode]:
    """Iterators and operators of the block graph in progress (no savers; every iterator bound)."""
    imaps = live_imaps(b)
    nodes: list[BlockNode] = [InputIterator(i, imaps[i], b.fmap[i]) for i in range(len(b.inputs))]
    for rec in b.recs:
        if isinstance(rec, BlockOpRec):
            nodes.append(BlockOp(rec.variant.op, tuple(Ref(i) for i in rec.inputs), rec.variant.attrs))
        else:
            nodes.append(Accumulator(Ref(rec.input), "sum", rec.fmap))
    return nodes


def finishable(s: Search, b: BlockBuild) -> list[int] | None:
    """The tensors the block graph would save if finished now, or None when it cannot finish yet."""
    m = len(b.inputs)
    if b.n_ops == 0 or any(b.shape[i] is None or b.uses[i] == 0 for i in range(m)):
        return None
    if not live_dims(b):
        return None  # no grid dim yet (a block graph has one at least)
    outs = [j for j in range(m, len(b.shape)) if b.uses[j] == 0]
    if not 1 <= len(outs) <= b.max_outputs:
        return None
    if b.looped and not all(b.post[j] for j in outs):
        return None
    return outs


def _finish(s: Search) -> Iterator[None]:
    st = s.state
    b = st.block
    assert b is not None
    outs = finishable(s, b)
    if outs is None:
        return
    nodes = block_nodes(b)
    live = live_dims(b)
    grid = tuple(size for size in b.grid if size is not None)
    imaps = live_imaps(b)
    forloop = b.forloop or 1
    refs = tuple(st.ref[t] for t in b.inputs)
    body = _body_key(b, grid, imaps, forloop)
    for omaps in itertools.product(*(omap_choices(len(b.shape[j]), len(live)) for j in outs)):  # type: ignore[arg-type]
        if b.last_kernel_op and not _final_shapes_ok(s, b, outs, omaps, grid):
            continue
        if s.spec.dims is not None and not fits(s.spec.dims, len(live), imaps, omaps):
            continue
        key = rank_key(b.inputs, GRAPH_DEFINED_CODE, (*body, tuple(outs), omaps))
        if s.spec.canonical and not follows(st.last_key, key):
            continue
        savers = [OutputSaver(Ref(j), om) for j, om in zip(outs, omaps, strict=True)]
        block = BlockGraph(grid, forloop, (*nodes, *savers))
        results = _outputs(s, b, block, outs, omaps)
        if results is None:
            continue
        if not b.last_kernel_op and not _counts_ok(s, results):
            s.counters.pruned_expr += 1
            continue
        ties: list[Ties | None] | None = None
        if s.ties is not None:
            ties = [saved_ties(b.ties[j], om, grid, live)  # type: ignore[arg-type]
                    for j, om in zip(outs, omaps, strict=True)]
            if (not s.spec.replicated_writes and not b.last_kernel_op
                    and any(t is not None and holds_copies(t) for t in ties)):
                continue
        st.close_block()
        st.push_kernel(GraphDefinedOp(block, refs), key, b.inputs, results, [b.const[j] for j in outs], ties=ties)
        try:
            yield
        finally:
            st.pop_kernel(b.inputs)
            st.block = b


def _counts_ok(s: Search, results: list[tuple[Shape, str, ExprValue]]) -> bool:
    """Whether each kernel tensor a block graph writes has no more elements than a µGraph equal to the program
    can reduce to its outputs (see :mod:`.element_counts`)."""
    caps = s.element_caps
    return caps is None or all(v.layout is not None or caps.admits(numel(shape), v.term) for shape, _, v in results)


def _body_key(b: BlockBuild, grid: tuple[int, ...], imaps: tuple[tuple[int | None, ...], ...],
              forloop: int) -> tuple[object, ...]:
    """The block graph without its savers as a tuple of ints (an injective attribute key for its rank; cheaper
    than the block's text and totally ordered, None written as -1)."""
    maps = tuple(tuple(-1 if d is None else d for d in m) for m in imaps)
    fmaps = tuple(-1 if f is None else f for f in b.fmap)
    recs = tuple((r.variant.code, r.inputs) if isinstance(r, BlockOpRec) else (-1, (r.input, -1 if r.fmap is None
                                                                                    else r.fmap))
                 for r in b.recs)
    return (grid, forloop, maps, fmaps, recs)


def _final_shapes_ok(s: Search, b: BlockBuild, outs: list[int], omaps: tuple[tuple[int, ...], ...],
                     grid: tuple[int, ...]) -> bool:
    """For the last kernel operator: its outputs must have the program outputs' shapes."""
    shapes = []
    for j, om in zip(outs, omaps, strict=True):
        shape = list(b.shape[j])  # type: ignore[arg-type]
        for g, d in enumerate(om):
            shape[d] *= grid[g]
        shapes.append(tuple(shape))
    return sorted(shapes) == sorted(s.output_shapes)


def _outputs(s: Search, b: BlockBuild, block: BlockGraph, outs: list[int],
             omaps: tuple[tuple[int, ...], ...]) -> list[tuple[Shape, str, ExprValue]] | None:
    """(shape, dtype, expression) of each kernel tensor the finished block graph writes, or None if pruned."""
    st = s.state
    values: list[ExprValue] = []
    if b.exact:
        for j, om in zip(outs, omaps, strict=True):
            v = b.val[j]
            assert v is not None
            for g, d in enumerate(om):
                v = EXPR.concat([v] * block.grid[g], d)
            values.append(v)
    else:  # a concatenated input: blocks see different pieces, so evaluate them all
        values = run_block_graph(EXPR, block, [st.val[t] for t in b.inputs])
    if s.spec.prune and not all(s.oracle.is_subexpr(v.term) for v in values):
        s.counters.pruned_expr += 1
        return None
    added = sum(numel(v.shape) * dtype_bytes(b.dtype[j]) for v, j in zip(values, outs, strict=True))
    if st.dram + added > s.hw.dram_bytes:
        s.counters.pruned_memory += 1
        return None
    return [(v.shape, b.dtype[j], v) for v, j in zip(values, outs, strict=True)]


__all__ = ["Binding", "block_children", "ops_left", "block_nodes", "finishable", "imap_choices", "live_dims",
           "live_imaps", "new_dims_canonical", "omap_choices"]

"""The compute operators a block-level node's children add: every variant of the op set on every operand tuple,
in increasing canonical rank, each checked before it is pushed.

An operator that first reads an unbound iterator binds it first (:mod:`.bindings`; every binding the operator
accepts is a child of its own). The checks on a new block tensor, in order (the first that fails counts it):
the constant-attribute budget and the placement of ``scale`` (not counted: they define the space); at a tight
bound, operators that add no class (``pruned_expr``); the operator's shape rules and, for the last kernel
operator, the split-reduction rule of :mod:`.provenance` (``pruned_shape``); in an exact block graph, the
expression checks: the subexpression oracle, the factor an ``exp``'s argument carries
(:mod:`gensorage.exhaustive.rules.constants`) and the element count
(:mod:`gensorage.exhaustive.rules.element_counts`) (``pruned_expr``); shared memory (``pruned_memory``); the
index-tie classes (:mod:`gensorage.exhaustive.rules.ties`, ``pruned_expr``). An operator that reads a tensor a
further time must keep the occurrence budget (:mod:`gensorage.exhaustive.rules.occurrences`).

Bindings of one iterator are grouped by the tile they give: the shape rules, the memory check and (for exact
expressions) the expression checks depend only on the tiles, so they are decided once per group.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from gensorage import opset
from gensorage.dtypes import dtype_bytes
from gensorage.exhaustive.expr.abstract_expr import Term
from gensorage.exhaustive.expr.expr_arith import EXPR, ExprValue
from gensorage.exhaustive.opcatalog import (
    OpVariant,
    keeps_scaled,
    out_shape,
    reads_scaled,
    shape_free_term,
)
from gensorage.exhaustive.rules.constants import BARRIERS, Const, const_of
from gensorage.exhaustive.rules.occurrences import read_again
from gensorage.exhaustive.rules.rule import NOT_TIGHT, TIGHT_ANY, TIGHT_KNOWN
from gensorage.exhaustive.rules.ties import NO_CLASS_OPS
from gensorage.exhaustive.walk.bindings import (
    Groups,
    admitted,
    admitted_groups,
    apply_binding,
    iterator_binding_groups,
    iterator_bindings,
    split_origins,
    undo_binding,
)
from gensorage.exhaustive.walk.provenance import of_iterator, of_op, splits_reduced
from gensorage.exhaustive.walk.search_context import SearchContext, remember
from gensorage.exhaustive.walk.search_state import BlockBuild, BlockOpRec, numel, ops_left
from gensorage.exhaustive.walk.stable_subs import (
    block_sub_only,
    block_sub_result,
    pending_block_sub,
    positive_scale,
    stabilises,
)
from gensorage.opset import Op, Shape

if TYPE_CHECKING:
    from gensorage.exhaustive.rules.ruleset import RuleSet
    from gensorage.exhaustive.walk.walk import Walk


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


def variants_for(s: Walk, ins: tuple[int, ...]) -> tuple[OpVariant, ...]:
    """The operator variants that take operand tuple ``ins`` (see :class:`~.search_context.SearchContext`)."""
    ctx = s.context
    if len(ins) == 1:
        return ctx.unary
    if ins[0] == ins[1]:
        return ctx.binary_self
    return ctx.binary if ins[0] < ins[1] else ctx.binary_ordered


def operators(
    s: Walk, b: BlockBuild, only: frozenset[Op] | None = None, tight: int = NOT_TIGHT
) -> Iterator[None]:
    """Every compute operator child; ``only``: the operator budget is exactly what the needed marks take, so
    only operators that can add one (exp, sqrt, activations, div; a scale when the bound counts one) may be
    added."""
    canonical = s.spec.canonical
    last = b.keys[-1] if b.keys else None
    low = last[0][0] if (last is not None and canonical) else 0
    # free' = free + 1 - (fresh operands) must stay <= max_outputs + operators left after this one.
    need = b.free + 1 - (b.max_outputs + ops_left(s.spec, b) - 1)
    if need > 2:
        return
    last_head = last[:2] if (last is not None and canonical) else None
    reads_ok = s.reads_checker()
    uses = b.uses
    stable = s.spec.sub_stabilises_only or s.spec.exp_stabilised_only
    pending_sub = pending_block_sub(b) if s.spec.sub_stabilises_only and canonical else None
    for ins, desc in operand_tuples(b, low, need):
        if pending_sub is not None and desc[0] >= pending_sub and ins != (pending_sub,):
            continue  # the pending sub result's exp could no longer follow it in canonical order
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
        if again and not reads_ok(operands_read_again(s, b, ins)):
            continue
        variants = [v for v in variants_for(s, ins) if v.code > min_code and (only is None or v.op in only)]
        if stable:
            variants = _stable_variants(s, b, ins, variants)
        if s.spec.max_last_dim_only and len(ins) == 1:
            variants = _last_dim_maxima(s, b, ins[0], variants)
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


def _stable_variants(
    s: Walk, b: BlockBuild, ins: tuple[int, ...], variants: list[OpVariant]
) -> list[OpVariant]:
    """With ``sub_stabilises_only``: only an ``exp`` reads a ``sub`` result, and a ``sub`` subtracts a maximum of
    its minuend; with ``exp_stabilised_only``: an ``exp`` reads only a ``sub`` result (see :mod:`.stable_subs`)."""
    spec = s.spec
    subs = [block_sub_result(b, i) for i in ins]
    if spec.sub_stabilises_only and any(subs):
        # An exp, or a positive scale of the sub itself (whose result only an exp may read then).
        scalable = len(ins) == 1 and block_sub_only(b, ins[0])
        return [v for v in variants if v.op is Op.EXP or (scalable and positive_scale(v))]
    if spec.exp_stabilised_only and not (len(ins) == 1 and subs[0]):
        variants = [v for v in variants if v.op is not Op.EXP]
    if spec.sub_stabilises_only and len(ins) == 2 and any(v.op is Op.SUB for v in variants):
        if not stabilises(_tensor_term(s, b, ins[0]), _tensor_term(s, b, ins[1])):
            return [v for v in variants if v.op is not Op.SUB]
    return variants


def _last_dim_maxima(s: Walk, b: BlockBuild, i: int, variants: list[OpVariant]) -> list[OpVariant]:
    """With ``max_last_dim_only`` (a restriction of the space): a block-level ``max`` reduces only its operand's
    last dim, a softmax row's (a tile keeps its tensor's rank, so an unbound iterator's is its tensor's)."""
    if not any(v.op is Op.MAX for v in variants):
        return variants
    value = b.val[i] if b.val[i] is not None else s.state.val[b.inputs[i]]  # type: ignore[index]
    last = len(value.shape) - 1  # type: ignore[union-attr]
    return [v for v in variants if v.op is not Op.MAX or dict(v.attrs).get("dim") == last]


def _bind_then_apply(
    s: Walk,
    b: BlockBuild,
    ins: tuple[int, ...],
    head: tuple[tuple[int, ...], tuple[int, ...]],
    variants: list[OpVariant],
    post: bool,
    pending: tuple[int, ...],
    known_tiles_pruned: bool = False,
) -> Iterator[None]:
    """Bind the iterators in ``pending`` (every combination of their options), then apply ``variants``.

    The last iterator's options are grouped by the tile they give: the operator's shape rules and the memory
    check depend only on the tiles, so a group no variant accepts, or whose tile does not fit, is skipped whole,
    and (for exact expressions) the variants' results are computed once per group. A binding whose imap no
    placement of the dim strategy admits together with the other iterators' is skipped before it is applied
    (see :func:`admitted`). ``known_tiles_pruned``: see :mod:`gensorage.exhaustive.rules.ties`.
    """
    i, rest = pending[0], pending[1:]
    limit = s.context.hw.shared_mem_per_block
    elem = dtype_bytes(b.dtype[i])
    if rest:
        bindings = iterator_bindings(s, b, i)
        for bd, ok in zip(bindings, admitted(s, b, i, bindings), strict=True):
            if b.smem + numel(bd.tile) * elem > limit:
                s.counters.pruned_memory += 1
            elif ok:
                apply_binding(s, b, i, bd)
                try:
                    yield from _bind_then_apply(s, b, ins, head, variants, post, rest, known_tiles_pruned)
                finally:
                    undo_binding(b, i, bd)
        return
    counters = s.counters
    groups = iterator_binding_groups(s, b, i)
    plan, trailing = _group_plan(s, b, i, ins, variants, groups)
    admitted_by_group = admitted_groups(s, b, i, groups)
    for pruned_shape, g, valid in plan:
        counters.pruned_shape += pruned_shape
        tile, bindings = groups[g]
        if b.smem + numel(tile) * elem > limit:
            counters.pruned_memory += len(bindings)
            continue
        members = admitted_by_group[g]
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
            apply_binding(s, b, i, bd)
            try:
                yield from _apply_variants(s, b, ins, head, valid, post, memo, known_tiles_pruned)
            finally:
                undo_binding(b, i, bd)
    counters.pruned_shape += trailing


def _group_checked(
    s: Walk,
    b: BlockBuild,
    ins: tuple[int, ...],
    i: int,
    tile: Shape,
    valid: list[OpVariant],
    memo: dict[int, Applied],
) -> list[OpVariant]:
    """In an exact block graph, the variants on the tiles of a binding group that the budget allows and whose
    expression passes the checks, before any binding of the group is applied: an iterator's tile expression is
    its input's term with the tile's shape, whichever binding gives the tile. Fills ``memo`` as
    :func:`_apply_variants` would; variants the budget or a scaled operand excludes are left to it."""
    term = s.state.val[b.inputs[i]].term  # type: ignore[union-attr]
    values = [ExprValue(tile, term) if k == i else b.val[k] for k in ins]
    shapes = [tile if k == i else b.shape[k] for k in ins]
    provs = [of_iterator(i, len(tile)) if k == i else b.prov[k] for k in ins]
    scaled = any(b.scaled[k] for k in ins)
    factors = [b.const[k] for k in ins if b.scaled[k]]
    first_const = b.const[ins[0]]
    prune, oracle, rules = s.spec.prune, s.context.oracle, s.context.rules
    out = []
    for v in valid:
        if not s.allowed(v) or (scaled and not reads_scaled(v.op, factors)):
            out.append(v)
            continue
        shape = out_shape(v, shapes)  # type: ignore[arg-type]
        assert shape is not None  # valid: the shape rules accept the group's tiles
        value = _expr(s, v, values)  # type: ignore[arg-type]
        if (not prune or oracle.is_subexpr(value.term)) and _factor_ok(rules, v, value.term, first_const):
            memo[v.code] = [shape, of_op(v.op, v.attrs, provs, shapes), value, True]  # type: ignore[arg-type]
            out.append(v)
    return out


def _expr(s: Walk, v: OpVariant, values: Sequence[ExprValue]) -> ExprValue:
    """The expression of ``v`` on operands ``values``, memoised per process."""
    key = (v.code, *values)
    value = s.context.expr_memo.get(key)
    if value is None:
        value = opset.apply(v.op, EXPR, values, v.attrs)  # type: ignore[arg-type,misc]
        remember(s.context.expr_memo, key, value)
    return value  # type: ignore[return-value]


# One entry of a group plan: the shape-pruned count of the groups skipped before it, the group's index, and the
# variants its tiles accept.
GroupEntry = tuple[int, int, list[OpVariant]]


def _group_plan(
    s: Walk, b: BlockBuild, i: int, ins: tuple[int, ...], variants: list[OpVariant], groups: Groups
) -> tuple[tuple[GroupEntry, ...], int]:
    """The binding groups of iterator ``i`` that some variant accepts, and the shape-pruned count of the groups
    after the last of them: a pure function of the groups, the variants and the other operands' tiles, memoised
    per process."""
    codes = tuple(v.code for v in variants)
    others = tuple(None if k == i else b.shape[k] for k in ins)
    key = (id(groups), codes, others)
    got = s.context.plan_memo.get(key)
    if got is not None and got[0] is groups:  # the groups object is held, so its id is not reused
        return got[1]  # type: ignore[return-value]
    plan: list[GroupEntry] = []
    skipped = 0
    for g, (tile, bindings) in enumerate(groups):
        shapes = tuple(tile if k == i else b.shape[k] for k in ins)
        valid = valid_variants(s.context, variants, shapes)  # type: ignore[arg-type]
        skipped += (len(variants) - len(valid)) * len(bindings)
        if valid:
            plan.append((skipped, g, valid))
            skipped = 0
    out = (tuple(plan), skipped)
    remember(s.context.plan_memo, key, (groups, out))
    return out


def valid_variants(
    ctx: SearchContext, variants: list[OpVariant], shapes: tuple[Shape, ...]
) -> list[OpVariant]:
    """The variants whose shape rules accept operands of ``shapes`` (memoised per process)."""
    key = (tuple(v.code for v in variants), shapes)
    got = ctx.valid_memo.get(key)
    if got is None:
        got = ctx.valid_memo[key] = [v for v in variants if out_shape(v, list(shapes)) is not None]
    return got


def _tensor_term(s: Walk, b: BlockBuild, i: int) -> Term:
    """The expression of block tensor ``i`` (an unbound iterator: its whole input's)."""
    v = b.val[i] if b.val[i] is not None else s.state.val[b.inputs[i]]
    return v.term  # type: ignore[union-attr]


def _factor_ok(rules: RuleSet, v: OpVariant, term: Term, arg: Const) -> bool:
    """Whether an operator's argument carries a factor the program's operator of its class does (only exp,
    silu and gelu are checked; see :mod:`gensorage.exhaustive.rules.constants`), and an ``add_scalar`` adds to
    a tensor the program adds to (:mod:`gensorage.exhaustive.rules.shift_places`)."""
    if v.op is Op.ADD_SCALAR:
        return rules.shifts is None or rules.shifts.admits(term)
    return v.op not in BARRIERS or rules.constants is None or rules.constants.admits(term, arg)


def operands_read_again(s: Walk, b: BlockBuild, ins: tuple[int, ...]) -> list[Term]:
    """The operands ``ins`` reads a further time (see :func:`gensorage.exhaustive.rules.occurrences.read_again`)."""
    return read_again(ins, lambda i: b.uses[i] == 0, lambda i: _tensor_term(s, b, i))


def _shape_free_prefilter(
    s: Walk, b: BlockBuild, ins: tuple[int, ...], variants: list[OpVariant]
) -> list[OpVariant]:
    """Drop the variants whose expression does not depend on tile sizes and fails the oracle, before binding."""
    terms = [(b.val[i] if b.val[i] is not None else s.state.val[b.inputs[i]]).term for i in ins]  # type: ignore[union-attr]
    oracle, rules = s.context.oracle, s.context.rules
    kept = []
    for v in variants:
        term = shape_free_term(v.op, terms)
        if term is not None and not oracle.is_subexpr(term):
            s.counters.pruned_expr += 1
            continue
        if term is not None and not _factor_ok(rules, v, term, b.const[ins[0]]):
            s.counters.pruned_expr += 1
            continue
        kept.append(v)
    return kept


# What an operator variant gives on a binding group's tiles (see _apply_variants): its output shape, provenance,
# and, once computed, its expression and whether it passes the expression checks.
Applied = list  # [Shape, Provenance, ExprValue | None, bool]


def _apply_variants(
    s: Walk,
    b: BlockBuild,
    ins: tuple[int, ...],
    head: tuple[tuple[int, ...], tuple[int, ...]],
    variants: list[OpVariant],
    post: bool,
    memo: dict[int, Applied] | None = None,
    known_tiles_pruned: bool = False,
) -> Iterator[None]:
    """Push each variant on operands ``ins`` that passes the checks. ``memo`` is shared by the bindings of one
    binding group: their operands have the same tiles, provenance and constant factors (only imaps, fmaps and
    index ties differ), so a variant's output shape and provenance, and in an exact block graph its expression
    and the checks on it, are computed once per group. ``known_tiles_pruned``: a repeat whose operands' ties are
    all known is pruned (see :mod:`gensorage.exhaustive.rules.ties`)."""
    counters = s.counters
    ctx = s.context
    oracle, rules, tie_rule = ctx.oracle, ctx.rules, ctx.rules.ties
    limit = ctx.hw.shared_mem_per_block
    shapes = [b.shape[i] for i in ins]
    values = [b.val[i] for i in ins]
    fdep = any(b.fdep[i] for i in ins)
    elem = dtype_bytes(b.dtype[ins[0]])
    scaled = any(b.scaled[i] for i in ins)
    consts = [b.const[i] for i in ins]
    factors = [b.const[i] for i in ins if b.scaled[i]]
    split = split_origins(ctx, b) if (b.last_kernel_op and ctx.split_rule) else None
    exact_prune = s.spec.prune and b.exact
    known = known_tiles_pruned and all((t := b.ties[i]) is not None and t.known for i in ins)
    caps = ctx.rules.element_caps if exact_prune else None
    spread = _spread(b, fdep) if caps is not None else 1
    for v in variants:
        if not s.allowed(v):
            continue
        if scaled and not reads_scaled(v.op, factors):
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
            keep = not exact_prune or oracle.is_subexpr(value.term)
            keep = keep and (not b.exact or _factor_ok(rules, v, value.term, consts[0]))
            if (
                b.exact
            ):  # elsewhere a tile's expression depends on more than its shape (see the module docstring)
                got[2], got[3] = value, keep
        if not keep or (caps is not None and not caps.admits(numel(out) * spread, value.term)):
            counters.pruned_expr += 1
            continue
        if b.smem + numel(out) * elem > limit:
            counters.pruned_memory += 1
            continue
        ties = None
        if tie_rule is not None:
            ties = opset.apply(v.op, tie_rule.arith, [b.ties[i] for i in ins], v.attrs)  # type: ignore[misc]
            if not tie_rule.admits(ties):
                counters.pruned_expr += 1
                continue
        s.state.push_block(
            BlockOpRec(v, ins),
            (*head, v.code, ()),
            out,
            value,
            post,
            fdep,
            prov,
            const_of(v.op, v.attrs, consts),
            keeps_scaled(v.op, scaled),
            ties,
        )
        s.spend(v, 1)
        try:
            yield
        finally:
            s.spend(v, -1)
            s.state.pop_block()


def _spread(b: BlockBuild, fdep: bool) -> int:
    """What a block tensor's element count is multiplied by on its way to a kernel tensor, at least: the grid
    sizes chosen so far, and the trip count for a tensor that varies across iterations (it is accumulated); see
    :mod:`gensorage.exhaustive.rules.element_counts`."""
    out = 1
    for size in b.grid:
        if size is not None:
            out *= size
    if fdep and b.forloop is not None:
        out *= b.forloop
    return out


__all__ = ["operand_tuples", "operands_read_again", "operators", "valid_variants", "variants_for"]

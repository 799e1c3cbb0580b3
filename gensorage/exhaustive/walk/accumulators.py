"""The for-loop accumulators a block-level node's children add: a sum, or a concatenation along a dim, of a
loop-body tensor, in rank order.

An accumulator's input varies across iterations (it depends on an fmap'd iterator: summing a loop-invariant tile
only multiplies it by the trip count) and is no ``scale`` result (one is read only by a mark). Checks, in order:
the occurrence budget for an input read again; at a tight bound, a concatenation (``pruned_expr``); the
subexpression oracle in an exact block graph (``pruned_expr``); shared memory (``pruned_memory``); the index-tie
classes of a sum (``pruned_expr``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from gensorage.dtypes import dtype_bytes
from gensorage.exhaustive.expr.expr_arith import EXPR
from gensorage.exhaustive.expr.ties import loop_concat, loop_sum
from gensorage.exhaustive.rules.rule import NOT_TIGHT
from gensorage.exhaustive.walk.operators import operands_read_again
from gensorage.exhaustive.walk.rank import ACCUMULATOR_CODE, follows, rank_key
from gensorage.exhaustive.walk.search_state import AccumRec, BlockBuild, free_after, numel, ops_left

if TYPE_CHECKING:
    from gensorage.exhaustive.walk.walk import Walk


def accumulators(s: Walk, b: BlockBuild, tight: int = NOT_TIGHT) -> Iterator[None]:
    """Every accumulator child, in rank order; ``tight``: a concatenation, which adds no class, is pruned (see
    :mod:`gensorage.exhaustive.rules.ties`)."""
    last = b.keys[-1] if b.keys else None
    low = last[0][0] if (last is not None and s.spec.canonical) else 0
    forloop = b.forloop
    assert forloop is not None
    limit = s.context.hw.shared_mem_per_block
    tie_rule = s.context.rules.ties
    reads_ok = s.reads_checker()
    for j in range(low, len(b.shape)):
        shape = b.shape[j]
        if shape is None or b.post[j] or not b.fdep[j] or b.scaled[j]:
            continue
        if not b.viable(free_after(b, (j,)), 0, ops_left(s.spec, b, 1)):
            continue
        if not reads_ok(operands_read_again(s, b, (j,))):
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
                out = shape[:fmap] + (shape[fmap] * forloop,) + shape[fmap + 1 :]
            assert value is not None
            if s.spec.prune and b.exact and not s.context.oracle.is_subexpr(value.term):
                s.counters.pruned_expr += 1
                continue
            if b.smem + numel(out) * dtype_bytes(b.dtype[j]) > limit:
                s.counters.pruned_memory += 1
                continue
            ties = None
            xt = b.ties[j]
            if xt is not None and tie_rule is not None:
                ties = loop_sum(xt) if fmap is None else loop_concat(xt, forloop, fmap)
                if fmap is None and not tie_rule.admits(ties):
                    s.counters.pruned_expr += 1
                    continue
            s.state.push_block(
                AccumRec(j, fmap),
                key,
                out,
                value,
                True,
                False,
                b.prov[j] if fmap is None else None,
                b.const[j],
                ties=ties,
            )
            try:
                yield
            finally:
                s.state.pop_block()


__all__ = ["accumulators"]

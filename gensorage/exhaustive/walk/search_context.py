"""What a search precomputes from its spec alone, built once and shared by the tasks one process runs.

A search has thousands of tasks, many of them a few milliseconds long. Building the hardware profile, the
program's abstract expressions, the operator catalog, the pruning rules and a fresh subexpression oracle for each
one cost about 2 ms a task, and each task's oracle and shape caches started empty, so every task solved again
the queries the one before it had solved. Everything here is a pure function of the spec (the caches memoise pure
functions), so sharing it changes no candidate and no logical counter. Only the work counters differ: the
oracle's queries and cache hits are counted per task as the difference over the task (see ``Search.stats``), and
a query the solver gave up on (kept, never pruned) is not asked again in that process.

The oracle's memo grows with every distinct query; :func:`process_context` starts a fresh one past
:data:`MAX_ORACLE_ENTRIES` so that a run of hours keeps a bounded memory.
"""

from __future__ import annotations

import math

from gensorage.exhaustive.expr.abstract_expr import Term, expr_of
from gensorage.exhaustive.expr.oracle import SubexprOracle
from gensorage.exhaustive.expr.ties import TieRule
from gensorage.exhaustive.rules.constants import ExpConstants
from gensorage.exhaustive.rules.element_counts import ElementCaps
from gensorage.exhaustive.rules.needed_ops import NeededOps
from gensorage.exhaustive.rules.occurrences import OccurrenceBudget
from gensorage.exhaustive.rules.reductions import Reductions
from gensorage.exhaustive.spec import SearchSpec
from gensorage.exhaustive.walk.opcatalog import COMMUTATIVE, SELF_USELESS, OpVariant, catalog
from gensorage.hw import load_profile
from gensorage.hw.profile import HwProfile
from gensorage.opset import Attrs, Op, Shape, attr, freeze_attrs

ORACLE_TIMEOUT_MS = 2000
MAX_ORACLE_ENTRIES = 500_000  # distinct terms memoised by a process's oracle before it starts afresh
# Operators whose attributes are program constants (scale factors, repeat counts, reshape targets); see
# docs/search.md.
BUDGETED = frozenset({Op.SCALE, Op.REPEAT, Op.RESHAPE})


def variant_attrs(op: Op, attrs: Attrs) -> Attrs:
    """A program node's attributes as the catalog writes them for ``op``."""
    if op is Op.SCALE:
        return freeze_attrs({"factor": float(attr(attrs, "factor"))})
    return attrs


def _term_vars(terms: list[Term]) -> frozenset[str]:
    return frozenset(t.name for term in terms for t in term.subterms() if t.op == "var")


class SearchContext:
    """The spec-level facts and memos of one search (see the module docstring)."""

    def __init__(self, spec: SearchSpec) -> None:
        self.spec = spec
        self.hw: HwProfile = load_profile(spec.hw)
        program = spec.program
        self.targets = expr_of(program)
        self.oracle = SubexprOracle(self.targets, ORACLE_TIMEOUT_MS)
        self.target_nfs = [self.oracle.canon.nf(t) for t in self.targets]
        rules = spec.prune and spec.expr_filter
        # The bound of needed_ops holds for µGraphs whose output equals the program's under A_eq.
        # The factors exp arguments must carry (see constants): a condition of equality with constants kept.
        self.exp_consts = ExpConstants(program, self.oracle.canon) if rules else None
        self.needed = (NeededOps(self.oracle.canon, self.targets, self.exp_consts.factor_marks)
                       if self.exp_consts is not None else None)
        self.variants = catalog(program, spec.op_types)
        # Coefficients only a reduction makes (see reductions): the same condition again.
        self.reductions = Reductions.for_search(self.oracle.canon, self.targets, self.variants) if rules else None
        # Reduction classes (see ties): the same condition again.
        self.ties = TieRule.for_search(program, [v.op for v in self.variants]) if rules else None
        binary = tuple(v for v in self.variants if v.arity == 2)
        self.unary = tuple(v for v in self.variants if v.arity == 1)
        self.binary = binary  # operands (lo, hi)
        self.binary_ordered = tuple(v for v in binary if v.op not in COMMUTATIVE)  # operands (hi, lo)
        self.binary_self = tuple(v for v in binary if v.op not in SELF_USELESS)  # operands (i, i)
        self.output_shapes = [t.shape for t in program.outputs]
        self.output_splits = frozenset(g for shape in self.output_shapes for d in shape for g in range(2, d + 1)
                                       if d % g == 0)
        used = _term_vars(self.targets)
        self.required_inputs = [i for i, t in enumerate(program.inputs) if t.name in used]
        # Like the needed-operator bound, the occurrence budget speaks about outputs equal under A_eq.
        self.occurrences = (OccurrenceBudget.for_search([t.name for t in program.inputs], self.targets,
                                                        self.variants) if rules else None)
        # Element counts only reductions shrink (see element_counts): outputs equal under A_eq again.
        self.element_caps = self._element_caps() if rules else None
        # The split-reduction rule of the last kernel operator (see provenance) assumes no grouped sums.
        self.split_rule = not any(program.nodes[i].op is Op.SUM and attr(program.nodes[i].attrs, "group") is not None
                                  for i in program.live_ids())
        # Budgeted operators are used at most as often as the program uses each, keyed by variant code.
        program_counts: dict[tuple[Op, Attrs], int] = {}
        for i in program.live_ids():
            node = program.nodes[i]
            if node.op in BUDGETED:
                key = (node.op, variant_attrs(node.op, node.attrs))
                program_counts[key] = program_counts.get(key, 0) + 1
        self.budget: dict[int, int] = {v.code: program_counts.get((v.op, v.attrs), 0)
                                       for v in self.variants if v.op in BUDGETED}
        # Memos of pure functions, shared by the tasks.
        self.construct_cache: dict[str, tuple[float, ...] | None] = {}
        self.valid_memo: dict[tuple[tuple[int, ...], tuple[Shape, ...]], list[OpVariant]] = {}
        self.split_memo: dict[tuple[object, ...], frozenset[tuple[int, int]]] = {}
        # Binding-group plans of the block walk (block_level._group_plan).
        self.plan_memo: dict[tuple[object, ...], tuple[object, object]] = {}
        self.admit_memo: dict[tuple[object, ...], tuple[object, object]] = {}
        # Expressions of operators on block tensors (block_level._apply_variants): a pure function of the operands'.
        self.expr_memo: dict[tuple[object, ...], object] = {}

    def _element_caps(self) -> ElementCaps | None:
        numels = [math.prod(shape) for shape in self.output_shapes]
        return ElementCaps.for_search(self.oracle.canon, self.targets, numels, self.variants)

    def oracle_entries(self) -> int:
        """How many distinct terms the oracle has memoised."""
        return self.oracle.memo_size()

    def fresh_oracle(self) -> None:
        """Start the oracle afresh (its memo is dropped; its answers are the same)."""
        self.oracle = SubexprOracle(self.targets, ORACLE_TIMEOUT_MS)
        self.target_nfs = [self.oracle.canon.nf(t) for t in self.targets]
        if self.exp_consts is not None:
            self.exp_consts = ExpConstants(self.spec.program, self.oracle.canon)
            self.needed = NeededOps(self.oracle.canon, self.targets, self.exp_consts.factor_marks)
        if self.reductions is not None:
            self.reductions = Reductions.for_search(self.oracle.canon, self.targets, self.variants)
        if self.element_caps is not None:
            self.element_caps = self._element_caps()


class _ProcessContext:
    key = ""
    context: SearchContext | None = None


def process_context(spec: SearchSpec, key: str | None = None) -> SearchContext:
    """This process's context for ``spec`` (a new spec replaces the previous one's); ``key``: ``spec.key()``
    when the caller has it."""
    key = spec.key() if key is None else key
    if _ProcessContext.key != key or _ProcessContext.context is None:
        _ProcessContext.context = SearchContext(spec)
        _ProcessContext.key = key
    ctx = _ProcessContext.context
    if ctx.oracle_entries() > MAX_ORACLE_ENTRIES:
        ctx.fresh_oracle()
    return ctx


__all__ = ["BUDGETED", "MAX_ORACLE_ENTRIES", "ORACLE_TIMEOUT_MS", "SearchContext", "process_context",
           "variant_attrs"]

"""What a search precomputes from its spec alone, built once and shared by the tasks one process runs.

A search has thousands of tasks, many of them a few milliseconds long. Building the hardware profile, the
program's abstract expressions, the operator catalog, the pruning rules and a fresh subexpression oracle for each
one cost about 2 ms a task, and each task's oracle and shape caches started empty, so every task solved again
the queries the one before it had solved. Everything here is a pure function of the spec (the caches memoise pure
functions), so sharing it changes no candidate and no logical counter. Only the work counters differ: the
oracle's queries and cache hits are counted per task as the difference over the task (see ``Walk.stats``), and
a query the solver gave up on (kept, never pruned) is not asked again in that process.

The oracle's memo grows with every distinct query; :func:`process_context` starts a fresh one past
:data:`MAX_ORACLE_ENTRIES` so that a run of hours keeps a bounded memory.
"""

from __future__ import annotations

from typing import Any

from gensorage.exhaustive.expr.abstract_expr import Term, expr_of
from gensorage.exhaustive.expr.oracle import SubexprOracle
from gensorage.exhaustive.opcatalog import (
    COMMUTATIVE,
    KERNEL_ONLY,
    SELF_USELESS,
    OpVariant,
    catalog,
    program_op_signatures,
    stable_softmax_only,
)
from gensorage.exhaustive.rules.last_reads import NOT_LIPSCHITZ, LastReads
from gensorage.exhaustive.rules.ruleset import RuleSet
from gensorage.exhaustive.spec import SearchSpec
from gensorage.hw import load_profile
from gensorage.hw.profile import HwProfile
from gensorage.opset import Attrs, Op, Shape, attr, freeze_attrs

ORACLE_TIMEOUT_MS = 2000
MAX_ORACLE_ENTRIES = 500_000  # distinct terms memoised by a process's oracle before it starts afresh
MAX_MEMO_ENTRIES = (
    200_000  # entries of each walk memo (plans, admitted bindings, expressions) before it starts afresh
)
# Operators whose attributes are program constants (scale factors, repeat counts, reshape targets); see
# docs/search.md.
BUDGETED = frozenset({Op.SCALE, Op.ADD_SCALAR, Op.REPEAT, Op.RESHAPE, Op.TRANSPOSE})


def variant_attrs(op: Op, attrs: Attrs) -> Attrs:
    """A program node's attributes as the catalog writes them for ``op``."""
    if op is Op.SCALE:
        return freeze_attrs({"factor": float(attr(attrs, "factor"))})
    if op is Op.ADD_SCALAR:
        return freeze_attrs({"value": float(attr(attrs, "value"))})
    return attrs


def _term_vars(terms: list[Term]) -> frozenset[str]:
    return frozenset(t.name for term in terms for t in term.subterms() if t.op == "var")


class SearchContext:
    """The spec-level facts and memos of one search (see the module docstring).

    ``rules`` holds the search's pruning rules (:class:`~gensorage.exhaustive.rules.ruleset.RuleSet`; none without
    ``prune`` and ``expr_filter``); the operator variants are kept by arity, as the walk reads them: ``unary``,
    ``binary`` (operands (lo, hi)), ``binary_ordered`` (the non-commutative ones, operands (hi, lo)) and
    ``binary_self`` (those worth applying to one tensor twice).
    """

    def __init__(self, spec: SearchSpec) -> None:
        self.spec = spec
        self.hw: HwProfile = load_profile(spec.hw)
        program = spec.program
        self.targets = expr_of(program)
        self.oracle = SubexprOracle(self.targets, ORACLE_TIMEOUT_MS)
        self.target_nfs = [self.oracle.canon.nf(t) for t in self.targets]
        self.variants = catalog(program, spec.op_types)
        binary = tuple(v for v in self.variants if v.arity == 2)
        self.unary = tuple(v for v in self.variants if v.arity == 1 and v.op not in KERNEL_ONLY)
        self.binary = binary
        self.binary_ordered = tuple(v for v in binary if v.op not in COMMUTATIVE)
        self.binary_self = tuple(v for v in binary if v.op not in SELF_USELESS)
        self.output_shapes = [t.shape for t in program.outputs]
        self.output_splits = frozenset(
            g for shape in self.output_shapes for d in shape for g in range(2, d + 1) if d % g == 0
        )
        used = _term_vars(self.targets)
        self.required_inputs = [i for i, t in enumerate(program.inputs) if t.name in used]
        # The most kernel tensors one kernel operator reads (walk.kernel_level.completable).
        self.max_kernel_reads = max([v.arity for v in self.variants] + [spec.max_block_inputs])
        self.rules = self._rules()
        # The operators the program applies (opcatalog.program_op_signatures), where the spec admits no other
        # pre-defined one (walk.kernel_level); None: any.
        self.own_ops = program_op_signatures(program) if spec.own_predefined_only else None
        # The last kernel's reads (rules.last_reads): exact for any equivalent µGraph, so with ``prune`` alone;
        # not where a block operator may be non-Lipschitz.
        lipschitz = not any(v.op in NOT_LIPSCHITZ for v in self.variants)
        self.last_reads = LastReads(program, self.required_inputs) if spec.prune and lipschitz else None
        # The split-reduction rule of the last kernel operator (see provenance) assumes no grouped sums.
        self.split_rule = not any(
            program.nodes[i].op is Op.SUM and attr(program.nodes[i].attrs, "group") is not None
            for i in program.live_ids()
        )
        # Budgeted operators are used at most as often as the program uses each, keyed by variant code.
        program_counts: dict[tuple[Op, Attrs], int] = {}
        for i in program.live_ids():
            node = program.nodes[i]
            if node.op in BUDGETED:
                key = (node.op, variant_attrs(node.op, node.attrs))
                program_counts[key] = program_counts.get(key, 0) + 1
        self.budget: dict[int, int] = {
            v.code: program_counts.get((v.op, v.attrs), 0) for v in self.variants if v.op in BUDGETED
        }
        # The add_scalar variants: while none is spent, the µGraph applies no additive constant (rules.homogeneity).
        self.shift_codes: tuple[int, ...] = tuple(v.code for v in self.variants if v.op is Op.ADD_SCALAR)
        # Memos of pure functions, shared by the tasks.
        self.construct_cache: dict[str, tuple[float, ...] | None] = {}
        self.valid_memo: dict[tuple[tuple[int, ...], tuple[Shape, ...]], list[OpVariant]] = {}
        self.split_memo: dict[tuple[object, ...], frozenset[tuple[int, int]]] = {}
        # Binding-group plans and admitted bindings of the block walk (walk.operators, walk.bindings).
        self.plan_memo: dict[tuple[object, ...], tuple[object, object]] = {}
        self.admit_memo: dict[tuple[object, ...], tuple[object, object]] = {}
        # Expressions of operators on block tensors (walk.operators): a pure function of the operands'.
        self.expr_memo: dict[tuple[object, ...], object] = {}

    def _rules(self) -> RuleSet:
        """The pruning rules: they speak about outputs equal to the program's under ``A_eq``, so only with
        ``prune`` and ``expr_filter``."""
        spec = self.spec
        if not (spec.prune and spec.expr_filter):
            return RuleSet()
        # A stable softmax's sub changes no tie class when every sub of the program and the space is one.
        stable_subs = spec.sub_stabilises_only and stable_softmax_only(spec.program)
        return RuleSet.for_search(
            spec.program, self.oracle.canon, self.targets, self.variants, self.output_shapes, stable_subs
        )

    def oracle_entries(self) -> int:
        """How many distinct terms the oracle has memoised."""
        return self.oracle.memo_size()

    def fresh_oracle(self) -> None:
        """Start the oracle afresh (its memo is dropped; its answers are the same), and the rules with it (they
        share its normal forms)."""
        self.oracle = SubexprOracle(self.targets, ORACLE_TIMEOUT_MS)
        self.target_nfs = [self.oracle.canon.nf(t) for t in self.targets]
        self.rules = self._rules()


def remember(memo: dict[tuple[object, ...], Any], key: tuple[object, ...], value: object) -> None:
    """``memo[key] = value``, the memo started afresh once it holds :data:`MAX_MEMO_ENTRIES`."""
    if len(memo) >= MAX_MEMO_ENTRIES:
        memo.clear()
    memo[key] = value


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


__all__ = [
    "BUDGETED",
    "MAX_MEMO_ENTRIES",
    "MAX_ORACLE_ENTRIES",
    "ORACLE_TIMEOUT_MS",
    "SearchContext",
    "process_context",
    "remember",
    "variant_attrs",
]

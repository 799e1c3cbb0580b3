"""What an exhaustive µGraph search is asked to do: :class:`SearchSpec` (program, GPU, limits, flags).

A spec is data: frozen, JSON-able (:meth:`SearchSpec.to_json` / :meth:`SearchSpec.from_json`, the program kept as
its ``.gsp`` text) and keyed by :meth:`SearchSpec.key`, a hash of that JSON, under which the runner's checkpoint is
stored. Two specs with the same key describe the same search and produce the same result.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from gensorage.errors import ConfigError, UnsupportedOpError
from gensorage.exhaustive.dim_strategy import DimStrategy
from gensorage.exhaustive.opcatalog import unsearched
from gensorage.opset import Op, parse_op
from gensorage.program import Program, dump_program, parse_program

ScheduleMode = Literal["markov", "enumerate"]
SCHEDULE_MODES: tuple[str, ...] = ("markov", "enumerate")
SPEC_FORMAT = "gensorage.search-spec"
SPEC_VERSION = 1
OMITTED_WHEN_NONE = frozenset({"max_block_nodes", "max_block_graphs", "dims"})
OMITTED_WHEN_TRUE = frozenset({"replicated_writes", "loop_concats"})
OMITTED_WHEN_FALSE = frozenset(
    {
        "fused_first",
        "parallel_first",
        "program_ops_first",
        "graph_defined_last",
        "sub_stabilises_only",
        "exp_stabilised_only",
        "max_last_dim_only",
        "own_predefined_only",
    }
)
OMITTED_WHEN_ONE = frozenset({"min_kernel_ops"})
# Elements of one program tensor a search evaluates at most (verification runs candidates at the program's shapes;
# the bundled 4096-wide configs have 16.8 M).
MAX_SEARCH_ELEMENTS = 1 << 28
#: The spec's true-or-false fields (each checked to be a bool).
SWITCHES = (
    "prune",
    "canonical",
    "expr_filter",
    "graph_defined_last",
    "fused_first",
    "parallel_first",
    "program_ops_first",
    "sub_stabilises_only",
    "exp_stabilised_only",
    "loop_concats",
    "max_last_dim_only",
    "own_predefined_only",
    "replicated_writes",
)


@dataclass(frozen=True, slots=True)
class SearchSpec:
    """An exhaustive µGraph search (Mirage Algorithm 1) of ``program`` for the GPU profile ``hw``.

    Parameters
    ----------
    program : Program
        The tensor program to superoptimise, at the shapes the search runs at (small "search shapes" keep
        verification cheap). Compared and hashed through its ``.gsp`` text (``program_text``).
    hw : str
        Hardware profile name (``configs/hw/<hw>.toml``): memory limits and the cost model.
    max_kernel_ops : int
        Kernel operators per µGraph (pre-defined and graph-defined).
    min_kernel_ops : int
        Kernel operators a complete µGraph has at least (1: any). With ``graph_defined_last``, a program
        with more operators than one block graph holds gets 2: a pre-defined operator must feed its custom
        kernel (see :mod:`gensorage.exhaustive.derived_limits`).
    max_block_ops : int
        Compute operators per block graph (iterators, accumulators and output savers are not counted).
    max_block_inputs, max_block_outputs : int
        Inputs (input iterators) and outputs (output savers) per block graph.
    max_block_nodes : int or None
        Mirage's own block-graph limit (``MAX_NUM_THREADBLOCK_GRAPH_OP``): input iterators, compute operators and
        accumulators together, output savers not counted; applied on top of ``max_block_ops``. None: no such
        limit. Table 5 of the Mirage paper counts block operators this way.
    max_block_graphs : int or None
        Graph-defined (custom) kernel operators per µGraph; the other kernel operators are pre-defined ones.
        Mirage's ``max_num_threadblock_graphs`` (1 in its default configuration). None: no such limit.
    graph_defined_last : bool
        A graph-defined operator only as the last kernel operator: pre-defined operators may feed it, none
        follows it. Its block graph then writes the program's outputs, so it is pruned as a last one is.
    max_grid_dims : int
        Grid dims of a block graph (1-3).
    prune : bool
        Abstract-expression pruning of every prefix (Mirage §4.3).
    canonical : bool
        Add operators only in increasing canonical rank, so each µGraph is generated once.
    schedule : {"markov", "enumerate"}
        How grid and for-loop sizes are chosen (see ``docs/search.md``).
    seed : int
        Seeds the Markov construction and the verification trials.
    delta : float
        Target false-accept probability of the equivalence check.
    max_trials : int or None
        Cap on verification trials per candidate (None: as many as ``delta`` needs; exp programs need millions).
    expr_filter : bool
        Send to verification only complete µGraphs whose output expression equals the program's under
        ``A_eq`` (the µGraphs Theorem 1 is about); False verifies every complete µGraph, as Mirage does.
    ops : tuple of str, optional
        Operator types the search may use; None derives them from the program (see ``opcatalog``).
    dims : DimStrategy, optional
        Mirage's dimension strategy: the imaps, omaps and fmaps block graphs may use (``configs/dims/``, see
        :mod:`~gensorage.exhaustive.dim_strategy`); None: every map.
    replicated_writes : bool
        Whether a block graph may write a kernel tensor that holds copies no operator has lined up with an input
        axis (a ``repeat``'s, or blocks along a grid dim the tensor does not vary with). False narrows the space
        (it is not exact: some correct µGraphs write such copies and tie them in the next kernel); see
        ``docs/search.md``.
    fused_first : bool
        Run first the tasks whose first graph-defined kernel reads every program input, directly or through the
        pre-defined operators before it (where one fused kernel for the whole program is found), with a for-loop
        first; the rest in walk order. Changes only which
        candidates a stopped search has found, not what a complete one finds. Off by default: on searches
        whose fusing subtrees are large and barren (attention presets) a short budget then finds less.
    parallel_first : bool
        With ``fused_first``: split each fusing task one level further (its block graph's first operator and
        bindings) and run those siblings in the order of the thread blocks their grid has there, most first
        (walk order among equals). An order, like ``fused_first``: a complete search finds the same candidates;
        a stopped one reaches many-block kernels (FlashDecoding's split-KV kernel) before one-block-per-head
        ones. See ``docs/search.md`` ("Tasks, stops and resumption").
    program_ops_first : bool
        With ``fused_first``: split each task whose node holds pre-defined operators only one level further (so
        that the fusing kernels below it are classed), and run first, within each class, the tasks whose
        pre-defined operators the program itself applies (``K``'s transpose in attention, not ``Q``'s). An
        order too: a complete search finds the same candidates. See ``docs/search.md`` ("Tasks, stops and
        resumption").
    sub_stabilises_only : bool
        Admit a ``sub`` (block-level or pre-defined) only as a stable softmax's: its subtrahend is a maximum of
        its minuend's expression (a tile's or row's max, a running max, a saved maximum read back), and only an
        ``exp`` reads its result. False by default: it narrows the space (it is no pruning rule: a ``sub`` of
        any other form, e.g. ``x − y − max(x)`` or a saved difference, is no longer searched); see
        ``docs/search.md``.
    exp_stabilised_only : bool
        Admit an ``exp`` operator (block-level or pre-defined) only on a ``sub`` result, so that every
        exponential is a stable softmax's (the online-softmax accumulators exponentiate inside, with their running
        maximum). False by default: it narrows the space, dropping the unstable ``exp(x)`` forms of a program
        written with the stable softmax (and every µGraph of a program with another ``exp``); see
        ``docs/search.md``.
    loop_concats : bool
        Whether a for-loop accumulator may concatenate its input's iterations along a dim (besides summing,
        maximising and the online softmax). False narrows the space (it is no pruning rule: a block graph that
        gathers its loop's tiles, e.g. a split's scores for a softmax after the loop, is no longer searched); see
        ``docs/search.md``.
    max_last_dim_only : bool
        Admit a block-level ``max`` only over its operand's last dim (a softmax row's). True narrows the space (it
        is no pruning rule: a maximum over a GQA block's query heads, or over splits saved along another dim, is
        no longer searched); see ``docs/search.md``.
    own_predefined_only : bool
        Admit a pre-defined operator only where the program applies it: the same operator and attributes on
        the same operands, traced back to the inputs (the direct µGraph's kernels), which may then read a
        ``scale``'s result as the program's operator does (``X − mean X``). True narrows the space (it is no
        pruning rule: a pre-defined operator the program does not apply, e.g. ``X W`` before a normalisation,
        is no longer searched); the limits derived for a program too large for one block graph set it. See
        ``docs/search.md``.
    """

    program: Program = field(compare=False, hash=False, repr=False)
    hw: str = "h100"
    max_kernel_ops: int = 2
    min_kernel_ops: int = 1
    max_block_ops: int = 5
    max_block_inputs: int = 3
    max_block_outputs: int = 2
    max_block_nodes: int | None = None
    max_block_graphs: int | None = None
    graph_defined_last: bool = False
    max_grid_dims: int = 3
    prune: bool = True
    canonical: bool = True
    schedule: ScheduleMode = "markov"
    seed: int = 0
    delta: float = 1e-9
    max_trials: int | None = 64
    expr_filter: bool = True
    ops: tuple[str, ...] | None = None
    dims: DimStrategy | None = None
    replicated_writes: bool = True
    fused_first: bool = False
    parallel_first: bool = False
    program_ops_first: bool = False
    sub_stabilises_only: bool = False
    exp_stabilised_only: bool = False
    loop_concats: bool = True
    max_last_dim_only: bool = False
    own_predefined_only: bool = False
    program_text: str = field(default="", init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.program, Program):
            raise ConfigError(f"search spec: program must be a Program, got {type(self.program).__name__}")
        if not self.program.outputs:
            raise ConfigError(f"search spec: program '{self.program.name}' has no outputs")
        if (why := unsearched(self.program)) is not None:
            raise UnsupportedOpError(f"search spec: program '{self.program.name}': {why}")
        object.__setattr__(self, "program_text", _program_text(self.program))
        self._check_size()
        check_limits(self)
        if self.dims is not None and not isinstance(self.dims, DimStrategy):
            raise ConfigError(f"search spec: dims must be a DimStrategy, got {type(self.dims).__name__}")
        if self.dims is not None:
            self._check_dims(self.dims)
        if self.ops is not None:
            object.__setattr__(self, "ops", tuple(sorted({parse_op(o).value for o in self.ops})))
            self._check_ops()

    def _check_size(self) -> None:
        """Candidates are verified by evaluating them at the program's shapes, so shapes too large to evaluate are
        refused before the search splits into tasks or checks anything."""
        for n in self.program.nodes:
            size = math.prod(n.shape)
            if size > MAX_SEARCH_ELEMENTS:
                raise ConfigError(
                    f"search spec: tensor '{n.name}' of program '{self.program.name}' has {size:,} "
                    f"elements, more than the {MAX_SEARCH_ELEMENTS:,} a search evaluates; search at "
                    "small shapes (docs/search.md, 'Choosing search shapes')"
                )

    def _check_dims(self, dims: DimStrategy) -> None:
        """A strategy none of whose imaps (omaps, fmaps) fits the program's tensors admits no block graph, so the
        search would walk for nothing: refused up front. (A strategy with some maps beyond the tensors' rank is
        fine: those maps never apply.)"""
        rank = max(len(n.shape) for n in self.program.nodes)
        for kind, maps in (("imaps", dims.imaps), ("omaps", dims.omaps)):
            if maps is not None and not any(all(d < rank for d in m) for m in maps):
                raise ConfigError(
                    f"search spec: dims '{dims.name}': every listed {kind[:-1]} names a data dim "
                    f"beyond the program's tensors (at most {rank} dims, numbered from 0)"
                )
        if dims.fmaps is not None and not any(f < rank for f in dims.fmaps):
            raise ConfigError(
                f"search spec: dims '{dims.name}': every listed fmap names a data dim beyond the "
                f"program's tensors (at most {rank} dims, numbered from 0)"
            )

    def _check_ops(self) -> None:
        """An operator set that cannot make the program is refused up front: without some operator whose mark
        the program's outputs carry (exp, sqrt, an activation, div; see needed_ops), no µGraph's expression
        equals the program's, so the default search (expression filter on) would walk for nothing."""
        if not self.ops:
            raise ConfigError(
                "search spec: ops is empty (name at least one operator type, or leave it unset)"
            )
        if not (self.prune and self.expr_filter):
            return
        from gensorage.exhaustive.opcatalog import program_ops
        from gensorage.exhaustive.rules.needed_ops import MARK_OPS

        lacking = sorted(op.value for op in program_ops(self.program) & MARK_OPS if op.value not in self.ops)
        if lacking:
            raise ConfigError(
                f"search spec: ops lacks {', '.join(lacking)}, which the program uses; no µGraph "
                "without it has the program's expression (add it, or leave ops unset)"
            )

    @property
    def op_types(self) -> tuple[Op, ...] | None:
        """The requested operator types, or None to derive them from the program."""
        return None if self.ops is None else tuple(Op(o) for o in self.ops)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict; :meth:`from_json` rebuilds an equal spec."""
        out: dict[str, Any] = {"format": SPEC_FORMAT, "version": SPEC_VERSION, "program": self.program_text}
        for f in fields(self):
            if f.name in ("program", "program_text"):
                continue
            value = getattr(self, f.name)
            if (
                (f.name in OMITTED_WHEN_NONE and value is None)
                or (f.name in OMITTED_WHEN_TRUE and value is True)
                or (f.name in OMITTED_WHEN_FALSE and value is False)
                or (f.name in OMITTED_WHEN_ONE and value == 1)
            ):
                continue  # keeps the keys (checkpoint names) of specs written before the field existed
            if isinstance(value, DimStrategy):
                out[f.name] = value.to_json()
            else:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @staticmethod
    def from_json(data: Any) -> SearchSpec:
        """The spec of a :meth:`to_json` dict; a malformed one is a :class:`ConfigError`."""
        if not isinstance(data, dict) or data.get("format") != SPEC_FORMAT:
            raise ConfigError("search spec: not a gensorage search-spec document")
        if data.get("version") != SPEC_VERSION:
            raise ConfigError(
                f"search spec: unsupported version {data.get('version')!r} (expected {SPEC_VERSION})"
            )
        text = data.get("program")
        if not isinstance(text, str):
            raise ConfigError("search spec: 'program' must be the program's .gsp text")
        known = {f.name for f in fields(SearchSpec)} - {"program", "program_text"}
        unknown = sorted(set(data) - known - {"format", "version", "program"})
        if unknown:
            raise ConfigError(f"search spec: unknown field(s) {', '.join(unknown)}")
        kwargs = {k: data[k] for k in known if k in data}
        if kwargs.get("ops") is not None:
            kwargs["ops"] = tuple(kwargs["ops"])
        if kwargs.get("dims") is not None:
            kwargs["dims"] = DimStrategy.from_json(kwargs["dims"], "search spec: dims")
        return SearchSpec(program=parse_program(text, source="search spec"), **kwargs)

    def key(self) -> str:
        """A stable hash of :meth:`to_json` and of the hardware profile's numbers (the checkpoint key): equal
        specs, equal keys, in every process; editing the profile file makes it another search, since memory
        limits and predicted times come from it."""
        from gensorage.hw.loader import profile_fingerprint

        blob = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        blob += "\nhw " + profile_fingerprint(self.hw)
        return hashlib.sha256(blob.encode()).hexdigest()[:24]


def check_limits(spec: Any) -> None:
    """The checks of a spec's limits and switches that need no program, on anything with the spec's fields as
    attributes: :class:`SearchSpec` runs them, and so does a preset's ``[search]`` table when the preset is loaded,
    whatever mode then runs (fast mode builds no spec, and took a broken table silently)."""
    for name in (
        "max_kernel_ops",
        "min_kernel_ops",
        "max_block_ops",
        "max_block_inputs",
        "max_block_outputs",
    ):
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"search spec: {name} must be a positive integer, got {value!r}")
    if spec.min_kernel_ops > spec.max_kernel_ops:
        raise ConfigError(
            f"search spec: min_kernel_ops ({spec.min_kernel_ops}) is more than max_kernel_ops "
            f"({spec.max_kernel_ops})"
        )
    for name, least in (("max_block_nodes", 2), ("max_block_graphs", 1)):
        value = getattr(spec, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
            what = "a positive integer" if least == 1 else f"an integer >= {least}"
            raise ConfigError(f"search spec: {name} must be {what} or None, got {value!r}")
    if spec.max_grid_dims not in (1, 2, 3):
        raise ConfigError(f"search spec: max_grid_dims must be 1, 2 or 3, got {spec.max_grid_dims!r}")
    if spec.schedule not in SCHEDULE_MODES:
        raise ConfigError(
            f"search spec: schedule must be one of {', '.join(SCHEDULE_MODES)}, got {spec.schedule!r}"
        )
    if isinstance(spec.delta, bool) or not isinstance(spec.delta, int | float) or not 0.0 < spec.delta < 1.0:
        raise ConfigError(f"search spec: delta must be in (0, 1), got {spec.delta!r}")
    if spec.max_trials is not None and (
        isinstance(spec.max_trials, bool) or not isinstance(spec.max_trials, int) or spec.max_trials < 1
    ):
        raise ConfigError(
            f"search spec: max_trials must be a positive integer or None, got {spec.max_trials!r}"
        )
    for name in SWITCHES:
        if not isinstance(getattr(spec, name), bool):
            raise ConfigError(f"search spec: {name} must be true or false, got {getattr(spec, name)!r}")
    for name in ("parallel_first", "program_ops_first"):
        if getattr(spec, name) and not spec.fused_first:
            raise ConfigError(f"search spec: {name} orders the fusing tasks and needs fused_first")
    if isinstance(spec.seed, bool) or not isinstance(spec.seed, int) or spec.seed < 0:
        raise ConfigError(f"search spec: seed must be a non-negative integer, got {spec.seed!r}")
    for op in spec.ops or ():
        if not isinstance(op, str):
            raise ConfigError(f"search spec: ops must be operator names, got {op!r}")
        parse_op(op)


def _program_text(program: Program) -> str:
    """The program's ``.gsp`` text without comment lines (the loader's parameter note would not round-trip)."""
    return "".join(
        line for line in dump_program(program).splitlines(keepends=True) if not line.startswith("#")
    )


__all__ = ["SCHEDULE_MODES", "ScheduleMode", "SearchSpec"]

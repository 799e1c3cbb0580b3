"""The mutable state of the depth-first search: the kernel graph built so far and the block graph in progress.

Everything is kept in parallel lists that operators are pushed onto and popped off (the search undoes every
change on the way back up), so the inner loop allocates little: a candidate operator costs a rank comparison, a
shape computation, one hash-consed expression and (mostly cached) oracle lookup before anything is pushed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gensorage.dtypes import dtype_bytes
from gensorage.exhaustive.expr.abstract_expr import Term, var
from gensorage.exhaustive.expr.expr_arith import ExprValue
from gensorage.exhaustive.expr.ties import Ties, input_ties
from gensorage.exhaustive.opcatalog import OpVariant
from gensorage.exhaustive.rules.constants import Const
from gensorage.exhaustive.spec import SearchSpec
from gensorage.exhaustive.walk.provenance import Provenance
from gensorage.exhaustive.walk.rank import RankKey
from gensorage.hw.profile import HwProfile
from gensorage.opset import Shape
from gensorage.program import Program
from gensorage.ugraph.ir import ACCUM_KINDS, AccumKind, KernelNode, KernelOp, Ref, TensorSpec


def free_after(b: BlockBuild, ins: tuple[int, ...]) -> int:
    """The unconsumed-tensor count after an operator reading ``ins`` is added."""
    return b.free + 1 - len({i for i in ins if b.uses[i] == 0})


def ops_left(spec: SearchSpec, b: BlockBuild, extra_nodes: int = 0) -> int:
    """Compute operators the block graph may still add (after ``extra_nodes`` more accumulators): the
    ``max_block_ops`` budget, and Mirage's ``max_block_nodes`` (iterators, operators and accumulators) if set."""
    left = spec.max_block_ops - b.n_ops
    nodes = spec.max_block_nodes
    if nodes is not None:
        left = min(left, nodes - len(b.inputs) - len(b.recs) - extra_nodes)
    return left


def numel(shape: Shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@dataclass(slots=True)
class BlockOpRec:
    """A compute operator of the block graph in progress (``inputs`` are block tensor indices)."""

    variant: OpVariant
    inputs: tuple[int, ...]


@dataclass(slots=True)
class AccumRec:
    """A for-loop accumulator of block tensor ``input`` (``fmap`` None combines with ``kind``, a dim
    concatenates); ``values`` is the value tensor of a ``softmax_matmul``."""

    input: int
    fmap: int | None
    kind: AccumKind = "sum"
    values: int | None = None

    @property
    def inputs(self) -> tuple[int, ...]:
        return (self.input,) if self.values is None else (self.input, self.values)

    @property
    def code(self) -> int:
        """The kind's place in the rank key's attributes (a concatenation's is its dim)."""
        return -1 - ACCUM_KINDS.index(self.kind) if self.fmap is None else self.fmap


@dataclass(slots=True)
class BlockBuild:
    """A graph-defined operator's block graph under construction.

    Block tensors are indexed like block nodes: input iterators ``0 .. m-1`` (one per kernel input, in order),
    then one per operator pushed. An iterator is *unbound* (imap/fmap not chosen, shape None) until an operator
    first reads it; the grid sizes and the for-loop trip count are chosen when the first iterator that needs them
    is bound (see :mod:`gensorage.exhaustive.walk.block_level`).
    """

    inputs: tuple[int, ...]  # kernel tensor indices read by the iterators
    r: int  # grid dims
    looped: bool
    grid: list[int | None]
    forloop: int | None  # None: looped but not chosen yet
    imap: list[tuple[int | None, ...] | None]
    fmap: list[int | None]
    shape: list[Shape | None]
    val: list[ExprValue | None]
    post: list[bool]  # after the for-loop (reads an accumulator)
    fdep: list[bool]  # depends on an iterator with an fmap (varies across iterations)
    uses: list[int]
    dtype: list[str]
    prov: list[Provenance]  # see gensorage.exhaustive.walk.provenance
    scaled: list[bool]  # the result of a scale operator
    const: list[Const]  # the constant factor each tensor carries (see constants)
    ties: list[Ties | None]  # each tensor's index ties (see ties; None when the rule is off or unbound)
    recs: list[BlockOpRec | AccumRec] = field(default_factory=list)
    keys: list[RankKey] = field(default_factory=list)
    n_ops: int = 0
    # Bytes of every tile so far, none shared. Validity charges the footprint planned by liveness
    # (gensorage.ugraph.optimize.memory_plan), at most this plus alignment padding and often far less: the
    # search still prunes block graphs that planning would fit.
    smem: int = 0
    exact: bool = (
        True  # False when an input is a concatenation: the tile-0 expressions then under-approximate
    )
    free: int = 0  # unconsumed tensors, unused iterators included (each must be consumed or saved)
    max_outputs: int = 1  # savers allowed when it finishes
    last_kernel_op: bool = False  # it is the last kernel operator the limits allow
    # (iterator, binding, trip count) -> the iterator's (tile expression, ties, provenance): the kernel tensors it
    # reads are fixed while the block is open, and every operator that first reads an iterator binds it again.
    bound_tiles: dict[tuple[object, ...], tuple[ExprValue, Ties | None, Provenance]] = field(
        default_factory=dict
    )
    # An iterator's binding options (and their groups by tile), keyed by iterator, grid sizes and trip count: the
    # other arguments of bindings.binding_options are fixed while the block is open.
    bindings_memo: dict[tuple[object, ...], tuple[object, ...]] = field(default_factory=dict)
    # What the kernel tensors offer later kernel operators (block_level.earlier_site), taken once per block:
    # (no tensor is a concatenation, their expressions, whether one carries a factor, their ties).
    kernel_view: tuple[bool, list[Term], bool, list[Ties | None]] | None = None

    def viable(self, free: int, n_ops: int, max_ops: int) -> bool:
        """Whether a state with ``free`` unconsumed tensors and ``n_ops`` operators can still finish.

        An operator consumes at most two tensors and adds one, so each remaining operator lowers the count by at
        most one (accumulators and unary operators by none); finishing needs at most ``max_outputs`` left.
        """
        return free - (max_ops - n_ops) <= self.max_outputs


class SearchState:
    """Kernel graph prefix (tensors, operators, ranks) plus the block graph in progress, if any."""

    def __init__(self, program: Program, hw: HwProfile, ties: bool = False) -> None:
        self.program = program
        self.hw = hw
        self.specs: tuple[TensorSpec, ...] = tuple(
            TensorSpec(t.name, t.shape, t.dtype) for t in program.inputs
        )
        n = len(self.specs)
        self.shape: list[Shape] = [s.shape for s in self.specs]
        self.dtype: list[str] = [s.dtype for s in self.specs]
        self.val: list[ExprValue] = [ExprValue(s.shape, var(s.name)) for s in self.specs]
        self.uses: list[int] = [0] * n
        self.ref: list[Ref] = [Ref(i) for i in range(n)]
        self.scaled: list[bool] = [False] * n
        self.const: list[Const] = [1.0] * n
        self.ties: list[Ties | None] = [
            input_ties(i, s.shape) if ties else None for i, s in enumerate(self.specs)
        ]
        self.ops: list[KernelNode] = []
        self.op_keys: list[RankKey] = []
        self.op_outputs: list[int] = []  # tensors each op produced
        self.dram = sum(numel(s.shape) * dtype_bytes(s.dtype) for s in self.specs)
        self.block: BlockBuild | None = None

    @property
    def n_inputs(self) -> int:
        return len(self.specs)

    def op_signature(self, r: Ref) -> object:
        """Kernel tensor ``r`` as :func:`~gensorage.exhaustive.opcatalog.program_op_signatures` writes the
        program's operators: an input by its index, a pre-defined operator's result by its kind, attributes and
        operands (None where an operand is a graph-defined operator's result)."""
        if r.node < self.n_inputs:
            return r.node
        op = self.ops[r.node - self.n_inputs]
        if not isinstance(op, KernelOp):
            return None
        return op.op.value, op.attrs, tuple(self.op_signature(i) for i in op.inputs)

    @property
    def last_key(self) -> RankKey | None:
        return self.op_keys[-1] if self.op_keys else None

    # ------------------------------------------------------------------ kernel level

    def push_kernel(
        self,
        node: KernelNode,
        key: RankKey,
        inputs: tuple[int, ...],
        outs: list[tuple[Shape, str, ExprValue]],
        consts: list[Const],
        scaled: bool = False,
        ties: list[Ties | None] | None = None,
    ) -> None:
        """Append kernel operator ``node`` reading tensors ``inputs`` and producing ``outs`` (carrying the
        factors ``consts`` and the index ties ``ties``)."""
        k = len(self.specs) + len(self.ops)
        for i in inputs:
            self.uses[i] += 1
        for j, (shape, dtype, value) in enumerate(outs):
            self.shape.append(shape)
            self.dtype.append(dtype)
            self.val.append(value)
            self.uses.append(0)
            self.scaled.append(scaled)
            self.const.append(consts[j])
            self.ties.append(None if ties is None else ties[j])
            self.ref.append(Ref(k, j))
            self.dram += numel(shape) * dtype_bytes(dtype)
        self.ops.append(node)
        self.op_keys.append(key)
        self.op_outputs.append(len(outs))

    def pop_kernel(self, inputs: tuple[int, ...]) -> None:
        for _ in range(self.op_outputs.pop()):
            shape, dtype = self.shape.pop(), self.dtype.pop()
            self.dram -= numel(shape) * dtype_bytes(dtype)
            self.val.pop()
            self.uses.pop()
            self.scaled.pop()
            self.const.pop()
            self.ties.pop()
            self.ref.pop()
        self.ops.pop()
        self.op_keys.pop()
        for i in inputs:
            self.uses[i] -= 1

    # ------------------------------------------------------------------ block level

    def open_block(
        self, inputs: tuple[int, ...], r: int, looped: bool, max_outputs: int, last_kernel_op: bool
    ) -> BlockBuild:
        m = len(inputs)
        exact = all(self.val[i].layout is None for i in inputs)
        self.block = BlockBuild(
            inputs=inputs,
            r=r,
            looped=looped,
            grid=[None] * r,
            forloop=None if looped else 1,
            imap=[None] * m,
            fmap=[None] * m,
            shape=[None] * m,
            val=[None] * m,
            post=[False] * m,
            fdep=[False] * m,
            uses=[0] * m,
            dtype=[self.dtype[i] for i in inputs],
            prov=[None] * m,
            scaled=[False] * m,
            const=[self.const[i] for i in inputs],
            ties=[None] * m,
            exact=exact,
            free=m,
            max_outputs=max_outputs,
            last_kernel_op=last_kernel_op,
        )
        return self.block

    def close_block(self) -> None:
        self.block = None

    def push_block(
        self,
        rec: BlockOpRec | AccumRec,
        key: RankKey,
        shape: Shape,
        value: ExprValue,
        post: bool,
        fdep: bool,
        prov: Provenance,
        const: Const,
        scaled: bool = False,
        ties: Ties | None = None,
    ) -> None:
        b = self.block
        assert b is not None
        ins = rec.inputs
        for i in ins:
            if b.uses[i] == 0:
                b.free -= 1
            b.uses[i] += 1
        b.free += 1
        b.recs.append(rec)
        b.keys.append(key)
        b.shape.append(shape)
        b.val.append(value)
        b.post.append(post)
        b.fdep.append(fdep)
        b.prov.append(prov)
        b.scaled.append(scaled)
        b.const.append(const)
        b.ties.append(ties)
        b.uses.append(0)
        b.dtype.append(b.dtype[ins[0]])
        b.smem += numel(shape) * dtype_bytes(b.dtype[-1])
        if isinstance(rec, BlockOpRec):
            b.n_ops += 1

    def pop_block(self) -> None:
        b = self.block
        assert b is not None
        rec = b.recs.pop()
        b.keys.pop()
        shape = b.shape.pop()
        b.val.pop()
        b.post.pop()
        b.fdep.pop()
        b.prov.pop()
        b.scaled.pop()
        b.const.pop()
        b.ties.pop()
        b.uses.pop()
        b.smem -= numel(shape) * dtype_bytes(b.dtype.pop())  # type: ignore[arg-type]
        ins = rec.inputs
        b.free -= 1
        for i in ins:
            b.uses[i] -= 1
            if b.uses[i] == 0:
                b.free += 1
        if isinstance(rec, BlockOpRec):
            b.n_ops -= 1


__all__ = ["AccumRec", "BlockBuild", "BlockOpRec", "SearchState", "free_after", "numel", "ops_left"]

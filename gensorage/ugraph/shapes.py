"""Shape and dtype inference for every tensor of a µGraph, checking each operator's spec on the way.

Dtypes follow the graph's precision policy (:mod:`gensorage.precision`): ``dtype`` is what a tensor is stored
in, ``program_dtype`` what the program's own types give it; a kernel-graph output is stored in its program dtype,
and so is a value a reshape passes to an output (:func:`stored_as_outputs`: a reshape is a view, it cannot cast).
Under ``"float32"`` a value that flows only into ``exp`` (:mod:`gensorage.ugraph.exp_operands`: a softmax's
scores, ``S − max S``, the maxima) is stored in float32 too, unless it is a kernel-level reshape (a view, which
keeps its input's dtype).

Kernel tensors have full shapes; a block-level tensor's shape is the per-block, per-iteration tile (an
accumulator's is the accumulated tile). Every violation is a :class:`UGraphError` whose message names the kernel
node (``%n``, its index in ``inputs + ops``), the block node (``#j``) and the thread op where relevant.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gensorage import opset
from gensorage.errors import ProgramError, UGraphError
from gensorage.opset import ELEMENTWISE, Op, Shape
from gensorage.precision import (
    DEFAULT_PRECISION,
    NORMALISED,
    UNIT,
    Producer,
    is_square,
    stored_dtype,
    value_range,
)
from gensorage.ugraph.convex_rows import NodeOf, convex_values, damped_values, weighted_sum
from gensorage.ugraph.exp_operands import ExpOperands, exp_operands
from gensorage.ugraph.ir import (
    ACCUM_KINDS,
    GRID_AXES,
    ONLINE_SOFTMAX_KINDS,
    Accumulator,
    BlockGraph,
    BlockOp,
    GraphDefinedOp,
    InputIterator,
    KernelGraph,
    KernelOp,
    OutputSaver,
    Ref,
    ThreadGraph,
)
from gensorage.ugraph.matmul_operands import matmul_operands

SIXTEEN_BIT = ("float16", "bfloat16")


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """A tensor's shape, the dtype it is stored in, and (when they differ) the dtype the program gives it."""

    shape: Shape
    dtype: str
    program: str = ""  # "" when the program's dtype is the stored one

    @property
    def program_dtype(self) -> str:
        return self.program or self.dtype

    def stored_as(self, dtype: str) -> TensorInfo:
        """This tensor stored in ``dtype`` (its program dtype unchanged)."""
        program = self.program_dtype
        return TensorInfo(self.shape, dtype, "" if program == dtype else program)


@dataclass(frozen=True, slots=True)
class BlockInfo:
    """Inferred tiles of one block graph.

    ``nodes[j]``: output tiles of block node ``j`` (empty for savers); ``threads[j]``: for a thread graph node,
    the tiles of its local values (``inputs + ops``), else ``()``; ``outputs``: the full kernel-level outputs.
    """

    nodes: tuple[tuple[TensorInfo, ...], ...]
    threads: tuple[tuple[TensorInfo, ...], ...]
    outputs: tuple[TensorInfo, ...]


@dataclass(frozen=True, slots=True)
class GraphInfo:
    """``nodes[n]``: output tensors of kernel node ``n`` (inputs first); ``blocks[k]``: op ``k``'s block info."""

    nodes: tuple[tuple[TensorInfo, ...], ...]
    blocks: tuple[BlockInfo | None, ...]

    def of(self, ref: Ref) -> TensorInfo:
        return self.nodes[ref.node][ref.out]


def node_kind(node: object) -> str:
    """Short name of a node kind for messages and text."""
    match node:
        case KernelOp() | BlockOp():
            return node.op.value
        case GraphDefinedOp():
            return "graph-defined"
        case InputIterator():
            return "iterator"
        case ThreadGraph():
            return "thread graph"
        case Accumulator():
            return "accumulator"
        case OutputSaver():
            return "saver"
        case _:
            return type(node).__name__


def kernel_where(g: KernelGraph, k: int) -> str:
    return f"kernel op %{len(g.inputs) + k} ({node_kind(g.ops[k])})"


def block_where(g: KernelGraph, k: int, j: int) -> str:
    node = g.ops[k]
    assert isinstance(node, GraphDefinedOp)
    return f"{kernel_where(g, k)}, block node #{j} ({node_kind(node.block.nodes[j])})"


def resolve(ref: Ref, infos: Sequence[tuple[TensorInfo, ...]], where: str) -> TensorInfo:
    """The tensor ``ref`` names among the nodes before the current one (``infos``), or a UGraphError."""
    if not 0 <= ref.node < len(infos):
        raise UGraphError(
            f"{where}: reference to node {ref.node} is not an earlier node (0..{len(infos) - 1})"
        )
    outs = infos[ref.node]
    if not 0 <= ref.out < len(outs):
        raise UGraphError(f"{where}: reference to output {ref.out} of node {ref.node}, which has {len(outs)}")
    return outs[ref.out]


def _op_shape(
    op: Op,
    args: Sequence[TensorInfo],
    attrs: opset.Attrs,
    where: str,
    refs: Sequence[Ref] = (),
    precision: str = DEFAULT_PRECISION,
    bounded: bool = False,
    into_exp: bool = False,
    within: str | None = None,
) -> TensorInfo:
    """``op``'s result on ``args`` (read through ``refs``): its shape, and dtypes under ``precision``
    (``bounded``: the structure proves it in [0, 1], so the program's dtype holds it; ``into_exp``: it flows
    only into exp, so the float32 policy stores it in float32; ``within``: the stored dtype of a tensor whose
    range holds it, :mod:`gensorage.ugraph.convex_rows`)."""
    try:
        shape = opset.infer_shape(op, [a.shape for a in args], attrs)
    except ProgramError as e:
        raise UGraphError(f"{where}: {e}") from None
    square = is_square(op, refs)
    program = _stored(op, [a.program_dtype for a in args], square, "storage", attrs)
    if bounded or (within == program and within in SIXTEEN_BIT):
        return TensorInfo(shape, program)
    dtype = _stored(op, [a.dtype for a in args], square, precision, attrs)
    if within == "float32" and precision == "float32":  # a weighted sum: as large as a sum (autocast's list)
        dtype = stored_dtype(Op.SUM, [dtype], False, precision)
    if into_exp and precision == "float32":
        dtype = stored_dtype(Op.EXP, [dtype], False, precision)  # an exp operand: float32 at least
    return TensorInfo(shape, program).stored_as(dtype)


def _stored(op: Op, dtypes: Sequence[str], square: bool, precision: str, attrs: opset.Attrs) -> str:
    """:func:`stored_dtype` of ``op``; a matmul's epilogue steps each as its own op would store (the last one's)."""
    steps = opset.epilogue(attrs) if op is Op.MATMUL else ()
    if not steps:
        return stored_dtype(op, dtypes, square, precision)
    values = [stored_dtype(op, dtypes[:2], False, precision), *dtypes[2:]]
    for name, args, _ in steps:
        sq = Op(name) is Op.MUL and len(args) == 2 and args[0] == args[1]
        values.append(stored_dtype(Op(name), [values[i] for i in args], sq, precision))
    return values[-1]


def _within(
    op: Op, refs: tuple[Ref, ...], node_of: NodeOf, infos: Sequence[tuple[TensorInfo, ...]], where: str
) -> str | None:
    """What :mod:`.convex_rows` says ``op``'s result fits: the stored dtype of the tensor whose range holds it,
    ``"float32"`` for an unnormalised weighted sum, None where it says nothing."""
    if weighted_sum(op, refs, node_of):
        return "float32"
    v = convex_values(op, refs, node_of, lambda r: len(resolve(r, infos, where).shape))
    v = damped_values(op, refs, functools.partial(_produced, node_of)) if v is None else v
    return resolve(v, infos, where).dtype if v is not None else None


def _produced(node_of: NodeOf, r: Ref) -> tuple[Op, tuple[Ref, ...], opset.Attrs] | None:
    """The operator, operands and attributes ``r``'s value comes from (None: not an operator's result)."""
    node = node_of(r)
    return (node.op, node.inputs, node.attrs) if isinstance(node, BlockOp | KernelOp) else None


class _Ranges:
    """What the structure proves of each value's range at one level (:func:`gensorage.precision.value_range`);
    a block's also holds its thread graphs' values (:func:`thread_shapes`)."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.known: dict[Any, str] = {}

    def of(self, at: Ref, op: Op, refs: Sequence[Ref], attrs: opset.Attrs) -> bool:
        """Record ``at``'s range; whether it is in [0, 1]."""
        found = value_range(op, refs, attrs, self.producer, self.known)
        if found is not None:
            self.known[at] = found
        return found in (UNIT, NORMALISED)


def _check_dim(dim: object, ndim: int, what: str, where: str) -> int:
    if not isinstance(dim, int) or isinstance(dim, bool) or not 0 <= dim < ndim:
        raise UGraphError(f"{where}: {what} {dim!r} is not a dim of a {ndim}-d tensor")
    return dim


def iterator_tile(it: InputIterator, shape: Shape, grid: Sequence[int], forloop: int, where: str) -> Shape:
    """Tile of ``shape`` one block loads per iteration under ``it``'s imap and fmap."""
    if len(it.imap) != len(grid):
        raise UGraphError(f"{where}: imap has {len(it.imap)} entries for a {len(grid)}-d grid")
    tile = list(shape)
    for g, d in enumerate(it.imap):
        if d is None:
            continue
        _check_dim(d, len(tile), f"imap {GRID_AXES[g]} dim", where)
        if tile[d] % grid[g]:
            raise UGraphError(
                f"{where}: imap {GRID_AXES[g]}->{d} does not divide: dim {d} of size {tile[d]} over {grid[g]} blocks"
            )
        tile[d] //= grid[g]
    if it.fmap is not None:
        if forloop == 1:
            raise UGraphError(f"{where}: fmap {it.fmap} given but the block graph has no for-loop")
        d = _check_dim(it.fmap, len(tile), "fmap dim", where)
        if tile[d] % forloop:
            raise UGraphError(
                f"{where}: fmap {d} does not divide: tile dim of size {tile[d]} over {forloop} iterations"
            )
        tile[d] //= forloop
    return tuple(tile)


def thread_shapes(
    tg: ThreadGraph,
    args: Sequence[TensorInfo],
    where: str,
    precision: str = DEFAULT_PRECISION,
    into_exp: frozenset[int] = frozenset(),
    block: tuple[_Ranges, Callable[[Ref], Any]] | None = None,
) -> tuple[TensorInfo, ...]:
    """Tiles of a thread graph's local values (inputs then ops); its ops must be elementwise (``into_exp``: the
    local values that flow only into exp). ``block``: the enclosing block's ranges (whose producer knows every
    thread graph's values) and the key each local value has there, so a range proof runs through the block's
    operators (a row-fused softmax: ``exp(S − max S)`` in one thread graph, its block sum, the division in the
    next; a row-fused norm's squares, sum and division) and the outputs' proofs reach the block."""
    if not tg.ops:
        raise UGraphError(f"{where}: a thread graph needs at least one op")
    if not tg.outputs:
        raise UGraphError(f"{where}: a thread graph needs at least one output")
    local: list[tuple[TensorInfo, ...]] = [(a,) for a in args]

    def producer(r: Ref) -> tuple[Op, tuple[Ref, ...], opset.Attrs] | None:
        n = r.node - len(args)
        return (tg.ops[n].op, tg.ops[n].inputs, tg.ops[n].attrs) if 0 <= n < len(tg.ops) else None

    ranges, key = block if block is not None else (_Ranges(producer), lambda r: r)
    for i, top in enumerate(tg.ops):
        here = f"{where}, thread op {i} ({top.op.value})"
        if top.op not in ELEMENTWISE:
            raise UGraphError(f"{here}: only elementwise ops may run in a thread graph")
        ins = [resolve(r, local, here) for r in top.inputs]
        keyed = tuple(key(r) for r in top.inputs)
        unit = ranges.of(key(Ref(len(local))), top.op, keyed, top.attrs)
        lead = len(local) in into_exp
        damped = damped_values(top.op, keyed, ranges.producer) is not None  # within its numerator's range
        within = resolve(top.inputs[0], local, here).dtype if damped else None
        args_ = (top.op, ins, top.attrs, here, top.inputs, precision, unit, lead, within)
        local.append((_op_shape(*args_),))
    for r in tg.outputs:
        resolve(r, local, f"{where}, thread output")
        if r.node < len(args):
            raise UGraphError(f"{where}: thread output {r.node} is an input, not a computed value")
    return tuple(t for (t,) in local)


def _online_tile(
    acc: Accumulator, s: TensorInfo, v: TensorInfo | None, where: str, precision: str
) -> TensorInfo:
    """``softmax_sum``: one per score row (keys reduced, kept as a dim of 1); ``softmax_matmul``: ``exp(s)·v``."""
    if acc.fmap is not None:
        raise UGraphError(f"{where}: a {acc.kind} accumulator does not concatenate (fmap {acc.fmap})")
    if len(s.shape) < 2:
        raise UGraphError(f"{where}: {acc.kind} scores {list(s.shape)} need rows and keys (2+ dims)")
    if (acc.kind == "softmax_matmul") != (v is not None):
        raise UGraphError(f"{where}: a {acc.kind} accumulator {'needs' if v is None else 'takes no'} values")
    dtype = stored_dtype(Op.EXP, [s.dtype], False, precision)
    if v is None:
        return TensorInfo(s.shape[:-1] + (1,), s.program_dtype).stored_as(dtype)
    out = _op_shape(Op.MATMUL, [s, v], (), where, acc.reads, precision)
    return TensorInfo(out.shape, out.program_dtype).stored_as(
        stored_dtype(Op.SUM, [dtype, v.dtype], False, precision)
    )


def _accum_tile(acc: Accumulator, arg: TensorInfo, forloop: int, where: str, precision: str) -> TensorInfo:
    if acc.kind not in ("sum", "max"):
        raise UGraphError(f"{where}: accumulator kind {acc.kind!r} is not one of {ACCUM_KINDS}")
    if acc.fmap is None:
        # A loop sum is a sum: stored like one. A running max is stored in float32 too: an online softmax
        # subtracts it inside exp, where its rounding would scale every term (exp(ulp/2) at a logit of 100).
        return arg.stored_as(stored_dtype(Op.SUM, [arg.dtype], False, precision))
    if acc.kind != "sum":
        raise UGraphError(f"{where}: a concatenating accumulator (fmap {acc.fmap}) takes kind 'sum'")
    d = _check_dim(acc.fmap, len(arg.shape), "accumulator fmap dim", where)
    shape = arg.shape[:d] + (arg.shape[d] * forloop,) + arg.shape[d + 1 :]
    return TensorInfo(shape, arg.dtype, arg.program)


def saver_output(sv: OutputSaver, tile: TensorInfo, grid: Sequence[int], where: str) -> TensorInfo:
    """Full output of a saver: its tile's dims multiplied by the grid dims mapped onto them."""
    if len(sv.omap) != len(grid):
        raise UGraphError(f"{where}: omap has {len(sv.omap)} entries for a {len(grid)}-d grid")
    shape = list(tile.shape)
    for g, d in enumerate(sv.omap):
        _check_dim(d, len(shape), f"omap {GRID_AXES[g]} dim", where)
        shape[d] *= grid[g]
    if len(set(sv.omap)) != len(sv.omap):
        raise UGraphError(f"{where}: omap {list(sv.omap)} maps two grid dims to one output dim")
    return TensorInfo(tuple(shape), tile.dtype, tile.program)


def narrowed(info: TensorInfo) -> TensorInfo:
    """A float32 intermediate of a bfloat16 program that only matmuls read, stored in bfloat16 (the matmuls round
    it so anyway: :mod:`gensorage.ugraph.matmul_operands`); any other tensor as it is."""
    if info.dtype == "float32" and info.program_dtype == "bfloat16":
        return info.stored_as("bfloat16")
    return info


def _narrow(g: KernelGraph) -> frozenset[Ref]:
    return matmul_operands(g) if g.precision == "float32" else frozenset()


def stored_as_outputs(g: KernelGraph) -> set[Ref]:
    """The graph's outputs and the values reshapes pass to them: each is stored in its program dtype.

    The runner makes a reshape a view of its input (:func:`gensorage.codegen.predefined.is_alias`), so an output
    that is a reshape of a float32 intermediate would come back in float32 unless that intermediate is stored in
    the program's dtype: its producer casts on store, as the producer of any output does.
    """
    refs = set(g.outputs)
    for k in reversed(range(len(g.ops))):
        op = g.ops[k]
        if isinstance(op, KernelOp) and op.op is Op.RESHAPE and Ref(len(g.inputs) + k) in refs:
            refs.add(op.inputs[0])
    return refs


def block_shapes(
    g: KernelGraph,
    k: int,
    block: BlockGraph,
    args: Sequence[TensorInfo],
    into: ExpOperands | None = None,
    narrow: frozenset[Ref] | None = None,
) -> BlockInfo:
    """Infer every tile of op ``k``'s block graph given its kernel inputs ``args`` (``into``: the values of ``g``
    that flow only into exp; ``narrow``: those :func:`narrowed` stores; each computed here when not given)."""
    if into is None:
        into = exp_operands(g)
    if narrow is None:
        narrow = _narrow(g)
    here = kernel_where(g, k)
    if not 1 <= len(block.grid) <= 3:
        raise UGraphError(f"{here}: grid {list(block.grid)} must have 1 to 3 dims")
    if any(n < 1 for n in block.grid):
        raise UGraphError(f"{here}: grid {list(block.grid)} has a dim below 1")
    if block.forloop < 1:
        raise UGraphError(f"{here}: for-loop trip count {block.forloop} is below 1")
    infos: list[tuple[TensorInfo, ...]] = []
    threads: list[tuple[TensorInfo, ...]] = []
    outputs: list[TensorInfo] = []
    graph_outputs = stored_as_outputs(g)
    me = len(g.inputs) + k

    def block_node(r: Ref) -> object:
        return block.nodes[r.node] if 0 <= r.node < len(block.nodes) else None

    def thread_key(j: int, r: Ref) -> Any:
        """Thread graph ``j``'s local value as the block's ranges know it: an input as its block value, an output
        as the graph's output, another op's result as ("thread", j, node)."""
        tg = block.nodes[j]
        assert isinstance(tg, ThreadGraph)
        if r.node < len(tg.inputs):
            return tg.inputs[r.node]
        return Ref(j, tg.outputs.index(r)) if r in tg.outputs else ("thread", j, r.node)

    def producer(c: Any) -> tuple[Op, tuple[Any, ...], opset.Attrs] | None:
        n = c if isinstance(c, tuple) else block_node(c)
        if isinstance(n, BlockOp):
            return n.op, n.inputs, n.attrs
        if isinstance(n, ThreadGraph) and 0 <= c.out < len(n.outputs):
            j, local = c.node, n.outputs[c.out].node
        elif isinstance(n, tuple):
            _, j, local = n
        else:
            return None
        tg = block.nodes[j]
        assert isinstance(tg, ThreadGraph)
        if local < len(tg.inputs):
            return producer(tg.inputs[local])
        top = tg.ops[local - len(tg.inputs)]
        return top.op, tuple(thread_key(j, r) for r in top.inputs), top.attrs

    ranges = _Ranges(producer)
    for j, node in enumerate(block.nodes):
        where = block_where(g, k, j)
        local: tuple[TensorInfo, ...] = ()
        outs: tuple[TensorInfo, ...]
        match node:
            case InputIterator():
                if not 0 <= node.input < len(args):
                    raise UGraphError(f"{where}: input {node.input} out of range (op has {len(args)} inputs)")
                src = args[node.input]
                outs = (
                    TensorInfo(
                        iterator_tile(node, src.shape, block.grid, block.forloop, where),
                        src.dtype,
                        src.program,
                    ),
                )
            case BlockOp():
                ins = [resolve(r, infos, where) for r in node.inputs]
                unit = ranges.of(Ref(j), node.op, node.inputs, node.attrs)
                lead = (k, j, 0) in into.block
                within = _within(node.op, node.inputs, block_node, infos, where)
                args_ = (node.op, ins, node.attrs, where, node.inputs, g.precision, unit, lead, within)
                outs = (_op_shape(*args_),)
            case ThreadGraph():
                ins = [resolve(r, infos, where) for r in node.inputs]
                keyed = (ranges, functools.partial(thread_key, j))
                local = thread_shapes(node, ins, where, g.precision, into.thread_locals(k, j), keyed)
                outs = tuple(local[r.node] for r in node.outputs)
            case Accumulator() if node.kind in ONLINE_SOFTMAX_KINDS:
                ins = [resolve(r, infos, where) for r in node.reads]
                outs = (_online_tile(node, ins[0], (ins + [None])[1], where, g.precision),)
            case Accumulator():
                if node.values is not None:
                    raise UGraphError(f"{where}: a {node.kind!r} accumulator reads no values")
                acc = resolve(node.input, infos, where)
                outs = (_accum_tile(node, acc, block.forloop, where, g.precision),)
            case OutputSaver():
                full = saver_output(node, resolve(node.input, infos, where), block.grid, where)
                if Ref(me, len(outputs)) in graph_outputs:  # a program output keeps the program's dtype
                    full = full.stored_as(full.program_dtype)
                elif Ref(me, len(outputs)) in narrow:
                    full = narrowed(full)
                outputs.append(full)
                outs = ()
            case _:
                raise UGraphError(f"{where}: not a block node: {type(node).__name__}")
        infos.append(outs)
        threads.append(local)
    if not outputs:
        raise UGraphError(f"{here}: block graph has no output saver")
    return BlockInfo(tuple(infos), tuple(threads), tuple(outputs))


def infer(g: KernelGraph) -> GraphInfo:
    """Shapes and dtypes of every tensor of ``g``; raises :class:`UGraphError` at the first spec violation."""
    infos: list[tuple[TensorInfo, ...]] = []
    names: set[str] = set()
    graph_outputs = stored_as_outputs(g)
    for i, spec in enumerate(g.inputs):
        if spec.name in names:
            raise UGraphError(f"kernel input %{i}: duplicate name {spec.name!r}")
        names.add(spec.name)
        if not spec.shape or any(d < 1 for d in spec.shape):
            raise UGraphError(f"kernel input %{i} ({spec.name}): bad shape {list(spec.shape)}")
        infos.append((TensorInfo(spec.shape, spec.dtype),))
    blocks: list[BlockInfo | None] = []

    def kernel_node(r: Ref) -> object:
        return g.ops[r.node - len(g.inputs)] if 0 <= r.node - len(g.inputs) < len(g.ops) else None

    def producer(r: Ref) -> tuple[Op, tuple[Ref, ...], opset.Attrs] | None:
        n = kernel_node(r)
        return (n.op, n.inputs, n.attrs) if isinstance(n, KernelOp) else None

    ranges = _Ranges(producer)
    into = exp_operands(g)
    narrow = _narrow(g)
    for k, node in enumerate(g.ops):
        where = kernel_where(g, k)
        if isinstance(node, KernelOp):
            ins = [resolve(r, infos, where) for r in node.inputs]
            unit = ranges.of(Ref(len(infos)), node.op, node.inputs, node.attrs)
            # a kernel-level reshape is a view of its input (the runner aliases it), so it cannot cast: it keeps
            # its input's dtype even as an exp operand (a bfloat16 input's mask read as float32 was garbage)
            lead = Ref(len(infos)) in into.kernel and node.op is not Op.RESHAPE
            within = _within(node.op, node.inputs, kernel_node, infos, where)
            out = _op_shape(node.op, ins, node.attrs, where, node.inputs, g.precision, unit, lead, within)
            if Ref(len(infos)) in graph_outputs:  # a program output keeps the program's dtype
                out = out.stored_as(out.program_dtype)
            elif Ref(len(infos)) in narrow and node.op not in (Op.RESHAPE, Op.TRANSPOSE):  # views cannot cast
                out = narrowed(out)
            infos.append((out,))
            blocks.append(None)
        elif isinstance(node, GraphDefinedOp):
            ins = [resolve(r, infos, where) for r in node.inputs]
            info = block_shapes(g, k, node.block, ins, into, narrow)
            infos.append(info.outputs)
            blocks.append(info)
        else:
            raise UGraphError(f"{where}: not a kernel op: {type(node).__name__}")
    if not g.outputs:
        raise UGraphError("kernel graph has no outputs")
    for r in g.outputs:
        resolve(r, infos, "kernel graph outputs")
    return GraphInfo(tuple(infos), tuple(blocks))


__all__ = [
    "BlockInfo",
    "GraphInfo",
    "TensorInfo",
    "block_shapes",
    "infer",
    "iterator_tile",
    "node_kind",
    "resolve",
    "saver_output",
    "thread_shapes",
]

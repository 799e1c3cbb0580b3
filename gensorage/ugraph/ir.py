"""The multi-level µGraph IR (Mirage §2): kernel graph, block graphs, thread graphs — data only.

Every class is a frozen, slotted dataclass of tuples, so graphs compare and hash structurally (the search dedupes
on them). Constructors normalise what they are given (lists to tuples, op names to :class:`Op`, attribute
mappings through :func:`gensorage.opset.freeze_attrs`), so two graphs built the same way are equal.

Reference spaces
----------------
A tensor inside a graph is a :class:`Ref` ``(node, out)``:

- kernel graph: ``node`` indexes the sequence ``inputs + ops`` (the kernel inputs are nodes ``0 .. len(inputs)-1``
  with one output each; op ``k`` is node ``len(inputs) + k``). A pre-defined op has one output; a graph-defined op
  has one output per :class:`OutputSaver` of its block graph, in node order.
- block graph: ``node`` indexes ``BlockGraph.nodes``. Iterators, block ops and accumulators have one output, a
  thread graph one per entry of its ``outputs``; output savers have none (they write the kernel op's outputs).
- thread graph: ``node`` indexes ``inputs + ops`` of the thread graph (like the kernel graph); ``out`` is 0.

Every reference points to an earlier node (the tuples are in topological order).

Partitioning
------------
``grid`` has 1-3 dims (x, y, z). An :class:`InputIterator` maps each grid dim to a data dim of its kernel input
(``imap[g] = d``: dim ``d`` is split evenly across the ``grid[g]`` blocks) or to ``None`` (replica φ), and the
for-loop to a data dim (``fmap``) or ``None`` (same tile every iteration). Splits apply in order x, y, z, then
the loop, each splitting what the previous left (so two grid dims on one data dim nest, x outermost; the loop
walks within a block's chunk). An :class:`OutputSaver`'s ``omap[g]`` names the output dim the blocks along grid
dim ``g`` are concatenated along (distinct dims, never a replica). An :class:`Accumulator` with ``fmap=None``
combines the iterations' tiles with ``kind`` (sum or max); with ``fmap=d`` it concatenates them along ``d``.
The online-softmax kinds (FlashAttention-2) read a score tile ``s`` (``input``, rows in its last-but-one dim, keys
in its last) and keep the running row maximum ``m`` of every score seen: ``softmax_sum`` gives
``l = Σ exp(s − m)`` and ``softmax_matmul`` (which also reads a value tile ``values``, keys in its last-but-one
dim) gives ``o = Σ exp(s − m)·v``, both rescaled by ``exp(m_old − m_new)`` whenever the maximum grows, so after
the loop they hold the sums relative to the row's full maximum, which a ``max`` accumulator of the same scores
gives (FlashDecoding's combine needs it).
The loop body is every node that does not depend on an accumulator; the nodes that do run once after the loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from gensorage.opset import Attrs, Op, Shape, freeze_attrs
from gensorage.precision import DEFAULT_PRECISION, check_precision

if TYPE_CHECKING:
    import numpy as np

    from gensorage.arith import Arith
    from gensorage.hw.profile import HwProfile
    from gensorage.ugraph.shapes import GraphInfo

AccumKind = Literal["sum", "max", "softmax_sum", "softmax_matmul"]
#: Accumulator kinds that keep a running row maximum and rescale (FlashAttention-2's online softmax).
ONLINE_SOFTMAX_KINDS: tuple[AccumKind, ...] = ("softmax_sum", "softmax_matmul")
ACCUM_KINDS: tuple[AccumKind, ...] = ("sum", "max", *ONLINE_SOFTMAX_KINDS)
GRID_AXES = ("x", "y", "z")


def _set(obj: object, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)


def _refs(items: Sequence[Ref | tuple[int, int] | int]) -> tuple[Ref, ...]:
    """Refs from Ref objects, ``(node, out)`` pairs or bare node indices (output 0)."""
    out: list[Ref] = []
    for r in items:
        if isinstance(r, Ref):
            out.append(r)
        elif isinstance(r, int):
            out.append(Ref(r))
        else:
            out.append(Ref(*r))
    return tuple(out)


def _attrs(attrs: Attrs | Mapping[str, Any] | None) -> Attrs:
    if isinstance(attrs, Mapping) or attrs is None:
        return freeze_attrs(attrs)
    return freeze_attrs(dict(attrs))


@dataclass(frozen=True, slots=True)
class Ref:
    """Output ``out`` of node ``node`` of the enclosing graph (see the module docstring for the index space)."""

    node: int
    out: int = 0


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """A kernel-graph input: name, full shape, dtype name (``"float16"``, ``"float32"``, ...)."""

    name: str
    shape: Shape
    dtype: str = "float16"

    def __post_init__(self) -> None:
        _set(self, "shape", tuple(int(d) for d in self.shape))


# --------------------------------------------------------------------------------------------- thread level


@dataclass(frozen=True, slots=True)
class ThreadOp:
    """An elementwise op inside a thread graph; ``inputs`` index the thread graph's ``inputs + ops``."""

    op: Op
    inputs: tuple[Ref, ...]
    attrs: Attrs = ()

    def __post_init__(self) -> None:
        _set(self, "op", Op(self.op))
        _set(self, "inputs", _refs(self.inputs))
        _set(self, "attrs", _attrs(self.attrs))


@dataclass(frozen=True, slots=True)
class ThreadGraph:
    """A block node: a fused chain of elementwise ops kept in registers.

    ``inputs`` are block-level refs (loaded from shared memory into registers); ``ops`` compute on them;
    ``outputs`` are thread-local refs (into ``inputs + ops``) saved back to shared memory, one block-level
    output each.
    """

    inputs: tuple[Ref, ...]
    ops: tuple[ThreadOp, ...]
    outputs: tuple[Ref, ...]

    def __post_init__(self) -> None:
        _set(self, "inputs", _refs(self.inputs))
        _set(self, "ops", tuple(self.ops))
        _set(self, "outputs", _refs(self.outputs))


# ---------------------------------------------------------------------------------------------- block level


@dataclass(frozen=True, slots=True)
class InputIterator:
    """Loads tiles of kernel input ``input`` (index into the graph-defined op's ``inputs``) into shared memory."""

    input: int
    imap: tuple[int | None, ...]
    fmap: int | None = None

    def __post_init__(self) -> None:
        _set(self, "imap", tuple(None if d is None else int(d) for d in self.imap))


@dataclass(frozen=True, slots=True)
class BlockOp:
    """A pre-defined block operator on shared-memory tiles."""

    op: Op
    inputs: tuple[Ref, ...]
    attrs: Attrs = ()

    def __post_init__(self) -> None:
        _set(self, "op", Op(self.op))
        _set(self, "inputs", _refs(self.inputs))
        _set(self, "attrs", _attrs(self.attrs))


@dataclass(frozen=True, slots=True)
class Accumulator:
    """For-loop accumulator: combine iterations with ``kind`` (``fmap=None``) or concatenate along ``fmap``;
    ``values`` is the value tile of a ``softmax_matmul`` accumulator (None for every other kind)."""

    input: Ref
    kind: AccumKind = "sum"
    fmap: int | None = None
    values: Ref | None = None

    def __post_init__(self) -> None:
        (ref,) = _refs([self.input])
        _set(self, "input", ref)
        if self.values is not None:
            (v,) = _refs([self.values])
            _set(self, "values", v)

    @property
    def reads(self) -> tuple[Ref, ...]:
        """The block tensors it reads: the scores (or tile), then the values of a ``softmax_matmul``."""
        return (self.input,) if self.values is None else (self.input, self.values)


@dataclass(frozen=True, slots=True)
class OutputSaver:
    """Writes a tile to device memory; blocks along grid dim ``g`` are concatenated along output dim ``omap[g]``."""

    input: Ref
    omap: tuple[int, ...]

    def __post_init__(self) -> None:
        (ref,) = _refs([self.input])
        _set(self, "input", ref)
        _set(self, "omap", tuple(int(d) for d in self.omap))


BlockNode = InputIterator | BlockOp | ThreadGraph | Accumulator | OutputSaver


@dataclass(frozen=True, slots=True)
class BlockGraph:
    """What one thread block computes: ``grid`` (1-3 dims), for-loop trip count (1 = no loop), nodes."""

    grid: tuple[int, ...]
    forloop: int
    nodes: tuple[BlockNode, ...]

    def __post_init__(self) -> None:
        _set(self, "grid", tuple(int(n) for n in self.grid))
        _set(self, "nodes", tuple(self.nodes))

    @property
    def savers(self) -> tuple[OutputSaver, ...]:
        """The output savers in node order (the graph-defined op's outputs)."""
        return tuple(n for n in self.nodes if isinstance(n, OutputSaver))


# --------------------------------------------------------------------------------------------- kernel level


@dataclass(frozen=True, slots=True)
class KernelOp:
    """A pre-defined kernel operator (a library kernel such as cuBLAS matmul); one output."""

    op: Op
    inputs: tuple[Ref, ...]
    attrs: Attrs = ()

    def __post_init__(self) -> None:
        _set(self, "op", Op(self.op))
        _set(self, "inputs", _refs(self.inputs))
        _set(self, "attrs", _attrs(self.attrs))


@dataclass(frozen=True, slots=True)
class GraphDefinedOp:
    """A custom kernel defined by ``block``; ``inputs[i]`` is the kernel tensor iterators with ``input=i`` read."""

    block: BlockGraph
    inputs: tuple[Ref, ...]

    def __post_init__(self) -> None:
        _set(self, "inputs", _refs(self.inputs))


KernelNode = KernelOp | GraphDefinedOp


@dataclass(frozen=True, slots=True)
class KernelGraph:
    """A µGraph: kernel inputs, kernel ops in topological order, outputs (refs into ``inputs + ops``), and the
    precision policy its intermediates are stored under (:mod:`gensorage.precision`)."""

    inputs: tuple[TensorSpec, ...]
    ops: tuple[KernelNode, ...]
    outputs: tuple[Ref, ...]
    precision: str = DEFAULT_PRECISION

    def __post_init__(self) -> None:
        _set(self, "inputs", tuple(self.inputs))
        _set(self, "ops", tuple(self.ops))
        _set(self, "outputs", _refs(self.outputs))
        check_precision(self.precision)

    # Behaviour lives in sibling modules; these are conveniences that delegate to them.
    def evaluate(self, arith: Arith[Any], inputs: Sequence[Any]) -> list[Any]:
        """Evaluate literally (block by block, iteration by iteration) in ``arith``; see :mod:`.evaluate`."""
        from gensorage.ugraph.evaluate import evaluate

        return evaluate(self, arith, inputs)

    def run(self, *arrays: np.ndarray) -> list[np.ndarray]:
        """Evaluate on numpy arrays in float64."""
        from gensorage.ugraph.evaluate import run

        return run(self, *arrays)

    def validate(self, hw: HwProfile | None = None) -> GraphInfo:
        """Check validity (Definition 2.1); see :func:`gensorage.ugraph.validate.validate`."""
        from gensorage.ugraph.validate import validate

        return validate(self, hw)

    def is_valid(self, hw: HwProfile | None = None) -> bool:
        from gensorage.ugraph.validate import is_valid

        return is_valid(self, hw)

    def to_json(self) -> dict[str, Any]:
        from gensorage.ugraph.serialize import to_json

        return to_json(self)

    @staticmethod
    def from_json(data: Any) -> KernelGraph:
        from gensorage.ugraph.serialize import from_json

        return from_json(data)

    def to_text(self) -> str:
        from gensorage.ugraph.text import to_text

        return to_text(self)

    def to_dot(self) -> str:
        from gensorage.ugraph.dot import to_dot

        return to_dot(self)

    def __str__(self) -> str:
        return self.to_text()


UGraph = KernelGraph


def num_outputs(node: KernelNode | BlockNode | TensorSpec) -> int:
    """How many tensors ``node`` produces inside its graph."""
    if isinstance(node, GraphDefinedOp):
        return len(node.block.savers)
    if isinstance(node, ThreadGraph):
        return len(node.outputs)
    if isinstance(node, OutputSaver):
        return 0
    return 1


def node_inputs(node: BlockNode) -> tuple[Ref, ...]:
    """The block-level refs a block node reads (none for an iterator)."""
    if isinstance(node, InputIterator):
        return ()
    if isinstance(node, BlockOp | ThreadGraph):
        return node.inputs
    if isinstance(node, Accumulator):
        return node.reads
    return (node.input,)


__all__ = [
    "ACCUM_KINDS",
    "GRID_AXES",
    "ONLINE_SOFTMAX_KINDS",
    "AccumKind",
    "Accumulator",
    "BlockGraph",
    "BlockNode",
    "BlockOp",
    "GraphDefinedOp",
    "InputIterator",
    "KernelGraph",
    "KernelNode",
    "KernelOp",
    "OutputSaver",
    "Ref",
    "TensorSpec",
    "ThreadGraph",
    "ThreadOp",
    "UGraph",
    "node_inputs",
    "num_outputs",
]

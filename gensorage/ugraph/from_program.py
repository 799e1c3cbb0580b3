"""The direct µGraph of a program (one pre-defined kernel op per program op) and single-op wrapping."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from gensorage.errors import UGraphError
from gensorage.opset import ELEMENTWISE, Op
from gensorage.precision import DEFAULT_PRECISION
from gensorage.ugraph.ir import (
    BlockGraph,
    BlockNode,
    BlockOp,
    GraphDefinedOp,
    InputIterator,
    KernelGraph,
    KernelOp,
    OutputSaver,
    Ref,
    TensorSpec,
)

if TYPE_CHECKING:
    from gensorage.program import Program


def from_program(program: Program, precision: str = DEFAULT_PRECISION) -> KernelGraph:
    """The µGraph running each op of ``program`` as its own pre-defined kernel.

    Kernel inputs follow ``program.inputs`` (names, shapes, dtypes); ops follow node order; ops no output depends
    on are left out. Outputs follow ``program.outputs``.
    """
    inputs = program.inputs
    if not program.outputs:
        raise UGraphError(f"program '{program.name}' has no outputs")
    ref_of: dict[int, Ref] = {t.id: Ref(i) for i, t in enumerate(inputs)}
    specs = tuple(TensorSpec(t.name, t.shape, t.dtype) for t in inputs)
    ops: list[KernelOp] = []
    for nid in program.live_ids():
        node = program.nodes[nid]
        if node.op is None:
            continue
        ops.append(KernelOp(node.op, tuple(ref_of[i] for i in node.inputs), node.attrs))
        ref_of[nid] = Ref(len(specs) + len(ops) - 1)
    return KernelGraph(specs, tuple(ops), tuple(ref_of[t.id] for t in program.outputs), precision)


def wrap_kernel_op(
    g: KernelGraph,
    index: int,
    grid: Sequence[int],
    imaps: Sequence[Sequence[int | None]],
    omap: Sequence[int],
) -> KernelGraph:
    """``g`` with pre-defined op ``g.ops[index]`` replaced by an equivalent one-op graph-defined kernel.

    Every block loads its inputs' tiles (``imaps[i]`` for input ``i``), applies the op and saves the result by
    ``omap``; no for-loop. Only ops whose result tile is the op applied to the input tiles are accepted:
    elementwise ops, and matmul (splitting rows of A / columns of B / batch dims; splitting the inner dim would
    need an accumulator). Whether the chosen maps are *correct* is checked by the caller (e.g. the verifier):
    this builds the graph, :func:`~gensorage.ugraph.validate.validate` checks it is well formed.
    """
    node = g.ops[index]
    if not isinstance(node, KernelOp):
        raise UGraphError(f"kernel op {index} is not a pre-defined op")
    if node.op not in ELEMENTWISE and node.op is not Op.MATMUL:
        raise UGraphError(
            f"cannot wrap {node.op.value}: only elementwise ops and matmul have per-tile semantics"
        )
    if len(imaps) != len(node.inputs):
        raise UGraphError(f"{node.op.value} has {len(node.inputs)} inputs, got {len(imaps)} imaps")
    n = len(node.inputs)
    nodes: list[BlockNode] = [InputIterator(i, tuple(imaps[i])) for i in range(n)]
    nodes.append(BlockOp(node.op, tuple(Ref(i) for i in range(n)), node.attrs))
    nodes.append(OutputSaver(Ref(n), tuple(omap)))
    wrapped = GraphDefinedOp(BlockGraph(tuple(grid), 1, tuple(nodes)), node.inputs)
    ops = g.ops[:index] + (wrapped,) + g.ops[index + 1 :]
    return KernelGraph(g.inputs, ops, g.outputs, g.precision)


__all__ = ["from_program", "wrap_kernel_op"]

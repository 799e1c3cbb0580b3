"""Transposed operand views: a matmul reads a transposed tensor in place instead of a transpose kernel's copy.

A pre-defined ``transpose`` of the last two dims whose every consumer is a pre-defined ``matmul`` (either
operand) is not emitted as a kernel: those matmul kernels read the transpose's *input* with the two indices
swapped (``x @ W.T`` reads ``W`` as it is, like cuBLAS's "NT" GEMM). The µGraph, its validation and its
verification are unchanged: this is a layout choice of the code generator, like a reshape's alias. The
transposed tensor is never stored, so one that a graph output or any other op reads keeps its copy kernel.

Every consumer of the lowering (the kernels, the runners, the GPU bundle, both cost models) asks
:func:`transposed_views` which ops have no kernel and :func:`matmul_operands` where a matmul's operands live.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from gensorage.opset import Op, attr
from gensorage.ugraph.ir import KernelGraph, KernelOp, Ref
from gensorage.ugraph.shapes import GraphInfo


@dataclass(frozen=True, slots=True)
class Operand:
    """Where a matmul operand lives: tensor ``ref``, stored with its last two dims swapped when ``transposed``."""

    ref: Ref
    transposed: bool


def _last_two(op: KernelOp, rank: int) -> bool:
    dims = {int(attr(op.attrs, "dim0")) % rank, int(attr(op.attrs, "dim1")) % rank}
    return rank >= 2 and dims == {rank - 2, rank - 1}


@lru_cache(maxsize=64)
def transposed_views(g: KernelGraph, ranks: tuple[int, ...]) -> frozenset[int]:
    """Kernel op indices of the transposes no kernel computes (their matmul consumers read the input).

    ``ranks[node]`` is the rank of node ``node``'s first output (shapes do not change which dims a transpose
    swaps, only a negative dim needs the rank).
    """
    n_in = len(g.inputs)
    readers: dict[int, list[KernelOp | None]] = {}
    for op in g.ops:
        for i, r in enumerate(op.inputs):
            # a matmul's epilogue operands (after A and B) are read as stored, not through a view
            kop = op if isinstance(op, KernelOp) and (op.op is not Op.MATMUL or i < 2) else None
            readers.setdefault(r.node, []).append(kop)
    outputs = {r.node for r in g.outputs}
    views = set()
    for k, op in enumerate(g.ops):
        node = n_in + k
        if not isinstance(op, KernelOp) or op.op is not Op.TRANSPOSE or node in outputs:
            continue
        users = readers.get(node, [])
        if not _last_two(op, ranks[node]) or not users:
            continue
        if all(u is not None and u.op is Op.MATMUL for u in users):
            views.add(k)
    return frozenset(views)


def graph_views(g: KernelGraph, info: GraphInfo) -> frozenset[int]:
    """:func:`transposed_views` of ``g`` with the ranks read off its shape information ``info``."""
    return transposed_views(g, tuple(len(ts[0].shape) if ts else 0 for ts in info.nodes))


def layout_name(ta: bool, tb: bool) -> str:
    """``nn``, ``nt``, ``tn`` or ``tt``: whether A, then B, is stored transposed."""
    return ("t" if ta else "n") + ("t" if tb else "n")


def matmul_operands(g: KernelGraph, k: int, views: frozenset[int]) -> tuple[Operand, Operand]:
    """The two operands of matmul kernel op ``k``: through a transposed view, its input, transposed."""
    op = g.ops[k]
    assert isinstance(op, KernelOp)
    n_in = len(g.inputs)

    def operand(r: Ref) -> Operand:
        j = r.node - n_in
        if j >= 0 and j in views:
            src = g.ops[j]
            assert isinstance(src, KernelOp)
            return Operand(src.inputs[0], True)
        return Operand(r, False)

    a, b = (operand(r) for r in op.inputs[:2])
    return a, b


__all__ = ["Operand", "graph_views", "layout_name", "matmul_operands", "transposed_views"]

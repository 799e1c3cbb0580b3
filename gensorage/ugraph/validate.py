"""Validity of a µGraph (Mirage, later version, Definition 2.1).

A µGraph is valid when

1. every kernel, block and thread operator's inputs and attributes match its spec (shapes via
   :mod:`gensorage.ugraph.shapes`; partitions divide exactly; grids have 1-3 dims; omaps map every grid dim to
   a distinct output dim; thread graphs hold elementwise ops only);
2. with a hardware profile, every level's tensors fit its memory: all kernel tensors together fit
   ``dram_bytes``; all tensors of one block graph (iterator tiles, op results, thread-graph results,
   accumulators; views aside), placed by liveness so that tiles whose lives do not overlap share bytes
   (:mod:`gensorage.ugraph.optimize.memory_plan`), fit ``shared_mem_per_block``; the values one thread graph
   keeps per element fit ``max_registers_per_thread`` 32-bit registers (one element per thread: the thread count is a schedule
   choice made later, so only this per-thread lower bound is checked here);
3. in a looped block graph (``forloop > 1``) every input-to-output path passes exactly one input iterator, one
   accumulator and one output saver: the loop body (nodes not depending on an accumulator) feeds only
   accumulators and other body nodes, post-loop nodes read only accumulators and post-loop nodes, and savers
   read post-loop values. Accumulators appear only in looped graphs (with no loop they would be identities).
"""

from __future__ import annotations

import math
from typing import Literal

from gensorage.dtypes import DTYPE_BYTES, dtype_bytes
from gensorage.errors import UGraphError
from gensorage.hw.profile import HwProfile
from gensorage.ugraph.ir import (
    Accumulator,
    BlockGraph,
    BlockOp,
    GraphDefinedOp,
    InputIterator,
    KernelGraph,
    OutputSaver,
    ThreadGraph,
    node_inputs,
)
from gensorage.ugraph.shapes import GraphInfo, TensorInfo, block_where, infer, kernel_where

Phase = Literal["body", "post", "saver"]


def tensor_bytes(t: TensorInfo) -> int:
    return math.prod(t.shape) * dtype_bytes(t.dtype)


def loop_phases(block: BlockGraph) -> tuple[Phase, ...]:
    """Per block node: ``"body"`` (runs every iteration), ``"post"`` (after the loop) or ``"saver"``.

    A node is post-loop when it is an accumulator or reads a post-loop value; refs are assumed checked.
    """
    phases: list[Phase] = []
    for node in block.nodes:
        if isinstance(node, OutputSaver):
            phases.append("saver")
        elif isinstance(node, Accumulator):
            phases.append("post")
        elif isinstance(node, InputIterator):
            phases.append("body")
        else:
            post = any(phases[r.node] == "post" for r in node_inputs(node))
            phases.append("post" if post else "body")
    return tuple(phases)


def _check_paths(g: KernelGraph, k: int, block: BlockGraph) -> None:
    phases = loop_phases(block)
    looped = block.forloop > 1
    for j, node in enumerate(block.nodes):
        where = block_where(g, k, j)
        if isinstance(node, Accumulator):
            if not looped:
                raise UGraphError(f"{where}: accumulator in a block graph without a for-loop")
            for r in node.reads:
                if phases[r.node] != "body":
                    raise UGraphError(
                        f"{where}: accumulates post-loop value #{r.node} (a second accumulator)"
                    )
        elif isinstance(node, OutputSaver):
            if looped and phases[node.input.node] != "post":
                raise UGraphError(
                    f"{where}: saves loop-body value #{node.input.node} with no accumulator on its path"
                )
        elif isinstance(node, BlockOp | ThreadGraph) and phases[j] == "post":
            body = [r.node for r in node_inputs(node) if phases[r.node] == "body"]
            if body:
                raise UGraphError(
                    f"{where}: post-loop op reads loop-body value #{body[0]}, a path with no accumulator"
                )


def _check_memory(g: KernelGraph, info: GraphInfo, hw: HwProfile) -> None:
    dram = sum(tensor_bytes(t) for outs in info.nodes for t in outs)
    if dram > hw.dram_bytes:
        raise UGraphError(f"kernel tensors need {dram} bytes of device memory, {hw.name} has {hw.dram_bytes}")
    # Imported here: the memory plan orders phases with this module's loop_phases.
    from gensorage.ugraph.optimize.memory_plan import shared_footprint

    for k, binfo in enumerate(info.blocks):
        op = g.ops[k]
        if binfo is None or not isinstance(op, GraphDefinedOp):
            continue
        smem = shared_footprint(op.block, binfo)
        if smem > hw.shared_mem_per_block:
            raise UGraphError(
                f"{kernel_where(g, k)}: block graph needs {smem} bytes of shared memory, "
                f"{hw.name} allows {hw.shared_mem_per_block} per block"
            )
        for j, local in enumerate(binfo.threads):
            regs = sum(math.ceil(dtype_bytes(t.dtype) / 4) for t in local)
            if regs > hw.max_registers_per_thread:
                raise UGraphError(
                    f"{block_where(g, k, j)}: thread graph keeps {regs} registers per element, "
                    f"{hw.name} allows {hw.max_registers_per_thread} per thread"
                )


def validate(g: KernelGraph, hw: HwProfile | None = None) -> GraphInfo:
    """Check ``g`` against Definition 2.1; raise :class:`UGraphError` naming the first violation.

    Parameters
    ----------
    g : KernelGraph
        The µGraph.
    hw : HwProfile, optional
        When given, also check the memory of every level against this GPU.

    Returns
    -------
    GraphInfo
        The inferred shapes and dtypes of every tensor (the check computes them anyway).
    """
    if not isinstance(g, KernelGraph):
        raise UGraphError(f"not a kernel graph: {type(g).__name__}")
    info = infer(g)
    for k, node in enumerate(g.ops):
        if isinstance(node, GraphDefinedOp):
            _check_paths(g, k, node.block)
    if hw is not None:
        for spec in g.inputs:  # every other tensor takes its dtype from these
            if spec.dtype not in DTYPE_BYTES:
                raise UGraphError(
                    f"input '{spec.name}': unknown dtype {spec.dtype!r} (known: {', '.join(DTYPE_BYTES)})"
                )
        _check_memory(g, info, hw)
    return info


def is_valid(g: KernelGraph, hw: HwProfile | None = None) -> bool:
    """Whether :func:`validate` accepts ``g``."""
    try:
        validate(g, hw)
    except UGraphError:
        return False
    return True


__all__ = ["Phase", "is_valid", "loop_phases", "tensor_bytes", "validate"]

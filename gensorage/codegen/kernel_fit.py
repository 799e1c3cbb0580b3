"""Whether a µGraph's graph-defined kernels launch on a GPU, checked on their emitted text before anything is
lowered or built.

The CUDA build checks every kernel's lowered TIR against the GPU's per-block limits
(:func:`~gensorage.codegen.gpu_limits.verify_gpu_limits`), which takes TVM's lowering passes (seconds for a large
block graph). The cost model charges a block the memory plan of its tiles in their stored dtype
(:func:`~gensorage.ugraph.optimize.memory_plan.shared_footprint`), which the kernel exceeds: padded rows
against bank conflicts, accumulators in the compute dtype, reduction scratch. A candidate priced at the
requested shapes can therefore fit the model and not launch. This module emits the kernel as the CUDA build
does (the same thread plan, both emissions of :func:`~gensorage.codegen.ugraph_tir.emit_graph_defined`) and
checks the threads and the shared bytes the emitter declares (what TVM's lowering allocates: the tests compare
the two) with the build's own check, :func:`~gensorage.codegen.gpu_limits.check_block`.

Pre-defined kernels are not checked here: their constructions refuse schedules past the limits themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gensorage.codegen.gpu_limits import BlockResources, check_block
from gensorage.errors import GensorageError, ScheduleError
from gensorage.ugraph.ir import GraphDefinedOp, KernelGraph
from gensorage.ugraph.shapes import GraphInfo, TensorInfo
from gensorage.ugraph.validate import validate

if TYPE_CHECKING:
    from gensorage.hw.profile import HwProfile


@dataclass(frozen=True, slots=True)
class _Key:
    """What a kernel's resources depend on: the op, its inputs' shapes and dtypes, the GPU and the seed."""

    op: GraphDefinedOp
    ins: tuple[TensorInfo, ...]
    dtype: str
    hw: HwProfile
    seed: int


_RESOURCES: dict[_Key, BlockResources] = {}
_MAX_RESOURCES = 1024


def graph_kernel_resources(
    g: KernelGraph, k: int, info: GraphInfo, hw: HwProfile, seed: int = 0
) -> BlockResources:
    """Threads and shared bytes of one block of graph-defined op ``k`` of ``g`` as the CUDA build emits it
    (cached: the choice checks the same kernels as it ranks, carries over and chooses)."""
    from gensorage.codegen.scalar import FloatScalar
    from gensorage.codegen.ugraph_tir import compute_dtype, emit_graph_defined, plan_threads

    op = g.ops[k]
    assert isinstance(op, GraphDefinedOp)
    dtype = compute_dtype(g, info)
    key = _Key(op, tuple(info.of(r) for r in op.inputs), dtype, hw, seed)
    res = _RESOURCES.get(key)
    if res is None:
        choice = plan_threads(g, k, info, hw, seed)
        kt = emit_graph_defined(g, k, info, choice, target="cuda", scalar=FloatScalar(dtype), name=f"fit{k}")
        if len(_RESOURCES) >= _MAX_RESOURCES:
            _RESOURCES.clear()
        res = _RESOURCES[key] = BlockResources(kt.threads, kt.shared_bytes, 0)
    return res


def launch_problem(g: KernelGraph, hw: HwProfile, seed: int = 0) -> str | None:
    """Why ``g`` cannot launch on ``hw`` (one line naming the first graph-defined kernel that exceeds a per-block
    limit, or that the code generator refuses), or None when every graph-defined kernel fits.

    Parameters
    ----------
    g : KernelGraph
        A µGraph at the shapes it would run at.
    hw : HwProfile
        The GPU whose limits apply.
    seed : int
        The seed the kernels are built with (:func:`gensorage.codegen.module.compile_ugraph`'s).
    """
    try:
        info = validate(g, hw)
    except GensorageError as exc:
        return str(exc)
    for k, op in enumerate(g.ops):
        if not isinstance(op, GraphDefinedOp):
            continue
        try:
            check_block(graph_kernel_resources(g, k, info, hw, seed), hw)
        except ScheduleError as exc:
            return f"kernel op {k} (graph-defined): {exc}"
        except GensorageError as exc:
            return f"kernel op {k} (graph-defined): the code generator refuses it: {exc}"
    return None


__all__ = ["graph_kernel_resources", "launch_problem"]

"""What an emitted kernel is: the TVMScript text of one PrimFunc (or a scheduled PrimFunc), its parameters and its
launch shape."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from gensorage.ugraph.ir import Ref

if TYPE_CHECKING:
    from gensorage.codegen.scalar import Scalar
    from gensorage.ugraph.ir import KernelGraph
    from gensorage.ugraph.shapes import GraphInfo

Target = Literal["cuda", "llvm"]
TARGETS: tuple[Target, ...] = ("cuda", "llvm")


@dataclass(frozen=True, slots=True)
class KernelParam:
    """One PrimFunc parameter: ``role`` input/output (a kernel-graph tensor ``ref``), the field parameters, or
    ``scratch``: a buffer of the kernel's own (split-k partials) that the caller allocates, no graph tensor.

    ``shape`` and ``dtype`` are what the kernel declares (with the leading component dim in field mode).
    """

    name: str
    role: Literal["input", "output", "field", "scratch"]
    ref: Ref | None
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True, slots=True)
class KernelText:
    """An emitted kernel: TVMScript ``text`` of one PrimFunc called ``name``, its parameters and launch shape;
    ``shared_bytes``: the shared memory one block declares (a graph-defined kernel for the GPU; what TVM's
    lowering allocates, :func:`gensorage.codegen.kernel_fit.launch_problem`)."""

    name: str
    op_index: int
    text: str
    params: tuple[KernelParam, ...]
    grid: tuple[int, ...]
    threads: int
    rule: str
    shared_bytes: int = 0
    # a generic kernel's (a copy with a whole block's threads): () -> the emitter's own (func, rule) here
    own: Any = None


def graph_kernel_params(g: KernelGraph, k: int, info: GraphInfo, scalar: Scalar) -> list[KernelParam]:
    """A graph-defined kernel's parameters: its inputs ``in<i>``, its outputs ``out<s>`` (the block graph's
    savers, in order) and, in field mode, the field parameters."""
    from gensorage.codegen.scalar import FIELD_PARAMS

    op = g.ops[k]
    binfo = info.blocks[k]
    assert binfo is not None
    ps = [
        KernelParam(
            f"in{i}", "input", r, scalar.buf_shape(info.of(r).shape), scalar.buf_dtype(info.of(r).dtype)
        )
        for i, r in enumerate(op.inputs)
    ]
    node_id = len(g.inputs) + k
    for s, t in enumerate(binfo.outputs):
        ps.append(
            KernelParam(
                f"out{s}", "output", Ref(node_id, s), scalar.buf_shape(t.shape), scalar.buf_dtype(t.dtype)
            )
        )
    if scalar.field:
        ps.append(KernelParam("F", "field", None, (FIELD_PARAMS,), "int64"))
    return ps


__all__ = ["TARGETS", "KernelParam", "KernelText", "Target", "graph_kernel_params"]


@dataclass(frozen=True, slots=True)
class ScheduledKernel:
    """A kernel lowered by :mod:`gensorage.codegen.lower_schedule` (a PrimFunc rather than text)."""

    name: str
    op_index: int
    func: Any
    params: tuple[KernelParam, ...]
    threads: int
    rule: str
    component: int | None = None  # field mode: which residue (0: mod p, 1: mod q) this kernel computes
    # a generic kernel's (gensorage.codegen.generic_matmul): () -> the emitter's own (func, rule) here, or None
    own: Any = None

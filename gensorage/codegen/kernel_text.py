"""What an emitted kernel is: the TVMScript text of one PrimFunc (or a scheduled PrimFunc), its parameters and its
launch shape."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from gensorage.ugraph.ir import Ref

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


__all__ = ["TARGETS", "KernelParam", "KernelText", "Target"]


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

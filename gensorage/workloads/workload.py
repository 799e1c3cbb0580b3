"""Workloads for the construction tuner: a loop nest with spatial and reduction axes and affine accesses.

Data only; building the TVM PrimFunc and the numpy reference is done by the constructors in ``gensorage.workloads``
(and by ``gensorage.workloads.from_te`` / ``from_prim_func`` for computations a user brings).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

AxisKind = Literal["spatial", "reduce"]


@dataclass(frozen=True, slots=True)
class Axis:
    name: str
    extent: int
    kind: AxisKind


@dataclass(frozen=True, slots=True)
class Access:
    """How one tensor is indexed by the loop nest.

    ``index[d]`` is the affine expression of tensor dimension ``d``: a tuple of ``(axis_name, coefficient)``
    pairs plus a constant ``offset[d]`` (e.g. conv2d input row ``h*stride + kh - pad``). ``elem_bytes``, when
    set, is the size of one element when it packs several of ``dtype`` (a block graph's loop nest carries the
    dims no axis splits inside its elements); None: the size of one ``dtype``.
    """

    tensor: str
    shape: tuple[int, ...]
    dtype: str
    index: tuple[tuple[tuple[str, int], ...], ...]
    offset: tuple[int, ...]
    is_output: bool = False
    elem_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class Workload:
    """One operator instance: ``name`` (e.g. "gemm"), ``params`` (e.g. (("M", 1024), ...)), its loop nest.

    ``build`` returns a ``tvm.tirx.PrimFunc`` (inputs first, output last, in ``accesses`` order) and
    ``reference`` computes the output in numpy float64 from the inputs. Both are excluded from equality and
    hashing so a workload is keyed by what it computes (``key``).
    """

    name: str
    params: tuple[tuple[str, int], ...]
    axes: tuple[Axis, ...]
    accesses: tuple[Access, ...]
    flops: int
    dtype: str
    build: Callable[[], Any] = field(compare=False, hash=False, repr=False)
    reference: Callable[..., Any] = field(compare=False, hash=False, repr=False)

    @property
    def spatial_axes(self) -> tuple[Axis, ...]:
        return tuple(a for a in self.axes if a.kind == "spatial")

    @property
    def reduce_axes(self) -> tuple[Axis, ...]:
        return tuple(a for a in self.axes if a.kind == "reduce")

    @property
    def inputs(self) -> tuple[Access, ...]:
        return tuple(a for a in self.accesses if not a.is_output)

    @property
    def output(self) -> Access:
        return next(a for a in self.accesses if a.is_output)

    def key(self) -> str:
        """Stable identity for stores: op name, parameters, dtype and the loop nest."""
        p = ",".join(f"{k}={v}" for k, v in self.params)
        ax = ",".join(f"{a.name}:{a.extent}:{a.kind[0]}" for a in self.axes)
        return f"{self.name}({p})[{ax}]:{self.dtype}"

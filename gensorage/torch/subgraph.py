"""One captured subgraph run by gensorage: its Program, its kernels, the check against torch, the fallback.

The Program lowered from the subgraph is its definition. On the first call (real tensors at hand) the Program is
superoptimised (:func:`gensorage.superoptimize`, which proves the chosen µGraph equal to the Program), the kernels
run on the call's inputs and their outputs are compared with torch running the same subgraph; only then are the
kernels used. Anything that fails (lowering, search, build, the comparison, a device the path does not serve)
leaves the subgraph in torch with a one-line reason in the report, so the answer is always torch's or checked.

Compiled kernels are cached by the Program's key (ops, shapes, dtypes; not names), so a shape seen before — in
this graph, another layer, or a recompiled graph — reuses its kernels without searching or building again; a new
shape of a program seen at another shape (a new sequence length) reuses the µGraph chosen there
(:mod:`gensorage.superopt.dispatch`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.fx as fx

from gensorage.codegen.runner import ALIGNMENT
from gensorage.dtypes import numpy_dtype
from gensorage.errors import GensorageError, UnsupportedOpError
from gensorage.program import Program
from gensorage.superopt.dispatch import Dispatcher, ShapeKernels
from gensorage.torch.lowering import Extra, Lowering
from gensorage.torch.report import Report

#: Largest error of the kernels against torch on the first inputs, relative to the largest reference value.
TOLERANCE: dict[str, float] = {"float32": 1e-3, "float16": 2e-2, "bfloat16": 2e-2}


@dataclass(frozen=True, slots=True)
class Options:
    """What :func:`gensorage.torch.compile` was asked for (the arguments of :func:`gensorage.superoptimize`)."""

    hw: str = "h100"
    mode: str = "fast"
    time_budget_s: float | None = None
    explain: bool = False


@dataclass(slots=True)
class Lowered:
    """A subgraph as a Program: which graph values feed its inputs, which of its outputs feed the graph's."""

    program: Program
    inputs: list[fx.Node]
    extras: list[Extra]
    outputs: list[int] = field(default_factory=list)  # graph output i is program output outputs[i]
    strides: list[tuple[int, ...]] = field(default_factory=list)  # torch's layout of graph output i


def lower(sub: fx.GraphModule, name: str) -> Lowered:
    """The Program of ``sub`` (a fused partition: placeholders, supported nodes, one output tuple)."""
    p = Program(name=name)
    lw = Lowering(p)
    for node in sub.graph.find_nodes(op="placeholder"):
        lw.value(node)  # program inputs in the subgraph's argument order, before any extra input
    for node in sub.graph.nodes:
        if node.op == "call_function":
            lw.lower(node)
    (results,) = next(n for n in sub.graph.nodes if n.op == "output").args
    lowered = Lowered(p, lw.inputs, [spec for _, spec in lw.extras])
    marked: dict[int, int] = {}
    for r in results:
        t = lw.tensor(r)
        if p.nodes[t.id].is_input:
            raise UnsupportedOpError(f"{name}: output {r.name} is an input unchanged")
        if t.id not in marked:
            marked[t.id] = len(marked)
            p.output(t)
        lowered.outputs.append(marked[t.id])
        lowered.strides.append(tuple(r.meta["val"].stride()))
    return lowered


class GensorageSubgraph(torch.nn.Module):
    """Runs the fused partition ``sub`` with gensorage kernels once they are checked, else with torch."""

    def __init__(self, sub: fx.GraphModule, name: str, options: Options, report: Report) -> None:
        super().__init__()
        self.sub = sub
        self.name = name
        self.options = options
        self.report = report
        self._kernels: tuple[Lowered, ShapeKernels] | None = None
        self._extras: list[torch.Tensor] = []
        self._fallback: str | None = None

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self._kernels is None and self._fallback is None:
            self._prepare(args)
        if self._kernels is None:
            return tuple(self.sub(*args))
        lowered, res = self._kernels
        if any(tuple(a.shape) != t.shape for a, t in zip(args, lowered.program.inputs, strict=False)):
            return tuple(
                self.sub(*args)
            )  # a guard let other shapes through: torch's answer, never a wrong one
        return run_kernels(lowered, res, [*args, *self._extras])

    def _prepare(self, args: tuple[torch.Tensor, ...]) -> None:
        try:
            lowered = lower(self.sub, self.name)
            if any(a.device.type != "cpu" for a in args):
                raise UnsupportedOpError(
                    f"tensors on {args[0].device}: the CUDA (DLPack) path is not wired yet"
                )
            res = compiled(lowered.program, self.options)
            extras = [spec.make(args[0].dtype, args[0].device) for spec in lowered.extras]
            got = run_kernels(lowered, res, [*args, *extras])
            err = mismatch(got, tuple(self.sub(*args)))
            dtype = lowered.program.inputs[0].dtype
            if not err <= TOLERANCE[dtype]:
                raise GensorageError(
                    f"kernels differ from torch by {err:.2e} (tolerance {TOLERANCE[dtype]:.0e})"
                )
        except GensorageError as exc:
            self._fallback = str(exc).splitlines()[0]
            self.report.subgraph(self.name, f"stays in torch: {self._fallback}")
            return
        self._kernels, self._extras = (lowered, res), extras
        self.report.subgraph(
            self.name,
            f"gensorage: {res.num_kernels} kernel(s) for {len(lowered.program.live_ids())} program nodes, "
            f"{dtype}; µGraph: {res.equivalence.method}; kernels within {err:.1e} of torch",
        )


_DISPATCHERS: dict[Options, Dispatcher] = {}


def dispatcher(options: Options) -> Dispatcher:
    """The per-shape kernel cache of ``options`` (one per hw, mode and budget, shared by every graph)."""
    key = Options(options.hw, options.mode, options.time_budget_s)
    if key not in _DISPATCHERS:
        _DISPATCHERS[key] = Dispatcher(options.hw, options.mode, options.time_budget_s)
    return _DISPATCHERS[key]


def compiled(program: Program, options: Options) -> ShapeKernels:
    """The verified, built kernels of ``program``: cached by its key, and a new shape of a program structure
    seen before reuses that structure's µGraph (:mod:`gensorage.superopt.dispatch`)."""
    return dispatcher(options).kernels(program)


def run_kernels(lowered: Lowered, res: ShapeKernels, args: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """The kernels of ``res`` on CPU tensors: through DLPack into outputs torch allocates (the prepared
    runner), else through numpy views (no conversion of values)."""
    if res.runner is not None:
        tensors = res.runner([_aligned(a) for a in args], _empty)
    else:
        tensors = [_to_torch(o) for o in res.run(*(_to_numpy(a) for a in args), target="cpu")]
    return tuple(_strided(tensors[i], s) for i, s in zip(lowered.outputs, lowered.strides, strict=True))


def _empty(shape: tuple[int, ...], dtype: str) -> torch.Tensor:
    return torch.empty(shape, dtype=getattr(torch, dtype))


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` contiguous with its data aligned as the runner needs (a view at an odd offset is copied)."""
    t = t.detach().contiguous()
    return t if t.data_ptr() % ALIGNMENT == 0 else t.clone()


def _strided(t: torch.Tensor, stride: tuple[int, ...]) -> torch.Tensor:
    """``t`` in the layout torch's graph gave the value: later views in torch rely on it (``transpose`` of an
    attention output, then ``view``)."""
    if t.stride() == stride or t.numel() <= 1:
        return t
    return torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device).copy_(t)


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(numpy_dtype("bfloat16"))
    return t.numpy()


def _to_torch(a: np.ndarray) -> torch.Tensor:
    if a.dtype == numpy_dtype("bfloat16"):
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a))


def mismatch(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...]) -> float:
    """Largest ``|got - want|`` relative to the largest finite ``|want|``, over all outputs; inf where the shapes
    or the positions of non-finite values differ."""
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        if g.shape != w.shape:
            return math.inf
        g64, w64 = g.double(), w.double()
        finite = torch.isfinite(w64)
        if not torch.equal(finite, torch.isfinite(g64)) or not torch.equal(g64[~finite], w64[~finite]):
            return math.inf
        if finite.any():
            scale = max(float(w64[finite].abs().max()), 1e-30)
            worst = max(worst, float((g64[finite] - w64[finite]).abs().max()) / scale)
    return worst


__all__ = [
    "GensorageSubgraph",
    "Lowered",
    "Options",
    "compiled",
    "dispatcher",
    "lower",
    "mismatch",
    "run_kernels",
]

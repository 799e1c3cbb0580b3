"""One captured subgraph run by gensorage: its Program, its kernels, the check against torch, the fallback.

The Program lowered from the subgraph is its definition. On the first call (real tensors at hand) the Program is
superoptimised (:func:`gensorage.superoptimize`, which proves the chosen µGraph equal to the Program), the kernels
run on the call's inputs and their outputs are compared with torch running the same subgraph; only then are the
kernels used. Anything that fails (lowering, search, build, the comparison, a device the path does not serve,
an error of TVM's own) leaves the subgraph in torch with a one-line reason in the report, so the answer is always
torch's or checked. The kernels run where the tensors are (:mod:`.device`).

Compiled kernels are cached by the Program's key (ops, shapes, dtypes; not names), so a shape seen before — in
this graph, another layer, or a recompiled graph — reuses its kernels without searching or building again; a new
shape of a program seen at another shape (a new sequence length) reuses the µGraph chosen there
(:mod:`gensorage.superopt.dispatch`).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from gensorage.errors import GensorageError, UnsupportedOpError
from gensorage.hw import load_profile
from gensorage.program import Program
from gensorage.superopt.dispatch import Dispatcher, ShapeKernels
from gensorage.torch.device import KeptInputs, build_for, profile_for, run_on_device
from gensorage.torch.lowering import DTYPES, Extra, Lowering, program_shape
from gensorage.torch.report import Report

#: Largest error of the kernels against torch on the first inputs, relative to the largest reference value; a
#: subgraph mixing dtypes (its Program computes in float32) takes its narrowest tensors' tolerance.
TOLERANCE: dict[str, float] = {"float32": 1e-3, "float16": 2e-2, "bfloat16": 2e-2}

#: Inputs (elements over all arguments) up to which torch's work in the check of a subgraph on the CPU (its
#: reference run, the comparison) takes one intra-op thread (:func:`check_threads`).
SMALL_REFERENCE_ELEMENTS = 1 << 18


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
    dtypes: list[torch.dtype] = field(default_factory=list)  # and its dtype (float32 after an x.float())
    input_shapes: list[tuple[int, ...]] = field(default_factory=list)  # the program's inputs, looked up once
    input_dtypes: list[torch.dtype] = field(default_factory=list)
    # whether the kernels' outputs are already in the graph's dtypes and layouts (known after the first run; the
    # shapes are fixed, and the kernels' outputs are always fresh contiguous tensors of their dtypes)
    plain: bool | None = None


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
            raise UnsupportedOpError(f"output {r.name} is an input unchanged")
        if t.id not in marked:
            marked[t.id] = len(marked)
            p.output(t)
        lowered.outputs.append(marked[t.id])
        lowered.strides.append(tuple(r.meta["val"].stride()))
        lowered.dtypes.append(r.meta["val"].dtype)
    lowered.input_shapes = [t.shape for t in p.inputs]
    lowered.input_dtypes = [getattr(torch, t.dtype) for t in p.inputs]
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
        self._kept: KeptInputs | None = None
        self._shapes: list[torch.Size] = []  # the arguments' shapes at the checked call
        self._cast: tuple[int, ...] = ()  # the arguments the checked call cast to their program inputs

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self._kernels is None and self._fallback is None:
            return self._prepare(args)  # the first call's outputs: torch's, or the kernels' once checked
        if self._kernels is None:
            return tuple(self.sub(*args))
        lowered, res = self._kernels
        shapes = [a.shape for a in args]  # torch.Size compares as a tuple: the first call's shapes, at once
        if shapes != self._shapes and any(
            program_shape(a) != s for a, s in zip(shapes, lowered.input_shapes, strict=False)
        ):
            return tuple(
                self.sub(*args)
            )  # a guard let other shapes through: torch's answer, never a wrong one
        try:
            return run_kernels(lowered, res, [*args, *self._extras], self._kept, self._cast)
        except Exception as exc:  # e.g. a device the kernels were not built for: torch from now on
            self._fall_back(f"kernels failed on a later call: {type(exc).__name__}: {exc}")
            return tuple(self.sub(*args))

    # An internal node of the partitioned graph, which registers no hooks: called straight, without
    # nn.Module.__call__'s hook checks (several µs a call).
    __call__ = forward

    def _fall_back(self, reason: str) -> None:
        self._kernels, self._fallback = None, (reason.strip().splitlines() or ["?"])[0]
        self.report.subgraph(self.name, f"stays in torch: {self._fallback}")

    def _prepare(self, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """Build and check the kernels on ``args``; their outputs when they pass (the kernels are kept), else
        torch's (the subgraph stays in torch)."""
        # torch's answer first: an error here is the model's own, raised as eager torch raises it
        with check_threads(args):
            want = tuple(self.sub(*args))
        try:
            lowered = lower(self.sub, self.name)
            if len({a.device for a in args}) > 1:
                raise UnsupportedOpError(
                    f"inputs on several devices: {sorted({str(a.device) for a in args})}"
                )
            res = compiled(lowered.program, self.options, args[0].device)
            extras = [spec.make(args[0].dtype, args[0].device) for spec in lowered.extras]
            with check_threads(args):
                got = run_kernels(lowered, res, [*args, *extras])
                err = mismatch(got, want)
            dtype = lowered.program.inputs[0].dtype
            tolerance = max(
                (TOLERANCE[DTYPES[t.dtype]] for t in (*args, *want) if t.dtype in DTYPES),
                default=TOLERANCE[dtype],
            )
            within = f"within {err:.1e} of torch"
            if not err <= tolerance:
                err, within = self._against_float64(args, got, want, err, tolerance)
        except GensorageError as exc:
            self._fall_back(str(exc))
            return want
        except Exception as exc:  # TVM's or DLPack's own error class: ours to fix, never the user's answer
            self._fall_back(f"internal error: {type(exc).__name__}: {exc}")
            return want
        self._kernels, self._extras, self._shapes = (lowered, res), extras, [a.shape for a in args]
        self._cast = casts(lowered, [*args, *extras])
        # parameters and the subgraph's own constants are the same tensors at every call: imported once
        stable = [i for i, a in enumerate(args) if isinstance(a, torch.nn.Parameter)]
        self._kept = KeptInputs([*stable, *range(len(args), len(args) + len(extras))])
        self.report.subgraph(
            self.name,
            f"gensorage: {res.num_kernels} kernel(s) for {len(lowered.program.live_ids())} program nodes, "
            f"{dtype}; µGraph: {res.equivalence.method}; kernels {within}",
        )
        return got

    def _against_float64(
        self,
        args: tuple[torch.Tensor, ...],
        got: tuple[torch.Tensor, ...],
        want: tuple[torch.Tensor, ...],
        err: float,
        tolerance: float,
    ) -> tuple[float, str]:
        """The subgraph in float64 decides when the kernels differ from torch by more than the tolerance: in
        float16 or bfloat16 torch's own answer can be that far off (its scores rounded before a softmax of large
        logits; an overflow to inf where the kernels compute in float32). Kernels within the tolerance of the
        float64 answer pass, and so do kernels no further from it than torch's finite answer (the user gets the
        better of two answers that both miss it): their error and how it was judged. Raises
        :class:`~gensorage.errors.GensorageError` otherwise, or when the float64 run fails."""
        differ = f"kernels differ from torch by {err:.2e} (tolerance {tolerance:.0e})"
        if any(g.shape != w.shape or g.dtype != w.dtype for g, w in zip(got, want, strict=True)):
            raise GensorageError(differ)
        try:
            with check_threads(args):
                ref = tuple(self.sub(*[a.double() if a.is_floating_point() else a for a in args]))
        except Exception as exc:
            raise GensorageError(f"{differ}; the float64 run that would decide failed: {exc}") from None
        ours, theirs = mismatch(got, ref, same_dtype=False), mismatch(want, ref, same_dtype=False)
        if not (ours <= tolerance or ours <= theirs < math.inf):
            raise GensorageError(
                f"{differ}, and from float64 by {ours:.2e} where torch is off by {theirs:.2e}"
            )
        return (
            ours,
            f"within {ours:.1e} of float64, torch's own answer {theirs:.1e} (the two {err:.1e} apart)",
        )


@dataclass(slots=True)
class _OneThread:
    """The checks holding torch at one intra-op thread, and the count to restore when the last one ends."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    checks: int = 0
    restore: int = 1


_ONE_THREAD = _OneThread()


@contextmanager
def check_threads(args: tuple[torch.Tensor, ...]) -> Iterator[None]:
    """One intra-op thread for torch's work in the check of a small subgraph on the CPU (its reference run, the
    comparison with the kernels' outputs; ``torch.set_num_threads``, restored after). Its ops are then
    microseconds each, and with several threads every op is a fork and join of OpenMP's team, which waits for
    any thread another process holds off its core: on the 2-core dev machine with the cores busy, the small
    decoder layer's 75 ops took ~117 ms with 2 threads and 0.35 ms with one. The setting is the process's: torch
    work of other threads meanwhile also runs on one thread (the same results, only slower). Checks in several
    threads at once share it: the first saves the count, the last restores it (each restoring its own would
    leave the process at one thread when two overlap)."""
    small = sum(a.numel() for a in args if isinstance(a, torch.Tensor)) <= SMALL_REFERENCE_ELEMENTS
    if not small or any(a.device.type != "cpu" for a in args if isinstance(a, torch.Tensor)):
        yield
        return
    one = _ONE_THREAD
    with one.lock:
        if one.checks == 0:
            one.restore = torch.get_num_threads()
            if one.restore != 1:
                torch.set_num_threads(1)
        one.checks += 1
    try:
        yield
    finally:
        with one.lock:
            one.checks -= 1
            if one.checks == 0 and one.restore != 1:
                torch.set_num_threads(one.restore)


_DISPATCHERS: dict[tuple[Options, tuple[int, int] | None], Dispatcher] = {}


def dispatcher(options: Options, device: torch.device | None = None) -> Dispatcher:
    """The per-shape kernel cache of ``options`` (one per hw, mode and budget, shared by every graph) for the
    tensors of ``device``: a GPU's gets the profile with that GPU's arch (:func:`.device.profile_for`)."""
    cuda = device is not None and device.type == "cuda"
    arch = torch.cuda.get_device_capability(device) if cuda else None
    key = (Options(options.hw, options.mode, options.time_budget_s), arch)
    if key not in _DISPATCHERS:
        hw = load_profile(options.hw)
        hw = profile_for(hw, arch) if arch is not None else hw
        _DISPATCHERS[key] = Dispatcher(hw, options.mode, options.time_budget_s)
    return _DISPATCHERS[key]


def compiled(program: Program, options: Options, device: torch.device | None = None) -> ShapeKernels:
    """The verified kernels of ``program``, built for ``device``'s tensors (llvm for the CPU's, CUDA for a
    GPU's, nothing else): cached by its key, and a new shape of a program structure seen before reuses that
    structure's µGraph (:mod:`gensorage.superopt.dispatch`)."""
    target = build_for(device) if device is not None else "llvm"
    return dispatcher(options, device).kernels(program, target)


def _as_input(a: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``a`` as its program input: in its dtype, a 0-d value as ``(1,)``; untouched (no new tensor) otherwise."""
    a = a if a.dtype is dtype else a.to(dtype)
    return a.reshape(1) if a.dim() == 0 else a


def casts(lowered: Lowered, args: Sequence[torch.Tensor]) -> tuple[int, ...]:
    """The positions of ``args`` that are not their program inputs as they are (another dtype, or 0-d)."""
    return tuple(
        i
        for i, (a, d) in enumerate(zip(args, lowered.input_dtypes, strict=True))
        if not (a.dtype is d and a.dim())
    )


def run_kernels(
    lowered: Lowered,
    res: ShapeKernels,
    args: list[torch.Tensor],
    kept: KeptInputs | None = None,
    cast: Sequence[int] | None = None,
) -> tuple[torch.Tensor, ...]:
    """The kernels of ``res`` on ``args`` where they are (:mod:`.device`: DLPack in and out, no copies, the
    inputs at ``kept``'s positions imported once); an argument in another dtype than its program input (a
    float32 value the graph casts down) is cast first.

    ``cast``: the only positions that may need it (:func:`casts` at a checked call of the same graph, whose
    arguments' dtypes dynamo guards); the others are passed as they are, and one in another dtype after all is
    the runner's one-line error (:class:`~gensorage.codegen.runner.KernelRunner` checks each torch tensor's
    dtype), never a wrong answer. None: every position is looked at."""
    if cast is None:
        cast = casts(lowered, args)
    if cast:
        args = list(args)
        for i in cast:
            args[i] = _as_input(args[i], lowered.input_dtypes[i])
    tensors = run_on_device(res, args, kept)
    outs = [tensors[i] for i in lowered.outputs]
    if lowered.plain:  # no per-output dtype and stride look-ups (~0.3 µs an output)
        return tuple(outs)
    got = tuple(
        _strided(t if t.dtype is d else t.to(d), s)
        for t, s, d in zip(outs, lowered.strides, lowered.dtypes, strict=True)
    )
    if lowered.plain is None:
        lowered.plain = all(g is t for g, t in zip(got, outs, strict=True))
    return got


def _strided(t: torch.Tensor, stride: tuple[int, ...]) -> torch.Tensor:
    """``t`` in the layout torch's graph gave the value: later views in torch rely on it (``transpose`` of an
    attention output, then ``view``)."""
    if not stride:  # a 0-d value, (1,) in the Program
        return t.reshape(())
    if t.stride() == stride or t.numel() <= 1:
        return t
    return torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device).copy_(t)


def mismatch(
    got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...], *, same_dtype: bool = True
) -> float:
    """Largest ``|got - want|`` relative to the largest finite ``|want|``, over all outputs; inf where the shapes,
    the dtypes (the next torch op would reject the tensor; not compared with ``same_dtype=False``, against a
    float64 reference) or the positions of non-finite values differ."""
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        if g.shape != w.shape or (same_dtype and g.dtype != w.dtype):
            return math.inf
        g64, w64 = g.double(), w.double()
        finite = torch.isfinite(w64)
        if not torch.equal(finite, torch.isfinite(g64)) or not torch.equal(g64.isnan(), w64.isnan()):
            return math.inf
        if not torch.equal(
            g64[w64.isinf()], w64[w64.isinf()]
        ):  # NaN where torch has NaN (a fully masked row)
            return math.inf
        if finite.any():
            scale = max(float(w64[finite].abs().max()), 1e-30)
            worst = max(worst, float((g64[finite] - w64[finite]).abs().max()) / scale)
    return worst


__all__ = [
    "GensorageSubgraph",
    "Lowered",
    "Options",
    "casts",
    "check_threads",
    "compiled",
    "dispatcher",
    "lower",
    "mismatch",
    "run_kernels",
]

"""A whole µGraph compiled to TVM kernels, with a host-side runner for the CPU (llvm) and CUDA.

Every kernel op becomes one or more PrimFuncs (:mod:`gensorage.codegen.ugraph_tir` for graph-defined ops,
:mod:`gensorage.codegen.predefined` for pre-defined ones); all of them go into one ``IRModule`` built with one
``tvm.compile``. The runner launches them in kernel-graph order, allocating every intermediate tensor once;
a kernel that sees a tensor under another shape (batch dims flattened, a reshape) gets a view of it. A
transpose that its matmuls read in place (:mod:`gensorage.codegen.operand_views`) has neither a kernel nor
storage.

Usage::

    cg = compile_ugraph(ugraph, load_profile("h100"))
    cg.cuda_source()            # CUDA C of every kernel
    cg.run(x, w1, w2)           # the llvm build of the same kernels, on numpy arrays
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gensorage.codegen import generic_rows
from gensorage.codegen.barriers import divergent_barriers, has_explicit_barriers, honour_explicit_barriers
from gensorage.codegen.kernel_text import ScheduledKernel
from gensorage.codegen.operand_views import graph_views
from gensorage.codegen.predefined import emit_predefined, is_alias
from gensorage.codegen.scalar import FloatScalar, Scalar
from gensorage.codegen.ugraph_tir import (
    TARGETS,
    KernelParam,
    KernelText,
    Target,
    compute_dtype,
    plan_threads,
)
from gensorage.construction.block_threads import ThreadChoice
from gensorage.dtypes import numpy_dtype
from gensorage.errors import ProgramError, ScheduleError, UnsupportedOpError
from gensorage.hw.profile import HwProfile
from gensorage.ugraph.ir import GraphDefinedOp, KernelGraph, KernelOp, Ref
from gensorage.ugraph.shapes import GraphInfo
from gensorage.ugraph.validate import validate


@dataclass(frozen=True, slots=True)
class Kernel:
    """One lowered kernel: its PrimFunc, TVMScript, parameters and launch shape.

    ``component`` is set for field-mode kernels that compute one residue of their output (0: mod p, 1: mod q);
    they see that component of their tensors (CPU only).
    """

    name: str
    op_index: int
    func: Any
    script: str
    params: tuple[KernelParam, ...]
    grid: tuple[int, ...] | None
    threads: int
    rule: str
    component: int | None = None
    own: Any = None  # a generic kernel's: () -> the emitter's own (func, rule) at this length, or None


def _parse(text: str, name: str) -> Any:
    from gensorage.codegen.script_templates import parse_text

    try:
        func = parse_text(text, name)
    except Exception as exc:  # a generator bug; say which kernel and keep the parser's diagnostic
        raise UnsupportedOpError(
            f"internal error: emitted TVMScript for {name} does not parse: {exc}"
        ) from exc
    if has_explicit_barriers(func):
        # TVM will not check the kernel's own barriers: check them here. Every later build of the kernel (a
        # bundle's cubin, launch_specs' pipeline), not only CompiledUGraph's, must then honour the mark.
        if divergent := divergent_barriers(func):
            raise UnsupportedOpError(
                f"internal error: {name} has {divergent} barrier(s) under a condition or in a thread loop"
            )
        honour_explicit_barriers()
    return func


def _kernel_name(g: KernelGraph, k: int) -> str:
    op = g.ops[k]
    return f"kernel{k}_{'graph' if isinstance(op, GraphDefinedOp) else op.op.value}"


def lower_ugraph(
    g: KernelGraph,
    info: GraphInfo,
    hw: HwProfile,
    plans: dict[int, ThreadChoice],
    *,
    target: Target,
    scalar: Scalar,
    seed: int = 0,
) -> list[Kernel]:
    """Every kernel of ``g`` for ``target`` in ``scalar``'s arithmetic, in launch order."""
    kernels: list[Kernel] = []
    for k, op in enumerate(g.ops):
        name = _kernel_name(g, k)
        if isinstance(op, GraphDefinedOp):  # a row kernel may be one for every length (generic_rows)
            emit = generic_rows.emitter(g, k, info, plans[k], target, scalar, name)
            kernels.append(generic_rows.row_kernel(emit, hw, seed) or _from_text(generic_rows.as_first(emit)))
            continue
        assert isinstance(op, KernelOp)
        for item in emit_predefined(g, k, info, hw, target=target, scalar=scalar, name=name, seed=seed):
            if isinstance(item, KernelText):
                kernels.append(_from_text(item))
            else:
                kernels.append(_from_scheduled(item))
    return kernels


def _from_text(kt: KernelText) -> Kernel:
    func = _parse(kt.text, kt.name)
    return Kernel(kt.name, kt.op_index, func, kt.text, kt.params, kt.grid, kt.threads, kt.rule, own=kt.own)


def _from_scheduled(sk: ScheduledKernel) -> Kernel:
    f, k = sk.func, sk
    return Kernel(k.name, k.op_index, f, f.script(), k.params, None, k.threads, k.rule, k.component, k.own)


#: The llvm build's pass options. TVM's argument checks (count, dtype, shape, strides, device, alignment of
#: every argument of every kernel) are most of a small kernel's LLVM IR, and so most of the JIT's time when a
#: module is loaded (about two thirds for a decoder layer's 25 kernels). Every caller of an llvm build checks
#: the arguments before the launches instead: :func:`_check_arrays` and :func:`_check_tensors` here (count,
#: shape, dtype, device; the tensors are ours, contiguous and aligned), and
#: :class:`~gensorage.codegen.runner.KernelRunner` (count, shape, dtype, device; DLPack checks layout and
#: alignment). The CUDA build keeps them: its arguments come from other processes' allocators too.
LLVM_CONFIG = {"tirx.disable_assert": True}
#: A quick llvm build: no LLVM optimisation (the full one is plain ``"llvm"``, level 3).
QUICK_TARGET = {"kind": "llvm", "opt-level": 0}


def ir_module(kernels: Sequence[Kernel]) -> Any:
    import tvm

    return tvm.IRModule({k.name: k.func for k in kernels})


def compile_kernels(
    kernels: Sequence[Kernel],
    target: Target,
    hw: HwProfile,
    quick: bool = False,
    share_same: bool | None = None,
) -> Any:
    """``tvm.compile`` of all kernels in one module (an Executable indexed by kernel name); ``quick``: llvm
    without LLVM's optimisation (:data:`QUICK_TARGET`, :mod:`~gensorage.codegen.symbolic_kernels`' first tier).
    ``share_same`` (default: llvm only): kernels whose TIR is the same but for their name (a gate and an up
    projection of one input) are compiled once and looked up under each name: LLVM's code generation is most of
    a CPU build, the CUDA compiler most of a CUDA one. Their CUDA source then has each distinct kernel once.
    llvm kernels are built without TVM's argument checks (:data:`LLVM_CONFIG`): every caller checks its own.
    """
    import tvm

    from gensorage.codegen.cuda_build import cuda_target
    from gensorage.codegen.tensor_core import build_config
    from gensorage.codegen.wgmma import target_profile

    same = _same_code(kernels) if (target == "llvm" if share_same is None else share_same) else {}
    mod = ir_module([k for k in kernels if k.name not in same])
    config = build_config(k.rule for k in kernels) if target == "cuda" else LLVM_CONFIG
    hw = target_profile(hw, [k.rule for k in kernels])  # wgmma kernels need sm_90a
    try:
        with tvm.transform.PassContext(config=config):
            llvm = QUICK_TARGET if quick else "llvm"
            ex = tvm.compile(mod, target=cuda_target(hw) if target == "cuda" else llvm)
            return _Renamed(ex, same) if same else ex
    except Exception as exc:  # TVM's own error classes; the generated code is at fault, name the first line
        lines = [ln for ln in str(exc).splitlines() if ln.strip()]
        raise ScheduleError(
            f"{target} build of the µGraph kernels failed: {lines[-1] if lines else exc}"
        ) from exc


def _same_code(kernels: Sequence[Kernel]) -> dict[str, str]:
    """Kernel name -> the name of an earlier kernel with the same TIR but for its name."""
    first: dict[str, str] = {}
    same: dict[str, str] = {}
    for k in kernels:
        body = re.sub(rf"\b{re.escape(k.name)}\b", "@", k.script)
        if body in first:
            same[k.name] = first[body]
        else:
            first[body] = k.name
    return same


class _Renamed:
    """An Executable whose functions are also looked up under other names (:func:`compile_kernels`)."""

    def __init__(self, ex: Any, names: dict[str, str]) -> None:
        self._ex = ex
        self._names = names

    def __getitem__(self, name: str) -> Any:
        return self._ex[self._names.get(name, name)]

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._ex, attr)


# ------------------------------------------------------------------------------------------------ running

#: DLPack's device type of the CPU (``kDLCPU``).
CPU_DEVICE = 1


def _view(t: Any, shape: tuple[int, ...]) -> Any:
    """``t`` seen with ``shape`` (same elements, row-major)."""
    return t if tuple(t.shape) == shape else t._create_view(shape)


def _run_component(ex: Any, kern: Kernel, values: dict[Ref, Any], dev: Any) -> None:
    """A field kernel computing residue ``kern.component`` only: run it on contiguous copies of that component.

    (Compiled kernels reject tensors with a byte offset, so a view of the second half cannot be passed.)
    """
    import tvm

    c = kern.component
    args, outs = [], []
    for p in kern.params:
        if p.role == "scratch":
            args.append(tvm.runtime.empty(p.shape, p.dtype, dev))
            continue
        assert p.ref is not None
        host = values[p.ref].numpy()
        args.append(tvm.runtime.tensor(np.ascontiguousarray(host[c].reshape(p.shape)), device=dev))
        if p.role == "output":
            outs.append((p.ref, host, args[-1]))
    ex[kern.name](*args)
    for ref, host, t in outs:
        host[c] = t.numpy().reshape(host.shape[1:])
        values[ref] = tvm.runtime.tensor(host, device=dev)


def _bind_outputs(
    g: KernelGraph,
    info: GraphInfo,
    k: int,
    values: dict[Ref, Any],
    dev: Any,
    scalar: Scalar,
    views: frozenset[int],
) -> None:
    """Give kernel op ``k``'s outputs their device tensors (an alias op's output is a view of its input)."""
    import tvm

    node, op = len(g.inputs) + k, g.ops[k]
    if isinstance(op, KernelOp) and is_alias(op):
        values[Ref(node)] = _view(values[op.inputs[0]], scalar.buf_shape(info.nodes[node][0].shape))
        return
    if k in views:  # a transposed view, never stored: its matmuls read its input
        return
    for o, t in enumerate(info.nodes[node]):
        values[Ref(node, o)] = tvm.runtime.empty(scalar.buf_shape(t.shape), scalar.buf_dtype(t.dtype), dev)


def _by_op(kernels: Sequence[Kernel]) -> dict[int, list[Kernel]]:
    by_op: dict[int, list[Kernel]] = {}
    for kern in kernels:
        by_op.setdefault(kern.op_index, []).append(kern)
    return by_op


def _args(kern: Kernel, values: dict[Ref, Any], field_params: Any, dev: Any) -> list[Any]:
    import tvm

    def arg(p: KernelParam) -> Any:
        if p.role == "field":
            return field_params
        if p.role == "scratch":  # allocated here, once per launch plan or execution
            return tvm.runtime.empty(p.shape, p.dtype, dev)
        return _view(values[p.ref], p.shape)  # type: ignore[index]

    return [arg(p) for p in kern.params]


def launch_plan(
    g: KernelGraph,
    info: GraphInfo,
    kernels: Sequence[Kernel],
    ex: Any,
    inputs: Sequence[Any],
    dev: Any,
    scalar: Scalar,
) -> tuple[list[tuple[Kernel, Any, list[Any]]], list[Any]]:
    """Allocate every intermediate and output once; returns the kernel calls in order and the output tensors.

    Calling ``function(*args)`` of each ``(kernel, function, args)`` in order computes the µGraph into the
    output tensors. The calls can be repeated with no allocation between launches, which is how the kernels
    are timed.
    """
    if any(k.component is not None for k in kernels):
        raise UnsupportedOpError("field-twin kernels run one residue at a time; use execute()")
    values: dict[Ref, Any] = {Ref(i): t for i, t in enumerate(inputs)}
    by_op = _by_op(kernels)
    views = graph_views(g, info)
    calls: list[tuple[Kernel, Any, list[Any]]] = []
    for k in range(len(g.ops)):
        _bind_outputs(g, info, k, values, dev, scalar, views)
        calls.extend((kern, ex[kern.name], _args(kern, values, None, dev)) for kern in by_op.get(k, []))
    return calls, [values[r] for r in g.outputs]


def execute(
    g: KernelGraph,
    info: GraphInfo,
    kernels: Sequence[Kernel],
    ex: Any,
    inputs: Sequence[Any],
    dev: Any,
    scalar: Scalar,
    field_params: Any = None,
) -> list[Any]:
    """Launch ``kernels`` (compiled into ``ex``) on device tensors ``inputs``; returns the output tensors."""
    values: dict[Ref, Any] = {Ref(i): t for i, t in enumerate(inputs)}
    by_op = _by_op(kernels)
    views = graph_views(g, info)
    for k in range(len(g.ops)):
        _bind_outputs(g, info, k, values, dev, scalar, views)
        for kern in by_op.get(k, []):
            if kern.component is not None:
                _run_component(ex, kern, values, dev)
            else:
                ex[kern.name](*_args(kern, values, field_params, dev))
    return [values[r] for r in g.outputs]


def _check_arrays(g: KernelGraph, arrays: Sequence[Any]) -> list[np.ndarray]:
    if len(arrays) != len(g.inputs):
        names = ", ".join(s.name for s in g.inputs)
        raise ProgramError(f"µGraph takes {len(g.inputs)} inputs ({names}), got {len(arrays)}")
    out = []
    for spec, a in zip(g.inputs, arrays, strict=True):
        arr = np.asarray(a)
        if tuple(arr.shape) != spec.shape:
            raise ProgramError(f"input {spec.name}: shape {list(arr.shape)} != expected {list(spec.shape)}")
        out.append(np.ascontiguousarray(arr, dtype=numpy_dtype(spec.dtype)))
    return out


def _check_tensors(g: KernelGraph, tensors: Sequence[Any], target: Target) -> None:
    if len(tensors) != len(g.inputs):
        raise ProgramError(f"µGraph takes {len(g.inputs)} inputs, got {len(tensors)}")
    for spec, t in zip(g.inputs, tensors, strict=True):
        if tuple(t.shape) != spec.shape or str(t.dtype) != spec.dtype:
            raise ProgramError(
                f"input {spec.name}: got {list(t.shape)} {t.dtype}, expected {list(spec.shape)} {spec.dtype}"
            )
        if target == "llvm" and t.device.dlpack_device_type() != CPU_DEVICE:  # no check in the build
            raise ProgramError(f"input {spec.name} is on {t.device}, the llvm kernels take CPU tensors")


# ------------------------------------------------------------------------------------------------ public API


class CompiledUGraph:
    """The kernels of a µGraph for a hardware profile; build outputs are made on first use and kept.

    Use :func:`compile_ugraph` to make one.
    """

    def __init__(
        self,
        ugraph: KernelGraph,
        hw: HwProfile,
        target: Target = "cuda",
        seed: int = 0,
        plans: dict[int, ThreadChoice] | None = None,
    ) -> None:
        if target not in TARGETS:
            raise UnsupportedOpError(f"unknown target {target!r} (expected 'cuda' or 'llvm')")
        self.ugraph = ugraph
        self.hw = hw
        self.target: Target = target
        self.seed = seed
        self.info = validate(ugraph, hw)
        self.compute = compute_dtype(ugraph, self.info)
        self.plans = {
            k: plan_threads(ugraph, k, self.info, hw, seed)
            for k, op in enumerate(ugraph.ops)
            if isinstance(op, GraphDefinedOp) and (plans is None or k not in plans)
        }
        self.plans.update(plans or {})
        self._kernels: dict[Target, list[Kernel]] = {}
        self._executables: dict[Target, Any] = {}
        self.kernels(target)

    def kernels(self, target: Target | None = None) -> list[Kernel]:
        """The float kernels for ``target`` (default: the compile target), in launch order."""
        t = target or self.target
        if t not in self._kernels:
            self._kernels[t] = lower_ugraph(
                self.ugraph,
                self.info,
                self.hw,
                self.plans,
                target=t,
                scalar=FloatScalar(self.compute),
                seed=self.seed,
            )
            if t == "cuda":
                self._check_limits(self._kernels[t])
        return self._kernels[t]

    def _check_limits(self, kernels: list[Kernel]) -> None:
        from gensorage.codegen.generic_matmul import concrete
        from gensorage.codegen.gpu_limits import verify_gpu_limits

        same = _same_code(kernels)  # a kernel of the same code as an earlier one: the same limits
        for kern in (k for k in kernels if k.name not in same):  # a matmul generic in its rows: at these
            try:
                verify_gpu_limits(ir_module([concrete(kern)]), self.hw)
            except ScheduleError as exc:
                raise UnsupportedOpError(f"{kern.name}: {exc}") from exc

    def executable(self, target: Target) -> Any:
        """The ``target`` build of the kernels (made on first use, or given by :meth:`use_executable`)."""
        if target not in self._executables:
            self._executables[target] = compile_kernels(self.kernels(target), target, self.hw)
        return self._executables[target]

    def use_executable(self, target: Target, executable: Any) -> None:
        """Run the ``target`` kernels from ``executable`` (their functions by kernel name), built elsewhere."""
        self._executables[target] = executable

    def tir(self, target: Target | None = None) -> str:
        """TVMScript of every kernel (the compile target's variant by default)."""
        return "\n\n".join(k.script for k in self.kernels(target))

    def cuda_source(self) -> str:
        """CUDA C source of all kernels (``tvm.compile`` for the profile's arch; no GPU needed)."""
        return str(self.executable("cuda").mod.imports[0].inspect_source())

    def cubin(self) -> bytes | None:
        """nvcc's cubin of the CUDA source for the arch (``sm_90a`` with wgmma kernels); None without nvcc."""
        from gensorage.codegen.cuda_build import build_cubin as nvcc_cubin
        from gensorage.codegen.wgmma import target_profile

        arch = target_profile(self.hw, [k.rule for k in self.kernels("cuda")]).arch
        return nvcc_cubin(self.cuda_source(), arch)

    def run(self, *arrays: Any, target: str = "cpu") -> list[Any]:
        """Run the kernels on ``arrays`` (one per µGraph input).

        ``target="cpu"`` runs the llvm build on numpy arrays and returns numpy arrays. ``target="cuda"`` runs
        the CUDA build on GPU 0; it accepts numpy arrays or DLPack tensors (e.g. torch) and returns numpy arrays
        for numpy inputs, DLPack-capable TVM tensors otherwise. Raises :class:`DeviceError` without a GPU.
        """
        if target in ("cpu", "llvm"):
            return self._run_cpu(arrays)
        if target == "cuda":
            return self._run_cuda(arrays)
        raise UnsupportedOpError(f"unknown run target {target!r} (expected 'cpu' or 'cuda')")

    def _run_cpu(self, arrays: Sequence[Any]) -> list[np.ndarray]:
        import tvm

        dev = tvm.cpu(0)
        inputs = [tvm.runtime.tensor(a, device=dev) for a in _check_arrays(self.ugraph, arrays)]
        outs = execute(
            self.ugraph,
            self.info,
            self.kernels("llvm"),
            self.executable("llvm"),
            inputs,
            dev,
            FloatScalar(self.compute),
        )
        return [np.asarray(o.numpy()) for o in outs]

    def _run_cuda(self, arrays: Sequence[Any]) -> list[Any]:
        import tvm

        from gensorage.codegen.cuda_build import require_cuda_device

        require_cuda_device("the µGraph")
        dev = tvm.cuda(0)
        numpy_in = all(isinstance(a, np.ndarray) for a in arrays)
        if numpy_in:
            inputs = [tvm.runtime.tensor(a, device=dev) for a in _check_arrays(self.ugraph, arrays)]
        else:
            inputs = [tvm.runtime.from_dlpack(a) for a in arrays]
        outs = self.run_tensors(inputs, "cuda")
        dev.sync()
        return [np.asarray(o.numpy()) for o in outs] if numpy_in else outs

    def run_tensors(self, inputs: Sequence[Any], target: Target) -> list[Any]:
        """Run the ``target`` build on TVM tensors already on its device (DLPack imports of torch tensors, say:
        no copies); returns the outputs as new TVM tensors on the inputs' device.

        The launches are asynchronous on a GPU (on TVM's current stream); reading the outputs on that stream
        (or after a sync) sees them. Raises :class:`ProgramError` for a wrong count, shape or dtype.
        """
        import tvm

        _check_tensors(self.ugraph, inputs, target)
        dev = inputs[0].device if inputs else tvm.cpu(0)
        scalar = FloatScalar(self.compute)
        kernels, ex = self.kernels(target), self.executable(target)
        return execute(self.ugraph, self.info, kernels, ex, inputs, dev, scalar)

    def field_twin(self, p: int | None = None, q: int | None = None) -> Any:
        """The :class:`~gensorage.codegen.field_twin.FieldTwin` of these kernels (same thread plans)."""
        from gensorage.codegen.field_twin import FieldTwin
        from gensorage.verify.primes import DEFAULT_P, DEFAULT_Q

        return FieldTwin(
            self.ugraph, self.hw, p=p or DEFAULT_P, q=q or DEFAULT_Q, seed=self.seed, plans=self.plans
        )

    def describe(self) -> str:
        """One line per kernel: name, launch shape and how its threads were chosen."""
        lines = []
        for k in self.kernels():
            grid = "scheduled" if k.grid is None else "x".join(str(n) for n in k.grid)
            lines.append(f"{k.name}: grid {grid}, {k.threads} threads/block; {k.rule}")
        return "\n".join(lines)


def compile_ugraph(
    ugraph: KernelGraph,
    hw: HwProfile,
    target: Target = "cuda",
    *,
    seed: int = 0,
    plans: dict[int, ThreadChoice] | None = None,
) -> CompiledUGraph:
    """Lower every kernel op of ``ugraph`` to TVM TIR for ``hw``.

    Parameters
    ----------
    ugraph : KernelGraph
        A valid µGraph (checked against ``hw``'s memory limits).
    hw : HwProfile
        The GPU profile: thread limits, shared memory, arch (``hw.arch``) for CUDA code generation.
    target : {"cuda", "llvm"}
        Which variant to lower eagerly (the other is lowered on demand); ``cuda`` kernels are also checked
        against ``hw``'s per-block limits.
    seed : int
        Seed of the Markov construction that picks threads and register tiles.
    plans : dict, optional
        Thread plans to use instead of the construction's for some graph-defined ops (kernel op index ->
        :class:`~gensorage.construction.block_threads.ThreadChoice`; e.g. to pin a tiling).

    Returns
    -------
    CompiledUGraph

    Raises
    ------
    UGraphError
        ``ugraph`` is invalid.
    UnsupportedOpError
        A construct the generator cannot emit correctly (it never emits a wrong kernel instead).
    """
    return CompiledUGraph(ugraph, hw, target, seed, plans)


def run_cpu(ugraph: KernelGraph, hw: HwProfile, *arrays: np.ndarray, seed: int = 0) -> list[np.ndarray]:
    """Run the llvm build of ``ugraph``'s kernels on numpy arrays; returns the outputs."""
    return compile_ugraph(ugraph, hw, "llvm", seed=seed).run(*arrays, target="cpu")


def build_cuda(ugraph: KernelGraph, hw: HwProfile, *, seed: int = 0) -> str:
    """CUDA C source of every kernel of ``ugraph`` for ``hw.arch``."""
    return compile_ugraph(ugraph, hw, "cuda", seed=seed).cuda_source()


def build_cubin(ugraph: KernelGraph, hw: HwProfile, *, seed: int = 0) -> bytes | None:
    """nvcc-compiled cubin of :func:`build_cuda`'s source; None when nvcc is not available."""
    return compile_ugraph(ugraph, hw, "cuda", seed=seed).cubin()


__all__ = [
    "CompiledUGraph",
    "Kernel",
    "build_cubin",
    "build_cuda",
    "compile_kernels",
    "compile_ugraph",
    "execute",
    "ir_module",
    "launch_plan",
    "lower_ugraph",
    "run_cpu",
]

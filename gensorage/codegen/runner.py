"""A prepared launch sequence of compiled µGraph kernels: what a repeated call costs on top of the kernels.

:meth:`~gensorage.codegen.module.CompiledUGraph.run` is general: it copies numpy inputs into TVM tensors,
allocates every intermediate, looks every kernel up by name and copies the outputs back. A caller that runs the
same kernels many times (the per-shape dispatch cache, :mod:`gensorage.superopt.dispatch`) prepares all of that
once here: the kernels' functions are looked up, intermediates and scratch buffers are allocated and every
argument that does not depend on the call is bound. A call then wraps its inputs and fresh outputs through
DLPack (no copy) and launches the kernels in order.

Intermediates are shared between calls, so calls of one runner are serialised by a lock. Inputs must be
contiguous DLPack-capable arrays (torch tensors, numpy arrays) of the µGraph's input shapes and dtypes whose
data is aligned to :data:`ALIGNMENT` bytes (TVM's requirement, which its import checks; torch's allocations are
aligned, a view at an offset may not be), or the caller passes ``prepare`` to copy those that are not; outputs
come from the caller's allocator (aligned alike), so they are the caller's kind of array and never alias each
other.

The same holds on a GPU (``target="cuda"``): the intermediates live on that GPU for the runner's lifetime, the
caller allocates the outputs there (torch's allocator, say), and the launches go to TVM's current stream, so
the caller orders calls by running them on one stream. The outputs are the caller's memory, never TVM's, so
their lifetime is the caller's allocator's alone.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gensorage.codegen.module import CPU_DEVICE
from gensorage.codegen.operand_views import graph_views
from gensorage.codegen.predefined import is_alias
from gensorage.codegen.scalar import FloatScalar
from gensorage.codegen.ugraph_tir import Target
from gensorage.errors import ProgramError, UnsupportedOpError
from gensorage.ugraph.ir import KernelOp, Ref

#: ``alloc(shape, dtype)``: a fresh contiguous DLPack-capable array (dtype named as in the µGraph).
Alloc = Callable[[tuple[int, ...], str], Any]

#: ``prepare(array)``: the array as the kernels can import it (contiguous, aligned); see ``KernelRunner.__call__``.
Prepare = Callable[[Any], Any]

#: Byte alignment TVM requires of the data of a tensor it takes through DLPack.
ALIGNMENT = 64

# Where a kernel argument comes from at call time: a call input, a call output, or bound once (a TVM tensor).
_INPUT, _OUTPUT, _BOUND = 0, 1, 2


@dataclass(frozen=True, slots=True)
class _Arg:
    kind: int
    index: int  # input or output position (_INPUT, _OUTPUT)
    view: tuple[int, ...] | None  # the kernel's view of that tensor, None when it is the tensor's own shape
    bound: Any = None  # the TVM tensor (_BOUND)


class KernelRunner:
    """The ``target`` kernels of a :class:`~gensorage.codegen.module.CompiledUGraph` (llvm, or CUDA on GPU
    ``device_index``), ready to run repeatedly.

    Raises
    ------
    UnsupportedOpError
        The µGraph has an output that is an input or a view of another tensor (the general
        :meth:`~gensorage.codegen.module.CompiledUGraph.run` serves it), or field kernels.
    """

    def __init__(self, compiled: Any, target: Target = "llvm", device_index: int = 0) -> None:
        import tvm

        g, info = compiled.ugraph, compiled.info
        kernels = compiled.kernels(target)
        if any(k.component is not None for k in kernels):
            raise UnsupportedOpError("field kernels run one residue at a time")
        ex = compiled.executable(target)
        scalar = FloatScalar(compiled.compute)
        dev = tvm.cuda(device_index) if target == "cuda" else tvm.cpu(0)
        self.input_shapes = tuple(s.shape for s in g.inputs)
        self.input_dtypes = tuple(s.dtype for s in g.inputs)
        outputs = {r: j for j, r in enumerate(g.outputs)}
        if len(outputs) != len(g.outputs):
            raise UnsupportedOpError("the µGraph returns one tensor twice")
        self.output_specs: list[tuple[tuple[int, ...], str]] = []
        for r in g.outputs:
            if r.node < len(g.inputs) or _is_alias_node(g, r.node):
                raise UnsupportedOpError(f"output {r} is an input or a view of another tensor")
            t = info.of(r)
            self.output_specs.append((scalar.buf_shape(t.shape), scalar.buf_dtype(t.dtype)))
        # Every tensor a kernel can see: (kind, index, shape) of its storage; alias ops view their input's.
        base: dict[Ref, tuple[int, int, Any, tuple[int, ...]]] = {
            Ref(i): (_INPUT, i, None, s.shape) for i, s in enumerate(g.inputs)
        }
        by_op: dict[int, list[Any]] = {}
        for kern in kernels:
            by_op.setdefault(kern.op_index, []).append(kern)
        self._calls: list[tuple[Any, tuple[_Arg, ...]]] = []
        self._names: list[str] = []  # each call's kernel, to look its function up again (relink)
        views = graph_views(g, info)
        for k in range(len(g.ops)):
            node = len(g.inputs) + k
            op = g.ops[k]
            if isinstance(op, KernelOp) and is_alias(op):
                base[Ref(node)] = base[op.inputs[0]]
                continue
            if k in views:  # a transpose its matmuls read in place: no storage
                continue
            for o, t in enumerate(info.nodes[node]):
                ref, shape = Ref(node, o), scalar.buf_shape(t.shape)
                if ref in outputs:
                    base[ref] = (_OUTPUT, outputs[ref], None, shape)
                else:
                    base[ref] = (_BOUND, 0, tvm.runtime.empty(shape, scalar.buf_dtype(t.dtype), dev), shape)
            for kern in by_op.get(k, []):
                self._calls.append((ex[kern.name], tuple(_arg(p, base, dev) for p in kern.params)))
                self._names.append(kern.name)
        self._lock = threading.Lock()
        # The llvm build does not check its arguments (gensorage.codegen.module.LLVM_CONFIG): the call does.
        self._cpu = target == "llvm"
        self._dtypes_seen: list[Any] = [None] * len(self.input_dtypes)
        self._imported_seen: list[Any] = [None] * len(self.input_dtypes)
        self._tensor_type = tvm.runtime.Tensor
        self._plan()

    def _plan(self) -> None:
        """Each kernel's arguments as positions in one list per call (``_slots``): the bound tensors first, then
        the inputs, the outputs and the views of those the kernels take; an ``itemgetter`` per kernel picks its
        arguments from that list in C, instead of resolving each argument in Python at every call."""
        import tvm_ffi

        fixed: list[Any] = []
        views: list[tuple[int, int, Any, Any]] = []  # (kind, index, shape, dtype) of each call-time view
        where: dict[Any, int] = {}
        n_in, n_out = len(self.input_shapes), len(self.output_specs)
        for _, args in self._calls:
            for a in args:
                if a.kind == _BOUND and id(a.bound) not in where:
                    where[id(a.bound)] = len(fixed)
                    fixed.append(a.bound)
        for _, args in self._calls:
            for a in args:
                if a.kind != _BOUND and a.view is not None and (a.kind, a.index, a.view) not in where:
                    where[(a.kind, a.index, a.view)] = len(fixed) + n_in + n_out + len(views)
                    dtype = self.input_dtypes[a.index] if a.kind == _INPUT else self.output_specs[a.index][1]
                    # shape and dtype built once: TVM's _create_view builds them from Python values in µs
                    views.append((a.kind, a.index, tvm_ffi.Shape(a.view), tvm_ffi.dtype(dtype)))

        def position(a: _Arg) -> int:
            if a.kind == _BOUND:
                return where[id(a.bound)]
            if a.view is not None:
                return where[(a.kind, a.index, a.view)]
            return len(fixed) + a.index + (n_in if a.kind == _OUTPUT else 0)

        self._fixed, self._views = fixed, views
        self._plan_calls = [(fn, _picker([position(a) for a in args])) for fn, args in self._calls]

    def relink(self, executable: Any) -> None:
        """Look every kernel's function up again in ``executable`` (by kernel name), after a rebuild swapped new
        ones in (:mod:`gensorage.codegen.symbolic_kernels`' tiers). One assignment replaces the launch list: a
        call running meanwhile finishes on the functions it started with."""
        functions = [executable[name] for name in self._names]
        self._calls = [(fn, args) for fn, (_, args) in zip(functions, self._calls, strict=True)]
        self._plan_calls = [(fn, pick) for fn, (_, pick) in zip(functions, self._plan_calls, strict=True)]

    def _check_dtype(self, i: int, dtype: Any) -> None:
        if str(dtype).removeprefix("torch.") != self.input_dtypes[i]:
            raise ProgramError(f"input {i} is {dtype}, the kernels take {self.input_dtypes[i]}")
        self._dtypes_seen[i] = dtype

    def __call__(self, arrays: Sequence[Any], alloc: Alloc, prepare: Prepare | None = None) -> list[Any]:
        """Run the kernels on ``arrays``; returns the outputs, allocated by ``alloc``.

        An array may also be a TVM tensor the caller imported once (``tvm.runtime.from_dlpack``) and passes at
        every call (a model's weight, say): it is checked the first time it is seen at its position and then
        taken as it is, which saves its import at every call.

        ``prepare``: what to do with an array whose import TVM refuses (strided, or its data not aligned): its
        result (a contiguous aligned copy, say) is imported instead. Without it such an array is a one-line
        error. Arrays are imported as they are first, so a caller pays for ``prepare`` only where it is needed.
        """
        import tvm

        if len(arrays) != len(self.input_shapes):
            raise ProgramError(f"the kernels take {len(self.input_shapes)} inputs, got {len(arrays)}")
        from_dlpack = tvm.runtime.from_dlpack
        seen, tensor_type = self._imported_seen, self._tensor_type
        shapes, dtypes, cpu = self.input_shapes, self._dtypes_seen, self._cpu
        ins: list[Any] = []
        try:
            for i, a in enumerate(arrays):
                if a is seen[i]:  # a TVM tensor checked at this position before
                    ins.append(a)
                    continue
                # a torch tensor of the shape and a dtype seen before, in CPU memory for the llvm kernels,
                # passes these checks inline; anything else gets the full check (which raises)
                if (
                    a.shape != shapes[i]
                    or a.dtype is not dtypes[i]
                    or (cpu and not getattr(a, "is_cpu", False))
                ):
                    self._check(i, a)
                if type(a) is tensor_type:
                    seen[i] = a
                    ins.append(a)
                    continue
                try:
                    ins.append(from_dlpack(a))
                except (RuntimeError, BufferError):  # strided or misaligned (torch's BufferError: such a
                    if prepare is None:  # tensor that requires grad): the caller's copy, else the error below
                        raise
                    ins.append(from_dlpack(prepare(a)))
            outs = [alloc(shape, dtype) for shape, dtype in self.output_specs]
            tensors = (ins, [from_dlpack(o) for o in outs])
        except (RuntimeError, BufferError) as exc:  # TVM's check of the alignment, the device or the layout
            raise ProgramError(f"the kernels cannot take these arrays through DLPack: {exc}") from None
        slots = [*self._fixed, *tensors[0], *tensors[1]]
        slots.extend(
            tensors[kind][index]._create_view(view, dtype) for kind, index, view, dtype in self._views
        )
        with self._lock:
            try:
                for fn, pick in self._plan_calls:
                    fn(*pick(slots))
            except TypeError as exc:  # TVM's check of the arguments' dtypes (the CUDA build's)
                want = ", ".join(self.input_dtypes)
                raise ProgramError(f"the kernels take {want}: {str(exc).splitlines()[0]}") from None
        return outs

    def _check(self, i: int, a: Any) -> None:
        """Input ``i``'s shape, dtype and (for the llvm kernels) memory."""
        if tuple(a.shape) != self.input_shapes[i]:
            raise ProgramError(
                f"an input has shape {list(a.shape)}, the kernels take {list(self.input_shapes[i])}"
            )
        if a.dtype is not self._dtypes_seen[i]:  # a dtype object checked before passes at once
            self._check_dtype(i, a.dtype)
        if self._cpu and not _on_cpu(a):
            raise ProgramError("an input is not in CPU memory: the llvm kernels take CPU arrays")


def _picker(positions: list[int]) -> Callable[[list[Any]], tuple[Any, ...]]:
    """The arguments at ``positions`` of a call's slot list, as a tuple (``itemgetter`` returns a bare item for
    one position)."""
    if len(positions) == 1:
        (p,) = positions
        return lambda slots: (slots[p],)
    return operator.itemgetter(*positions)


def _on_cpu(a: Any) -> bool:
    """Whether DLPack-capable ``a`` is in CPU memory (torch's ``is_cpu`` first: its DLPack query is slow)."""
    cpu = getattr(a, "is_cpu", None)
    return bool(cpu) if cpu is not None else a.__dlpack_device__()[0] == CPU_DEVICE


def _is_alias_node(g: Any, node: int) -> bool:
    op = g.ops[node - len(g.inputs)]
    return isinstance(op, KernelOp) and is_alias(op)


def _arg(p: Any, base: dict[Ref, tuple[int, int, Any, tuple[int, ...]]], dev: Any) -> _Arg:
    import tvm

    if p.role == "scratch":
        return _Arg(_BOUND, 0, None, tvm.runtime.empty(p.shape, p.dtype, dev))
    if p.role == "field":
        raise UnsupportedOpError("field kernels run one residue at a time")
    kind, index, bound, shape = base[p.ref]
    view = None if tuple(p.shape) == shape else tuple(p.shape)
    if kind == _BOUND:
        return _Arg(kind, 0, None, bound if view is None else bound._create_view(view))
    return _Arg(kind, index, view)


def _resolve(a: _Arg, tensors: tuple[list[Any], list[Any]]) -> Any:
    if a.kind == _BOUND:
        return a.bound
    t = tensors[a.kind][a.index]
    return t if a.view is None else t._create_view(a.view)


__all__ = ["ALIGNMENT", "Alloc", "KernelRunner", "Prepare"]

"""Where a subgraph's kernels run: the tensors' device picks the build, and the tensors reach the kernels and come
back through DLPack, without copies.

CPU tensors run the llvm build; CUDA tensors run a CUDA build for the GPU they are on (its compute capability, not
the profile's, when the two differ) on torch's current stream, so the kernels are ordered with the torch ops
around them without a device sync. Inputs are imported with ``tvm.runtime.from_dlpack`` (the same memory); the
kernels need contiguous data aligned to 64 bytes, so a strided or offset view is first copied by torch on its own
device. Outputs are torch allocations on the inputs' device that the kernels write through DLPack (a prepared
:class:`~gensorage.codegen.runner.KernelRunner` per µGraph and device, its intermediates kept on the device).
Nothing passes through numpy or the host on the CUDA path.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from gensorage.codegen.cuda_build import require_cuda_device
from gensorage.codegen.module import CompiledUGraph, compile_ugraph
from gensorage.codegen.runner import ALIGNMENT, KernelRunner
from gensorage.codegen.ugraph_tir import Target
from gensorage.errors import UnsupportedOpError

if TYPE_CHECKING:
    from gensorage.hw.profile import HwProfile
    from gensorage.superopt.dispatch import ShapeKernels

#: The kernel build for each torch device type.
BUILDS: dict[str, Target] = {"cpu": "llvm", "cuda": "cuda"}


def build_for(device: torch.device) -> Target:
    """The kernel build that runs on ``device``'s tensors; a one-line error for other devices."""
    if device.type not in BUILDS:
        raise UnsupportedOpError(f"tensors on {device}: gensorage kernels run on cpu and cuda tensors")
    return BUILDS[device.type]


def cuda_arch(capability: tuple[int, int]) -> str:
    """The CUDA arch of a compute capability: (9, 0) -> ``"sm_90"``."""
    major, minor = capability
    return f"sm_{major}{minor}"


def profile_for(hw: HwProfile, capability: tuple[int, int]) -> HwProfile:
    """``hw`` with the arch of the GPU at hand (its limits stay the profile's: they only bound the kernels)."""
    arch = cuda_arch(capability)
    return hw if hw.arch.removesuffix("a") == arch else replace(hw, arch=arch)


_BUILT: dict[tuple[Any, ...], CompiledUGraph] = {}


_ON_DEVICE: dict[tuple[int, torch.device], tuple[CompiledUGraph, CompiledUGraph]] = {}

# (µGraph, runner, the generation of the functions it looked up: a CUDA first tier's are replaced later)
_RUNNERS: dict[tuple[int, torch.device], tuple[CompiledUGraph, KernelRunner | None, int]] = {}


def kernels_for(cg: CompiledUGraph, device: torch.device) -> CompiledUGraph:
    """``cg``'s kernels built for ``device`` (built once per µGraph and arch, then kept).

    Looked up by ``cg``'s identity on every call (hashing the µGraph would cost more than a small kernel); the
    entry holds ``cg``, so the identity is not reused while the entry lives.
    """
    key = (id(cg), device)
    if key not in _ON_DEVICE:
        if build_for(device) == "llvm":
            built = cg
            built.executable("llvm")  # build now: a failure is a fallback reason at the first call
        else:
            require_cuda_device(f"gensorage kernels for tensors on {device}")
            built = cuda_kernels(cg, torch.cuda.get_device_capability(device))
        _ON_DEVICE[key] = (cg, built)
    return _ON_DEVICE[key][1]


def cuda_kernels(cg: CompiledUGraph, capability: tuple[int, int]) -> CompiledUGraph:
    """``cg``'s CUDA build for a GPU of ``capability`` (compiles without a GPU; loading the module needs one)."""
    hw = profile_for(cg.hw, capability)
    key = (cg.ugraph, hw, cg.seed)
    if key not in _BUILT:
        built = cg if hw is cg.hw else compile_ugraph(cg.ugraph, hw, "cuda", seed=cg.seed)
        built.executable("cuda")
        _BUILT[key] = built
    return _BUILT[key]


def aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` contiguous with its data aligned as TVM needs: the same memory when it is, else a torch copy on its
    own device (detached where it requires grad: DLPack takes no such tensor)."""
    if t.requires_grad:
        t = t.detach()
    if not t.is_contiguous() or t.data_ptr() % ALIGNMENT:
        t = t.clone(memory_format=torch.contiguous_format)
    return t


class KeptInputs:
    """One caller's inputs that are the same tensor at every call (a module's parameters, a subgraph's own
    constants), imported for the kernels once instead of at every call.

    Only ``positions`` are kept. An entry is used while the argument is the same tensor object at the same
    address (``param.data = ...`` moves it: imported again); a tensor the kernels can only take as a copy
    (strided or misaligned) is never kept, since the copy would not see its in-place updates. The entries hold
    the tensors, which their caller holds anyway.
    """

    def __init__(self, positions: Sequence[int]) -> None:
        self.positions = frozenset(positions)
        self._held: dict[int, tuple[torch.Tensor, int, Any]] = {}

    def imported(self, i: int, t: torch.Tensor) -> Any:
        """Input ``i`` as the kernels take it: the kept TVM tensor, or ``t`` prepared (and kept when it can)."""
        held = self._held.get(i)
        if held is not None and held[0] is t and held[1] == t.data_ptr():
            return held[2]
        a = aligned(t)
        if a.data_ptr() != t.data_ptr():  # a copy: taken at this call only
            return a
        import tvm

        imported = tvm.runtime.from_dlpack(a)
        self._held[i] = (t, t.data_ptr(), imported)
        return imported

    def arguments(self, args: Sequence[torch.Tensor]) -> list[Any]:
        """``args`` for the runner: kept inputs as :meth:`imported` gives them, the others as they are (the
        runner imports them and copies, with :func:`aligned`, only those TVM refuses; one loop: a call per kept
        input costs more than the lookup it makes)."""
        held, positions = self._held, self.positions
        out: list[Any] = []
        for i, t in enumerate(args):
            entry = held.get(i)
            if entry is not None and entry[0] is t and entry[1] == t.data_ptr():
                out.append(entry[2])
            else:
                out.append(self.imported(i, t) if i in positions else t)
        return out


def kernel_input(t: torch.Tensor) -> Any:
    """``t`` as a TVM tensor on its device: the same memory when it is contiguous and aligned, else a torch copy."""
    import tvm

    return tvm.runtime.from_dlpack(aligned(t))


def _stream(device: torch.device) -> AbstractContextManager[Any]:
    if device.type != "cuda":
        return nullcontext()
    import tvm_ffi

    return tvm_ffi.use_torch_stream()  # type: ignore[no-any-return]


def _empty(shape: tuple[int, ...], dtype: str) -> torch.Tensor:
    # sizes as separate arguments: torch's argument parser takes them ~0.4 µs faster than a tuple
    return (
        torch.empty(*shape, dtype=getattr(torch, dtype))
        if shape
        else torch.empty((), dtype=getattr(torch, dtype))
    )


def cuda_runner(cg: CompiledUGraph, device: torch.device) -> KernelRunner | None:
    """The prepared CUDA launch sequence of ``cg`` on ``device`` (built once per µGraph and device, then kept);
    None when the µGraph returns an input or a view, which the general run serves."""
    key = (id(cg), device)
    entry = _RUNNERS.get(key)
    if entry is None:
        built = kernels_for(cg, device)
        try:
            runner: KernelRunner | None = KernelRunner(built, "cuda", device.index or 0)
        except UnsupportedOpError:
            runner = None
        # holds cg: its identity is not reused while the entry lives
        entry = _RUNNERS[key] = (cg, runner, _generation(built))
    elif entry[1] is not None and (gen := _generation(kernels_for(cg, device))) != entry[2]:
        # the dispatcher's CUDA first tier (generic kernels) was replaced by the length's own kernels
        entry[1].relink(kernels_for(cg, device).executable("cuda"))
        entry = _RUNNERS[key] = (cg, entry[1], gen)
    return entry[1]


def _generation(built: CompiledUGraph) -> int:
    """Which functions ``built``'s CUDA executable serves now (:class:`~gensorage.codegen.symbolic_kernels.
    BoundExecutable` counts its swaps; a plain Executable never changes)."""
    return int(getattr(built.executable("cuda"), "generation", 0))


def run_on_device(
    res: ShapeKernels, args: Sequence[torch.Tensor], kept: KeptInputs | None = None
) -> list[torch.Tensor]:
    """The kernels of ``res`` on ``args`` (all on one device), outputs as torch tensors on that device.

    CPU tensors take the prepared launch sequence (:class:`~gensorage.codegen.runner.KernelRunner`) where the
    µGraph has one, with the inputs at ``kept``'s positions imported once (:class:`KeptInputs`); everything else
    runs the device's build of the kernels.
    """
    if res.runner is not None and args[0].is_cpu:  # the llvm build's (is_cpu: no device object made)
        # each argument imported as it is, copied (aligned) only where TVM refuses it: most are contiguous and
        # aligned, and checking that first in Python costs ~0.35 µs an argument
        return res.runner(args if kept is None else kept.arguments(args), _empty, aligned)
    device = args[0].device
    target = build_for(device)
    runner = cuda_runner(res.compiled, device) if target == "cuda" else None
    with torch.cuda.device(device) if device.type == "cuda" else nullcontext(), _stream(device):
        if runner is not None:
            return list(runner([aligned(a) for a in args], partial(_empty_on, device)))
        cg = kernels_for(res.compiled, device)
        outs = cg.run_tensors([kernel_input(a) for a in args], target)
        # copies owned by torch, made while TVM's tensors are alive (see the module docstring)
        return [torch.from_dlpack(o).clone() for o in outs]


def _empty_on(device: torch.device, shape: tuple[int, ...], dtype: str) -> torch.Tensor:
    return torch.empty(shape, dtype=getattr(torch, dtype), device=device)


__all__ = [
    "ALIGNMENT",
    "BUILDS",
    "KeptInputs",
    "aligned",
    "build_for",
    "cuda_arch",
    "cuda_kernels",
    "cuda_runner",
    "kernel_input",
    "kernels_for",
    "profile_for",
    "run_on_device",
]

"""Check a thread-bound TIR module against a GPU's per-block limits before anything is built.

``tvm.compile`` does not check GPU limits (a 2048-thread block compiles to CUDA that fails only at launch), so
the scheduled module is lowered through the same passes MetaSchedule's ``VerifyGPUCode`` postproc runs (up to
virtual-thread injection and shared-memory merging) and handed to ``tvm.s_tir.analysis.verify_gpu_code``.
The MetaSchedule postproc itself is not used because initialising its tuning context takes ~20 s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gensorage.codegen.tir_walk import walk
from gensorage.errors import ScheduleError

if TYPE_CHECKING:
    import tvm

    from gensorage.hw.profile import HwProfile

# Widest single vector access the CUDA code generator may emit (16 bytes = float4).
MAX_VECTOR_BYTES = 16
# Static ``__shared__`` arrays are limited to 48 KiB per block by CUDA; past that a kernel uses dynamic shared
# memory (TVM's "shared.dyn" scope, whose launch raises the per-kernel limit up to the opt-in maximum).
STATIC_SHARED_LIMIT = 48 * 1024
# The most shared memory a pipelined graph-defined kernel may plan for its tiles before it falls back to one
# stage (gensorage.codegen.block_buffers): the largest opt-in per-block maximum of any CUDA GPU (227 KiB, cc 9.0).
# The construction (gensorage.construction.pipeline_stages) checks the profile's own limit before it asks.
STAGED_SHARED_LIMIT = 227 * 1024
# CUDA's per-dimension block limits (x, y, z) on every architecture since Kepler.
MAX_THREAD_DIMS = (1024, 1024, 64)
# CUDA's grid limits per dimension (x, y, z): blocks a kernel launch may have along each.
MAX_GRID = (2**31 - 1, 65535, 65535)


@dataclass(frozen=True, slots=True)
class BlockResources:
    """What one thread block of a lowered kernel uses."""

    threads: int
    shared_bytes: int
    local_bytes_per_thread: int


def block_resources(mod: tvm.IRModule) -> BlockResources:
    """Threads per block and shared/local bytes of the (single-kernel) scheduled module."""
    return _resources(_lower_for_verification(mod))


def _resources(lowered: tvm.IRModule) -> BlockResources:
    """:func:`block_resources` of a module already lowered for verification."""
    threads = 1
    for func in lowered.functions.values():
        threads = max(threads, _thread_count(func))
    shared = local = 0
    from tvm import s_tir

    for per_func in s_tir.analysis.calculate_allocated_bytes(lowered).values():
        shared = max(shared, sum(int(v) for k, v in per_func.items() if str(k).startswith("shared")))
        local = max(local, sum(int(v) for k, v in per_func.items() if str(k) == "local"))
    return BlockResources(threads=threads, shared_bytes=shared, local_bytes_per_thread=local)


def verify_gpu_limits(mod: tvm.IRModule, hw: HwProfile) -> BlockResources:
    """Raise :class:`ScheduleError` if ``mod`` exceeds ``hw``'s per-block limits; return its resources.

    Checked: threads per block, shared memory per block (the opt-in maximum), per-dimension thread extents
    and vector width, via TVM's ``verify_gpu_code`` on the lowered module; the message names the first
    limit exceeded.
    """
    from tvm import s_tir

    lowered = _lower_for_verification(mod)  # once: the resources and TVM's check read the same lowering
    res = _resources(lowered)
    check_block(res, hw)
    constraints = {
        "max_threads_per_block": hw.max_threads_per_block,
        "max_shared_memory_per_block": hw.shared_mem_per_block,
        "max_thread_x": MAX_THREAD_DIMS[0],
        "max_thread_y": MAX_THREAD_DIMS[1],
        "max_thread_z": MAX_THREAD_DIMS[2],
        "max_vector_bytes": MAX_VECTOR_BYTES,
    }
    for gv, func in lowered.functions.items():
        if not s_tir.analysis.verify_gpu_code(func, constraints):
            raise ScheduleError(
                f"kernel {gv.name_hint} violates {hw.name}'s GPU limits "
                f"(threads, shared memory or vector width)"
            )
    return res


def check_block(res: BlockResources, hw: HwProfile) -> None:
    """Raise :class:`ScheduleError` naming the first of ``hw``'s per-block limits ``res`` exceeds: threads, then
    shared memory (the opt-in maximum). Registers never stop a launch: TVM's kernels declare
    ``__launch_bounds__(threads)``, so nvcc fits a block's registers in the SM's file and spills the rest."""
    if res.threads > hw.max_threads_per_block:
        raise ScheduleError(
            f"{res.threads} threads per block exceed {hw.name}'s limit of {hw.max_threads_per_block}"
        )
    if res.shared_bytes > hw.shared_mem_per_block:
        raise ScheduleError(
            f"{res.shared_bytes} bytes of shared memory per block exceed {hw.name}'s limit of "
            f"{hw.shared_mem_per_block}"
        )


def _lower_for_verification(mod: tvm.IRModule) -> tvm.IRModule:
    import tvm
    from tvm import s_tir, tirx

    passes = [
        s_tir.transform.LowerCrossThreadReduction(),
        s_tir.transform.LowerInitBlock(),
        s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
        s_tir.transform.ConvertBlocksToOpaque(),
        s_tir.transform.ManifestSharedMemoryLocalStage(),
        s_tir.transform.CompactBufferAllocation(),
        s_tir.transform.LowerAutoCopy(),
        s_tir.transform.UnifyThreadBinding(),
        s_tir.transform.LowerMatchBuffer(),
        s_tir.transform.StmtSimplify(),
        s_tir.transform.LowerOpaqueBlock(),
        tirx.transform.FlattenBuffer(),
        tirx.transform.NarrowDataType(32),
        tirx.transform.StmtSimplify(),
        tirx.transform.VectorizeLoop(True),
        s_tir.transform.InjectVirtualThread(),
        tirx.transform.StorageRewrite(),
        s_tir.transform.MergeSharedMemoryAllocations(),
    ]
    try:
        return tvm.ir.transform.Sequential(passes)(mod)
    except Exception as exc:
        raise ScheduleError(
            f"cannot lower the scheduled module for verification: {exc}".splitlines()[0]
        ) from exc


def _thread_count(func: Any) -> int:
    """Product of the distinct threadIdx extents bound in ``func``."""
    from tvm import tirx

    extents: dict[str, int] = {}
    for node in walk(func.body):
        if isinstance(node, tirx.AttrStmt) and node.attr_key == "thread_extent":
            tag = node.node.thread_tag
            if tag.startswith("threadIdx") and isinstance(node.value, tirx.IntImm):
                extents[tag] = max(extents.get(tag, 1), int(node.value))
    n = 1
    for e in extents.values():
        n *= e
    return n

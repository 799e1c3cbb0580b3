"""Building kernels whose shared-memory barriers are all explicit (dynamic shared memory).

TVM's ``ThreadSync("shared.dyn")`` pass treats every dynamic shared buffer of a kernel as one buffer, because
the later ``MergeSharedMemoryAllocations`` pass may place buffers with disjoint live ranges at the same
address without adding barriers. For the emitted µGraph kernels that makes every phase look like a
read-after-write on one buffer, and TVM then wants a barrier inside the phase's guarded (``if``) code, which it
refuses ("Cannot insert syncs inside condition").

Kernels emitted with dynamic shared memory therefore hand TVM one allocation (an arena whose tiles the memory
plan of :mod:`gensorage.ugraph.optimize.memory_plan` places, so the merge pass has nothing to move), place
every barrier they need themselves (before a phase that reads bytes written since the last barrier or writes
bytes read or written since then, tiles sharing bytes included; within a phase no thread reads what another
thread of the same phase writes) and carry the function attribute :data:`EXPLICIT_BARRIERS`. While :func:`explicit_barriers` is active, TVM's ``ThreadSync("shared.dyn")`` skips
functions with that attribute and runs unchanged on every other function (e.g. the scheduled matmuls of
:mod:`gensorage.codegen.lower_schedule`, which rely on it).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: PrimFunc attribute of kernels that place every barrier they need themselves.
EXPLICIT_BARRIERS = "gensorage.explicit_barriers"


def _selective(original: Any) -> Any:
    import tvm
    from tvm.tirx.transform import prim_func_pass

    def thread_sync(storage_scope: str) -> Any:
        inner = original(storage_scope)
        if storage_scope != "shared.dyn":
            return inner

        @prim_func_pass(opt_level=0, name="gensorage.ThreadSyncUnlessExplicit")
        def unless_explicit(func: Any, mod: Any, ctx: Any) -> Any:
            if func.attrs is not None and EXPLICIT_BARRIERS in func.attrs:
                return func
            return inner(tvm.IRModule({"main": func}))["main"]

        return unless_explicit

    return thread_sync


@contextmanager
def explicit_barriers() -> Iterator[None]:
    """Within the block, ``tvm.compile`` leaves functions marked :data:`EXPLICIT_BARRIERS` to their own barriers."""
    from tvm.s_tir import transform

    original = transform.ThreadSync
    transform.ThreadSync = _selective(original)
    try:
        yield
    finally:
        transform.ThreadSync = original


def has_explicit_barriers(func: Any) -> bool:
    return func.attrs is not None and EXPLICIT_BARRIERS in func.attrs


__all__ = ["EXPLICIT_BARRIERS", "explicit_barriers", "has_explicit_barriers"]

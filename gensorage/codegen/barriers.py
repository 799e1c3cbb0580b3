"""Building kernels whose shared-memory barriers are all explicit (every graph-defined kernel).

TVM's ``ThreadSync("shared.dyn")`` pass treats every dynamic shared buffer of a kernel as one buffer, because
the later ``MergeSharedMemoryAllocations`` pass may place buffers with disjoint live ranges at the same
address without adding barriers. For the emitted µGraph kernels that makes every phase look like a
read-after-write on one buffer, and TVM then wants a barrier inside the phase's guarded (``if``) code, which it
refuses ("Cannot insert syncs inside condition").

Static ``__shared__`` arrays fare no better: ``ThreadSync("shared")`` wants a barrier inside a phase guarded by
its warp (a tensor-core matmul on some of the block's warps, :mod:`gensorage.codegen.mma_threads`) and refuses
the same way.

Kernels emitted with dynamic shared memory therefore hand TVM one allocation (an arena whose tiles the memory
plan of :mod:`gensorage.ugraph.optimize.memory_plan` places, so the merge pass has nothing to move). Every
graph-defined kernel places every barrier it needs itself (before a phase that reads bytes written since the
last barrier or writes bytes read or written since then, tiles sharing bytes included; within a phase no thread
reads what another thread of the same phase writes) and carries the function attribute
:data:`EXPLICIT_BARRIERS`. Once :func:`honour_explicit_barriers` has run (it runs when such a kernel is parsed,
and before a launch table or a bundle's cubin is built from one), TVM's ``ThreadSync`` of shared memory (static
and dynamic) skips functions with that attribute and runs unchanged on every other function (e.g. the scheduled
matmuls of :mod:`gensorage.codegen.lower_schedule`, which rely on it). The mark is honoured by every build of the
process, whoever calls TVM. (Honouring it only inside a context around one build call left the other paths with
TVM's pass, which refused the marked kernels.) Since TVM no longer checks these kernels,
:func:`divergent_barriers` does: no barrier under an ``if`` or inside a thread loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: PrimFunc attribute of kernels that place every barrier they need themselves.
EXPLICIT_BARRIERS = "gensorage.explicit_barriers"


def _selective(original: Any) -> Any:
    import tvm
    from tvm.tirx.transform import prim_func_pass

    def thread_sync(storage_scope: str) -> Any:
        inner = original(storage_scope)
        if storage_scope not in ("shared", "shared.dyn"):
            return inner

        @prim_func_pass(opt_level=0, name="gensorage.ThreadSyncUnlessExplicit")
        def unless_explicit(func: Any, mod: Any, ctx: Any) -> Any:
            if has_explicit_barriers(func):
                return func
            return inner(tvm.IRModule({"main": func}))["main"]

        return unless_explicit

    return thread_sync


#: Attribute of the installed wrapper, so that installing it twice wraps TVM's pass once.
_INSTALLED = "gensorage_explicit_barriers"


def honour_explicit_barriers() -> None:
    """From now on, TVM's ``ThreadSync("shared.dyn")`` leaves functions marked :data:`EXPLICIT_BARRIERS` to their
    own barriers (idempotent; every other function gets TVM's pass unchanged, so every build may see it)."""
    from tvm.s_tir import transform

    if getattr(transform.ThreadSync, _INSTALLED, False):
        return
    selective = _selective(transform.ThreadSync)
    setattr(selective, _INSTALLED, True)
    transform.ThreadSync = selective


def has_explicit_barriers(func: Any) -> bool:
    return func.attrs is not None and EXPLICIT_BARRIERS in func.attrs


def divergent_barriers(func: Any) -> int:
    """How many barriers of ``func`` sit where the threads of a block may not all reach them: under an ``if`` or
    inside a ``threadIdx`` loop (conservative: an ``if`` every thread takes alike counts too).

    TVM's barrier pass refuses such a barrier ("Cannot insert syncs inside condition"), and on the GPU one is a
    deadlock or undefined behaviour; a kernel that places its own barriers, which TVM then does not check, is
    checked with this instead.
    """
    from gensorage.codegen.tir_walk import child_statements

    count = 0
    stack: list[tuple[Any, bool]] = [(func.body, False)]
    while stack:
        node, divergent = stack.pop()
        kind = type(node).__name__
        if (
            kind == "Evaluate"
            and getattr(getattr(node.value, "op", None), "name", "") == "tirx.tvm_storage_sync"
        ):
            count += divergent
        binding = getattr(node, "thread_binding", None) if kind == "For" else None
        divergent = (
            divergent
            or kind == "IfThenElse"
            or (binding is not None and binding.thread_tag.startswith("threadIdx"))
        )
        stack.extend((child, divergent) for child in child_statements(node))
    return count


def tiles_clash(memory: Any, r: Any, others: set[Any]) -> bool:
    """Whether tile ``r`` shares a byte with any of ``others``: itself, or a neighbour in the arena laid out by
    ``memory`` (a :class:`~gensorage.ugraph.optimize.memory_plan.MemoryPlan`; None when tiles never share)."""
    if r in others:
        return True
    if memory is None:
        return False
    mine = memory.placement(r)
    return any(mine.shares_bytes(memory.placement(o)) for o in others)


class BarrierPlacement:
    """Where a graph-defined kernel needs barriers: the tiles the phase being emitted reads and writes, and
    those read and written since the last barrier.

    A phase needs a barrier before it exactly when it reads bytes written since the last barrier or writes bytes
    read or written since then (within a phase no thread reads what another writes). ``clash(r, others)`` says
    whether tile ``r`` shares a byte with any of ``others`` (itself, or a neighbour in a shared arena).
    """

    def __init__(self, clash: Callable[[Any, set[Any]], bool]) -> None:
        self.clash = clash
        self.reads: set[Any] = set()
        self.writes: set[Any] = set()
        self._pending_reads: set[Any] = set()
        self._pending_writes: set[Any] = set()

    def clear(self) -> None:
        """A barrier was placed: nothing is pending."""
        self._pending_reads, self._pending_writes = set(), set()

    def pending(self) -> bool:
        return bool(self._pending_reads or self._pending_writes)

    def begin(self) -> None:
        """A phase starts: its accesses are recorded into ``reads`` and ``writes``."""
        self.reads, self.writes = set(), set()

    def end(self) -> bool:
        """The phase ended: whether it needs a barrier before it (the pending accesses are then cleared)."""
        pending = self._pending_reads | self._pending_writes
        needed = any(self.clash(r, self._pending_writes) for r in self.reads) or any(
            self.clash(r, pending) for r in self.writes
        )
        if needed:
            self.clear()
        self._pending_reads |= self.reads
        self._pending_writes |= self.writes
        return needed


__all__ = [
    "EXPLICIT_BARRIERS",
    "BarrierPlacement",
    "honour_explicit_barriers",
    "tiles_clash",
    "divergent_barriers",
    "has_explicit_barriers",
]

"""Lower a construction schedule (ETIR tiles + virtual threads) to a scheduled TVM TIR module.

The workload's PrimFunc is scheduled with ``tvm.s_tir.Schedule`` in the classic multi-level tiling shape that
the Gensor cost model assumes:

* every spatial axis is split into ``[grid, vthread, threads, inner]`` with ``grid = ceil(extent / T1)``,
  ``vthread = vthreads[a]``, ``threads = ceil(T1 / T0)`` and ``inner = T0 / vthreads[a]``; the grid loops are
  fused and bound to ``blockIdx.x``, the vthread loops to ``vthread.x``, the thread loops (flattened) to
  ``threadIdx.x``;
* every reduction axis is split into ``[outer steps, ceil(T1 / T0), T0]``;
* each input is staged in shared memory once per outer reduction step (``cache_read`` + ``compute_at``) and
  fetched cooperatively by all threads of the block, vectorized where the access is provably aligned;
* the accumulator lives in registers (``cache_write`` "local" + ``reverse_compute_at`` at the thread loop);
* the inner reduction step and the register tile are unrolled.

Extents that the tiles do not divide are handled by TVM's predicated (imperfect) splits; when T0 does not
divide T1 the threads cover ceil(T1 / T0) * T0 elements and the excess is predicated off (the shared stage is
sized for that bounding box). A separate producer block of the main computation (a padding stage) becomes
the shared stage itself; producers further upstream are inlined into it. Elementwise consumers (a ReLU, a
scale) are folded into the register write-back. Padding written as a guarded load inside the main block (the
built-in conv2d / avgpool2d) is staged with ``cache_read``; where TVM's buffer compaction then gives up and
would keep the whole input in shared memory, the stage is indexed modulo its window (see
``_wrap_overallocated``).

The CPU variant (``target="llvm"``) runs the very same scheduling program with the thread and vthread
bindings left out: tiling, caches, ``compute_at`` and index arithmetic survive, so the numerics of the GPU
kernel's index math can be checked on a machine without a GPU. (Replaying the recorded trace minus its
``Bind`` instructions is not robust: without bindings ``compute_at`` may create a different number of loops,
and the replay of ``GetLoops`` then fails.) What the CPU run cannot check is races and barriers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gensorage.codegen.gpu_limits import MAX_VECTOR_BYTES, STATIC_SHARED_LIMIT
from gensorage.dtypes import dtype_bytes
from gensorage.errors import ProgramError, ScheduleError, first_line

if TYPE_CHECKING:
    import tvm

    from gensorage.hw.profile import HwProfile
    from gensorage.markov.schedule import Schedule
    from gensorage.workloads.workload import Workload

_CPU_TARGETS = ("llvm", "cpu")


@dataclass(frozen=True, slots=True)
class AxisTiling:
    """How one axis of the main block is split (derived from a :class:`Schedule`)."""

    name: str
    extent: int
    kind: str  # "spatial" | "reduce"
    block_tile: int  # T1
    thread_tile: int  # T0
    vthreads: int

    @property
    def threads(self) -> int:
        """Threads (spatial) or register steps (reduction) per block tile: ceil(T1 / T0)."""
        return -(-self.block_tile // self.thread_tile)

    @property
    def covered(self) -> int:
        """Elements of this axis one block covers: spatial ceil(T1 / T0) * T0, reduction T1 per step.

        The construction space allows a spatial T0 that does not divide T1. A block then covers its threads'
        whole register tiles, ceil(T1 / T0) * T0 elements, rather than exactly T1: masking the excess would
        need a predicate on the register write-back, which ``reverse_compute_at`` does not carry over, so the
        excess rows would be written by two blocks (a race that an H100 run exposed as zeros in the output).
        """
        return self.threads * self.thread_tile if self.kind == "spatial" else self.block_tile

    @property
    def inner_factors(self) -> list[int]:
        """Split of :attr:`covered`: spatial [vthread, threads, T0 / vthread], reduction [steps, T0].

        For a reduction whose T0 does not divide T1, TVM's predicate masks the excess of the last step.
        """
        if self.kind == "spatial":
            return [self.vthreads, self.threads, self.thread_tile // self.vthreads]
        return [self.threads, self.thread_tile]


def axis_tilings(workload: Workload, schedule: Schedule) -> tuple[AxisTiling, ...]:
    """Check ``schedule`` against ``workload`` and return the per-axis tiling, in workload axis order.

    Raises :class:`ScheduleError` when the schedule names other axes, has the wrong outermost extents, or
    tiles that do not nest (T0 <= T1, the vthread count must divide T0).
    """
    names = tuple(a.name for a in workload.axes)
    if tuple(schedule.axes) != names:
        raise ScheduleError(f"schedule axes {list(schedule.axes)} do not match workload axes {list(names)}")
    if len(schedule.tiles) < 2:
        raise ScheduleError(
            f"schedule needs at least 2 tile levels (registers and extent), got {len(schedule.tiles)}"
        )
    if any(len(t) != len(names) for t in schedule.tiles) or len(schedule.vthreads) != len(names):
        raise ScheduleError("schedule tiles/vthreads do not have one entry per axis")
    out = []
    for i, ax in enumerate(workload.axes):
        t0, t1, top = schedule.tiles[0][i], schedule.tiles[1][i], schedule.tiles[-1][i]
        v = schedule.vthreads[i]
        if min(t0, t1, v) < 1:
            raise ScheduleError(
                f"axis {ax.name}: tiles and vthreads must be positive (T0={t0}, T1={t1}, v={v})"
            )
        if top != ax.extent:
            raise ScheduleError(f"axis {ax.name}: outermost tile {top} != extent {ax.extent}")
        if t0 > t1:
            raise ScheduleError(f"axis {ax.name}: register tile T0={t0} exceeds block tile T1={t1}")
        if ax.kind == "spatial" and t0 % v:
            raise ScheduleError(f"axis {ax.name}: vthreads={v} do not divide register tile T0={t0}")
        if ax.kind == "reduce" and v != 1:
            raise ScheduleError(f"axis {ax.name}: reduction axes cannot have vthreads (got {v})")
        out.append(AxisTiling(ax.name, ax.extent, ax.kind, t1, t0, v))
    return tuple(out)


def threads_per_block(workload: Workload, schedule: Schedule) -> int:
    """Number of (physical) threads of one block: the product of ceil(T1/T0) over spatial axes."""
    return int(
        np.prod([t.threads for t in axis_tilings(workload, schedule) if t.kind == "spatial"], dtype=np.int64)
    )


def lower(
    workload: Workload, schedule: Schedule, target: str = "cuda", *, hw: HwProfile | None = None
) -> tvm.IRModule:
    """Apply ``schedule`` to ``workload.build()`` and return the scheduled module.

    Parameters
    ----------
    workload
        The operator; its PrimFunc must have one main block (the reduction, or the output block of a purely
        elementwise computation) plus producers/consumers that can be inlined.
    schedule
        The construction schedule (see :mod:`gensorage.markov.schedule` for the level convention).
    target
        ``"cuda"`` for the thread-bound GPU schedule, ``"llvm"`` (or ``"cpu"``) for the same trace without
        thread bindings, runnable on the CPU.
    hw
        When given with ``target="cuda"``, the module is also checked against the profile's limits
        (:func:`gensorage.codegen.gpu_limits.verify_gpu_limits`).

    Returns
    -------
    tvm.IRModule
        The scheduled module (function ``"main"``).

    Raises
    ------
    ScheduleError
        The schedule does not fit the workload or the hardware, or TVM rejects a scheduling step.
    """
    if target not in ("cuda", *_CPU_TARGETS):
        raise ScheduleError(f"unknown lowering target {target!r} (expected 'cuda' or 'llvm')")
    gpu = target == "cuda"
    mod = _schedule(workload, schedule, gpu=gpu).mod
    if gpu and hw is not None:
        from gensorage.codegen.gpu_limits import verify_gpu_limits

        verify_gpu_limits(mod, hw)
    return mod


def run_cpu(workload: Workload, schedule: Schedule, *arrays: np.ndarray) -> np.ndarray:
    """Compile the llvm variant of ``schedule`` and run it on the given inputs; returns the output array."""
    import tvm

    inputs = check_inputs(workload, arrays)
    ex = compile_cpu(workload, schedule)
    dev = tvm.cpu(0)
    out = workload.output
    args = [tvm.runtime.tensor(a, device=dev) for a in inputs]
    result = tvm.runtime.empty(out.shape, out.dtype, dev)
    ex["main"](*args, result)
    return np.asarray(result.numpy())


def compile_cpu(workload: Workload, schedule: Schedule) -> Any:
    """``tvm.compile`` of the llvm variant (an Executable with a ``"main"`` function)."""
    import tvm

    mod = lower(workload, schedule, "llvm")
    try:
        return tvm.compile(mod, target="llvm")
    except Exception as exc:  # TVM raises its own error classes; one line is enough for the user
        raise ScheduleError(f"llvm build of {workload.name} failed: {first_line(exc)}") from exc


def check_inputs(workload: Workload, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Check count, shape and dtype of the input arrays against the workload (converting dtype if safe)."""
    specs = workload.inputs
    if len(arrays) != len(specs):
        raise ProgramError(
            f"{workload.name} takes {len(specs)} inputs "
            f"({', '.join(s.tensor for s in specs)}), got {len(arrays)}"
        )
    out = []
    for spec, arr in zip(specs, arrays, strict=True):
        a = np.asarray(arr)
        if tuple(a.shape) != tuple(spec.shape):
            raise ProgramError(f"input {spec.tensor}: shape {tuple(a.shape)} != expected {tuple(spec.shape)}")
        out.append(np.ascontiguousarray(a, dtype=spec.dtype))
    return out


# ---------------------------------------------------------------------------------------------------------
# The schedule
# ---------------------------------------------------------------------------------------------------------


def _schedule(workload: Workload, schedule: Schedule, *, gpu: bool) -> Any:
    """The scheduling program. With ``gpu=False`` the same steps run without thread/vthread bindings
    (and without vectorizing the cooperative fetch, a codegen detail that does not change the index math)."""
    from tvm import s_tir

    tilings = axis_tilings(workload, schedule)
    func = workload.build()
    sch = s_tir.Schedule(func)
    try:
        main = _inline_producers_and_find_main(sch)
        _apply_tiling(sch, main, tilings, gpu=gpu)
    except (RuntimeError, ValueError) as exc:  # TVM's ScheduleError / TVMError: the nest rejects a step
        raise ScheduleError(f"cannot lower schedule for {workload.name}: {first_line(exc)}") from exc
    return sch


def _blocks(sch: Any) -> list[Any]:
    root = sch.get_sblock("root")
    return list(sch.get_child_blocks(root))


def _has_init(sch: Any, block: Any) -> bool:
    return sch.get(block).init is not None


def _inline_producers_and_find_main(sch: Any) -> Any:
    """Inline the producers of the main block that will not be staged, and return the main block.

    The main block is the (single) reduction block; for a computation without a reduction it is the block
    that writes the output. The direct producers of a reduction (e.g. the padding of a convolution) are kept:
    they become the shared-memory stage, computing exactly the padded tile each step needs. Everything
    further upstream is inlined into them.
    """
    blocks = _blocks(sch)
    reductions = [b for b in blocks if _has_init(sch, b)]
    if len(reductions) > 1:
        raise ScheduleError(f"workload has {len(reductions)} reduction blocks; one main computation expected")
    main_name = sch.get(reductions[0]).name_hint if reductions else sch.get(blocks[-1]).name_hint
    keep = {sch.get(p).name_hint for p in sch.get_producers(main_name)} if reductions else set()
    for b in blocks:
        name = sch.get(b).name_hint
        if name == main_name or name in keep or not _is_upstream(sch, b, main_name):
            continue
        try:
            sch.compute_inline(b)
        except (RuntimeError, ValueError) as exc:
            raise ScheduleError(
                f"producer block {name!r} cannot be inlined into {main_name!r}: {first_line(exc)}"
            ) from exc
    return sch.get_sblock(main_name)


def _shared_stages(sch: Any, main: Any) -> list[tuple[Any, bool]]:
    """One shared-memory stage per input of the main block: ``(block, is_plain_copy)``.

    An input produced inside the function (padding) is staged by computing its producer into shared memory;
    an input read straight from a parameter is staged with ``cache_read``.
    """
    producers = {}
    for p in sch.get_producers(main):
        producers[sch.get(p).writes[0].source] = p
    stages = []
    reads = [r.source for r in sch.get(main).reads]
    for i, buf in enumerate(reads):
        prod = next((p for b, p in producers.items() if b.same_as(buf)), None)
        if prod is not None:
            stages.append((prod, False))
        else:
            stages.append((sch.cache_read(main, i, "shared"), True))
    return stages


def _is_upstream(sch: Any, block: Any, main_name: str) -> bool:
    """Whether ``block`` (transitively) feeds the main block."""
    seen: set[str] = set()
    frontier = [block]
    while frontier:
        b = frontier.pop()
        for c in sch.get_consumers(b):
            name = sch.get(c).name_hint
            if name == main_name:
                return True
            if name not in seen:
                seen.add(name)
                frontier.append(c)
    return False


def _loop_axes(sch: Any, main: Any, tilings: Sequence[AxisTiling]) -> list[AxisTiling]:
    """The tiling of each loop of the main block, outermost first (matching by iteration variable name)."""
    from tvm import s_tir, tirx

    loops = sch.get_loops(main)
    realize = _realize(sch, main)
    if not loops or not isinstance(sch.get(loops[-1]).body, s_tir.SBlockRealize):
        raise ScheduleError("main block is not directly nested in its loops")
    block = realize.block
    loop_vars = [sch.get(lp).loop_var for lp in loops]
    if len(loops) != len(block.iter_vars):
        raise ScheduleError(f"main block has {len(block.iter_vars)} iterators but {len(loops)} loops")
    by_name = {t.name: t for t in tilings}
    remaining = {"spatial": [t for t in tilings], "reduce": [t for t in tilings]}
    out: list[AxisTiling | None] = [None] * len(loops)
    for iv, value in zip(block.iter_vars, realize.iter_values, strict=True):
        if not any(value.same_as(v) for v in loop_vars):
            raise ScheduleError(f"iterator {iv.var.name} of the main block is not a plain loop variable")
        pos = next(i for i, v in enumerate(loop_vars) if value.same_as(v))
        kind = "reduce" if int(iv.iter_type) == 2 else "spatial"
        name = iv.var.name[2:] if iv.var.name.startswith("v_") else iv.var.name
        tiling = by_name.get(name)
        if tiling is None or tiling.kind != kind:
            # Names differ (e.g. a user PrimFunc): fall back to the next axis of the same kind, in order.
            tiling = next((t for t in remaining[kind] if t.kind == kind), None)
        # a variable where the caller built the workload symbolic in it (predefined_matmul)
        ext = iv.dom.extent
        if tiling is None or tiling.extent != (int(ext) if isinstance(ext, tirx.IntImm) else tiling.extent):
            if not (isinstance(ext, tirx.IntImm) and int(ext) == 1):
                raise ScheduleError(f"iterator {iv.var.name} (extent {ext}) matches no workload axis")
            tiling = AxisTiling(iv.var.name, 1, kind, 1, 1, 1)  # a batch of one a gemm workload leaves out
        for lst in remaining.values():
            if tiling in lst:
                lst.remove(tiling)
        out[pos] = tiling
    if any(t is None for t in out) or len({t.name for t in out if t and t in tilings}) != len(tilings):
        raise ScheduleError("main block loops do not map one-to-one onto the workload axes")
    return [t for t in out if t is not None]


def _apply_tiling(sch: Any, main: Any, tilings: Sequence[AxisTiling], *, gpu: bool) -> None:
    loop_axes = _loop_axes(sch, main, tilings)
    loops = sch.get_loops(main)
    spatial: list[list[Any]] = []
    reduce: list[list[Any]] = []
    for loop, t in zip(loops, loop_axes, strict=True):
        outer, tile = sch.split(loop, [None, t.covered])
        parts = [outer, *sch.split(tile, t.inner_factors)]
        (spatial if t.kind == "spatial" else reduce).append(parts)
    grid = [p[0] for p in spatial]
    vthr = [p[1] for p in spatial]
    thr = [p[2] for p in spatial]
    inner_s = [p[3] for p in spatial]
    outer_r = [p[0] for p in reduce]
    mid_r = [p[1] for p in reduce]
    inner_r = [p[2] for p in reduce]
    # Reduction steps outside the register tile: per k, the thread does an outer product of its fragments.
    sch.reorder(*grid, *vthr, *thr, *outer_r, *mid_r, *inner_r, *inner_s)
    bx = sch.fuse(*grid)
    vt = sch.fuse(*vthr)
    tx = sch.fuse(*thr)
    if gpu:
        sch.bind(bx, "blockIdx.x")
        if _extent(sch, vt) > 1:
            sch.bind(vt, "vthread.x")
        sch.bind(tx, "threadIdx.x")
    nthreads = _extent(sch, tx)
    if not reduce:
        for lp in inner_s:
            sch.unroll(lp)
        return
    write = sch.cache_write(main, 0, "local")
    sch.reverse_compute_at(write, tx)
    _inline_consumers(sch, write)
    at = outer_r[-1]
    depth = 1 + next(i for i, lp in enumerate(sch.get_loops(main)) if sch.get(lp).same_as(sch.get(at)))
    stages = _shared_stages(sch, main)
    for c, _ in stages:
        # The scope must be shared *before* compute_at: only then is the stage's region relaxed over the
        # thread-bound loops, i.e. sized for the whole block instead of one thread.
        sch.set_scope(c, 0, "shared")
        sch.compute_at(c, at)
        if gpu:
            _check_block_wide(sch, c, [tx, vt])
    caches = [c for c, _ in stages]
    windows = [_window(sch, c, depth) for c in caches]
    wrapped = _wrap_overallocated(sch, caches, windows, [False] * len(caches))
    if gpu and _shared_bytes(sch, caches, windows) > STATIC_SHARED_LIMIT:
        for c in caches:
            sch.set_scope(c, 0, "shared.dyn")
    vectorized = [
        _cooperative_fetch(sch, c, depth, nthreads, vectorize=plain and gpu and not wrap, bind=gpu)
        for (c, plain), wrap in zip(stages, wrapped, strict=True)
    ]
    for lp in (*inner_r, *inner_s):
        sch.unroll(lp)
    sch.decompose_reduction(main, outer_r[0])
    # The later steps add predicates that can defeat TVM's compaction again, also in a dim of a stage wrapped
    # above (its wrapped dims now have their window's extent and are left alone); re-check the final module.
    # Vectorized stages are left as they are: a modulo index would break their aligned vector copies.
    _wrap_overallocated(sch, caches, windows, [v > 1 for v in vectorized])


def _realize(sch: Any, block: Any) -> Any:
    """The SBlockRealize of ``block`` (its iteration bindings and predicate)."""
    from tvm import s_tir

    from gensorage.codegen.tir_walk import walk

    loops = sch.get_loops(block)
    scope = sch.get(loops[-1]) if loops else sch.get(sch.get_sblock("root"))
    target = sch.get(block)
    for node in walk(scope.body):
        if isinstance(node, s_tir.SBlockRealize) and node.block.same_as(target):
            return node
    raise ScheduleError(f"block {target.name_hint!r} not found under its loops")


def _extent(sch: Any, loop: Any) -> int:
    return int(sch.get(loop).extent)


def _inline_consumers(sch: Any, write: Any) -> None:
    """Fold elementwise epilogues (pool division, activation) into the register write-back."""
    while True:
        consumers = list(sch.get_consumers(write))
        if not consumers:
            return
        for c in consumers:
            name = sch.get(c).name_hint
            try:
                sch.reverse_compute_inline(c)
            except Exception as exc:
                raise ScheduleError(
                    f"consumer block {name!r} cannot be inlined into the write-back: {first_line(exc)}"
                ) from exc


def _check_block_wide(sch: Any, stage: Any, thread_loops: Sequence[Any]) -> None:
    """A shared stage must cover the block's tile: its indices may not depend on thread or vthread ids."""
    from tvm.tirx.analysis import undefined_vars

    realize = _realize(sch, stage)
    used = {v.name for e in realize.iter_values for v in undefined_vars(e)}
    for lp in thread_loops:
        name = sch.get(lp).loop_var.name
        if name in used:
            raise ScheduleError(f"shared stage {sch.get(stage).name_hint!r} depends on thread loop {name!r}")


def _cache_loops(sch: Any, cache: Any, depth: int) -> list[Any]:
    """The loops compute_at created around a cache block, below the ``depth`` loops it shares with main."""
    return list(sch.get_loops(cache))[depth:]


def _wrap_overallocated(
    sch: Any, stages: Sequence[Any], windows: Sequence[list[int]], skip: Sequence[bool]
) -> list[bool]:
    """Make each shared stage's allocation exactly its per-step window; returns which stages were wrapped.

    TVM sizes a stage's buffer by ``CompactBufferAllocation``, which gives up (keeps the whole input
    dimension) when the stage's clamped writes and the consumer's guarded reads meet on a strided index, as
    in a padded or edge-predicated convolution. Such a dimension is wrapped: indexed modulo its window
    extent, which is injective within a window (each step writes and reads one window of consecutive
    indices), so the buffer shrinks to the window without changing what is computed.
    """
    from tvm import tirx

    allocated = _compacted_shapes(sch.mod)
    out = []
    for c, window, done in zip(stages, windows, skip, strict=True):
        shape = allocated.get(str(sch.get(c).writes[0].source.name))
        if (
            done
            or shape is None
            or len(shape) != len(window)
            or all(0 <= s <= w for s, w in zip(shape, window, strict=True))
        ):
            out.append(False)
            continue
        wrap = [not 0 <= s <= w for s, w in zip(shape, window, strict=True)]
        index_map = tirx.IndexMap.from_func(_wrapper(wrap, window), ndim=len(window), index_dtype="int32")
        sch.transform_layout(c, ("write", 0), index_map, assume_injective_transform=True)
        out.append(True)
    return out


def _wrapper(wrap: Sequence[bool], window: Sequence[int]) -> Any:
    from tvm import tirx

    def index_map(*idx: Any) -> list[Any]:
        return [tirx.floormod(i, w) if f else i for i, f, w in zip(idx, wrap, window, strict=True)]

    return index_map


def _window(sch: Any, stage: Any, depth: int) -> list[int]:
    """Per dimension of the stage's buffer, how many consecutive indices one step writes.

    compute_at creates one loop per non-unit dimension of the region; a dimension bound to no such loop
    has a window of one index.
    """
    from tvm.tirx.analysis import undefined_vars

    loops = _cache_loops(sch, stage, depth)
    extents = {sch.get(lp).loop_var.name: _extent(sch, lp) for lp in loops}
    realize = _realize(sch, stage)
    window = []
    for value in realize.iter_values:
        names = [v.name for v in undefined_vars(value) if v.name in extents]
        window.append(int(np.prod([extents[n] for n in names], dtype=np.int64)) if names else 1)
    return window


def _compacted_shapes(mod: Any) -> dict[str, tuple[int, ...]]:
    """Buffer shapes after TVM's own allocation planning and compaction (the build's first passes)."""
    import tvm
    from tvm import s_tir

    from gensorage.codegen.tir_walk import allocated_shapes

    passes = tvm.ir.transform.Sequential(
        [
            s_tir.transform.LowerCrossThreadReduction(),
            s_tir.transform.LowerInitBlock(),
            s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
            s_tir.transform.ConvertBlocksToOpaque(),
            s_tir.transform.CompactBufferAllocation(),
        ]
    )
    shapes: dict[str, tuple[int, ...]] = {}
    for func in passes(mod).functions.values():
        shapes.update(allocated_shapes(func))
    return shapes


def _shared_bytes(sch: Any, caches: Sequence[Any], windows: Sequence[list[int]]) -> int:
    total = 0
    for c, window in zip(caches, windows, strict=True):
        elems = int(np.prod(window, dtype=np.int64))
        total += elems * dtype_bytes(sch.get(c).writes[0].source.dtype)
    return total


def _cooperative_fetch(
    sch: Any, cache: Any, depth: int, nthreads: int, *, vectorize: bool, bind: bool
) -> int:
    """All threads of the block fill the stage: fuse its loops, split by threads (and a vector width).

    Returns the vector width used (1 when scalar)."""
    loops = _cache_loops(sch, cache, depth)
    if not loops:  # a one-element stage: give it a loop so one thread (not all) fills it
        loops = [sch.add_unit_loop(cache)]
    # A computed stage (padding) has a condition per element and an offset source index: keep it scalar.
    vec = _vector_width(sch, cache, loops, nthreads) if vectorize else 1
    fused = sch.fuse(*loops)
    if vec > 1:
        _, t, v = sch.split(fused, [None, nthreads, vec])
        sch.vectorize(v)
    else:
        _, t = sch.split(fused, [None, nthreads])
    if bind:
        sch.bind(t, "threadIdx.x")
    return vec


def _vector_width(sch: Any, cache: Any, loops: Sequence[Any], nthreads: int) -> int:
    """Widest vector copy that is provably legal: no predicate, aligned rows, whole vectors per thread."""
    from tvm import tirx
    from tvm.sym.analyzer import Analyzer

    if not loops:
        return 1
    realize = _realize(sch, cache)
    if not (isinstance(realize.predicate, tirx.IntImm) and int(realize.predicate) == 1):
        return 1  # imperfect tile or clamped region: lanes could fall out of bounds
    block = realize.block
    src = block.reads[0].source
    elem = dtype_bytes(src.dtype)
    last = _extent(sch, loops[-1])
    total = int(np.prod([_extent(sch, lp) for lp in loops], dtype=np.int64))
    row = int(src.shape[-1]) if isinstance(src.shape[-1], tirx.IntImm) else 1
    offset = realize.iter_values[-1] - sch.get(loops[-1]).loop_var
    ana = Analyzer()
    ms = ana.modular_set(ana.simplify(offset))
    vec = MAX_VECTOR_BYTES // elem
    while vec > 1:
        aligned = ms.coeff % vec == 0 and ms.base % vec == 0
        if last % vec == 0 and row % vec == 0 and total % (nthreads * vec) == 0 and aligned:
            return vec
        vec //= 2
    return 1

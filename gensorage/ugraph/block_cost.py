"""The cost of one graph-defined kernel as the code generator emits it (:mod:`gensorage.codegen.ugraph_tir`).

The kernel is planned as the generator plans it: its threads per block as
:func:`~gensorage.codegen.ugraph_tir.plan_threads` gives them (:func:`block_threads`), and an emitter is set up (nothing emitted) so that the
tensor-core warp layouts (:func:`~gensorage.codegen.block_mma.mma_tilings`), the thread graphs fused into a
matmul's phase and the accumulators kept in registers are the kernel's own. Times are SM cycles.

- **Occupancy.** Resident blocks per SM: the fewest that shared memory (the memory plan's footprint plus the
  runtime's reserve), threads, registers (accumulators, fragments and a base per thread) and the per-SM block
  limit allow. **Waves**: the grid in rounds of ``SMs x resident`` blocks; the last round runs fewer blocks.
- **Per loop iteration**, the time is the larger of one block's latency chain and the work of the resident
  blocks on the SM's shared pipes:

  - *tile loads*: element-wise ones keep ``block_load_flight_bytes`` in flight per thread, so a thread's ``b``
    bytes take ``ceil(b / flight)`` DRAM round trips (Little's law); ``cp.async`` copies are all in flight at
    once, one round trip per load phase; the SM's share of L2 bandwidth bounds the resident blocks' bytes; each
    load is also a shared-memory store. *Software pipelining* (``S`` stages of the loop's ``cp.async`` tiles,
    :mod:`gensorage.codegen.block_loads`): their copies leave the iteration's chain; issued ``S - 1`` iterations
    ahead, one round trip is hidden behind ``S - 1`` iterations of compute, so an iteration takes
    ``max(compute + block_stage_cycles, round trip / (S - 1))`` (the larger of copy and compute, instead of their
    sum), plus one round trip before the loop (the fill); the stages' bytes count in the shared footprint
    (occupancy);
  - *barriers*: one after each depth level of the body, one before the online-softmax phases, one at the end,
    those the memory plan needs between phases of one level (:mod:`gensorage.ugraph.level_fences`),
    ``block_barrier_cycles`` each;
  - *tensor-core matmuls* at the emitted warp layout: per 16-wide k chunk a warp loads its fragments element by
    element from shared memory (``8 warp_m + 4 warp_n`` loads, one wavefront each) and issues ``warp_m warp_n``
    MMAs of ``block_mma_cycles`` each on its sub-core; warps without a warp tile idle;
  - *the online P·V on tensor cores* (:mod:`gensorage.codegen.online_mma`), per warp tile: each lane's row
    maxima over a quarter of the keys (a serial chain), two shuffles and a broadcast, the rescale (an ``exp``
    per row), P's fragment elements (a shared read and an ``exp`` each, recomputed by every warp tile of the
    same rows), the value fragments as a block matmul loads them, and the MMAs;
  - *element-wise work* (element-wise block ops, reductions, thread graphs, CUDA-core matmuls, accumulator
    updates and the online-softmax rescale): per thread ``ceil(elements / threads)`` elements, each some
    operations of ``block_element_cycles`` issue cycles (address arithmetic included), one wavefront per shared
    read or write and two SFU cycles per warp for each ``exp``-like op; a reduction with fewer results than
    threads is priced as the code generator emits it (:mod:`gensorage.codegen.block_reduce`): ``lanes``
    threads per result, then its combining tree (warp shuffles and one or two barriers);
- **Epilogue:** the register flush, the post-loop phases and the stores of the outputs.

time = launch overhead + max(sum over waves of the wave's cycles / clock, DRAM bytes / DRAM bandwidth).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gensorage.dtypes import dtype_bytes
from gensorage.hw.profile import Calibration, HwProfile
from gensorage.markov.space import SHARED_RESERVED_PER_BLOCK
from gensorage.opset import BINARY_ELEMENTWISE, REDUCTIONS, UNARY_ELEMENTWISE, Op, attr
from gensorage.ugraph.ir import (
    ONLINE_SOFTMAX_KINDS,
    Accumulator,
    BlockOp,
    GraphDefinedOp,
    InputIterator,
    KernelGraph,
    OutputSaver,
    Ref,
    ThreadGraph,
)
from gensorage.ugraph.level_fences import level_fences
from gensorage.ugraph.optimize.phase_order import depths
from gensorage.ugraph.optimize.views import is_view
from gensorage.ugraph.shapes import BlockInfo, GraphInfo

if TYPE_CHECKING:
    from gensorage.codegen.block_emitter import BlockEmitter
    from gensorage.construction.block_threads import ThreadChoice

BASE_REGISTERS = 32  # registers a thread needs besides accumulators and fragments (indices, addresses, temps)
SUB_CORES = 4  # warp schedulers per SM (every architecture since Volta)
SFU_WARP_CYCLES = 2  # a warp's exp/sqrt on the SM's 16 special-function units: 32 lanes / 16 per cycle
WAVEFRONT = 1  # shared-memory cycles of one warp access without bank conflicts (the layouts avoid them)
# tanh: one exp and one division (its float64 series and selects are cheap next to them); log: one SFU op.
SPECIAL_OPS = frozenset({Op.EXP, Op.SQRT, Op.SILU, Op.GELU, Op.DIV, Op.TANH, Op.LOG})


@dataclass(frozen=True, slots=True)
class Work:
    """What phases cost one block, as counts the calibration prices (:meth:`cycles`)."""

    latency: float = 0.0  # cycles of one thread's chain besides its MMAs (register and shared latencies)
    chained_mmas: float = 0.0  # MMAs one warp issues one after another
    ops: float = 0.0  # warp instructions of element-wise work
    mmas: float = 0.0  # MMAs of the block
    shared: float = 0.0  # shared-memory wavefronts
    sfu: float = 0.0  # special-function cycles
    thread_bytes: float = 0.0  # bytes one thread loads from global memory element by element
    async_loads: float = (
        0.0  # cp.async load phases: one DRAM round trip each, all of a thread's copies in flight
    )
    barriers: int = 0

    def __add__(self, o: Work) -> Work:
        return Work(
            *(getattr(self, f) + getattr(o, f) for f in self.__slots__)  # type: ignore[attr-defined]
        )

    def cycles(self, hw: HwProfile, resident: int) -> float:
        """The phases on an SM running ``resident`` such blocks: one block's latency chain (loads as DRAM
        round trips with ``block_load_flight_bytes`` in flight, barriers, MMAs), or the resident blocks' work
        on the busiest pipe."""
        cal = hw.calibration
        trips = math.ceil(self.thread_bytes / max(1.0, cal.block_load_flight_bytes))
        chain = (
            self.latency
            + self.chained_mmas * cal.block_mma_cycles
            + (trips + self.async_loads) * hw.level("dram").latency_cycles
            + self.barriers * cal.block_barrier_cycles
        )
        issue = (self.ops * cal.block_element_cycles + self.mmas * cal.block_mma_cycles) / SUB_CORES
        return max(chain, resident * max(issue, self.shared, self.sfu))


@dataclass(frozen=True, slots=True)
class BlockPlan:
    """A graph-defined kernel as planned: threads, resident blocks, one loop iteration's work and the work
    done once (hoisted loads, epilogue)."""

    threads: int
    resident: int
    registers: int
    spilled: int  # registers per thread past :func:`register_cap`
    body: Work
    once: Work
    load_bytes: int  # bytes one block loads per iteration (L2 traffic)
    hoisted_bytes: int  # bytes one block loads once, before the loop
    mma: bool  # whether a block matmul runs on tensor cores
    stages: int = 1  # stages of the loop's cp.async tiles (1: not pipelined)
    stageable: bool = False  # whether the loop has cp.async tiles to stage
    shared_bytes: int = 0  # the shared footprint occupancy was priced with (stages included)


def _elementwise(
    hw: HwProfile, threads: int, elements: int, ops: float, reads: float, writes: float, special: float = 0.0
) -> Work:
    """``elements`` dealt cyclically over the threads, each ``ops`` operations, ``reads``/``writes`` shared
    accesses and ``special`` SFU ops."""
    per_thread = -(-elements // threads)
    warps = -(-threads // hw.warp_size)
    reg_lat = hw.level("register").latency_cycles
    shared_lat = hw.level("shared").latency_cycles
    return Work(
        latency=per_thread * (ops * reg_lat + (reads > 0) * shared_lat),
        ops=warps * per_thread * ops,
        shared=warps * per_thread * (reads + writes) * WAVEFRONT,
        sfu=warps * per_thread * special * SFU_WARP_CYCLES,
    )


@dataclass(frozen=True, slots=True)
class MmaCosts:
    """Per-SM rates of the fragment loads of a tensor-core matmul: bytes per cycle and latency of shared memory."""

    shared_bytes_per_cycle: float
    shared_latency: float

    @staticmethod
    def of(hw: HwProfile) -> MmaCosts:
        shared = hw.level("shared")
        return MmaCosts(shared.bandwidth_Bps / (hw.sm_count * hw.clock_hz), shared.latency_cycles)


def fragment_cycles(instructions: float, nbytes: int, costs: MmaCosts) -> float:
    """Shared-pipe cycles of one fragment load by one warp: ``instructions`` instructions (one a cycle) or
    ``nbytes`` bytes at the shared bandwidth, whichever is more."""
    return max(float(instructions), nbytes / costs.shared_bytes_per_cycle)


def shared_cycles(t: object, costs: MmaCosts, rows: tuple[bool, bool] = (False, False)) -> float:
    """Shared-pipe cycles of the fragment loads of one 16-wide k chunk of tiling ``t``
    (:class:`~gensorage.codegen.block_mma.MmaTiling`) over all its warps: per fragment a 2-byte element per lane
    and instruction, or, for the operands ``rows`` says ``ldmatrix`` loads, one instruction per A fragment and
    one per two B fragments."""
    from gensorage.codegen.block_mma import A_ELEMS, B_ELEMS, WARP, MmaTiling

    assert isinstance(t, MmaTiling)
    el = dtype_bytes(t.dtype)
    a = fragment_cycles(1 if rows[0] else A_ELEMS, WARP * A_ELEMS * el, costs)
    b = fragment_cycles(0.5 if rows[1] else B_ELEMS, WARP * B_ELEMS * el, costs)
    return t.warps * t.steps * (t.warp_m * a + t.warp_n * b)


def _mma(hw: HwProfile, t: object, rows: tuple[bool, bool]) -> Work:
    """A tensor-core matmul phase at the emitted warp layout (:class:`~gensorage.codegen.block_mma.MmaTiling`);
    ``rows``: which operands ``ldmatrix`` loads (:func:`shared_cycles`)."""
    from gensorage.codegen.block_mma import MMA_K, MmaTiling

    assert isinstance(t, MmaTiling)
    chunks = t.k // MMA_K
    return Work(
        latency=t.steps * chunks * hw.level("shared").latency_cycles,
        chained_mmas=t.steps * chunks * t.warp_m * t.warp_n,
        mmas=t.warp_tiles * t.warp_m * t.warp_n * chunks,
        shared=chunks * shared_cycles(t, MmaCosts.of(hw), rows) * WAVEFRONT,
    )


def _online_mma(hw: HwProfile, e: BlockEmitter, j: int, t: object) -> Work:
    """The tensor-core online step (:mod:`gensorage.codegen.online_mma`) per warp tile: each of a lane's
    ``2 warp_m`` rows' maximum over a quarter of the keys (a shared read and a max each, a serial chain), two
    shuffles and a broadcast, the rescale (an ``exp`` per row, a multiply per fragment), then per 16-wide k
    chunk the P fragments (a shared read, a subtract, an ``exp`` and a convert per element), the value
    fragments as a block matmul loads them, and the MMAs."""
    from gensorage.codegen.block_mma import A_ELEMS, B_ELEMS, MMA_K, WARP, MmaTiling

    assert isinstance(t, MmaTiling)
    node = e.nodes[j]
    assert isinstance(node, Accumulator) and node.values is not None
    chunks, rows, quarter = t.k // MMA_K, 2 * t.warp_m, t.k // 4
    reg_lat, shared_lat = hw.level("register").latency_cycles, hw.level("shared").latency_cycles
    p_elems = chunks * t.warp_m * A_ELEMS
    per_tile = Work(
        latency=rows * (quarter * reg_lat + shared_lat + 3 * reg_lat) + chunks * (shared_lat + reg_lat),
        ops=rows * (2 * quarter + 8) + 2 * t.regs + 4 * p_elems,
        shared=(rows * quarter + p_elems) * WAVEFRONT,
        sfu=(rows + p_elems) * SFU_WARP_CYCLES,
    )
    warp_work = t.warps * t.steps
    b_rows = e.mma_emitter.row_loadable(node.values, t, False)
    b = fragment_cycles(0.5 if b_rows else B_ELEMS, WARP * B_ELEMS * dtype_bytes(t.dtype), MmaCosts.of(hw))
    matmul = _mma(hw, t, (True, b_rows))
    # The A fragments are computed (priced above), not loaded: only the value fragments' loads.
    sums = sum(pv == j for pv in e.online_sums.values())
    if sums:  # a float32 add per P element, two shuffles, a broadcast and the rescaled add per row
        per_tile += Work(latency=rows * 3 * reg_lat, ops=p_elems + sums * rows * 6)
    return dataclasses.replace(
        matmul,
        latency=matmul.latency + t.steps * per_tile.latency,
        ops=matmul.ops + warp_work * per_tile.ops,
        shared=chunks * warp_work * t.warp_n * b * WAVEFRONT + warp_work * per_tile.shared,
        sfu=matmul.sfu + warp_work * per_tile.sfu,
    )


def _special(n: ThreadGraph | BlockOp) -> int:
    ops = [t.op for t in n.ops] if isinstance(n, ThreadGraph) else [n.op]
    return sum(op in SPECIAL_OPS for op in ops)


def _node_work(e: BlockEmitter, hw: HwProfile, j: int, mma: bool) -> Work:
    """One body or post-loop node's phase (loads aside)."""
    node, binfo, nt = e.nodes[j], e.binfo, e.nt
    out = binfo.nodes[j][0].shape if binfo.nodes[j] else ()
    if isinstance(node, ThreadGraph):
        local = binfo.threads[j]
        elems = max(math.prod(t.shape) for t in local)
        fused = mma and j in e.fused_into
        reads = 0 if fused else len(node.inputs)
        return _elementwise(hw, nt, elems, len(node.ops) + 1, reads, len(node.outputs), _special(node))
    if isinstance(node, Accumulator):
        if mma and j in e.online_mma:
            return _online_mma(hw, e, j, e.online_mma[j])
        if mma and j in e.online_sums:
            return Work()  # in its P·V's phase (priced there)
        if node.kind in ONLINE_SOFTMAX_KINDS:
            keys = binfo.nodes[node.input.node][node.input.out].shape[-1]
            values = node.values is not None
            # Per element of the result: a max pass and an exp(-max)-weighted pass over the row's keys. Both are
            # serial loops carrying the running max or sum, so a thread waits for each key's shared read: one
            # shared latency per key on its chain (fewer threads, more elements each, a longer chain).
            work = _elementwise(
                hw, nt, math.prod(out), keys * (3 + 2 * values) + 6, keys * (2 + values), 0, keys + 1
            )
            per_thread = -(-math.prod(out) // nt)
            return work + Work(latency=per_thread * keys * hw.level("shared").latency_cycles)
        src = binfo.nodes[node.input.node][node.input.out]
        copied = not e.fusable(node.input) or node.fmap is not None
        return _elementwise(hw, nt, math.prod(src.shape), 2, int(copied), int(node.fmap is not None))
    if not isinstance(node, BlockOp) or node.op in (Op.RESHAPE, Op.REPEAT):
        return Work()
    if node.op is Op.MATMUL:
        if mma and j in e.mma:
            t = e.mma[j]
            a, b = node.inputs
            rows = e.mma_emitter.row_loadable(a, t, t.padded), e.mma_emitter.row_loadable(b, t, False)
            return _mma(hw, t, rows)
        # CUDA cores, one output element per thread (register tile 1): k multiply-adds, 2k shared reads.
        k = binfo.nodes[node.inputs[0].node][node.inputs[0].out].shape[-1]
        return _elementwise(hw, nt, math.prod(out), k, 2 * k, 1)
    if node.op in REDUCTIONS:
        shape = binfo.nodes[node.inputs[0].node][node.inputs[0].out].shape
        dim = int(attr(node.attrs, "dim")) % len(shape)
        group = attr(node.attrs, "group")
        count = shape[dim] if group is None else int(group)
        lanes = e.reduce.lanes.get(j, 1)
        if lanes == 1:
            return _elementwise(hw, nt, math.prod(out), count, count, 1)
        # Cooperative (gensorage.codegen.block_reduce): lanes threads per result, a tree of log2(lanes)
        # combining steps (warp shuffles within a warp, then the warps' partials; in shared memory, a barrier
        # and two reads and a write per step, where shuffles do not apply), then the results read back.
        per = -(-count // lanes)
        steps = lanes.bit_length() - 1
        warps = -(-nt // hw.warp_size)
        shuffle = e.reduce.shuffles()
        tree = Work(
            latency=steps * (hw.level("register" if shuffle else "shared").latency_cycles + 1),
            ops=warps * steps * 2,
            shared=0 if shuffle else warps * steps * 3 * WAVEFRONT,
            barriers=(1 + (lanes > hw.warp_size)) if shuffle else steps + 1,
        )
        return (
            _elementwise(hw, nt, math.prod(out) * lanes, per, per, 1)
            + tree
            + _elementwise(hw, nt, math.prod(out), 1, 1, 1)
        )
    if node.op in BINARY_ELEMENTWISE or node.op in UNARY_ELEMENTWISE or node.op is Op.CONCAT:
        return _elementwise(hw, nt, math.prod(out), 1, len(node.inputs), 1, _special(node))
    return _elementwise(hw, nt, math.prod(out), 1, len(node.inputs), 1)


def _load(hw: HwProfile, e: BlockEmitter, j: int) -> tuple[Work, int]:
    """An iterator's tile: its loads (each also a shared-memory store), and its bytes. Element-wise loads keep
    ``block_load_flight_bytes`` in flight per thread; ``cp.async`` copies (16-byte runs,
    :mod:`gensorage.codegen.block_loads`) are all in flight at once: one round trip, a quarter of the
    instructions of 4-byte loads, each run four shared wavefronts per warp (512 bytes)."""
    t = e.binfo.nodes[j][0]
    elems = math.prod(t.shape)
    nbytes = elems * dtype_bytes(t.dtype)
    run = e.loads.run_elements(j)
    if run:
        work = _elementwise(hw, e.nt, -(-elems // run), 1, 0, 0)
        return Work(ops=work.ops, shared=4 * work.ops, async_loads=1), nbytes
    work = _elementwise(hw, e.nt, elems, 1, 0, 1)
    per_thread = -(-elems // e.nt) * dtype_bytes(t.dtype)
    return Work(ops=work.ops, shared=work.shared, thread_bytes=per_thread), nbytes


def _registers(e: BlockEmitter, mma: bool) -> int:
    from gensorage.codegen.block_mma import A_ELEMS, B_ELEMS

    regs = BASE_REGISTERS
    for j, m in e.reg_accs.items():
        t = e.online_mma.get(j)
        if t is not None:  # the kept fragments, each row's running and new maximum, the step's fragments
            regs += t.slots + 2 * t.warp_m * (t.steps + 1) + (A_ELEMS * t.warp_m + B_ELEMS * t.warp_n) // 2
            continue
        online = isinstance(e.nodes[j], Accumulator) and e.accs.is_online(j) and j not in e.online_sums
        regs += e.slots(m) * (2 if online else 1)
    if mma:
        regs += max(
            (t.regs + (A_ELEMS * t.warp_m + B_ELEMS * t.warp_n) // 2 for t in e.mma.values()), default=0
        )
    return -(-regs // 8) * 8


def register_cap(hw: HwProfile, threads: int) -> int:
    """The registers a thread of a ``threads``-thread block may use: the per-thread limit, or its share of the
    SM's register file (allocated 8 at a time), whichever is less; nvcc spills past it."""
    return min(hw.max_registers_per_thread, hw.registers_per_sm // threads // 8 * 8)


def plan_block(
    g: KernelGraph,
    k: int,
    info: GraphInfo,
    hw: HwProfile,
    mma: bool = True,
    choice: ThreadChoice | None = None,
) -> BlockPlan:
    """Graph-defined op ``k`` of ``g`` as the code generator plans it (``mma=False``: block matmuls on CUDA
    cores, as kernels were emitted before tensor-core block graphs), under ``choice`` (default: the
    generator's own, :func:`block_threads`). Cached: a search prices many µGraphs that share kernels."""
    # The plan is counts; only block_cycles reads the calibration, so calibrated variants of a profile share
    # plans. The thread choice does read it (it is priced), so it is made on the profile as given.
    op = g.ops[k]
    assert isinstance(op, GraphDefinedOp)
    if choice is None:
        choice = block_threads(g, k, info, hw)
    base = dataclasses.replace(hw, calibration=Calibration())
    key = _Key(op, tuple(info.of(r) for r in op.inputs), base, mma, choice)
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        plan = _PLANS[key] = _build_plan(g, k, info, base, mma, choice)
    return plan


@dataclass(frozen=True, slots=True)
class _Key:
    """What a plan depends on: the op, its inputs' tiles, the GPU (the µGraph around it does not matter)."""

    op: object
    ins: object
    hw: HwProfile
    mma: bool
    choice: object


_PLANS: dict[_Key, BlockPlan] = {}
_MAX_PLANS = 4096


def _tensor_peak(hw: HwProfile, dtype: str) -> float:
    """The profile's tensor-core peak for ``dtype`` (0: none; ``hw.flops`` would answer the CUDA-core one)."""
    return next((tensor for dt, _, tensor in hw.peak_flops if dt == dtype), 0.0)


def block_threads(g: KernelGraph, k: int, info: GraphInfo, hw: HwProfile) -> ThreadChoice:
    """The thread plan of graph-defined op ``k`` as :func:`~gensorage.codegen.ugraph_tir.plan_threads` gives it
    (:func:`_threads`), with its loop's stages (:func:`~gensorage.construction.pipeline_stages.choose_stages`)."""
    from gensorage.construction.pipeline_stages import choose_stages

    return choose_stages(g, k, info, hw, _threads(g, k, info, hw))


def _threads(g: KernelGraph, k: int, info: GraphInfo, hw: HwProfile) -> ThreadChoice:
    """The thread plan of graph-defined op ``k`` as :func:`~gensorage.codegen.ugraph_tir.plan_threads` gives it.
    A kernel whose dominant matmul runs on tensor cores gets the generator's own plan
    (:func:`~gensorage.codegen.mma_threads.mma_block_layout`, which this model prices). Otherwise the Markov
    construction is not run (about a second per matmul tile; full mode prices hundreds of tiles as it rebuilds
    the search's structures at the requested shapes): the dominant matmul's block tile widened to the grid's
    share of the GPU at one output element per thread, the generator's rule when the construction's register
    tile is 1, as on every fused kernel measured (``tests/test_block_cost.py`` compares the two)."""
    # Imported here: gensorage.codegen and gensorage.construction import the µGraph modules.
    from gensorage.codegen.mma_threads import mma_block_layout
    from gensorage.codegen.ugraph_tir import dominant_matmul, largest_tile
    from gensorage.construction.block_threads import (
        ThreadChoice,
        row_kernel_threads,
        thread_cap,
        widen_block_tile,
    )

    op = g.ops[k]
    binfo = info.blocks[k]
    assert isinstance(op, GraphDefinedOp) and binfo is not None
    layout = mma_block_layout(g, k, info, hw)
    if layout is not None:
        return layout
    dominant = dominant_matmul(op, binfo)
    if dominant is None:
        nt = row_kernel_threads(largest_tile(binfo), hw)
        rule = "fallback: no matmul in the block graph"
    else:
        b, m, n, _ = dominant[1]
        nt = math.prod(
            widen_block_tile((b, m, n), (1, 1, 1), (1, 1, 1), thread_cap(hw, math.prod(op.block.grid)))
        )
        rule = "the dominant matmul's tile, one output element per thread"
    return ThreadChoice(nt, None, None, rule)


def _build_plan(
    g: KernelGraph, k: int, info: GraphInfo, hw: HwProfile, mma: bool, choice: ThreadChoice
) -> BlockPlan:
    from gensorage.codegen.block_emitter import BlockEmitter
    from gensorage.codegen.scalar import FloatScalar
    from gensorage.codegen.ugraph_tir import compute_dtype
    from gensorage.ugraph.optimize.memory_plan import shared_footprint

    op = g.ops[k]
    assert isinstance(op, GraphDefinedOp)
    # The emitter, set up and not run: its tensor-core tilings, fused thread graphs and register accumulators.
    e = BlockEmitter(g, k, info, choice, "cuda", FloatScalar(compute_dtype(g, info)), f"cost{k}")
    # A profile without tensor cores for the MMA dtype (peak 0) prices the CUDA-core path.
    tilings = [*e.mma.values(), *e.online_mma.values()]
    mma = mma and bool(tilings) and all(_tensor_peak(hw, t.dtype) > 0 for t in tilings)
    block, binfo, nt = op.block, e.binfo, e.nt
    looped = block.forloop > 1
    level = depths(block)
    read = {r.node for r in e.consumers}
    staged, stages = _stages(e, binfo)
    body, once = Work(), Work()
    load_bytes = hoisted = 0
    body_levels: set[int] = set()
    online = 0
    for j, node in enumerate(block.nodes):
        if isinstance(node, OutputSaver) or is_view(node):
            continue
        if j not in read and not isinstance(node, Accumulator):
            continue  # nothing reads it: the generator emits no phase
        if isinstance(node, InputIterator):
            work, nbytes = _load(hw, e, j)
            if j in staged:  # prefetched: its round trip is priced per stage in block_cycles
                work = dataclasses.replace(work, async_loads=0.0)
            if looped and node.fmap is None and not e.sinks_of(Ref(j)):  # hoisted before the loop
                once, hoisted = once + work, hoisted + nbytes
            else:
                body, load_bytes = body + work, load_bytes + nbytes
            continue
        in_body = e.phase_of[j] == "body" or (isinstance(node, Accumulator) and looped)
        if isinstance(node, Accumulator) and node.kind in ONLINE_SOFTMAX_KINDS:
            online += 1
        elif in_body and not isinstance(node, Accumulator) and not (mma and j in e.fused_into):
            body_levels.add(level[j])
        work = _node_work(e, hw, j, mma)
        if in_body:
            body += work
        else:
            once += work
    # A barrier after each depth level of the body (the next reads it), before the online-softmax phases (they
    # read the body's tiles and write registers only), and at the end of the iteration (the next overwrites
    # the tiles).
    body += Work(
        barriers=len(body_levels) + int(online > 0) + int(looped) + level_fences(e, staged, stages, mma)
    )
    # Epilogue: the flush and the outputs' element-wise stores (one DRAM round trip), after a barrier.
    out_elems = sum(math.prod(t.shape) for t in binfo.outputs) // math.prod(block.grid)
    once += _elementwise(hw, nt, out_elems, 2, 1, 0) + Work(
        latency=hw.level("dram").latency_cycles, barriers=1
    )
    footprint = shared_footprint(block, binfo, staged, stages)
    threads = -(-nt // hw.warp_size) * hw.warp_size
    demand = _registers(e, mma)
    regs = min(demand, register_cap(hw, threads))
    # What does not fit spills to local memory, through L1 (the shared-memory pipe): each spilled register
    # stored and loaded once per loop iteration, one wavefront per warp access.
    spilled = demand - regs
    body += Work(shared=2 * spilled * threads // hw.warp_size)
    resident = max(
        1,
        min(
            hw.max_blocks_per_sm,
            hw.shared_mem_per_sm // (footprint + SHARED_RESERVED_PER_BLOCK),
            hw.max_threads_per_sm // threads,
            hw.registers_per_sm // (regs * threads),
        ),
    )
    stageable = bool(e.loads.stageable())
    return BlockPlan(
        nt, resident, regs, spilled, body, once, load_bytes, hoisted, mma, stages, stageable, footprint
    )


def _stages(e: BlockEmitter, binfo: BlockInfo) -> tuple[tuple[int, ...], int]:
    """The iterators the kernel stages and its stages, as :func:`gensorage.codegen.block_buffers.allocate`
    decides them (one stage when the stages' footprint passes the plan's limit; the model's footprint, of the
    tiles in their stored dtypes, stands for the emitter's)."""
    from gensorage.codegen.gpu_limits import STAGED_SHARED_LIMIT
    from gensorage.ugraph.optimize.memory_plan import shared_footprint

    staged, stages = e.loads.pipelined(), min(e.choice.stages, e.block.forloop)
    limit = e.choice.shared_limit or STAGED_SHARED_LIMIT
    if not staged or shared_footprint(e.block, binfo, staged, stages) > limit:
        return (), 1
    return staged, stages


def block_cycles(plan: BlockPlan, hw: HwProfile, blocks: int, forloop: int) -> tuple[float, int]:
    """Cycles of a grid of ``blocks`` blocks of ``plan`` (waves one after another on each SM), and the waves:
    full waves of ``resident`` blocks per SM, then a last one of the blocks left."""
    sm_bytes_per_cycle = hw.level("l2").bandwidth_Bps / hw.sm_count / hw.clock_hz

    trip = hw.level("dram").latency_cycles
    cal = hw.calibration

    def wave(resident: int) -> float:
        streamed = resident * plan.load_bytes / sm_bytes_per_cycle
        compute = plan.body.cycles(hw, resident)
        if plan.stages == 1:
            return forloop * max(compute, streamed) + plan.once.cycles(hw, resident)
        # Pipelined: the copies of iteration i + S - 1 fly while iterations i .. i + S - 2 compute.
        per_iter = max(compute + cal.block_stage_cycles, trip / (plan.stages - 1), streamed)
        return forloop * per_iter + trip + plan.once.cycles(hw, resident)

    per_wave = hw.sm_count * plan.resident
    full, rest = divmod(blocks, per_wave)
    total = full * wave(plan.resident)
    if rest:
        total += wave(-(-rest // hw.sm_count))
    return total, full + (1 if rest else 0)


__all__ = [
    "BlockPlan",
    "MmaCosts",
    "Work",
    "fragment_cycles",
    "shared_cycles",
    "block_cycles",
    "block_threads",
    "plan_block",
]

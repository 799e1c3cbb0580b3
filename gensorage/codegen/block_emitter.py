"""The emitter of one graph-defined kernel: phases, buffers, barriers (see :mod:`.ugraph_tir` for the kernel's
structure and semantics); the block's matmuls are emitted by :mod:`.block_matmul`, its loop accumulators by
:mod:`.block_accumulators`."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

from gensorage.codegen.barriers import EXPLICIT_BARRIERS, BarrierPlacement, tiles_clash
from gensorage.codegen.block_accesses import AccessRecorder
from gensorage.codegen.block_accumulators import AccumulatorEmitter
from gensorage.codegen.block_buffers import allocate
from gensorage.codegen.block_loads import GRID_VARS, LoadEmitter
from gensorage.codegen.block_matmul import MatmulEmitter, batch_index, check_tiling, matmul_dims
from gensorage.codegen.block_mma import ROW_BYTES, MmaEmitter, fused_thread_graphs, mma_tilings, slot_coords
from gensorage.codegen.block_reduce import ReduceEmitter
from gensorage.codegen.element_maps import Cyclic, ElementMap, Fragments, RowFragments, Tiled
from gensorage.codegen.gpu_limits import MAX_GRID
from gensorage.codegen.kernel_text import TARGETS, KernelParam, KernelText, Target, graph_kernel_params
from gensorage.codegen.online_mma import OnlineMmaEmitter, online_mma_tilings, online_sums, row_slot_coords
from gensorage.codegen.scalar import Scalar, Val
from gensorage.codegen.tir_text import (
    Ix,
    Writer,
    broadcast_all,
    broadcast_guard,
    broadcast_index,
    index_text,
    is_atomic,
    nest,
    reshape_index,
    shape_text,
    unravel,
)
from gensorage.construction.block_threads import MatmulTiling, ThreadChoice
from gensorage.dtypes import dtype_bytes
from gensorage.errors import UnsupportedOpError
from gensorage.folds import decide
from gensorage.opset import BINARY_ELEMENTWISE, REDUCTIONS, UNARY_ELEMENTWISE, Op, attr
from gensorage.ugraph.ir import (
    Accumulator,
    BlockOp,
    GraphDefinedOp,
    InputIterator,
    KernelGraph,
    OutputSaver,
    Ref,
    ThreadGraph,
    node_inputs,
)
from gensorage.ugraph.optimize.layouts import Layout, choose_layout
from gensorage.ugraph.optimize.memory_plan import MemoryPlan
from gensorage.ugraph.optimize.phase_order import depth_order
from gensorage.ugraph.optimize.views import VIEW_OPS
from gensorage.ugraph.shapes import GraphInfo, TensorInfo
from gensorage.ugraph.validate import loop_phases

# ---------------------------------------------------------------------------------------------- emission


@dataclass(frozen=True, slots=True)
class _View:
    """A reshape or repeat: element ``idx`` of this node is element ``index(idx)`` of ``src``."""

    src: Ref
    index: Callable[[list[Ix]], list[Ix]]


class BlockEmitter:
    """Emits one graph-defined op (see the module docstring); one instance per kernel and target."""

    def __init__(
        self,
        g: KernelGraph,
        k: int,
        info: GraphInfo,
        choice: ThreadChoice,
        target: Target,
        scalar: Scalar,
        name: str,
        layouts: Mapping[Ref, Layout] | None = None,
    ) -> None:
        op = g.ops[k]
        binfo = info.blocks[k]
        assert isinstance(op, GraphDefinedOp) and binfo is not None
        if target not in TARGETS:
            raise UnsupportedOpError(f"unknown code generation target {target!r} (expected 'cuda' or 'llvm')")
        self.g, self.k, self.op, self.binfo = g, k, op, binfo
        self.block = op.block
        # grid dims with a block index: those of 2 blocks or more (gensorage.folds: one of one block keeps its
        # index, 0, where another length's emission of this kernel did)
        self.split = tuple(
            decide(("split",) if n > 1 else ("whole", "split")) == "split" for n in op.block.grid
        )
        self.nodes = op.block.nodes
        self.info = info
        self.choice = choice
        self.gpu = target == "cuda"
        self.sc = scalar
        self.nt = choice.threads
        self.name = name
        self.w = Writer(1)
        self.phase_of = loop_phases(op.block)
        self.savers = [j for j, n in enumerate(self.nodes) if isinstance(n, OutputSaver)]
        self.consumers: dict[Ref, list[int]] = {}
        for j, node in enumerate(self.nodes):
            for r in node_inputs(node):
                self.consumers.setdefault(r, []).append(j)
        self.views = {
            j: self._view(j, n)
            for j, n in enumerate(self.nodes)
            if isinstance(n, BlockOp) and n.op in VIEW_OPS
        }
        self.mma = mma_tilings(self)
        self.fused = fused_thread_graphs(self)
        self.fused_into = {t: j for j, t in self.fused.items()}
        self.online_mma = online_mma_tilings(info, binfo, self.nodes, self.nt)
        self.online_sums = online_sums(self.nodes, self.online_mma)  # softmax_sum -> its P·V's node
        self.accs = AccumulatorEmitter(self)
        # Loop accumulators combined with sum/max live in registers across the loop (see block_accumulators).
        self.reg_accs = self.accs.register_maps()
        self.buffers: dict[Ref, str] = {}
        # Each tile's layout (padded or swizzled rows; gensorage.ugraph.optimize.layouts), chosen from the
        # accesses a first emission records (one warp's element indices per read or write site).
        self.layouts = dict(layouts or {})
        self.recorder = AccessRecorder(self.nt)
        self.row_loads: set[Ref] = set()  # tiles read or written in 16-byte runs (ldmatrix, cp.async)
        # Set by allocate: the memory plan, whether the tiles are views of one arena (then they may share bytes)
        # and its element type (the widest tile's), dynamic shared memory, the bytes a block declares on the GPU.
        self.memory, self.arena, self.arena_dtype, self.arena_name = MemoryPlan((), 0, 0), False, "", ""
        self.dynamic_shared, self.shared_bytes = False, 0
        self.barriers = BarrierPlacement(lambda r, o: tiles_clash(self.memory if self.arena else None, r, o))
        # Software pipelining (block_loads): the staged iterators and their stages (set by allocate), and the
        # stage their tiles' reads and writes address now (the iteration's, or a prefetch's).
        self.staged: tuple[int, ...] = ()
        self.stages, self.stage_at = 1, Ix()
        self._check_grid()
        if choice.tiling is not None:
            check_tiling(choice.tiling, choice.threads)
        self.matmul = MatmulEmitter(self)
        self.mma_emitter = MmaEmitter(self)
        self.online = OnlineMmaEmitter(self)
        self.loads = LoadEmitter(self)
        self.reduce = ReduceEmitter(self)

    def _check_grid(self) -> None:
        for g, n in enumerate(self.block.grid):
            if n > MAX_GRID[g]:
                raise UnsupportedOpError(
                    f"grid dim {GRID_VARS[g][1]} of {n} blocks exceeds CUDA's {MAX_GRID[g]}"
                )

    def tile(self, r: Ref) -> TensorInfo:
        return self.binfo.nodes[r.node][r.out]

    def _view(self, j: int, node: BlockOp) -> _View:
        src = node.inputs[0]
        src_shape = self.tile(src).shape
        dst_shape = self.binfo.nodes[j][0].shape
        if node.op is Op.RESHAPE:
            return _View(src, lambda idx: reshape_index(idx, src_shape, dst_shape))
        dim = int(attr(node.attrs, "dim")) % len(src_shape)
        times = int(attr(node.attrs, "times"))

        def repeat(idx: list[Ix]) -> list[Ix]:
            out = list(idx)
            out[dim] = idx[dim].floordiv(times, dst_shape[dim])
            return out

        return _View(src, repeat)

    def fusable(self, r: Ref) -> bool:
        """Whether accumulators/savers reading ``r`` are written from the phase that computes ``r``."""
        node = self.nodes[r.node]
        if r.node in self.views or isinstance(node, Accumulator):
            return False
        return not (isinstance(node, BlockOp) and node.op is Op.CONCAT)

    def sinks_of(self, r: Ref) -> list[int]:
        """Accumulators/savers written directly by the phase that produces ``r`` (or by a register flush)."""
        cons = self.consumers.get(r, [])
        if r.node in self.reg_accs:
            return [c for c in cons if isinstance(self.nodes[c], OutputSaver)]
        if not self.fusable(r):
            return []
        return [
            c
            for c in cons
            if isinstance(self.nodes[c], Accumulator | OutputSaver) and not self.accs.is_online(c)
        ]

    def needs_buffer(self, r: Ref) -> bool:
        """Whether block tensor ``r`` is materialised in shared memory (something reads it element-wise)."""
        if r.node in self.views:
            return False
        node = self.nodes[r.node]
        if isinstance(node, Accumulator) and node.fmap is not None:
            return True
        fused = set(self.sinks_of(r))
        if r.node in self.fused:
            fused.add(self.fused[r.node])
        for c in self.consumers.get(r, []):
            if c in fused or (c in self.views and not self.consumers.get(Ref(c))):
                continue
            return True
        return False

    def producer_map(self, r: Ref) -> ElementMap:
        """How the phase computing ``r`` deals ``r``'s elements to threads."""
        node = self.nodes[r.node]
        shape = self.tile(r).shape
        if isinstance(node, ThreadGraph):
            local = self.binfo.threads[r.node]
            return Cyclic(broadcast_all([t.shape for t in local]), shape)
        if r.node in self.mma:
            return Fragments(self.mma[r.node])
        if r.node in self.fused_into:
            return Fragments(self.mma[self.fused_into[r.node]])
        if isinstance(node, BlockOp) and node.op is Op.MATMUL and self._tiled(r.node) is not None:
            tiling = self._tiled(r.node)
            assert tiling is not None
            return Tiled(tiling, shape[:-2])
        return Cyclic(shape, shape)

    def _tiled(self, j: int) -> MatmulTiling | None:
        t = self.choice.tiling
        node = self.nodes[j]
        if t is None or not isinstance(node, BlockOp) or node.op is not Op.MATMUL:
            return None
        b, m, n, k = matmul_dims(self.binfo, node, j)
        return t if (b, m, n) == t.extents and k == t.k else None

    def slots(self, m: ElementMap) -> int:
        if isinstance(m, Tiled):
            return math.prod(m.tiling.steps) * math.prod(m.tiling.t0)
        if isinstance(m, Fragments):
            return m.tiling.slots
        if isinstance(m, RowFragments):
            return m.tiling.steps * 2 * m.tiling.warp_m
        return -(-math.prod(m.space) // self.nt)

    # ------------------------------------------------------------------ value access

    def read(self, r: Ref, idx: list[Ix]) -> Val:
        view = self.views.get(r.node)
        if view is not None:
            return self.read(view.src, view.index(idx))
        self.barriers.reads.add(r)
        self.recorder.note(r, idx)
        return self.sc.load(self.buffers[r], self.tile_index(r, idx), self.buf_dtype(r))

    # ------------------------------------------------------------------ layouts

    def chosen_layouts(self) -> dict[Ref, Layout]:
        """Every tile's layout with the fewest bank-conflict wavefronts over the recorded accesses."""
        return {
            r: choose_layout(
                self.tile(r).shape,
                dtype_bytes(self.buf_dtype(r)),
                self.recorder.accesses.get(r, []),
                ROW_BYTES if r in self.row_loads else 0,
            )
            for r in self.buffers
        }

    def buf_tile_shape(self, r: Ref) -> tuple[int, ...]:
        """The allocated shape of tile ``r``: its shape with the last dim padded (then the scalar's layout),
        after a leading dim of its stages when it is staged."""
        shape = self.tile(r).shape
        pad = self.layouts.get(r, Layout()).pad
        padded = (*shape[:-1], shape[-1] + pad) if pad else shape
        return self.sc.buf_shape((self.stages, *padded) if r.node in self.staged else padded)

    def staged_index(self, r: Ref, idx: list[Ix]) -> list[Ix]:
        """Element ``idx`` of tile ``r`` in its allocation: after the stage addressed now when it is staged."""
        return [self.stage_at, *idx] if r.node in self.staged else idx

    def tile_index(self, r: Ref, idx: list[Ix]) -> str:
        """Index text of element ``idx`` of tile ``r`` in its layout (a swizzle XORs the last index), in the
        stage addressed now when the tile is staged."""
        lay = self.layouts.get(r, Layout())
        if not lay.swizzle:
            return index_text(self.staged_index(r, idx))
        step = lay.step(dtype_bytes(self.buf_dtype(r)))
        last = f"({idx[-1]}) ^ (({idx[-2]}) % {lay.swizzle} * {step})"
        return index_text([*self.staged_index(r, idx[:-1]), last])

    def buf_dtype(self, r: Ref) -> str:
        # Accumulators keep the compute precision (a float16 running sum would lose the low bits every step).
        if isinstance(self.nodes[r.node], Accumulator):
            return self.sc.acc_dtype
        return self.sc.buf_dtype(self.tile(r).dtype)

    def store(self, buf: str, idx: str, v: Val, dtype: str) -> None:
        self.barriers.writes.update(r for r, name in self.buffers.items() if name == buf)
        for c, e in enumerate(self.sc.store(v, dtype)):
            self.w.line(f"{self.sc.at(buf, c, idx)} = {e}")

    def temp(self, v: Val) -> Val:
        """``v`` kept in a local register (one per component)."""
        name = self.w.fresh("r")
        self.w.line(f'{name} = T.alloc_buffer(({self.sc.comps},), "{v.dtype}", scope="local")')
        for c, e in enumerate(v.comps):
            self.w.line(f"{name}[{c}] = {e}")
        return Val(tuple(f"{name}[{c}]" for c in range(self.sc.comps)), v.dtype)

    def emit_value(self, r: Ref, idx: list[Ix], v: Val, slot: Ix) -> None:
        """Element ``idx`` of block tensor ``r`` (this thread's ``slot``): to its shared buffer and its sinks."""
        sinks = self.sinks_of(r)
        if (r in self.buffers) + len(sinks) > 1 and not all(is_atomic(e) for e in v.comps):
            v = self.temp(v)
        if r in self.buffers:
            self.recorder.note(r, idx)
            self.store(self.buffers[r], self.tile_index(r, idx), v, self.buf_dtype(r))
        for j in sinks:
            self.sink(j, idx, v, slot)

    def sink(self, j: int, idx: list[Ix], v: Val, slot: Ix) -> None:
        if isinstance(self.nodes[j], OutputSaver):
            self._save(j, idx, v)
        else:
            self.accs.sink(j, idx, v, slot)

    def _save(self, j: int, idx: list[Ix], v: Val) -> None:
        node = self.nodes[j]
        assert isinstance(node, OutputSaver)
        s = self.savers.index(j)
        tile = self.tile(node.input).shape
        out = list(idx)
        for g, d in enumerate(node.omap):
            if self.split[g]:
                out[d] = idx[d] + Ix.var(GRID_VARS[g]) * tile[d]
        self.store(f"out{s}", index_text(out), v, self.sc.buf_dtype(self.binfo.outputs[s].dtype))

    # ------------------------------------------------------------------ loops

    @contextmanager
    def threads(self) -> Iterator[None]:
        kind = f'T.thread_binding({self.nt}, thread="threadIdx.x")' if self.gpu else f"T.serial({self.nt})"
        with self.w.block(f"for tx in {kind}:"):
            yield

    def sync(self) -> None:
        if self.gpu:
            self.w.line('T.tvm_storage_sync("shared")')
        self.barriers.clear()

    @contextmanager
    def barrier_phase(self) -> Iterator[None]:
        """One phase, with a barrier before it exactly when it needs one (:class:`.BarrierPlacement`)."""
        mark, depth = len(self.w.lines), self.w.depth
        self.barriers.begin()
        yield
        if self.barriers.end() and self.gpu:
            self.w.lines.insert(mark, "    " * depth + 'T.tvm_storage_sync("shared")')

    def settle(self) -> None:
        """A barrier if any phase since the last one touched shared memory (before and at the end of the
        loop: every iteration starts with no access pending)."""
        self.loads.wait()
        if self.barriers.pending():
            self.sync()

    @contextmanager
    def elements(self, space: tuple[int, ...]) -> Iterator[tuple[list[Ix], Ix]]:
        """Inside a thread loop: element ``e * threads + tx`` of ``space`` for every ``e`` (guarded); yields
        (index, slot ``e``)."""
        n = math.prod(space)
        iters = -(-n // self.nt)
        with self.w.loop(self.w.fresh("e"), iters) as e:
            flat = self._flat(e)
            with self.w.block(f"if {flat} < {n}:") if iters * self.nt > n else nullcontext():
                yield unravel(flat, space), e

    def _flat(self, slot: Ix) -> Ix:
        flat = slot * self.nt + Ix.var("tx")
        if len(flat.terms) > 1 or flat.const:
            f = self.w.fresh("f")
            self.w.line(f"{f} = {flat}")
            self.recorder.define(f, flat)
            return Ix.var(f)
        return flat

    def locate(self, m: ElementMap, slot: Ix) -> tuple[list[Ix], list[str]]:
        """Element of a map's value held in ``slot`` of this thread, and the conditions for it to exist."""
        if isinstance(m, Tiled):
            t = m.tiling
            parts = unravel(slot, (*t.steps, *t.t0))
            glob, conds = self.matmul.tile_coords(t, parts[:3], parts[3:])
            return batch_index(glob[0], m.batch) + [glob[1], glob[2]], conds
        if isinstance(m, Fragments):
            return slot_coords(m.tiling, self.nt, slot)
        if isinstance(m, RowFragments):
            return row_slot_coords(m.tiling, self.nt, slot)
        n = math.prod(m.space)
        flat = self._flat(slot)
        conds = [f"{flat} < {n}"] if self.slots(m) * self.nt > n else []
        idx = unravel(flat, m.space)
        return broadcast_index(idx, m.shape), conds + broadcast_guard(idx, m.shape, m.space)

    # ------------------------------------------------------------------ phases

    def phase_op(self, j: int) -> None:
        node = self.nodes[j]
        assert isinstance(node, BlockOp)
        out = self.tile(Ref(j)).shape
        if node.op is Op.MATMUL:
            tiling = self._tiled(j)
            if j in self.mma:
                self.mma_emitter.phase(j, node, self.mma[j])
            elif tiling is not None:
                self.matmul.tiled(j, node, tiling)
            else:
                self.matmul.cyclic(j, node)
        elif node.op in REDUCTIONS:
            self.reduce.phase(j, node)
        elif node.op is Op.CONCAT:
            self.phase_concat(j, node)
        elif node.op in BINARY_ELEMENTWISE or node.op in UNARY_ELEMENTWISE:
            with self.threads(), self.elements(out) as (idx, slot):
                args = [self.read(r, broadcast_index(idx, self.tile(r).shape)) for r in node.inputs]
                self.emit_value(Ref(j), idx, self.sc.op(self.w, node.op, node.attrs, args), slot)
        else:
            raise UnsupportedOpError(f"block op '{node.op.value}' has no code generator")

    def mac(self, acc: str, r: Ix, a: Val, b: Val) -> None:
        """``acc[r] += a * b`` in the accumulator dtype."""
        cur = self.sc.load(acc, str(r), self.sc.acc_dtype)
        self.store(acc, str(r), self.sc.plus(cur, self.sc.product(a, b)), self.sc.acc_dtype)

    def acc_buffer(self, size: int) -> str:
        """A fresh thread-local accumulator of ``size`` elements."""
        acc = self.w.fresh("acc")
        shape = self.sc.buf_shape((size,))
        self.w.line(f'{acc} = T.alloc_buffer({shape_text(shape)}, "{self.sc.acc_dtype}", scope="local")')
        return acc

    def phase_concat(self, j: int, node: BlockOp) -> None:
        out = self.tile(Ref(j)).shape
        dim = int(attr(node.attrs, "dim")) % len(out)
        offset = 0
        with self.threads():
            for r in node.inputs:
                part = self.tile(r).shape
                with self.elements(part) as (idx, slot):
                    dst = list(idx)
                    dst[dim] = idx[dim] + offset
                    self.emit_value(Ref(j), dst, self.read(r, idx), slot)
                offset += part[dim]

    def phase_thread_graph(self, j: int) -> None:
        node = self.nodes[j]
        assert isinstance(node, ThreadGraph)
        local = self.binfo.threads[j]
        space = broadcast_all([t.shape for t in local])
        with self.threads(), self.elements(space) as (idx, slot):
            inputs = [
                self.read(r, broadcast_index(idx, t.shape)) for r, t in zip(node.inputs, local, strict=False)
            ]
            self.thread_graph_element(j, idx, inputs, slot)

    def thread_graph_element(self, j: int, idx: list[Ix], inputs: list[Val], slot: Ix) -> None:
        """Thread graph ``j`` on element ``idx`` of its space (this thread's ``slot``): its inputs' values in
        registers, its ops, its outputs emitted."""
        node = self.nodes[j]
        assert isinstance(node, ThreadGraph)
        local = self.binfo.threads[j]
        space = broadcast_all([t.shape for t in local])
        vals = [self.temp(v) for v in inputs]
        for top in node.ops:
            vals.append(self.temp(self.sc.op(self.w, top.op, top.attrs, [vals[r.node] for r in top.inputs])))
        for o, r in enumerate(node.outputs):
            shape = local[r.node].shape
            conds = broadcast_guard(idx, shape, space)
            with self.w.block(f"if {' and '.join(conds)}:") if conds else nullcontext():
                self.emit_value(Ref(j, o), broadcast_index(idx, shape), vals[r.node], slot)

    def phase(self, j: int) -> None:
        node = self.nodes[j]
        if j in self.fused_into:
            return  # ran in its matmul's phase
        if not (isinstance(node, InputIterator) and self.loads.run_elements(j)):
            self.loads.wait()
        with self.barrier_phase():
            if isinstance(node, InputIterator):
                self.loads.phase(j)
            elif isinstance(node, ThreadGraph):
                self.phase_thread_graph(j)
            else:
                self.phase_op(j)

    # ------------------------------------------------------------------ whole kernel

    def params(self) -> list[KernelParam]:
        return graph_kernel_params(self.g, self.k, self.info, self.sc)

    def body(self) -> None:
        allocate(self)
        loop = self.block.forloop > 1
        nodes = list(enumerate(self.nodes))
        # A loop-invariant tile is loaded once before the loop, unless the load itself feeds an accumulator.
        hoisted = [
            j
            for j, n in nodes
            if loop and isinstance(n, InputIterator) and n.fmap is None and not self.sinks_of(Ref(j))
        ]
        # Phases by depth, so independent ones share a barrier (gensorage.ugraph.optimize.phase_order).
        in_body, post = depth_order(self.block)
        # A node nothing reads computes nothing (its phase would be an empty loop, which TVMScript refuses).
        read = {r.node for r in self.consumers}
        body = [j for j in in_body if j not in hoisted and j in read and j not in self.staged]
        post = tuple(j for j in post if j in read)
        copies = [
            (j, n)
            for j, n in nodes
            if isinstance(n, Accumulator | OutputSaver) and j not in self.sinks_of(n.input)
        ]
        for j in hoisted:
            if j in read:
                self.phase(j)
        if loop:
            self.settle()
        self.loads.prologue()  # the first stages' copies, when staged (block_loads: the schedule, its barriers)
        with (
            self.w.loop("it", self.block.forloop, f"T.serial({self.block.forloop})")
            if loop
            else nullcontext()
        ):
            self.loads.begin_iteration()  # when staged: the next copies, this iteration's wait and barrier
            for j in body:
                self.phase(j)
            for j, n in copies:
                if isinstance(n, Accumulator):
                    self.accs.phase(j)
            if loop:
                self.settle()  # the next iteration overwrites tiles this one read
        self.loads.wait()
        self.loads.drain()
        self.accs.phase_flush()
        for j in post:
            self.phase(j)
        for j, n in copies:
            if isinstance(n, OutputSaver):
                self.accs.phase_copy(n.input, [j])

    def emit(self) -> KernelText:
        params = self.params()
        with self.grid():
            self.body()
        sig = ", ".join(f'{p.name}: T.Buffer({shape_text(p.shape)}, "{p.dtype}")' for p in params)
        explicit = f', "{EXPLICIT_BARRIERS}": True' if self.gpu else ""
        head = [
            "@T.prim_func",
            f"def {self.name}({sig}):",
            f'    T.func_attr({{"global_symbol": "{self.name}", "tir.noalias": True{explicit}}})',
        ]
        text = "\n".join(head) + "\n" + self.w.text()
        rule = "; ".join(
            [self.choice.rule]
            + [f"block matmul #{j} on {t.describe()}" for j, t in self.mma.items()]
            + [
                f"online accumulator #{j}: P·V on {t.describe()}"
                + "".join(f", with the row sums of #{s}" for s, pv in self.online_sums.items() if pv == j)
                for j, t in self.online_mma.items()
            ]
        )
        return KernelText(
            self.name, self.k, text, tuple(params), self.block.grid, self.nt, rule, self.shared_bytes
        )

    @contextmanager
    def grid(self) -> Iterator[None]:
        dims = [(g, n) for g, n in enumerate(self.block.grid) if g == 0 or self.split[g]]
        with nest(self.w, [self._grid_header(g, n, first=i == 0) for i, (g, n) in enumerate(dims)]):
            yield

    def _grid_header(self, g: int, n: int, first: bool) -> str:
        var = GRID_VARS[g]
        if self.gpu:
            return f'for {var} in T.thread_binding({n}, thread="blockIdx.{"xyz"[g]}"):'
        return f"for {var} in {'T.parallel' if first else 'T.serial'}({n}):"


__all__ = ["BlockEmitter"]

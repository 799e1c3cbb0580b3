"""A graph-defined kernel op of a µGraph lowered to one TVM PrimFunc (emitted as TVMScript text).

Structure of the emitted kernel (``target="cuda"``)::

    for bx in T.thread_binding(grid_x, thread="blockIdx.x"):      # (by, bz for 2-3 grid dims)
        s3 = T.alloc_buffer(tile, dtype, scope="shared")          # one per materialised block tensor
        a7 = T.alloc_buffer((slots,), "float32", scope="local")   # per-thread part of a loop accumulator
        <phases of loop-invariant input iterators>
        for it in T.serial(forloop):                               # the block graph's for-loop
            <phase> T.tvm_storage_sync("shared") <phase> ...       # loop body, in node order
        <flush of the accumulators> <post-loop phases>

A *phase* is one ``for tx in T.thread_binding(threads, thread="threadIdx.x")`` loop in which the block's
threads share one node's work: loading an iterator's tile (cooperatively, element ``e * threads + tx``),
one block op on shared tiles, or a whole thread graph (each thread runs the fused chain for its elements in
``scope="local"`` temporaries, with no shared-memory round trip between the chain's ops). A barrier follows
every phase that wrote shared memory that a later phase reads, and ends every loop iteration (the next one
overwrites the tiles). How the dominant matmul is tiled over the threads (and how many threads there are)
comes from the Markov construction: see :mod:`gensorage.construction.block_threads`.

Semantics (:mod:`gensorage.ugraph.ir`, reproduced by :mod:`gensorage.ugraph.evaluate`):

- iterator tile offset along data dim ``d``: each grid dim ``g`` with ``imap[g] = d`` splits what the previous
  splits left (x, y, z in order), then the for-loop splits along ``fmap``;
- reshape and repeat are index arithmetic on their source (views), never copies; concat copies its parts;
- a ``sum``/``max`` accumulator (``fmap=None``) combines in registers: the phase that updates it deals the same
  elements to the same thread every iteration, so each thread keeps its elements in a ``local`` array
  (``it == 0`` stores, later iterations combine) and one flush after the loop writes them to the
  accumulator's shared tile (with the same element-to-thread map). Combining in shared memory instead would be
  a read-modify-write in a loop, which TVM's barrier insertion answers with a barrier inside that loop. A
  concatenating accumulator (``fmap=d``) writes each iteration's tile to shared memory at offset ``it * tile``;
- accumulators and output savers of a value computed by a block op, a thread graph or an iterator are
  written from that producer's phase (no intermediate tile); an output saver writes element ``i`` of its tile
  to ``out[..., b_g * tile_d + i_d, ...]`` for ``omap[g] = d``.

``target="llvm"`` emits the same text with the bindings turned into loops (``T.parallel`` over blockIdx.x,
serial loops otherwise), shared buffers in global scope and no barriers; accumulator registers, which must
outlive one thread loop, get a row per thread (``a7[tx, slot]``). Every other index expression is literally
the same, so running it on the CPU checks the GPU kernel's index arithmetic (not races or barriers).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Literal

from gensorage.codegen.barriers import EXPLICIT_BARRIERS
from gensorage.codegen.scalar import FIELD_PARAMS, FLOAT_DTYPES, Scalar, Val
from gensorage.codegen.tir_text import (
    Ix,
    Writer,
    broadcast_index,
    index_text,
    reshape_index,
    summed_index,
    unravel,
)
from gensorage.construction.block_threads import MatmulTiling, ThreadChoice, fallback_threads, matmul_tiling
from gensorage.dtypes import dtype_bytes
from gensorage.errors import ScheduleError, UnsupportedOpError
from gensorage.hw.profile import HwProfile
from gensorage.opset import BINARY_ELEMENTWISE, UNARY_ELEMENTWISE, Op, attr
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
from gensorage.ugraph.shapes import BlockInfo, GraphInfo, TensorInfo
from gensorage.ugraph.validate import loop_phases

Target = Literal["cuda", "llvm"]
TARGETS: tuple[Target, ...] = ("cuda", "llvm")
# CUDA caps static __shared__ arrays at 48 KiB; beyond that the kernel uses dynamic shared memory.
STATIC_SHARED_LIMIT = 48 * 1024
# Byte alignment of each tile inside the dynamic shared-memory arena (the widest vector access, 128 bits).
_ARENA_ALIGN = 16
# Index arithmetic is int32 (TVM's default): every tensor must stay below 2^31 elements.
MAX_ELEMENTS = (1 << 31) - 1
# CUDA grid limits per dim (x, y, z).
MAX_GRID = (2**31 - 1, 65535, 65535)
_GRID_VARS = ("bx", "by", "bz")
_VIEW_OPS = frozenset({Op.RESHAPE, Op.REPEAT})


@dataclass(frozen=True, slots=True)
class KernelParam:
    """One PrimFunc parameter: ``role`` input/output (a kernel-graph tensor ``ref``) or the field parameters.

    ``shape`` and ``dtype`` are what the kernel declares (with the leading component dim in field mode).
    """

    name: str
    role: Literal["input", "output", "field"]
    ref: Ref | None
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True, slots=True)
class KernelText:
    """An emitted kernel: TVMScript ``text`` of one PrimFunc called ``name``, its parameters and launch shape."""

    name: str
    op_index: int
    text: str
    params: tuple[KernelParam, ...]
    grid: tuple[int, ...]
    threads: int
    rule: str


def compute_dtype(g: KernelGraph, info: GraphInfo) -> str:
    """float64 when the graph holds any float64 tensor, else float32; non-float tensors are unsupported."""
    dtypes = {t.dtype for outs in info.nodes for t in outs}
    bad = sorted(d for d in dtypes if d not in FLOAT_DTYPES)
    if bad:
        raise UnsupportedOpError(f"code generation supports float tensors only (got dtype {', '.join(bad)})")
    big = [t.shape for outs in info.nodes for t in outs if math.prod(t.shape) > MAX_ELEMENTS]
    if big:
        raise UnsupportedOpError(f"tensor of shape {list(big[0])} has 2^31 or more elements (int32 indexing)")
    return "float64" if "float64" in dtypes else "float32"


# ---------------------------------------------------------------------------------------------- planning


def _matmul_dims(binfo: BlockInfo, node: BlockOp, j: int) -> tuple[int, int, int, int]:
    a = binfo.nodes[node.inputs[0].node][node.inputs[0].out].shape
    out = binfo.nodes[j][0].shape
    return math.prod(out[:-2]), out[-2], out[-1], a[-1]


def _largest_tile(binfo: BlockInfo) -> int:
    sizes = [math.prod(t.shape) for outs in binfo.nodes for t in outs]
    sizes += [math.prod(t.shape) for local in binfo.threads for t in local]
    return max(sizes, default=1)


def plan_threads(g: KernelGraph, k: int, info: GraphInfo, hw: HwProfile, seed: int = 0) -> ThreadChoice:
    """Threads per block of graph-defined op ``k`` (see :mod:`gensorage.construction.block_threads`)."""
    op = g.ops[k]
    binfo = info.blocks[k]
    assert isinstance(op, GraphDefinedOp) and binfo is not None
    best: tuple[int, int] | None = None
    for j, node in enumerate(op.block.nodes):
        if isinstance(node, BlockOp) and node.op is Op.MATMUL:
            work = math.prod(_matmul_dims(binfo, node, j))
            if best is None or work > best[0]:
                best = (work, j)
    why = "no matmul in the block graph"
    if best is not None:
        j = best[1]
        node = op.block.nodes[j]
        assert isinstance(node, BlockOp)
        b, m, n, kk = _matmul_dims(binfo, node, j)
        try:
            tiling = matmul_tiling(b, m, n, kk, binfo.nodes[j][0].dtype, hw, seed, math.prod(op.block.grid))
        except ScheduleError as exc:
            why = f"the construction found no schedule for the matmul tile: {exc}"
        else:
            return ThreadChoice(tiling.threads, j, tiling, tiling.describe())
    nt = fallback_threads(_largest_tile(binfo), hw)
    return ThreadChoice(nt, None, None, f"fallback ({why}): {nt} threads, one per element of the largest tile "
                                        f"({_largest_tile(binfo)}) rounded to the warp size")


# ---------------------------------------------------------------------------------------------- emission


@dataclass(frozen=True, slots=True)
class _View:
    """A reshape or repeat: element ``idx`` of this node is element ``index(idx)`` of ``src``."""

    src: Ref
    index: Callable[[list[Ix]], list[Ix]]


@dataclass(frozen=True, slots=True)
class _Cyclic:
    """Elements dealt cyclically: slot ``e`` of thread ``tx`` is flat element ``e * threads + tx`` of ``space``;
    the value written has ``shape`` (``space`` projected by broadcasting, stored where the projection is
    the first element)."""

    space: tuple[int, ...]
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class _Tiled:
    """The constructor's register tiling of a matmul with batch dims ``batch`` (slot = step, then register)."""

    tiling: MatmulTiling
    batch: tuple[int, ...]


_Map = _Cyclic | _Tiled


class _BlockEmitter:
    """Emits one graph-defined op (see the module docstring); one instance per kernel and target."""

    def __init__(self, g: KernelGraph, k: int, info: GraphInfo, choice: ThreadChoice, target: Target,
                 scalar: Scalar, name: str) -> None:
        op = g.ops[k]
        binfo = info.blocks[k]
        assert isinstance(op, GraphDefinedOp) and binfo is not None
        if target not in TARGETS:
            raise UnsupportedOpError(f"unknown code generation target {target!r} (expected 'cuda' or 'llvm')")
        self.g, self.k, self.op, self.binfo = g, k, op, binfo
        self.block = op.block
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
        self.views = {j: self._view(j, n) for j, n in enumerate(self.nodes)
                      if isinstance(n, BlockOp) and n.op in _VIEW_OPS}
        # Loop accumulators combined with sum/max live in registers across the loop (see _reg_acc_map).
        self.reg_accs = {j: self._reg_acc_map(j, n) for j, n in enumerate(self.nodes)
                         if isinstance(n, Accumulator) and n.fmap is None}
        self.buffers: dict[Ref, str] = {}
        self.dynamic_shared = False
        self._synced = True
        self._check_grid()
        if choice.tiling is not None:
            _check_tiling(choice.tiling, choice.threads)

    # ------------------------------------------------------------------ analysis

    def _check_grid(self) -> None:
        for g, n in enumerate(self.block.grid):
            if n > MAX_GRID[g]:
                raise UnsupportedOpError(f"grid dim {_GRID_VARS[g][1]} of {n} blocks exceeds CUDA's {MAX_GRID[g]}")

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

    def _fusable(self, r: Ref) -> bool:
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
        if not self._fusable(r):
            return []
        return [c for c in cons if isinstance(self.nodes[c], Accumulator | OutputSaver)]

    def needs_buffer(self, r: Ref) -> bool:
        """Whether block tensor ``r`` is materialised in shared memory (something reads it element-wise)."""
        if r.node in self.views:
            return False
        node = self.nodes[r.node]
        if isinstance(node, Accumulator) and node.fmap is not None:
            return True
        fused = set(self.sinks_of(r))
        for c in self.consumers.get(r, []):
            if c in fused or (c in self.views and not self.consumers.get(Ref(c))):
                continue
            return True
        return False

    def _producer_map(self, r: Ref) -> _Map:
        """How the phase computing ``r`` deals ``r``'s elements to threads."""
        node = self.nodes[r.node]
        shape = self.tile(r).shape
        if isinstance(node, ThreadGraph):
            local = self.binfo.threads[r.node]
            return _Cyclic(_broadcast_all([t.shape for t in local]), shape)
        if isinstance(node, BlockOp) and node.op is Op.MATMUL and self._tiled(r.node) is not None:
            tiling = self._tiled(r.node)
            assert tiling is not None
            return _Tiled(tiling, shape[:-2])
        return _Cyclic(shape, shape)

    def _reg_acc_map(self, j: int, node: Accumulator) -> _Map:
        """Element-to-thread map of a register accumulator: its producer's (fused) or a cyclic copy phase's.

        Every iteration runs the same phase, so a thread always combines the same elements and can keep them
        in registers; read-modify-writes of shared memory in a loop would also make TVM's barrier insertion put
        a barrier inside the loop.
        """
        r = node.input
        shape = self.tile(r).shape
        return self._producer_map(r) if self._fusable(r) else _Cyclic(shape, shape)

    def _tiled(self, j: int) -> MatmulTiling | None:
        t = self.choice.tiling
        node = self.nodes[j]
        if t is None or not isinstance(node, BlockOp) or node.op is not Op.MATMUL:
            return None
        b, m, n, k = _matmul_dims(self.binfo, node, j)
        return t if (b, m, n) == t.extents and k == t.k else None

    def slots(self, m: _Map) -> int:
        if isinstance(m, _Tiled):
            return math.prod(m.tiling.steps) * math.prod(m.tiling.t0)
        return -(-math.prod(m.space) // self.nt)

    # ------------------------------------------------------------------ value access

    def read(self, r: Ref, idx: list[Ix]) -> Val:
        view = self.views.get(r.node)
        if view is not None:
            return self.read(view.src, view.index(idx))
        return self.sc.load(self.buffers[r], index_text(idx), self._buf_dtype(r))

    def _buf_dtype(self, r: Ref) -> str:
        # Accumulators keep the compute precision (a float16 running sum would lose the low bits every step).
        if isinstance(self.nodes[r.node], Accumulator):
            return self.sc.acc_dtype
        return self.sc.buf_dtype(self.tile(r).dtype)

    def store(self, buf: str, idx: str, v: Val, dtype: str) -> None:
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
        if (r in self.buffers) + len(sinks) > 1 and not all(_atomic(e) for e in v.comps):
            v = self.temp(v)
        if r in self.buffers:
            self.store(self.buffers[r], index_text(idx), v, self._buf_dtype(r))
        for j in sinks:
            self.sink(j, idx, v, slot)

    def _reg(self, j: int, slot: Ix) -> str:
        """Index text of this thread's register ``slot`` of accumulator ``j`` (a row per thread on the CPU)."""
        return str(slot) if self.gpu else f"tx, {slot}"

    def sink(self, j: int, idx: list[Ix], v: Val, slot: Ix) -> None:
        node = self.nodes[j]
        if isinstance(node, OutputSaver):
            self._save(j, idx, v)
            return
        assert isinstance(node, Accumulator)
        if node.fmap is not None:
            shifted = list(idx)
            shifted[node.fmap] = idx[node.fmap] + Ix.var("it") * self.tile(node.input).shape[node.fmap]
            self.store(self.buffers[Ref(j)], index_text(shifted), v, self.sc.acc_dtype)
            return
        if not all(_atomic(e) for e in v.comps):
            v = self.temp(v)
        reg, at = f"a{j}", self._reg(j, slot)
        new = self.sc.combine(node.kind, self.sc.load(reg, at, self.sc.acc_dtype), v)
        first = self.sc.store(v, self.sc.acc_dtype)
        for c, e in enumerate(self.sc.store(new, self.sc.acc_dtype)):
            self.w.line(f"{self.sc.at(reg, c, at)} = T.if_then_else(it == 0, {first[c]}, {e})")

    def _save(self, j: int, idx: list[Ix], v: Val) -> None:
        node = self.nodes[j]
        assert isinstance(node, OutputSaver)
        s = self.savers.index(j)
        tile = self.tile(node.input).shape
        out = list(idx)
        for g, d in enumerate(node.omap):
            if self.block.grid[g] > 1:
                out[d] = idx[d] + Ix.var(_GRID_VARS[g]) * tile[d]
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
        self._synced = True

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
            return Ix.var(f)
        return flat

    def locate(self, m: _Map, slot: Ix) -> tuple[list[Ix], list[str]]:
        """Element of a map's value held in ``slot`` of this thread, and the conditions for it to exist."""
        if isinstance(m, _Tiled):
            t = m.tiling
            parts = unravel(slot, (*t.steps, *t.t0))
            glob, conds = self._tile_coords(t, parts[:3], parts[3:])
            return self._batch(glob[0], m.batch) + [glob[1], glob[2]], conds
        n = math.prod(m.space)
        flat = self._flat(slot)
        conds = [f"{flat} < {n}"] if self.slots(m) * self.nt > n else []
        idx = unravel(flat, m.space)
        return broadcast_index(idx, m.shape), conds + _broadcast_guard(idx, m.shape, m.space)

    # ------------------------------------------------------------------ phases

    def phase_load(self, j: int) -> None:
        node = self.nodes[j]
        assert isinstance(node, InputIterator)
        src = self.op.inputs[node.input]
        shape = self.info.of(src).shape
        ext, off = list(shape), [Ix() for _ in shape]
        for g, d in enumerate(node.imap):
            if d is not None and self.block.grid[g] > 1:
                ext[d] //= self.block.grid[g]
                off[d] = off[d] + Ix.var(_GRID_VARS[g]) * ext[d]
        if node.fmap is not None:
            ext[node.fmap] //= self.block.forloop
            off[node.fmap] = off[node.fmap] + Ix.var("it") * ext[node.fmap]
        dtype = self.sc.buf_dtype(self.info.of(src).dtype)
        with self.threads(), self.elements(self.tile(Ref(j)).shape) as (idx, slot):
            gidx = [o + i for o, i in zip(off, idx, strict=True)]
            self.emit_value(Ref(j), idx, self.sc.load(f"in{node.input}", index_text(gidx), dtype), slot)

    def phase_op(self, j: int) -> None:
        node = self.nodes[j]
        assert isinstance(node, BlockOp)
        out = self.tile(Ref(j)).shape
        if node.op is Op.MATMUL:
            tiling = self._tiled(j)
            if tiling is not None:
                self.phase_matmul_tiled(j, node, tiling)
            else:
                self.phase_matmul_cyclic(j, node)
        elif node.op is Op.SUM:
            self.phase_sum(j, node)
        elif node.op is Op.CONCAT:
            self.phase_concat(j, node)
        elif node.op in BINARY_ELEMENTWISE or node.op in UNARY_ELEMENTWISE:
            with self.threads(), self.elements(out) as (idx, slot):
                args = [self.read(r, broadcast_index(idx, self.tile(r).shape)) for r in node.inputs]
                self.emit_value(Ref(j), idx, self.sc.op(self.w, node.op, node.attrs, args), slot)
        else:
            raise UnsupportedOpError(f"block op '{node.op.value}' has no code generator")

    def _mac(self, acc: str, r: Ix, a: Val, b: Val) -> None:
        cur = self.sc.load(acc, str(r), self.sc.acc_dtype)
        self.store(acc, str(r), self.sc.plus(cur, self.sc.product(a, b)), self.sc.acc_dtype)

    def _acc_buffer(self, size: int) -> str:
        acc = self.w.fresh("acc")
        shape = self.sc.buf_shape((size,))
        self.w.line(f'{acc} = T.alloc_buffer({_shape(shape)}, "{self.sc.acc_dtype}", scope="local")')
        return acc

    def phase_matmul_cyclic(self, j: int, node: BlockOp) -> None:
        """One thread per output element (cyclic), the whole inner dim in one register."""
        a, b = node.inputs
        kdim = self.tile(a).shape[-1]
        with self.threads(), self.elements(self.tile(Ref(j)).shape) as (idx, slot):
            acc = self._acc_buffer(1)
            self.store(acc, "0", self.sc.zero(), self.sc.acc_dtype)
            with self.w.loop(self.w.fresh("k"), kdim) as kk:
                av = self.read(a, broadcast_index(idx[:-2], self.tile(a).shape[:-2]) + [idx[-2], kk])
                bv = self.read(b, broadcast_index(idx[:-2], self.tile(b).shape[:-2]) + [kk, idx[-1]])
                self._mac(acc, Ix(), av, bv)
            self.emit_value(Ref(j), idx, self.sc.reduced(self.sc.load(acc, "0", self.sc.acc_dtype)), slot)

    def phase_matmul_tiled(self, j: int, node: BlockOp, t: MatmulTiling) -> None:
        """The constructor's register tiling: per thread a T0 tile of accumulators, T1 tiles walked in turn."""
        a, b = node.inputs
        batch = self.tile(Ref(j)).shape[:-2]
        regs = math.prod(t.t0)
        with self.threads():
            acc = self._acc_buffer(regs)
            with self.w.loop(self.w.fresh("sb"), t.steps[0]) as sb, \
                    self.w.loop(self.w.fresh("si"), t.steps[1]) as si, \
                    self.w.loop(self.w.fresh("sj"), t.steps[2]) as sj:
                steps = [sb, si, sj]
                with self.w.loop(self.w.fresh("r"), regs, _unroll(regs)) as r:
                    self.store(acc, str(r), self.sc.zero(), self.sc.acc_dtype)
                with self.w.loop(self.w.fresh("k"), t.k) as kk, self._register_tile(t, steps) as (r, g):
                    bi = self._batch(g[0], batch)
                    av = self.read(a, broadcast_index(bi, self.tile(a).shape[:-2]) + [g[1], kk])
                    bv = self.read(b, broadcast_index(bi, self.tile(b).shape[:-2]) + [kk, g[2]])
                    self._mac(acc, r, av, bv)
                with self._register_tile(t, steps) as (r, g):
                    slot = ((sb * t.steps[1] + si) * t.steps[2] + sj) * regs + r
                    v = self.sc.reduced(self.sc.load(acc, str(r), self.sc.acc_dtype))
                    self.emit_value(Ref(j), self._batch(g[0], batch) + [g[1], g[2]], v, slot)

    @staticmethod
    def _batch(flat: Ix, batch: tuple[int, ...]) -> list[Ix]:
        return unravel(flat, batch) if batch else []

    def _thread_coords(self, t: MatmulTiling) -> list[Ix]:
        """This thread's position (b, i, j) in the tiling's thread grid; the last axis varies fastest."""
        th = t.threads_per_axis
        tx = Ix.var("tx")
        return [tx.floordiv(th[1] * th[2], self.nt).mod(th[0], -(-self.nt // (th[1] * th[2]))),
                tx.floordiv(th[2], self.nt).mod(th[1], -(-self.nt // th[2])),
                tx.mod(th[2], self.nt)]

    def _tile_coords(self, t: MatmulTiling, steps: list[Ix], regs: list[Ix]) -> tuple[list[Ix], list[str]]:
        """Output coordinates (b, i, j) of register ``regs`` in step ``steps`` of this thread, and their guards.

        Along an axis a T1 tile is laid out ``[vthreads, threads, T0 / vthreads]``: register ``r`` is in chunk
        ``r // c`` (``c = T0 / vthreads``), at ``chunk * threads * c + thread * c + r % c``.
        """
        th = t.threads_per_axis
        coords = self._thread_coords(t)
        glob, conds = [], []
        for ax in range(3):
            chunk = t.t0[ax] // t.vthreads[ax]
            pos = regs[ax].floordiv(chunk, t.t0[ax]) * (th[ax] * chunk) + coords[ax] * chunk + \
                regs[ax].mod(chunk, t.t0[ax])
            gl = steps[ax] * t.t1[ax] + pos
            if th[ax] * t.t0[ax] > t.t1[ax]:
                conds.append(f"{pos} < {t.t1[ax]}")
            if t.steps[ax] * t.t1[ax] > t.extents[ax]:
                conds.append(f"{gl} < {t.extents[ax]}")
            glob.append(gl)
        return glob, conds

    @contextmanager
    def _register_tile(self, t: MatmulTiling, steps: list[Ix]) -> Iterator[tuple[Ix, list[Ix]]]:
        """Loops over a thread's register tile; yields (register index, output coords (b, i, j)), guarded."""
        names = [self.w.fresh(p) for p in ("rb", "ri", "rj")]
        with self.w.loop(names[0], t.t0[0], _unroll(t.t0[0])) as rb, \
                self.w.loop(names[1], t.t0[1], _unroll(t.t0[1])) as ri, \
                self.w.loop(names[2], t.t0[2], _unroll(t.t0[2])) as rj:
            glob, conds = self._tile_coords(t, steps, [rb, ri, rj])
            r = rb * (t.t0[1] * t.t0[2]) + ri * t.t0[2] + rj
            with self.w.block(f"if {' and '.join(conds)}:") if conds else nullcontext():
                yield r, glob

    def phase_sum(self, j: int, node: BlockOp) -> None:
        x = node.inputs[0]
        shape = self.tile(x).shape
        dim = int(attr(node.attrs, "dim")) % len(shape)
        keep = bool(attr(node.attrs, "keepdim", True))
        group = attr(node.attrs, "group")
        full = group is None or group == shape[dim]
        count = shape[dim] if full else int(group)
        with self.threads(), self.elements(self.tile(Ref(j)).shape) as (idx, slot):
            acc = self._acc_buffer(1)
            self.store(acc, "0", self.sc.zero(), self.sc.acc_dtype)
            with self.w.loop(self.w.fresh("g"), count) as gi:
                cur = self.sc.load(acc, "0", self.sc.acc_dtype)
                src = summed_index(idx, dim, gi, count, full, keep)
                self.store(acc, "0", self.sc.plus(cur, self.read(x, src)), self.sc.acc_dtype)
            self.emit_value(Ref(j), idx, self.sc.reduced(self.sc.load(acc, "0", self.sc.acc_dtype)), slot)

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
        space = _broadcast_all([t.shape for t in local])
        with self.threads(), self.elements(space) as (idx, slot):
            vals: list[Val] = []
            for r, t in zip(node.inputs, local, strict=False):
                vals.append(self.temp(self.read(r, broadcast_index(idx, t.shape))))
            for top in node.ops:
                vals.append(self.temp(self.sc.op(self.w, top.op, top.attrs, [vals[r.node] for r in top.inputs])))
            for o, r in enumerate(node.outputs):
                shape = local[r.node].shape
                conds = _broadcast_guard(idx, shape, space)
                with self.w.block(f"if {' and '.join(conds)}:") if conds else nullcontext():
                    self.emit_value(Ref(j, o), broadcast_index(idx, shape), vals[r.node], slot)

    def phase_copy(self, src: Ref, sinks: list[int]) -> None:
        """Accumulators/savers reading a view, a concat or a shared accumulator: a cyclic pass over the value."""
        with self.threads(), self.elements(self.tile(src).shape) as (idx, slot):
            v = self.read(src, idx)
            for s in sinks:
                self.sink(s, idx, v, slot)
        self._after(any(isinstance(self.nodes[s], Accumulator) and self.nodes[s].fmap is not None  # type: ignore[union-attr]
                        for s in sinks))

    def phase_flush(self) -> None:
        """After the loop: register accumulators to their shared buffers and fused savers (same element map)."""
        if not self.reg_accs:
            return
        with self.threads():
            for j, m in self.reg_accs.items():
                with self.w.loop(self.w.fresh("sl"), self.slots(m)) as slot:
                    idx, conds = self.locate(m, slot)
                    with self.w.block(f"if {' and '.join(conds)}:") if conds else nullcontext():
                        v = self.sc.load(f"a{j}", self._reg(j, slot), self.sc.acc_dtype)
                        self.emit_value(Ref(j), idx, v, slot)
        self._after(any(Ref(j) in self.buffers for j in self.reg_accs))

    def writes_shared(self, j: int) -> bool:
        refs = [Ref(j, o) for o in range(len(self.binfo.nodes[j]))]
        return any(r in self.buffers for r in refs) or any(
            Ref(s) in self.buffers and s not in self.reg_accs for r in refs for s in self.sinks_of(r)
            if isinstance(self.nodes[s], Accumulator))

    def _after(self, wrote_shared: bool) -> None:
        """Barrier after a phase whose shared-memory writes later phases read; after every phase when shared
        memory is dynamic (see :mod:`gensorage.codegen.barriers`)."""
        if wrote_shared or self.dynamic_shared:
            self.sync()
        else:
            self._synced = False

    def phase(self, j: int) -> None:
        node = self.nodes[j]
        if isinstance(node, InputIterator):
            self.phase_load(j)
        elif isinstance(node, ThreadGraph):
            self.phase_thread_graph(j)
        else:
            self.phase_op(j)
        self._after(self.writes_shared(j))

    # ------------------------------------------------------------------ whole kernel

    def allocate(self) -> None:
        total = 0
        for j, outs in enumerate(self.binfo.nodes):
            for o, t in enumerate(outs):
                r = Ref(j, o)
                if self.needs_buffer(r):
                    self.buffers[r] = f"s{j}" if len(outs) == 1 else f"s{j}_{o}"
                    total += math.prod(self.sc.buf_shape(t.shape)) * dtype_bytes(self._buf_dtype(r))
        self.dynamic_shared = self.gpu and total > STATIC_SHARED_LIMIT
        if self.dynamic_shared:
            self._allocate_arena()
        else:
            scope = "shared" if self.gpu else "global"
            for r, name in self.buffers.items():
                shape = self.sc.buf_shape(self.tile(r).shape)
                self.w.line(f'{name} = T.alloc_buffer({_shape(shape)}, "{self._buf_dtype(r)}", scope="{scope}")')
        for j, m in self.reg_accs.items():
            # Registers of each thread; on the CPU the threads are loop iterations, so each gets its own row.
            shape = self.sc.buf_shape((self.slots(m),) if self.gpu else (self.nt, self.slots(m)))
            self.w.line(f'a{j} = T.alloc_buffer({_shape(shape)}, "{self.sc.acc_dtype}", '
                        f'scope="{"local" if self.gpu else "global"}")')

    def _allocate_arena(self) -> None:
        """Dynamic shared memory as one arena with a typed view per tile, at offsets we choose.

        TVM's ``MergeSharedMemoryAllocations`` (which the CUDA build runs to place dynamic shared buffers)
        loses the offset of a buffer in some liveness patterns (a scalar tile written after a loop and read by
        every thread: "buffer_byte_offsets" check), so the kernel places its tiles itself and hands TVM a
        single allocation. Tiles never share bytes; each starts at a multiple of 16 bytes (vector loads), so
        every offset is a whole number of elements of any tile type.
        """
        offset = 0
        views: list[tuple[str, tuple[int, ...], str, int]] = []
        for r, name in self.buffers.items():
            dtype = self._buf_dtype(r)
            shape = self.sc.buf_shape(self.tile(r).shape)
            views.append((name, shape, dtype, offset // dtype_bytes(dtype)))
            offset += -(-math.prod(shape) * dtype_bytes(dtype) // _ARENA_ALIGN) * _ARENA_ALIGN
        # The arena has a tile's element type: TVM's StorageRewrite retypes an allocation whose every access has
        # one type to that type *keeping its element count*, so a uint8 arena of float32 tiles would grow 4x.
        arena = max((dtype for _, _, dtype, _ in views), key=dtype_bytes)
        self.w.line(f'smem = T.alloc_buffer(({offset // dtype_bytes(arena)},), "{arena}", scope="shared.dyn")')
        for name, shape, dtype, elem_offset in views:
            self.w.line(f'{name} = T.decl_buffer({_shape(shape)}, "{dtype}", data=smem.data, '
                        f'elem_offset={elem_offset}, scope="shared.dyn")')

    def params(self) -> list[KernelParam]:
        ps: list[KernelParam] = []
        for i, ref in enumerate(self.op.inputs):
            t = self.info.of(ref)
            ps.append(KernelParam(f"in{i}", "input", ref, self.sc.buf_shape(t.shape), self.sc.buf_dtype(t.dtype)))
        node_id = len(self.g.inputs) + self.k
        for s, t in enumerate(self.binfo.outputs):
            ps.append(KernelParam(f"out{s}", "output", Ref(node_id, s), self.sc.buf_shape(t.shape),
                                  self.sc.buf_dtype(t.dtype)))
        if self.sc.field:
            ps.append(KernelParam("F", "field", None, (FIELD_PARAMS,), "int64"))
        return ps

    def body(self) -> None:
        self.allocate()
        loop = self.block.forloop > 1
        nodes = list(enumerate(self.nodes))
        # A loop-invariant tile is loaded once before the loop, unless the load itself feeds an accumulator.
        hoisted = [j for j, n in nodes if loop and isinstance(n, InputIterator) and n.fmap is None
                   and not self.sinks_of(Ref(j))]
        computed = [j for j, n in nodes if j not in self.views and isinstance(n, InputIterator | BlockOp | ThreadGraph)]
        body = [j for j in computed if self.phase_of[j] == "body" and j not in hoisted]
        post = [j for j in computed if self.phase_of[j] == "post"]
        copies = [(j, n) for j, n in nodes if isinstance(n, Accumulator | OutputSaver) and j not in
                  self.sinks_of(n.input)]
        for j in hoisted:
            self.phase(j)
        with self.w.loop("it", self.block.forloop, f"T.serial({self.block.forloop})") if loop else nullcontext():
            for j in body:
                self.phase(j)
            for j, n in copies:
                if isinstance(n, Accumulator):
                    self.phase_copy(n.input, [j])
            if loop and not self._synced:
                self.sync()  # the next iteration overwrites tiles this one read
        self.phase_flush()
        for j in post:
            self.phase(j)
        for j, n in copies:
            if isinstance(n, OutputSaver):
                self.phase_copy(n.input, [j])

    def emit(self) -> KernelText:
        params = self.params()
        with self.grid():
            self.body()
        sig = ", ".join(f'{p.name}: T.Buffer({_shape(p.shape)}, "{p.dtype}")' for p in params)
        explicit = f', "{EXPLICIT_BARRIERS}": True' if self.dynamic_shared else ""
        head = [
            "@T.prim_func",
            f"def {self.name}({sig}):",
            f'    T.func_attr({{"global_symbol": "{self.name}", "tir.noalias": True{explicit}}})',
        ]
        text = "\n".join(head) + "\n" + self.w.text()
        return KernelText(self.name, self.k, text, tuple(params), self.block.grid, self.nt, self.choice.rule)

    @contextmanager
    def grid(self) -> Iterator[None]:
        dims = [(g, n) for g, n in enumerate(self.block.grid) if g == 0 or n > 1]
        with _nest(self.w, [self._grid_header(g, n, first=i == 0) for i, (g, n) in enumerate(dims)]):
            yield

    def _grid_header(self, g: int, n: int, first: bool) -> str:
        var = _GRID_VARS[g]
        if self.gpu:
            return f'for {var} in T.thread_binding({n}, thread="blockIdx.{"xyz"[g]}"):'
        return f"for {var} in {'T.parallel' if first else 'T.serial'}({n}):"


def _check_tiling(t: MatmulTiling, threads: int) -> None:
    """A tiling must nest (``1 <= T0 <= T1 <= extent``, vthreads a power of two dividing T0) and fill the block."""
    for ax in range(3):
        t0, t1, e, v = t.t0[ax], t.t1[ax], t.extents[ax], t.vthreads[ax]
        if not 1 <= t0 <= t1 <= e or v < 1 or v & (v - 1) or t0 % v:
            raise UnsupportedOpError(f"matmul tiling {t.describe()} does not nest on axis {'bij'[ax]} "
                                     f"(T0={t0}, T1={t1}, extent={e}, vthreads={v})")
    if t.threads != threads:
        raise UnsupportedOpError(f"matmul tiling needs {t.threads} threads, the block has {threads}")


@contextmanager
def _nest(w: Writer, headers: list[str]) -> Iterator[None]:
    if not headers:
        yield
        return
    with w.block(headers[0]), _nest(w, headers[1:]):
        yield


def _unroll(n: int) -> str:
    return f"T.unroll({n})" if n > 1 else "range"


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _atomic(e: str) -> bool:
    return e.replace("_", "").isalnum() or (e.endswith("]") and e.count("[") == 1 and "(" not in e)


def _broadcast_all(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    nd = max(len(s) for s in shapes)
    out = [1] * nd
    for s in shapes:
        for i, n in enumerate(s):
            d = nd - len(s) + i
            out[d] = max(out[d], n)
    return tuple(out)


def _broadcast_guard(idx: list[Ix], shape: tuple[int, ...], space: tuple[int, ...]) -> list[str]:
    """Conditions under which element ``idx`` of ``space`` is the one that stores its broadcast source element."""
    lead = len(space) - len(shape)
    conds = []
    for d, n in enumerate(space):
        own = shape[d - lead] if d >= lead else 1
        if own == 1 and n > 1:
            conds.append(f"{idx[d]} == 0")
    return conds


def emit_graph_defined(g: KernelGraph, k: int, info: GraphInfo, choice: ThreadChoice, *, target: Target,
                       scalar: Scalar, name: str) -> KernelText:
    """TVMScript text of graph-defined op ``k`` of ``g`` (see the module docstring).

    Parameters
    ----------
    g, k, info
        The µGraph, the kernel op index and the validated shapes (:func:`gensorage.ugraph.validate`).
    choice
        Threads per block and the matmul tiling (:func:`plan_threads`).
    target
        ``"cuda"`` (thread-bound, shared memory, barriers) or ``"llvm"`` (the same loops, runnable on the CPU).
    scalar
        :class:`~gensorage.codegen.scalar.FloatScalar` or :class:`~gensorage.codegen.scalar.FieldScalar`.
    name
        The PrimFunc's name (a Python identifier).

    Raises
    ------
    UnsupportedOpError
        A dtype, op or grid the generator cannot emit correctly.
    """
    return _BlockEmitter(g, k, info, choice, target, scalar, name).emit()


__all__ = ["MAX_ELEMENTS", "TARGETS", "KernelParam", "KernelText", "Target", "compute_dtype", "emit_graph_defined",
           "plan_threads"]

"""A graph-defined kernel op of a µGraph lowered to one TVM PrimFunc (emitted as TVMScript text).

Structure of the emitted kernel (``target="cuda"``)::

    for bx in T.thread_binding(grid_x, thread="blockIdx.x"):      # (by, bz for 2-3 grid dims)
        s3 = T.alloc_buffer(tile, dtype, scope="shared")          # one per materialised block tensor
        <phases of loop-invariant input iterators>
        for it in range(forloop):                                  # the block graph's for-loop
            <phase> T.tvm_storage_sync("shared") <phase> ...       # loop body, in node order
        <post-loop phases>

A *phase* is one ``for tx in T.thread_binding(threads, thread="threadIdx.x")`` loop in which the block's
threads share one node's work: loading an iterator's tile (cooperatively, element ``e * threads + tx``),
one block op on shared tiles, or a whole thread graph (each thread runs the fused chain for its elements in
``scope="local"`` temporaries, with no shared-memory round trip between the chain's ops). A barrier follows
every phase that wrote shared memory. How the dominant matmul is tiled over the threads (and how many threads
there are) comes from the Markov construction: see :mod:`gensorage.codegen.block_threads`.

Semantics (:mod:`gensorage.ugraph.ir`, reproduced by :mod:`gensorage.ugraph.evaluate`):

- iterator tile offset along data dim ``d``: each grid dim ``g`` with ``imap[g] = d`` splits what the previous
  splits left (x, y, z in order), then the for-loop splits along ``fmap``;
- reshape and repeat are index arithmetic on their source (views), never copies; concat copies its parts;
- an accumulator is a shared buffer combined with ``sum``/``max`` (``it == 0`` stores) or written at offset
  ``it * tile`` along its ``fmap``; when its input is computed by a block op, thread graph or iterator the
  combine happens inside that producer's phase (no intermediate tile);
- an output saver writes its tile to ``out[..., b_g * tile_d + i_d, ...]`` for ``omap[g] = d``; savers of a
  computed value are fused into the producer's phase the same way.

``target="llvm"`` emits the same text with the bindings turned into loops (``T.parallel`` over blockIdx.x,
serial loops otherwise), shared buffers in global scope and no barriers: every index expression is literally
the same, so running it on the CPU checks the GPU kernel's index arithmetic (not races or barriers).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Literal

from gensorage.codegen.block_threads import MatmulTiling, ThreadChoice, fallback_threads, matmul_tiling
from gensorage.codegen.scalar import FIELD_PARAMS, FLOAT_DTYPES, Scalar, Val
from gensorage.codegen.tir_text import Ix, Writer, broadcast_index, index_text, reshape_index, unravel
from gensorage.errors import UnsupportedOpError
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
from gensorage.ugraph.validate import dtype_bytes, loop_phases

Target = Literal["cuda", "llvm"]
TARGETS: tuple[Target, ...] = ("cuda", "llvm")
# CUDA caps static __shared__ arrays at 48 KiB; beyond that the kernel uses dynamic shared memory.
STATIC_SHARED_LIMIT = 48 * 1024
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
    """Threads per block of graph-defined op ``k`` (see :mod:`gensorage.codegen.block_threads`)."""
    op = g.ops[k]
    binfo = info.blocks[k]
    assert isinstance(op, GraphDefinedOp) and binfo is not None
    best: tuple[int, int] | None = None
    for j, node in enumerate(op.block.nodes):
        if isinstance(node, BlockOp) and node.op is Op.MATMUL:
            work = math.prod(_matmul_dims(binfo, node, j))
            if best is None or work > best[0]:
                best = (work, j)
    if best is not None:
        j = best[1]
        node = op.block.nodes[j]
        assert isinstance(node, BlockOp)
        b, m, n, kk = _matmul_dims(binfo, node, j)
        tiling = matmul_tiling(b, m, n, kk, binfo.nodes[j][0].dtype, hw, seed)
        return ThreadChoice(tiling.threads, j, tiling, tiling.describe())
    nt = fallback_threads(_largest_tile(binfo), hw)
    return ThreadChoice(nt, None, None, f"fallback (no matmul in the block graph): {nt} threads, one per element "
                                        f"of the largest tile ({_largest_tile(binfo)}) rounded to the warp size")


# ---------------------------------------------------------------------------------------------- emission


@dataclass(frozen=True, slots=True)
class _View:
    """A reshape or repeat: element ``idx`` of this node is element ``index(idx)`` of ``src``."""

    src: Ref
    index: Callable[[list[Ix]], list[Ix]]


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
        self.buffers: dict[Ref, str] = {}
        self._check_grid()

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

    def _is_sink(self, j: int) -> bool:
        return isinstance(self.nodes[j], Accumulator | OutputSaver)

    def _fusable(self, r: Ref) -> bool:
        """Whether accumulators/savers reading ``r`` can be written from the producer's phase."""
        return r.node not in self.views and not isinstance(self.nodes[r.node], Accumulator)

    def needs_buffer(self, r: Ref) -> bool:
        if isinstance(self.nodes[r.node], Accumulator):
            return True
        if r.node in self.views:
            return False
        for c in self.consumers.get(r, []):
            if self._is_sink(c) and self._fusable(r):
                continue
            if c in self.views and not self.consumers.get(Ref(c), []):
                continue  # a dead view reads nothing
            return True
        return False

    def fused_sinks(self, r: Ref) -> list[int]:
        if not self._fusable(r):
            return []
        return [c for c in self.consumers.get(r, []) if self._is_sink(c)]

    # ------------------------------------------------------------------ value access

    def read(self, r: Ref, idx: list[Ix]) -> Val:
        view = self.views.get(r.node)
        if view is not None:
            return self.read(view.src, view.index(idx))
        t = self.tile(r)
        buf = self.buffers[r]
        return self.sc.load(buf, index_text(idx), self._buf_dtype(r, t))

    def _buf_dtype(self, r: Ref, t: TensorInfo) -> str:
        # Accumulators keep the compute precision (a float16 running sum would lose the low bits every step).
        if isinstance(self.nodes[r.node], Accumulator):
            return self.sc.acc_dtype
        return self.sc.buf_dtype(t.dtype)

    def store(self, buf: str, idx: list[Ix], v: Val, dtype: str) -> None:
        for c, e in enumerate(self.sc.store(v, dtype)):
            self.w.line(f"{self.sc.at(buf, c, index_text(idx))} = {e}")

    def temp(self, v: Val) -> Val:
        """``v`` kept in a local register (one per component)."""
        name = self.w.fresh("r")
        dtype = v.dtype
        self.w.line(f'{name} = T.alloc_buffer(({self.sc.comps},), "{dtype}", scope="local")')
        for c, e in enumerate(v.comps):
            self.w.line(f"{name}[{c}] = {e}")
        return Val(tuple(f"{name}[{c}]" for c in range(self.sc.comps)), dtype)

    def emit_value(self, r: Ref, idx: list[Ix], v: Val) -> None:
        """Write element ``idx`` of block tensor ``r``: to its shared buffer and to fused accumulators/savers."""
        writes = (r in self.buffers) + len(self.fused_sinks(r))
        if writes > 1 and not all(_atomic(e) for e in v.comps):
            v = self.temp(v)
        if r in self.buffers:
            self.store(self.buffers[r], idx, v, self._buf_dtype(r, self.tile(r)))
        for j in self.fused_sinks(r):
            self.sink(j, idx, v)

    def sink(self, j: int, idx: list[Ix], v: Val) -> None:
        node = self.nodes[j]
        if isinstance(node, OutputSaver):
            self._save(j, idx, v)
            return
        assert isinstance(node, Accumulator)
        buf = self.buffers[Ref(j)]
        if node.fmap is not None:
            shifted = list(idx)
            shifted[node.fmap] = idx[node.fmap] + Ix.var("it") * self.tile(node.input).shape[node.fmap]
            self.store(buf, shifted, v, self.sc.acc_dtype)
            return
        if not all(_atomic(e) for e in v.comps):
            v = self.temp(v)
        acc = self.sc.load(buf, index_text(idx), self.sc.acc_dtype)
        new = self.sc.combine(node.kind, acc, v)
        first = self.sc.store(v, self.sc.acc_dtype)
        for c, e in enumerate(self.sc.store(new, self.sc.acc_dtype)):
            self.w.line(f"{self.sc.at(buf, c, index_text(idx))} = T.if_then_else(it == 0, {first[c]}, {e})")

    def _save(self, j: int, idx: list[Ix], v: Val) -> None:
        node = self.nodes[j]
        assert isinstance(node, OutputSaver)
        s = self.savers.index(j)
        tile = self.tile(node.input).shape
        out = list(idx)
        for g, d in enumerate(node.omap):
            if self.block.grid[g] > 1:
                out[d] = idx[d] + Ix.var(_GRID_VARS[g]) * tile[d]
        self.store(f"out{s}", out, v, self.sc.buf_dtype(self.binfo.outputs[s].dtype))

    # ------------------------------------------------------------------ loops

    @contextmanager
    def threads(self) -> Iterator[None]:
        kind = f'T.thread_binding({self.nt}, thread="threadIdx.x")' if self.gpu else f"T.serial({self.nt})"
        with self.w.block(f"for tx in {kind}:"):
            yield

    def sync(self) -> None:
        if self.gpu:
            self.w.line('T.tvm_storage_sync("shared")')

    @contextmanager
    def elements(self, shape: tuple[int, ...]) -> Iterator[list[Ix]]:
        """Inside a thread loop: element ``e * threads + tx`` of ``shape`` for every ``e`` (guarded)."""
        n = math.prod(shape)
        iters = -(-n // self.nt)
        with self.w.loop(self.w.fresh("e"), iters) as e:
            flat = e * self.nt + Ix.var("tx")
            guard = self.w.block(f"if {flat} < {n}:") if iters * self.nt > n else nullcontext()
            with guard:
                if len(flat.terms) > 1 or flat.const:
                    f = self.w.fresh("f")
                    self.w.line(f"{f} = {flat}")
                    flat = Ix.var(f)
                yield unravel(flat, shape)

    # ------------------------------------------------------------------ phases

    def phase_load(self, j: int) -> None:
        node = self.nodes[j]
        assert isinstance(node, InputIterator)
        src = self.op.inputs[node.input]
        shape = self.info.of(src).shape
        tile = self.tile(Ref(j)).shape
        ext, off = list(shape), [Ix() for _ in shape]
        for g, d in enumerate(node.imap):
            if d is not None and self.block.grid[g] > 1:
                ext[d] //= self.block.grid[g]
                off[d] = off[d] + Ix.var(_GRID_VARS[g]) * ext[d]
        if node.fmap is not None:
            ext[node.fmap] //= self.block.forloop
            off[node.fmap] = off[node.fmap] + Ix.var("it") * ext[node.fmap]
        dtype = self.sc.buf_dtype(self.info.of(src).dtype)
        with self.threads(), self.elements(tile) as idx:
            gidx = [o + i for o, i in zip(off, idx, strict=True)]
            self.emit_value(Ref(j), idx, self.sc.load(f"in{node.input}", index_text(gidx), dtype))

    def phase_op(self, j: int) -> None:
        node = self.nodes[j]
        assert isinstance(node, BlockOp)
        out = self.tile(Ref(j)).shape
        if node.op is Op.MATMUL:
            if self.choice.matmul_node is not None and self.choice.tiling is not None and \
                    self._same_tile(j, self.choice.tiling):
                self.phase_matmul_tiled(j, node, self.choice.tiling)
            else:
                self.phase_matmul_cyclic(j, node)
        elif node.op is Op.SUM:
            self.phase_sum(j, node)
        elif node.op is Op.CONCAT:
            self.phase_concat(j, node)
        elif node.op in BINARY_ELEMENTWISE or node.op in UNARY_ELEMENTWISE:
            with self.threads(), self.elements(out) as idx:
                args = [self.read(r, broadcast_index(idx, self.tile(r).shape)) for r in node.inputs]
                self.emit_value(Ref(j), idx, self.sc.op(self.w, node.op, node.attrs, args))
        else:
            raise UnsupportedOpError(f"block op '{node.op.value}' has no code generator")

    def _same_tile(self, j: int, tiling: MatmulTiling) -> bool:
        node = self.nodes[j]
        assert isinstance(node, BlockOp)
        b, m, n, k = _matmul_dims(self.binfo, node, j)
        return (b, m, n) == tiling.extents and k == tiling.k

    def _matmul_operands(self, node: BlockOp, j: int) -> tuple[Ref, Ref, tuple[int, ...]]:
        a, b = node.inputs
        return a, b, self.tile(Ref(j)).shape[:-2]

    def _mac(self, acc: str, r: Ix, a: Val, b: Val) -> None:
        cur = self.sc.load(acc, str(r), self.sc.acc_dtype)
        nxt = self.sc.plus(cur, self.sc.product(a, b))
        for c, e in enumerate(nxt.comps):
            self.w.line(f"{self.sc.at(acc, c, str(r))} = {e}")

    def _acc_buffer(self, size: int) -> str:
        acc = self.w.fresh("acc")
        shape = self.sc.buf_shape((size,))
        self.w.line(f'{acc} = T.alloc_buffer({_shape(shape)}, "{self.sc.acc_dtype}", scope="local")')
        return acc

    def _zero(self, acc: str, r: Ix) -> None:
        for c, e in enumerate(self.sc.zero().comps):
            self.w.line(f"{self.sc.at(acc, c, str(r))} = {e}")

    def phase_matmul_cyclic(self, j: int, node: BlockOp) -> None:
        """One thread per output element (cyclic), the whole inner dim in one register."""
        a, b, batch = self._matmul_operands(node, j)
        kdim = self.tile(a).shape[-1]
        with self.threads(), self.elements(self.tile(Ref(j)).shape) as idx:
            acc = self._acc_buffer(1)
            self._zero(acc, Ix())
            with self.w.loop(self.w.fresh("k"), kdim) as kk:
                av = self.read(a, broadcast_index(idx[:-2], self.tile(a).shape[:-2]) + [idx[-2], kk])
                bv = self.read(b, broadcast_index(idx[:-2], self.tile(b).shape[:-2]) + [kk, idx[-1]])
                self._mac(acc, Ix(), av, bv)
            self.emit_value(Ref(j), idx, self.sc.reduced(self.sc.load(acc, "0", self.sc.acc_dtype)))

    def phase_matmul_tiled(self, j: int, node: BlockOp, t: MatmulTiling) -> None:
        """The constructor's register tiling: per thread a T0 tile of accumulators, T1 tiles walked in turn."""
        a, b, batch = self._matmul_operands(node, j)
        kdim = t.k
        th = t.threads_per_axis
        coords = [Ix.var("tx").floordiv(th[1] * th[2], self.nt).mod(th[0], -(-self.nt // (th[1] * th[2]))),
                  Ix.var("tx").floordiv(th[2], self.nt).mod(th[1], -(-self.nt // th[2])),
                  Ix.var("tx").mod(th[2], self.nt)]
        regs = math.prod(t.t0)
        with self.threads():
            acc = self._acc_buffer(regs)
            with self._steps(t) as steps:
                with self.w.loop(self.w.fresh("r"), regs, "T.unroll(%d)" % regs if regs > 1 else "range") as r:
                    self._zero(acc, r)
                with self.w.loop(self.w.fresh("k"), kdim) as kk, self._register_tile(t, steps, coords) as (r, g):
                    av = self.read(a, broadcast_index(self._batch(g[0], batch), self.tile(a).shape[:-2]) + [g[1], kk])
                    bv = self.read(b, broadcast_index(self._batch(g[0], batch), self.tile(b).shape[:-2]) + [kk, g[2]])
                    self._mac(acc, r, av, bv)
                with self._register_tile(t, steps, coords) as (r, g):
                    v = self.sc.reduced(self.sc.load(acc, str(r), self.sc.acc_dtype))
                    self.emit_value(Ref(j), self._batch(g[0], batch) + [g[1], g[2]], v)

    @staticmethod
    def _batch(flat: Ix, batch: tuple[int, ...]) -> list[Ix]:
        return unravel(flat, batch) if batch else []

    @contextmanager
    def _steps(self, t: MatmulTiling) -> Iterator[list[Ix]]:
        steps: list[Ix] = []
        with self.w.loop(self.w.fresh("sb"), t.steps[0]) as sb, self.w.loop(self.w.fresh("si"), t.steps[1]) as si, \
                self.w.loop(self.w.fresh("sj"), t.steps[2]) as sj:
            steps = [sb, si, sj]
            yield steps

    @contextmanager
    def _register_tile(self, t: MatmulTiling, steps: list[Ix], coords: list[Ix]) -> Iterator[tuple[Ix, list[Ix]]]:
        """Loops over a thread's register tile; yields (register index, output coords (b, i, j)), guarded."""
        names = [self.w.fresh(p) for p in ("rb", "ri", "rj")]
        th = t.threads_per_axis
        with self.w.loop(names[0], t.t0[0], _unroll(t.t0[0])) as rb, \
                self.w.loop(names[1], t.t0[1], _unroll(t.t0[1])) as ri, \
                self.w.loop(names[2], t.t0[2], _unroll(t.t0[2])) as rj:
            regs = [rb, ri, rj]
            pos, glob, conds = [], [], []
            for ax in range(3):
                chunk = t.t0[ax] // t.vthreads[ax]
                p = regs[ax].floordiv(chunk, t.t0[ax]) * (th[ax] * chunk) + coords[ax] * chunk + \
                    regs[ax].mod(chunk, t.t0[ax])
                gl = steps[ax] * t.t1[ax] + p
                if th[ax] * t.t0[ax] > t.t1[ax]:
                    conds.append(f"{p} < {t.t1[ax]}")
                if t.steps[ax] * t.t1[ax] > t.extents[ax]:
                    conds.append(f"{gl} < {t.extents[ax]}")
                pos.append(p)
                glob.append(gl)
            r = rb * (t.t0[1] * t.t0[2]) + ri * t.t0[2] + rj
            guard = self.w.block(f"if {' and '.join(conds)}:") if conds else nullcontext()
            with guard:
                yield r, glob

    def phase_sum(self, j: int, node: BlockOp) -> None:
        x = node.inputs[0]
        shape = self.tile(x).shape
        dim = int(attr(node.attrs, "dim")) % len(shape)
        keep = bool(attr(node.attrs, "keepdim", True))
        group = attr(node.attrs, "group")
        full = group is None or group == shape[dim]
        count = shape[dim] if full else int(group)
        with self.threads(), self.elements(self.tile(Ref(j)).shape) as idx:
            acc = self._acc_buffer(1)
            self._zero(acc, Ix())
            with self.w.loop(self.w.fresh("g"), count) as gi:
                if full and keep:
                    src = idx[:dim] + [gi] + idx[dim + 1:]
                elif full:
                    src = idx[:dim] + [gi] + idx[dim:]
                else:
                    src = idx[:dim] + [idx[dim] * count + gi] + idx[dim + 1:]
                cur = self.sc.load(acc, "0", self.sc.acc_dtype)
                for c, e in enumerate(self.sc.plus(cur, self.read(x, src)).comps):
                    self.w.line(f"{self.sc.at(acc, c, '0')} = {e}")
            self.emit_value(Ref(j), idx, self.sc.reduced(self.sc.load(acc, "0", self.sc.acc_dtype)))

    def phase_concat(self, j: int, node: BlockOp) -> None:
        out = self.tile(Ref(j)).shape
        dim = int(attr(node.attrs, "dim")) % len(out)
        offset = 0
        with self.threads():
            for r in node.inputs:
                part = self.tile(r).shape
                with self.elements(part) as idx:
                    dst = list(idx)
                    dst[dim] = idx[dim] + offset
                    self.emit_value(Ref(j), dst, self.read(r, idx))
                offset += part[dim]

    def phase_thread_graph(self, j: int) -> None:
        node = self.nodes[j]
        assert isinstance(node, ThreadGraph)
        local = self.binfo.threads[j]
        space = _broadcast_all([t.shape for t in local])
        with self.threads(), self.elements(space) as idx:
            vals: list[Val] = []
            for r, t in zip(node.inputs, local, strict=False):
                vals.append(self.temp(self.read(r, broadcast_index(idx, t.shape))))
            for top in node.ops:
                vals.append(self.temp(self.sc.op(self.w, top.op, top.attrs, [vals[r.node] for r in top.inputs])))
            for o, r in enumerate(node.outputs):
                shape = local[r.node].shape
                conds = _broadcast_guard(idx, shape, space)
                with self.w.block(f"if {' and '.join(conds)}:") if conds else nullcontext():
                    self.emit_value(Ref(j, o), broadcast_index(idx, shape), vals[r.node])

    def phase_copy(self, src: Ref, sinks: list[int]) -> None:
        """Accumulators/savers that read a view or an accumulator: their own phase over the value."""
        with self.threads(), self.elements(self.tile(src).shape) as idx:
            v = self.read(src, idx)
            for s in sinks:
                self.sink(s, idx, v)

    def writes_shared(self, j: int) -> bool:
        refs = [Ref(j, o) for o in range(len(self.binfo.nodes[j]))]
        return any(r in self.buffers for r in refs) or any(
            isinstance(self.nodes[s], Accumulator) for r in refs for s in self.fused_sinks(r))

    def phase(self, j: int) -> None:
        node = self.nodes[j]
        if isinstance(node, InputIterator):
            self.phase_load(j)
        elif isinstance(node, ThreadGraph):
            self.phase_thread_graph(j)
        else:
            self.phase_op(j)
        if self.writes_shared(j):
            self.sync()

    # ------------------------------------------------------------------ whole kernel

    def allocate(self) -> None:
        total = 0
        for j, outs in enumerate(self.binfo.nodes):
            for o, t in enumerate(outs):
                r = Ref(j, o)
                if not self.needs_buffer(r):
                    continue
                self.buffers[r] = f"s{j}" if len(outs) == 1 else f"s{j}_{o}"
                dtype = self._buf_dtype(r, t)
                total += math.prod(self.sc.buf_shape(t.shape)) * dtype_bytes(dtype)
        scope = ("shared.dyn" if total > STATIC_SHARED_LIMIT else "shared") if self.gpu else "global"
        for r, name in self.buffers.items():
            t = self.tile(r)
            shape = self.sc.buf_shape(t.shape)
            self.w.line(f'{name} = T.alloc_buffer({_shape(shape)}, "{self._buf_dtype(r, t)}", scope="{scope}")')

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
        hoisted = [j for j, n in enumerate(self.nodes) if loop and isinstance(n, InputIterator) and n.fmap is None]
        body = [j for j, n in enumerate(self.nodes)
                if self.phase_of[j] == "body" and j not in hoisted and j not in self.views]
        post = [j for j, n in enumerate(self.nodes) if self.phase_of[j] == "post" and j not in self.views
                and not isinstance(n, Accumulator)]
        acc_copies = [j for j, n in enumerate(self.nodes) if isinstance(n, Accumulator) and not self._fusable(n.input)]
        save_copies = [j for j, n in enumerate(self.nodes)
                       if isinstance(n, OutputSaver) and not self._fusable(n.input)]
        for j in hoisted:
            self.phase(j)
        with self.w.loop("it", self.block.forloop, "T.serial(%d)" % self.block.forloop) if loop else nullcontext():
            for j in body:
                self.phase(j)
            for j in acc_copies:
                node = self.nodes[j]
                assert isinstance(node, Accumulator)
                self.phase_copy(node.input, [j])
                self.sync()
        for j in post:
            self.phase(j)
        for j in save_copies:
            node = self.nodes[j]
            assert isinstance(node, OutputSaver)
            self.phase_copy(node.input, [j])

    def emit(self) -> KernelText:
        params = self.params()
        with self.grid():
            self.body()
        sig = ", ".join(f'{p.name}: T.Buffer({_shape(p.shape)}, "{p.dtype}")' for p in params)
        head = [
            "@T.prim_func",
            f"def {self.name}({sig}):",
            f'    T.func_attr({{"global_symbol": "{self.name}", "tir.noalias": True}})',
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

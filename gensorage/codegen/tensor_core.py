"""Tensor-core matmul kernels: a TIR schedule with TVM's registered ldmatrix / mma.sync intrinsics.

The matmul PrimFunc (``C[b, i, j] += A[.., i, k] * B[.., k, j]`` accumulated in float32, then cast to the
output dtype by a consumer block) is scheduled into the shape of a CUTLASS-style tensor-core GEMM:

* the 16 x 16 x 16 MMA tile is made a block (``blockize``) and tensorized with TVM's ``mma_f16f16f32``
  (two ``mma.sync.m16n8k16`` per tile) and ``mma_fill`` intrinsics;
* the output is tiled ``[grid, warps, warp tiles]`` per spatial axis: a thread block computes a
  ``block_m x block_n`` tile with ``(block_m / warp_m) * (block_n / warp_n)`` warps, each warp a
  ``warp_m x warp_n`` tile of 16 x 16 MMA tiles whose float32 accumulators stay in registers ("warp" scope in
  the ldmatrix fragment layout);
* per ``block_k`` step both operand tiles are copied global -> shared (16-byte vectors, all threads) and
  the fragments loaded shared -> registers with ``ldmatrix`` (the B operand with ``.trans``); an operand stored
  transposed (``TensorCoreTiles.layout``: B as ``[n, k]``, ``x @ W.T`` read in place; A as ``[k, m]``) keeps its
  layout in shared memory, so the copies still run along its contiguous dim, and is loaded with the other
  ``ldmatrix`` (B without ``.trans``, A with it) and the MMA intrinsic of that layout; the shared rows are
  padded by 8 elements (``storage_align``) so the eight 16-byte rows an ``ldmatrix`` reads fall in distinct
  banks (conflict-free by padding rather than by an XOR swizzle);
* with ``stages >= 2`` the reduction loop is software-pipelined and the global -> shared copies become
  ``cp.async`` (``tirx.use_async_copy``): ``stages`` shared buffers in flight;
* the accumulators go back through shared memory (float32, padded), and the copy to global memory does the
  cast to the output dtype (the cast block is inlined into it) with coalesced vector stores;
* with ``split_k > 1`` (2-D matmuls with few output tiles) the reduction is cut into ``split_k`` slices: the
  grid's y dimension runs the slices, each writes its float32 partial tile to a scratch parameter, and a
  second kernel adds the slices and casts.

Extents that are not multiples of the tiles are padded (``pad_einsum``): the padded loads read zeros and the
padded outputs are never written.

The CPU twin (``gpu=False``) runs the same program without thread bindings and without tensorization: the
splits, the shared and register stages, the fragment layout transform (the ldmatrix thread/element index map),
the padding and the write-back run on llvm, with each 16 x 16 x 16 MMA tile computed by its scalar semantics
(the intrinsic's description is the loop it replaces).
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any

from gensorage.errors import ScheduleError, first_line

MMA = 16  # the m16n8k16 instruction pair covers a 16 x 16 x 16 tile
WARP = 32
MMA_DTYPES = ("float16", "bfloat16")  # operand dtypes this lowering emits MMA for
LAYOUTS = ("nn", "nt", "tn", "tt")  # which operand is stored transposed (A [k, m], B [n, k])


def mma_dtype(a: str, b: str) -> str | None:
    """The MMA operand dtype of a matmul of ``a`` by ``b`` (None: not on tensor cores).

    Two equal 16-bit dtypes multiply as they are. A float32 operand (an intermediate the precision policy
    keeps wide, e.g. a normalised activation) with a 16-bit one multiplies in bfloat16: its range is float32's,
    so nothing overflows, at 8 significant bits per operand (the products accumulate in float32).
    """
    if a == b and a in MMA_DTYPES:
        return a
    if {a, b} <= {"float32", *MMA_DTYPES} and {a, b} & set(MMA_DTYPES):
        return "bfloat16"
    return None


RULE = "tensor-core"  # how a kernel's rule names this lowering
VECTOR = 8  # 16-bit elements per 16-byte copy from global to shared memory
CONVERT_VECTOR = 4  # elements per converting copy (16 bytes of a float32 operand)


@dataclass(frozen=True, slots=True)
class TensorCoreTiles:
    """The levels of a tensor-core kernel: block tile, warp tile, reduction step and pipeline stages."""

    block_m: int
    block_n: int
    block_k: int
    warp_m: int
    warp_n: int
    stages: int
    fragment_pipeline: bool = True  # load the next k step's fragments while this step's MMAs run
    split_k: int = 1  # the reduction split over this many blocks, whose float32 partials a second kernel adds
    layout: str = "nn"  # operands stored transposed: "nt" B as [n, k] (x @ W.T), "tn" A as [k, m], "tt" both

    @property
    def warps(self) -> int:
        return (self.block_m // self.warp_m) * (self.block_n // self.warp_n)

    @property
    def threads(self) -> int:
        return self.warps * WARP

    def describe(self) -> str:
        return (
            f"block {self.block_m}x{self.block_n}x{self.block_k}, warp {self.warp_m}x{self.warp_n}, "
            f"{self.stages} stage{'s' if self.stages > 1 else ''}"
            + ("" if self.fragment_pipeline else ", fragments not pipelined")
            + (f", split-k {self.split_k}" if self.split_k > 1 else "")
            + (f", layout {self.layout.upper()}" if self.layout != "nn" else "")
        )

    def invalid(self) -> str | None:
        """Why these tiles cannot be scheduled (None when they can)."""
        for name, v in (("block_m", self.block_m), ("block_n", self.block_n), ("block_k", self.block_k)):
            if v < MMA or v % MMA:
                return f"{name}={v} is not a positive multiple of {MMA}"
        for name, v, whole in (("warp_m", self.warp_m, self.block_m), ("warp_n", self.warp_n, self.block_n)):
            if v < MMA or v % MMA or whole % v:
                return f"{name}={v} must be a multiple of {MMA} dividing the block tile {whole}"
        if self.threads > 1024:
            return f"{self.threads} threads per block exceed 1024"
        if self.stages < 1:
            return f"stages={self.stages} must be at least 1"
        if self.split_k < 1 or self.split_k & (self.split_k - 1):
            return f"split_k={self.split_k} must be a power of two"
        if self.layout not in LAYOUTS:
            return f"layout={self.layout!r} is not one of {LAYOUTS}"
        return None


def shared_bytes(t: TensorCoreTiles, in_bytes: int = 2) -> int:
    """Dynamic shared memory of one block: padded operand stages, or the padded float32 output staging.

    A shared tile keeps its operand's layout, rows padded: A ``[block_m, block_k + 8]`` (``[block_k,
    block_m + 8]`` stored transposed), B ``[block_k, block_n + 8]`` (``[block_n, block_k + 8]``)."""
    pad = 8
    a = t.block_k * (t.block_m + pad) if t.layout[0] == "t" else t.block_m * (t.block_k + pad)
    b = t.block_n * (t.block_k + pad) if t.layout[1] == "t" else t.block_k * (t.block_n + pad)
    operands = t.stages * (a + b) * in_bytes
    output = t.block_m * (t.block_n + 4) * 4
    # TVM merges the dynamic shared allocations of disjoint lifetimes; count the larger one.
    return max(operands, output)


def build_config(rules: Any) -> dict[str, Any]:
    """The PassContext config a module with these kernels' rules needs: ``cp.async`` for pipelined MMA loops."""
    return {"tirx.use_async_copy": 1} if any(r.startswith(RULE) for r in rules) else {}


@dataclass(frozen=True, slots=True)
class Intrinsics:
    """The names of the tensor intrinsics one operand dtype is tensorized with."""

    load_a: str
    load_b: str
    mma: str
    fill: str
    store: str


@contextmanager
def _stack_without_source() -> Iterator[None]:
    """``inspect.stack()`` without the source file and lines of each frame, while TVM's intrinsics register.

    TVM's ``prim_func`` decorator calls ``inspect.stack()``, which looks up each frame's source file: for frames
    of ``<frozen importlib>`` that searches every module in ``sys.modules``, so registering the 500 intrinsics
    took 35 s on the development machine, over 60 s with torch loaded. The decorator uses the frames themselves
    (closure variables) and a frame's source line only to detect an ``@I.ir_module`` class, which the
    intrinsics modules do not have.
    """
    full = inspect.stack

    def frames(context: int = 1) -> list[inspect.FrameInfo]:
        out = []
        frame = sys._getframe(1)
        while frame is not None:
            code = frame.f_code
            out.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name, None, None))
            frame = frame.f_back  # type: ignore[assignment]
        return out

    inspect.stack = frames
    try:
        yield
    finally:
        inspect.stack = full


@cache
def intrinsics(dtype: str, layout: str = "nn") -> Intrinsics:
    """TVM's float16 intrinsics, or the bfloat16 ones of :mod:`gensorage.codegen.mma_bfloat16`, for operands
    stored as ``layout`` says.

    A B stored ``[n, k]`` (k contiguous) is what ``ldmatrix`` without ``.trans`` loads into the ``mma.sync``
    ``col`` operand (TVM's ``*_b_trans`` intrinsics, named after the stored B); the usual ``[k, n]`` B needs
    ``.trans``. An A stored ``[k, m]`` is loaded with ``.trans`` (``*_a_trans``). The MMA intrinsic of the
    layout reads its fragments with the same index map. Importing TVM's CUDA intrinsics registers them, which
    takes seconds once per process: only the GPU schedule asks for them.
    """
    with _stack_without_source():
        return _intrinsics(dtype, layout[0] == "t", layout[1] == "t")


def _intrinsics(dtype: str, ta: bool, tb: bool) -> Intrinsics:
    from tvm.s_tir.tensor_intrin import cuda

    fill, store = cuda.MMA_fill_16x16_f32_INTRIN, cuda.MMA_store_16x16_f32_shared_dyn_INTRIN_SIMPLE
    if dtype == "float16":
        mma = {
            (False, False): cuda.MMA_f16f16f32_INTRIN,
            (False, True): cuda.MMA_f16f16f32_TRANS_B_INTRIN,
            (True, False): cuda.MMA_f16f16f32_TRANS_A_INTRIN,
            (True, True): cuda.MMA_f16f16f32_TRANS_A_TRANS_B_INTRIN,
        }[ta, tb]
        return Intrinsics(
            cuda.LDMATRIX_f16_A_TRANS_DYN_INTRIN if ta else cuda.LDMATRIX_f16_A_DYN_INTRIN,
            cuda.LDMATRIX_f16_B_TRANS_DYN_INTRIN if tb else cuda.LDMATRIX_f16_B_DYN_INTRIN,
            mma,
            fill,
            store,
        )
    if dtype == "bfloat16":
        from gensorage.codegen import mma_bfloat16 as bf

        bf.register()
        return Intrinsics(
            bf.ldmatrix_name("A", ta), bf.ldmatrix_name("B", tb), bf.mma_name(ta, tb), fill, store
        )
    raise ScheduleError(f"tensor-core schedule: no MMA intrinsics for operand dtype {dtype}")


def fragment_lane(i: Any, j: Any) -> tuple[Any, Any]:
    """(lane, element) holding element (i, j) of a 16 x 16 tile in the m16n8k16 fragment layout.

    The PTX ISA's layout of the A/C fragments of ``mma.m16n8k16`` (and what ``ldmatrix.x4`` loads): lane
    ``4 * (i % 8) + (j % 8) // 2`` holds the pair of columns ``j % 8 // 2 * 2, +1`` of row ``i % 8`` in each of
    the four 8 x 8 quadrants, ordered (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (rows 0-7, cols 8-15), ...
    The same layout as TVM's ``shared_16x16_to_ldmatrix_32x8_layout``, which its mma/ldmatrix intrinsics assume;
    computing it here keeps the CPU twin free of importing the intrinsics.
    """
    return 4 * (i % 8) + (j % 8) // 2, 4 * (j // 8) + (i // 8) * 2 + j % 2


def _fragment_map(i: Any, j: Any) -> tuple[Any, ...]:
    """(tile row, tile col, lane, element) of element (i, j): the ldmatrix / mma fragment layout."""
    lane, elem = fragment_lane(i % MMA, j % MMA)
    return (i // MMA, j // MMA, lane, elem)


def _batched_fragment_map(b: Any, i: Any, j: Any) -> tuple[Any, ...]:
    return (b, *_fragment_map(i, j))


def _layout(sch: Any, block: Any, buffer: tuple[str, int], batched: bool) -> None:
    sch.transform_layout(block, buffer, _batched_fragment_map if batched else _fragment_map)


def schedule_tensor_core(
    func: Any, tiles: TensorCoreTiles, *, gpu: bool = True, gather: bool = False, convert: bool = False
) -> Any:
    """Schedule a matmul PrimFunc (blocks ``C`` and an optional cast ``D``) onto tensor cores.

    Parameters
    ----------
    func
        A PrimFunc whose reduction block ``C`` is ``C[.., i, j] += float32(A[.., i, k]) * float32(B[.., k, j])``
        with 16-bit operands (read directly, or produced by conversions ``A_mma`` / ``B_mma``, which are inlined
        into the shared copies); a consumer block ``D`` (the cast) is inlined into the write-back.
    tiles
        Block, warp and reduction tiles and the pipeline depth.
    gpu
        False gives the CPU twin: the same schedule without thread bindings and tensorization.
    gather
        The operands are gathered, not rows of contiguous tensors (an implicit GEMM): the copies to shared memory
        move one element per thread and step instead of 16-byte vectors (and so are not asynchronous).
    convert
        The operands are converted to the MMA dtype on their way to shared memory: the copies move
        ``CONVERT_VECTOR`` elements per thread and step (not asynchronous either).

    Returns
    -------
    tvm.s_tir.Schedule

    Raises
    ------
    ScheduleError
        Tiles that do not fit, or a PrimFunc of another form (TVM's schedule error, first line).
    """
    why = tiles.invalid()
    if why is not None:
        raise ScheduleError(f"tensor-core tiles: {why}")
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    try:
        _schedule(sch, tiles, gpu=gpu, vector=1 if gather else CONVERT_VECTOR if convert else VECTOR)
    except ScheduleError:
        raise
    except Exception as exc:  # TVM's schedule errors: a PrimFunc of an unexpected form
        raise ScheduleError(f"tensor-core schedule: {first_line(exc)}") from exc
    return sch


def _schedule(sch: Any, t: TensorCoreTiles, *, gpu: bool, vector: int) -> None:
    main = sch.get_sblock("C")
    # The twins run any operand dtype (int64 residues for the field twin); MMA needs a 16-bit one.
    dtypes = sorted({str(r.source.dtype) for r in sch.get(main).reads if r.source.name != "C"})
    if gpu and (len(dtypes) != 1 or dtypes[0] not in MMA_DTYPES):
        raise ScheduleError(
            f"tensor-core schedule: operands of dtypes {dtypes}, expected one of {MMA_DTYPES}"
        )
    dtype = dtypes[0]
    ci = intrinsics(dtype, t.layout) if gpu else None
    nbatch = len(sch.get_loops(main)) - 3
    if t.split_k == 1:  # split-k's build pads its rows itself, and its slices divide n and k (construction)
        sch.pad_einsum(main, [1] * nbatch + [t.block_m, t.block_n, t.block_k])
    loops = sch.get_loops(main)
    batch, (i, j, k) = loops[:nbatch], loops[nbatch:]
    i, i_tc = sch.split(i, [None, MMA])
    j, j_tc = sch.split(j, [None, MMA])
    k, k_tc = sch.split(k, [None, MMA])
    sch.reorder(i, j, k, i_tc, j_tc, k_tc)
    outer = sch.blockize(i_tc)
    warps_m, warps_n = t.block_m // t.warp_m, t.block_n // t.warp_n
    i0, i1, i2 = sch.split(i, [None, warps_m, t.warp_m // MMA])
    j0, j1, j2 = sch.split(j, [None, warps_n, t.warp_n // MMA])
    k0, k1 = sch.split(k, [None, t.block_k // MMA])
    sch.reorder(i0, j0, i1, j1, k0, k1, i2, j2)
    bx = sch.fuse(i0, j0)
    ty = sch.fuse(i1, j1)
    if gpu:
        if batch:
            sch.bind(sch.fuse(*batch) if len(batch) > 1 else batch[0], "blockIdx.y")
        sch.bind(bx, "blockIdx.x")
        sch.bind(ty, "threadIdx.y")
    for operand in (0, 1):
        _fetch_to_shared(sch, outer, operand, k0, t.warps, vector, gpu=gpu)
    a_frag = sch.cache_read(outer, 0, "warp" if gpu else "local")
    b_frag = sch.cache_read(outer, 1, "warp" if gpu else "local")
    sch.compute_at(a_frag, k1)
    sch.compute_at(b_frag, k1)
    staged = sch.cache_write(outer, 0, "shared.dyn")
    acc = sch.cache_write(outer, 0, "warp" if gpu else "local")
    # The float32 staging rows padded by 4 words: the fragment stores of a warp spread over the banks.
    sch.storage_align(acc, 0, axis=-2, factor=16, offset=4)
    sch.reverse_compute_at(acc, ty)
    sch.reverse_compute_at(staged, ty)
    store_loop = _tile_2d(sch, acc)
    init = sch.decompose_reduction(outer, k0)
    a_loop, b_loop = _tile_2d(sch, a_frag), _tile_2d(sch, b_frag)
    batched = bool(batch)
    _layout(sch, a_frag, ("write", 0), batched and _ndim(sch, a_frag) == 3)
    _layout(sch, b_frag, ("write", 0), batched and _ndim(sch, b_frag) == 3)
    _layout(sch, acc, ("read", 0), batched)
    if t.split_k > 1:
        _add_partials(sch, t.warps, gpu=gpu)  # D adds the slices in a kernel of its own
    else:
        _inline_epilogue(sch, staged)
    _copy_out(sch, staged, t.warps, gpu=gpu)
    if ci is None:
        return
    sch.tensorize(a_loop, ci.load_a)
    sch.tensorize(b_loop, ci.load_b)
    sch.tensorize(sch.get_loops(main)[-3], ci.mma)
    sch.tensorize(sch.get_loops(sch.get_child_blocks(init)[0])[-2], ci.fill)
    sch.tensorize(store_loop, ci.store)
    inner = t.fragment_pipeline and t.block_k > MMA
    if inner:
        # Fragments of the next 16-wide k step are loaded (ldmatrix) while this step's MMAs run.
        sch.annotate(k1, "software_pipeline_stage", [0, 0, 1])
        sch.annotate(k1, "software_pipeline_order", [0, 1, 2])
    if t.stages > 1:
        # Order: copy A, copy B (stage 0, asynchronous) | fragments and MMAs (last stage). With the inner
        # pipeline the body of k0 is: copy A, copy B, the first A and B fragments, the k1 loop.
        body = 5 if inner else 3
        sch.annotate(k0, "software_pipeline_stage", [0, 0] + [t.stages - 1] * (body - 2))
        sch.annotate(k0, "software_pipeline_order", list(range(body)))
        sch.annotate(k0, "software_pipeline_async_stages", [0])


def _ndim(sch: Any, block: Any) -> int:
    return len(sch.get(block).writes[0].region)


def _tile_2d(sch: Any, block: Any) -> Any:
    """Split a fragment copy's last two loops into 16 x 16 tiles; returns the first intra-tile loop."""
    a, b = sch.get_loops(block)[-2:]
    a0, a1 = sch.split(a, [None, MMA])
    b0, b1 = sch.split(b, [None, MMA])
    sch.reorder(a0, b0, a1, b1)
    return a1


def _fetch_to_shared(
    sch: Any, block: Any, operand: int, at: Any, warps: int, vector: int, *, gpu: bool
) -> None:
    """Stage one operand tile per reduction step in shared memory, copied by all threads in 16-byte vectors."""
    stage = sch.cache_read(block, operand, "shared.dyn")
    sch.compute_at(stage, at)
    _inline_pad(sch, stage)
    fused = sch.fuse(*sch.get_loops(stage)[-2:])
    _, f1, f2, f3 = sch.split(fused, [None, warps, WARP, vector])
    if gpu:
        sch.bind(f2, "threadIdx.x")
        sch.bind(f1, "threadIdx.y")
        if vector > 1:
            sch.vectorize(f3)
    # Rows padded by 8 halves (16 bytes): the 8 rows one ldmatrix phase reads start in different banks.
    sch.storage_align(stage, 0, axis=-2, factor=32, offset=8)


def _inline_pad(sch: Any, stage: Any) -> None:
    """Every producer block of the operand (``pad_einsum``'s zero padding, an implicit GEMM's gather) is
    inlined into the shared stage, which then loads from the function's own inputs with guards."""
    while producers := sch.get_producers(stage):
        for producer in producers:
            sch.compute_inline(producer)


def _inline_epilogue(sch: Any, staged: Any) -> None:
    """Fold the consumers of the write-back (``pad_einsum``'s un-padding copy, the cast ``D``) into it."""
    while consumers := sch.get_consumers(staged):
        if len(consumers) != 1:
            raise ScheduleError("tensor-core schedule: the matmul result has several consumers")
        sch.reverse_compute_inline(consumers[0])


def _add_partials(sch: Any, warps: int, *, gpu: bool) -> None:
    """Split-k's second kernel: ``D[i, j]`` adds the ``split_k`` partials, one thread per element.

    Its blocks have the MMA kernel's shape (32 x ``warps`` threads): one PrimFunc's kernels share their
    thread extents, which is what the launch and the limits check read.
    """
    add = sch.get_sblock("D")
    fused = sch.fuse(*sch.get_loops(add))
    bx, ty, tx = sch.split(fused, [None, warps, WARP])
    if gpu:
        sch.bind(bx, "blockIdx.x")
        sch.bind(ty, "threadIdx.y")
        sch.bind(tx, "threadIdx.x")


def _copy_out(sch: Any, staged: Any, warps: int, *, gpu: bool) -> None:
    """The shared -> global copy of a warp's tile: coalesced, 4 float32 per thread and step."""
    fused = sch.fuse(*sch.get_loops(staged)[-2:])
    _, f1, f2 = sch.split(fused, [None, WARP, 4])
    if gpu:
        sch.bind(f1, "threadIdx.x")
        sch.vectorize(f2)

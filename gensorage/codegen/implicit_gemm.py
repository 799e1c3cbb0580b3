"""2-D convolution as an implicit GEMM on tensor cores.

The NCHW convolution of :func:`gensorage.workloads.conv2d` is the GEMM ``C[m, f] = sum_k A[m, k] * B[k, f]``
with ``m = (n, oh, ow)``, ``k = (c, kh, kw)``, ``A[m, k] = X[n, c, oh*sh + kh - ph, ow*sw + kw - pw]`` (zero
outside the image) and ``B[k, f] = W[f, c, kh, kw]``. The PrimFunc states A and B as index-mapping blocks over
the real tensors. The tensor-core schedule (:mod:`gensorage.codegen.tensor_core`) inlines them into its shared
memory copies, so no im2col matrix is ever written: each block gathers its A tile straight from X, with the
padding as a guarded load. In NCHW neither operand is contiguous along k (A runs along ``kw`` for at most
``kw`` elements, B strides by ``c * kh * kw``), so the gathers move one element per thread and step: no 16-byte
vectors and no ``cp.async``. An NHWC layout would give both. The output block maps ``C[m, f]`` back to ``Y[n, f, oh, ow]`` and casts, inlined into
the write-back. The tiles come from :func:`gensorage.construction.tensor_core.construct_tensor_core` on the
GEMM's ``(1, M, F, K)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gensorage.codegen.tensor_core import TensorCoreTiles, schedule_tensor_core
from gensorage.errors import ScheduleError


@dataclass(frozen=True, slots=True)
class Conv2d:
    """An NCHW convolution: input (n, c, h, w), weight (f, c, kh, kw), stride and zero padding per axis."""

    n: int
    c: int
    h: int
    w: int
    f: int
    kh: int
    kw: int
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)

    @property
    def out_hw(self) -> tuple[int, int]:
        oh = (self.h + 2 * self.padding[0] - self.kh) // self.stride[0] + 1
        ow = (self.w + 2 * self.padding[1] - self.kw) // self.stride[1] + 1
        return oh, ow

    @property
    def gemm(self) -> tuple[int, int, int, int]:
        """(batch, M, N, K) of the implicit GEMM."""
        oh, ow = self.out_hw
        return 1, self.n * oh * ow, self.f, self.c * self.kh * self.kw

    def check(self) -> None:
        oh, ow = self.out_hw
        if min(self.n, self.c, self.h, self.w, self.f, self.kh, self.kw) < 1 or oh < 1 or ow < 1:
            raise ScheduleError(f"conv2d {self}: no output (sizes must be positive and the window fit)")


def conv2d_prim_func(conv: Conv2d, dtype: str = "float16") -> Any:
    """The implicit-GEMM PrimFunc of ``conv`` (parameters X, W, Y; float32 accumulation, ``dtype`` output)."""
    from tvm import te, tirx

    conv.check()
    (_, m, f, kg), (oh, ow) = conv.gemm, conv.out_hw
    (sh, sw), (ph, pw), window = conv.stride, conv.padding, conv.kh * conv.kw
    x = te.placeholder((conv.n, conv.c, conv.h, conv.w), dtype, name="X")
    wt = te.placeholder((conv.f, conv.c, conv.kh, conv.kw), dtype, name="W")

    def gather(i: Any, k: Any) -> Any:
        n, pix = i // (oh * ow), i % (oh * ow)
        c, tap = k // window, k % window
        row = pix // ow * sh + tap // conv.kw - ph
        col = pix % ow * sw + tap % conv.kw - pw
        inside = tirx.all(row >= 0, row < conv.h, col >= 0, col < conv.w)
        return tirx.if_then_else(inside, x[n, c, row, col], tirx.const(0, dtype))

    a = te.compute((m, kg), gather, name="A")
    b = te.compute((kg, f), lambda k, j: wt[j, k // window, k % window // conv.kw, k % conv.kw], name="B")
    k = te.reduce_axis((0, kg), name="k")
    c = te.compute(
        (m, f), lambda i, j: te.sum(a[i, k].astype("float32") * b[k, j].astype("float32"), axis=k), name="C"
    )
    y = te.compute(
        (conv.n, f, oh, ow), lambda n, j, r, q: c[n * oh * ow + r * ow + q, j].astype(dtype), name="D"
    )
    return te.create_prim_func([x, wt, y])


def conv2d_tensor_core(
    conv: Conv2d, tiles: TensorCoreTiles, dtype: str = "float16", *, gpu: bool = True
) -> Any:
    """The scheduled module of ``conv`` on tensor cores (``gpu=False``: its CPU twin).

    Raises
    ------
    ScheduleError
        Split-k tiles (the implicit GEMM is not split), or what :func:`schedule_tensor_core` refuses.
    """
    if tiles.split_k != 1:
        raise ScheduleError("conv2d on tensor cores: split-k is not supported for the implicit GEMM")
    return schedule_tensor_core(conv2d_prim_func(conv, dtype), tiles, gpu=gpu, gather=True).mod

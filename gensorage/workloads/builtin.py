"""The built-in workloads: GEMM, GEMV, batched matmul, 2-D convolution and average pooling.

Each constructor returns a :class:`Workload` whose ``build()`` gives a TVM PrimFunc with exactly one block, the
reduction (made with ``tvm.te`` and ``te.create_prim_func``; parameters are the inputs then the output), and
whose ``reference(*arrays)`` computes the output in numpy float64 independently of TVM.

Conventions shared by all of them:

* float16 / bfloat16 inputs are cast to float32 inside the reduction and the output is float32 (the output
  ``Access`` says so); float32 inputs accumulate and store in float32.
* ``flops`` counts the floating-point operations the block executes: one multiply and one add per innermost
  iteration (2 x the iteration count). For average pooling that is the scale-by-1/(KH*KW) and the add.
* Zero padding (conv2d, avgpool2d) is an ``if_then_else`` on the input load inside the single block rather than
  a separate pad stage: the function stays one block that schedules and lowers without inlining, and the input
  access keeps its affine index ``oh*stride + kh - padding``, whose constant offset is the negative padding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gensorage.errors import ProgramError
from gensorage.workloads.data import accum_dtype, check_dtype
from gensorage.workloads.workload import Access, Axis, AxisKind, Workload

IndexSpec = Sequence[Sequence[tuple[str, int]]]


def _positive(op: str, **values: object) -> None:
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
            raise ProgramError(f"{op}: {name} must be a positive integer, got {v!r}")


def _pair(op: str, name: str, value: object, *, minimum: int) -> tuple[int, int]:
    vals = tuple(value) if isinstance(value, tuple | list) else (value, value)
    if len(vals) != 2 or any(
        isinstance(v, bool) or not isinstance(v, int | np.integer) or v < minimum for v in vals
    ):
        raise ProgramError(f"{op}: {name} must be an integer >= {minimum} or a pair of them, got {value!r}")
    return int(vals[0]), int(vals[1])


def _axes(*spec: tuple[str, int, AxisKind]) -> tuple[Axis, ...]:
    return tuple(Axis(name, int(extent), kind) for name, extent, kind in spec)


def _access(
    tensor: str,
    shape: Sequence[int],
    dtype: str,
    index: IndexSpec,
    offset: Sequence[int] | None = None,
    *,
    is_output: bool = False,
) -> Access:
    return Access(
        tensor=tensor,
        shape=tuple(int(s) for s in shape),
        dtype=dtype,
        index=tuple(tuple((a, int(c)) for a, c in dim) for dim in index),
        offset=tuple(int(o) for o in offset) if offset is not None else tuple(0 for _ in shape),
        is_output=is_output,
    )


def _f64(*arrays: Any) -> list[np.ndarray]:
    return [np.asarray(a, dtype=np.float64) for a in arrays]


def _check_ref_args(name: str, accesses: Sequence[Access], arrays: Sequence[Any]) -> list[np.ndarray]:
    inputs = [a for a in accesses if not a.is_output]
    if len(arrays) != len(inputs):
        raise ProgramError(
            f"{name}: reference takes {len(inputs)} arrays ({', '.join(a.tensor for a in inputs)}),"
            f" got {len(arrays)}"
        )
    out = _f64(*arrays)
    for spec, arr in zip(inputs, out, strict=True):
        if arr.shape != spec.shape:
            raise ProgramError(f"{name}: input {spec.tensor} has shape {arr.shape}, expected {spec.shape}")
    return out


def _workload(
    name: str,
    params: Sequence[tuple[str, int]],
    axes: tuple[Axis, ...],
    accesses: tuple[Access, ...],
    flops: int,
    dtype: str,
    build: Callable[[], Any],
    reference: Callable[..., np.ndarray],
) -> Workload:
    def checked_reference(*arrays: Any) -> np.ndarray:
        return reference(*_check_ref_args(name, accesses, arrays))

    return Workload(
        name=name,
        params=tuple((k, int(v)) for k, v in params),
        axes=axes,
        accesses=accesses,
        flops=int(flops),
        dtype=dtype,
        build=build,
        reference=checked_reference,
    )


def _load(tensor: Any, idx: Sequence[Any], dtype: str) -> Any:
    """``tensor[idx]`` cast to the accumulator dtype when the input is a 16-bit float."""
    value = tensor[tuple(idx)]
    acc = accum_dtype(dtype)
    return value.astype(acc) if acc != dtype else value


def _te_funcs() -> tuple[Any, Any]:
    from tvm import te, tirx

    return te, tirx


# ---------------------------------------------------------------------------------------------------------
# GEMM / GEMV / batched matmul
# ---------------------------------------------------------------------------------------------------------


def gemm(M: int, N: int, K: int, dtype: str = "float16") -> Workload:
    """``C = A @ B`` with A of shape (M, K), B of shape (K, N), C of shape (M, N); axes i, j (spatial), k."""
    _positive("gemm", M=M, N=N, K=K)
    M, N, K = int(M), int(N), int(K)
    check_dtype(dtype, "gemm")
    acc = accum_dtype(dtype)
    axes = _axes(("i", M, "spatial"), ("j", N, "spatial"), ("k", K, "reduce"))
    accesses = (
        _access("A", (M, K), dtype, [[("i", 1)], [("k", 1)]]),
        _access("B", (K, N), dtype, [[("k", 1)], [("j", 1)]]),
        _access("C", (M, N), acc, [[("i", 1)], [("j", 1)]], is_output=True),
    )

    def build() -> Any:
        te, _ = _te_funcs()
        A = te.placeholder((M, K), dtype, name="A")
        B = te.placeholder((K, N), dtype, name="B")
        k = te.reduce_axis((0, K), name="k")
        C = te.compute(
            (M, N), lambda i, j: te.sum(_load(A, (i, k), dtype) * _load(B, (k, j), dtype), axis=k), name="C"
        )
        return te.create_prim_func([A, B, C])

    def reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return a @ b

    return _workload(
        "gemm", (("M", M), ("N", N), ("K", K)), axes, accesses, 2 * M * N * K, dtype, build, reference
    )


def gemv(M: int, N: int, dtype: str = "float16") -> Workload:
    """``y = A @ x`` with A of shape (M, N), x of shape (N,), y of shape (M,); axes i (spatial), k (reduce)."""
    _positive("gemv", M=M, N=N)
    M, N = int(M), int(N)
    check_dtype(dtype, "gemv")
    acc = accum_dtype(dtype)
    axes = _axes(("i", M, "spatial"), ("k", N, "reduce"))
    accesses = (
        _access("A", (M, N), dtype, [[("i", 1)], [("k", 1)]]),
        _access("x", (N,), dtype, [[("k", 1)]]),
        _access("y", (M,), acc, [[("i", 1)]], is_output=True),
    )

    def build() -> Any:
        te, _ = _te_funcs()
        A = te.placeholder((M, N), dtype, name="A")
        x = te.placeholder((N,), dtype, name="x")
        k = te.reduce_axis((0, N), name="k")
        y = te.compute(
            (M,), lambda i: te.sum(_load(A, (i, k), dtype) * _load(x, (k,), dtype), axis=k), name="y"
        )
        return te.create_prim_func([A, x, y])

    def reference(a: np.ndarray, x: np.ndarray) -> np.ndarray:
        return a @ x

    return _workload("gemv", (("M", M), ("N", N)), axes, accesses, 2 * M * N, dtype, build, reference)


def batch_matmul(B: int, M: int, N: int, K: int, dtype: str = "float16") -> Workload:
    """``C[b] = A[b] @ B[b]`` with A (B, M, K), B (B, K, N), C (B, M, N); axes b, i, j (spatial), k."""
    _positive("batch_matmul", B=B, M=M, N=N, K=K)
    B, M, N, K = int(B), int(M), int(N), int(K)
    check_dtype(dtype, "batch_matmul")
    acc = accum_dtype(dtype)
    axes = _axes(("b", B, "spatial"), ("i", M, "spatial"), ("j", N, "spatial"), ("k", K, "reduce"))
    accesses = (
        _access("A", (B, M, K), dtype, [[("b", 1)], [("i", 1)], [("k", 1)]]),
        _access("B", (B, K, N), dtype, [[("b", 1)], [("k", 1)], [("j", 1)]]),
        _access("C", (B, M, N), acc, [[("b", 1)], [("i", 1)], [("j", 1)]], is_output=True),
    )

    def build() -> Any:
        te, _ = _te_funcs()
        A = te.placeholder((B, M, K), dtype, name="A")
        Bt = te.placeholder((B, K, N), dtype, name="B")
        k = te.reduce_axis((0, K), name="k")
        C = te.compute(
            (B, M, N),
            lambda b, i, j: te.sum(_load(A, (b, i, k), dtype) * _load(Bt, (b, k, j), dtype), axis=k),
            name="C",
        )
        return te.create_prim_func([A, Bt, C])

    def reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.matmul(a, b)

    return _workload(
        "batch_matmul",
        (("B", B), ("M", M), ("N", N), ("K", K)),
        axes,
        accesses,
        2 * B * M * N * K,
        dtype,
        build,
        reference,
    )


# ---------------------------------------------------------------------------------------------------------
# Windowed ops: conv2d, avgpool2d
# ---------------------------------------------------------------------------------------------------------


def _out_size(op: str, size: int, kernel: int, stride: int, pad: int, dim: str) -> int:
    out = (size + 2 * pad - kernel) // stride + 1
    if size + 2 * pad < kernel or out < 1:
        raise ProgramError(f"{op}: kernel {kernel} does not fit input {dim}={size} with padding {pad}")
    return out


def _padded_load(
    X: Any, n: Any, c: Any, h: Any, w: Any, H: int, W: int, pad: tuple[int, int], dtype: str
) -> Any:
    """``X[n, c, h, w]`` or 0 outside the input (zero padding), cast to the accumulator dtype."""
    _, tirx = _te_funcs()
    value = _load(X, (n, c, h, w), dtype)
    conds = []
    if pad[0]:
        conds += [h >= 0, h < H]
    if pad[1]:
        conds += [w >= 0, w < W]
    if not conds:
        return value
    return tirx.if_then_else(tirx.all(*conds), value, tirx.const(0.0, accum_dtype(dtype)))


def _windows(xp: np.ndarray, kh: int, kw: int, oh: int, ow: int, stride: tuple[int, int]) -> np.ndarray:
    """The (N, C, OH, OW) slice of the padded input seen at kernel offset (kh, kw)."""
    return xp[
        :, :, kh : kh + stride[0] * (oh - 1) + 1 : stride[0], kw : kw + stride[1] * (ow - 1) + 1 : stride[1]
    ]


def _window_params(
    N: int, C: int, H: int, W: int, KH: int, KW: int, stride: tuple[int, int], pad: tuple[int, int]
) -> list[tuple[str, int]]:
    return [
        ("N", N),
        ("C", C),
        ("H", H),
        ("W", W),
        ("KH", KH),
        ("KW", KW),
        ("stride_h", stride[0]),
        ("stride_w", stride[1]),
        ("pad_h", pad[0]),
        ("pad_w", pad[1]),
    ]


def conv2d(
    N: int,
    C: int,
    H: int,
    W: int,
    F: int,
    KH: int,
    KW: int,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
    dtype: str = "float16",
) -> Workload:
    """2-D convolution (cross-correlation), NCHW input X (N, C, H, W), weight W (F, C, KH, KW), output Y.

    ``Y[n, f, oh, ow] = sum_{c, kh, kw} X[n, c, oh*sh + kh - ph, ow*sw + kw - pw] * W[f, c, kh, kw]`` with zero
    padding; OH = (H + 2 ph - KH) // sh + 1 (likewise OW). ``stride``/``padding`` are an int or an (h, w) pair.
    Axes: n, f, oh, ow (spatial), c, kh, kw (reduce).
    """
    _positive("conv2d", N=N, C=C, H=H, W=W, F=F, KH=KH, KW=KW)
    N, C, H, W, F, KH, KW = (int(v) for v in (N, C, H, W, F, KH, KW))
    check_dtype(dtype, "conv2d")
    st = _pair("conv2d", "stride", stride, minimum=1)
    pad = _pair("conv2d", "padding", padding, minimum=0)
    OH = _out_size("conv2d", H, KH, st[0], pad[0], "H")
    OW = _out_size("conv2d", W, KW, st[1], pad[1], "W")
    acc = accum_dtype(dtype)
    axes = _axes(
        ("n", N, "spatial"),
        ("f", F, "spatial"),
        ("oh", OH, "spatial"),
        ("ow", OW, "spatial"),
        ("c", C, "reduce"),
        ("kh", KH, "reduce"),
        ("kw", KW, "reduce"),
    )
    accesses = (
        _access(
            "X",
            (N, C, H, W),
            dtype,
            [[("n", 1)], [("c", 1)], [("oh", st[0]), ("kh", 1)], [("ow", st[1]), ("kw", 1)]],
            (0, 0, -pad[0], -pad[1]),
        ),
        _access("W", (F, C, KH, KW), dtype, [[("f", 1)], [("c", 1)], [("kh", 1)], [("kw", 1)]]),
        _access("Y", (N, F, OH, OW), acc, [[("n", 1)], [("f", 1)], [("oh", 1)], [("ow", 1)]], is_output=True),
    )

    def build() -> Any:
        te, _ = _te_funcs()
        X = te.placeholder((N, C, H, W), dtype, name="X")
        Wt = te.placeholder((F, C, KH, KW), dtype, name="W")
        c = te.reduce_axis((0, C), name="c")
        kh = te.reduce_axis((0, KH), name="kh")
        kw = te.reduce_axis((0, KW), name="kw")

        def body(n: Any, f: Any, oh: Any, ow: Any) -> Any:
            x = _padded_load(X, n, c, oh * st[0] + kh - pad[0], ow * st[1] + kw - pad[1], H, W, pad, dtype)
            return te.sum(x * _load(Wt, (f, c, kh, kw), dtype), axis=[c, kh, kw])

        Y = te.compute((N, F, OH, OW), body, name="Y")
        return te.create_prim_func([X, Wt, Y])

    def reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
        out = np.zeros((N, F, OH, OW))
        for i in range(KH):
            for j in range(KW):
                out += np.einsum("nchw,fc->nfhw", _windows(xp, i, j, OH, OW, st), w[:, :, i, j])
        return out

    params = _window_params(N, C, H, W, KH, KW, st, pad)
    params.insert(4, ("F", F))
    return _workload(
        "conv2d", params, axes, accesses, 2 * N * F * OH * OW * C * KH * KW, dtype, build, reference
    )


def avgpool2d(
    N: int,
    C: int,
    H: int,
    W: int,
    KH: int,
    KW: int,
    stride: int | tuple[int, int] | None = None,
    padding: int | tuple[int, int] = 0,
    dtype: str = "float16",
) -> Workload:
    """2-D average pooling over NCHW input X (N, C, H, W) with output Y (N, C, OH, OW).

    ``count_include_pad`` semantics (PyTorch's default): every window is divided by KH*KW, padded zeros
    included. ``stride`` defaults to the window size (KH, KW); OH = (H + 2 ph - KH) // sh + 1 (floor mode).
    Axes: n, c, oh, ow (spatial), kh, kw (reduce).
    """
    _positive("avgpool2d", N=N, C=C, H=H, W=W, KH=KH, KW=KW)
    N, C, H, W, KH, KW = (int(v) for v in (N, C, H, W, KH, KW))
    check_dtype(dtype, "avgpool2d")
    st = _pair("avgpool2d", "stride", (KH, KW) if stride is None else stride, minimum=1)
    pad = _pair("avgpool2d", "padding", padding, minimum=0)
    OH = _out_size("avgpool2d", H, KH, st[0], pad[0], "H")
    OW = _out_size("avgpool2d", W, KW, st[1], pad[1], "W")
    acc = accum_dtype(dtype)
    axes = _axes(
        ("n", N, "spatial"),
        ("c", C, "spatial"),
        ("oh", OH, "spatial"),
        ("ow", OW, "spatial"),
        ("kh", KH, "reduce"),
        ("kw", KW, "reduce"),
    )
    accesses = (
        _access(
            "X",
            (N, C, H, W),
            dtype,
            [[("n", 1)], [("c", 1)], [("oh", st[0]), ("kh", 1)], [("ow", st[1]), ("kw", 1)]],
            (0, 0, -pad[0], -pad[1]),
        ),
        _access("Y", (N, C, OH, OW), acc, [[("n", 1)], [("c", 1)], [("oh", 1)], [("ow", 1)]], is_output=True),
    )

    def build() -> Any:
        te, tirx = _te_funcs()
        X = te.placeholder((N, C, H, W), dtype, name="X")
        kh = te.reduce_axis((0, KH), name="kh")
        kw = te.reduce_axis((0, KW), name="kw")
        scale = tirx.const(1.0 / (KH * KW), acc)

        def body(n: Any, c: Any, oh: Any, ow: Any) -> Any:
            x = _padded_load(X, n, c, oh * st[0] + kh - pad[0], ow * st[1] + kw - pad[1], H, W, pad, dtype)
            return te.sum(x * scale, axis=[kh, kw])

        Y = te.compute((N, C, OH, OW), body, name="Y")
        return te.create_prim_func([X, Y])

    def reference(x: np.ndarray) -> np.ndarray:
        xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
        out = np.zeros((N, C, OH, OW))
        for i in range(KH):
            for j in range(KW):
                out += _windows(xp, i, j, OH, OW, st)
        return out / (KH * KW)

    return _workload(
        "avgpool2d",
        _window_params(N, C, H, W, KH, KW, st, pad),
        axes,
        accesses,
        2 * N * C * OH * OW * KH * KW,
        dtype,
        build,
        reference,
    )

"""Lowering construction schedules to TVM TIR / CUDA: structure, GPU limits and CPU numerics."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import gensorage.workloads as workloads
from gensorage.codegen.cuda_build import build_cubin, build_cuda, cubin_unavailable_reason
from gensorage.codegen.gpu_limits import block_resources, verify_gpu_limits
from gensorage.codegen.lower_schedule import axis_tilings, lower, run_cpu, threads_per_block
from gensorage.errors import ProgramError, ScheduleError
from gensorage.hw.loader import load_profile
from gensorage.markov.schedule import Schedule
from gensorage.tuning import relative_error
from gensorage.workloads import Access, Axis, Workload

H100 = load_profile("h100")


def sched(
    wl: Workload, t0: tuple[int, ...], t1: tuple[int, ...], v: tuple[int, ...] | None = None
) -> Schedule:
    ext = tuple(a.extent for a in wl.axes)
    return Schedule(
        tuple(a.name for a in wl.axes), (tuple(t0), tuple(t1), ext), tuple(v or (1,) * len(ext)), 2
    )


def cpu_error(wl: Workload, s: Schedule, seed: int = 0) -> float:
    xs = workloads.random_inputs(wl, seed)
    out = run_cpu(wl, s, *xs)
    assert out.shape == wl.output.shape and out.dtype == np.dtype(wl.output.dtype)
    return relative_error(np.asarray(out, dtype=np.float64), wl.reference(*xs))


def window_bytes(wl: Workload, t1: tuple[int, ...]) -> int:
    """Shared bytes of one block's input tiles, from the affine accesses: span = 1 + sum c * (T1 - 1)."""
    pos = {a.name: i for i, a in enumerate(wl.axes)}
    total = 0
    for acc in wl.inputs:
        n = 1
        for size, terms in zip(acc.shape, acc.index, strict=True):
            n *= min(size, 1 + sum(c * (t1[pos[a]] - 1) for a, c in terms))
        total += n * np.dtype(workloads.numpy_dtype(acc.dtype)).itemsize
    return total


# (workload, T0, T1, vthreads): divisible and odd sizes, vthreads, T0 not dividing T1, gemv, padding, stride
CASES: list[tuple[Workload, tuple[int, ...], tuple[int, ...], tuple[int, ...] | None]] = [
    (workloads.gemm(1000, 100, 77, dtype="float32"), (4, 4, 1), (32, 32, 8), (2, 1, 1)),
    (workloads.gemm(128, 128, 64, dtype="float32"), (4, 4, 4), (32, 64, 16), (2, 2, 1)),
    (workloads.gemm(50, 70, 30, dtype="float32"), (3, 5, 4), (8, 16, 10), None),
    (workloads.gemm(1000, 1, 513, dtype="float32"), (4, 1, 8), (128, 1, 64), None),
    (workloads.gemm(1, 300, 129, dtype="float32"), (1, 2, 4), (1, 64, 32), (1, 2, 1)),
    (workloads.gemv(300, 257, dtype="float32"), (2, 8), (64, 64), (2, 1)),
    (workloads.batch_matmul(3, 33, 45, 70, dtype="float32"), (1, 2, 3, 5), (1, 16, 12, 10), (1, 2, 1, 1)),
    (
        workloads.conv2d(2, 16, 15, 15, 32, 3, 3, stride=2, padding=1, dtype="float32"),
        (1, 2, 2, 1, 4, 1, 3),
        (1, 16, 4, 8, 8, 3, 3),
        (1, 2, 1, 1, 1, 1, 1),
    ),
    (
        workloads.conv2d(1, 3, 40, 40, 8, 7, 7, stride=2, padding=3, dtype="float32"),
        (1, 2, 1, 2, 1, 1, 1),
        (1, 8, 4, 8, 3, 7, 7),
        None,
    ),
    (
        workloads.avgpool2d(2, 8, 15, 15, 3, 3, stride=2, padding=1, dtype="float32"),
        (1, 1, 2, 2, 1, 1),
        (1, 3, 4, 8, 3, 3),
        (1, 1, 2, 1, 1, 1),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0].key())
def test_cuda_source_and_cpu_numerics(case: tuple[Any, ...]) -> None:
    wl, t0, t1, v = case
    s = sched(wl, t0, t1, v)
    mod = lower(wl, s, "cuda", hw=H100)
    src = build_cuda(mod, H100)
    assert "blockIdx.x" in src and "threadIdx.x" in src and "__shared__" in src
    assert f"__launch_bounds__({threads_per_block(wl, s)})" in src
    # Each block stages exactly its input windows (no whole-tensor fallback of TVM's buffer compaction).
    # When T0 does not divide T1 the threads cover ceil(T1/T0)*T0 (the excess is predicated off), and the
    # stage is sized for that bounding box.
    covered = tuple(-(-b // r) * r for b, r in zip(t1, t0, strict=True))
    assert block_resources(mod).shared_bytes == window_bytes(wl, covered)
    assert cpu_error(wl, s) < 1e-5


def test_float16_gemm_accumulates_in_float32() -> None:
    wl = workloads.gemm(64, 80, 96, dtype="float16")
    s = sched(wl, (4, 4, 4), (32, 16, 16), (1, 2, 1))
    src = build_cuda(lower(wl, s), H100)
    assert "half" in src and "__shared__" in src
    assert cpu_error(wl, s) < 1e-5  # fp16 inputs are exact in float32; only the summation rounds


def test_vectorized_cooperative_fetch_when_aligned() -> None:
    wl = workloads.gemm(256, 256, 256, dtype="float32")
    src = build_cuda(lower(wl, sched(wl, (8, 8, 4), (128, 128, 16), (2, 2, 1))), H100)
    assert "float4" in src  # 16-byte loads of the A and B tiles
    odd = workloads.gemm(250, 250, 250, dtype="float32")
    assert "float4" not in build_cuda(lower(odd, sched(odd, (8, 8, 4), (128, 128, 16), (2, 2, 1))), H100)


def test_large_stage_uses_dynamic_shared_memory() -> None:
    wl = workloads.gemm(256, 256, 512, dtype="float32")
    s = sched(wl, (8, 8, 8), (128, 128, 64))  # 2 x 128 x 64 x 4 B = 64 KiB > the 48 KiB static limit
    mod = lower(wl, s, hw=H100)
    assert block_resources(mod).shared_bytes == 65536
    src = build_cuda(mod, H100)
    assert "extern __shared__" in src
    assert cpu_error(wl, s) < 1e-5


def test_llvm_variant_has_no_thread_bindings() -> None:
    wl = workloads.gemm(64, 64, 32, dtype="float32")
    s = sched(wl, (2, 2, 2), (16, 16, 8), (2, 1, 1))
    gpu, cpu = lower(wl, s, "cuda").script(), lower(wl, s, "llvm").script()
    assert "threadIdx" in gpu and "vthread" in gpu and "blockIdx" in gpu
    assert "thread_binding" not in cpu and "shared" in cpu  # same tiling and caches, no bindings


def _te_workload(
    name: str,
    axes: list[tuple[str, int, str]],
    inputs: list[tuple[str, tuple[int, ...]]],
    out_shape: tuple[int, ...],
    make: Callable[[], Any],
    reference: Callable[..., Any],
) -> Workload:
    """A workload whose PrimFunc has several blocks (producer / epilogue stages), as a user could bring."""
    accesses = tuple(Access(n, sh, "float32", (), ()) for n, sh in inputs)
    accesses += (Access("out", out_shape, "float32", (), (), is_output=True),)
    return Workload(
        name,
        (),
        tuple(Axis(n, e, k) for n, e, k in axes),
        accesses,
        0,
        "float32",  # type: ignore[arg-type]
        make,
        reference,
    )


def test_multi_block_padding_stage_and_epilogue() -> None:
    """A separate pad block becomes the shared stage; a ReLU epilogue folds into the register write-back."""
    n, c, h, w, f, k, stride, pad = 2, 6, 11, 11, 8, 3, 2, 1
    oh = (h + 2 * pad - k) // stride + 1

    def make() -> Any:
        from tvm import te, topi

        x = te.placeholder((n, c, h, w), "float32", name="x")
        wt = te.placeholder((f, c, k, k), "float32", name="wt")
        y = topi.nn.conv2d_nchw(x, wt, stride, pad, 1)
        return te.create_prim_func([x, wt, topi.nn.relu(y)])

    def reference(x: np.ndarray, wt: np.ndarray) -> np.ndarray:
        return np.maximum(
            workloads.conv2d(n, c, h, w, f, k, k, stride=stride, padding=pad, dtype="float32").reference(
                x, wt
            ),
            0.0,
        )

    axes = [
        ("nn", n, "spatial"),
        ("ff", f, "spatial"),
        ("yy", oh, "spatial"),
        ("xx", oh, "spatial"),
        ("rc", c, "reduce"),
        ("ry", k, "reduce"),
        ("rx", k, "reduce"),
    ]
    wl = _te_workload(
        "conv_relu", axes, [("x", (n, c, h, w)), ("wt", (f, c, k, k))], (n, f, oh, oh), make, reference
    )
    s = sched(wl, (1, 2, 1, 2, 2, 1, 3), (1, 8, 2, 4, 6, 3, 3), (1, 2, 1, 1, 1, 1, 1))
    mod = lower(wl, s)
    assert "pad_temp" in mod.script()
    assert "__shared__" in build_cuda(mod, H100)
    assert cpu_error(wl, s) < 1e-5


def test_elementwise_workload_without_reduction() -> None:
    def make() -> Any:
        from tvm import te

        a = te.placeholder((100, 37), "float32", name="a")
        b = te.compute((100, 37), lambda i, j: a[i, j] * 2.0, name="b")
        return te.create_prim_func([a, te.compute((100, 37), lambda i, j: b[i, j] + 1.0, name="c")])

    wl = _te_workload(
        "axpb",
        [("i", 100, "spatial"), ("j", 37, "spatial")],
        [("a", (100, 37))],
        (100, 37),
        make,
        lambda a: a * 2.0 + 1.0,
    )
    s = sched(wl, (2, 3), (16, 12), (2, 1))
    assert "blockIdx.x" in build_cuda(lower(wl, s), H100)
    assert cpu_error(wl, s) == 0.0


def test_over_the_thread_limit_is_a_schedule_error() -> None:
    wl = workloads.gemm(512, 512, 64, dtype="float32")
    s = sched(wl, (1, 1, 1), (64, 32, 8))  # 2048 threads per block
    with pytest.raises(ScheduleError, match="2048 threads per block exceed h100"):
        lower(wl, s, hw=H100)
    with pytest.raises(ScheduleError, match="threads"):
        verify_gpu_limits(lower(wl, s), H100)
    assert verify_gpu_limits(lower(wl, sched(wl, (2, 2, 1), (64, 32, 8))), H100).threads == 512


def test_over_the_shared_memory_limit_is_a_schedule_error() -> None:
    wl = workloads.gemm(512, 512, 4096, dtype="float32")
    s = sched(wl, (8, 8, 8), (128, 128, 256))  # 2 x 128 x 256 x 4 B = 256 KiB > 227 KiB
    with pytest.raises(ScheduleError, match="shared memory"):
        lower(wl, s, hw=H100)


@pytest.mark.parametrize(
    ("tiles", "v", "match"),
    [
        (((4, 4, 1), (2, 32, 8)), (1, 1, 1), "exceeds block tile"),
        (((4, 4, 1), (32, 32, 8)), (3, 1, 1), "vthreads=3 do not divide"),
        (((4, 4, 1), (32, 32, 8)), (1, 1, 2), "reduction axes cannot have vthreads"),
        (((0, 4, 1), (32, 32, 8)), (1, 1, 1), "must be positive"),
    ],
)
def test_malformed_schedules_are_rejected(tiles: Any, v: tuple[int, ...], match: str) -> None:
    wl = workloads.gemm(64, 64, 64, dtype="float32")
    with pytest.raises(ScheduleError, match=match):
        lower(wl, Schedule(("i", "j", "k"), (*tiles, (64, 64, 64)), v, 2))


def test_schedule_for_another_workload_is_rejected() -> None:
    a, b = workloads.gemm(64, 64, 64, dtype="float32"), workloads.gemm(64, 64, 32, dtype="float32")
    with pytest.raises(ScheduleError, match="outermost tile 64 != extent 32"):
        lower(b, sched(a, (2, 2, 2), (16, 16, 8)))
    with pytest.raises(ScheduleError, match="do not match workload axes"):
        lower(workloads.gemv(64, 64, dtype="float32"), sched(a, (2, 2, 2), (16, 16, 8)))
    with pytest.raises(ProgramError, match="takes 2 inputs"):
        run_cpu(a, sched(a, (2, 2, 2), (16, 16, 8)), np.zeros((64, 64), np.float32))


def test_from_te_workload_lowers() -> None:
    from tvm import te

    x = te.placeholder((37, 64), "float32", name="x")
    wt = te.placeholder((48, 64), "float32", name="wt")
    k = te.reduce_axis((0, 64), name="k")
    y = te.compute((37, 48), lambda i, j: te.sum(x[i, k] * wt[j, k], axis=k), name="y")  # x @ wt.T
    wl = workloads.from_te([x, wt], y)
    names = [a.name for a in wl.axes]
    s = Schedule(tuple(names), ((2, 2, 4), (16, 16, 16), tuple(a.extent for a in wl.axes)), (1, 2, 1), 2)
    assert "__shared__" in build_cuda(lower(wl, s), H100)
    xs = workloads.random_inputs(wl, 0)
    np.testing.assert_allclose(
        run_cpu(wl, s, *xs), xs[0].astype(np.float64) @ xs[1].T.astype(np.float64), rtol=1e-5, atol=1e-5
    )


@settings(max_examples=6, deadline=None)
@given(st.data())
def test_random_tilings_of_odd_gemm_match_numpy(data: st.DataObject) -> None:
    wl = workloads.gemm(45, 38, 29, dtype="float32")
    t1 = tuple(
        data.draw(st.integers(1, e), label=f"T1[{a.name}]")
        for a, e in zip(wl.axes, (45, 38, 29), strict=True)
    )
    # Register tiles stay small (as the construction's register limit keeps them): they are fully unrolled.
    t0 = tuple(
        data.draw(st.integers(1, min(b, 6)), label=f"T0[{a.name}]") for a, b in zip(wl.axes, t1, strict=True)
    )
    v = tuple(
        data.draw(st.sampled_from([d for d in (1, 2, 4) if t % d == 0]), label=f"v[{a.name}]")
        if a.kind == "spatial"
        else 1
        for a, t in zip(wl.axes, t0, strict=True)
    )
    s = sched(wl, t0, t1, v)
    assert [t.threads for t in axis_tilings(wl, s)] == [math.ceil(b / r) for b, r in zip(t1, t0, strict=True)]
    assert cpu_error(wl, s) < 1e-5


@settings(max_examples=4, deadline=None)
@given(oh=st.integers(1, 6), ow=st.integers(1, 8), c=st.sampled_from([1, 2, 4]))
@example(oh=3, ow=1, c=1)  # the rows were wrapped first, the width over-allocated only after the fetch loops
def test_random_conv_tiles_stage_exact_windows(oh: int, ow: int, c: int) -> None:
    wl = workloads.conv2d(1, 4, 13, 11, 4, 3, 3, stride=2, padding=2, dtype="float32")
    t1 = (1, 4, oh, ow, c, 3, 3)
    s = sched(wl, (1, 1, 1, 1, 1, 1, 1), t1)
    assert block_resources(lower(wl, s)).shared_bytes == window_bytes(wl, t1)
    assert cpu_error(wl, s) < 1e-5


@pytest.mark.skipif(cubin_unavailable_reason() is not None, reason="nvcc not available")
def test_cubin_builds_with_nvcc() -> None:
    wl = workloads.conv2d(1, 8, 14, 14, 16, 3, 3, stride=2, padding=1, dtype="float16")
    src = build_cuda(lower(wl, sched(wl, (1, 2, 1, 2, 2, 1, 3), (1, 16, 4, 4, 8, 3, 3)), hw=H100), H100)
    cubin = build_cubin(src, H100.arch)
    assert cubin is not None and cubin[:4] == b"\x7fELF"
    with pytest.raises(ScheduleError, match="nvcc failed for sm_90: .*error"):
        build_cubin('extern "C" __global__ void k() { undefined_name = 1; }', "sm_90")

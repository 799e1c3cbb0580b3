"""The GPU side of the suite's runner: launching cubins through CuPy on torch's stream, timing CUDA-graph
replays with events, and what is measured once per device (self-check, facts, ceilings).

Split from :mod:`benchmarks.gpu_runner` (which checks and times the cases); like it, it imports no TVM.
"""

from __future__ import annotations

import math
import statistics
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.gpu_bundle import Case, KernelSpec, one_line

SAMPLES = 20
MIN_SAMPLE_S = 1e-3
WARMUP_REPLAYS = 3
STATIC_SMEM_LIMIT = 48 * 1024  # past this a kernel needs its dynamic shared-memory limit raised


@dataclass
class Env:
    """What every case shares: the modules, the device, the shared caches and the flags."""

    torch: Any
    cupy: Any
    np: Any
    bundle_dir: Path
    device: str = "cuda"
    l2_bytes: int = 50 * 2**20
    memory_bytes: int = 8 * 2**30
    use_compile: bool = True
    modules: dict[str, Any] = field(default_factory=dict)
    per_kernel: bool = False  # also time each launch of a program case alone (``kernel_times``)
    # Baselines measured once per (kind, shape or program, dtype): a GEMM's tilings share one cuBLAS timing.
    baselines: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    def sync(self) -> None:
        if self.device.startswith("cuda"):
            self.torch.cuda.synchronize()


# ------------------------------------------------------------------------------------ what runs on the GPU


class BoundLaunch:
    """One kernel launch on fixed pointers, onto torch's current stream (the capture stream while capturing).

    A kernel with tensor-map parameters (TMA) gets its maps encoded here, once per set of pointers, and is
    launched through ``cuLaunchKernel`` (:mod:`benchmarks.gpu_tensor_map`); every other one through CuPy."""

    def __init__(self, env: Env, func: Any, spec: KernelSpec, pointers: list[int]) -> None:
        self.env, self.func, self.spec = env, func, spec
        self.args = tuple(env.np.uint64(p) for p in pointers)  # 8-byte values: the kernels' pointer params
        self.raw = None
        if spec.maps:
            from benchmarks.gpu_tensor_map import RawLaunch, function_handle

            launch = (spec.grid, spec.block, spec.smem)
            self.raw = RawLaunch(function_handle(func), pointers, spec.maps, launch)

    def __call__(self) -> None:
        current = self.env.torch.cuda.current_stream().cuda_stream
        if self.raw is not None:
            self.raw(current)
            return
        stream = self.env.cupy.cuda.ExternalStream(current)
        self.func(self.spec.grid, self.spec.block, self.args, shared_mem=self.spec.smem, stream=stream)


def load_kernels(env: Env, case: Case) -> list[Any]:
    """The case's functions (modules loaded once per cubin), with their shared-memory limit raised as needed."""
    funcs = []
    for spec in case.kernels:
        path = str(env.bundle_dir / spec.cubin)
        if path not in env.modules:
            env.modules[path] = env.cupy.RawModule(path=path)
        funcs.append(env.modules[path].get_function(spec.entry))
    for func, spec in zip(funcs, case.kernels, strict=True):
        if spec.smem > STATIC_SMEM_LIMIT and func.max_dynamic_shared_size_bytes < spec.smem:
            func.max_dynamic_shared_size_bytes = spec.smem
    return funcs


def kernel_launches(env: Env, case: Case, funcs: list[Any], tensors: Mapping[str, Any]) -> list[BoundLaunch]:
    """The case's launches, in order, on ``tensors`` (one copy of its inputs, intermediates and outputs)."""
    return [
        BoundLaunch(env, f, spec, [tensors[n].data_ptr() for n in spec.args])
        for f, spec in zip(funcs, case.kernels, strict=True)
    ]


def ours(env: Env, case: Case, funcs: list[Any], tensors: Mapping[str, Any]) -> Callable[[], list[Any]]:
    launches = kernel_launches(env, case, funcs, tensors)
    outputs = [tensors[n] for n in case.outputs_order]

    def run() -> list[Any]:
        for launch in launches:
            launch()
        return outputs

    return run


def capture(torch: Any, fns: list[Callable[[], Any]]) -> Any:
    """A CUDA graph of ``fns`` run in order, after one warm-up pass on a side stream (as torch asks)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for f in fns:
            f()
    torch.cuda.synchronize()
    return graph


def event_time(torch: Any, step: Callable[[], Any], reps: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        step()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) / 1e3


def time_replays(torch: Any, fns: list[Callable[[], Any]]) -> dict[str, Any]:
    """Seconds per run of one of ``fns`` (one per input copy): graph replays of all, events around them."""
    rec: dict[str, Any] = {"timing": "graph", "copies": len(fns)}
    try:
        graph = capture(torch, fns)
        step: Callable[[], Any] = graph.replay
    except Exception as exc:  # capture refused (an uncapturable call): time plain launches instead
        torch.cuda.synchronize()
        rec.update(timing="events", capture_error=one_line(exc))

        def step() -> None:
            for f in fns:
                f()

    for _ in range(WARMUP_REPLAYS):
        step()
    one = min(event_time(torch, step, 1) for _ in range(3))
    reps = max(1, math.ceil(MIN_SAMPLE_S / max(one, 1e-9)))
    samples = sorted(event_time(torch, step, reps) / (reps * len(fns)) for _ in range(SAMPLES))
    deciles = statistics.quantiles(samples, n=10)
    rec.update(median_s=statistics.median(samples), p10_s=deciles[0], p90_s=deciles[-1], reps=reps)
    rec["samples"] = len(samples)
    return rec


def kernel_times(
    torch: Any,
    launch_sets: list[list[Callable[[], Any]]],
    timer: Callable[[Any, list[Callable[[], Any]]], dict[str, Any]] = time_replays,
) -> list[dict[str, Any]]:
    """Each launch of a case timed alone: ``launch_sets[i][k]`` is launch ``k`` on input copy ``i``; launch
    ``k``'s replays cycle over the copies as the whole case's do. Its operands are what the case's own runs
    left in the copies (the inputs and the earlier launches' results), so it computes what it computes in the
    case. A launch whose timing fails has its one-line error instead."""
    out = []
    for k in range(len(launch_sets[0])):
        try:
            out.append(timer(torch, [launches[k] for launches in launch_sets]))
        except Exception as exc:
            out.append({"error": one_line(exc)})
    return out


# ---------------------------------------------------------------------------- the device, once per bundle


SELF_CHECK_SRC = r"""
extern "C" __global__ void gensorage_self_check(const float* x, float* y) {
  extern __shared__ float buf[];  // launched with 64 KiB: needs the raised dynamic shared-memory limit
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  buf[threadIdx.x] = x[i]; __syncthreads(); y[i] = 2.0f * buf[threadIdx.x] + 1.0f;
}
"""


def self_check(env: Env) -> dict[str, Any]:
    """The launch path end to end on a kernel NVRTC compiles here: direct launch, graph replay, event timing."""
    torch = env.torch
    rec: dict[str, Any] = {"ok": False}
    try:
        func = env.cupy.RawKernel(SELF_CHECK_SRC, "gensorage_self_check")
        func.max_dynamic_shared_size_bytes = 64 * 1024
        x, y = torch.empty(256 * 256, device=env.device), torch.empty(256 * 256, device=env.device)
        spec = KernelSpec("", "gensorage_self_check", (256, 1, 1), (256, 1, 1), 64 * 1024, ("x", "y"))
        launch = BoundLaunch(env, func, spec, [x.data_ptr(), y.data_ptr()])
        rec["direct"] = _self_check_run(torch, x, y, launch)
        graph = capture(torch, [launch])
        rec["graph"] = _self_check_run(torch, x, y, graph.replay)
        rec.update(time_replays(torch, [launch]))
        rec["ok"] = rec["direct"] and rec["graph"] and rec["timing"] == "graph"
    except Exception as exc:
        rec["error"] = one_line(exc)
    return rec


def _self_check_run(torch: Any, x: Any, y: Any, step: Callable[[], Any]) -> bool:
    x.normal_()
    y.fill_(float("nan"))
    step()
    torch.cuda.synchronize()
    return bool(torch.equal(y, 2.0 * x + 1.0))


def device_facts(torch: Any, cupy: Any) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": torch.cuda.get_device_name(0),
        "sm_count": props.multi_processor_count,
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "memory_bytes": props.total_memory,
        "capability": f"{props.major}.{props.minor}",
        "driver": nvidia_driver(),
        "driver_cuda": cupy.cuda.runtime.driverGetVersion(),
        "cuda_runtime": torch.version.cuda,
        "torch": torch.__version__,
        "cupy": cupy.__version__,
    }


def nvidia_driver() -> str | None:
    try:
        proc = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() or None


def ceilings(torch: Any) -> dict[str, Any]:
    """A 1 GiB device-to-device copy (bytes read + written) and an 8192^3 fp16 matmul, on random data."""

    def copy_time() -> dict[str, Any]:
        src = torch.randn(2**29, device="cuda", dtype=torch.float16)
        dst = torch.empty_like(src)
        return time_replays(torch, [lambda: dst.copy_(src)])

    def matmul_time() -> dict[str, Any]:
        a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.float16) for _ in range(2))
        return time_replays(torch, [lambda: torch.matmul(a, b)])

    copy, mm = copy_time(), matmul_time()
    torch.cuda.empty_cache()
    return {
        "copy_gbps": 2 * 2**30 / copy["median_s"] / 1e9,
        "copy": copy,
        "matmul_fp16_tflops": 2 * 8192**3 / mm["median_s"] / 1e12,
        "matmul": mm,
    }

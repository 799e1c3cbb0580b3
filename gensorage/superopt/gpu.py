"""Timing µGraph kernels on a GPU (used only where one exists: full mode's profiling, the GPU benchmark)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gensorage.codegen.module import CompiledUGraph
    from gensorage.program import Program


def gpu_unavailable_reason() -> str | None:
    """None when TVM can run CUDA kernels here, else why not."""
    try:
        from gensorage.codegen.cuda_build import cuda_device_available

        return cuda_device_available()
    except ImportError as exc:  # a TVM build without CUDA support
        return f"TVM cannot load CUDA: {exc}"


def gpu_name() -> str:
    """The name of GPU 0 as TVM reports it."""
    import tvm

    return str(tvm.cuda(0).device_name)


def measure_ugraph(compiled: CompiledUGraph, program: Program, *, seed: int = 0, warmup: int = 5,
                   repeats: int = 50) -> float:
    """Median wall time (s) of one launch of all of ``compiled``'s kernels on GPU 0.

    Inputs (random, the program's dtypes) and every intermediate live on the device; each timed run is
    bracketed by device synchronisations, so it includes the kernels' launch overheads, as a user sees them.
    """
    import numpy as np
    import tvm

    from gensorage.codegen.module import execute
    from gensorage.codegen.scalar import FloatScalar
    from gensorage.ops.data import numpy_dtype

    arrays = [a.astype(numpy_dtype(t.dtype)) for a, t in zip(program.random_inputs(seed), program.inputs,
                                                                strict=True)]
    compiled.run(*arrays, target="cuda")  # builds the CUDA module (and picks nvcc where NVRTC is missing)
    dev = tvm.cuda(0)
    inputs = [tvm.runtime.tensor(a, device=dev) for a in arrays]
    kernels, ex = compiled.kernels("cuda"), compiled.executable("cuda")
    scalar = FloatScalar(compiled.compute)
    for _ in range(warmup):
        execute(compiled.ugraph, compiled.info, kernels, ex, inputs, dev, scalar)
    dev.sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        execute(compiled.ugraph, compiled.info, kernels, ex, inputs, dev, scalar)
        dev.sync()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


__all__ = ["gpu_name", "gpu_unavailable_reason", "measure_ugraph"]

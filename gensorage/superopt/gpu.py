"""Timing µGraph kernels on a GPU (used only where one exists: full mode's profiling, the GPU benchmark)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gensorage.codegen.module import CompiledUGraph
    from gensorage.program import Program

#: Launches per timed sample for fast programs: the host synchronises once per sample, so its cost is shared by
#: this many runs. A program whose one run takes SLOW_RUN_S or more is timed one run per sample.
RUNS_PER_SAMPLE = 10
SLOW_RUN_S = 1e-3
#: Fewest samples a median is taken over, however small the time budget.
MIN_SAMPLES = 5


@dataclass(frozen=True, slots=True)
class Timing:
    """A median and how it was taken."""

    median_s: float
    samples: int
    runs_per_sample: int

    def to_json(self) -> dict[str, float | int]:
        return {"median_s": self.median_s, "samples": self.samples, "runs_per_sample": self.runs_per_sample}


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


def median_time(
    run: Callable[[], None],
    sync: Callable[[], None],
    *,
    warmup: int = 5,
    repeats: int = 50,
    budget_s: float | None = None,
) -> Timing:
    """Median seconds of one ``run()``, by wall clock between ``sync()`` calls.

    One probe run sets the runs per sample (RUNS_PER_SAMPLE back to back for fast programs, one for slow
    ones) and, with ``budget_s``, cuts the ``repeats`` samples to what fits the budget (at least MIN_SAMPLES),
    so a slow candidate cannot hold up a search's profiling for minutes.
    """
    import numpy as np

    run()
    sync()
    t0 = time.perf_counter()
    run()
    sync()
    once = time.perf_counter() - t0
    per = RUNS_PER_SAMPLE if once < SLOW_RUN_S else 1
    if budget_s is not None:
        repeats = max(MIN_SAMPLES, min(repeats, int(budget_s / max(once * per, 1e-9))))
        warmup = min(warmup, repeats)
    for _ in range(warmup):
        run()
    sync()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(per):
            run()
        sync()
        samples.append((time.perf_counter() - t0) / per)
    return Timing(float(np.median(samples)), repeats, per)


def program_inputs(program: Program, seed: int) -> list[Any]:
    """The program's random inputs (``Program.random_inputs``) rounded to its dtypes: what the GPU runs on."""
    from gensorage.workloads.data import numpy_dtype

    return [
        a.astype(numpy_dtype(t.dtype))
        for a, t in zip(program.random_inputs(seed), program.inputs, strict=True)
    ]


def measure_ugraph(
    compiled: CompiledUGraph,
    program: Program,
    *,
    seed: int = 0,
    warmup: int = 5,
    repeats: int = 50,
    budget_s: float | None = None,
) -> Timing:
    """Median wall time of one launch of all of ``compiled``'s kernels on GPU 0.

    Inputs (random, the program's dtypes), intermediates and outputs are allocated on the device once; the
    timed runs only launch the kernels (see :func:`median_time`).
    """
    import tvm

    from gensorage.codegen.module import launch_plan
    from gensorage.codegen.scalar import FloatScalar

    arrays = program_inputs(program, seed)
    compiled.run(*arrays, target="cuda")  # builds the CUDA module (and picks nvcc where NVRTC is missing)
    dev = tvm.cuda(0)
    inputs = [tvm.runtime.tensor(a, device=dev) for a in arrays]
    calls, _ = launch_plan(
        compiled.ugraph,
        compiled.info,
        compiled.kernels("cuda"),
        compiled.executable("cuda"),
        inputs,
        dev,
        FloatScalar(compiled.compute),
    )

    def run() -> None:
        for _, f, args in calls:
            f(*args)

    return median_time(run, dev.sync, warmup=warmup, repeats=repeats, budget_s=budget_s)


__all__ = [
    "MIN_SAMPLES",
    "RUNS_PER_SAMPLE",
    "SLOW_RUN_S",
    "Timing",
    "gpu_name",
    "gpu_unavailable_reason",
    "measure_ugraph",
    "median_time",
    "program_inputs",
]

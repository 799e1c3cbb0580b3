"""GPU timing and full mode's choice by measurement, checked without a GPU (a CPU launch plan, a fake clock)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_superopt import SOFTMAX, TINY

from gensorage.codegen.module import compile_ugraph, execute, launch_plan
from gensorage.codegen.scalar import FloatScalar
from gensorage.hw import load_profile
from gensorage.superopt import gpu, run, superoptimize
from gensorage.superopt.presets import preset_from_dict
from gensorage.ugraph.examples import EXAMPLES

HW = load_profile("h100")


@pytest.mark.parametrize("name", ["flash_attention", "rmsnorm_matmul", "lora"])
def test_a_launch_plan_repeats_the_computation_without_allocating(name: str) -> None:
    import tvm

    program, g = EXAMPLES[name](dtype="float32")
    cg = compile_ugraph(g, HW, "llvm")
    rng = np.random.default_rng(0)
    xs = [rng.uniform(-1, 1, s.shape).astype(np.float32) for s in g.inputs]
    dev = tvm.cpu(0)
    inputs = [tvm.runtime.tensor(x, device=dev) for x in xs]
    args = (g, cg.info, cg.kernels("llvm"), cg.executable("llvm"), inputs, dev, FloatScalar(cg.compute))
    calls, outs = launch_plan(*args)
    assert len(calls) == len(cg.kernels("llvm"))
    want = [o.numpy() for o in execute(*args)]
    for _ in range(2):  # the same buffers, run twice: same answer, and it is the program's
        for _, f, a in calls:
            f(*a)
        for o, w, ref in zip(outs, want, program.run(*xs), strict=True):
            np.testing.assert_array_equal(o.numpy(), w)
            np.testing.assert_allclose(o.numpy(), ref, rtol=1e-4, atol=1e-5)


def test_median_time_counts_probe_warmup_and_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(float(t) for t in range(1000))  # every clock reading is one second later: a slow program
    monkeypatch.setattr(gpu.time, "perf_counter", lambda: next(clock))
    runs, syncs = [], []
    t = gpu.median_time(lambda: runs.append(1), lambda: syncs.append(1), warmup=3, repeats=4)
    assert t.runs_per_sample == 1 and t.samples == 4
    assert len(runs) == 2 + 3 + 4 and len(syncs) == 2 + 1 + 4
    assert t.median_s == 1.0


def test_median_time_batches_fast_runs_and_keeps_to_its_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    runs: list[int] = []

    def run() -> None:  # a fast program: 10 µs a run
        runs.append(1)
        now[0] += 1e-5

    monkeypatch.setattr(gpu.time, "perf_counter", lambda: now[0])
    t = gpu.median_time(run, lambda: None, warmup=3, repeats=50)
    assert t.runs_per_sample == gpu.RUNS_PER_SAMPLE and t.samples == 50
    assert t.median_s == pytest.approx(1e-5)
    assert len(runs) == 2 + 3 + 50 * gpu.RUNS_PER_SAMPLE
    tight = gpu.median_time(run, lambda: None, warmup=3, repeats=50, budget_s=1e-3)
    assert tight.samples == 10  # 1 ms / (10 runs of 10 µs)
    tighter = gpu.median_time(run, lambda: None, warmup=3, repeats=50, budget_s=1e-9)
    assert tighter.samples == gpu.MIN_SAMPLES


def test_full_mode_takes_the_fastest_measured_candidate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fake GPU on which more kernels run faster, so the direct µGraph (three kernels) is the fastest even
    # though the cost model ranks it last: the measurement must decide, and the direct must be among the timed.
    monkeypatch.setattr(run, "gpu_unavailable_reason", lambda: None)
    monkeypatch.setattr(run, "gpu_name", lambda: "fake GPU")
    monkeypatch.setattr(run, "measure_ugraph", lambda c, p, **kw: gpu.Timing(1.0 / len(c.ugraph.ops), 5, 1))
    (tmp_path / "softmax.gsp").write_text(SOFTMAX)
    preset = preset_from_dict({"search": TINY}, name="test")
    r = superoptimize(
        tmp_path / "softmax.gsp",
        mode="full",
        preset=preset,
        workers=1,
        store=tmp_path / "s.sqlite",
        checkpoint=tmp_path / "c.sqlite",
        progress=False,
    )
    assert r.selection == f"median of up to {run.PROFILE_REPEATS} samples on fake GPU"
    assert r.measured is not None and len(r.measured) == run.PROFILE_TOP + 1 and "direct" in r.measured
    assert r.is_direct and r.measured["direct"] == min(r.measured.values()) == 1.0 / 3

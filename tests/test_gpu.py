"""On a CUDA GPU: the emitted kernels run there and match numpy float64 (skipped where TVM sees no GPU).

Every check draws fresh random inputs twice, so an output the kernels leave unwritten (or stale from an earlier
run) cannot pass; the error is ||out - ref|| / ||ref|| against the float64 reference computed from the same
rounded inputs.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import gensorage.workloads as workloads
from gensorage.codegen.cuda_build import cuda_device_available
from gensorage.codegen.module import compile_ugraph
from gensorage.hw import load_profile
from gensorage.program import load_config
from gensorage.superopt import load_preset, superoptimize
from gensorage.superopt.presets import preset_from_dict
from gensorage.ugraph.examples import EXAMPLES
from gensorage.ugraph.from_program import from_program
from gensorage.workloads.data import numpy_dtype

NO_GPU = cuda_device_available()
pytestmark = pytest.mark.skipif(NO_GPU is not None, reason=f"needs a CUDA GPU: {NO_GPU}")

HW = load_profile("h100")
SOFTMAX = """program softmax
param m = 64
param n = 200
input X [m, n] float32
E = exp(X)
O = div(E, sum(E, dim=1))
output O
"""


def _rel_err(got: list[Any], want: list[np.ndarray]) -> float:
    errs = []
    for g, w in zip(got, want, strict=True):
        g64 = np.asarray(g, dtype=np.float64)
        assert np.isfinite(g64).all()
        errs.append(float(np.linalg.norm(g64 - w) / np.linalg.norm(w)))
    return max(errs)


def _rounded(program: Any, seed: int, dtype: str | None = None) -> list[np.ndarray]:
    return [
        a.astype(numpy_dtype(dtype or t.dtype))
        for a, t in zip(program.random_inputs(seed), program.inputs, strict=True)
    ]


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_paper_example_runs_on_cuda_float32(name: str) -> None:
    program, g = EXAMPLES[name](dtype="float32")
    cg = compile_ugraph(g, HW, "cuda")
    for seed in (0, 1):
        xs = _rounded(program, seed)
        assert _rel_err(cg.run(*xs, target="cuda"), program.run(*xs)) < 1e-5


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_paper_example_runs_on_cuda_in_its_own_dtype(name: str) -> None:
    program, g = EXAMPLES[name]()
    cg = compile_ugraph(g, HW, "cuda")
    for seed in (2, 3):
        xs = _rounded(program, seed)
        got = cg.run(*xs, target="cuda")
        assert got[0].dtype == xs[0].dtype
        assert _rel_err(got, program.run(*xs)) < 1e-2


@pytest.mark.parametrize(
    "name", ["rmsnorm", "gated_mlp", "lora", "mha_incdec", "gqa_prefill", "qknorm", "moe"]
)
def test_direct_ugraph_of_a_bundled_program_runs_on_cuda(name: str) -> None:
    program = load_config(name, load_preset(name).search_params)
    cg = compile_ugraph(from_program(program), HW, "cuda")
    for seed in (0, 1):
        xs = _rounded(program, seed)
        assert _rel_err(cg.run(*xs, target="cuda"), program.run(*xs)) < 1e-2


def test_torch_tensors_go_in_and_come_out_on_the_device() -> None:
    torch = pytest.importorskip("torch")
    program, g = EXAMPLES["flash_attention"](dtype="float32")
    xs = _rounded(program, 4)
    outs = compile_ugraph(g, HW, "cuda").run(*[torch.as_tensor(x, device="cuda") for x in xs], target="cuda")
    got = [torch.from_dlpack(o) for o in outs]
    assert all(t.is_cuda for t in got)
    assert _rel_err([t.cpu().numpy() for t in got], program.run(*xs)) < 1e-5


def test_dlpack_outputs_stay_right_once_tvm_lets_go() -> None:
    """The general CUDA run on torch tensors (many kernels, intermediates freed at the end of each call): the
    outputs torch imports stay right after TVM's tensors are dropped, torch's allocator churns, and several
    calls are queued before the one synchronize (the decoder layer once read garbage through this path)."""
    torch = pytest.importorskip("torch")
    program = load_config("rmsnorm", load_preset("rmsnorm").search_params)
    cg = compile_ugraph(from_program(program), HW, "cuda")
    got, want = [], []
    for seed in range(4):
        xs = _rounded(program, 10 + seed)
        ins = [torch.from_numpy(x.astype(np.float32)).to("cuda", torch.float16) for x in xs]
        outs = cg.run(*ins, target="cuda")
        got.append([torch.from_dlpack(o) for o in outs])
        del outs
        churn = [torch.full((1 << 20,), float("nan"), device="cuda") for _ in range(8)]
        del churn
        want.append(program.run(*[t.cpu().double().numpy() for t in ins]))
    torch.cuda.synchronize()
    for g, w in zip(got, want, strict=True):
        assert _rel_err([t.cpu().double().numpy() for t in g], w) < 2e-2


def test_full_mode_profiles_the_top_candidates_on_the_gpu(tmp_path: Path) -> None:
    (tmp_path / "softmax.gsp").write_text(SOFTMAX)
    preset = preset_from_dict(
        {
            "search": {
                "max_kernel_ops": 1,
                "max_block_ops": 3,
                "max_grid_dims": 1,
                "max_block_inputs": 2,
                "max_block_outputs": 1,
            },
            "search_params": {"m": 4, "n": 16},
        },
        name="test",
    )
    r = superoptimize(
        tmp_path / "softmax.gsp",
        mode="full",
        preset=preset,
        workers=2,
        store=tmp_path / "s.sqlite",
        checkpoint=tmp_path / "c.sqlite",
        progress=False,
    )
    assert r.selection.startswith("median of") and r.measured
    assert all(math.isfinite(t) and t > 0 for t in r.measured.values())
    assert r.origin in r.measured
    assert r.measured[r.origin] == min(r.measured.values())
    for seed in (0, 1):
        xs = _rounded(r.program, seed)
        assert _rel_err(r.run(*xs, target="cuda"), r.program.run(*xs)) < 1e-5


@pytest.mark.parametrize(
    "wl",
    [
        workloads.gemm(96, 80, 72, dtype="float32"),
        workloads.gemm(256, 512, 128),
        workloads.gemv(300, 1000),
        workloads.batch_matmul(4, 64, 48, 80),
    ],
    ids=str,
)
def test_tuned_single_op_runs_on_cuda(wl: Any) -> None:
    from gensorage.tuning import tune

    r = tune(wl, "h100", "markov", use_store=False)
    for seed in (0, 1):
        xs = workloads.random_inputs(wl, seed)
        got = np.asarray(r.run(*xs, target="cuda"), dtype=np.float64)
        want = np.asarray(wl.reference(*xs), dtype=np.float64)
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2

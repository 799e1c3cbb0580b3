"""A regression: full mode's choice for mha_specdec (now mha_specdec_papers; search #37 on the H200 profile) read
uninitialised register slots once its exp thread graph was fused into the tensor-core matmul phase on a subset
of the warps, while an accumulator summed that graph's output tiles: NaN in about half the outputs, on the GPU and in the CPU twin alike
(`gpu_suite-h200-candidates-2026-11-26.json`). A thread graph that feeds an accumulator now runs in a phase of its
own (`block_mma.fused_thread_graphs`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from gensorage.arith import Float64Arith
from gensorage.codegen.module import compile_ugraph
from gensorage.hw import load_profile
from gensorage.program import load_config
from gensorage.ugraph.ir import KernelGraph

DATA = Path(__file__).parent / "data"


def test_mha_specdec_search_choice_matches_float64_on_the_cpu_twin() -> None:
    program = load_config("mha_specdec_papers")
    g = KernelGraph.from_json(json.loads((DATA / "mha_specdec_search37.ugraph.json").read_text()))
    cg = compile_ugraph(g, load_profile("h200"), "cuda")
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(s.shape).astype(np.float16) for s in program.inputs]
    (want,) = program.evaluate(Float64Arith(), [x.astype(np.float64) for x in inputs])
    (got,) = cg.run(*inputs, target="cpu")
    got = got.astype(np.float64)
    assert np.isfinite(got).all()
    # P (exp, kept in float32) times V on tensor cores in bfloat16, rounded by the twin as on the GPU (2^-9).
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 4e-3

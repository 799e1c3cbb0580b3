"""The µGraph cost model against the device: the measured order of a program's fused and direct µGraphs.

The orderings are data: the committed H200 run (``benchmarks/results/``) measured each fused µGraph of
``benchmarks.gpu_prepare.DIRECT_OF`` and the direct µGraph of its program; full mode picks the one the model
predicts faster, so the model must order every measured pair as the device did.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.calibrate_ugraph import rebuild
from benchmarks.gpu_prepare import DIRECT_OF, measured_as
from gensorage.hw import load_profile
from gensorage.precision import DEFAULT_PRECISION
from gensorage.ugraph.cost import predict_ugraph_time

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks/results/gpu_suite-h200-fused-mma-2026-11-26.json"


def _measured_pairs() -> list[tuple[str, str, float, float]]:
    """(fused, direct, measured fused s, measured direct s) for every pair the run measured."""
    data = json.loads(RESULTS.read_text())
    prepared = data["prepared"]["date"]  # before issue 23 its attention programs were the papers' form
    medians = {
        measured_as(c["name"].removeprefix("program_"), prepared): c["methods"]["ours"]["median_s"]
        for c in data["cases"]
        if c.get("kind") == "program" and c.get("status") == "ok" and "median_s" in c["methods"]["ours"]
    }
    return [
        (f, d, medians[f], medians[d])
        for f, d in DIRECT_OF.items()
        if f in medians and d in medians and f not in REBUILT
    ]


#: Fused µGraphs whose kernels the generator emits differently since the run measured them (the order measured
#: then says nothing of the model's price now); each waits for a run of the new kernel.
REBUILT = {
    # Measured with the online-softmax P·V on CUDA cores, one thread per output element; tensor cores since
    # issue 26 (gensorage.codegen.online_mma).
    "llama3_flash_attention2",
}


PAIRS = _measured_pairs()
HW = load_profile(json.loads(RESULTS.read_text())["prepared"]["hw"])


def test_the_run_measured_fused_and_direct_pairs() -> None:
    # gated_mlp, rmsnorm and mha_prefill (LLaMA-3's prefill attention waits in REBUILT): without them the test
    # below checks nothing.
    assert len(PAIRS) >= 3


@pytest.mark.parametrize(("fused", "direct", "fused_s", "direct_s"), PAIRS, ids=[p[0] for p in PAIRS])
def test_the_model_orders_fused_and_direct_as_measured(
    fused: str, direct: str, fused_s: float, direct_s: float
) -> None:
    predicted_fused = predict_ugraph_time(rebuild(fused, DEFAULT_PRECISION)[0], HW)
    predicted_direct = predict_ugraph_time(rebuild(direct, DEFAULT_PRECISION)[0], HW)
    assert (predicted_fused < predicted_direct) == (fused_s < direct_s), (
        f"{fused}: predicted {predicted_fused * 1e6:.1f} us vs {direct} {predicted_direct * 1e6:.1f} us; "
        f"measured {fused_s * 1e6:.1f} vs {direct_s * 1e6:.1f}"
    )

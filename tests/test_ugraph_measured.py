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

RUNS = [  # in order: a later run's measurement of a µGraph replaces an earlier one's
    Path(__file__).resolve().parents[1] / "benchmarks/results" / name
    for name in (
        "gpu_suite-h200-fused-mma-2026-11-26.json",
        # The tensor-core online-softmax FA-2 kernels (LLaMA-3's and the stable mha_prefill's), beside the direct
        # µGraph of one kernel per op ("_perop": since row fusion, the plain case name is the row-fused one).
        "gpu_suite-h200-session11-attention-2026-11-27.json",
    )
]


def _medians(path: Path) -> dict[str, float]:
    """Median seconds of every checked program case of one run, by the µGraph it measured."""
    data = json.loads(path.read_text())
    prepared = data["prepared"]["date"]  # before issue 23 its attention programs were the papers' form
    row_fused = any(c["name"].endswith("_perop") for c in data["cases"])
    medians = {}
    for c in data["cases"]:
        name = c["name"].removeprefix("program_")
        if c.get("kind") != "program" or c.get("status") != "ok" or "median_s" not in c["methods"]["ours"]:
            continue
        if row_fused and name in DIRECT_OF.values():
            continue  # the row-fused direct µGraph, not the one rebuild() builds
        medians[measured_as(name.removesuffix("_perop"), prepared)] = c["methods"]["ours"]["median_s"]
    return medians


def _measured_pairs() -> list[tuple[str, str, float, float]]:
    """(fused, direct, measured fused s, measured direct s) for every pair a run measured both sides of."""
    pairs = {}
    for path in RUNS:
        medians = _medians(path)
        pairs |= {
            f: (f, d, medians[f], medians[d]) for f, d in DIRECT_OF.items() if f in medians and d in medians
        }
    return list(pairs.values())


PAIRS = _measured_pairs()
HW = load_profile(json.loads(RUNS[-1].read_text())["prepared"]["hw"])


def test_the_run_measured_fused_and_direct_pairs() -> None:
    # gated_mlp, rmsnorm and mha_prefill (the papers' form), LLaMA-3's FA-2 and the stable mha_prefill's: without
    # them the test below checks nothing.
    assert {p[0] for p in PAIRS} >= {"fused_gated_mlp", "llama3_flash_attention2", "fa2_mha_prefill"}


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

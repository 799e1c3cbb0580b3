"""The µGraph cost model against the device: the measured order of a program's µGraphs.

The orderings are data: the committed H200 runs (``benchmarks/results/``) measured each fused µGraph of
``benchmarks.gpu_prepare.DIRECT_OF`` and the direct µGraph of its program, each program's row-fused and direct
µGraphs, and full mode's candidates of four prefill attention programs; full mode picks the one the model
predicts fastest, so the model must order every measured pair as the device did.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.calibrate_ugraph import ORDER_TOLERANCE, Measured, measured_programs, predict, rebuild
from benchmarks.gpu_prepare import DIRECT_OF, measured_as
from gensorage.hw import load_profile
from gensorage.precision import DEFAULT_PRECISION
from gensorage.ugraph.cost import predict_ugraph_time

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks/results"
RUNS = [  # in order: a later run's measurement of a µGraph replaces an earlier one's
    [RESULTS / name for name in names]  # files of one session, bundled from one tree: one run
    for names in (
        ["gpu_suite-h200-fused-mma-2026-11-26.json"],
        [
            # The direct µGraphs of the programs with fused examples (fused_rmsnorm's rmsnorm) ...
            "gpu_suite-h200-session11-2026-11-27.json",
            # ... and the fused examples, among them the tensor-core online-softmax FA-2 kernels (LLaMA-3's and
            # the stable mha_prefill's) beside the direct µGraph of one kernel per op ("_perop": since row
            # fusion, the plain case name is the row-fused one).
            "gpu_suite-h200-session11-attention-2026-11-27.json",
        ],
    )
]
#: Full mode's candidates (the row-fused direct µGraph, the search's, the direct one) of four prefill attention
#: programs, measured side by side: full mode without a device picks the one the model prices fastest.
CANDIDATES_RUN = RESULTS / "gpu_suite-h200-session11-candidates-2026-11-27.json"


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
    for paths in RUNS:
        medians = {k: v for path in paths for k, v in _medians(path).items()}
        pairs |= {
            f: (f, d, medians[f], medians[d]) for f, d in DIRECT_OF.items() if f in medians and d in medians
        }
    return list(pairs.values())


PAIRS = _measured_pairs()
HW = load_profile(json.loads(RUNS[-1][-1].read_text())["prepared"]["hw"])


def test_the_run_measured_fused_and_direct_pairs() -> None:
    # gated_mlp, rmsnorm and mha_prefill (the papers' form), LLaMA-3's FA-2 and the stable mha_prefill's: without
    # them the test below checks nothing.
    assert {p[0] for p in PAIRS} >= {
        "fused_gated_mlp",
        "fused_rmsnorm",
        "llama3_flash_attention2",
        "fa2_mha_prefill",
    }


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


def _by_program(cases: list[Measured]) -> dict[str, list[Measured]]:
    groups: dict[str, list[Measured]] = {}
    for m in cases:
        groups.setdefault(m.program, []).append(m)
    return groups


CANDIDATE_SETS = _by_program(measured_programs([CANDIDATES_RUN]))


def test_every_candidate_of_the_candidates_run_is_rebuilt() -> None:
    # Each program's µGraphs, the search's among them (benchmarks/results/candidates-ugraphs-*.json), in the
    # dtypes the run stored them in (calibrate_ugraph.as_measured): without them the test below checks nothing.
    assert {p: len(g) for p, g in CANDIDATE_SETS.items()} == {
        "mha_prefill": 3,
        "gqa_prefill": 3,
        "llama3_flash_attention2": 2,
        "fa2_mha_prefill": 2,
    }


@pytest.mark.parametrize("program", sorted(CANDIDATE_SETS))
def test_full_modes_choice_by_the_model_is_the_fastest_measured_candidate(program: str) -> None:
    group = CANDIDATE_SETS[program]
    predicted = {m.name: predict(m, HW) for m in group}
    chosen = min(group, key=lambda m: predicted[m.name])
    fastest = min(group, key=lambda m: m.measured_s)
    assert chosen is fastest, {m.name: (predicted[m.name] * 1e6, m.measured_s * 1e6) for m in group}


#: Each program's row-fused µGraph (its plain case, and "_rows" without the matmul epilogues) beside its direct
#: µGraph of one kernel per op ("_perop"), measured in one run.
ROW_FUSED = [
    (name, [m for m in group if not m.name.endswith(("_st1", "_st2", "_st3"))])
    for name, group in _by_program(measured_programs(RUNS[-1])).items()
    if any(m.name.endswith("_perop") for m in group)
]


def test_the_runs_measured_row_fused_and_direct_pairs() -> None:
    assert len(ROW_FUSED) >= 15


@pytest.mark.parametrize(("program", "group"), ROW_FUSED, ids=[p for p, _ in ROW_FUSED])
def test_the_model_orders_row_fused_and_direct_as_measured(program: str, group: list[Measured]) -> None:
    (direct,) = (m for m in group if m.name.endswith("_perop"))
    for m in group:
        if m is direct or abs(m.measured_s / direct.measured_s - 1) <= ORDER_TOLERANCE:
            continue  # as fast as measured: either order is right
        assert (predict(m, HW) < predict(direct, HW)) == (m.measured_s < direct.measured_s), (
            f"{m.name}: predicted {predict(m, HW) * 1e6:.1f} us vs {predict(direct, HW) * 1e6:.1f}; "
            f"measured {m.measured_s * 1e6:.1f} vs {direct.measured_s * 1e6:.1f}"
        )

"""Full mode's candidates on the device: the runner's summary of whether full mode chose the fastest measured."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks.gpu_candidates import candidate_cases, candidate_lines
from gensorage.hw import load_profile
from gensorage.ugraph import KernelGraph, examples


def _case(
    program: str, origin: str, predicted_us: float, measured_us: float | None, chosen: bool
) -> dict[str, Any]:
    ours = {} if measured_us is None else {"median_s": measured_us * 1e-6}
    return {
        "name": f"program_{program}_{origin}",
        "methods": {"ours": ours},
        "candidate": {
            "program": program,
            "origin": origin,
            "predicted_s": predicted_us * 1e-6,
            "chosen": chosen,
        },
    }


def test_the_summary_says_whether_full_modes_choice_was_the_fastest_measured() -> None:
    cases = [
        _case("gated_mlp", "search #4", 23.0, 85.0, chosen=True),
        _case("gated_mlp", "direct", 28.0, 31.0, chosen=False),
        _case("rmsnorm", "direct", 18.0, 19.6, chosen=True),
        _case("rmsnorm", "search #0", 25.0, 25.6, chosen=False),
        _case("rmsnorm", "search #1", 26.0, None, chosen=False),  # not measured (deadline): not counted
        {"name": "gemm_M1", "methods": {"ours": {"median_s": 1e-3}}},  # not a candidate
    ]
    lines = candidate_lines(cases)
    assert len(lines) == 3
    assert (
        lines[0].startswith("gated_mlp")
        and "chose search #4" in lines[0]
        and "fastest measured direct" in lines[0]
    )
    assert lines[0].endswith("choice != fastest")
    assert "of 2;" in lines[1] and lines[1].endswith("choice = fastest")
    assert lines[2] == "full mode's choice is the fastest measured candidate for 1 of 2 programs"


def test_no_candidates_no_lines() -> None:
    assert candidate_lines([{"name": "gemm_M1", "methods": {"ours": {"median_s": 1e-3}}}]) == []


def test_a_candidate_the_build_refuses_is_replaced_by_the_next_and_kept_for_reproduction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gensorage
    from benchmarks import gpu_prepare

    _, g = examples.gated_mlp(m=8, k=64, n=64, blocks=2, forloop=2)
    ranked = (
        ("search #3", g, 1e-5),
        ("direct", g, 2e-5),
        ("fused", g, 2.5e-5),  # the direct µGraph row-fused: bundled wherever it ranks, like the direct one
        ("search #0", g, 3e-5),
        ("search #1", g, 4e-5),
        ("search #9", g, 1.0),  # 50,000 times the direct µGraph: not worth the device's time
    )
    result = SimpleNamespace(candidates=ranked, origin="search #3", stopped_by=None, complete=True)
    monkeypatch.setattr(gensorage, "superoptimize", lambda *a, **k: result)
    monkeypatch.setattr(gpu_prepare, "load_program", lambda name: None)
    monkeypatch.setattr(
        gpu_prepare, "program_path", lambda name, program, out: f"configs/programs/{name}.gsp"
    )

    def program_case(name: str, *args: Any) -> dict[str, Any]:
        if name.endswith("_c0"):
            raise RuntimeError("Cannot insert syncs inside condition")
        return {"name": f"program_{name}"}

    monkeypatch.setattr(gpu_prepare, "program_case", program_case)
    cases = candidate_cases("gated_mlp", load_profile("h200"), tmp_path, 3, 1.0, "float32")
    assert [(c["name"], c["candidate"]["rank"], c["candidate"]["chosen"]) for c in cases] == [
        ("program_gated_mlp_direct", 1, False),
        ("program_gated_mlp_fused", 2, False),
        ("program_gated_mlp_c3", 3, False),  # the next in rank stand in for the refused one
        ("program_gated_mlp_c4", 4, False),
    ]
    failed = json.loads((tmp_path / "program_gated_mlp_c0.failed.json").read_text())
    assert "syncs inside condition" in failed["error"]
    assert KernelGraph.from_json(failed["ugraph"]) == g


def test_a_choice_that_was_not_measured_is_no_agreement() -> None:
    cases = [_case("mha_prefill", "direct", 1168.0, 1187.0, chosen=False)]  # the chosen one was not bundled
    line, total = candidate_lines(cases)
    assert "chose a µGraph not measured" in line and line.endswith("choice != fastest")
    assert total.endswith("for 0 of 1 programs")

"""Full mode's candidates on the device: the runner's summary of whether full mode chose the fastest measured."""

from __future__ import annotations

from typing import Any

from benchmarks.gpu_candidates import candidate_lines


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

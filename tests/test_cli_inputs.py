"""Bad command-line input is a one-line error with a nonzero exit, whichever subcommand gets it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gensorage.cli import main
from gensorage.errors import ConfigError
from gensorage.exhaustive.spec import SearchSpec
from gensorage.program import parse_program
from tests.conftest import ONE


def _one_line_error(capsys: pytest.CaptureFixture[str], *needles: str) -> None:
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and all(n in err for n in needles), err


@pytest.mark.parametrize(
    "argv",
    [
        ["search", "{prog}", "--seed", "-5"],
        ["program", "run", "{prog}", "--seed", "-1"],
        ["verify", "{prog}", "{prog}", "--seed", "-1"],
        ["tune", "--op", "gemm", "--shape", "M=64,N=64,K=64", "--no-store", "--seed", "-1"],
        ["superopt", "{prog}", "--seed", "-1"],
    ],
)
def test_a_negative_seed_is_a_usage_error(
    argv: list[str], prog: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main([a.format(prog=prog) for a in argv])
    assert exc.value.code == 2
    _one_line_error(capsys, "--seed", "non-negative")


@pytest.mark.parametrize(
    "argv",
    [["search"], ["search", "x.gsp", "--workers", "abc"], ["program", "run", "x", "--max-elements", "-5"]],
)
def test_usage_errors_are_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    _one_line_error(capsys, "error:", "--help")


@pytest.mark.parametrize("doc, needle", [([1, 2], "expected an object"), ({}, "format: missing")])
def test_a_bad_ugraph_file_is_named(
    doc: object, needle: str, prog: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    assert main(["verify", str(prog), str(bad)]) != 0
    _one_line_error(capsys, str(bad), needle)


@pytest.mark.parametrize("argv", [["program", "show", "{dir}"], ["search", "{dir}"], ["superopt", "{dir}"]])
def test_a_directory_is_not_a_program(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GENSORAGE_HOME", str(tmp_path / "home"))
    (tmp_path / "progs").mkdir()
    assert main([a.format(dir=tmp_path / "progs") for a in argv]) != 0
    _one_line_error(capsys, "is a directory")


def test_spec_refuses_a_negative_seed_and_an_op_set_that_cannot_make_the_program() -> None:
    p = parse_program(ONE)
    with pytest.raises(ConfigError, match="seed"):
        SearchSpec(program=p, seed=-1)
    with pytest.raises(ConfigError, match="ops is empty"):
        SearchSpec(program=p, ops=())
    with pytest.raises(ConfigError, match="ops lacks exp"):
        SearchSpec(program=p, ops=("mul",))
    # Without the expression filter a µGraph is checked by evaluation only, and no such claim is made.
    assert SearchSpec(program=p, ops=("mul",), expr_filter=False).ops == ("mul",)


def test_the_search_key_follows_the_hardware_profile_file(tmp_path: Path) -> None:
    # Memory limits and predicted times come from the profile: an edited file is another search.
    src = Path(__file__).resolve().parents[1] / "configs" / "hw" / "h100.toml"
    hw = tmp_path / "h100.toml"
    hw.write_text(src.read_text())
    spec = SearchSpec(program=parse_program(ONE), hw=str(hw))
    before = spec.key()
    assert SearchSpec(program=parse_program(ONE), hw=str(hw)).key() == before
    hw.write_text(
        src.read_text().replace("sm_count = 132", "sm_count = 66", 1)
    )  # another size: no stale cache
    assert spec.key() != before


def test_search_shapes_too_large_to_evaluate_are_refused_before_the_search(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A huge --param used to reach the task split or verification and fail there with a numpy error (or run
    for ages); the spec now refuses it in one line naming the tensor."""
    assert main(["search", "gated_mlp", "--param", "t=100000000000", "--json"]) != 0
    _one_line_error(capsys, "tensor", "elements", "search at small shapes")


def test_verify_refuses_sides_too_large_to_evaluate(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", "gated_mlp", "gated_mlp", "--param", "t=100000000000"]) != 0
    _one_line_error(capsys, "gated_mlp: tensor", "--max-elements")
    with pytest.raises(SystemExit) as exc:
        main(["verify", "gated_mlp", "gated_mlp", "--max-elements", "0"])
    assert exc.value.code == 2
    _one_line_error(capsys, "--max-elements")

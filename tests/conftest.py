"""Fixtures shared by the command-line tests."""

from __future__ import annotations

from pathlib import Path

import pytest

# exp of a 2x4 matrix: 20 tasks at 1 kernel op / 1 block op, candidates in well under a second.
ONE = "program one\ninput A [2, 4] float16\nD = exp(A)\noutput D\n"


@pytest.fixture
def prog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """ONE in a ``.gsp`` file, with ``GENSORAGE_HOME`` in the test's own directory."""
    monkeypatch.setenv("GENSORAGE_HOME", str(tmp_path / "home"))
    path = tmp_path / "one.gsp"
    path.write_text(ONE)
    return path

"""The code is formatted (ruff format), lint-clean (ruff check) and type-clean (mypy), as CI checks it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PATHS = ["gensorage", "tests", "benchmarks"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_ruff_format_leaves_every_file_as_it_is() -> None:
    proc = _run("ruff", "format", "--check", *PATHS)
    assert proc.returncode == 0, f"run `ruff format {' '.join(PATHS)}`:\n{proc.stdout}{proc.stderr}"


def test_ruff_check_finds_nothing() -> None:
    proc = _run("ruff", "check", *PATHS)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_finds_nothing() -> None:
    proc = _run("mypy", "gensorage")
    assert proc.returncode == 0, proc.stdout + proc.stderr

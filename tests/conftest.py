"""Fixtures shared by the command-line tests, and the Hypothesis profile of every test."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# The tests of Ctrl-C expect what a terminal gives: SIGINT raises KeyboardInterrupt. A run started in the
# background (`nohup ... &`, a job without a terminal) starts Python with SIGINT ignored, and those tests then
# find SIG_IGN where they expect the handler back; a test run behaves the same however it is started.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Hypothesis's wall-clock checks (the too-slow health check on drawing data, the per-example deadline) fail a
# correct test when the machine is busy (seen with several test runs sharing two cores): what is drawn and
# checked does not depend on time, so time is not a failure here.
settings.register_profile("gensorage", suppress_health_check=[HealthCheck.too_slow], deadline=None)
settings.load_profile("gensorage")

# exp of a 2x4 matrix: 20 tasks at 1 kernel op / 1 block op, candidates in well under a second.
ONE = "program one\ninput A [2, 4] float16\nD = exp(A)\noutput D\n"


@pytest.fixture
def prog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """ONE in a ``.gsp`` file, with ``GENSORAGE_HOME`` in the test's own directory."""
    monkeypatch.setenv("GENSORAGE_HOME", str(tmp_path / "home"))
    path = tmp_path / "one.gsp"
    path.write_text(ONE)
    return path

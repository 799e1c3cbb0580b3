"""The Programs the PyTorch front end lowers a model to, captured without building kernels (test helper)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import gensorage
from gensorage.errors import ConfigError
from gensorage.torch import subgraph


@contextmanager
def capturing() -> Iterator[list[gensorage.Program]]:
    """Within the block, each subgraph's Program is appended to the list yielded instead of being compiled (its
    first call then runs in torch: the capture stops with a ConfigError, a fallback reason)."""
    got: list[gensorage.Program] = []

    def grab(program: gensorage.Program, options: object, device: object = None) -> None:
        got.append(program)
        raise ConfigError("captured")

    real = subgraph.compiled
    subgraph.compiled = grab  # type: ignore[assignment]
    try:
        yield got
    finally:
        subgraph.compiled = real

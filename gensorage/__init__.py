"""gensorage: a superoptimizer for tensor programs on CUDA GPUs.

Mirage-style multi-level µGraphs found by exhaustive search and verified by probabilistic identity testing,
with schedules built by Gensor-style Markov construction from a hardware profile, and TVM TIR as the code
generator. See docs/how-it-works.md.

Top-level names are imported lazily so ``import gensorage`` stays cheap (TVM and Z3 load only when used).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS: dict[str, tuple[str, str]] = {
    "Program": ("gensorage.program", "Program"),
    "load_program": ("gensorage.program", "load_program"),
    "KernelGraph": ("gensorage.ugraph", "KernelGraph"),
    "UGraph": ("gensorage.ugraph", "UGraph"),
    "equivalent": ("gensorage.verify", "equivalent"),
    "tune": ("gensorage.tuning", "tune"),
    "superoptimize": ("gensorage.superopt", "superoptimize"),
    "load_profile": ("gensorage.hw", "load_profile"),
}
_SUBMODULES = (
    "workloads",
    "hw",
    "markov",
    "ugraph",
    "verify",
    "program",
    "exhaustive",
    "codegen",
    "errors",
    "opset",
    "torch",
)

__all__ = ["__version__", *_EXPORTS, *_SUBMODULES]

# torch.compile(model, backend="gensorage") works once gensorage is imported (torch itself is not imported here).
importlib.import_module("gensorage.torch.registration").install()


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        module, attr = _EXPORTS[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"gensorage.{name}")
    raise AttributeError(f"module 'gensorage' has no attribute {name!r}")

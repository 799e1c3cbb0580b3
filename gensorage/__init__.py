"""gensorage: a superoptimizer for tensor programs on CUDA GPUs.

Mirage-style multi-level µGraphs found by exhaustive search and verified by probabilistic identity testing,
with schedules built by Gensor-style Markov construction from a hardware profile, and TVM TIR as the code
generator. See docs/how-it-works.md.
"""

from __future__ import annotations

__version__ = "0.1.0"

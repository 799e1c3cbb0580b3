"""The µGraph optimizer (the later Mirage paper): passes over a verified µGraph's block graphs, each a pure
function from a block graph to a plan the code generator follows.

- :mod:`.liveness`: every tile's live interval in the order the kernel runs its phases;
- :mod:`.memory_plan`: tiles whose lives do not overlap share bytes of one shared-memory arena.
"""

from __future__ import annotations

from gensorage.ugraph.optimize.liveness import Interval, Liveness, live_intervals
from gensorage.ugraph.optimize.memory_plan import ARENA_ALIGN, MemoryPlan, Placement, plan_memory

__all__ = ["ARENA_ALIGN", "Interval", "Liveness", "MemoryPlan", "Placement", "live_intervals", "plan_memory"]

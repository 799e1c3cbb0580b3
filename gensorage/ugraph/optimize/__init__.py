"""The µGraph optimizer (the later Mirage paper): passes over a verified µGraph's block graphs, each a pure
function (of a block graph, or of a tile's accesses) to a plan the code generator follows.

- :mod:`.phase_order`: phases by depth, so independent operators share one barrier;
- :mod:`.liveness`: every tile's live interval in that order;
- :mod:`.memory_plan`: tiles whose lives do not overlap share bytes of one shared-memory arena;
- :mod:`.layouts`: each tile's layout (padded or XOR-swizzled rows) whose accesses take the fewest
  bank-conflict wavefronts.

The code generator (:mod:`gensorage.codegen.block_emitter`) applies them in that order: it emits a block graph
by depth, records every tile's accesses, chooses the layouts, and lays the tiles out by the plan.
"""

from __future__ import annotations

from gensorage.ugraph.optimize.liveness import Interval, Liveness, live_intervals
from gensorage.ugraph.optimize.memory_plan import ARENA_ALIGN, MemoryPlan, Placement, plan_memory

__all__ = ["ARENA_ALIGN", "Interval", "Liveness", "MemoryPlan", "Placement", "live_intervals", "plan_memory"]

"""Tuning one operator: :func:`tune` builds a schedule for a workload on a GPU profile with one of
:data:`METHODS` (Gensor's construction or a baseline), remembers it in the result store, and lowers and checks
it on demand (:class:`TuneResult`)."""

from __future__ import annotations

from gensorage.tuning.methods import METHODS
from gensorage.tuning.result import CHECK_RTOL, TuneResult, check_tolerance, relative_error
from gensorage.tuning.tuner import method_names, resolve_hw, resolve_workload, tune

__all__ = [
    "CHECK_RTOL",
    "METHODS",
    "TuneResult",
    "check_tolerance",
    "method_names",
    "relative_error",
    "resolve_hw",
    "resolve_workload",
    "tune",
]

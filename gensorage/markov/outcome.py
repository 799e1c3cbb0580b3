"""What every schedule-search method returns."""

from __future__ import annotations

from dataclasses import dataclass

from gensorage.markov.schedule import Schedule


@dataclass(frozen=True, slots=True)
class SearchOutcome:
    """The schedule a method picked and how it got there.

    ``predicted_time_s`` is :func:`gensorage.markov.cost_model.predict_schedule_time` of ``schedule``; ``evaluated`` counts
    the schedules the method scored with the cost model (infeasible ones included); ``trace`` lists
    ``(elapsed seconds, best predicted time so far)`` each time the best improved.
    """

    schedule: Schedule
    predicted_time_s: float
    method: str
    evaluated: int
    elapsed_s: float
    trace: tuple[tuple[float, float], ...]

"""Conversions between a search core's results and the runner's plain data (what crosses process boundaries
and goes into the checkpoint)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from gensorage.exhaustive.run.checkpoint import CandidateRow
from gensorage.exhaustive.run.core import SearchCore


@dataclass(slots=True)
class Outcome:
    """A task's result as plain data, built where the task ran."""

    index: int
    complete: bool
    stats: dict[str, Any]
    rows: list[CandidateRow]
    elapsed_s: float
    resume: Any = None  # JSON: where a stopped task continues
    sized: tuple[str, ...] = ()  # the structures the run sized (see TaskResult.sized)
    keys: tuple[str | None, ...] = ()  # each row's structure, when the core says (see TaskResult.keys)


def to_json(obj: Any) -> Any:
    to_json = getattr(obj, "to_json", None)
    if callable(to_json):
        return to_json()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    raise TypeError(f"{type(obj).__name__} has no JSON form")


def stats_to_dict(stats: Any) -> dict[str, Any]:
    """A search core's ``Stats`` as a JSON object (its ``to_json()``, else its dataclass fields)."""
    value = to_json(stats)
    if not isinstance(value, dict):
        raise TypeError(f"statistics {type(stats).__name__} do not convert to a JSON object")
    return value


def decode_stats(core: SearchCore, d: dict[str, Any]) -> Any:
    from_json = getattr(core.stats_type, "from_json", None)
    return from_json(d) if callable(from_json) else core.stats_type(**d)


def add_stats(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Field-wise sum of two statistics dicts (numeric fields; others keep the first value seen)."""
    out = dict(a)
    for k, v in b.items():
        if k in out and isinstance(v, int | float) and isinstance(out[k], int | float):
            out[k] = out[k] + v
        elif k not in out:
            out[k] = v
    return out


def encode(index: int, res: Any, elapsed_s: float) -> Outcome:
    if res.task_index != index:
        raise RuntimeError(f"search core bug: task {index} returned the result of task {res.task_index}")
    rows = [
        CandidateRow(
            index,
            pos,
            c.ugraph.to_json(),
            float(c.predicted_time_s),
            dict(c.equivalence),
            int(c.found_in_task),
        )
        for pos, c in enumerate(res.candidates)
    ]
    resume = getattr(res, "resume", None)
    return Outcome(
        index,
        bool(res.complete),
        stats_to_dict(res.stats),
        rows,
        float(elapsed_s),
        None if res.complete or resume is None else to_json(resume),
        tuple(getattr(res, "sized", ())),
        tuple(getattr(res, "keys", ())),
    )


def decode_candidate(core: SearchCore, row: CandidateRow) -> Any:
    from gensorage.ugraph import KernelGraph

    return core.candidate_type(
        ugraph=KernelGraph.from_json(row.ugraph),
        predicted_time_s=row.predicted_time_s,
        equivalence=row.equivalence,
        found_in_task=row.found_in_task,
    )


__all__ = ["Outcome", "add_stats", "decode_candidate", "decode_stats", "encode", "stats_to_dict", "to_json"]

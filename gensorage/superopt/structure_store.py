"""The algebraic structures full-mode searches found, kept in the SQLite result store for fast mode.

A record holds the µGraph the search chose, *at the shapes it was found for*, together with that program's
``.gsp`` text: re-instantiating it at other shapes (:mod:`gensorage.superopt.reshape_structure`) needs both.
Records live in the generic key/value table ``ugraph_structures`` of :class:`gensorage.store.Store`, keyed by
``(program.structure_key(), hw name, gensorage version)``: the shapes are not part of the key, which is the
point — a new shape of the same program finds the structure.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from gensorage.errors import GensorageError, StoreError
from gensorage.program import Program, parse_program
from gensorage.store import Store
from gensorage.ugraph.ir import KernelGraph

KIND = "ugraph_structures"
RECORD_FORMAT = "gensorage.ugraph-structure"
RECORD_VERSION = 1


def record_key(structure_key: str, hw: str, version: str | None = None) -> str:
    """The store key of a structure: ``<structure key>/<hw>/<gensorage version>``."""
    if version is None:
        from gensorage import __version__ as version
    return f"{structure_key}/{hw}/{version}"


@dataclass(frozen=True, slots=True)
class StructureRecord:
    """A µGraph structure found by a full-mode run.

    ``ugraphs`` are the search's verified µGraphs of the program ``program_text`` (at ``params``), the one
    chosen at the full-mode run's shapes first, with the search's equivalence summaries in ``reports``; ``predicted_time_s`` and ``naive_predicted_time_s`` are the
    cost model's times of the first and of the direct µGraph at those shapes; ``search`` summarises the search.
    """

    structure_key: str
    hw: str
    version: str
    program_text: str
    params: dict[str, int]
    ugraphs: tuple[KernelGraph, ...]
    predicted_time_s: float
    naive_predicted_time_s: float
    search: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    reports: tuple[dict[str, Any] | None, ...] = ()

    def report(self, i: int) -> dict[str, Any] | None:
        """The search's equivalence summary of ``ugraphs[i]`` at the stored shapes (None if not kept)."""
        return self.reports[i] if i < len(self.reports) else None

    def program(self) -> Program:
        """The program the stored µGraph computes."""
        return parse_program(self.program_text, source="stored structure")

    def to_json(self) -> dict[str, Any]:
        return {
            "format": RECORD_FORMAT,
            "version": RECORD_VERSION,
            "structure_key": self.structure_key,
            "hw": self.hw,
            "gensorage_version": self.version,
            "program": self.program_text,
            "params": dict(self.params),
            "ugraphs": [g.to_json() for g in self.ugraphs],
            "predicted_time_s": self.predicted_time_s,
            "naive_predicted_time_s": self.naive_predicted_time_s,
            "search": self.search,
            "created_at": self.created_at,
            "reports": list(self.reports),
        }

    @staticmethod
    def from_json(data: Any, where: str = "structure record") -> StructureRecord:
        """A record from :meth:`to_json`'s dict; anything malformed is a :class:`StoreError`."""
        if not isinstance(data, dict) or data.get("format") != RECORD_FORMAT:
            raise StoreError(f"{where}: not a gensorage µGraph structure record")
        if data.get("version") != RECORD_VERSION:
            raise StoreError(f"{where}: unsupported record version {data.get('version')!r}")
        try:
            return StructureRecord(
                structure_key=str(data["structure_key"]),
                hw=str(data["hw"]),
                version=str(data["gensorage_version"]),
                program_text=str(data["program"]),
                params={str(k): int(v) for k, v in dict(data["params"]).items()},
                ugraphs=tuple(KernelGraph.from_json(g) for g in data["ugraphs"]),
                predicted_time_s=float(data["predicted_time_s"]),
                naive_predicted_time_s=float(data["naive_predicted_time_s"]),
                search=dict(data.get("search") or {}),
                created_at=float(data.get("created_at", 0.0)),
                reports=tuple(None if r is None else dict(r) for r in data.get("reports") or ()),
            )
        except (KeyError, TypeError, ValueError, GensorageError) as exc:
            raise StoreError(f"{where}: malformed record ({type(exc).__name__}: {exc})") from None


class StructureStore:
    """Structures by (structure key, hw) in a :class:`~gensorage.store.Store` (default: the user's store file).

    Parameters
    ----------
    store : Store, path or None
        An open store, a path to the SQLite file, or None for ``$GENSORAGE_HOME/store.sqlite``.
    """

    def __init__(self, store: Store | str | os.PathLike[str] | None = None) -> None:
        self._owned = not isinstance(store, Store)
        self.store = store if isinstance(store, Store) else Store(store)

    def get(self, structure_key: str, hw: str) -> StructureRecord | None:
        """The record for this program structure and GPU (this gensorage version), or None."""
        key = record_key(structure_key, hw)
        value = self.store.get(KIND, key)
        return None if value is None else StructureRecord.from_json(value, f"{self.store.path}: {KIND}/{key}")

    def put(self, record: StructureRecord) -> None:
        """Store ``record`` (replacing an earlier one for the same key); ``created_at`` is set to now if 0."""
        data = record.to_json()
        if not record.created_at:
            data["created_at"] = time.time()
        self.store.put(KIND, record_key(record.structure_key, record.hw, record.version), data)

    def close(self) -> None:
        if self._owned:
            self.store.close()

    def __enter__(self) -> StructureStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["KIND", "StructureRecord", "StructureStore", "record_key"]

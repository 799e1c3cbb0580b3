"""Superoptimising a whole program: :func:`superoptimize` (full and fast mode), presets, stored structures.

See :mod:`gensorage.superopt.api` for the two modes.
"""

from __future__ import annotations

from gensorage.superopt.api import (
    MODES,
    SuperoptInterrupted,
    SuperoptResult,
    Verification,
    resolve_program,
    superoptimize,
)
from gensorage.superopt.presets import DEFAULT_PRESET, Preset, list_presets, load_preset
from gensorage.superopt.reshape_structure import ReshapeFailed, reinstantiate
from gensorage.superopt.structure_store import StructureRecord, StructureStore

__all__ = [
    "DEFAULT_PRESET", "MODES", "Preset", "ReshapeFailed", "StructureRecord", "StructureStore",
    "SuperoptInterrupted", "SuperoptResult", "Verification", "list_presets", "load_preset", "reinstantiate",
    "resolve_program", "superoptimize",
]

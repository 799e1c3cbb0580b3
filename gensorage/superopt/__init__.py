"""Superoptimising a whole program: :func:`superoptimize` (full and fast mode), presets, stored structures.

Pipeline order: :mod:`.sources` (the program and its search shapes), :mod:`.search_shapes` (search shapes
derived for a program without a preset), :mod:`.api` (the entry point and the two
modes), :mod:`.run` (one call: search or store, then the choice), :mod:`.reshape_structure` and :mod:`.size_map` (a found structure
at new shapes), :mod:`.choice` (checking and building a competitor), :mod:`.gpu` (timing where a GPU exists),
:mod:`.result`, :mod:`.structure_store`, :mod:`.presets`; :mod:`.dispatch` (built kernels per shape, chosen
µGraphs per structure, for callers that run a program at many shapes).
"""

from __future__ import annotations

from gensorage.superopt.api import MODES, superoptimize
from gensorage.superopt.presets import DEFAULT_PRESET, Preset, list_presets, load_preset
from gensorage.superopt.reshape_structure import reinstantiate
from gensorage.superopt.result import SuperoptInterrupted, SuperoptResult, Verification
from gensorage.superopt.size_map import ReshapeFailed
from gensorage.superopt.sources import resolve_program
from gensorage.superopt.structure_store import StructureRecord, StructureStore

__all__ = [
    "DEFAULT_PRESET",
    "MODES",
    "Preset",
    "ReshapeFailed",
    "StructureRecord",
    "StructureStore",
    "SuperoptInterrupted",
    "SuperoptResult",
    "Verification",
    "list_presets",
    "load_preset",
    "reinstantiate",
    "resolve_program",
    "superoptimize",
]

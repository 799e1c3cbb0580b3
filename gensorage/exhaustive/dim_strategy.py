"""Mirage's dimension strategy: the imaps, omaps and fmaps a search may use (an optional restriction).

Mirage does not search every map. Its generator takes lists of candidate input maps, output maps and for-loop
maps (``GeneratorConfig``'s ``imap_to_explore``, ``omap_to_explore``, ``fmap_to_explore``) and has per-workload
lists (its "attention", "mlp" and "lora" configs); Table 5 of the paper times searches in such a space. A
:class:`DimStrategy` is the same restriction as data (``configs/dims/<name>.toml``), for
``SearchSpec.dims``. Grid sizes and trip counts are not listed: the search's schedule mode chooses them.

Maps are written as Mirage writes them, over the three grid *slots* x, y, z: an imap or omap is three data dims,
``-1`` for a replica (imap) or an unused slot; an fmap is one data dim, ``-1`` for none. A block graph with
``r`` grid dims is in the strategy when some injective *placement* of its grid dims onto the slots (a slot no
dim occupies holds ``-1``) makes every input's imap a listed imap and every output's omap a listed omap, and
every iterator's fmap is a listed fmap. Asking for *some* placement keeps the restriction independent of the
search's canonical numbering of grid dims (which permutes them, see ``walk.bindings.new_dims_canonical``).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from gensorage.errors import ConfigError
from gensorage.hw.loader import list_config_names, read_named_toml

Slots = tuple[int, int, int]  # Mirage's int3: a data dim per grid slot x, y, z; -1 replica / none
Map = tuple[int | None, ...]  # gensorage's imap or omap: a data dim (or None) per grid dim
SLOTS = 3
_KEYS = frozenset({"description", "imaps", "omaps", "fmaps"})


@dataclass(frozen=True, slots=True)
class DimStrategy:
    """Candidate maps (None: any), in Mirage's notation; see the module docstring."""

    name: str
    imaps: tuple[Slots, ...] | None = None
    omaps: tuple[Slots, ...] | None = None
    fmaps: tuple[int, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "imaps": _listed(self.imaps),
            "omaps": _listed(self.omaps),
            "fmaps": None if self.fmaps is None else list(self.fmaps),
        }

    @staticmethod
    def from_json(data: Any, where: str = "dim strategy") -> DimStrategy:
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise ConfigError(f"{where}: must be a table with a 'name'")
        unknown = sorted(set(data) - _KEYS - {"name"})
        if unknown:
            raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)} (known: imaps, omaps, fmaps)")
        return DimStrategy(
            data["name"],
            _slots_list(data.get("imaps"), f"{where}: imaps"),
            _slots_list(data.get("omaps"), f"{where}: omaps"),
            _fmap_list(data.get("fmaps"), f"{where}: fmaps"),
        )

    def allowed_fmaps(self) -> frozenset[int | None] | None:
        """The fmaps as gensorage writes them (None: no loop dim), or None when any is allowed."""
        return None if self.fmaps is None else frozenset(None if f < 0 else f for f in self.fmaps)


def _listed(maps: tuple[Slots, ...] | None) -> list[list[int]] | None:
    return None if maps is None else [list(m) for m in maps]


def _slots_list(value: Any, where: str) -> tuple[Slots, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where} must be a non-empty list of [x, y, z] data dims (-1: replica / unused)")
    out = []
    for m in value:
        if (
            not isinstance(m, list)
            or len(m) != SLOTS
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= -1 for d in m)
        ):
            raise ConfigError(f"{where}: {m!r} is not [x, y, z] with each a data dim or -1")
        dims = [d for d in m if d >= 0]
        if len(dims) != len(set(dims)):
            raise ConfigError(f"{where}: {m!r} maps two grid slots to one data dim")
        out.append((m[0], m[1], m[2]))
    return tuple(dict.fromkeys(out))


def _fmap_list(value: Any, where: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= -1 for d in value)
    ):
        raise ConfigError(f"{where} must be a non-empty list of data dims (-1: no loop dim)")
    return tuple(dict.fromkeys(value))


# ------------------------------------------------------------------------------------------ membership


@lru_cache(maxsize=8)
def placements(r: int) -> tuple[tuple[int, ...], ...]:
    """Every injective placement of ``r`` grid dims onto the slots x, y, z."""
    return tuple(itertools.permutations(range(SLOTS), r))


def slotted(m: Map, placement: Sequence[int]) -> Slots:
    """The map ``m`` written in slots under ``placement`` (-1 for replicas and unused slots)."""
    out = [-1] * SLOTS
    for g, d in enumerate(m):
        if d is not None:
            out[placement[g]] = d
    return (out[0], out[1], out[2])


def fits(strategy: DimStrategy, r: int, imaps: Sequence[Map | None], omaps: Sequence[Map] = ()) -> bool:
    """Whether some placement makes every given imap (None: not chosen yet, ignored) and omap a listed one."""
    return _fits(strategy, r, tuple(imaps), tuple(omaps))


@lru_cache(maxsize=1 << 14)
def imap_placements(strategy: DimStrategy, r: int, imap: Map | None) -> int:
    """The placements (bits, in :func:`placements` order) under which ``imap`` is a listed one (None: not chosen
    yet, every placement). Some placement fits a set of imaps iff their bit sets share a bit."""
    every = (1 << len(placements(r))) - 1
    if imap is None or strategy.imaps is None:
        return every
    ok = frozenset(strategy.imaps)
    return sum(1 << k for k, p in enumerate(placements(r)) if slotted(imap, p) in ok)


@lru_cache(maxsize=1 << 14)
def _fits(strategy: DimStrategy, r: int, imaps: tuple[Map | None, ...], omaps: tuple[Map, ...]) -> bool:
    ok_in = None if strategy.imaps is None else frozenset(strategy.imaps)
    ok_out = None if strategy.omaps is None else frozenset(strategy.omaps)
    for p in placements(r):
        if ok_in is not None and any(m is not None and slotted(m, p) not in ok_in for m in imaps):
            continue
        if ok_out is not None and any(slotted(m, p) not in ok_out for m in omaps):
            continue
        return True
    return False


# ------------------------------------------------------------------------------------------ loading


def list_dim_strategies() -> list[str]:
    """Names of the strategies in ``$GENSORAGE_CONFIG_DIR/dims/`` and the checkout's ``configs/dims/``."""
    return list_config_names("dims")


def load_dim_strategy(name_or_path: str | os.PathLike[str]) -> DimStrategy:
    """A strategy by name (``configs/dims/<name>.toml``) or from a ``.toml`` path; a bad file is a ConfigError."""
    path, data = read_named_toml("dims", name_or_path, "dim strategy")
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise ConfigError(
            f"{path}: unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(_KEYS))})"
        )
    return DimStrategy.from_json(
        {**{k: v for k, v in data.items() if k != "description"}, "name": path.stem}, str(path)
    )


__all__ = [
    "DimStrategy",
    "fits",
    "imap_placements",
    "list_dim_strategies",
    "load_dim_strategy",
    "placements",
    "slotted",
]

"""Search presets per benchmark program: ``configs/presets/<name>.toml``, parsed as data.

A preset says at which (small) shapes the exhaustive search runs for a program, with which limits, and how
the result is checked at the requested shapes::

    program = "rmsnorm"              # the bundled program (configs/programs/<program>.gsp); default: file stem
    description = "..."
    time_budget_s = 120              # default time budget of a full-mode run (absent: none)
    top_k = 5                        # re-instantiated candidates compared (the fastest predicted at the shapes)
    delta = 1e-9                     # false-accept probability of the final equivalence check
    verify_max_trials = 64           # cap on that check's trials (default 64; 0: as many as delta needs)
    verify_max_elements = 4194304    # skip the check at the requested shapes above this many elements

    [search_params]                  # the program's params at the search shapes
    b = 2

    [run_params]                     # the params ``gensorage superopt`` runs at when the preset is run
    b = 2                            # without naming a program (default: the program's own)

    [search]                         # SearchSpec fields (limits and flags), e.g.
    max_kernel_ops = 1
    max_block_ops = 4
    dims = "attention"               # a dim strategy by name (configs/dims/<name>.toml)

Presets are looked up in ``$GENSORAGE_CONFIG_DIR/presets`` first, then in the checkout's ``configs/presets``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from gensorage.errors import ConfigError, GensorageError
from gensorage.hw.loader import config_search_dirs, find_config, list_config_names, read_named_toml

#: Preset the CLI runs when no program is named.
DEFAULT_PRESET = "default"
#: SearchSpec fields a preset may set (the program, hw, seed and delta come from the call).
_CALL_FIELDS = frozenset({"program", "program_text", "hw", "seed", "delta"})
_TOP_KEYS = frozenset(
    {
        "program",
        "description",
        "time_budget_s",
        "top_k",
        "delta",
        "verify_max_trials",
        "verify_max_elements",
        "search_params",
        "search",
        "modes",
        "run_params",
    }
)
DEFAULT_TOP_K = 5
DEFAULT_DELTA = 1e-9
DEFAULT_VERIFY_MAX_TRIALS = 64
DEFAULT_VERIFY_MAX_ELEMENTS = 1 << 22


@dataclass(frozen=True, slots=True)
class Preset:
    """Search settings for one program (see the module docstring for the file format).

    ``modes`` is what the CLI runs for this preset when it is invoked without a mode (``("fast", "full")``
    runs fast mode, then full mode).
    """

    name: str
    program: str
    description: str = ""
    search_params: dict[str, int] = field(default_factory=dict)
    search: dict[str, Any] = field(default_factory=dict)
    time_budget_s: float | None = None
    top_k: int = DEFAULT_TOP_K
    delta: float = DEFAULT_DELTA
    verify_max_trials: int | None = DEFAULT_VERIFY_MAX_TRIALS
    verify_max_elements: int = DEFAULT_VERIFY_MAX_ELEMENTS
    modes: tuple[str, ...] = ("full",)
    run_params: dict[str, int] = field(default_factory=dict)
    path: Path | None = None

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["path"] = None if self.path is None else str(self.path)
        out["modes"] = list(self.modes)
        return out


def preset_dirs() -> list[Path]:
    """Folders searched for presets, in priority order."""
    return config_search_dirs("presets")


def list_presets() -> list[str]:
    """Names of every preset file found."""
    return list_config_names("presets")


def find_preset(name: str) -> Path | None:
    """The file of preset ``name``, or None."""
    return find_config("presets", name)


def load_preset(name_or_path: str | os.PathLike[str]) -> Preset:
    """Load a preset by name (``"rmsnorm"``) or from a ``.toml`` path; a broken file is a :class:`ConfigError`."""
    path, data = read_named_toml("presets", name_or_path, "preset")
    return preset_from_dict(data, name=path.stem, path=path)


def preset_from_dict(data: dict[str, Any], name: str, path: Path | None = None) -> Preset:
    """Validate a parsed preset document (every field's type and range)."""
    where = str(path) if path is not None else f"preset {name}"
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise ConfigError(
            f"{where}: unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(_TOP_KEYS))})"
        )
    program = data.get("program", name)
    if not isinstance(program, str) or not program:
        raise ConfigError(f"{where}: 'program' must be a program config name")
    return Preset(
        name=name,
        program=program,
        description=str(data.get("description", "")),
        search_params=_params(data.get("search_params", {}), where, "search_params"),
        search=_search(data.get("search", {}), where),
        time_budget_s=_opt_positive(data, "time_budget_s", where),
        top_k=_int(data, "top_k", DEFAULT_TOP_K, where),
        delta=_delta(data.get("delta", DEFAULT_DELTA), where),
        verify_max_trials=_opt_int(data, "verify_max_trials", DEFAULT_VERIFY_MAX_TRIALS, where),
        verify_max_elements=_int(data, "verify_max_elements", DEFAULT_VERIFY_MAX_ELEMENTS, where),
        modes=_modes(data.get("modes", ["full"]), where),
        run_params=_params(data.get("run_params", {}), where, "run_params"),
        path=path,
    )


def _params(value: Any, where: str, table: str) -> dict[str, int]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: [{table}] must be a table of integers")
    out: dict[str, int] = {}
    for k, v in value.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{where}: {table}.{k} must be a positive integer, got {v!r}")
        out[k] = v
    return out


def _search(value: Any, where: str) -> dict[str, Any]:
    from gensorage.exhaustive.spec import SearchSpec, check_limits

    if not isinstance(value, dict):
        raise ConfigError(f"{where}: [search] must be a table of search limits")
    allowed = {f.name for f in dataclasses.fields(SearchSpec)} - _CALL_FIELDS
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise ConfigError(
            f"{where}: unknown search field(s) {', '.join(unknown)} (known: {', '.join(sorted(allowed))})"
        )
    out = dict(value)
    if "ops" in out:
        if not isinstance(out["ops"], list) or not all(isinstance(o, str) for o in out["ops"]):
            raise ConfigError(f"{where}: search.ops must be a list of op names")
        out["ops"] = tuple(out["ops"])
    if "dims" in out:
        from gensorage.exhaustive.dim_strategy import load_dim_strategy

        if not isinstance(out["dims"], str):
            raise ConfigError(f"{where}: search.dims must be the name of a dim strategy (configs/dims/)")
        out["dims"] = load_dim_strategy(out["dims"])
    defaults = {
        f.name: f.default for f in dataclasses.fields(SearchSpec) if f.default is not dataclasses.MISSING
    }
    try:
        check_limits(SimpleNamespace(**{**defaults, **out}))
    except GensorageError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return out


def _int(data: dict[str, Any], key: str, default: int, where: str) -> int:
    v = data.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(f"{where}: {key} must be a positive integer, got {v!r}")
    return v


def _opt_int(data: dict[str, Any], key: str, default: int | None, where: str) -> int | None:
    if key not in data:
        return default
    if data[key] == 0 and not isinstance(data[key], bool):
        return None  # 0 means "no cap" (TOML has no null)
    return _int(data, key, 1, where)


def _opt_positive(data: dict[str, Any], key: str, where: str) -> float | None:
    if key not in data:
        return None
    v = data[key]
    if isinstance(v, bool) or not isinstance(v, int | float) or not (v > 0 and math.isfinite(v)):
        raise ConfigError(f"{where}: {key} must be a positive number of seconds, got {v!r}")
    return float(v)


def _delta(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < 1:
        raise ConfigError(f"{where}: delta must be a number in (0, 1), got {v!r}")
    return float(v)


def _modes(v: Any, where: str) -> tuple[str, ...]:
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not v or not all(m in ("fast", "full") for m in v):
        raise ConfigError(f"{where}: modes must be a list of 'fast' and 'full', got {v!r}")
    return tuple(v)


__all__ = [
    "DEFAULT_PRESET",
    "Preset",
    "find_preset",
    "list_presets",
    "load_preset",
    "preset_dirs",
    "preset_from_dict",
]

"""Loading and validating hardware profiles from TOML files.

A profile file (``configs/hw/<name>.toml``) holds the scalar fields of :class:`HwProfile` at top level, one
``[levels.<name>]`` table per memory level (``dram``, ``l2``, ``shared``, ``register``) with ``bandwidth_Bps`` and
``latency_cycles``, one ``[peak_flops.<dtype>]`` table per dtype with ``cuda`` and ``tensor`` FLOP/s, and an
optional ``[sources]`` table mapping a field (dotted for nested ones, e.g. ``levels.l2.bandwidth_Bps``) to where
its value comes from. Level capacities are not written in the file: they are derived from the scalar fields
(DRAM = ``dram_bytes``, L2 = ``l2_bytes``, shared = ``shared_mem_per_sm``, register = ``registers_per_sm`` x 4
bytes) so the two can never disagree.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from gensorage.errors import ConfigError
from gensorage.hw.profile import CALIBRATION_KEYS, Calibration, HwProfile, MemLevel

ENV_CONFIG_DIR = "GENSORAGE_CONFIG_DIR"

# Memory levels, outermost first: the order HwProfile.levels promises.
LEVEL_NAMES: tuple[str, ...] = ("dram", "l2", "shared", "register")
REQUIRED_DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32")
REGISTER_BYTES = 4  # CUDA registers are 32 bits wide

_INT_FIELDS: tuple[str, ...] = (
    "sm_count",
    "warp_size",
    "max_threads_per_block",
    "max_threads_per_sm",
    "max_blocks_per_sm",
    "registers_per_sm",
    "max_registers_per_thread",
    "shared_mem_per_sm",
    "shared_mem_per_block",
    "l2_bytes",
    "shared_banks",
    "bank_width_bytes",
    "transaction_bytes",
    "dram_bytes",
)
_STR_FIELDS: tuple[str, ...] = ("name", "display_name", "arch")
_FLOAT_FIELDS: tuple[str, ...] = ("clock_hz",)
_TABLE_FIELDS: tuple[str, ...] = ("levels", "peak_flops", "sources", "calibration")
_LEVEL_KEYS: tuple[str, ...] = ("bandwidth_Bps", "latency_cycles")
_FLOPS_KEYS: tuple[str, ...] = ("cuda", "tensor")
# Sizes whose hardware values are always powers of two; a typo there (e.g. 33 banks) is caught early.
_POW2_FIELDS: tuple[str, ...] = ("warp_size", "shared_banks", "bank_width_bytes", "transaction_bytes")
_ARCH_RE = re.compile(r"^sm_\d{2,3}[a-z]?$")


def repo_config_dir() -> Path:
    """The repository's ``configs/`` folder, found relative to the installed package."""
    import gensorage

    return Path(gensorage.__file__).resolve().parents[1] / "configs"


def config_search_dirs(kind: str) -> list[Path]:
    """Folders searched for ``kind`` ("hw" or "ops") config files, in priority order."""
    dirs = []
    env = os.environ.get(ENV_CONFIG_DIR)
    if env:
        dirs.append(Path(env).expanduser() / kind)
    dirs.append(repo_config_dir() / kind)
    return dirs


def list_config_names(kind: str) -> list[str]:
    """Names of the ``kind`` config files (``<dir>/<kind>/<name>.toml``) in every config folder."""
    names: set[str] = set()
    for d in config_search_dirs(kind):
        if d.is_dir():
            names.update(p.stem for p in d.glob("*.toml") if p.is_file())
    return sorted(names)


def find_config(kind: str, name: str) -> Path | None:
    """The file of the ``kind`` config ``name`` (first config folder that has it), or None."""
    for d in config_search_dirs(kind):
        path = d / f"{name}.toml"
        if path.is_file():
            return path
    return None


def read_named_toml(
    kind: str, name_or_path: str | os.PathLike[str], what: str
) -> tuple[Path, dict[str, Any]]:
    """A ``kind`` config by name, or a ``.toml`` path, parsed as data; every failure is a one-line ConfigError
    naming ``what`` it is (unknown names list the known ones)."""
    text = os.fspath(name_or_path)
    if text.endswith(".toml") or os.sep in text:
        path = Path(text).expanduser()
        if not path.is_file():
            raise ConfigError(f"{what} file {path} does not exist")
    else:
        found = find_config(kind, text)
        if found is None:
            raise ConfigError(
                f"unknown {what} {text!r} (known: {', '.join(list_config_names(kind)) or 'none'})"
            )
        path = found
    try:
        return path, tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read {what}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: cannot read {what}: not valid TOML: {exc}") from None


def list_profiles() -> list[str]:
    """Names of the hardware profiles found in ``$GENSORAGE_CONFIG_DIR/hw/`` and the repo's ``configs/hw/``."""
    names: set[str] = set()
    for d in config_search_dirs("hw"):
        if d.is_dir():
            names.update(p.stem for p in d.glob("*.toml") if p.is_file())
    return sorted(names)


def _looks_like_path(name_or_path: str | os.PathLike[str]) -> bool:
    s = os.fspath(name_or_path)
    return s.endswith(".toml") or os.sep in s or (os.altsep is not None and os.altsep in s)


def resolve_profile_path(name_or_path: str | os.PathLike[str]) -> Path:
    """Where the profile ``name_or_path`` is read from (see :func:`load_profile` for the search order)."""
    if _looks_like_path(name_or_path):
        path = Path(name_or_path).expanduser()
        if not path.is_file():
            raise ConfigError(f"hardware profile file {path} does not exist")
        return path
    name = os.fspath(name_or_path)
    for d in config_search_dirs("hw"):
        candidate = d / f"{name}.toml"
        if candidate.is_file():
            return candidate
    known = ", ".join(list_profiles()) or "none"
    raise ConfigError(f"unknown hardware profile {name!r} (known profiles: {known})")


def load_profile(name_or_path: str | os.PathLike[str]) -> HwProfile:
    """Load and validate a hardware profile.

    Parameters
    ----------
    name_or_path
        A profile name (``"a100"``) or a path to a ``.toml`` file. A name is looked up first in
        ``$GENSORAGE_CONFIG_DIR/hw/<name>.toml``, then in the repository's ``configs/hw/<name>.toml``; an
        argument ending in ``.toml`` or containing a path separator is taken as a path.

    Returns
    -------
    HwProfile
        The profile; loads are cached per file (and re-read when the file changes).

    Raises
    ------
    ConfigError
        Unknown name (the message lists the known profiles), unreadable or malformed TOML, or a field that
        is missing, of the wrong type or physically implausible (the message names the file and the field).
    """
    path = resolve_profile_path(name_or_path).resolve()
    st = path.stat()
    return _load_cached(str(path), st.st_mtime_ns, st.st_size)


def profile_fingerprint(name_or_path: str | os.PathLike[str]) -> str:
    """A short hash of the numbers of the profile :func:`load_profile` gives (cached per file like the load: a
    search key asks for it once a task)."""
    path = resolve_profile_path(name_or_path).resolve()
    st = path.stat()
    return _fingerprint_cached(str(path), st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=64)
def _fingerprint_cached(path: str, mtime_ns: int, size: int) -> str:
    from gensorage.fingerprint import data_fingerprint

    return data_fingerprint(_load_cached(path, mtime_ns, size))


@lru_cache(maxsize=64)
def _load_cached(path: str, _mtime_ns: int, _size: int) -> HwProfile:
    p = Path(path)
    try:
        with p.open("rb") as fh:
            data = tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: invalid TOML: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror or exc}") from exc
    profile = profile_from_dict(data, where=str(p))
    if profile.name != p.stem:
        raise ConfigError(f"{p}: field 'name': {profile.name!r} does not match the file name {p.stem!r}")
    return profile


# ---------------------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------------------


def _fail(where: str, field: str, reason: str) -> ConfigError:
    return ConfigError(f"{where}: field '{field}': {reason}")


def _get_int(data: Mapping[str, Any], key: str, where: str, prefix: str = "") -> int:
    v = data.get(key)
    if v is None:
        raise _fail(where, prefix + key, "missing")
    if isinstance(v, bool) or not isinstance(v, int):
        raise _fail(where, prefix + key, f"expected an integer, got {type(v).__name__} {v!r}")
    if v <= 0:
        raise _fail(where, prefix + key, f"must be positive, got {v}")
    return v


def _get_float(
    data: Mapping[str, Any], key: str, where: str, prefix: str = "", *, allow_zero: bool = False
) -> float:
    v = data.get(key)
    if v is None:
        raise _fail(where, prefix + key, "missing")
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise _fail(where, prefix + key, f"expected a number, got {type(v).__name__} {v!r}")
    f = float(v)
    if f != f or f in (float("inf"), float("-inf")):
        raise _fail(where, prefix + key, f"must be finite, got {v}")
    if f < 0 or (f == 0 and not allow_zero):
        raise _fail(where, prefix + key, f"must be {'non-negative' if allow_zero else 'positive'}, got {v}")
    return f


def _get_str(data: Mapping[str, Any], key: str, where: str) -> str:
    v = data.get(key)
    if v is None:
        raise _fail(where, key, "missing")
    if not isinstance(v, str) or not v.strip():
        raise _fail(where, key, f"expected a non-empty string, got {v!r}")
    return v


def _get_table(data: Mapping[str, Any], key: str, where: str, *, required: bool = True) -> Mapping[str, Any]:
    v = data.get(key)
    if v is None:
        if required:
            raise _fail(where, key, "missing table")
        return {}
    if not isinstance(v, dict):
        raise _fail(where, key, f"expected a table, got {type(v).__name__}")
    return v


def _check_unknown(data: Mapping[str, Any], allowed: tuple[str, ...], where: str, prefix: str = "") -> None:
    for key in data:
        if key not in allowed:
            raise _fail(where, prefix + key, f"unknown field (expected one of: {', '.join(allowed)})")


def _parse_levels(data: Mapping[str, Any], ints: Mapping[str, int], where: str) -> tuple[MemLevel, ...]:
    table = _get_table(data, "levels", where)
    _check_unknown(table, LEVEL_NAMES, where, "levels.")
    capacity = {
        "dram": ints["dram_bytes"],
        "l2": ints["l2_bytes"],
        "shared": ints["shared_mem_per_sm"],
        "register": ints["registers_per_sm"] * REGISTER_BYTES,
    }
    levels = []
    for name in LEVEL_NAMES:
        prefix = f"levels.{name}."
        lv = _get_table(table, name, where)
        _check_unknown(lv, _LEVEL_KEYS, where, prefix)
        levels.append(
            MemLevel(
                name=name,
                bandwidth_Bps=_get_float(lv, "bandwidth_Bps", where, prefix),
                latency_cycles=_get_float(lv, "latency_cycles", where, prefix),
                capacity_bytes=capacity[name],
            )
        )
    # Inner levels are faster: bandwidth must not drop and latency must not grow from DRAM to registers.
    for outer, inner in zip(levels, levels[1:], strict=False):
        if inner.bandwidth_Bps < outer.bandwidth_Bps:
            raise _fail(
                where,
                f"levels.{inner.name}.bandwidth_Bps",
                f"{inner.bandwidth_Bps:g} B/s is below the outer level {outer.name}'s "
                f"{outer.bandwidth_Bps:g} B/s (levels must be ordered dram -> register)",
            )
        if inner.latency_cycles > outer.latency_cycles:
            raise _fail(
                where,
                f"levels.{inner.name}.latency_cycles",
                f"{inner.latency_cycles:g} cycles exceeds the outer level {outer.name}'s "
                f"{outer.latency_cycles:g} (levels must be ordered dram -> register)",
            )
    return tuple(levels)


def _parse_flops(data: Mapping[str, Any], where: str) -> tuple[tuple[str, float, float], ...]:
    table = _get_table(data, "peak_flops", where)
    for dtype in REQUIRED_DTYPES:
        if dtype not in table:
            raise _fail(where, f"peak_flops.{dtype}", "missing table")
    out = []
    for dtype, entry in table.items():
        prefix = f"peak_flops.{dtype}."
        if not isinstance(entry, dict):
            raise _fail(where, f"peak_flops.{dtype}", f"expected a table with {_FLOPS_KEYS}")
        _check_unknown(entry, _FLOPS_KEYS, where, prefix)
        cuda = _get_float(entry, "cuda", where, prefix)
        tensor = _get_float(entry, "tensor", where, prefix, allow_zero=True)  # 0: no tensor-core path
        out.append((dtype, cuda, tensor))
    return tuple(out)


def _valid_source_key(key: str, data: Mapping[str, Any]) -> bool:
    parts = key.split(".")
    if parts[0] in _INT_FIELDS + _STR_FIELDS + _FLOAT_FIELDS:
        return len(parts) == 1
    if parts[0] == "levels":
        return (len(parts) == 2 and parts[1] in LEVEL_NAMES) or (
            len(parts) == 3 and parts[1] in LEVEL_NAMES and parts[2] in _LEVEL_KEYS
        )
    if parts[0] == "calibration":
        return len(parts) == 2 and parts[1] in CALIBRATION_KEYS
    if parts[0] == "peak_flops":
        dtypes = data.get("peak_flops", {})
        return (len(parts) == 2 and parts[1] in dtypes) or (
            len(parts) == 3 and parts[1] in dtypes and parts[2] in _FLOPS_KEYS
        )
    return False


def _parse_sources(data: Mapping[str, Any], where: str) -> tuple[tuple[str, str], ...]:
    table = _get_table(data, "sources", where, required=False)
    out = []
    for key, value in table.items():
        if not _valid_source_key(key, data):
            raise _fail(where, f"sources.{key}", "names no profile field")
        if not isinstance(value, str) or not value.strip():
            raise _fail(where, f"sources.{key}", f"expected a non-empty string, got {value!r}")
        out.append((key, value))
    return tuple(out)


def _parse_calibration(data: Mapping[str, Any], where: str) -> Calibration:
    table = _get_table(data, "calibration", where, required=False)
    _check_unknown(table, CALIBRATION_KEYS, where, "calibration.")
    values = {k: _get_float(table, k, where, "calibration.") for k in CALIBRATION_KEYS if k in table}
    for key in ("mma_sync_fraction", "wgmma_fraction", "tma_wgmma_fraction", "tma_l2_fraction"):
        if values.get(key, 0.5) > 1:
            raise _fail(where, f"calibration.{key}", "is a fraction of the tensor peak (at most 1)")
    return Calibration(**values)


def _check_relations(ints: Mapping[str, int], where: str) -> None:
    for key in _POW2_FIELDS:
        v = ints[key]
        if v & (v - 1):
            raise _fail(where, key, f"must be a power of two, got {v}")
    rules = (
        (
            "max_threads_per_block",
            ints["max_threads_per_block"] <= ints["max_threads_per_sm"],
            "exceeds max_threads_per_sm",
        ),
        (
            "max_threads_per_block",
            ints["max_threads_per_block"] % ints["warp_size"] == 0,
            "is not a multiple of warp_size",
        ),
        (
            "max_threads_per_sm",
            ints["max_threads_per_sm"] % ints["warp_size"] == 0,
            "is not a multiple of warp_size",
        ),
        (
            "shared_mem_per_block",
            ints["shared_mem_per_block"] <= ints["shared_mem_per_sm"],
            "exceeds shared_mem_per_sm",
        ),
        (
            "max_registers_per_thread",
            ints["max_registers_per_thread"] <= ints["registers_per_sm"],
            "exceeds registers_per_sm",
        ),
        ("l2_bytes", ints["l2_bytes"] < ints["dram_bytes"], "is not smaller than dram_bytes"),
        ("shared_mem_per_sm", ints["shared_mem_per_sm"] < ints["l2_bytes"], "is not smaller than l2_bytes"),
    )
    for field, ok, reason in rules:
        if not ok:
            raise _fail(where, field, f"{ints[field]} {reason}")


def profile_from_dict(data: Mapping[str, Any], *, where: str = "<profile>") -> HwProfile:
    """Build a validated :class:`HwProfile` from parsed TOML data (``where`` names the file in errors)."""
    _check_unknown(data, _STR_FIELDS + _FLOAT_FIELDS + _INT_FIELDS + _TABLE_FIELDS, where)
    strs = {k: _get_str(data, k, where) for k in _STR_FIELDS}
    if not _ARCH_RE.match(strs["arch"]):
        raise _fail(where, "arch", f"expected a CUDA arch like 'sm_80', got {strs['arch']!r}")
    ints = {k: _get_int(data, k, where) for k in _INT_FIELDS}
    clock = _get_float(data, "clock_hz", where)
    if not 1e7 <= clock <= 1e10:
        raise _fail(where, "clock_hz", f"{clock:g} is not a GPU clock in Hz (expected e.g. 1.41e9)")
    _check_relations(ints, where)
    return HwProfile(
        name=strs["name"],
        display_name=strs["display_name"],
        arch=strs["arch"],
        clock_hz=clock,
        levels=_parse_levels(data, ints, where),
        peak_flops=_parse_flops(data, where),
        sources=_parse_sources(data, where),
        calibration=_parse_calibration(data, where),
        **ints,
    )

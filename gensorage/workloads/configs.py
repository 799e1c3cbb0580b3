"""Operator configurations as data: ``configs/ops/*.toml`` and single specs (e.g. from the CLI).

A config file holds an array of tables ``[[workload]]``; each has an ``id`` (unique), an ``op`` (a key of
:data:`OPS`), that op's shape parameters, and optionally ``dtype`` (default ``"float16"``) and free-text
``source`` / ``note``. Example::

    [[workload]]
    id = "M1"
    op = "gemm"
    M = 8192
    N = 8192
    K = 8192
    source = "Gensor Table IV"
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gensorage.errors import ConfigError, ProgramError
from gensorage.hw.loader import config_search_dirs
from gensorage.workloads.builtin import avgpool2d, batch_matmul, conv2d, gemm, gemv
from gensorage.workloads.workload import Workload

DEFAULT_DTYPE = "float16"
_METADATA_KEYS: tuple[str, ...] = ("id", "source", "note")


@dataclass(frozen=True, slots=True)
class OpSpec:
    """How to build one op from a spec: its constructor, required shape parameters, optional ones."""

    constructor: Callable[..., Workload]
    required: tuple[str, ...]
    optional: tuple[str, ...] = ()  # int or [int, int]


OPS: dict[str, OpSpec] = {
    "gemm": OpSpec(gemm, ("M", "N", "K")),
    "gemv": OpSpec(gemv, ("M", "N")),
    "batch_matmul": OpSpec(batch_matmul, ("B", "M", "N", "K")),
    "conv2d": OpSpec(conv2d, ("N", "C", "H", "W", "F", "KH", "KW"), ("stride", "padding")),
    "avgpool2d": OpSpec(avgpool2d, ("N", "C", "H", "W", "KH", "KW"), ("stride", "padding")),
}


def _bad(where: str, field: str, reason: str) -> ConfigError:
    return ConfigError(f"{where}: field '{field}': {reason}")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _shape_value(v: object, where: str, key: str, *, optional: bool) -> int | tuple[int, int]:
    if _is_int(v):
        if not optional and v < 1:  # type: ignore[operator]
            raise _bad(where, key, f"must be a positive integer, got {v}")
        return v  # type: ignore[return-value]
    if optional and isinstance(v, list | tuple) and len(v) == 2 and all(_is_int(x) for x in v):
        return (int(v[0]), int(v[1]))
    expected = "an integer or a pair of integers" if optional else "an integer"
    raise _bad(where, key, f"expected {expected}, got {v!r}")


def workload_from_spec(spec: Mapping[str, Any], *, where: str = "op spec") -> Workload:
    """Build a workload from a parsed spec such as ``{"op": "gemm", "M": 64, "N": 64, "K": 64}``.

    Parameters
    ----------
    spec
        ``op`` plus the op's parameters (see :data:`OPS`), optional ``dtype``; ``id``/``source``/``note`` are
        accepted and ignored.
    where
        What to call the spec in error messages (a file and entry, or "--shape").

    Returns
    -------
    Workload

    Raises
    ------
    ConfigError
        Unknown op or field, a missing or mistyped field, or a shape the op rejects; the message names
        ``where`` and the field.
    """
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: expected a table of fields, got {type(spec).__name__}")
    op = spec.get("op")
    if op is None:
        raise _bad(where, "op", f"missing (one of: {', '.join(OPS)})")
    if not isinstance(op, str) or op not in OPS:
        raise _bad(where, "op", f"unknown op {op!r} (known: {', '.join(OPS)})")
    info = OPS[op]
    allowed = ("op", "dtype", *info.required, *info.optional, *_METADATA_KEYS)
    for key in spec:
        if key not in allowed:
            raise _bad(where, key, f"unknown field for op {op} (expected: {', '.join(allowed)})")
    kwargs: dict[str, Any] = {}
    for key in info.required:
        if key not in spec:
            raise _bad(where, key, f"missing (op {op} needs {', '.join(info.required)})")
        kwargs[key] = _shape_value(spec[key], where, key, optional=False)
    for key in info.optional:
        if key in spec:
            kwargs[key] = _shape_value(spec[key], where, key, optional=True)
    dtype = spec.get("dtype", DEFAULT_DTYPE)
    if not isinstance(dtype, str):
        raise _bad(where, "dtype", f"expected a string, got {dtype!r}")
    try:
        return info.constructor(dtype=dtype, **kwargs)
    except ProgramError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc


def _load_file(path: Path) -> list[tuple[str, Workload]]:
    data = _read_toml(path)
    for key in data:
        if key != "workload":
            raise ConfigError(
                f"{path}: field '{key}': unknown top-level field (expected [[workload]] tables)"
            )
    entries = data.get("workload", [])
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: field 'workload': expected an array of tables ([[workload]])")
    out: list[tuple[str, Workload]] = []
    for i, entry in enumerate(entries):
        where = f"{path}: entry {i + 1}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: expected a table")
        wid = entry.get("id")
        if not isinstance(wid, str) or not wid.strip():
            raise _bad(where, "id", f"expected a non-empty string, got {wid!r}")
        where = f"{path}: entry {wid!r}"
        out.append((wid, workload_from_spec(entry, where=where)))
    return out


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(p for p in path.glob("*.toml") if p.is_file())
    raise ConfigError(f"op config path {path} does not exist")


def _load_dir_or_file(path: Path) -> list[tuple[str, Workload]]:
    out: list[tuple[str, Workload]] = []
    origin: dict[str, Path] = {}
    for f in _files(path):
        for wid, wl in _load_file(f):
            if wid in origin:
                raise ConfigError(f"{f}: entry {wid!r}: field 'id': duplicate (also in {origin[wid]})")
            origin[wid] = f
            out.append((wid, wl))
    return out


def load_op_configs(path: str | os.PathLike[str] | None = None) -> list[tuple[str, Workload]]:
    """Load operator configurations.

    Parameters
    ----------
    path
        A ``.toml`` file or a folder of them. ``None`` loads ``$GENSORAGE_CONFIG_DIR/ops/`` (when it exists)
        and the repository's ``configs/ops/``; an id defined in both is taken from the former.

    Returns
    -------
    list of (str, Workload)
        ``(id, workload)`` in file order (files sorted by name).

    Raises
    ------
    ConfigError
        Broken TOML, a malformed entry (the message names the file, the entry and the field), duplicate ids.
    """
    if path is not None:
        return _load_dir_or_file(Path(path).expanduser())
    result: list[tuple[str, Workload]] = []
    seen: set[str] = set()
    for d in config_search_dirs("ops"):
        if not d.is_dir():
            continue
        for wid, wl in _load_dir_or_file(d):
            if wid not in seen:
                seen.add(wid)
                result.append((wid, wl))
    return result


def list_op_configs() -> list[str]:
    """Ids of the default operator configurations (see :func:`load_op_configs`)."""
    return [wid for wid, _ in load_op_configs()]


def get_op_config(config_id: str) -> Workload:
    """The workload of the default configuration ``config_id`` (e.g. ``"M1"``); ConfigError if unknown."""
    configs = load_op_configs()
    for wid, wl in configs:
        if wid == config_id:
            return wl
    raise ConfigError(f"unknown op config {config_id!r} (known: {', '.join(w for w, _ in configs)})")

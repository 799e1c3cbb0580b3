"""The bundled benchmark programs in ``configs/programs/*.gsp``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import gensorage
from gensorage.errors import ConfigError
from gensorage.program.program import Program
from gensorage.program.text_format import load_program

CONFIG_ENV = "GENSORAGE_CONFIG_DIR"


def config_dir() -> Path:
    """``$GENSORAGE_CONFIG_DIR/programs`` if that variable is set, else ``configs/programs`` of the checkout."""
    env = os.environ.get(CONFIG_ENV)
    if env:
        return Path(env) / "programs"
    return Path(gensorage.__file__).resolve().parents[1] / "configs" / "programs"


def list_configs() -> list[Path]:
    """Every ``.gsp`` file of :func:`config_dir`, sorted by name (empty if the folder does not exist)."""
    folder = config_dir()
    if not folder.is_dir():
        return []
    return sorted(folder.glob("*.gsp"))


def load_config(name: str, params: Mapping[str, int] | None = None) -> Program:
    """Load the bundled program ``name`` (the file stem, e.g. ``"gqa_incdec"``) with optional param overrides."""
    path = config_dir() / f"{name}.gsp"
    if not path.is_file():
        known = ", ".join(p.stem for p in list_configs()) or "none"
        raise ConfigError(f"no program config '{name}' in {config_dir()} (available: {known})")
    return load_program(path, params)


__all__ = ["CONFIG_ENV", "config_dir", "list_configs", "load_config"]

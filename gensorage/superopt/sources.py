"""Where a program to superoptimise comes from (a Program, a ``.gsp`` file, a bundled config) and the shapes
its search runs at (a preset's small *search shapes*, else its own)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gensorage.errors import ConfigError, GensorageError
from gensorage.program import Program, config_dir, parse_program
from gensorage.superopt.presets import Preset, find_preset, load_preset
from gensorage.superopt.search_shapes import derive_search_shapes


@dataclass(frozen=True, slots=True)
class ProgramSource:
    """A program at the requested shapes, with the text it came from (to instantiate it at other shapes)."""

    program: Program
    text: str | None
    name: str


def resolve_program(
    program: Program | str | os.PathLike[str], params: Mapping[str, int] | None = None
) -> ProgramSource:
    """``program`` as a :class:`ProgramSource`: a Program, a ``.gsp`` path, or a bundled config name."""
    if isinstance(program, Program):
        if params:
            raise ConfigError("params apply to a program file or config name, not to a built Program")
        return ProgramSource(program, _config_text_for(program), program.name)
    text_name = os.fspath(program)
    path = Path(text_name).expanduser()
    if not path.is_file():
        if path.is_dir():
            raise ConfigError(f"{text_name}: is a directory, not a program file")
        if path.suffix or os.sep in text_name:
            raise ConfigError(f"{text_name}: no such program file")
        path = config_dir() / f"{text_name}.gsp"
        if not path.is_file():
            from gensorage.program import list_configs

            known = ", ".join(p.stem for p in list_configs()) or "none"
            raise ConfigError(f"no program file or bundled config named '{text_name}' (configs: {known})")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read program file: {exc}") from None
    p = parse_program(text, params=params, source=str(path), default_name=path.stem)
    return ProgramSource(p, text, path.stem)


def _config_text_for(p: Program) -> str | None:
    """The bundled config a built Program was instantiated from (same name, same key at its params), if any."""
    path = config_dir() / f"{p.name}.gsp"
    if not p.params or not path.is_file():
        return None
    try:
        text = path.read_text(encoding="utf-8")
        if parse_program(text, params=p.params, source=str(path)).key() == p.key():
            return text
    except (OSError, GensorageError):
        return None
    return None


def resolve_preset(preset: Preset | str | None, src: ProgramSource) -> tuple[Preset | None, bool]:
    """(the preset, whether the caller named it); an automatic one is the preset named like the program."""
    if isinstance(preset, Preset):
        return preset, True
    if isinstance(preset, str):
        return load_preset(preset), True
    if find_preset(src.name) is None:
        return None, False
    auto = load_preset(src.name)
    return (auto, False) if auto.program == src.name else (None, False)


def search_program(src: ProgramSource, preset: Preset | None, explicit: bool, notes: list[str]) -> Program:
    """The program at the preset's search shapes; without a preset that names some, at shapes derived from its
    own (:mod:`.search_shapes`), or the program itself where none can be derived (the note says why)."""
    p = src.program
    if preset is None or not preset.search_params:
        derived = derive_search_shapes(p)
        notes.append(derived.note)
        return _with_params(src, derived.program, derived.sizes) if derived.shrunk else derived.program
    if src.text is None:
        notes.append(
            f"preset '{preset.name}' has search shapes, but the program has no source text to "
            "instantiate at them: searching at its own shapes"
        )
        return p
    try:
        small = parse_program(
            src.text, params=preset.search_params, source=f"preset {preset.name}", default_name=src.name
        )
    except GensorageError as exc:
        if explicit:
            raise ConfigError(
                f"preset '{preset.name}': its search_params do not fit the program: {exc}"
            ) from None
        notes.append(f"preset '{preset.name}' does not fit this program ({exc}); searching at its own shapes")
        return p
    if small.structure_key() != p.structure_key():
        if explicit:
            raise ConfigError(
                f"preset '{preset.name}': the program at its search shapes has another structure"
            )
        notes.append(f"preset '{preset.name}' changes the program's structure; searching at its own shapes")
        return p
    return small


def _with_params(src: ProgramSource, small: Program, sizes: dict[int, int]) -> Program:
    """``small`` parsed from the program's text at its params shrunk alike, when that gives the same program
    (so the store and the result say which params the search ran at); else ``small`` as derived."""
    p = src.program
    if src.text is None or not p.params or any(v not in sizes for v in p.params.values()):
        return small
    params = {k: sizes[v] for k, v in p.params.items()}
    try:
        parsed = parse_program(src.text, params=params, source="search shapes", default_name=src.name)
    except GensorageError:
        return small
    return parsed if parsed.key() == small.key() else small


__all__ = ["ProgramSource", "resolve_preset", "resolve_program", "search_program"]

"""Tensor programs: the builder (:class:`Program`), the ``.gsp`` text form and the bundled benchmark configs."""

from __future__ import annotations

from gensorage.program.configs import config_dir, list_configs, load_config
from gensorage.program.program import DEFAULT_DTYPE, DTYPES, Node, Program, Tensor
from gensorage.program.text_format import dump_program, load_program, parse_program

__all__ = [
    "DEFAULT_DTYPE",
    "DTYPES",
    "Node",
    "Program",
    "Tensor",
    "config_dir",
    "dump_program",
    "list_configs",
    "load_config",
    "load_program",
    "parse_program",
]

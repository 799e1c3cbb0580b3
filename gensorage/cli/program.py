"""``gensorage program``: show, run and list tensor programs (``.gsp`` files or bundled configs)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from gensorage.cli.argtypes import positive_int, seed
from gensorage.errors import ConfigError, ProgramError
from gensorage.program import Program, list_configs, load_config, load_program

# float64 elements `run` may allocate before it refuses (2^28 elements = 2 GiB).
DEFAULT_MAX_ELEMENTS = 1 << 28


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("program", help="show, run and list tensor programs (.gsp files)")
    sub = parser.add_subparsers(dest="program_command", metavar="ACTION")
    sub.required = True

    show = sub.add_parser("show", help="print a program's inputs, ops with shapes, and outputs")
    _add_source_args(show)
    show.add_argument("--json", action="store_true", help="print JSON instead of text")
    show.set_defaults(func=cmd_show)

    run = sub.add_parser(
        "run", help="run a program in float64 on random inputs; print output shapes and checksums"
    )
    _add_source_args(run)
    run.add_argument("--seed", type=seed, default=0, help="random seed for the inputs (default 0)")
    run.add_argument(
        "--max-elements",
        type=positive_int,
        default=DEFAULT_MAX_ELEMENTS,
        help=f"refuse programs whose tensors hold more float64 elements (default {DEFAULT_MAX_ELEMENTS})",
    )
    run.set_defaults(func=cmd_run)

    lst = sub.add_parser("list", help="list the bundled program configs")
    lst.set_defaults(func=cmd_list)


def _add_source_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file", metavar="FILE", help="a .gsp file, or the name of a bundled config (see 'list')"
    )
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override an integer 'param' of the program (repeatable)",
    )


def parse_params(items: list[str]) -> dict[str, int]:
    """``["b=2", "d=16"]`` as ``{"b": 2, "d": 16}``; a malformed item is a :class:`ConfigError`."""
    params: dict[str, int] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--param {item!r}: expected NAME=VALUE")
        try:
            params[key] = int(value.strip())
        except ValueError:
            raise ConfigError(f"--param {item!r}: value must be an integer") from None
    return params


def load_source(file: str, params: dict[str, int]) -> Program:
    """A program from a path, or from a bundled config when ``file`` is not a path to an existing file."""
    path = Path(file)
    if path.is_file():
        return load_program(path, params)
    if path.is_dir():
        raise ConfigError(f"{file}: is a directory, not a program file")
    if path.suffix or "/" in file:
        raise ConfigError(f"{file}: no such program file")
    return load_config(file, params)


def program_json(p: Program) -> dict[str, Any]:
    names = {n.id: n.name for n in p.nodes}
    return {
        "name": p.name,
        "params": p.params,
        "inputs": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype} for t in p.inputs],
        "nodes": [
            {
                "id": n.id,
                "name": n.name,
                "op": n.op.value if n.op else None,
                "inputs": [names[i] for i in n.inputs],
                "attrs": {k: list(v) if isinstance(v, tuple) else v for k, v in n.attrs},
                "shape": list(n.shape),
                "dtype": n.dtype,
            }
            for n in p.nodes
            if n.op is not None
        ],
        "outputs": [t.name for t in p.outputs],
        "key": p.key(),
        "structure_key": p.structure_key(),
    }


def cmd_show(args: argparse.Namespace) -> int:
    p = load_source(args.file, parse_params(args.param))
    if args.json:
        print(json.dumps(program_json(p), indent=2))
        return 0
    if p.params:
        print("params: " + ", ".join(f"{k}={v}" for k, v in p.params.items()))
    print(p.describe())
    print(f"key {p.key()}  structure_key {p.structure_key()}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    p = load_source(args.file, parse_params(args.param))
    live = set(p.live_ids())
    elements = sum(math.prod(n.shape) for n in p.nodes if n.id in live)
    if elements > args.max_elements:
        raise ProgramError(
            f"program '{p.name}' holds {elements} float64 elements in its tensors, over the limit of "
            f"{args.max_elements}: pass smaller --param values or raise --max-elements"
        )
    outputs = p.run(*p.random_inputs(args.seed))
    for t, value in zip(p.outputs, outputs, strict=True):
        finite = bool(np.all(np.isfinite(value)))
        print(
            f"{t.name}: shape {list(value.shape)} sum {float(np.sum(value)):.12g} "
            f"l2 {float(np.linalg.norm(value)):.12g}{'' if finite else ' (non-finite values)'}"
        )
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    configs = list_configs()
    if not configs:
        print("no program configs found", file=sys.stderr)
        return 1
    for path in configs:
        p = load_program(path)
        params = ", ".join(f"{k}={v}" for k, v in p.params.items())
        shapes = " ".join(f"{t.name}{list(t.shape)}" for t in p.inputs)
        print(f"{path.stem:<12} {shapes}  ({params})")
    return 0

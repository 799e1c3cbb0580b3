"""The ``gensorage`` command line.

Each subcommand lives in its own module of this package and exposes ``register(subparsers)``, which adds an
``argparse`` sub-parser whose ``func`` attribute is called with the parsed arguments and returns the exit code.
Errors the user can cause are :class:`gensorage.errors.GensorageError`: printed on one line, exit code taken
from the error class. Ctrl-C exits with 130 after the subcommand has saved what it found.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from gensorage.cli.argtypes import OneLineParser
from gensorage.errors import GensorageError

# Subcommand modules, in the order they appear in ``gensorage --help``.
SUBCOMMANDS: tuple[str, ...] = ("program", "verify", "hw", "tune", "search", "superopt")

EXIT_INTERRUPTED = 130


def _build_parser() -> argparse.ArgumentParser:
    from gensorage import __version__

    parser = OneLineParser(
        prog="gensorage",
        description="Superoptimizer for tensor programs: exhaustive µGraph search + Markov schedule construction.",
    )
    parser.add_argument("--version", action="version", version=f"gensorage {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"gensorage.cli.{name}")
        except ModuleNotFoundError as exc:
            # A subcommand module that is not written yet is skipped; any other import failure is a bug.
            if exc.name != f"gensorage.cli.{name}":
                raise
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except GensorageError as exc:
        print(f"gensorage: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("gensorage: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

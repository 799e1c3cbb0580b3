"""``argparse`` value types shared by the subcommands: a bad value is a one-line usage error (exit 2)."""

from __future__ import annotations

import argparse


def seed(text: str) -> int:
    """A random seed: a non-negative integer (numpy's generators take no other)."""
    return _int_at_least(text, 0, "a non-negative integer")


def positive_int(text: str) -> int:
    """An integer of at least 1."""
    return _int_at_least(text, 1, "a positive integer")


def _int_at_least(text: str, low: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
    return value


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line (the subcommand's ``--help`` has the rest)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


__all__ = ["OneLineParser", "positive_int", "seed"]

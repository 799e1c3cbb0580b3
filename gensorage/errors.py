"""The gensorage error hierarchy.

Every error a user can cause (a malformed program, an unsupported op, a shape that does not fit, a broken
config file, a corrupt store) is a :class:`GensorageError`. The CLI prints ``gensorage: error: <message>`` on
one line and exits with the class's ``exit_code``; nothing else escapes as a traceback.
"""

from __future__ import annotations


class GensorageError(Exception):
    """Base class of every user-facing gensorage error."""

    exit_code: int = 2


class ProgramError(GensorageError):
    """A malformed tensor program: wrong shapes or dtypes for an op, unknown tensor, bad attribute."""

    exit_code = 3


class UnsupportedOpError(GensorageError):
    """An op or feature gensorage does not support (in general or in the requested context)."""

    exit_code = 4


class NotLaxError(UnsupportedOpError):
    """A program outside the Lax fragment where only Lax programs can be verified."""


class UGraphError(GensorageError):
    """An invalid µGraph: operator spec, shape, memory or path-structure violation."""

    exit_code = 5


class ConfigError(GensorageError):
    """A broken config, profile or program file (names the file, the field and the reason)."""

    exit_code = 6


class StoreError(GensorageError):
    """A corrupt or incompatible result store / checkpoint."""

    exit_code = 7


class ScheduleError(GensorageError):
    """A schedule that does not fit the hardware or the workload, or cannot be lowered."""

    exit_code = 8


class VerificationError(GensorageError):
    """A candidate failed verification where equivalence was required."""

    exit_code = 9


class DeviceError(GensorageError):
    """A GPU operation was requested where no usable GPU exists."""

    exit_code = 10


def first_line(exc: BaseException) -> str:
    """The line of an exception's message worth showing in a one-line error: TVM puts it last, on a line that
    names the error, after a traceback and metadata (at most 300 characters)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    msg = next((ln for ln in reversed(lines) if "Error" in ln or "error" in ln), lines[-1] if lines else "")
    return msg[:300] or type(exc).__name__

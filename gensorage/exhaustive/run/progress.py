"""Live progress of a running search, on stderr.

On a terminal a single line is rewritten in place at most :data:`TTY_INTERVAL_S` apart; otherwise (a log file,
a pipe) a full line is printed every :data:`LOG_INTERVAL_S`. A header says where the work is kept; the final
line is always printed. Nothing here touches stdout, which carries the search's result.
"""

from __future__ import annotations

import math
import shutil
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TextIO

TTY_INTERVAL_S = 0.25
LOG_INTERVAL_S = 10.0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the progress line shows; ``stats`` is a ``Stats`` as a dict (missing fields count as 0)."""

    stats: Mapping[str, Any]
    tasks_done: int
    tasks_total: int
    tasks_done_this_run: int
    tasks_running: int
    best_time_s: float | None
    elapsed_s: float


def format_count(n: float) -> str:
    """``1234567`` as ``1.23M`` (thousands as ``k``), small numbers as they are."""
    n = float(n)
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.3g}{suffix}"
    return f"{n:.0f}"


def format_seconds(s: float | None) -> str:
    """``75.2`` as ``1:15``, ``3725`` as ``1:02:05``; None or non-finite as ``?``."""
    if s is None or not math.isfinite(s):
        return "?"
    s = max(0, int(round(s)))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def format_time(t: float | None) -> str:
    """A predicted kernel time in the most readable unit; None as ``-``."""
    if t is None:
        return "-"
    if t >= 1.0:
        return f"{t:.3g} s"
    if t >= 1e-3:
        return f"{t * 1e3:.3g} ms"
    return f"{t * 1e6:.3g} µs"


def eta_s(snap: Snapshot) -> float | None:
    """Remaining time at this run's task throughput; None before any task of this run has finished."""
    remaining = snap.tasks_total - snap.tasks_done
    if remaining <= 0:
        return 0.0
    if snap.tasks_done_this_run <= 0 or snap.elapsed_s <= 0:
        return None
    return snap.elapsed_s / snap.tasks_done_this_run * remaining


def format_line(snap: Snapshot, *, compact: bool = False) -> str:
    """The one-line summary: tasks, states, pruning, solver, verification, best, elapsed and ETA.

    ``compact`` leaves out the breakdown of pruning so the line fits a terminal.
    """
    st = snap.stats

    def g(name: str) -> float:
        return float(st.get(name, 0) or 0)

    pruned = g("pruned_expr") + g("pruned_shape") + g("pruned_memory")
    if compact:
        running = f" ({snap.tasks_running} running)" if snap.tasks_running else ""
        return (
            f"tasks {snap.tasks_done}/{snap.tasks_total}{running} | states {format_count(g('states'))} | "
            f"pruned {format_count(pruned)} | solver {format_count(g('solver_queries'))} q, "
            f"{format_count(g('cache_hits'))} hits | verified {format_count(g('verified'))} | best "
            f"{format_time(snap.best_time_s)} | {format_seconds(snap.elapsed_s)}, ETA {format_seconds(eta_s(snap))}"
        )
    parts = [
        f"tasks {snap.tasks_done}/{snap.tasks_total}"
        + (f" ({snap.tasks_running} running)" if snap.tasks_running else ""),
        f"states {format_count(g('states'))}"
        + (f" ({format_count(g('states_reused'))} reused)" if g("states_reused") else ""),
        f"pruned {format_count(pruned)} (expr {format_count(g('pruned_expr'))}, shape "
        f"{format_count(g('pruned_shape'))}, mem {format_count(g('pruned_memory'))})",
        f"solver {format_count(g('solver_queries'))} queries, {format_count(g('cache_hits'))} cache hits",
        f"verified {format_count(g('verified'))}",
        f"best {format_time(snap.best_time_s)}",
        f"elapsed {format_seconds(snap.elapsed_s)}",
        f"ETA {format_seconds(eta_s(snap))}",
    ]
    return "  ".join(parts)


class ProgressReporter:
    """Writes progress to ``stream`` (stderr by default); every method is a no-op when ``enabled`` is False.

    Parameters
    ----------
    enabled
        False silences everything (library use, ``--json``).
    stream
        Where to write; stdout is never the default.
    tty
        Rewrite one line in place; default: whether ``stream`` is a terminal.
    interval_s
        Minimum seconds between two updates (default :data:`TTY_INTERVAL_S` on a terminal, else
        :data:`LOG_INTERVAL_S`).
    """

    def __init__(
        self,
        *,
        enabled: bool = True,
        stream: TextIO | None = None,
        tty: bool | None = None,
        interval_s: float | None = None,
    ) -> None:
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        if tty is None:
            isatty = getattr(self.stream, "isatty", None)
            tty = bool(isatty()) if callable(isatty) else False
        self.tty = tty
        self.interval_s = (
            interval_s if interval_s is not None else (TTY_INTERVAL_S if tty else LOG_INTERVAL_S)
        )
        self._last = -math.inf
        self._last_line = ""
        self._open_line = False

    def message(self, text: str) -> None:
        """A line of its own (ends an in-place line first)."""
        if not self.enabled:
            return
        self._end_line()
        self.stream.write(text + "\n")
        self.stream.flush()

    def update(self, snap: Snapshot, *, force: bool = False) -> None:
        """Show ``snap`` if the interval has passed (or ``force``)."""
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < self.interval_s:
            return
        self._last = now
        line = "search: " + format_line(snap, compact=self.tty)
        if line == self._last_line:  # the final line after an update in the same second: shown already
            return
        self._last_line = line
        if self.tty:
            # \r + erase-to-end-of-line rewrites the line in place whatever its previous length; a line wider
            # than the terminal would wrap and \r would only return to its last row, so it is cut to fit.
            width = shutil.get_terminal_size((120, 24)).columns - 1
            if len(line) > width:
                line = line[: max(0, width - 1)] + "…"
            self.stream.write("\r" + line + "\x1b[K")
            self._open_line = True
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def finish(self, snap: Snapshot) -> None:
        """The final state, always printed, ending the line."""
        if not self.enabled:
            return
        self.update(snap, force=True)
        self._end_line()

    def _end_line(self) -> None:
        if self._open_line:
            self.stream.write("\n")
            self._open_line = False


__all__ = [
    "LOG_INTERVAL_S",
    "TTY_INTERVAL_S",
    "ProgressReporter",
    "Snapshot",
    "eta_s",
    "format_count",
    "format_line",
    "format_seconds",
    "format_time",
]

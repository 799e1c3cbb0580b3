"""Running an exhaustive search for hours (:func:`run_search`): worker processes, a SQLite checkpoint, a time
budget, Ctrl-C, live progress.

- :mod:`.runner`: the entry point and its contract (see its docstring for stopping and resuming);
- :mod:`.core`: the search core it drives (:class:`SearchCore`; by default the walk's task API);
- :mod:`.search_run`: one run: tasks inline, then on an :mod:`.engine` (a process pool, :mod:`.workers`, or a
  Dask cluster, :mod:`.cluster`), each committed to the :mod:`.checkpoint` as it finishes (plain data:
  :mod:`.conversions`; tasks continued or split into pieces: :mod:`.pieces`);
- :mod:`.progress` (the progress line) and :mod:`.processes` (workers die with their parent; scripts without a
  ``__main__`` guard).
"""

from __future__ import annotations

from gensorage.exhaustive.run.checkpoint import Checkpoint, StaleCheckpoint, default_checkpoint_path
from gensorage.exhaustive.run.conversions import stats_to_dict
from gensorage.exhaustive.run.core import SearchCore, default_core
from gensorage.exhaustive.run.progress import ProgressReporter
from gensorage.exhaustive.run.runner import SearchInterrupted, default_workers, run_search

__all__ = [
    "Checkpoint",
    "ProgressReporter",
    "SearchCore",
    "SearchInterrupted",
    "StaleCheckpoint",
    "default_checkpoint_path",
    "default_core",
    "default_workers",
    "run_search",
    "stats_to_dict",
]

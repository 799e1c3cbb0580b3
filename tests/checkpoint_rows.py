"""Reading a search checkpoint from outside the search while it runs (tests that wait for progress)."""

from __future__ import annotations

import sqlite3
from pathlib import Path


def count_rows(path: Path, query: str) -> int:
    """``query``'s single count on the checkpoint at ``path``, read-only; 0 while it does not exist or is
    locked mid-write."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        try:
            return int(conn.execute(query).fetchone()[0])
        finally:
            conn.close()
    except sqlite3.Error:
        return 0


def done_tasks(path: Path) -> int:
    """Tasks the checkpoint records as done."""
    return count_rows(path, "SELECT COUNT(*) FROM tasks WHERE status = 'done'")


def partial_rows(path: Path) -> int:
    """Save points of running tasks the driver wrote."""
    return count_rows(path, "SELECT COUNT(*) FROM partial")

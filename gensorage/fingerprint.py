"""Fingerprints that key stored results to the code and data that produced them.

A stored schedule or structure is reused only while the algorithm that made it and the hardware profile it was
made for are unchanged; keying by the package version alone would serve stale results after a change between
releases.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

import gensorage

_ROOT = Path(gensorage.__file__).resolve().parent


@cache
def code_fingerprint(*packages: str) -> str:
    """Short hash of the Python sources of the given ``gensorage`` subpackages (e.g. ``"markov"``)."""
    h = hashlib.sha256()
    for pkg in sorted(packages):
        for path in sorted((_ROOT / pkg).rglob("*.py")):
            h.update(path.relative_to(_ROOT).as_posix().encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:12]


def data_fingerprint(value: object) -> str:
    """Short hash of a frozen dataclass (e.g. a :class:`~gensorage.hw.profile.HwProfile`) by its ``repr``."""
    return hashlib.sha256(repr(value).encode()).hexdigest()[:12]

"""OpenBLAS threads for the verifier's exact matmuls.

The first tier's limb products are many small or skinny GEMMs (a decode step's ``(7 × 4096) @ (4096 × 256)``
per head). OpenBLAS threads each call; on a machine whose cores are busy the threads wait for each other, and
such a product measured 5-100× slower with two threads than with one (2-core machine, loaded). Large products
gain little from threads on the same machine. So :func:`single_threaded` sets the calling thread's OpenBLAS
thread count to one for the duration of a matmul (``openblas_set_num_threads_local``, OpenBLAS ≥ 0.3.27),
and restores it; with another BLAS, or an older OpenBLAS, it does nothing.
"""

from __future__ import annotations

import ctypes
import glob
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache

import numpy as np


@cache
def _set_local() -> Callable[[int], int] | None:
    """``openblas_set_num_threads_local`` of the OpenBLAS numpy loaded, or None."""
    folder = os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs")
    for path in sorted(glob.glob(os.path.join(folder, "*openblas*"))):
        try:
            fn = ctypes.CDLL(path).openblas_set_num_threads_local
        except (OSError, AttributeError):
            continue
        fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
        return fn  # type: ignore[no-any-return]
    return None


@contextmanager
def single_threaded() -> Iterator[None]:
    """Run the body with one OpenBLAS thread in the calling thread (no effect without OpenBLAS)."""
    fn = _set_local()
    if fn is None:
        yield
        return
    previous = fn(1)
    try:
        yield
    finally:
        fn(previous)


__all__ = ["single_threaded"]

"""Dtypes and random inputs for workloads."""

from __future__ import annotations

import numpy as np

from gensorage.dtypes import numpy_dtype
from gensorage.errors import ProgramError
from gensorage.workloads.workload import Workload

# Element types a workload may compute in (the dtypes hardware profiles give peak FLOP/s for).
SUPPORTED_DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32")


def accum_dtype(dtype: str) -> str:
    """The accumulator / output dtype for inputs of ``dtype``: 16-bit floats accumulate in float32."""
    return "float32" if dtype in ("float16", "bfloat16") else dtype


def check_dtype(dtype: object, op: str) -> str:
    if not isinstance(dtype, str) or dtype not in SUPPORTED_DTYPES:
        raise ProgramError(f"{op}: unsupported dtype {dtype!r} (supported: {', '.join(SUPPORTED_DTYPES)})")
    return dtype


def random_inputs(workload: Workload, seed: int = 0) -> list[np.ndarray]:
    """Random input arrays for ``workload``, one per input access, in order.

    Parameters
    ----------
    workload
        The workload whose ``inputs`` give the shapes and dtypes.
    seed
        Seed of the generator; the same seed gives the same arrays.

    Returns
    -------
    list of numpy.ndarray
        Values uniform in [-1, 1), stored in each input's dtype (so 16-bit inputs are already rounded).
    """
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1.0, 1.0, size=acc.shape).astype(numpy_dtype(acc.dtype)) for acc in workload.inputs]

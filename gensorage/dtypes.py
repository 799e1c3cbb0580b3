"""Element types: how many bytes each takes and its numpy form (one table for the whole package)."""

from __future__ import annotations

from typing import Any

import numpy as np

from gensorage.errors import UnsupportedOpError

DTYPE_BYTES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3": 1,
    "float8_e5m2": 1,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}


def dtype_bytes(dtype: object) -> int:
    """Bytes per element of ``dtype``: one of :data:`DTYPE_BYTES`, else any TVM dtype of whole bytes (a
    computation a user brings may use others, e.g. ``uint32`` or ``float16x4``).

    Raises
    ------
    UnsupportedOpError
        ``dtype`` is neither, or not a whole number of bytes.
    """
    name = str(dtype)
    known = DTYPE_BYTES.get(name)
    if known is not None:
        return known
    import tvm  # only for the rare dtype outside the table

    try:
        dt = tvm.runtime.DataType(name)
        bits = int(dt.bits) * int(dt.lanes)
    except ValueError:
        bits = 0
    if bits <= 0 or bits % 8:
        raise UnsupportedOpError(
            f"unknown dtype {name!r} (known: {', '.join(DTYPE_BYTES)}, or a TVM dtype of whole bytes)"
        )
    return bits // 8


def numpy_dtype(dtype: str) -> Any:
    """The numpy dtype for a dtype name (``bfloat16`` comes from ``ml_dtypes``, a TVM dependency)."""
    if dtype == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


__all__ = ["DTYPE_BYTES", "dtype_bytes", "numpy_dtype"]

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


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype``.

    Raises
    ------
    UnsupportedOpError
        ``dtype`` is not one of :data:`DTYPE_BYTES`.
    """
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise UnsupportedOpError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPE_BYTES)})") from None


def numpy_dtype(dtype: str) -> Any:
    """The numpy dtype for a dtype name (``bfloat16`` comes from ``ml_dtypes``, a TVM dependency)."""
    if dtype == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


__all__ = ["DTYPE_BYTES", "dtype_bytes", "numpy_dtype"]

"""The one dtype table (gensorage.dtypes)."""

from __future__ import annotations

import numpy as np
import pytest

from gensorage.dtypes import DTYPE_BYTES, dtype_bytes, numpy_dtype
from gensorage.errors import UnsupportedOpError

NUMPY_KNOWS = sorted(d for d in DTYPE_BYTES if not d.startswith("float8"))  # numpy has no float8


@pytest.mark.parametrize("dtype", NUMPY_KNOWS)
def test_sizes_agree_with_numpy(dtype: str) -> None:
    assert dtype_bytes(dtype) == numpy_dtype(dtype).itemsize


def test_float8_takes_one_byte() -> None:
    assert dtype_bytes("float8_e4m3") == dtype_bytes("float8_e5m2") == 1


def test_other_tvm_dtypes_of_whole_bytes_are_sized_and_the_rest_refused() -> None:
    assert dtype_bytes("uint32") == 4 and dtype_bytes("float16x4") == 8
    for bad in ("float7", "int4", "bogus"):
        with pytest.raises(UnsupportedOpError, match=f"unknown dtype '{bad}'"):
            dtype_bytes(bad)
    assert numpy_dtype("bfloat16") != np.dtype("float16") and numpy_dtype("bfloat16").itemsize == 2

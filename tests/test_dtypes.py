"""The one dtype table (gensorage.dtypes)."""

from __future__ import annotations

import numpy as np
import pytest

from gensorage.dtypes import DTYPE_BYTES, dtype_bytes, numpy_dtype
from gensorage.errors import UnsupportedOpError


@pytest.mark.parametrize("dtype", sorted(DTYPE_BYTES))
def test_sizes_agree_with_numpy_where_numpy_has_the_type(dtype: str) -> None:
    if dtype.startswith("float8"):
        pytest.skip("numpy has no float8")
    assert dtype_bytes(dtype) == numpy_dtype(dtype).itemsize


def test_unknown_dtypes_are_named() -> None:
    with pytest.raises(UnsupportedOpError, match="unknown dtype 'float7'"):
        dtype_bytes("float7")
    assert numpy_dtype("bfloat16") != np.dtype("float16") and numpy_dtype("bfloat16").itemsize == 2

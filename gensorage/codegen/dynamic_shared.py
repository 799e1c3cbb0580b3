"""Names of dynamic shared memory arrays.

CUDA gives every ``extern __shared__`` array of a translation unit the same address, and nvcc refuses two
declarations of one name with different element types ("declaration is incompatible"), even in different
kernels. A µGraph's kernels are built into one module, so each kernel names its dynamic shared array after its
element type: kernels that agree on the type share a name, the others cannot clash.
"""

from __future__ import annotations

from typing import Any


def dynamic_shared_name(stem: str, dtype: str) -> str:
    """The name of a kernel's dynamic shared array of ``dtype`` elements (TVM prints it with ``_ptr``)."""
    return f"{stem}_{dtype}"


def alloc_dynamic_shared(stem: str, size: int, dtype: str) -> Any:
    """``T.alloc_buffer((size,), dtype, scope="shared.dyn")`` named by :func:`dynamic_shared_name`, for kernels
    written as TVMScript in Python (assign it with ``T.meta_var`` so the parser keeps the name)."""
    from tvm.script import tirx as T
    from tvm.script.ir_builder import IRBuilder

    buf = T.alloc_buffer((size,), dtype, scope="shared.dyn")
    IRBuilder.name(dynamic_shared_name(stem, dtype), buf)
    return buf


__all__ = ["alloc_dynamic_shared", "dynamic_shared_name"]

"""An llvm build's functions served from a loaded shared library instead of LLVM's JIT: the memory a length keeps.

A compiled model in a serving process keeps, for every sequence length it has met, that length's own kernels
(:meth:`gensorage.codegen.symbolic_kernels.BoundExecutable.use_exact`). Served from the build as
``tvm.compile`` returns it, each length's module keeps TVM's LLVM module in memory beside the machine code
LLVM's JIT makes of it (the IR, its context, the JIT's own state): about 5 MB of native heap a length for the
small decoder layer of ``tests/test_torch_frontend.py`` (glibc's ``mallinfo2``, 12 lengths; the rest of the
10 MB a length that resident memory grew is dynamo's graphs and the dispatcher's per-length entries). Written
out as a shared library and loaded back (``export_library``: TVM's object file linked by the system's C
compiler), the module is the library's mapped code: the build's in-memory LLVM state is freed with it, and a
length keeps no measurable native heap for its kernels. The link costs the background build a few tenths of a
second (0.7 s a length at load average 7 on the 2-core dev machine); the machine code is the same LLVM code
generation's, so the kernels run as fast.

Where the link fails (no C compiler on the machine), the JIT serves the build as before: correct, the memory
kept; the first failure is logged once (logger ``gensorage.codegen``).
"""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any

from gensorage.codegen.module import _Renamed

log = logging.getLogger("gensorage.codegen")

#: Serve the llvm kernels of background builds (kept for the process's lifetime) from a loaded shared library
#: (False: from LLVM's JIT, about 1.5 MB a module of a few kernels kept beside the code).
AS_LIBRARY = True

_failed: list[str] = []  # the first link failure, logged once


def served(executable: Any, target: str) -> Any:
    """A background build's ``executable`` as it is kept: :func:`as_library` on llvm where :data:`AS_LIBRARY`."""
    return as_library(executable) if target == "llvm" and AS_LIBRARY else executable


def as_library(executable: Any) -> Any:
    """``executable`` (an llvm :func:`~gensorage.codegen.module.compile_kernels` result) with its functions
    looked up in the same code written out as a shared library and loaded (see the module docstring); itself
    where that fails."""
    import tvm

    inner, names = (
        (executable._ex, executable._names) if isinstance(executable, _Renamed) else (executable, None)
    )
    try:
        # the loaded library stays mapped once its file is removed
        with tempfile.TemporaryDirectory(prefix="gensorage-") as folder:
            path = os.path.join(folder, "kernels.so")
            inner.export_library(path)
            library = tvm.runtime.load_module(path)
    except Exception as exc:  # no compiler or linker: LLVM's JIT serves the build
        if not _failed:
            _failed.append(f"{type(exc).__name__}: {exc}")
            log.warning(
                "kernels stay in LLVM's JIT (about 5 MB a length): linking them failed: %s", _failed[0]
            )
        return executable
    return _Renamed(library, names) if names is not None else library


__all__ = ["AS_LIBRARY", "as_library", "served"]

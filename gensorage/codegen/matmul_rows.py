"""A 2-D matmul's scheduled PrimFunc at a new row count without TVM's schedule primitives.

At a new sequence length the matmuls whose rows are the tokens (a layer's projections) are lowered again, and
TVM's schedule primitives (``split``, ``compute_at``, ``reverse_compute_at``: 7–80 ms a matmul under load) are most
of that. Their schedule program depends on the construction's tiles, not on the row count. So the matmul is
scheduled once per (operand shapes with the rows left out, dtypes, epilogue, per-axis tiling) with its row count a
TIR variable, and :func:`specialised` binds the variable at each row count (well under a millisecond).

Exactness: TVM's schedule primitives preserve the function's meaning for every value of a variable, so the
specialised function computes the matmul at that row count, with the same tiles, the same reduction order and
so the same floating-point results. Where a step of the schedule would depend on the row count's value (an
extent it must read as an integer) the symbolic schedule fails and the key falls back to the schedule at each
row count. For the projections tried (the small decoder layer's, lengths 8–200) the block-lowered text equals the
one the schedule at that row count gives, so the compiled variants (:mod:`~gensorage.codegen.symbolic_kernels`)
see the same kernels; :data:`CHECK` (on in the tests) lowers both ways and raises where they differ.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from gensorage.errors import ScheduleError

if TYPE_CHECKING:
    from gensorage.codegen.epilogue_expr import KernelEpilogue
    from gensorage.codegen.predefined_matmul import _MatmulShape
    from gensorage.markov.schedule import Schedule

#: Off by default: a key's first symbolic schedule costs 3-4 times the schedule at one row count (TVM's analyses
#: over a variable extent), so it pays only from the key's second length on; on the small layer's lengths
#: 8-200 that was a loss (CHANGELOG, tenth session). On: every 2-D float llvm matmul goes through here.
ENABLED = False

#: Set by tests: every specialised matmul is also scheduled at its row count and the two block-lowered texts
#: compared (a difference raises :class:`~gensorage.errors.ScheduleError`).
CHECK = False

#: Symbolic schedules by key: the PrimFunc, or None where the symbolic schedule failed.
_SYMBOLIC: dict[Hashable, Any] = {}
_MAX_KEYS = 1024
_MISSING = object()


def specialised(
    ms: _MatmulShape,
    dtypes: tuple[str, str, str],
    schedule: Schedule,
    epi: KernelEpilogue | None,
    build: Any,
) -> Any:
    """The llvm PrimFunc of the float matmul ``ms`` scheduled with ``schedule``, from the symbolic schedule of its
    key bound at its row count; None where it has no symbolic schedule (a batched matmul, one row, an extra
    operand of rank above 2, or a schedule that needs the row count's value). ``build(ms, epi)`` is the
    workload's build function (``predefined_matmul._matmul_build`` with the dtypes bound)."""
    from tvm import tirx

    from gensorage.codegen.lower_schedule import axis_tilings, lower
    from gensorage.construction import matmul_workload

    rows = ms.out[-2]
    extra = epi.extra if epi is not None else ()
    if ms.batch or rows <= 1 or any(len(shape) > 2 for shape, _ in extra):
        return None
    wl = matmul_workload(*ms.dims, dtypes[0])
    tilings = tuple(
        dataclasses.replace(t, extent=0) if t.name == "i" else t for t in axis_tilings(wl, schedule)
    )
    key = (_with_rows(ms, 0), dtypes, _epi_with_rows(epi, rows, 0), tilings)
    entry = _SYMBOLIC.get(key, _MISSING)
    if entry is _MISSING:
        var = tirx.Var("rows", "int32")
        sym = dataclasses.replace(wl, build=build(_with_rows(ms, var), _epi_with_rows(epi, rows, var)))
        try:
            entry = lower(sym, schedule, "llvm")["main"]
        except (TypeError, ValueError, RuntimeError, ScheduleError):  # a step needs the rows' value
            entry = None
        if len(_SYMBOLIC) >= _MAX_KEYS:
            _SYMBOLIC.clear()
        _SYMBOLIC[key] = entry
    if entry is None:
        return None
    # A (the first parameter, stored as ``ms.stored_a``) declares the rows: bound through its shape
    out = entry.specialize({entry.params[0]: tirx.decl_buffer(ms.stored_a, dtypes[0], "A")})
    if CHECK:
        concrete = lower(dataclasses.replace(wl, build=build(ms, epi)), schedule, "llvm")["main"]
        if _block_lowered(out) != _block_lowered(concrete):
            raise ScheduleError(f"internal error: the specialised matmul {ms} differs from its schedule")
    return out


def _with_rows(ms: _MatmulShape, rows: Any) -> _MatmulShape:
    """``ms`` (2-D) with its row count replaced by ``rows``."""
    return dataclasses.replace(ms, a=(rows, ms.a[-1]), out=(rows, ms.out[-1]))


def _epi_with_rows(epi: KernelEpilogue | None, rows: int, new: Any) -> KernelEpilogue | None:
    """``epi`` with its extra operands' row dims (the second-to-last, broadcast against the output's rows)
    replaced by ``new`` where they are the rows (a broadcast row of 1 stays)."""
    if epi is None:
        return None
    extra = tuple(
        ((new, shape[1]) if len(shape) == 2 and shape[0] == rows else shape, dt) for shape, dt in epi.extra
    )
    return dataclasses.replace(epi, extra=extra)


def _block_lowered(func: Any) -> str:
    import tvm

    from gensorage.codegen.symbolic_kernels import _block_lowering

    with tvm.target.Target("llvm"):
        mod = tvm.ir.transform.Sequential(_block_lowering())(tvm.IRModule({"main": func}))
    return str(mod["main"].script())


__all__ = ["CHECK", "specialised"]

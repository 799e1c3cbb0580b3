"""The parameterization the sampling baselines (Optuna, random) draw schedules from.

Per axis ``a`` with legal sizes ``c = space.candidates[a]``: an index ``i0`` into ``c`` for ``T_0``, an offset
``d`` giving ``T_1 = c[min(len(c) - 1, i0 + d)]`` (so ``T_0 <= T_1`` always holds), and for spatial axes an
exponent ``e`` giving ``vthreads = min(2**e, largest power of two dividing T_0, MAX_VTHREAD)``. Every schedule of
the Markov construction's space has a parameter vector, so all methods search the same set; hardware limits
are not built in (a sample that does not fit scores ``inf`` and still counts as a trial).
"""

from __future__ import annotations

from dataclasses import dataclass

from gensorage.markov.schedule import Schedule
from gensorage.markov.space import MAX_VTHREAD, ScheduleSpace

VTHREAD_EXPONENTS = MAX_VTHREAD.bit_length()  # exponents 0 .. log2(MAX_VTHREAD)


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    high: int  # inclusive upper bound; the lower bound is 0


def parameters(space: ScheduleSpace) -> tuple[Param, ...]:
    """The integer parameters of ``space``, in a fixed order."""
    out: list[Param] = []
    for a, name in enumerate(space.axes):
        n = len(space.candidates[a])
        out.append(Param(f"{name}.t0", n - 1))
        out.append(Param(f"{name}.t1_offset", n - 1))
        if not space.is_reduce[a]:
            out.append(Param(f"{name}.vthread_exp", VTHREAD_EXPONENTS - 1))
    return tuple(out)


def decode(space: ScheduleSpace, values: dict[str, int]) -> Schedule:
    """The schedule a full parameter assignment stands for."""
    t0: list[int] = []
    t1: list[int] = []
    v: list[int] = []
    for a, name in enumerate(space.axes):
        c = space.candidates[a]
        i0 = values[f"{name}.t0"]
        t0.append(c[i0])
        t1.append(c[min(len(c) - 1, i0 + values[f"{name}.t1_offset"])])
        if space.is_reduce[a]:
            v.append(1)
        else:
            v.append(min(2 ** values[f"{name}.vthread_exp"], space.max_vthread(c[i0])))
    return space.make(tuple(t0), tuple(t1), tuple(v))

"""The shared-tile accesses of one graph-defined kernel, recorded while it is emitted, for the layout choice
(:mod:`gensorage.ugraph.optimize.layouts`): per read or write site, the element each lane of the first warp
touches. An index expression is evaluated with ``tx`` the lane, a flat-index temporary by its definition and
every other loop variable 0 (one representative instance of the site)."""

from __future__ import annotations

from gensorage.codegen.tir_text import Ix
from gensorage.ugraph.ir import Ref
from gensorage.ugraph.optimize.layouts import WARP, Access


class _LaneEnv(dict[str, int]):
    """The names of an index expression at one lane (see the module docstring)."""

    def __init__(self, lane: int, rec: AccessRecorder) -> None:
        super().__init__()
        self.lane, self.rec = lane, rec

    def __missing__(self, name: str) -> int:
        if name == "tx":
            return self.lane
        d = self.rec.defs.get(name)
        return 0 if d is None else self.rec.at_lane(d, self.lane)


class AccessRecorder:
    """Every tile's recorded accesses (``accesses[r]``, one :class:`Access` per site) in a kernel of
    ``threads`` threads."""

    def __init__(self, threads: int) -> None:
        self.lanes = min(WARP, threads)
        self.defs: dict[str, Ix] = {}  # the flat-index temporaries
        self.accesses: dict[Ref, list[Access]] = {}

    def define(self, name: str, value: Ix) -> None:
        self.defs[name] = value

    def note(self, r: Ref, idx: list[Ix]) -> None:
        """Record an access of tile ``r`` at element ``idx``."""
        lanes = tuple(tuple(self.at_lane(i, lane) for i in idx) for lane in range(self.lanes))
        self.accesses.setdefault(r, []).append(Access(lanes))

    def note_rows(self, r: Ref, idx: list[Ix], matrices: int, width: int) -> None:
        """Record an ``ldmatrix`` of ``matrices`` 8 x 8 matrices of tile ``r``: each lane gives the first element
        ``idx`` of a row of ``width`` elements, and each group of 8 lanes (one matrix) is one access."""
        for q in range(matrices):
            lanes = []
            for lane in range(8 * q, 8 * q + 8):
                first = [self.at_lane(i, lane) for i in idx]
                lanes += [(*first[:-1], first[-1] + c) for c in range(width)]
            self.accesses.setdefault(r, []).append(Access(tuple(lanes)))

    def note_run(self, r: Ref, idx: list[Ix], width: int) -> None:
        """Record an access of tile ``r`` in which each lane touches ``width`` elements from ``idx``."""
        lanes = []
        for lane in range(self.lanes):
            first = [self.at_lane(i, lane) for i in idx]
            lanes += [(*first[:-1], first[-1] + c) for c in range(width)]
        self.accesses.setdefault(r, []).append(Access(tuple(lanes)))

    def at_lane(self, ix: Ix, lane: int) -> int:
        env = _LaneEnv(lane, self)
        # The atoms are the emitter's own index text: names, integers, +, *, // and %.
        return ix.const + sum(c * int(eval(atom, {"__builtins__": {}}, env)) for atom, c in ix.terms)  # noqa: S307


__all__ = ["AccessRecorder"]

"""Additive constants: a program that is not positively homogeneous needs an ``add_scalar`` (an RMSNorm's eps).

A function ``f`` of the inputs is *positively homogeneous* of degree ``a`` when scaling every input by ``t > 0``
scales it by ``t^a``: ``f(t·x) = t^a·f(x)``. Over positive inputs (where every value of such a µGraph is positive,
so every ``sqrt`` and ``div`` is defined) each operator of :data:`HOMOGENEOUS_OPS` other than ``add_scalar`` maps
tensors whose elements are homogeneous to a tensor whose elements are: ``mul``/``matmul`` add degrees, ``div``
subtracts them, ``sqrt`` halves them, ``scale``, ``relu``, maxima, layout operators and tiles keep them, and a
sum (a reduction, a ``matmul``'s contraction, a summing accumulator) adds terms of one formula, so of one degree
(without ``add``, ``sub`` or ``concat`` no tensor mixes degrees). Every element of an input has degree 1, so a
µGraph without ``add_scalar`` over such an op set computes homogeneous outputs.

A program whose output is not homogeneous (``x / sqrt(mean(x²) + eps)``: as ``t → 0`` the denominator tends to
``sqrt(eps)``, not to 0) therefore equals no such µGraph, and every µGraph equivalent to it applies an
``add_scalar`` somewhere. While none has been applied (the walk's constant budget of every ``add_scalar`` variant
is untouched), the operators still to be added must include one: the node rule adds one to the bound, prunes a
node whose room it exceeds, and names ``add_scalar`` among the operators a tight bound admits. It removes only
µGraphs that cannot be equivalent to the program (they would fail verification), never a candidate.

Whether the program is homogeneous is decided numerically and only one way: it is evaluated in float64 at
positive inputs scaled by ``t`` and ``1/t`` for ``t = 10, 10², …, 10⁸``; a homogeneous output has
``f(t·x)·f(x/t) = f(x)²`` exactly, so an element off by more than :data:`TOLERANCE` (relative, far above
float64 rounding) proves that it is not. Otherwise (where a value is not finite and nonzero, or the program has
more than :data:`MAX_ELEMENTS` elements) the rule is off.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

import numpy as np

from gensorage.arith import Float64Arith
from gensorage.exhaustive.opcatalog import program_ops
from gensorage.exhaustive.rules.rule import PRUNE, Bound, Prune, Site
from gensorage.opset import Op
from gensorage.program import Program

#: Operators that keep every element of every tensor homogeneous (``add_scalar`` is the one that breaks it).
HOMOGENEOUS_OPS = frozenset(
    {
        Op.MATMUL,
        Op.MUL,
        Op.DIV,
        Op.SQRT,
        Op.SCALE,
        Op.RELU,
        Op.SUM,
        Op.MAX,
        Op.TRANSPOSE,
        Op.SLICE,
        Op.RESHAPE,
        Op.REPEAT,
        Op.ADD_SCALAR,
    }
)
#: Relative difference of ``f(t·x)·f(x/t)`` from ``f(x)²`` that proves a program inhomogeneous.
TOLERANCE = 1e-6
# Magnitudes well inside float64's normal range (a value outside it may have lost precision).
NORMAL_LOW, NORMAL_HIGH = 1e-250, 1e250
#: The most elements (all nodes together) the test evaluates.
MAX_ELEMENTS = 1 << 22
SCALES = tuple(10.0**k for k in range(1, 9))


def inhomogeneous(program: Program, seed: int = 0) -> bool:
    """Whether some output of ``program`` is shown not to be positively homogeneous (see the module docstring);
    False where the evaluation cannot show it."""
    if sum(math.prod(n.shape) for n in program.nodes) > MAX_ELEMENTS:
        return False  # too large to evaluate seventeen times (search shapes are small)
    rng = np.random.default_rng(seed)
    xs = [rng.uniform(0.5, 2.0, t.shape) for t in program.inputs]
    arith = Float64Arith()

    def at(t: float) -> list[np.ndarray]:
        with np.errstate(all="ignore"):
            return [np.asarray(o, dtype=np.float64) for o in program.evaluate(arith, [t * x for x in xs])]

    base = at(1.0)
    if not all(np.all(np.isfinite(o) & (o != 0)) for o in base):
        return False
    for t in SCALES:
        for o, up, down in zip(base, at(t), at(1.0 / t), strict=True):
            with np.errstate(all="ignore"):
                off = np.abs(up * down / (o * o) - 1.0)
            # Only where both values are normal floats: a subnormal or overflowing one has lost its precision.
            normal = _normal(up) & _normal(down) & np.isfinite(off)
            if np.any(normal & (off > TOLERANCE)):
                return True
    return False


def _normal(a: np.ndarray) -> np.ndarray:
    mag = np.abs(a)
    return np.isfinite(a) & (mag > NORMAL_LOW) & (mag < NORMAL_HIGH)


@dataclasses.dataclass(frozen=True, slots=True)
class Homogeneity:
    """The node rule (see the module docstring); built only where it applies."""

    @staticmethod
    def for_search(program: Program, ops: Iterable[Op]) -> Homogeneity | None:
        """The rule for a search of ``program`` over operators ``ops``, or None where it does not apply."""
        ops = frozenset(ops)
        if Op.ADD_SCALAR not in ops or not ops | program_ops(program) <= HOMOGENEOUS_OPS:
            return None
        return Homogeneity() if inhomogeneous(program) else None

    def check(self, site: Site, bound: Bound) -> Bound | Prune | None:
        """The node rule: an ``add_scalar`` is still needed where none has been applied."""
        if site.shifted:
            return None
        need = bound.need + 1
        if need > site.ops_room:
            return PRUNE
        return dataclasses.replace(bound, need=need, shift=True)


__all__ = ["HOMOGENEOUS_OPS", "Homogeneity", "inhomogeneous"]

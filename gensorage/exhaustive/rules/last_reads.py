"""The last kernel's reads: the program's outputs must be a function of the tensors the last kernel reads.

When the limits leave room for one more kernel operator only, that operator reads a set ``T`` of kernel tensors
(every unconsumed result among them, :func:`gensorage.exhaustive.walk.kernel_level.must_consume`) and writes
every program output. Its block graph reads nothing but ``T`` (and constants), so a µGraph completed there
computes ``O = f(T)``, ``f`` made of µGraph operators. If that µGraph is equivalent to the program, the
program's outputs ``O(x)`` equal ``f(T(x))`` for every input ``x``.

The test is first order, at a random point ``x``: for every direction ``v`` with ``J_T v = 0``,
``T(x + t v) − T(x) = o(t)``, and ``f`` is locally Lipschitz at ``T(x)`` (see below), so
``O(x + t v) − O(x) = o(t)`` and ``J_O v = 0``. So the null space of ``J_T`` lies in that of ``J_O``: every row of
``J_O`` lies in the row space of ``J_T``. Where it does not, no last kernel reading ``T`` finishes the µGraph.
``f`` need not be differentiable at ``T(x)`` (a maximum's kink): Lipschitz is enough. The µGraph operators are
locally Lipschitz wherever they are finite, except ``sqrt`` and ``log`` at 0, so the rule is applied only where
the op set has neither. The point must be one where ``T`` and ``O`` are differentiable (no two maxima's operands
tie): a random point is, with probability 1, and a prefix is pruned only if the test fails at two points.

Numerics keep what they cannot decide: the Jacobians are exact forward-mode derivatives in float64
(:class:`JetArith`, the blocks of a grid stacked), the row space of ``J_T`` takes every direction whose
remainder is above ``1e-9`` of its largest row (:func:`row_basis`; a larger row space rejects less), and a prefix
is rejected only when the part of ``J_O`` outside it is over :data:`REJECT` of ``J_O`` (FlashDecoding's split
kernel without ``l`` leaves 3.4 % of it outside at the MQA preset's shapes; a function of ``T`` leaves ~1e-15).
Any non-finite value keeps the prefix. Reads that hold every input the outputs depend on are kept untested, and
so are prefixes whose jets or row basis would be large (:data:`MAX_JET_ELEMENTS`, :data:`MAX_BASIS_WORK`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from gensorage.arith import AccumKind, Activation
from gensorage.errors import GensorageError
from gensorage.opset import Op
from gensorage.program import Program
from gensorage.ugraph.evaluate import evaluate
from gensorage.ugraph.ir import KernelGraph, KernelNode, Ref, TensorSpec

ROW_SPACE_RTOL = (
    1e-9  # directions of J_T whose remainder is above this fraction of its largest row: its row space
)
REJECT = 1e-3  # the share of J_O outside J_T's row space (Frobenius) above which a prefix is rejected
MAX_JET_ELEMENTS = 1 << 22  # input directions x largest tensor: past this the test is skipped (kept)
MAX_BASIS_WORK = 1 << 23  # directions x rows of J_T x the smaller of the two (the row basis's work): likewise
MAX_DECIDED = 100_000  # verdicts remembered before the memo starts afresh
SEEDS = (0x5EED, 0xD1CE)  # the two random points; a prefix is rejected only where both reject it
NOT_LIPSCHITZ = frozenset({Op.SQRT, Op.LOG})


class Jet(NamedTuple):
    """A value and its derivative along each input direction: ``d[k]`` is ``∂v/∂x_k`` (``d.shape = (n, *v.shape)``)."""

    v: np.ndarray
    d: np.ndarray


def _lift(d: np.ndarray, rank: int) -> np.ndarray:
    """``d`` with unit dims after the direction axis, so that its value part has ``rank`` dims."""
    missing = rank - (d.ndim - 1)
    return d if missing <= 0 else d.reshape((d.shape[0],) + (1,) * missing + d.shape[1:])


def _full(d: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    return np.broadcast_to(_lift(d, len(shape)), (d.shape[0], *shape))


class JetArith:
    """The :class:`~gensorage.arith.Arith` of first-order jets in float64 (forward-mode derivatives).

    A maximum's derivative is its larger operand's (``>=`` picks the first on a tie, which a random point has not).
    """

    name = "jet"

    def shape(self, a: Jet) -> tuple[int, ...]:
        return tuple(int(s) for s in a.v.shape)

    def _out(self, v: np.ndarray, d: np.ndarray) -> Jet:
        return Jet(v, _full(d, v.shape))

    def add(self, a: Jet, b: Jet) -> Jet:
        v = a.v + b.v
        return self._out(v, _full(a.d, v.shape) + _full(b.d, v.shape))

    def sub(self, a: Jet, b: Jet) -> Jet:
        v = a.v - b.v
        return self._out(v, _full(a.d, v.shape) - _full(b.d, v.shape))

    def mul(self, a: Jet, b: Jet) -> Jet:
        v = a.v * b.v
        return self._out(v, _full(a.d, v.shape) * b.v + a.v * _full(b.d, v.shape))

    def div(self, a: Jet, b: Jet) -> Jet:
        with np.errstate(divide="ignore", invalid="ignore"):
            v = a.v / b.v
            return self._out(v, (_full(a.d, v.shape) - v * _full(b.d, v.shape)) / b.v)

    def exp(self, a: Jet) -> Jet:
        with np.errstate(over="ignore", invalid="ignore"):
            v = np.exp(a.v)
            return Jet(v, a.d * v)

    def sqrt(self, a: Jet) -> Jet:
        with np.errstate(divide="ignore", invalid="ignore"):
            v = np.sqrt(a.v)
            return Jet(v, a.d * (0.5 / v))

    def scale(self, a: Jet, factor: float) -> Jet:
        return Jet(a.v * float(factor), a.d * float(factor))

    def add_scalar(self, a: Jet, value: float) -> Jet:
        return Jet(a.v + float(value), a.d)

    def activation(self, kind: Activation, a: Jet) -> Jet:
        from scipy import special

        x = a.v
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            if kind == "relu":
                v, g = np.maximum(x, 0.0), (x > 0).astype(np.float64)
            elif kind == "silu":
                s = special.expit(x)
                v, g = x * s, s * (1.0 + x * (1.0 - s))
            elif kind == "gelu":
                cdf = 0.5 * (1.0 + special.erf(x / math.sqrt(2.0)))
                v, g = x * cdf, cdf + x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
            elif kind == "tanh":
                v = np.tanh(x)
                g = 1.0 - v * v
            elif kind == "log":
                v, g = np.log(x), 1.0 / x
            else:
                raise ValueError(kind)
        return Jet(v, a.d * g)

    def clamp(self, a: Jet, lo: float | None, hi: float | None) -> Jet:
        inside = np.ones(a.v.shape)
        v = a.v
        if lo is not None:
            inside = inside * (v > lo)
            v = np.maximum(v, lo)
        if hi is not None:
            inside = inside * (v < hi)
            v = np.minimum(v, hi)
        return Jet(v, a.d * inside)

    def matmul(self, a: Jet, b: Jet) -> Jet:
        if a.v.ndim < 2 or b.v.ndim < 2:
            raise ValueError("a matmul of a vector")
        v = np.matmul(a.v, b.v)
        return self._out(v, np.matmul(_lift(a.d, v.ndim), b.v) + np.matmul(a.v, _lift(b.d, v.ndim)))

    def reduce_sum(self, a: Jet, axis: int, keepdims: bool) -> Jet:
        ax = axis % a.v.ndim
        return Jet(np.sum(a.v, axis=ax, keepdims=keepdims), np.sum(a.d, axis=ax + 1, keepdims=keepdims))

    def reduce_max(self, a: Jet, axis: int, keepdims: bool) -> Jet:
        ax = axis % a.v.ndim
        idx = np.argmax(a.v, axis=ax, keepdims=True)
        v = np.take_along_axis(a.v, idx, axis=ax)
        d = np.take_along_axis(a.d, np.broadcast_to(idx[None], (a.d.shape[0], *idx.shape)), axis=ax + 1)
        if not keepdims:
            v, d = np.squeeze(v, axis=ax), np.squeeze(d, axis=ax + 1)
        return Jet(v, d)

    def accumulate(self, acc: Jet | None, x: Jet, kind: AccumKind) -> Jet:
        if acc is None:
            return x
        if kind == "sum":
            return self.add(acc, x)
        v = np.maximum(acc.v, x.v)
        first = acc.v >= x.v
        return self._out(v, np.where(first, _full(acc.d, v.shape), _full(x.d, v.shape)))

    def reshape(self, a: Jet, shape: tuple[int, ...]) -> Jet:
        v = np.reshape(a.v, shape)
        return Jet(v, np.reshape(a.d, (a.d.shape[0], *v.shape)))

    def repeat(self, a: Jet, axis: int, times: int) -> Jet:
        ax = axis % a.v.ndim
        return Jet(np.repeat(a.v, times, axis=ax), np.repeat(a.d, times, axis=ax + 1))

    def transpose(self, a: Jet, axis0: int, axis1: int) -> Jet:
        n = a.v.ndim
        return Jet(np.swapaxes(a.v, axis0 % n, axis1 % n), np.swapaxes(a.d, axis0 % n + 1, axis1 % n + 1))

    def concat(self, parts: Sequence[Jet], axis: int) -> Jet:
        ax = axis % parts[0].v.ndim
        return Jet(
            np.concatenate([p.v for p in parts], axis=ax), np.concatenate([p.d for p in parts], axis=ax + 1)
        )

    def slice(self, a: Jet, axis: int, start: int, stop: int) -> Jet:
        ax = axis % a.v.ndim
        sv = [slice(None)] * a.v.ndim
        sv[ax] = slice(start, stop)
        return Jet(a.v[tuple(sv)], a.d[(slice(None), *sv)])


def input_jets(shapes: Sequence[tuple[int, ...]], seed: int) -> list[Jet]:
    """Standard normal inputs of ``shapes``, each element its own direction (``d`` the identity's rows)."""
    rng = np.random.default_rng(seed)
    n = sum(math.prod(s) for s in shapes)
    jets, at = [], 0
    for s in shapes:
        k = math.prod(s)
        d = np.zeros((n, k))
        d[at : at + k] = np.eye(k)
        jets.append(Jet(rng.standard_normal(s), d.reshape((n, *s))))
        at += k
    return jets


def jacobian(values: Sequence[Jet]) -> np.ndarray:
    """The Jacobian of ``values`` (their elements as rows, the input directions as columns)."""
    if not values:
        return np.zeros((0, 0))
    return np.concatenate([x.d.reshape(x.d.shape[0], -1).T for x in values], axis=0)


def row_basis(j: np.ndarray, rtol: float = ROW_SPACE_RTOL) -> np.ndarray:
    """An orthonormal basis (rows) of the row space of ``j``: pivoted Gram–Schmidt, the row with the largest
    remainder first, until every remainder is at most ``rtol`` of the largest row. Vector operations only, so
    its time does not depend on how many threads the BLAS may start (a LAPACK SVD of these sizes took ten times
    as long on a loaded machine)."""
    rest = np.array(j, dtype=np.float64)
    basis = np.zeros((min(rest.shape), rest.shape[1]))
    norms = np.sqrt(np.einsum("ij,ij->i", rest, rest))
    top = float(norms.max()) if norms.size else 0.0
    k = 0
    while k < basis.shape[0] and top > 0.0:
        i = int(np.argmax(norms))
        if norms[i] <= rtol * top:
            break
        q = rest[i] / norms[i]
        q = q - (basis[:k] @ q) @ basis[:k]  # orthogonal again to the basis (roundoff in the remainders)
        basis[k] = q / np.sqrt(q @ q)
        rest = rest - np.outer(rest @ basis[k], basis[k])
        norms = np.sqrt(np.einsum("ij,ij->i", rest, rest))
        k += 1
    return basis[:k]


def outside_share(j_out: np.ndarray, j_reads: np.ndarray) -> float:
    """The share (Frobenius) of ``j_out``'s rows outside the row space of ``j_reads``; NaN where not finite."""
    if not (np.all(np.isfinite(j_out)) and np.all(np.isfinite(j_reads))):
        return math.nan
    total = float(np.linalg.norm(j_out))
    if total == 0.0:
        return 0.0
    basis = row_basis(j_reads)
    rest = j_out - (j_out @ basis.T) @ basis
    return float(np.linalg.norm(rest)) / total


class LastReads:
    """The test of one search (its program's output Jacobians at the random points are computed once)."""

    def __init__(self, program: Program, required: Sequence[int]) -> None:
        self.shapes = [tuple(t.shape) for t in program.inputs]
        self.required = frozenset(Ref(i) for i in required)  # the inputs the outputs depend on
        self.directions = sum(math.prod(s) for s in self.shapes)
        self._outputs: dict[int, np.ndarray] = {}
        self._program = program
        self._decided: dict[bytes, bool] = {}  # verdicts by the reads' sorted values (see _value_key)
        self.tested = 0  # numeric tests made (the subtree memo keeps no subtree in which one was)

    def _output_jacobian(self, seed: int) -> np.ndarray:
        """``J_O`` at the point of ``seed``; NaN where an output is not finite there (the test then keeps)."""
        if seed not in self._outputs:
            outs = self._program.evaluate(JetArith(), input_jets(self.shapes, seed))
            j = jacobian(outs)
            if not all(np.all(np.isfinite(o.v)) for o in outs):
                j = np.full_like(j, np.nan)
            self._outputs[seed] = j
        return self._outputs[seed]

    def admits(
        self,
        specs: Sequence[TensorSpec],
        ops: Sequence[KernelNode],
        reads: Sequence[Ref],
        largest: int,
        rows: int,
    ) -> bool:
        """Whether the program's outputs may be a function of the tensors ``reads`` of the µGraph prefix ``ops``
        (``largest``: the most elements of a tensor in it, to bound the jets' size; ``rows``: the elements of
        ``reads``). Rejected only where the test rejects at both points; kept at once where the reads hold every
        input the outputs depend on."""
        if self.required <= set(reads):
            return True
        n = self.directions
        if n * max(largest, 1) > MAX_JET_ELEMENTS or n * rows * min(n, rows) > MAX_BASIS_WORK:
            return True
        self.tested += 1
        prefix = KernelGraph(tuple(specs), tuple(ops), tuple(reads))
        key = None
        for seed in SEEDS:
            try:
                values = evaluate(prefix, JetArith(), input_jets(self.shapes, seed), check=False, stack=True)
            except (ValueError, ArithmeticError, GensorageError):
                return True  # not evaluable as jets: kept
            if key is None:
                key = _value_key(values)
                if key in self._decided:
                    return self._decided[key]
            share = outside_share(self._output_jacobian(seed), jacobian(values))
            if not share > REJECT:  # NaN keeps
                return self._decide(key, True)
        return self._decide(key, False)

    def _decide(self, key: bytes | None, verdict: bool) -> bool:
        if key is not None:
            if len(self._decided) >= MAX_DECIDED:
                self._decided.clear()
            self._decided[key] = verdict
        return verdict


def _value_key(values: Sequence[Jet]) -> bytes:
    """The reads' values at the first point, sorted: reads that lay out the same scalar functions differently (a
    split kernel's savers' output maps) have the same row space, and two different functions agree at a random
    point with probability 0."""
    flat = np.sort(np.concatenate([np.ravel(x.v) for x in values]))
    return flat.tobytes()


__all__ = [
    "MAX_BASIS_WORK",
    "MAX_JET_ELEMENTS",
    "NOT_LIPSCHITZ",
    "REJECT",
    "ROW_SPACE_RTOL",
    "SEEDS",
    "Jet",
    "JetArith",
    "LastReads",
    "input_jets",
    "jacobian",
    "outside_share",
    "row_basis",
]

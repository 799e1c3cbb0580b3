"""Abstract arithmetic for the bounds the trial count needs, and the Lax check.

Every element of a Lax program's output can be written (Mirage, later version, §5.1) as ``P / P'`` with
``P = Σ_i f_i/g_i · exp(h_i/u_i)``. Clearing the inner denominators, a value here is ``N / D`` where

    N = Σ_{i ≤ kn} c_i · exp(e_i),   D = Σ_{j ≤ kd} c'_j · exp(e'_j),   e = h / u,

with polynomial coefficients ``c`` (degree ≤ ``dn`` in N, ≤ ``dd`` in D) and exponents ``h/u`` (degrees
≤ ``eh``, ``eu``). :class:`Bound` holds upper bounds for one tensor (the maximum over its elements):

- ``kn``, ``kd``: exponential term counts (1 and 1 for a plain rational function);
- ``dn``, ``dd``, ``eh``, ``eu``: total-degree bounds;
- ``wn``, ``wd``, ``wh``, ``wu``: log2 of bounds on the sum of absolute integer coefficients (the later
  paper's theorem assumes coefficients in [-w, w] with q > 2w; scale factors n/d multiply N by n and D by d);
- ``nexp``, ``dexp``: whether N / D contain a term with a non-constant exponent;
- ``exped``: some exp lies on a path into the tensor (a second exp on it is not Lax).

Rules (``a + b = (Na·Db + Nb·Da)/(Da·Db)``, ``a·b = Na·Nb/(Da·Db)``, ``a/b = Na·Db/(Da·Nb)``): term counts
multiply and add accordingly, degrees and log-coefficients add, and exponents combine (``e + e'``, degrees
``max(eh + eu', eh' + eu), eu + eu'``) whenever two exp-bearing parts multiply. A sum of n equal-bound terms
(reduce_sum over n, matmul with inner dim K = n) is the add rule applied n - 1 times, in closed form. sqrt,
the activations and max are *fresh variables* of degree 1 (their true algebraic relation to the input is
ignored); for the Lax theorems this is a heuristic they do not cover, and the results say so. With
``uninterpreted=True`` (the first tier) exp is a fresh variable too, and fresh variables are exactly what the
first tier's theorem is about.

:class:`BoundsArith` also records, for the degenerate-trial event, the sum over every divisor element of its
numerator degree, the element counts used to size trial batches, and per uninterpreted symbol the number of
applications and bounds on their arguments (:class:`Applications`, for the first tier's collision term).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from functools import lru_cache

from gensorage.arith import AccumKind, Activation
from gensorage.errors import NotLaxError
from gensorage.opset import broadcast_shapes, clamp_symbol, reshape_groups, transposed
from gensorage.verify.field import rational_of

#: Term counts saturate here: a count this large means "astronomically many" (no feasible trial count), and
#: keeping exact powers such as kd^K for K in the thousands, compounded over layers, would exhaust memory.
K_CAP = 1 << 1024


def _sat(x: int) -> int:
    return x if x < K_CAP else K_CAP


def _sat_pow(base: int, e: int) -> int:
    if base <= 1 or e == 0:
        return 1 if e == 0 else base
    if e * math.log2(base) >= 1024:
        return K_CAP
    return _sat(base**e)


def _log2_add(x: float, y: float) -> float:
    """log2(2^x + 2^y) without overflow."""
    hi, lo = max(x, y), min(x, y)
    return hi + math.log2(1.0 + 2.0 ** (lo - hi))


@dataclass(frozen=True, slots=True)
class Bound:
    """Bounds for every element of one tensor (see the module docstring)."""

    kn: int = 1
    kd: int = 1
    dn: int = 1
    dd: int = 0
    eh: int = 0
    eu: int = 0
    wn: float = 0.0
    wd: float = 0.0
    wh: float = 0.0
    wu: float = 0.0
    nexp: bool = False
    dexp: bool = False
    exped: bool = False

    @property
    def has_exp(self) -> bool:
        return self.nexp or self.dexp

    @property
    def degree(self) -> int:
        """Largest degree of any polynomial in the representation."""
        return max(self.dn, self.dd, self.eh, self.eu)

    @property
    def log2_coeff(self) -> float:
        """log2 of the largest coefficient-sum bound of any polynomial in the representation."""
        return max(self.wn, self.wd, self.wh, self.wu)


#: An input element: the polynomial x (degree 1, coefficient 1).
VARIABLE = Bound()


def _exponent(a: Bound, b: Bound, combine: bool) -> dict[str, float | int]:
    """Exponent bounds of a product of parts of ``a`` and ``b``; ``combine``: two exp-bearing parts multiply."""
    if not combine:
        return {"eh": max(a.eh, b.eh), "eu": max(a.eu, b.eu), "wh": max(a.wh, b.wh), "wu": max(a.wu, b.wu)}
    return {
        "eh": max(a.eh + b.eu, b.eh + a.eu),
        "eu": a.eu + b.eu,
        "wh": _log2_add(a.wh + b.wu, b.wh + a.wu),
        "wu": a.wu + b.wu,
    }


@lru_cache(maxsize=4096)  # blocks of a µGraph repeat the same bounds
def bound_add(a: Bound, b: Bound) -> Bound:
    """``a ± b = (Na·Db ± Nb·Da) / (Da·Db)``."""
    plain = not (a.has_exp or b.has_exp)
    combine = (a.nexp and b.dexp) or (b.nexp and a.dexp) or (a.dexp and b.dexp)
    return Bound(
        kn=1 if plain else _sat(a.kn * b.kd + b.kn * a.kd),
        kd=1 if plain else _sat(a.kd * b.kd),
        dn=max(a.dn + b.dd, b.dn + a.dd),
        dd=a.dd + b.dd,
        wn=_log2_add(a.wn + b.wd, b.wn + a.wd),
        wd=a.wd + b.wd,
        nexp=a.has_exp or b.has_exp,
        dexp=a.dexp or b.dexp,
        exped=a.exped or b.exped,
        **_exponent(a, b, combine),  # type: ignore[arg-type]
    )


@lru_cache(maxsize=4096)  # blocks of a µGraph repeat the same bounds
def bound_mul(a: Bound, b: Bound) -> Bound:
    """``a · b = (Na·Nb) / (Da·Db)``."""
    combine = (a.nexp and b.nexp) or (a.dexp and b.dexp)
    return Bound(
        kn=_sat(a.kn * b.kn),
        kd=_sat(a.kd * b.kd),
        dn=a.dn + b.dn,
        dd=a.dd + b.dd,
        wn=a.wn + b.wn,
        wd=a.wd + b.wd,
        nexp=a.nexp or b.nexp,
        dexp=a.dexp or b.dexp,
        exped=a.exped or b.exped,
        **_exponent(a, b, combine),  # type: ignore[arg-type]
    )


@lru_cache(maxsize=4096)  # blocks of a µGraph repeat the same bounds
def bound_div(a: Bound, b: Bound) -> Bound:
    """``a / b = (Na·Db) / (Da·Nb)``."""
    combine = (a.nexp and b.dexp) or (a.dexp and b.nexp)
    return Bound(
        kn=_sat(a.kn * b.kd),
        kd=_sat(a.kd * b.kn),
        dn=a.dn + b.dd,
        dd=a.dd + b.dn,
        wn=a.wn + b.wd,
        wd=a.wd + b.wn,
        nexp=a.nexp or b.dexp,
        dexp=a.dexp or b.nexp,
        exped=a.exped or b.exped,
        **_exponent(a, b, combine),  # type: ignore[arg-type]
    )


@lru_cache(maxsize=4096)  # blocks of a µGraph repeat the same bounds
def bound_sum(a: Bound, n: int, distinct: int | None = None) -> Bound:
    """Bound of a sum of ``n`` terms each bounded by ``a`` whose denominators take at most ``distinct`` values
    (default ``n``: all may differ).

    Over the product of the ``r`` distinct denominators, ``Σ_i N_i / D_c(i) = (Σ_i N_i · Π_{k≠c(i)} D_k) / Π_k
    D_k``: numerator degree ``dn + (r − 1)·dd``, denominator ``r·dd``. ``r = 1`` is one common denominator
    (``Σ N_i / D = (Σ N_i) / D``), ``r = n`` the add rule applied n − 1 times (closed form).
    """
    if n <= 1:
        return a
    r = n if distinct is None else max(1, min(distinct, n))
    log_n = math.log2(n)
    plain = not a.has_exp
    exps = {"eh": a.eh, "eu": a.eu, "wh": a.wh, "wu": a.wu}
    if a.dexp and r > 1:  # each distinct exp-bearing denominator multiplies into the others' terms
        exps = {
            "eh": a.eh + (r - 1) * a.eu,
            "eu": r * a.eu,
            "wh": math.log2(r) + a.wh + (r - 1) * a.wu,
            "wu": r * a.wu,
        }
    return replace(
        a,
        kn=1 if plain else _sat(n * a.kn * _sat_pow(a.kd, r - 1)),
        kd=1 if plain else _sat_pow(a.kd, r),
        dn=a.dn + (r - 1) * a.dd,
        dd=r * a.dd,
        wn=log_n + a.wn + (r - 1) * a.wd,
        wd=r * a.wd,
        nexp=a.nexp if r == 1 else a.has_exp,
        **exps,  # type: ignore[arg-type]
    )


@lru_cache(maxsize=4096)  # blocks of a µGraph repeat the same bounds
def bound_exp(a: Bound) -> Bound:
    """``exp(N/D)`` of an exp-free ``a``: one term with exponent ``h/u = N/D``."""
    if a.exped or a.has_exp:
        raise NotLaxError(
            "not in the Lax fragment: two exps on one path through exp (its input already depends on an exp)"
        )
    return Bound(
        kn=1,
        kd=1,
        dn=0,
        dd=0,
        eh=a.dn,
        eu=a.dd,
        wn=0.0,
        wd=0.0,
        wh=a.wn,
        wu=a.wd,
        nexp=True,
        dexp=False,
        exped=True,
    )


@lru_cache(maxsize=4096)  # blocks of a µGraph repeat the same bounds
def bound_scale(a: Bound, factor: float) -> Bound:
    """``a · n/d``: N gains the factor n, D the factor d."""
    r = rational_of(factor)
    return replace(a, wn=a.wn + math.log2(max(abs(r.numerator), 1)), wd=a.wd + math.log2(r.denominator))


def bound_constant(value: float) -> Bound:
    """The constant ``n/d`` (the rational of ``value``, as for scale): degree 0, coefficients n over d."""
    r = rational_of(value)
    return Bound(dn=0, wn=math.log2(max(abs(r.numerator), 1)), wd=math.log2(r.denominator))


def fresh(exped: bool = False) -> Bound:
    """An opaque result (sqrt, activation) treated as a fresh degree-1 variable."""
    return replace(VARIABLE, exped=exped)


def bound_join(bounds: Sequence[Bound]) -> Bound:
    """A bound valid for every element of a concatenation (field-wise maximum)."""
    return Bound(**{f.name: max(getattr(b, f.name) for b in bounds) for f in fields(Bound)})


def trivial_denominator(b: Bound) -> bool:
    """The denominator is a constant (no variables, no exp): the same for every element it could meet."""
    return b.kd == 1 and b.dd == 0 and not b.dexp


@dataclass(slots=True)
class Applications:
    """Element-wise applications of one uninterpreted function symbol, and bounds on their arguments.

    ``count`` applications (an upper bound on the number of distinct arguments); every argument is ``N / D``
    with ``deg N ≤ dn``, ``deg D ≤ dd`` and log2 coefficient sums ``≤ wn``, ``wd``. Two arguments differ by
    ``(N_i·D_j − N_j·D_i)/(D_i·D_j)``, a numerator of degree ``≤ dn + dd`` (:attr:`difference_degree`).
    """

    count: int = 0
    dn: int = 0
    dd: int = 0
    wn: float = 0.0
    wd: float = 0.0

    def add(self, count: int, arg: Bound) -> None:
        self.count += count
        self.dn, self.dd = max(self.dn, arg.dn), max(self.dd, arg.dd)
        self.wn, self.wd = max(self.wn, arg.wn), max(self.wd, arg.wd)

    @property
    def difference_degree(self) -> int:
        return self.dn + self.dd

    @property
    def difference_log2_coeff(self) -> float:
        return self.wn + self.wd + 1.0


@dataclass(frozen=True, slots=True)
class BoundValue:
    """A tensor in :class:`BoundsArith`: logical shape, element bound, and how its denominators vary.

    ``distinct[j]`` bounds how many values the elements' denominators take along axis ``j``: the denominator
    of element ``i`` is ``F(g_0(i_0), …, g_n(i_n))`` for some ``F`` and maps ``g_j`` with at most
    ``distinct[j]`` values (docs/verification.md, "Denominators along an axis"). 1: it does not change along
    ``j`` (a softmax row sum broadcast along ``j``), so a sum along ``j`` keeps one common denominator; a
    heads × head_dim dim merged by a reshape has as many as there are heads.
    """

    shape: tuple[int, ...]
    bound: Bound
    distinct: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True, slots=True)
class DiffBound:
    """Bounds on ``A - B = (Na·Db - Nb·Da) / (Da·Db)`` for one pair of outputs."""

    k: int
    degree: int
    numerator_degree: int
    denominator_degree: int
    log2_coeff: float
    has_exp: bool


def difference(a: Bound, b: Bound) -> DiffBound:
    """The difference bound of two outputs (cross-multiplied)."""
    d = bound_add(a, b)
    return DiffBound(
        k=d.kn if d.has_exp else 1,
        degree=d.degree,
        numerator_degree=d.dn,
        denominator_degree=d.dd,
        log2_coeff=d.log2_coeff,
        has_exp=d.has_exp,
    )


def _padded(v: BoundValue, ndim: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shape and distinct denominators of ``v`` left-padded to ``ndim`` axes (absent axes broadcast: size 1)."""
    pad = ndim - len(v.shape)
    return (1,) * pad + v.shape, (1,) * pad + v.distinct


def _reshape_distinct(
    old: tuple[int, ...], distinct: tuple[int, ...], new: tuple[int, ...]
) -> tuple[int, ...]:
    """Distinct denominators after a row-major reshape: axes are matched in groups of equal size product. Where
    a group has one new axis of more than one element (a merge, or a dim kept), that axis' index determines the
    old indices, so it sees at most the product of their counts. Where it has several (a split), an index of one
    new axis does not determine the old index alone, and the denominator need not factor over the new axes with
    those counts: each new axis gets its size (identity maps, for which it factors), unless every old count is
    1 (one denominator for the whole group)."""
    groups = reshape_groups(old, new)
    if groups is None:  # not a reshape of these sizes: every index its own denominator
        return new
    out = [1] * len(new)  # size-1 axes: one value
    for ins, outs in groups:
        count = math.prod(distinct[x] for x in ins)
        for y in outs:
            out[y] = new[y] if len(outs) > 1 and count > 1 else count
    return tuple(out)


class BoundsArith:
    """The :class:`gensorage.arith.Arith` of :class:`BoundValue`; run a program through it to get its bounds.

    Attributes
    ----------
    divisor_degree_p, divisor_degree_q : int
        Σ over every divisor element of its numerator degree, for zero tests mod p (all divisors) and mod q
        (divisors not downstream of an exp). P[some divisor vanishes] ≤ these / p and / q (Schwartz–Zippel).
    exp_divisor : bool
        Some divisor contains exp terms (its vanishing is not bounded by a degree).
    opaque : set of str
        Ops evaluated as fresh variables (``sqrt``, activations).
    total_numel : int
        Elements of every value computed (an upper bound on what an evaluation holds at once).
    uninterpreted : bool
        Bound the first tier (:mod:`gensorage.verify.uninterpreted`): exp is an uninterpreted function (a fresh
        variable) like sqrt and the activations, so no exponential terms arise and any nesting is allowed.
    applications : dict of str to Applications
        Per uninterpreted symbol (``exp``, ``sqrt``, activations, ``max-element`` for the elements a max hashes,
        ``max`` for its digests), the applications and their argument bounds.
    """

    name = "bounds"
    #: A tile's bound does not depend on where it was cut, so every block of a grid computes the same values and
    #: adds the same amounts to the counters: the µGraph evaluator runs one block literally and adds the
    #: others' counts (:meth:`counters`, :meth:`add_counters`) instead of running each.
    blocks_alike = True

    def __init__(self, *, uninterpreted: bool = False) -> None:
        self.uninterpreted = uninterpreted
        self.divisor_degree_p = 0
        self.divisor_degree_q = 0
        self.exp_divisor = False
        self.opaque: set[str] = set()
        self.total_numel = 0
        self.applications: dict[str, Applications] = {}

    def counters(self) -> tuple[int, int, int, dict[str, int]]:
        """The additive counters: divisor degrees mod p and q, elements, applications per symbol."""
        counts = {s: a.count for s, a in self.applications.items()}
        return self.divisor_degree_p, self.divisor_degree_q, self.total_numel, counts

    def add_counters(self, before: tuple[int, int, int, dict[str, int]], times: int) -> None:
        """Add ``times`` more of what the counters grew by since :meth:`counters` returned ``before``.

        What else a computation records (the largest argument bounds, opaque ops, an exp divisor) is the same
        when it runs again on the same values.
        """
        p, q, numel, counts = before
        self.divisor_degree_p += times * (self.divisor_degree_p - p)
        self.divisor_degree_q += times * (self.divisor_degree_q - q)
        self.total_numel += times * (self.total_numel - numel)
        for symbol, app in self.applications.items():
            app.count += times * (app.count - counts.get(symbol, 0))

    def _applied(self, symbol: str, count: int, arg: Bound) -> None:
        self.applications.setdefault(symbol, Applications()).add(count, arg)

    def _max(self, elements: int, arg: Bound, shape: tuple[int, ...]) -> BoundValue:
        """A max result: ``elements`` elements bounded by ``arg`` hashed, one digest per output element.

        A digest is linear in the element hashes with multiplicities ≤ ``elements`` as coefficients.
        """
        self.opaque.add("max")
        self._applied("max-element", elements, arg)
        self._applied("max", math.prod(shape), replace(VARIABLE, wn=math.log2(elements + 1)))
        return self._new(shape, fresh(False), ())

    def variable(self, shape: Sequence[int]) -> BoundValue:
        """An input tensor: independent variables."""
        shape_t = tuple(int(s) for s in shape)
        return self._new(shape_t, VARIABLE, ())

    def _new(self, shape: tuple[int, ...], bound: Bound, distinct: Sequence[int]) -> BoundValue:
        # a constant denominator is one value; no axis has more values than elements
        same = trivial_denominator(bound)
        counts = (
            (1,) * len(shape)
            if same
            else tuple(max(1, min(r, n)) for r, n in zip(distinct, shape, strict=True))
        )
        v = BoundValue(shape, bound, counts)
        self.total_numel += v.numel
        return v

    def _binary(self, a: BoundValue, b: BoundValue, bound: Bound, divide: bool = False) -> BoundValue:
        shape = broadcast_shapes(a.shape, b.shape) or a.shape  # shapes were checked by the evaluator
        _, ra = _padded(a, len(shape))
        shape_b, rb = _padded(b, len(shape))
        # a/b's denominator is Da·Nb: Nb may take a new value at every index along j unless b is broadcast there.
        right = [1 if d == 1 else n for d, n in zip(shape_b, shape, strict=True)] if divide else rb
        return self._new(shape, bound, [x * y for x, y in zip(ra, right, strict=True)])

    def shape(self, a: BoundValue) -> tuple[int, ...]:
        return a.shape

    def add(self, a: BoundValue, b: BoundValue) -> BoundValue:
        return self._binary(a, b, bound_add(a.bound, b.bound))

    def sub(self, a: BoundValue, b: BoundValue) -> BoundValue:
        return self._binary(a, b, bound_add(a.bound, b.bound))

    def mul(self, a: BoundValue, b: BoundValue) -> BoundValue:
        return self._binary(a, b, bound_mul(a.bound, b.bound))

    def div(self, a: BoundValue, b: BoundValue) -> BoundValue:
        degree = b.numel * b.bound.dn
        self.divisor_degree_p += degree
        if not b.bound.exped:
            self.divisor_degree_q += degree
        self.exp_divisor |= b.bound.nexp
        return self._binary(a, b, bound_div(a.bound, b.bound), divide=True)

    def exp(self, a: BoundValue) -> BoundValue:
        self._applied("exp", a.numel, a.bound)
        if self.uninterpreted:
            return self._new(a.shape, fresh(False), a.distinct)
        return self._new(a.shape, bound_exp(a.bound), a.distinct)

    def sqrt(self, a: BoundValue) -> BoundValue:
        self.opaque.add("sqrt")
        self._applied("sqrt", a.numel, a.bound)
        return self._new(a.shape, fresh(a.bound.exped and not self.uninterpreted), a.distinct)

    def scale(self, a: BoundValue, factor: float) -> BoundValue:
        return self._new(a.shape, bound_scale(a.bound, factor), a.distinct)

    def add_scalar(self, a: BoundValue, value: float) -> BoundValue:
        return self._new(a.shape, bound_add(a.bound, bound_constant(value)), a.distinct)

    def activation(self, kind: Activation, a: BoundValue) -> BoundValue:
        return self._function(kind, a)

    def clamp(self, a: BoundValue, lo: float | None, hi: float | None) -> BoundValue:
        return self._function(clamp_symbol(lo, hi), a)

    def _function(self, symbol: str, a: BoundValue) -> BoundValue:
        self.opaque.add(symbol)
        self._applied(symbol, a.numel, a.bound)
        return self._new(a.shape, fresh(False), a.distinct)

    def matmul(self, a: BoundValue, b: BoundValue) -> BoundValue:
        batch = broadcast_shapes(a.shape[:-2], b.shape[:-2]) or ()
        nd = len(batch) + 2
        _, ra = _padded(a, nd)
        _, rb = _padded(b, nd)
        k = a.shape[-1]
        # Σ_k a_ik b_kj: the terms' denominators Da·Db take at most ra·rb values along k; the sum's is the product
        # of those, a function of i through a's map only (of j through b's).
        batch_r = [x * y for x, y in zip(ra[:-2], rb[:-2], strict=True)]
        bound = bound_sum(bound_mul(a.bound, b.bound), k, ra[-1] * rb[-2])
        return self._new(batch + (a.shape[-2], b.shape[-1]), bound, batch_r + [ra[-2], rb[-1]])

    def reduce_sum(self, a: BoundValue, axis: int, keepdims: bool) -> BoundValue:
        shape = a.shape[:axis] + ((1,) if keepdims else ()) + a.shape[axis + 1 :]
        distinct = a.distinct[:axis] + ((1,) if keepdims else ()) + a.distinct[axis + 1 :]
        return self._new(shape, bound_sum(a.bound, a.shape[axis], a.distinct[axis]), distinct)

    def reduce_max(self, a: BoundValue, axis: int, keepdims: bool) -> BoundValue:
        if a.shape[axis] == 1:  # max({s}) = s
            return self.reshape(a, a.shape[:axis] + ((1,) if keepdims else ()) + a.shape[axis + 1 :])
        shape = a.shape[:axis] + ((1,) if keepdims else ()) + a.shape[axis + 1 :]
        return self._max(a.numel, a.bound, shape)

    def accumulate(self, acc: BoundValue | None, x: BoundValue, kind: AccumKind) -> BoundValue:
        if acc is None:
            return x
        if kind == "sum":
            return self.add(acc, x)
        return self._max(acc.numel + x.numel, bound_join([acc.bound, x.bound]), x.shape)

    def reshape(self, a: BoundValue, shape: tuple[int, ...]) -> BoundValue:
        new = tuple(int(d) for d in shape)
        return self._new(new, a.bound, _reshape_distinct(a.shape, a.distinct, new))

    def repeat(self, a: BoundValue, axis: int, times: int) -> BoundValue:
        shape = a.shape[:axis] + (a.shape[axis] * times,) + a.shape[axis + 1 :]
        return self._new(shape, a.bound, a.distinct)

    def transpose(self, a: BoundValue, axis0: int, axis1: int) -> BoundValue:
        return self._new(transposed(a.shape, axis0, axis1), a.bound, transposed(a.distinct, axis0, axis1))

    def concat(self, parts: Sequence[BoundValue], axis: int) -> BoundValue:
        first = parts[0].shape
        shape = first[:axis] + (sum(p.shape[axis] for p in parts),) + first[axis + 1 :]
        # along the axis, the part and its own map pick the denominator; along another, every part's map does
        distinct = [
            sum(p.distinct[j] for p in parts) if j == axis else math.prod(p.distinct[j] for p in parts)
            for j in range(len(first))
        ]
        return self._new(shape, bound_join([p.bound for p in parts]), distinct)

    def slice(self, a: BoundValue, axis: int, start: int, stop: int) -> BoundValue:
        shape = a.shape[:axis] + (stop - start,) + a.shape[axis + 1 :]
        return self._new(shape, a.bound, a.distinct)


__all__ = [
    "K_CAP",
    "VARIABLE",
    "Applications",
    "Bound",
    "BoundValue",
    "BoundsArith",
    "DiffBound",
    "bound_add",
    "bound_constant",
    "bound_div",
    "bound_exp",
    "bound_join",
    "bound_mul",
    "bound_scale",
    "bound_sum",
    "difference",
    "fresh",
    "trivial_denominator",
]

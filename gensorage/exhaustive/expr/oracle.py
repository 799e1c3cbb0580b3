"""The subexpression oracle of Algorithm 1 (``Subexpr(E, E_O)``): keep a prefix iff ``A_eq ∪ A_sub ⊨
subexpr(E, E_O)``, decided by a normal-form procedure and, where that cannot decide, by Z3.

Why not Z3 alone: with the quantified axioms Z3 proves entailed queries in milliseconds but essentially
never refutes one — a non-entailed query runs to its time or resource limit and comes back ``unknown``, and since a
timeout must never prune, Z3 alone would prune nothing. (Mirage counts ``unknown`` as "prune".) So the answer is
computed exactly in the *canonical model* of the axioms and Z3 is consulted only for the rare shapes the
procedure does not handle (a quotient of two denominators where the divisor adds fractions over different
denominators, e.g. ``x / (a/b + c/d)`` against a target with denominator ``(a/b + c/d) * u``).

The canonical model
-------------------
Read ``A_eq`` as rewriting to a normal form (an :class:`Elem`): a term is a sum of fractions with pairwise
different denominators, ``Σ_D N_D / D``; each numerator ``N_D`` is a multiset of monomials; a monomial is a
coefficient (the product of the reduction sizes of the ``sum`` s around it, an integer) and a non-empty multiset of
atoms; an atom is a variable or an uninterpreted application (``exp``, ``sqrt``, ``fn``, ``max``, ``cat``) of
normal forms; a denominator is a normal form. Adding merges numerators of equal denominators (``x/z + y/z =
(x+y)/z``), multiplying distributes and multiplies coefficients and denominators (``x * y/z = (x*y)/z``,
``sum(i, x*y) = sum(i, x)*y``), dividing multiplies every denominator (``(x/y)/z = x/(y*z)``), ``sum(i, .)``
multiplies every coefficient (``sum(i, sum(j, x)) = sum(i*j, x)``, ``sum(1, x) = x``). These normal forms with
these operations satisfy every axiom of ``A_eq`` for all integers, so they form a model: two terms are
``A_eq``-equal iff their normal forms are identical. Nothing cancels (no ``div(mul(x, y), y) = x``), as in the paper.

In that model the least relation satisfying ``A_sub`` is characterised by *contexts*: composing the arithmetic
contexts ``add(., r)``, ``mul(., z)``, ``div(., d)``, ``sum(i, .)`` always gives ``i*a*z/d + r``, so
``a ⊑ b`` iff

1. ``b ≡ i*a*z/d + r`` for some integer ``i``, monomial ``z``, denominator ``d``, remainder ``r`` (each
   optional) — :func:`arith_sub`, a finite search over the monomials of ``b``; or
2. ``a ⊑ g`` for a *gateway* of ``b``: a denominator of ``b`` (``subexpr(y, div(x, y))``) or an argument of an atom
   of ``b`` (``exp``, ``sqrt``, ``fn``, ``max`` — including ``max_r(j, e)`` for ``j | k``, ``cat`` parts); or
3. ``a`` is a ``cat`` all of whose parts are ``⊑ b`` (the concatenation rule).

This relation contains every ``A_sub`` instance and is transitive, so it includes the least one (every "no" is
exact); every "yes" comes with the witness context, an ``A_eq ∪ A_sub`` derivation (so it is exact too). The
test suite checks both directions against Z3 on random terms.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gensorage.exhaustive.expr.abstract_expr import Term

Atoms = tuple["Atom", ...]
Mono = tuple[int, Atoms]  # (coefficient, atoms sorted by uid)
Poly = tuple[tuple[Mono, int], ...]  # distinct monomials with their multiplicities, in mono_key order

#: Most distinct monomials a normal form may have. Expanding products of sums can grow exponentially
#: (``(x+y)^64`` from six squarings); beyond this a query is left to Z3 instead.
MAX_MONOMIALS = 20_000


class TooBig(Exception):
    """A normal form would exceed :data:`MAX_MONOMIALS`."""


class Atom:
    """An interned atom of the canonical model: a variable or an uninterpreted application of normal forms."""

    __slots__ = ("kind", "name", "k", "args", "uid", "vars")
    vars: frozenset[str]

    def __init__(self, kind: str, name: str, k: int, args: tuple[Elem, ...], uid: int) -> None:
        self.kind = kind
        self.name = name
        self.k = k
        self.args = args
        self.uid = uid
        self.vars = frozenset([name]) if kind == "var" else frozenset().union(*(a.vars for a in args))


class Elem:
    """An interned normal form: ``parts`` is ``((denominator or None, numerator), ...)``, numerators nonempty."""

    __slots__ = ("parts", "uid", "vars", "_counts", "atom")
    vars: frozenset[str]

    def __init__(self, parts: tuple[tuple[Elem | None, Poly], ...], uid: int) -> None:
        self.parts = parts
        self.uid = uid
        vs: set[str] = set()
        for d, poly in parts:
            if d is not None:
                vs |= d.vars
            for (_, atoms), _ in poly:
                for a in atoms:
                    vs |= a.vars
        self.vars = frozenset(vs)
        self._counts: dict[Elem | None, dict[Mono, int]] | None = None
        # The atom when this element is exactly one atom (coefficient 1, no denominator), else None.
        self.atom: Atom | None = None
        if len(parts) == 1 and parts[0][0] is None and len(parts[0][1]) == 1:
            (c, atoms), mult = parts[0][1][0]
            if c == 1 and mult == 1 and len(atoms) == 1:
                self.atom = atoms[0]

    def counts(self) -> dict[Elem | None, dict[Mono, int]]:
        """Numerators as monomial -> multiplicity maps, by denominator (cached)."""
        if self._counts is None:
            self._counts = {d: dict(poly) for d, poly in self.parts}
        return self._counts

    def __repr__(self) -> str:
        return f"Elem<{show(self)}>"


Groups = dict["Elem | None", dict[Mono, int]]


def _put(groups: Groups, d: Elem | None, m: Mono, n: int) -> None:
    g = groups.setdefault(d, {})
    g[m] = g.get(m, 0) + n


class Canon:
    """Intern tables and memoised operations of the canonical model."""

    def __init__(self) -> None:
        self._uid = 0
        self._atoms: dict[tuple[str, str, int, tuple[Elem, ...]], Atom] = {}
        self._elems: dict[tuple[tuple[Elem | None, Poly], ...], Elem] = {}
        self._nf: dict[Term, Elem] = {}
        self._mul: dict[tuple[Elem, Elem], Elem] = {}

    def _next(self) -> int:
        self._uid += 1
        return self._uid

    # ------------------------------------------------------------------ construction

    def atom(self, kind: str, args: tuple[Elem, ...], k: int = 0, name: str = "") -> Atom:
        key = (kind, name, k, args)
        a = self._atoms.get(key)
        if a is None:
            a = Atom(kind, name, k, args, self._next())
            self._atoms[key] = a
        return a

    def elem(self, groups: Groups) -> Elem:
        if sum(len(g) for g in groups.values()) > MAX_MONOMIALS:
            raise TooBig
        parts = tuple(
            (d, tuple(sorted(groups[d].items(), key=_item_key)))
            for d in sorted(groups, key=lambda d: 0 if d is None else d.uid)
            if groups[d]
        )
        e = self._elems.get(parts)
        if e is None:
            e = Elem(parts, self._next())
            self._elems[parts] = e
        return e

    def of_atom(self, a: Atom) -> Elem:
        return self.elem({None: {(1, (a,)): 1}})

    def add(self, x: Elem, y: Elem) -> Elem:
        groups: Groups = {}
        for e in (x, y):
            for d, poly in e.parts:
                for m, n in poly:
                    _put(groups, d, m, n)
        return self.elem(groups)

    def mul(self, x: Elem, y: Elem) -> Elem:
        key = (x, y) if x.uid <= y.uid else (y, x)
        got = self._mul.get(key)
        if got is not None:
            return got
        groups: Groups = {}
        for dx, px in x.parts:
            for dy, py in y.parts:
                d = self.den_mul(dx, dy)
                if len(px) * len(py) > MAX_MONOMIALS:
                    raise TooBig
                for m, a in px:
                    for n, b in py:
                        _put(groups, d, mono_mul(m, n), a * b)
        out = self.elem(groups)
        self._mul[key] = out
        return out

    def den_mul(self, d: Elem | None, e: Elem | None) -> Elem | None:
        if d is None:
            return e
        if e is None:
            return d
        return self.mul(d, e)

    def div(self, x: Elem, y: Elem) -> Elem:
        groups: Groups = {}
        for d, poly in x.parts:
            q = self.den_mul(d, y)
            for m, n in poly:
                _put(groups, q, m, n)
        return self.elem(groups)

    def sum(self, i: int, x: Elem) -> Elem:
        if i == 1:
            return x
        groups: Groups = {}
        for d, poly in x.parts:
            for (c, atoms), n in poly:
                _put(groups, d, (i * c, atoms), n)
        return self.elem(groups)

    def max_r(self, k: int, x: Elem) -> Elem:
        if k == 1:
            return x
        if x.atom is not None and x.atom.kind == "max":
            return self.of_atom(self.atom("max", x.atom.args, k * x.atom.k))
        return self.of_atom(self.atom("max", (x,), k))

    def cat(self, parts: Iterable[Elem]) -> Elem:
        flat: dict[int, Elem] = {}
        for p in parts:
            for q in p.atom.args if p.atom is not None and p.atom.kind == "cat" else (p,):
                flat[q.uid] = q
        if len(flat) == 1:
            return next(iter(flat.values()))
        return self.of_atom(self.atom("cat", tuple(flat[u] for u in sorted(flat))))

    def nf(self, t: Term) -> Elem:
        """The normal form of ``t`` (memoised per interned subterm); :class:`TooBig` if it would be huge."""
        got = self._nf.get(t)
        if got is not None:
            return got
        for s in t.subterms():  # children before parents: no deep recursion
            if s not in self._nf:
                self._nf[s] = self._nf_node(s)
        return self._nf[t]

    def _nf_node(self, t: Term) -> Elem:
        a = [self._nf[x] for x in t.args]
        match t.op:
            case "var":
                return self.of_atom(self.atom("var", (), 0, t.name))
            case "add":
                return self.add(a[0], a[1])
            case "mul":
                return self.mul(a[0], a[1])
            case "div":
                return self.div(a[0], a[1])
            case "sum":
                return self.sum(t.k, a[0])
            case "max":
                return self.max_r(t.k, a[0])
            case "cat":
                return self.cat(a)
            case "exp" | "sqrt":
                return self.of_atom(self.atom(t.op, (a[0],)))
            case "fn":
                return self.of_atom(self.atom("fn", (a[0],), 0, t.name))
            case _:
                raise ValueError(f"unknown term operator {t.op!r}")

    # ------------------------------------------------------------------ exact division

    def divide(self, num: Elem, den: Elem) -> Elem | None | _Undecided:
        """The ``q`` with ``den * q == num`` (unique: positive coefficients cancel), None if there is none.

        A ``den`` that is one fraction ``P/H`` (or a polynomial ``P``) maps ``Σ_G Q_G/G`` to ``Σ_G (P*Q_G)/(H*G)``,
        one-to-one, so every fraction ``N_K/K`` of ``num`` needs ``N_K = P*Q_G`` and ``K = H*G``: a polynomial
        division and a recursive one. A ``den`` adding fractions over several denominators, or non-positive
        coefficients, is undecided.
        """
        if not den.vars <= num.vars:
            return None  # a product keeps every variable of its factors
        if num.parts[-1][0] is None and any(h is not None for h, _ in den.parts):
            return None  # den * q has a fraction over H*G for each fraction of den: it is never fraction-free
        if len(den.parts) != 1:
            return UNDECIDED
        h, p = den.parts[0]
        groups: Groups = {}
        for k, poly in num.parts:
            g: Any = k
            if h is not None:
                if k is None:
                    return None
                g = None if k is h else self.divide(k, h)
                if g is UNDECIDED or (g is None and k is not h):
                    return g
            q = poly_divide(poly, p)
            if q is UNDECIDED or q is None:
                return q
            assert isinstance(q, dict)
            groups[g] = q
        return self.elem(groups)


class _Undecided:
    def __repr__(self) -> str:
        return "UNDECIDED"


UNDECIDED = _Undecided()


def mono_key(m: Mono) -> tuple[int, tuple[int, ...], int]:
    """A total monomial order compatible with multiplication (degree, then reverse-lex atoms, then coefficient)."""
    return (len(m[1]), tuple(a.uid for a in m[1]), m[0])


def _item_key(item: tuple[Mono, int]) -> tuple[int, tuple[int, ...], int]:
    return mono_key(item[0])


def mono_mul(m: Mono, n: Mono) -> Mono:
    return (m[0] * n[0], tuple(sorted(m[1] + n[1], key=_uid)))


def _uid(a: Atom) -> int:
    return a.uid


def atoms_minus(n: Atoms, m: Atoms) -> Atoms | None:
    """``n - m`` as multisets (both sorted by uid), or None unless ``m ⊆ n``."""
    if len(m) > len(n):
        return None
    out: list[Atom] = []
    j = 0
    for a in n:
        if j < len(m) and m[j] is a:
            j += 1
        else:
            out.append(a)
    return tuple(out) if j == len(m) else None


def poly_divide(num: Poly, den: Poly, max_steps: int = 10_000) -> dict[Mono, int] | None | _Undecided:
    """Exact division of numerators by leading monomials; None if ``den`` does not divide ``num``."""
    if any(c <= 0 for (c, _), _ in num) or any(c <= 0 for (c, _), _ in den):
        return UNDECIDED  # the monomial order is multiplicative only for positive coefficients
    dcount = dict(den)
    lead = max(dcount, key=mono_key)
    rem = dict(num)
    quotient: dict[Mono, int] = {}
    for _ in range(max_steps):
        if not rem:
            return quotient
        top = max(rem, key=mono_key)
        (c, atoms), (lc, latoms) = top, lead
        rest = atoms_minus(atoms, latoms)
        if c % lc or rest is None or not rest or rem[top] % dcount[lead]:
            return None  # no monomial t with t * lead == top (a monomial has at least one atom)
        t: Mono = (c // lc, rest)
        times = rem[top] // dcount[lead]
        for m, k in dcount.items():
            pm = mono_mul(t, m)
            left = rem.get(pm, 0) - k * times
            if left < 0:
                return None
            if left:
                rem[pm] = left
            else:
                del rem[pm]
        quotient[t] = quotient.get(t, 0) + times
    return UNDECIDED


# --------------------------------------------------------------------------------------------- the relation


def arith_sub(canon: Canon, a: Elem, b: Elem) -> bool | _Undecided:
    """Whether ``b ≡ i*a*z/d + r`` for some integer ``i``, monomial ``z``, denominator ``d``, remainder ``r``.

    ``z`` may be taken to be one monomial and ``d`` to absorb ``z``'s denominators: a bigger ``z`` only adds
    monomials that must also be present. Pick ``a``'s first fraction ``M0/E0`` and its first monomial; each
    monomial of ``b`` it can divide fixes ``i`` and ``z``, each denominator ``D`` of ``b`` fixes ``d = D/E0``; then
    every fraction ``M/E`` of ``a`` must appear, scaled, inside ``b``'s numerator over ``E*d``.
    """
    if not a.vars <= b.vars:
        return False
    counts = b.counts()
    e0, m0 = a.parts[0]
    c1, atoms1 = m0[0][0]
    undecided = False
    for big_d, numer in b.parts:
        d: Any
        if e0 is None:
            d = big_d
        elif big_d is None:
            continue
        elif big_d is e0:
            d = None
        else:
            d = canon.divide(big_d, e0)
            if d is UNDECIDED:
                undecided = True
                continue
            if d is None:
                continue
        for (c, atoms), _ in numer:
            if c1 == 0 or c % c1:
                continue
            z = atoms_minus(atoms, atoms1)
            if z is None:
                continue
            i = c // c1
            if all(_contains(counts.get(canon.den_mul(e, d)), m, i, z) for e, m in a.parts):
                return True
    return UNDECIDED if undecided else False


def _contains(have: dict[Mono, int] | None, poly: Poly, i: int, z: Atoms) -> bool:
    """Whether ``i * poly * z`` is a sub-multiset of ``have`` (the map is one-to-one for ``i != 0``)."""
    if have is None:
        return False
    return all(have.get((i * c, tuple(sorted(atoms + z, key=_uid))), 0) >= n for (c, atoms), n in poly)


def gateways(canon: Canon, b: Elem) -> list[Elem]:
    """``b`` and everything reachable from it through denominators and atom arguments (see the module doc)."""
    seen: dict[int, Elem] = {b.uid: b}
    stack = [b]
    while stack:
        e = stack.pop()
        for d, poly in e.parts:
            nxt: list[Elem] = [] if d is None else [d]
            for (_, atoms), _ in poly:
                for atom in atoms:
                    nxt.extend(atom.args)
                    if atom.kind == "max":  # max_r(j, x) ⊑ max_r(k, x) for j | k: max_r(k/j, max_r(j, x))
                        nxt.extend(canon.max_r(j, atom.args[0]) for j in divisors(atom.k) if 1 < j < atom.k)
            for g in nxt:
                if g.uid not in seen:
                    seen[g.uid] = g
                    stack.append(g)
    return list(seen.values())


def divisors(k: int) -> list[int]:
    """The positive divisors of ``k >= 1``, ascending."""
    small = [j for j in range(1, math.isqrt(k) + 1) if k % j == 0]
    return sorted(set(small + [k // j for j in small]))


def show(e: Elem) -> str:
    """A readable rendering of a normal form (``3*X*Y + Z / (W)``)."""

    def mono(m: Mono) -> str:
        body = "*".join(_show_atom(a) for a in m[1])
        return body if m[0] == 1 else f"{m[0]}*{body}"

    out = []
    for d, poly in e.parts:
        num = " + ".join(" + ".join([mono(m)] * n) for m, n in poly)
        out.append(num if d is None else f"({num}) / ({show(d)})")
    return " + ".join(out)


def _show_atom(a: Atom) -> str:
    if a.kind == "var":
        return a.name
    inner = ", ".join(show(x) for x in a.args)
    if a.kind == "max":
        return f"max({a.k}, {inner})"
    return f"{a.name or a.kind}({inner})"


# --------------------------------------------------------------------------------------------- the oracle


@dataclass
class OracleStats:
    """Counters of a :class:`SubexprOracle` (times in seconds, wall clock)."""

    queries: int = 0  # calls of is_subexpr / decide
    cache_hits: int = 0  # answered from the memo of earlier queries (by term, then by normal form)
    decided_fast: int = 0  # decided by the normal-form procedure
    z3_calls: int = 0  # sent to Z3
    timeouts: int = 0  # Z3 said unknown (time or resource limit): kept, never pruned
    solve_time_s: float = 0.0  # total time spent deciding queries not in the memo (procedure + Z3)
    z3_time_s: float = 0.0


class SubexprOracle:
    """``Subexpr(E, E_O)`` of Algorithm 1: is ``e`` an abstract subexpression of one of ``targets``?

    Parameters
    ----------
    targets : sequence of Term
        The program's output expressions ``E_O``; a query is kept if it is a subexpression of any of them.
    timeout_ms : int
        Z3 time limit per query (a resource limit proportional to it is set too, since Z3 overruns time limits
        while instantiating quantifiers). Only queries the normal-form procedure cannot decide reach Z3.
    use_fast_path : bool
        Decide by normal forms first (default). False sends every query to Z3 — for cross-checks only: Z3 cannot
        refute, so nothing would be pruned.

    Notes
    -----
    :meth:`is_subexpr` returns True to *keep* (entailed, or Z3 timed out / gave up: a timeout never prunes) and
    False to prune. Every distinct query is solved once: the memo is keyed by the interned term and by its
    normal form. Counters are in :attr:`stats`.
    """

    def __init__(self, targets: Sequence[Term], timeout_ms: int = 200, *, use_fast_path: bool = True) -> None:
        if not targets:
            raise ValueError("SubexprOracle needs at least one target expression")
        if timeout_ms <= 0:
            raise ValueError(f"timeout_ms must be positive, got {timeout_ms}")
        self.targets = tuple(targets)
        self.timeout_ms = int(timeout_ms)
        self.use_fast_path = use_fast_path
        self.stats = OracleStats()
        self.canon = Canon()
        self._gateways: list[list[Elem]] = []
        if use_fast_path:
            try:
                self._gateways = [gateways(self.canon, self.canon.nf(t)) for t in self.targets]
            except TooBig:
                self._gateways = []  # a target too big to normalise: everything goes to Z3
        self._fast_ok = bool(self._gateways)
        self._by_term: dict[Term, bool | None] = {}
        self._by_nf: dict[Elem, bool | None] = {}
        self._sub_memo: dict[tuple[Elem, int], bool | _Undecided] = {}
        self._z3: Any = None

    # The counters the search reports, as attributes of the oracle itself.
    @property
    def queries(self) -> int:
        return self.stats.queries

    @property
    def cache_hits(self) -> int:
        return self.stats.cache_hits

    @property
    def timeouts(self) -> int:
        return self.stats.timeouts

    @property
    def solve_time_s(self) -> float:
        return self.stats.solve_time_s

    def memo_size(self) -> int:
        """How many terms the memo holds (what a long-lived oracle's memory grows with)."""
        return len(self._by_term) + len(self.canon._nf)

    def is_subexpr(self, e: Term) -> bool:
        """True to keep ``e`` (entailed, or undecided within the time limit), False to prune it."""
        return self.decide(e) is not False

    def decide(self, e: Term) -> bool | None:
        """True (entailed), False (not entailed) or None (Z3 gave up: counted in ``timeouts``)."""
        st = self.stats
        st.queries += 1
        got = self._by_term.get(e, _MISSING)
        if got is not _MISSING:
            st.cache_hits += 1
            return got  # type: ignore[return-value]
        t0 = time.perf_counter()
        nf = self._normal_form(e)
        got = _MISSING if nf is None else self._by_nf.get(nf, _MISSING)
        if got is not _MISSING:
            st.cache_hits += 1
        else:
            got = self._solve(e, nf)
            if nf is not None:
                self._by_nf[nf] = got  # type: ignore[assignment]
        self._by_term[e] = got  # type: ignore[assignment]
        st.solve_time_s += time.perf_counter() - t0
        return got  # type: ignore[return-value]

    def entails_fast(self, e: Term) -> bool | None:
        """The normal-form procedure alone: True, False, or None where it cannot decide (no Z3, no counters)."""
        nf = self._normal_form(e)
        r = UNDECIDED if nf is None else self._fast(nf)
        return None if r is UNDECIDED else bool(r)

    def _normal_form(self, e: Term) -> Elem | None:
        """``e``'s normal form, or None when the procedure is off or the form would be too big."""
        if not self._fast_ok:
            return None
        try:
            return self.canon.nf(e)
        except TooBig:
            return None

    def _solve(self, e: Term, nf: Elem | None) -> bool | None:
        if nf is not None:
            r = self._fast(nf)
            if r is not UNDECIDED:
                self.stats.decided_fast += 1
                return bool(r)
        return self._ask_z3(e)

    def _fast(self, a: Elem) -> bool | _Undecided:
        try:
            return self._fast_unguarded(a)
        except TooBig:  # a product formed while matching (a denominator times d) grew too big
            return UNDECIDED

    def _fast_unguarded(self, a: Elem) -> bool | _Undecided:
        undecided = False
        for i in range(len(self.targets)):
            r = self._sub(a, i)
            if r is True:
                return True
            undecided |= r is UNDECIDED
        return UNDECIDED if undecided else False

    def _sub(self, a: Elem, target: int) -> bool | _Undecided:
        key = (a, target)
        got = self._sub_memo.get(key)
        if got is not None:
            return got
        out: bool | _Undecided = False
        for g in self._gateways[target]:
            r = arith_sub(self.canon, a, g)
            if r is True:
                out = True
                break
            if r is UNDECIDED:
                out = UNDECIDED
        if out is not True and a.atom is not None and a.atom.kind == "cat":
            parts = [self._sub(p, target) for p in a.atom.args]
            if all(p is True for p in parts):
                out = True
            elif any(p is UNDECIDED for p in parts) and not any(p is False for p in parts):
                out = UNDECIDED
        self._sub_memo[key] = out
        return out

    def _ask_z3(self, e: Term) -> bool | None:
        from gensorage.exhaustive.expr.axioms import Z3Subexpr

        if self._z3 is None:
            self._z3 = Z3Subexpr(self.targets, self.timeout_ms)
        self.stats.z3_calls += 1
        t0 = time.perf_counter()
        r = self._z3.entails(e)
        self.stats.z3_time_s += time.perf_counter() - t0
        if r is None:
            self.stats.timeouts += 1
        return r


_MISSING = object()


__all__ = [
    "MAX_MONOMIALS", "UNDECIDED", "Atom", "Canon", "Elem", "OracleStats", "SubexprOracle", "TooBig", "arith_sub",
    "divisors", "gateways", "show",
]

"""The subexpression oracle of Algorithm 1 (``Subexpr(E, E_O)``): keep a prefix iff ``A_eq ∪ A_sub ⊨
subexpr(E, E_O)``, decided by a normal-form procedure and, where that cannot decide, by Z3.

Why not Z3 alone: with the quantified axioms Z3 proves entailed queries in milliseconds but essentially
never refutes one — a non-entailed query runs to its time or resource limit and comes back ``unknown``, and since a
timeout must never prune, Z3 alone would prune nothing. (Mirage counts ``unknown`` as "prune".) So the answer is
computed exactly in the *canonical model* of the axioms and Z3 is consulted only for the rare shapes the
procedure does not handle (a quotient of two denominators where the divisor adds fractions over different
denominators, e.g. ``x / (a/b + c/d)`` against a target with denominator ``(a/b + c/d) * u``).

The canonical model (:mod:`.canon`) reads ``A_eq`` as rewriting to a normal form, so two terms are
``A_eq``-equal iff their normal forms are identical.

In that model the least relation satisfying ``A_sub`` is characterised by *contexts*: composing the arithmetic
contexts ``add(., r)``, ``mul(., z)``, ``div(., d)``, ``sum(i, .)`` always gives ``i*a*z/d + r``, so
``a ⊑ b`` iff

1. ``b ≡ i*a*z/d + r`` for some integer ``i``, monomial ``z``, denominator ``d``, remainder ``r`` (each
   optional) — :func:`arith_sub`, a finite search over the monomials of ``b``; or
2. ``a ⊑ g`` for a *gateway* of ``b``: a denominator of ``b`` (``subexpr(y, div(x, y))``) or an argument of an atom
   of ``b`` (``exp``, ``sqrt``, ``fn``, ``max`` — including ``max_r(j, e)`` for ``j | k``, ``cat`` parts); or
3. ``a`` is a ``cat`` all of whose parts are ``⊑ b`` (the concatenation rule); or
4. ``a ⊑ rest + Σ max(k_j, y_j)`` for a monomial of a gateway holding ``exp(rest)`` (or nothing for ``rest``)
   and ``stab(y_j)`` atoms: by the stabiliser laws that exponent's ``exp`` is a factor of the monomial for any
   sizes and multiplicities, so :func:`in_family` lets ``a``'s summands ``max(k, y_j)`` go to the free maxima.
   This is how a split's maximum ``m_i``, ``S − m_i`` and the rescale's ``m_i − M`` are kept.

This relation contains every ``A_sub`` instance and is transitive, so it includes the least one (every "no" is
exact); ``stab`` atoms are idempotent, so a context's ``z`` may or may not repeat the ones ``a`` has, and both
are tried. Every "yes" comes with the witness context, an ``A_eq ∪ A_sub`` derivation (so it is exact too). The
test suite checks both directions against Z3 on random terms.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gensorage.exhaustive.expr.abstract_expr import Term
from gensorage.exhaustive.expr.canon import (
    UNDECIDED,
    Atoms,
    Canon,
    Elem,
    Mono,
    Poly,
    TooBig,
    Undecided,
    atoms_minus,
    divide_all,
    divisors,
    join,
    stabs_of,
)

# --------------------------------------------------------------------------------------------- the relation


def arith_sub(canon: Canon, a: Elem, b: Elem) -> bool | Undecided:
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
        ds: list[Any]
        if e0 is None:
            ds = [big_d]
        elif big_d is None:
            continue
        elif big_d is e0:
            ds = [None]
        else:
            got = divide_all(canon, big_d, e0)
            if got is UNDECIDED:
                undecided = True
                continue
            assert isinstance(got, list)
            ds = got
        for d in ds:
            if _fits(canon, a, counts, numer, d, c1, atoms1):
                return True
    return UNDECIDED if undecided else False


def _fits(
    canon: Canon,
    a: Elem,
    counts: dict[Elem | None, dict[Mono, int]],
    numer: Poly,
    d: Any,
    c1: int,
    atoms1: Atoms,
) -> bool:
    """Whether some monomial of ``numer`` fixes ``i`` and ``z`` with ``i*a*z/d`` inside ``b`` (see arith_sub)."""
    for (c, atoms), _ in numer:
        if c1 == 0 or c % c1:
            continue
        z = atoms_minus(atoms, atoms1)
        if z is None:
            continue
        i = c // c1
        for zs in _with_shared_stabs(z, atoms1):
            if all(_contains(counts.get(canon.den_mul(e, d)), m, i, zs) for e, m in a.parts):
                return True
    return False


def _with_shared_stabs(z: Atoms, atoms1: Atoms) -> list[Atoms]:
    """Every ``z'`` with ``z' * atoms1 == z * atoms1``: ``z`` with any subset of ``atoms1``'s ``stab`` atoms
    added (they are idempotent), so that ``a``'s other monomials, which may lack them, are scaled right."""
    out = [z]
    for st in stabs_of(atoms1):
        out += [join(x, (st,)) for x in out]
    return out


def _contains(have: dict[Mono, int] | None, poly: Poly, i: int, z: Atoms) -> bool:
    """Whether ``i * poly * z`` is a sub-multiset of ``have`` (``z`` joins each monomial's atoms; two monomials
    may meet in one image when ``z`` adds a ``stab`` one of them lacks, so images are counted together)."""
    if have is None:
        return False
    need: dict[Mono, int] = {}
    for (c, atoms), n in poly:
        key = (i * c, join(atoms, z))
        need[key] = need.get(key, 0) + n
    return all(have.get(m, 0) >= n for m, n in need.items())


def in_family(a: Elem, rest: Elem | None, bases: frozenset[int]) -> bool:
    """Whether ``a ⊑ exp(rest + Σ max(k_j, y_j))`` for some sizes and multiplicities, the ``y_j`` among
    ``bases`` (uids), beyond what :func:`arith_sub` against ``rest`` finds: with ``i = 1``, ``z = 1`` and no
    denominator, ``a``'s summands that are one ``max`` over a base go to the free maxima and the others must be
    among ``rest``'s (every other context makes a ``max`` summand of ``a`` into no summand ``max(k, y)``)."""
    have = None if rest is None else rest.counts()
    found = False
    for d, poly in a.parts:
        left = []
        for m, n in poly:
            c, atoms = m
            if d is None and c == 1 and len(atoms) == 1 and atoms[0].kind == "max":
                if atoms[0].args[0].uid not in bases:
                    return False
                found = True
            else:
                left.append((m, n))
        if left and (have is None or not _contains(have.get(d), tuple(left), 1, ())):
            return False
    return found


Family = tuple[Elem | None, frozenset[int]]


def gateways(canon: Canon, b: Elem) -> list[Elem]:
    """``b`` and everything reachable from it through denominators and atom arguments (see the module doc)."""
    return gateways_and_families(canon, b)[0]


def gateways_and_families(canon: Canon, b: Elem) -> tuple[list[Elem], list[Family]]:
    """:func:`gateways`, and the exponent families of their monomials with ``stab`` atoms: ``(rest, bases)``
    for each ``exp(rest)`` atom of such a monomial and ``(None, bases)`` for the monomial itself, where
    ``bases`` are its ``stab`` atoms' arguments — ``exp(rest + Σ max(k_j, y_j)) = exp(rest) * Π stab(y_j)``
    for any sizes, so each such exponent is a subexpression too (see :func:`in_family`)."""
    seen: dict[int, Elem] = {b.uid: b}
    families: dict[Family, None] = {}
    stack = [b]
    while stack:
        e = stack.pop()
        for d, poly in e.parts:
            nxt: list[Elem] = [] if d is None else [d]
            for (_, atoms), _ in poly:
                stabs = stabs_of(atoms)
                if stabs:
                    bases = frozenset(s.args[0].uid for s in stabs)
                    families[(None, bases)] = None
                    for atom in atoms:
                        if atom.kind == "exp":
                            families[(atom.args[0], bases)] = None
                for atom in atoms:
                    nxt.extend(atom.args)
                    if atom.kind == "max":  # max_r(j, x) ⊑ max_r(k, x) for j | k: max_r(k/j, max_r(j, x))
                        nxt.extend(canon.max_r(j, atom.args[0]) for j in divisors(atom.k) if 1 < j < atom.k)
            for g in nxt:
                if g.uid not in seen:
                    seen[g.uid] = g
                    stack.append(g)
    return list(seen.values()), list(families)


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
        self._families: list[list[Family]] = []
        if use_fast_path:
            try:
                found = [gateways_and_families(self.canon, self.canon.nf(t)) for t in self.targets]
            except TooBig:
                found = []  # a target too big to normalise: everything goes to Z3
            self._gateways = [g for g, _ in found]
            self._families = [f for _, f in found]
        self._fast_ok = bool(self._gateways)
        self._by_term: dict[Term, bool | None] = {}
        self._by_nf: dict[Elem, bool | None] = {}
        self._sub_memo: dict[tuple[Elem, int], bool | Undecided] = {}
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

    def _fast(self, a: Elem) -> bool | Undecided:
        try:
            return self._fast_unguarded(a)
        except TooBig:  # a product formed while matching (a denominator times d) grew too big
            return UNDECIDED

    def _fast_unguarded(self, a: Elem) -> bool | Undecided:
        undecided = False
        for i in range(len(self.targets)):
            r = self._sub(a, i)
            if r is True:
                return True
            undecided |= r is UNDECIDED
        return UNDECIDED if undecided else False

    def _sub(self, a: Elem, target: int) -> bool | Undecided:
        key = (a, target)
        got = self._sub_memo.get(key)
        if got is not None:
            return got
        out: bool | Undecided = False
        for g in self._gateways[target]:
            r = arith_sub(self.canon, a, g)
            if r is True:
                out = True
                break
            if r is UNDECIDED:
                out = UNDECIDED
        if out is not True and any(in_family(a, rest, bases) for rest, bases in self._families[target]):
            out = True
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


__all__ = ["OracleStats", "SubexprOracle", "arith_sub", "gateways", "gateways_and_families", "in_family"]

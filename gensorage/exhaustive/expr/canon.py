"""The canonical model of ``A_eq``: interned normal forms of abstract expressions (:class:`Canon`).

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

The stabiliser laws (see :mod:`.axioms`): ``exp`` of a sum with summands ``max(k, y)`` (``k >= 2``) is
``exp(rest) * stab(y) * ...`` — the summand leaves the ``exp`` as the *stabiliser atom* ``stab(y)`` (no ``exp``
atom at all when nothing else is left), and ``stab`` atoms are idempotent factors (``stab(y)*stab(y) =
stab(y)``): a monomial holds each at most once, so multiplying monomials joins their ``stab`` atoms as a set.

The subexpression oracle (:mod:`.oracle`) decides ``A_sub`` in this model.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
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

    def exp(self, x: Elem) -> Elem:
        """``exp(x)``: each summand of ``x`` that is one ``max(k, y)`` leaves as ``stab(y)`` (see the module doc)."""
        plain: Groups = {}
        stabs: dict[int, Atom] = {}
        for d, poly in x.parts:
            for m, n in poly:
                c, atoms = m
                if d is None and c == 1 and len(atoms) == 1 and atoms[0].kind == "max":
                    st = self.atom("stab", atoms[0].args)
                    stabs[st.uid] = st
                else:
                    _put(plain, d, m, n)
        if not stabs:
            return self.of_atom(self.atom("exp", (x,)))
        atoms = tuple(stabs[u] for u in sorted(stabs))
        if plain:
            atoms = join((self.atom("exp", (self.elem(plain),)),), atoms)
        return self.elem({None: {(1, atoms): 1}})

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
            case "exp":
                return self.exp(a[0])
            case "sqrt":
                return self.of_atom(self.atom("sqrt", (a[0],)))
            case "fn":
                return self.of_atom(self.atom("fn", (a[0],), 0, t.name))
            case _:
                raise ValueError(f"unknown term operator {t.op!r}")

    # ------------------------------------------------------------------ exact division

    def divide(self, num: Elem, den: Elem) -> Elem | None | Undecided:
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


def divide_all(canon: Canon, num: Elem, den: Elem) -> list[Elem] | Undecided:
    """Every ``q`` with ``den * q == num`` (:meth:`Canon.divide`, which finds the one there is when no ``stab``
    atom is involved). With ``stab`` atoms (idempotent) a quotient is not unique: for one monomial over one
    monomial they are the remaining atoms with any subset of the divisor's ``stab`` atoms; one monomial over
    monomials that differ once their ``stab`` atoms are dropped has none; other shapes with ``stab`` atoms are
    undecided."""
    got = canon.divide(num, den)  # undecided where a leading monomial of a divisor has stab atoms
    if not isinstance(got, Undecided):
        return [] if got is None else [got]
    if (
        len(num.parts) != 1
        or len(den.parts) != 1
        or num.parts[0][0] is not None
        or den.parts[0][0] is not None
    ):
        return UNDECIDED
    (((c, atoms), n),) = num.parts[0][1] if len(num.parts[0][1]) == 1 else (((0, ()), 0),)
    (((lc, latoms), ln),) = den.parts[0][1] if len(den.parts[0][1]) == 1 else (((0, ()), 0),)
    if n and not ln and len({_unstabbed(m) for m, _ in den.parts[0][1]}) > 1:
        # One monomial M over several: nothing cancels, so every product m*t of a monomial of den and one of q
        # is M, and without stab atoms (the free monoid, where products cancel) every m would be the same.
        return []
    if not n or not ln:
        return UNDECIDED
    rest = atoms_minus(atoms, latoms)
    if rest is None or c % lc or n % ln:
        return []
    outs: list[Atoms] = [rest]
    for st in stabs_of(latoms):
        outs += [join(x, (st,)) for x in outs]
    return [canon.elem({None: {(c // lc, t): n // ln}}) for t in outs if t]


def _unstabbed(m: Mono) -> Mono:
    """``m`` with its ``stab`` atoms set to 1 (a homomorphism: ``stab * stab = stab`` maps to ``1 * 1 = 1``)."""
    return (m[0], tuple(a for a in m[1] if a.kind != "stab"))


class Undecided:
    def __repr__(self) -> str:
        return "UNDECIDED"


UNDECIDED = Undecided()


def mono_key(m: Mono) -> tuple[int, tuple[int, ...], int]:
    """A total monomial order compatible with multiplication (degree, then reverse-lex atoms, then coefficient)."""
    return (len(m[1]), tuple(a.uid for a in m[1]), m[0])


def _item_key(item: tuple[Mono, int]) -> tuple[int, tuple[int, ...], int]:
    return mono_key(item[0])


def mono_mul(m: Mono, n: Mono) -> Mono:
    return (m[0] * n[0], join(m[1], n[1]))


def join(a: Atoms, b: Atoms) -> Atoms:
    """The atoms of a product: a multiset union, except that a ``stab`` atom occurs at most once (idempotent)."""
    out = sorted(a + b, key=uid_of)
    if any(x.kind == "stab" for x in a) and any(x.kind == "stab" for x in b):
        out = [x for i, x in enumerate(out) if not (x.kind == "stab" and i and out[i - 1] is x)]
    return tuple(out)


def stabs_of(atoms: Atoms) -> Atoms:
    """The ``stab`` atoms among ``atoms``."""
    return tuple(a for a in atoms if a.kind == "stab")


def uid_of(a: Atom) -> int:
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


def poly_divide(num: Poly, den: Poly, max_steps: int = 10_000) -> dict[Mono, int] | None | Undecided:
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
        if stabs_of(latoms):
            return UNDECIDED  # t * lead == top for several t (stab atoms are idempotent): see divide_all
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
    if a.kind == "stab":
        return f"stab({inner})"
    return f"{a.name or a.kind}({inner})"


__all__ = [
    "MAX_MONOMIALS",
    "UNDECIDED",
    "Atom",
    "Atoms",
    "Canon",
    "Elem",
    "Mono",
    "Poly",
    "TooBig",
    "Undecided",
    "atoms_minus",
    "divide_all",
    "divisors",
    "mono_key",
    "mono_mul",
    "poly_divide",
    "show",
    "stabs_of",
    "join",
    "uid_of",
]

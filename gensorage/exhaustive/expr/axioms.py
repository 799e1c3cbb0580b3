"""Table 2 of Mirage as Z3 axioms: ``A_eq`` (equivalence) and ``A_sub`` (abstract subexpression).

Abstract expressions are terms of an uninterpreted sort ``P``; reduction sizes are Z3 integers, so
``sum(i, sum(j, x)) = sum(i*j, x)`` is the paper's (non-linear) axiom verbatim, quantified over all integers.
``subexpr(a, b)`` is entailed iff ``axioms ∧ ¬subexpr(a, b)`` is unsatisfiable.

Beyond Table 2 (for the ops Mirage's first paper does not have; see
:mod:`gensorage.exhaustive.expr.abstract_expr`):

- ``sqrt`` and each function ``fn_<name>`` (relu, silu, gelu, tanh, log, clamp): uninterpreted, ``subexpr(x, f(x))``, no
  equations (they commute with nothing);
- ``max(k, x)`` (max-reduction / max accumulator): uninterpreted, ``subexpr(x, max(i, x))``, with the size laws
  of ``sum`` (``x = max(1, x)``, ``max(i, max(j, x)) = max(i*j, x)``) so split max-reductions agree with whole ones;
- ``cat(x, y)`` (concatenation): commutative, associative, idempotent; ``subexpr(x, cat(x, y))``, and
  ``subexpr(x, z) ∧ subexpr(y, z) → subexpr(cat(x, y), z)`` so a concatenation of useful parts is useful;
- the stabiliser laws, for a max-subtracting softmax and its rescales (FlashDecoding's ``exp(m_i − M)``):
  ``exp(add(x, max(i, y))) = mul(exp(x), stab(y))`` and ``exp(max(i, y)) = stab(y)`` for ``i >= 2``, and
  ``mul(stab(y), stab(y)) = stab(y)``. ``stab(y)`` is the abstraction of ``exp(±max(k, y))``: a positive
  per-row factor that a maximum over ``y`` sets and that cancels between a softmax's numerator and denominator.
  Read over the reals with ``stab = 1``, the three are the law ``exp(a + b) = exp(a)·exp(b)`` (``exp(a − b) =
  exp(a)/exp(b)``: signs are not part of the abstraction) followed by dropping that factor — what Table 1 does
  with ``scale``'s constants — so, as for ``scale``, they hold in the abstraction's real reading and only
  identify more terms, i.e. keep more prefixes. Without them a split's partial ``Σ exp(S − m_i)·V`` (``m_i`` the
  split's maximum) and the rescale ``exp(m_i − M)`` are no subexpressions of ``exp(S − M)``: the law alone does
  not help, since ``exp(S − m_i)·exp(m_i − M) = exp(S − M)`` needs ``m_i − m_i = 0``, and any cancellation
  axiom makes every term a subexpression of every other (``x ⊑ add(x, neg(x)) ⊑ add(add(x, neg(x)), y) = y``).
  The guard ``i >= 2`` matters: ``max(1, y) = y``, so without it the first law would split every sum in an
  ``exp``. Z3 uses them only left to right (patterns on the left-hand sides, which are larger), so they do not
  loop.

Z3 proves entailed queries quickly but cannot refute with these quantified axioms (it runs to its limit and says
``unknown``); :mod:`gensorage.exhaustive.expr.oracle` decides queries exactly in the canonical model and uses this
encoding only as a fallback and as the reference its tests compare with.
"""

from __future__ import annotations

from collections.abc import Sequence

import z3

from gensorage.exhaustive.expr.abstract_expr import ACTIVATION_NAMES, Term

#: Z3 resource units per millisecond of time limit (measured: about 1.5 million units per second here). Z3 does
#: not check its timer while instantiating quantifiers, so a resource limit is what actually bounds a query.
RLIMIT_PER_MS = 1500


class Theory:
    """Sort, function symbols and axioms of Table 2 (plus the extensions above) in one Z3 context."""

    def __init__(self, ctx: z3.Context | None = None) -> None:
        self.ctx = ctx if ctx is not None else z3.Context()
        c = self.ctx
        self.P = z3.DeclareSort("P", c)
        P, Int = self.P, z3.IntSort(c)
        self.add = z3.Function("add", P, P, P)
        self.mul = z3.Function("mul", P, P, P)
        self.div = z3.Function("div", P, P, P)
        self.exp = z3.Function("exp", P, P)
        self.sqrt = z3.Function("sqrt", P, P)
        self.sum = z3.Function("sum", Int, P, P)
        self.max = z3.Function("max", Int, P, P)
        self.cat = z3.Function("cat", P, P, P)
        self.stab = z3.Function("stab", P, P)
        self.subexpr = z3.Function("subexpr", P, P, z3.BoolSort(c))
        self._fns: dict[str, z3.FuncDeclRef] = {}
        self._pending: list[
            z3.BoolRef
        ] = []  # axioms of functions declared after the solver took the base set
        self._cache: dict[Term, z3.ExprRef] = {}
        for name in ACTIVATION_NAMES:
            self.fn(name)
        self._pending.clear()

    def fn(self, name: str) -> z3.FuncDeclRef:
        """The uninterpreted unary function ``fn_<name>`` (declared, with its ``A_sub`` axiom, on first use)."""
        f = self._fns.get(name)
        if f is None:
            f = z3.Function(f"fn_{name}", self.P, self.P)
            self._fns[name] = f
            self._pending.append(self._sub_axiom_unary(f))
        return f

    def _sub_axiom_unary(self, f: z3.FuncDeclRef) -> z3.BoolRef:
        x = z3.Const("x", self.P)
        return z3.ForAll([x], self.subexpr(x, f(x)))

    def a_eq(self) -> list[z3.BoolRef]:
        """Table 2's equivalence axioms, then the ``max``, ``cat`` and stabiliser equations."""
        x, y, z = z3.Consts("x y z", self.P)
        i, j = z3.Ints("i j", self.ctx)
        add, mul, div, sm, mx, cat = self.add, self.mul, self.div, self.sum, self.max, self.cat
        F = z3.ForAll
        return [
            F([x, y], add(x, y) == add(y, x)),
            F([x, y], mul(x, y) == mul(y, x)),
            F([x, y, z], add(x, add(y, z)) == add(add(x, y), z)),
            F([x, y, z], mul(x, mul(y, z)) == mul(mul(x, y), z)),
            F([x, y, z], add(mul(x, z), mul(y, z)) == mul(add(x, y), z)),
            F([x, y, z], add(div(x, z), div(y, z)) == div(add(x, y), z)),
            F([x, y, z], mul(x, div(y, z)) == div(mul(x, y), z)),
            F([x, y, z], div(div(x, y), z) == div(x, mul(y, z))),
            F([x], x == sm(1, x)),
            F([x, i, j], sm(i, sm(j, x)) == sm(i * j, x)),
            F([x, y, i], sm(i, add(x, y)) == add(sm(i, x), sm(i, y))),
            F([x, y, i], sm(i, mul(x, y)) == mul(sm(i, x), y)),
            F([x, y, i], sm(i, div(x, y)) == div(sm(i, x), y)),
            # extensions
            F([x], x == mx(1, x)),
            F([x, i, j], mx(i, mx(j, x)) == mx(i * j, x)),
            F([x, y], cat(x, y) == cat(y, x)),
            F([x, y, z], cat(x, cat(y, z)) == cat(cat(x, y), z)),
            F([x], cat(x, x) == x),
            # the stabiliser laws (guarded: max(1, y) = y)
            F(
                [x, y, i],
                z3.Implies(i >= 2, self.exp(add(x, mx(i, y))) == mul(self.exp(x), self.stab(y))),
                patterns=[self.exp(add(x, mx(i, y)))],
            ),
            F([y, i], z3.Implies(i >= 2, self.exp(mx(i, y)) == self.stab(y)), patterns=[self.exp(mx(i, y))]),
            F(
                [y],
                mul(self.stab(y), self.stab(y)) == self.stab(y),
                patterns=[mul(self.stab(y), self.stab(y))],
            ),
        ]

    def a_sub(self) -> list[z3.BoolRef]:
        """Table 2's subexpression axioms, then those of ``sqrt``, the activations, ``max`` and ``cat``."""
        x, y, z = z3.Consts("x y z", self.P)
        i = z3.Int("i", self.ctx)
        sub = self.subexpr
        F = z3.ForAll
        return [
            F([x, y], sub(x, self.add(x, y))),
            F([x, y], sub(x, self.mul(x, y))),
            F([x, y], sub(x, self.div(x, y))),
            F([x, y], sub(y, self.div(x, y))),
            F([x], sub(x, self.exp(x))),
            F([x, i], sub(x, self.sum(i, x))),
            F([x], sub(x, x)),
            F([x, y, z], z3.Implies(z3.And(sub(x, y), sub(y, z)), sub(x, z))),
            # extensions
            F([x], sub(x, self.sqrt(x))),
            *(self._sub_axiom_unary(f) for f in self._fns.values()),
            F([x, i], sub(x, self.max(i, x))),
            F([x, y], sub(x, self.cat(x, y))),
            F([x, y, z], z3.Implies(z3.And(sub(x, z), sub(y, z)), sub(self.cat(x, y), z))),
            # consequences of sub(x, exp(x)) and the stabiliser laws, stated for Z3, whose instantiation
            # never builds the exp(...) term in between
            F([y, i], z3.Implies(i >= 2, sub(self.max(i, y), self.stab(y))), patterns=[self.max(i, y)]),
            F(
                [x, y, i],
                z3.Implies(i >= 2, sub(self.add(x, self.max(i, y)), self.mul(self.exp(x), self.stab(y)))),
                patterns=[self.add(x, self.max(i, y))],
            ),
        ]

    def take_pending(self) -> list[z3.BoolRef]:
        """Axioms of functions first met since the last call (to add to a solver's base level)."""
        out, self._pending = self._pending, []
        return out

    def term(self, t: Term) -> z3.ExprRef:
        """``t`` as a Z3 term (variables become constants ``v_<name>``; n-ary ``cat`` nests to the right)."""
        got = self._cache.get(t)
        if got is not None:
            return got
        for s in t.subterms():
            if s not in self._cache:
                self._cache[s] = self._node(s)
        return self._cache[t]

    def _node(self, t: Term) -> z3.ExprRef:
        a = [self._cache[x] for x in t.args]
        match t.op:
            case "var":
                return z3.Const(f"v_{t.name}", self.P)
            case "add" | "mul" | "div":
                return getattr(self, t.op)(a[0], a[1])  # type: ignore[no-any-return]
            case "exp" | "sqrt":
                return getattr(self, t.op)(a[0])  # type: ignore[no-any-return]
            case "sum" | "max":
                return getattr(self, t.op)(z3.IntVal(t.k, self.ctx), a[0])  # type: ignore[no-any-return]
            case "fn":
                return self.fn(t.name)(a[0])
            case "cat":
                out = a[-1]
                for p in reversed(a[:-1]):
                    out = self.cat(p, out)
                return out
            case _:
                raise ValueError(f"unknown term operator {t.op!r}")


class Z3Subexpr:
    """Entailment of ``subexpr(e, t)`` for some target ``t`` by Z3 (one solver, axioms asserted once).

    Parameters
    ----------
    targets : sequence of Term
        The right-hand sides; a query asks for ``subexpr(e, t1) ∨ subexpr(e, t2) ∨ ...``.
    timeout_ms : int
        Time limit per query; a resource limit of ``RLIMIT_PER_MS * timeout_ms`` is set as well.
    """

    #: Recreate the solver after this many unknowns: state kept across push/pop slows later queries.
    RESET_AFTER_UNKNOWN = 32

    def __init__(self, targets: Sequence[Term], timeout_ms: int = 2000) -> None:
        if not targets:
            raise ValueError("Z3Subexpr needs at least one target expression")
        self.targets = tuple(targets)
        self.timeout_ms = int(timeout_ms)
        self.theory = Theory()
        self._target_z3 = [self.theory.term(t) for t in self.targets]
        self._solver = self._new_solver()
        self._unknowns = 0

    def _new_solver(self) -> z3.Solver:
        th = self.theory
        s = z3.Solver(ctx=th.ctx)
        s.set("timeout", self.timeout_ms)
        s.set("rlimit", RLIMIT_PER_MS * self.timeout_ms)
        s.add(th.a_eq())
        s.add(th.a_sub())
        th.take_pending()  # a_sub() already covers every function declared so far
        return s

    def entails(self, e: Term) -> bool | None:
        """True (entailed: unsat), False (a countermodel: sat) or None (unknown: time/resource limit)."""
        th = self.theory
        q = th.term(e)
        pending = th.take_pending()
        if pending:
            self._solver.add(pending)
        s = self._solver
        s.push()
        s.add(z3.Not(z3.Or([th.subexpr(q, t) for t in self._target_z3])))
        r = s.check()
        s.pop()
        if r == z3.unsat:
            return True
        if r == z3.sat:
            return False
        self._unknowns += 1
        if self._unknowns % self.RESET_AFTER_UNKNOWN == 0:
            self._solver = self._new_solver()
        return None


__all__ = ["RLIMIT_PER_MS", "Theory", "Z3Subexpr"]

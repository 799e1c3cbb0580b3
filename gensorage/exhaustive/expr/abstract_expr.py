"""Abstract expressions (Mirage §4.3, Table 1): hash-consed first-order terms over uninterpreted functions.

An abstract expression abstracts the function an edge of a program or µGraph computes by forgetting which
element of an input tensor is read: ``matmul(X, Y)`` becomes ``sum(k, mul(X, Y))``. The search prunes every prefix
whose expression is not a subexpression of the program's (see :mod:`gensorage.exhaustive.expr.oracle`).

Terms are *interned*: building the same term twice returns the identical object, so ``==`` and ``hash`` are
identity operations and a term can key a memo for free. Constructors apply only rewrites that are equalities of
Table 2's ``A_eq`` (``sum(1, x) = x``, ``sum(i, sum(j, x)) = sum(i*j, x)``, argument order of ``add`` and
``mul``), so they never change an oracle answer; they only make equal terms meet in the cache more often.

Table 1 as implemented by :class:`gensorage.exhaustive.expr.expr_arith.ExprArith`:

- input ``X``: ``var("X")``; ``reshape``, ``repeat``, ``transpose``, iterator tiles (``slice``): ``E(X)`` (a
  layout op moves elements without changing any one element's expression);
- ``add``: ``add``; ``sub``: ``add`` too (signs are not part of the abstraction, like ``scale``);
- ``mul``/``div``/``exp``/``sqrt``: the same-named term; ``relu``/``silu``/``gelu``/``tanh``/``log``:
  ``fn(name, E)``; ``clamp``: ``fn("clamp", E)`` whatever its bounds (dropped, like ``scale``'s constant);
- ``matmul`` with inner size ``k``: ``sum(k, mul(E(X), E(Y)))``; ``Sum(d, k)`` / a reduction of size ``k``:
  ``sum(k, E)``; a reduction by max: ``max_r(k, E)``;
- ``scale``: ``E(X)``. Mirage's Table 1 has no scalar op. Dropping the constant keeps Theorem 1's prefix
  property trivially (``E(X)`` is a subexpression of itself) and loses no µGraph: ``A_eq`` need not be sound,
  so identifying ``c*X`` with ``X`` can only keep more prefixes, never prune a useful one. A ``const(c)`` factor
  would instead split programs that place the same constant differently (``scale`` before vs after a matmul
  needs commuting constants, ``1/sqrt(d)`` folded into an ``exp`` argument needs arithmetic on constants);
- ``add_scalar`` (``x + c``, e.g. an epsilon): ``E(X)`` for the same reason (constants are dropped; the
  verifier, not the abstraction, tells ``x + c`` from ``x``);
- ``max`` over a dim of size ``k`` (the program op, a block op or a max accumulator): ``max_r(k, E)``;
- for-loop accumulators over ``r`` iterations: ``sum(r, E)`` (sum), ``max_r(r, E)`` (max), ``E`` (fmap
  concatenation); grid blocks' tiles of one term concatenate to that term;
- ``concat``: ``cat(E(X), E(Y), ...)`` — see below.

Concatenation (LoRA)
--------------------
``cat`` is a set-like term (flattened, sorted, duplicates dropped, one part is that part). Its axioms
(:mod:`gensorage.exhaustive.expr.axioms`) make every part a subexpression of the ``cat`` and — the one extra Horn
rule — a ``cat`` a subexpression of anything each of its parts is a subexpression of. The arithmetic keeps the
*layout* of a concatenation beside the term (which parts occupy which index range of which dim), and ops that
act independently along that dim are applied piece by piece. In particular a matmul whose inner dim is a
concatenation of sizes ``k1 + k2`` is ``add(sum(k1, mul(..)), sum(k2, mul(..)))``, so
``matmul(concat(X, X A), concat(W, B))`` has exactly the expression of ``X W + (X A) B``. Theorem 1's prefix
property still holds: each part of a ``cat`` is a subexpression of the op's output, so by the extra rule the
``cat`` itself is too.
"""

from __future__ import annotations

import builtins
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gensorage.program import Program
    from gensorage.ugraph.ir import KernelGraph

#: Term operators. ``k`` is the reduction size of ``sum``/``max``; ``name`` the variable or function name.
OPS = ("var", "add", "mul", "div", "exp", "sqrt", "sum", "max", "fn", "cat")
ACTIVATION_NAMES = ("relu", "silu", "gelu", "tanh", "log", "clamp")

_uids = itertools.count(1)
# The intern table lives for the process: terms are small and the search's memo keeps them alive anyway.
_TABLE: dict[tuple[str, tuple[Term, ...], int, str], Term] = {}


@dataclass(frozen=True, slots=True, eq=False)
class Term:
    """One interned abstract-expression node; compare and hash by identity (equal terms are the same object).

    Build terms with the module's constructors (:func:`var`, :func:`add`, ...), never directly.
    """

    op: str
    args: tuple[Term, ...]
    k: int
    name: str
    uid: int

    def __reduce__(self) -> tuple[Any, ...]:
        # Unpickling re-interns, so identity equality survives a trip through another process.
        return (_make, (self.op, self.args, self.k, self.name))

    def __str__(self) -> str:
        if self.op == "var":
            return self.name
        inner = ", ".join(str(a) for a in self.args)
        if self.op in ("sum", "max"):
            return f"{self.op}({self.k}, {inner})"
        if self.op == "fn":
            return f"{self.name}({inner})"
        return f"{self.op}({inner})"

    def __repr__(self) -> str:
        return f"Term<{self}>"

    def subterms(self) -> Iterator[Term]:
        """Every distinct subterm, this one included (depth-first, children before parents)."""
        seen: set[int] = set()
        stack: list[tuple[Term, bool]] = [(self, False)]
        while stack:
            t, done = stack.pop()
            if done:
                yield t
                continue
            if t.uid in seen:
                continue
            seen.add(t.uid)
            stack.append((t, True))
            stack.extend((a, False) for a in reversed(t.args))

    @property
    def size(self) -> int:
        """Number of distinct subterms (a DAG size)."""
        return builtins.sum(1 for _ in self.subterms())


def _make(op: str, args: tuple[Term, ...], k: int = 0, name: str = "") -> Term:
    key = (op, args, k, name)
    t = _TABLE.get(key)
    if t is None:
        t = Term(op, args, k, name, next(_uids))
        _TABLE[key] = t
    return t


def _ordered(a: Term, b: Term) -> tuple[Term, Term]:
    return (a, b) if a.uid <= b.uid else (b, a)


def var(name: str) -> Term:
    """The expression of program input ``name``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a variable needs a non-empty name, got {name!r}")
    return _make("var", (), 0, name)


def add(a: Term, b: Term) -> Term:
    return _make("add", _ordered(a, b))


def mul(a: Term, b: Term) -> Term:
    return _make("mul", _ordered(a, b))


def div(a: Term, b: Term) -> Term:
    return _make("div", (a, b))


def exp(a: Term) -> Term:
    return _make("exp", (a,))


def sqrt(a: Term) -> Term:
    return _make("sqrt", (a,))


def fn(name: str, a: Term) -> Term:
    """An uninterpreted unary function (the non-Lax relu, silu, gelu, tanh, log, clamp)."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a function name must be an identifier, got {name!r}")
    return _make("fn", (a,), 0, name)


def _reduction(op: str, k: int, e: Term) -> Term:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"{op}: reduction size must be a positive integer, got {k!r}")
    if k == 1:
        return e  # x = sum(1, x)
    if e.op == op:
        return _make(op, e.args, k * e.k)  # sum(i, sum(j, x)) = sum(i*j, x)
    return _make(op, (e,), k)


def sum(k: int, e: Term) -> Term:  # shadows the builtin on purpose: the paper names it sum
    """``sum(k, e)``: a reduction of ``k`` elements."""
    return _reduction("sum", k, e)


def max_r(k: int, e: Term) -> Term:
    """``max(k, e)``: a max-reduction of ``k`` elements (uninterpreted; same size laws as ``sum``)."""
    return _reduction("max", k, e)


def cat(*parts: Term) -> Term:
    """The expression of a concatenation: a set of parts (flattened, deduplicated, one part is that part)."""
    flat: dict[int, Term] = {}
    for p in parts:
        for q in p.args if p.op == "cat" else (p,):
            flat[q.uid] = q
    if not flat:
        raise ValueError("cat needs at least one part")
    if len(flat) == 1:
        return next(iter(flat.values()))
    return _make("cat", tuple(flat[u] for u in sorted(flat)))


def add_all(terms: Sequence[Term]) -> Term:
    """``add`` folded over ``terms`` (left to right); one term is itself."""
    if not terms:
        raise ValueError("add_all needs at least one term")
    out = terms[0]
    for t in terms[1:]:
        out = add(out, t)
    return out


def expr_of(obj: Program | KernelGraph) -> list[Term]:
    """The abstract expression of each output of a program or µGraph (inputs are ``var(name)``).

    A µGraph is evaluated literally by :func:`gensorage.ugraph.evaluate.evaluate` (without re-validating it).
    """
    from gensorage.exhaustive.expr.expr_arith import ExprArith, ExprValue
    from gensorage.program import Program

    arith = ExprArith()
    if isinstance(obj, Program):
        inputs = [ExprValue(t.shape, var(t.name)) for t in obj.inputs]
        return [v.term for v in obj.evaluate(arith, inputs)]
    from gensorage.ugraph.evaluate import evaluate
    from gensorage.ugraph.ir import KernelGraph

    if not isinstance(obj, KernelGraph):
        raise TypeError(f"expr_of takes a Program or a KernelGraph, got {type(obj).__name__}")
    values = [ExprValue(s.shape, var(s.name)) for s in obj.inputs]
    return [v.term for v in evaluate(obj, arith, values, check=False)]


__all__ = [
    "ACTIVATION_NAMES",
    "OPS",
    "Term",
    "add",
    "add_all",
    "cat",
    "div",
    "exp",
    "expr_of",
    "fn",
    "max_r",
    "mul",
    "sqrt",
    "sum",
    "var",
]

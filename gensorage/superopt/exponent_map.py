"""Search shapes around pinned sizes: a map of power-of-two exponents that keeps the products reshapes need.

:func:`~gensorage.superopt.search_shapes.size_choice` shrinks every exponent ``e`` to about ``e / 3``. Where a
slice pins a size (RoPE's head_dim of 128, and its half), that rule cannot keep the products of sizes that a
reshape splits or merges: LLaMA-3-8B's ``4096 = 32 · 128`` heads × head_dim, with 128 kept, needs
``g(12) = g(5) + 7``, which ``ceil(12 / 3) = 4`` is not, and the program kept all its real sizes (a 101-node
decoder layer whose check then cannot bound its error). Here the exponent map ``g`` is instead *solved for*:

* every reshape (and ``repeat``) relates the exponents of the sizes it splits or merges: for each group of
  input dims whose product equals a group of output dims, ``Σ g(e_in) = Σ g(e_out)`` (odd parts are kept, so
  their products match already);
* a pinned size's exponent keeps its value, every other exponent ``e ≥ 1`` gets ``1 ≤ g(e) ≤ e``;
* the sizes keep their order (:func:`~gensorage.superopt.search_shapes.keeps_order`: distinct stay distinct,
  a size dividing another still divides it).

A depth-first walk over the free exponents (smallest first, each from 1 upward; an equation with one unknown
left fixes it) returns the first map that satisfies all three, so the free exponents are as small as the
constraints allow; the walk stops after :data:`MAX_STEPS` assignments. Relations the walk does not know (other
size-valued attributes) are caught by the caller, which instantiates the program at the map and compares
structure keys.
"""

from __future__ import annotations

from collections.abc import Callable

from gensorage.opset import Op, reshape_groups
from gensorage.program import Program

#: Assignments the walk tries before giving up (a decoder layer needs a few dozen).
MAX_STEPS = 20_000

Equation = tuple[dict[int, int], int]  # coefficients of g(e) per exponent e, and the constant the sum equals


def product_relations(p: Program) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Pairs (input sizes, output sizes) whose products are equal, from ``p``'s reshapes and repeats (groups of
    dims as a row-major reshape pairs them; sizes 1 dropped)."""
    out: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    for n in p.nodes:
        if n.op is Op.RESHAPE:
            old = p.nodes[n.inputs[0]].shape
            for ins, outs in reshape_groups(old, n.shape) or []:
                out.append((tuple(old[i] for i in ins), tuple(n.shape[j] for j in outs)))
        elif n.op is Op.REPEAT:
            attrs = dict(n.attrs)
            dim, times = int(attrs["dim"]), int(attrs["times"])
            src = p.nodes[n.inputs[0]].shape[dim]
            out.append((tuple(v for v in (src, times) if v > 1), (n.shape[dim],)))
    return [(a, b) for a, b in out if len(a) + len(b) > 2]


def solve_exponents(
    values: set[int],
    pinned: set[int],
    relations: list[tuple[tuple[int, ...], tuple[int, ...]]],
    keeps_order: Callable[[dict[int, int]], bool],
) -> dict[int, int] | None:
    """The search size of each of ``values`` (see the module docstring), or None when no map is found."""
    fixed = {two_adic(v): two_adic(v) for v in pinned} | {0: 0}
    free = sorted({two_adic(v) for v in values} - fixed.keys())
    equations = [_equation(ins, outs) for ins, outs in relations]
    steps = [0]

    def sizes(g: dict[int, int]) -> dict[int, int]:
        return {
            v: v if v in pinned else (v >> two_adic(v)) << g[two_adic(v)] for v in values if two_adic(v) in g
        }

    def consistent(g: dict[int, int]) -> bool:
        for coef, const in equations:
            if all(e in g for e in coef) and sum(c * g[e] for e, c in coef.items()) != const:
                return False
        return keeps_order(sizes(g))

    def propagate(g: dict[int, int]) -> dict[int, int] | None:
        g = dict(g)
        changed = True
        while changed:
            changed = False
            for coef, const in equations:
                unknown = [e for e in coef if e not in g]
                if len(unknown) != 1:
                    continue
                (e,) = unknown
                rest = const - sum(c * g[x] for x, c in coef.items() if x != e)
                if rest % coef[e] or not 1 <= rest // coef[e] <= e:
                    return None
                g[e] = rest // coef[e]
                changed = True
        return g if consistent(g) else None

    def walk(g: dict[int, int]) -> dict[int, int] | None:
        todo = [e for e in free if e not in g]
        if not todo:
            return g
        e = todo[0]
        for v in range(1, e + 1):
            steps[0] += 1
            if steps[0] > MAX_STEPS:
                return None
            nxt = propagate({**g, e: v})
            if nxt is not None and (found := walk(nxt)) is not None:
                return found
        return None

    start = propagate(fixed)
    found = walk(start) if start is not None else None
    return None if found is None else sizes(found)


def _equation(ins: tuple[int, ...], outs: tuple[int, ...]) -> Equation:
    coef: dict[int, int] = {}
    for v, sign in [(v, 1) for v in ins] + [(v, -1) for v in outs]:
        e = two_adic(v)
        if e:
            coef[e] = coef.get(e, 0) + sign
    return {e: c for e, c in coef.items() if c}, 0


def two_adic(v: int) -> int:
    """The exponent of 2 in ``v`` (``v`` > 0)."""
    return (v & -v).bit_length() - 1


__all__ = ["MAX_STEPS", "product_relations", "solve_exponents", "two_adic"]

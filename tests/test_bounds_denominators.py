"""The bounds' distinct denominators along an axis (gensorage.verify.bounds, docs/verification.md "Denominators
along an axis"): the degree bounds against the true degrees of the reduced rational functions, computed by
sympy on the same expressions."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import sympy

from gensorage.program import Program, Tensor
from gensorage.verify.bounds import BoundsArith


def bounds(shapes: list[tuple[int, ...]], body: Callable[..., Tensor]) -> tuple[int, int, tuple[int, ...]]:
    p = Program()
    xs = [p.input(f"x{i}", s, "float32") for i, s in enumerate(shapes)]
    p.output(body(p, *xs))
    arith = BoundsArith(uninterpreted=True)
    (out,) = p.evaluate(arith, [arith.variable(t.shape) for t in p.inputs])
    return out.bound.dn, out.bound.dd, out.distinct


def symbols(name: str, shape: tuple[int, ...]) -> np.ndarray:
    flat = sympy.symbols(f"{name}0:{int(np.prod(shape))}")
    return np.array(flat, dtype=object).reshape(shape)


def degrees(e: sympy.Expr) -> tuple[int, int]:
    """Total degrees of the reduced numerator and denominator of ``e``."""
    num, den = sympy.fraction(sympy.cancel(sympy.together(e)))
    gens = sorted(e.free_symbols, key=str)
    return sympy.Poly(num, *gens).total_degree(), sympy.Poly(den, *gens).total_degree()


H, D, K = 3, 2, 2


def test_heads_merged_then_projected_has_one_denominator_per_head() -> None:
    """``(X / S)`` with S one value per head, heads × head_dim merged, then a projection: the common denominator
    is the product of the heads' S (degree H), not of all H·D terms' (the bound before counted H·D)."""
    got = bounds(
        [(H, D), (H, 1), (H * D, K)],
        lambda p, x, s, w: p.matmul(p.reshape(p.div(x, s), (1, H * D)), w),
    )
    x, s, w = symbols("x", (H, D)), symbols("s", (H, 1)), symbols("w", (H * D, K))
    y = (x / s).reshape(1, H * D) @ w
    want = degrees(y[0, 0])
    assert want == (H + 1, H)
    assert got[:2] == want  # sound and tight here
    assert got[2] == (1, 1)  # the projection's denominator does not vary along its output dim


@pytest.mark.parametrize("case", ["per_element", "concat", "transposed"])
def test_denominators_that_vary_along_the_sum_are_all_counted(case: str) -> None:
    """Sums along an axis whose denominators do vary: the bound is at least the true degree."""
    if case == "per_element":  # Σ_j x_j / t_j: every term its own denominator
        got = bounds([(1, D + 2), (1, D + 2)], lambda p, x, t: p.sum(p.div(x, t), dim=1))
        x, t = symbols("x", (1, D + 2)), symbols("t", (1, D + 2))
        want = degrees(sum(x[0, j] / t[0, j] for j in range(D + 2)))
    elif case == "concat":  # [x / a, x / b] summed along the concatenated axis: two denominators
        got = bounds(
            [(1, D), (1, 1), (1, 1)],
            lambda p, x, a, b: p.sum(p.concat([p.div(x, a), p.div(x, b)], dim=1), dim=1),
        )
        x, a, b = symbols("x", (1, D)), symbols("a", (1, 1)), symbols("b", (1, 1))
        want = degrees(sum(x[0, j] / a[0, 0] + x[0, j] / b[0, 0] for j in range(D)))
    else:  # per-row denominators moved onto the summed axis by a transpose
        got = bounds([(H, D), (H, 1)], lambda p, x, s: p.sum(p.transpose(p.div(x, s), 0, 1), dim=1))
        x, s = symbols("x", (H, D)), symbols("s", (H, 1))
        want = degrees(sum(x[i, 0] / s[i, 0] for i in range(H)))
    assert got[0] >= want[0] and got[1] >= want[1], (got, want)
    assert got[1] == want[1]  # the denominators really are distinct: the bound counts each once

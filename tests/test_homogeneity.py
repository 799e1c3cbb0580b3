"""Additive constants (:mod:`gensorage.exhaustive.rules.homogeneity`, :mod:`~gensorage.exhaustive.rules.shift_places`):
which programs are shown not to be homogeneous, where an add_scalar may go, where the rules apply, and that they
prune no candidate."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from search_walk import candidates_and_states

from gensorage.exhaustive import SearchSpec
from gensorage.exhaustive.expr import abstract_expr as ae
from gensorage.exhaustive.expr.canon import Canon
from gensorage.exhaustive.rules import ruleset
from gensorage.exhaustive.rules.homogeneity import Homogeneity, inhomogeneous
from gensorage.exhaustive.rules.shift_places import ShiftPlaces, core
from gensorage.exhaustive.walk import SearchContext
from gensorage.program import Program, Tensor, load_config


def l2(eps: float, shape: tuple[int, int] = (2, 4)) -> Program:
    """Rows divided by ``sqrt(Σx² + eps)``: five operators."""
    p = Program(name="l2_eps")
    x = p.input("X", shape)
    p.output(p.div(x, p.sqrt(p.add_scalar(p.sum(p.mul(x, x), 1, keepdim=True), eps))))
    return p


def rms_matmul(eps: float) -> Program:
    p = Program(name="rms_matmul")
    x, g, w = p.input("X", (2, 4)), p.input("G", (4,)), p.input("W", (4, 3))
    p.output(p.matmul(p.mul(p.rms_norm(x, eps=eps), g), w))
    return p


@settings(max_examples=40, deadline=None)
@given(st.floats(1e-8, 1e3), st.integers(1, 4), st.integers(2, 5))
def test_an_epsilon_of_any_magnitude_makes_the_program_inhomogeneous(
    eps: float, rows: int, cols: int
) -> None:
    assert inhomogeneous(l2(eps, (rows, cols)))


def test_homogeneous_programs_are_not_taken_for_inhomogeneous() -> None:
    assert not inhomogeneous(rms_matmul(0.0))  # an add_scalar of 0 adds nothing
    assert not inhomogeneous(load_config("rmsnorm"))  # Mirage's RMSNorm has no epsilon
    p = Program(name="cancels")  # (x + v) / (x + v) = 1: an add_scalar, and still homogeneous (degree 0)
    x = p.input("X", (2, 3))
    shifted = p.add_scalar(x, 0.5)
    p.output(p.mul(p.div(shifted, shifted), x))
    assert not inhomogeneous(p)


_OPS = ("mul", "div", "sqrt", "scale", "sum", "matmul")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(_OPS), min_size=1, max_size=6), st.floats(1e-3, 1e3))
def test_programs_without_an_add_scalar_are_homogeneous(ops: list[str], factor: float) -> None:
    # A random chain of the homogeneous operators, with scale factors of drawn magnitude: never shown
    # inhomogeneous (the float64 test has no false positives on these).
    p = Program(name="chain")
    x, w = p.input("X", (3, 3)), p.input("W", (3, 3))
    t: Tensor = x
    for op in ops:
        match op:
            case "mul" | "div":
                t = getattr(p, op)(t, x)
            case "sqrt":
                t = p.sqrt(t)
            case "scale":
                t = p.scale(t, factor)
            case "sum":
                t = p.repeat(p.sum(t, 1, keepdim=True), 1, 3)
            case _:
                t = p.matmul(t, w)
    p.output(t)
    assert not inhomogeneous(p)


def test_the_rule_applies_only_to_inhomogeneous_programs_over_homogeneous_operators() -> None:
    def rule(p: Program) -> Homogeneity | None:
        return next(
            (r for r in SearchContext(SearchSpec(program=p)).rules.nodes if isinstance(r, Homogeneity)), None
        )

    assert rule(l2(1e-6)) is not None and rule(rms_matmul(1e-6)) is not None
    assert rule(rms_matmul(0.0)) is None and rule(load_config("rmsnorm")) is None
    p = Program(name="with_add")  # add can make an inhomogeneous tensor without add_scalar
    x = p.input("X", (2, 3))
    p.output(p.add(p.sqrt(p.add_scalar(p.mul(x, x), 1.0)), x))
    assert rule(p) is None
    assert SearchContext(SearchSpec(program=l2(1e-6), expr_filter=False)).rules.nodes == ()


def test_an_add_scalar_goes_where_the_program_adds_up_to_sums() -> None:
    canon = Canon()
    x2 = ae.mul(ae.var("X"), ae.var("X"))
    # A sum of k terms multiplies the numerator coefficients: x², Σ₄ x² and Σ₆₄ x² share a core.
    assert core(canon.nf(x2)) == core(canon.nf(ae.sum(4, x2))) == core(canon.nf(ae.sum(64, x2)))
    assert core(canon.nf(x2)) != core(canon.nf(ae.var("X")))
    assert core(canon.nf(ae.sum(4, x2))) != core(canon.nf(ae.sum(4, ae.mul(x2, ae.var("X")))))
    places = ShiftPlaces.for_search(rms_matmul(1e-6), canon, [])
    assert places is not None
    assert places.admits(x2) and places.admits(ae.sum(2, x2))  # on x², or on its partial sums
    wrong = [
        ae.var("X"),
        ae.var("W"),
        ae.sqrt(ae.sum(4, x2)),
        ae.sum(4, ae.mul(ae.var("X"), ae.var("W"))),
    ]
    assert not any(places.admits(t) for t in wrong)


def test_the_shift_rules_apply_only_without_addition_maximum_or_exp() -> None:
    def places(p: Program) -> ShiftPlaces | None:
        return SearchContext(SearchSpec(program=p)).rules.shifts

    assert places(rms_matmul(1e-6)) is not None and places(l2(1e-3)) is not None
    assert places(load_config("rmsnorm")) is None  # nothing is added
    p = Program(name="shifted_max")  # max(x + v) = max(x) + v: the rule is off
    x = p.input("X", (2, 3))
    p.output(p.sqrt(p.max(p.add_scalar(p.mul(x, x), 1.0), 1)))
    assert places(p) is None


def _off(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    for name in names:
        monkeypatch.setattr(getattr(ruleset, name), "for_search", staticmethod(lambda *a: None))


@pytest.mark.parametrize("rules", [("Homogeneity",), ("Homogeneity", "ShiftPlaces")])
def test_the_rules_prune_no_verified_candidate(
    rules: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same search with the rules switched off finds exactly the same candidates and walks more states.
    spec = SearchSpec(
        program=l2(1e-3), max_kernel_ops=1, max_block_ops=5, max_grid_dims=1, max_block_outputs=1
    )
    with_rules, states_with = candidates_and_states(spec)
    _off(monkeypatch, *rules)
    without_rules, states_without = candidates_and_states(spec)
    assert with_rules == without_rules and with_rules
    assert states_with < states_without


def _rms(shape: tuple[int, int]) -> Program:
    p = Program(name="rms_eps")
    p.output(p.rms_norm(p.input("X", shape), eps=1e-6))
    return p


@pytest.mark.slow
def test_an_epsilon_added_before_the_mean_is_still_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """At x: [2, 4] the mean's factor is 1/4, so ``Σ(x² + eps)/4 = mean(x²) + eps``: the shift-aware laws move
    the constant through the sum and the scale, and both placements stay candidates, with far fewer states."""
    spec = SearchSpec(
        program=_rms((2, 4)), max_kernel_ops=1, max_block_ops=6, max_grid_dims=1, max_block_outputs=1
    )
    with_rules, states_with = candidates_and_states(spec)
    _off(monkeypatch, "Homogeneity", "ShiftPlaces")
    without_rules, states_without = candidates_and_states(spec)
    assert with_rules == without_rules and len(with_rules) == 2
    assert states_with * 4 < states_without

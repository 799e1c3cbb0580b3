"""The index-tie rule on a program whose every ``sub`` is a stable softmax's, searched with
``sub_stabilises_only``: ``exp(x − m) = exp(x) / exp(m)`` rewrites each ``sub`` away without changing a tie, so
``sub`` changes no class there and the rule applies (docs/search.md, "Index ties"); and the limits derived for
such a program set the two stable-softmax restrictions."""

from __future__ import annotations

from pathlib import Path

import pytest

from gensorage.exhaustive import SearchSpec
from gensorage.exhaustive.derived_limits import derive_limits
from gensorage.exhaustive.opcatalog import stable_softmax_only
from gensorage.exhaustive.rules import ruleset
from gensorage.exhaustive.walk.search_context import SearchContext
from gensorage.program import Program
from gensorage.program.text_format import parse_program
from tests.search_walk import assert_rule_prunes_only, candidates_and_states

DATA = Path(__file__).parent / "data" / "user_programs"


def _softmax_matmul(rows: int = 2, inner: int = 3, cols: int = 5) -> Program:
    p = Program("softmax_matmul")
    p.output(p.softmax(p.matmul(p.input("X", (rows, inner)), p.input("W", (inner, cols))), dim=1))
    return p


def _unstable_softmax() -> Program:
    p = Program("unstable_softmax")
    e = p.exp(p.input("X", (2, 3)))
    p.output(p.div(e, p.sum(e, dim=1)))
    return p


def _shifted() -> Program:
    """A difference saved as an output: not a stable softmax's."""
    p = Program("shifted")
    x = p.input("X", (2, 3))
    p.output(p.sub(x, p.max(x, dim=1, keepdim=True)))
    return p


def test_stable_softmax_only() -> None:
    assert stable_softmax_only(_softmax_matmul())
    assert not stable_softmax_only(_unstable_softmax())  # an exp of no sub (and no sub at all)
    assert not stable_softmax_only(_shifted())  # a sub read by no exp
    for name, want in [("clip_softmax_max", True), ("attn_scores", True), ("rmsnorm_odd", False)]:
        p = parse_program((DATA / f"{name}.gsp").read_text(encoding="utf-8"))
        assert stable_softmax_only(p) is want, name


def test_the_rule_applies_only_with_the_restriction() -> None:
    program = _softmax_matmul()
    assert SearchContext(SearchSpec(program=program)).rules.ties is None  # sub splits sums
    assert SearchContext(SearchSpec(program=program, sub_stabilises_only=True)).rules.ties is not None
    # A program with another sub keeps the rule off even with the restriction.
    assert SearchContext(SearchSpec(program=_shifted(), sub_stabilises_only=True)).rules.ties is None


def test_derived_limits_restrict_a_stable_softmax() -> None:
    limits = derive_limits(_softmax_matmul()).limits
    assert limits["sub_stabilises_only"] and limits["exp_stabilised_only"] and not limits["loop_concats"]
    restrictions = {"sub_stabilises_only", "exp_stabilised_only", "loop_concats"}
    for p in (_unstable_softmax(), _shifted()):
        assert not restrictions & set(derive_limits(p).limits)


def _scaled_softmax_matmul() -> Program:
    p = Program("scaled_softmax_matmul")
    p.output(p.softmax(p.scale(p.matmul(p.input("X", (2, 3)), p.input("W", (3, 5))), 0.5), dim=1))
    return p


@pytest.mark.parametrize(
    ("program", "block_ops", "concats"), [(_softmax_matmul(), 6, True), (_scaled_softmax_matmul(), 7, False)]
)
def test_the_rule_keeps_every_candidate(
    program: Program, block_ops: int, concats: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fused softmax of a matmul (of scaled scores: the scale between the sub and its exp), with the
    stable-softmax restrictions: with and without the tie rule, the same candidates; with it, fewer states."""
    spec = SearchSpec(
        program=program,
        max_kernel_ops=1,
        max_block_graphs=1,
        max_block_ops=block_ops,
        max_grid_dims=1,
        max_block_outputs=1,
        sub_stabilises_only=True,
        exp_stabilised_only=True,
        loop_concats=concats,
    )
    off = staticmethod(lambda *a: None)
    assert_rule_prunes_only(spec, lambda: monkeypatch.setattr(ruleset.TieRule, "for_search", off))


def test_a_softmax_of_scaled_scores_keeps_its_fused_kernel() -> None:
    """A positive scale between the sub and its exp (``exp(c·(S − max S))``, where a constant factor's canonical
    place puts it) is in the restricted space, so a softmax of scaled scores still has its one-kernel µGraph."""
    p = Program("scaled_softmax")
    p.output(p.softmax(p.scale(p.input("X", (2, 3)), 0.5), dim=1))
    spec = SearchSpec(program=p, **{**derive_limits(p).limits, "max_grid_dims": 1})
    assert spec.sub_stabilises_only and spec.exp_stabilised_only
    found, _ = candidates_and_states(spec)
    assert found

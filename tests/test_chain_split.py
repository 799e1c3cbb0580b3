"""A program whose form the space does not hold (LayerNorm's ``X − mean X``), searched as its own pre-defined
chain and the rest as a program of its own (:mod:`gensorage.exhaustive.chain_split`): the rest's search has the
rules a program without ``sub`` gets, and each of its candidates is joined behind the chain and checked whole."""

from __future__ import annotations

from pathlib import Path

from gensorage.exhaustive import SearchSpec, search_serial
from gensorage.exhaustive.chain_split import chain_split, spliced_candidates
from gensorage.exhaustive.derived_limits import derive_limits
from gensorage.exhaustive.results import Candidate
from gensorage.exhaustive.walk.search_context import SearchContext
from gensorage.opset import Op
from gensorage.program import Program, parse_program
from gensorage.superopt import SuperoptResult, superoptimize
from gensorage.ugraph import from_program
from gensorage.ugraph.ir import GraphDefinedOp, KernelOp
from gensorage.verify import equivalent

LAYERNORM = Path(__file__).parent / "data" / "user_programs" / "layernorm_matmul.gsp"


def layernorm_matmul() -> Program:
    return parse_program(LAYERNORM.read_text(), source=str(LAYERNORM))


def layernorm(rows: int = 2, cols: int = 4) -> Program:
    """LayerNorm without affine, nine operators: ``sum``, ``scale``, ``sub``, then an RMSNorm of ``C``."""
    p = Program(name="layernorm")
    x = p.input("X", (rows, cols))
    c = p.sub(x, p.scale(p.sum(x, 1), 1 / cols), name="C")
    v = p.add_scalar(p.scale(p.sum(p.mul(c, c), 1), 1 / cols), 1e-5)
    p.output(p.div(c, p.sqrt(v)))
    return p


def centred_squares(rows: int = 2, cols: int = 4) -> Program:
    p = Program(name="centred_squares")
    x = p.input("X", (rows, cols))
    c = p.sub(x, p.scale(p.sum(x, 1), 1 / cols), name="C")
    p.output(p.sum(p.mul(c, c), 1))
    return p


def _pre(g: object) -> list[str]:
    return [op.op.value for op in g.ops if isinstance(op, KernelOp)]  # type: ignore[attr-defined]


def test_layernorm_matmul_is_its_mean_subtraction_then_rmsnorm_matmul_over_c() -> None:
    d = derive_limits(layernorm_matmul())
    assert d.split is not None and d.split.chain_ops == ("sum", "scale", "sub")
    rest = d.split.rest
    assert sorted(t.name for t in rest.inputs) == ["C", "W"]
    ops = [n.op for n in rest.nodes if n.op is not None]
    assert len(ops) == 7 and Op.SUB not in ops
    # The rest's own limits: one custom kernel of seven block operators, and no restriction of the whole program.
    assert d.limits == derive_limits(rest).limits
    assert d.limits["max_kernel_ops"] == 1 and "own_predefined_only" not in d.limits
    assert "its own pre-defined sum, scale, sub" in d.note


def test_the_rests_search_prunes_with_the_rules_sub_turns_off() -> None:
    """The point of the split: the whole program's op set has ``sub``, which turns the index-tie rule, the
    occurrence budget, the reductions rule and both rules of additive constants off; the rest's has none, so they
    are on."""
    d = derive_limits(layernorm_matmul())
    assert d.split is not None
    rest = SearchContext(SearchSpec(program=d.split.rest, **d.limits)).rules
    whole = SearchContext(SearchSpec(program=layernorm_matmul(), **d.limits)).rules
    assert rest.ties and rest.occurrences and rest.shifts and len(rest.nodes) == 5
    assert not (whole.ties or whole.occurrences or whole.shifts) and len(whole.nodes) == 1


def test_each_candidate_of_the_rest_is_checked_behind_the_chain() -> None:
    p = centred_squares()
    split = chain_split(p)
    assert split is not None and [t.name for t in split.rest.inputs] == ["C"]
    spec = SearchSpec(
        program=split.rest, max_kernel_ops=1, max_block_ops=2, max_block_graphs=1, max_grid_dims=1
    )
    found = search_serial(spec)
    assert found.complete and found.candidates
    spliced = spliced_candidates(split, p, spec, found.candidates)
    assert len(spliced) == len(found.candidates)
    for c in spliced:
        assert _pre(c.ugraph) == ["sum", "scale", "sub"] and isinstance(c.ugraph.ops[-1], GraphDefinedOp)
        assert [t.name for t in c.ugraph.inputs] == ["X"] and c.equivalence["equivalent"]
        assert equivalent(p, c.ugraph, 1e-6)
    # The check decides: a µGraph of another rest (Σ C instead of Σ C²) is dropped, not returned.
    other = Program(name="other")
    other.output(other.sum(other.input("C", (2, 4)), 1))
    wrong = Candidate(from_program(other), 0.0, {}, 0)
    assert spliced_candidates(split, p, spec, [wrong]) == []


def test_a_chain_result_that_is_an_output_keeps_the_own_predefined_chain() -> None:
    p = layernorm_matmul()
    p.output(p.tensor("C"))
    assert chain_split(p) is None
    d = derive_limits(p)
    assert d.split is None and d.limits["own_predefined_only"] and d.limits["max_kernel_ops"] == 4


def test_full_mode_searches_the_rest_and_returns_whole_program_ugraphs(tmp_path: Path) -> None:
    """Full mode on a LayerNorm of nine operators: the rest's search, its candidates µGraphs of the whole
    program; a rerun resumes the rest's checkpoint and splices the same candidates."""
    p = layernorm()

    def run() -> SuperoptResult:
        return superoptimize(
            p, mode="full", workers=1, use_store=False, checkpoint=tmp_path / "c.sqlite", progress=False
        )

    r = run()
    assert any("its own pre-defined sum, scale, sub" in n for n in r.notes)
    assert r.complete and r.search_stats is not None and r.search_stats["candidates"] > 0
    searched = [g for origin, g, _ in r.candidates if origin.startswith("search")]
    assert searched and r.equivalence
    for g in searched:
        assert [t.name for t in g.inputs] == ["X"] and equivalent(p, g, 1e-6)
    again = run()
    assert again.search_stats is not None
    assert again.search_stats["tasks_resumed"] == again.search_stats["tasks_total"]
    assert again.candidates == r.candidates and again.best == r.best

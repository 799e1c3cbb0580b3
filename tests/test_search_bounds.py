"""Search-space bounds: Mirage's block-node limit, canonical grid numbering, the needed-operators bound and its
use before the last kernel."""

from __future__ import annotations

import dataclasses

import pytest
from search_walk import candidates_and_states

from gensorage.errors import ConfigError
from gensorage.exhaustive import SearchSpec, search_serial
from gensorage.exhaustive.expr import abstract_expr as ae
from gensorage.exhaustive.expr.oracle import SubexprOracle
from gensorage.exhaustive.results import ugraph_key
from gensorage.exhaustive.rules import ties as rule_ties
from gensorage.exhaustive.rules.needed_ops import DIV_MARK, NeededOps
from gensorage.exhaustive.walk import block_level, kernel_level
from gensorage.exhaustive.walk.bindings import binding_options, new_dims_canonical
from gensorage.program import Program, load_config
from gensorage.ugraph.ir import Accumulator, BlockOp, GraphDefinedOp, InputIterator, ThreadGraph


def softmax_rows() -> Program:
    """``exp(X) / sum(exp(X))`` over rows: needs an exp and a div."""
    p = Program("softmax_rows")
    x = p.input("X", (3, 4))
    e = p.exp(x)
    p.output(p.div(e, p.sum(e, dim=1)))
    return p


# ------------------------------------------------------------------------------ max_block_nodes


def test_block_nodes_limit_counts_iterators_operators_and_accumulators() -> None:
    program = load_config("gated_mlp", {"t": 3, "k": 4, "f": 5})
    base = SearchSpec(
        program=program, max_kernel_ops=1, max_block_ops=4, max_grid_dims=1, max_block_outputs=1
    )
    unlimited = search_serial(base)
    assert unlimited.complete and unlimited.candidates

    def nodes(c: object) -> int:
        op = c.ugraph.ops[0]  # type: ignore[attr-defined]
        assert isinstance(op, GraphDefinedOp)
        count = 0
        for n in op.block.nodes:
            if isinstance(n, InputIterator | BlockOp | Accumulator):
                count += 1
            elif isinstance(n, ThreadGraph):
                count += len(n.ops)
        return count

    most = max(nodes(c) for c in unlimited.candidates)
    limited = search_serial(dataclasses.replace(base, max_block_nodes=most - 1))
    assert limited.complete
    assert all(nodes(c) <= most - 1 for c in limited.candidates)
    kept = {ugraph_key(c.ugraph) for c in unlimited.candidates if nodes(c) <= most - 1}
    assert {ugraph_key(c.ugraph) for c in limited.candidates} == kept


def test_block_nodes_in_json_only_when_set() -> None:
    program = softmax_rows()
    spec = SearchSpec(program=program)
    assert "max_block_nodes" not in spec.to_json()  # keys of specs written before the field are unchanged
    limited = dataclasses.replace(spec, max_block_nodes=6)
    assert limited.to_json()["max_block_nodes"] == 6
    assert SearchSpec.from_json(limited.to_json()) == limited
    assert limited.key() != spec.key()


@pytest.mark.parametrize("bad", [1, 0, -3, True, 2.5, "7"])
def test_block_nodes_rejects_bad_values(bad: object) -> None:
    with pytest.raises(ConfigError, match="max_block_nodes"):
        SearchSpec(program=softmax_rows(), max_block_nodes=bad)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ replicated_writes


def test_replicated_writes_in_json_only_when_false() -> None:
    spec = SearchSpec(program=softmax_rows())
    assert "replicated_writes" not in spec.to_json()  # keys of specs written before the field are unchanged
    narrow = dataclasses.replace(spec, replicated_writes=False)
    assert narrow.to_json()["replicated_writes"] is False
    assert SearchSpec.from_json(narrow.to_json()) == narrow and narrow.key() != spec.key()
    with pytest.raises(ConfigError, match="replicated_writes"):
        SearchSpec(program=softmax_rows(), replicated_writes="no")  # type: ignore[arg-type]


def grouped_dot() -> Program:
    """Row h of Q against row h // 2 of K (GQA's grouping), then exp."""
    p = Program("grouped_dot")
    k = p.repeat(p.input("K", (2, 3)), dim=0, times=2)
    p.output(p.exp(p.sum(p.mul(p.input("Q", (4, 3)), k), dim=1)))
    return p


def test_without_replicated_writes_no_kernel_but_the_last_writes_copies() -> None:
    """The narrower space: a subset of the candidates, fewer states, and what it drops is a first kernel that
    writes K's rows twice for the second to line up with Q's."""
    spec = SearchSpec(program=grouped_dot(), max_kernel_ops=2, max_block_ops=2, max_grid_dims=1)
    wide, wide_states = candidates_and_states(spec)
    narrow, narrow_states = candidates_and_states(dataclasses.replace(spec, replicated_writes=False))
    assert set(narrow) < set(wide) and narrow_states < wide_states


# ------------------------------------------------------------------------- canonical grid numbering


def test_new_grid_dims_are_numbered_in_order_of_first_split() -> None:
    assert new_dims_canonical((0, None, None), [0], 0)
    assert not new_dims_canonical((None, 0, None), [1], 0)  # dim 0 must be introduced first
    assert new_dims_canonical((1, 2, None), [0, 1], 0)
    assert not new_dims_canonical((2, 1, None), [0, 1], 0)  # two new dims: increasing data dims
    assert new_dims_canonical((None, 0, 2), [2], 2)  # dims 0 and 1 chosen before: 2 is next
    assert not new_dims_canonical((None, None, 2), [2], 1)  # dim 1 must come before dim 2
    assert new_dims_canonical((None, 0, 2), [1, 2], 1)


def test_canonical_bindings_are_one_numbering_of_the_free_ones() -> None:
    """Every binding the canonical form drops is a grid-dim permutation of one it keeps."""
    shape, r = (4, 6, 2), 2
    free = binding_options(shape, r, (None, None), False, 1, "enumerate", (), None, False)
    kept = binding_options(shape, r, (None, None), False, 1, "enumerate", (), None, True)
    assert set(kept) < set(free)

    def canon(bd: object) -> tuple[object, ...]:  # the imap/sizes up to a permutation of the grid dims
        imap = bd.imap  # type: ignore[attr-defined]
        sizes = dict(bd.new_grid)  # type: ignore[attr-defined]
        return tuple(sorted((imap[g], sizes.get(g)) for g in range(r) if imap[g] is not None)), bd.tile  # type: ignore[attr-defined]

    assert {canon(b) for b in kept} == {canon(b) for b in free}


def test_canonical_grid_numbering_keeps_the_structures() -> None:
    p = Program("exp_matmul")
    p.output(p.exp(p.matmul(p.input("X", (2, 4)), p.input("Y", (4, 3)))))
    spec = SearchSpec(program=p, max_kernel_ops=1, max_block_ops=2, max_grid_dims=2, max_block_outputs=1)
    canonical = search_serial(spec)
    free = search_serial(dataclasses.replace(spec, canonical=False))
    assert canonical.complete and free.complete and canonical.candidates
    # Without canonical form some µGraphs come in several grid numberings; every one the canonical search keeps
    # is among them, and it visits fewer states.
    kept = {ugraph_key(c.ugraph) for c in canonical.candidates}
    assert kept < {ugraph_key(c.ugraph) for c in free.candidates}
    assert any(len(c.ugraph.ops[0].block.grid) == 2 for c in canonical.candidates)  # type: ignore[union-attr]
    assert canonical.stats.states < free.stats.states


# ------------------------------------------------------------------------------- needed operators


def test_marks_and_bound() -> None:
    x, y = ae.var("X"), ae.var("Y")
    target = ae.div(ae.exp(x), ae.sum(4, ae.exp(x)))
    oracle = SubexprOracle([target], 1000)
    needed = NeededOps(oracle.canon, [target])
    assert DIV_MARK in needed.target
    assert needed.bound([x]) == (2, False)  # an exp and a div
    assert needed.bound([ae.exp(x)]) == (1, False)  # the div
    assert needed.bound([ae.exp(y)]) == (2, False)  # exp(Y) is another class
    assert needed.bound([ae.sum(4, ae.exp(x)), ae.div(y, x)]) == (0, False)
    assert needed.bound([]) == (2, False)


def test_needed_ops_bound_keeps_the_verified_set(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = SearchSpec(
        program=softmax_rows(), max_kernel_ops=2, max_block_ops=2, max_grid_dims=1, max_block_outputs=1
    )
    bounded = search_serial(spec)
    monkeypatch.setattr(NeededOps, "bound", lambda self, *a: (0, False))
    unbounded = search_serial(spec)
    assert bounded.complete and unbounded.complete and bounded.candidates
    assert {ugraph_key(c.ugraph) for c in bounded.candidates} == {
        ugraph_key(c.ugraph) for c in unbounded.candidates
    }
    assert bounded.stats.states < unbounded.stats.states


@pytest.mark.parametrize(
    ("program", "kernels", "block_ops", "nodes"),
    [
        (softmax_rows(), 3, 2, 2),  # three kernels: the first two are both "before the last"
        (
            load_config("gqa_incdec_papers", {"kv": 2, "g": 2, "n": 4, "d": 2}),
            2,
            5,
            5,
        ),  # 6 candidates, 2 kernels
    ],
)
def test_the_bound_before_the_last_kernel_keeps_every_candidate(
    program: Program, kernels: int, block_ops: int, nodes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A block graph before the last kernel operator is pruned when the needed operators and missing reduction
    classes exceed what it and the later kernels can add: the same candidates with and without it, fewer
    states with it."""
    spec = SearchSpec(
        program=program,
        max_kernel_ops=kernels,
        max_block_ops=block_ops,
        max_block_nodes=nodes,
        max_grid_dims=1,
        max_block_outputs=2,
    )
    with_bound, states_with = candidates_and_states(spec)
    monkeypatch.setattr(block_level, "earlier_site", lambda *a: None)
    without_bound, states_without = candidates_and_states(spec)
    assert with_bound == without_bound and with_bound
    assert states_with < states_without


@pytest.mark.parametrize(
    ("program", "nodes", "grid", "dims"),
    [
        (load_config("gqa_incdec_papers", {"kv": 2, "g": 2, "n": 4, "d": 2}), 5, 1, None),
        (load_config("gqa_incdec_papers", {"kv": 2, "g": 2, "n": 4, "d": 2}), 5, 2, "attention"),
    ],
)
def test_children_that_add_no_mark_or_class_at_a_tight_bound_are_not_generated(
    program: Program, nodes: int, grid: int, dims: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the needed marks plus the missing reduction classes take every node left, a repeat or a
    concatenating accumulator (which add neither) is not generated unless its operand's new tile has unknown
    ties: every such child was pruned at once anyway, so the candidates are the same and the states fewer."""
    from gensorage.exhaustive.dim_strategy import load_dim_strategy

    spec = SearchSpec(
        program=program,
        max_kernel_ops=2,
        max_block_ops=nodes,
        max_block_nodes=nodes,
        max_grid_dims=grid,
        max_block_outputs=2,
        dims=load_dim_strategy(dims) if dims is not None else None,
    )
    with_rule, states_with = candidates_and_states(spec)
    monkeypatch.setattr(rule_ties, "TIGHT_RULE", False)
    without_rule, states_without = candidates_and_states(spec)
    assert with_rule == without_rule and with_rule
    assert states_with < states_without


def scaled_softmax_rows() -> Program:
    """``softmax(X / 2)`` over rows, the stable form: a scale, a max, a sub, an exp, a sum and a div."""
    p = Program("scaled_softmax_rows")
    x = p.input("X", (3, 4))
    p.output(p.softmax(p.scale(x, 0.5), 1))
    return p


@pytest.mark.slow
def test_kernel_graphs_that_cannot_complete_by_counting_are_not_generated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A kernel operator after which the tensors still to read cannot be brought down to the outputs by the
    operators left (each reads at most its arity or max_block_inputs; a scale's result only by a unary
    operator of its own) is not generated: the same candidates with and without the rule, fewer states
    (about half here: kernel-level scales of X followed by custom kernels that cannot consume them)."""
    spec = SearchSpec(
        program=scaled_softmax_rows(),
        max_kernel_ops=3,
        max_block_ops=1,
        max_block_inputs=1,
        max_grid_dims=1,
        max_block_outputs=2,
    )
    with_rule, states_with = candidates_and_states(spec)
    monkeypatch.setattr(kernel_level, "COUNT_RULE", False)
    without_rule, states_without = candidates_and_states(spec)
    assert with_rule == without_rule
    assert states_with < states_without

"""Search limits derived from the program (:mod:`gensorage.exhaustive.derived_limits`), the
``max_block_graphs`` limit they use, the order tasks run in, and full mode without a preset using them."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import numpy as np
import pytest
from search_walk import candidates_and_states, replayed

from gensorage.errors import ConfigError
from gensorage.exhaustive import SearchSpec, enumerate_tasks, search_serial
from gensorage.exhaustive.derived_limits import MAX_BLOCK_OPS, derive_limits
from gensorage.exhaustive.walk import block_level
from gensorage.program import Program, load_config
from gensorage.superopt import superoptimize
from gensorage.superopt.search_shapes import derive_search_shapes
from gensorage.ugraph.ir import GraphDefinedOp, KernelGraph, Ref


def two_matmul(t: int = 8, k: int = 32) -> Program:
    p = Program(name="two_matmul")
    x, w1, w2 = p.input("X", (t, k)), p.input("W1", (k, k)), p.input("W2", (k, k))
    p.output(p.matmul(p.matmul(x, w1), w2))
    return p


def rms_eps_matmul() -> Program:
    """RMSNorm with epsilon and weight, then a projection: eight operators."""
    p = Program(name="rms_eps_matmul")
    x, g, w = p.input("X", (8, 64)), p.input("G", (64,)), p.input("W", (64, 128))
    p.output(p.matmul(p.mul(p.rms_norm(x), g), w))
    return p


def graph_defined(g: KernelGraph) -> int:
    return sum(isinstance(op, GraphDefinedOp) for op in g.ops)


# ------------------------------------------------------------------------------------------- the limits


def test_rmsnorm_gets_one_fused_kernel_of_seven_block_operators() -> None:
    d = derive_limits(load_config("rmsnorm"))
    assert d.limits == {
        "max_kernel_ops": 1,
        "max_block_graphs": 1,
        "max_block_ops": 7,
        "max_block_inputs": 3,
        "max_block_outputs": 2,
        "max_grid_dims": 2,
        "fused_first": True,
    }
    assert "7 operators" in d.note and "one graph-defined kernel" in d.note


def test_block_operators_follow_the_program_and_a_larger_program_gets_a_predefined_operator() -> None:
    small = derive_limits(two_matmul()).limits
    assert small["max_block_ops"] == 2 and small["max_kernel_ops"] == 1
    assert small["max_block_inputs"] == 3
    big = derive_limits(rms_eps_matmul()).limits
    assert big["max_block_ops"] == MAX_BLOCK_OPS
    assert big["max_kernel_ops"] == 2 and big["max_block_graphs"] == 1 and big["graph_defined_last"]
    assert big["min_kernel_ops"] == 2  # seven block operators cannot hold eight program operators alone
    assert "graph_defined_last" not in small and "min_kernel_ops" not in small


def test_one_input_program_gets_two_block_inputs_and_its_rank_of_grid_dims() -> None:
    p = Program(name="row_sum")
    p.output(p.sum(p.input("X", (4, 6, 8)), 2))
    got = derive_limits(p).limits
    assert got["max_block_inputs"] == 2 and got["max_grid_dims"] == 3 and got["max_block_ops"] == 2


def test_derived_limits_make_a_valid_spec() -> None:
    p = derive_search_shapes(load_config("rmsnorm")).program
    spec = SearchSpec(program=p, **derive_limits(p).limits)
    assert spec.to_json()["max_block_graphs"] == 1


# ------------------------------------------------------------------------------------ max_block_graphs


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_max_block_graphs_must_be_a_positive_integer(bad: object) -> None:
    with pytest.raises(ConfigError, match="max_block_graphs"):
        SearchSpec(program=two_matmul(2, 3), max_block_graphs=bad)  # type: ignore[arg-type]


def test_the_new_fields_at_their_defaults_keep_the_spec_json_and_key_of_before() -> None:
    spec = SearchSpec(program=two_matmul(2, 3))
    for name in ("max_block_graphs", "fused_first", "graph_defined_last", "min_kernel_ops"):
        assert name not in spec.to_json()
    assert SearchSpec.from_json(spec.to_json()).key() == spec.key()
    on = SearchSpec(
        program=two_matmul(2, 3),
        max_block_graphs=1,
        fused_first=True,
        graph_defined_last=True,
        min_kernel_ops=2,
    )
    assert SearchSpec.from_json(on.to_json()) == on and on.key() != spec.key()


@pytest.mark.parametrize("bad", [0, 3, True])
def test_min_kernel_ops_must_be_a_positive_integer_within_max_kernel_ops(bad: object) -> None:
    with pytest.raises(ConfigError, match="min_kernel_ops"):
        SearchSpec(program=two_matmul(2, 3), max_kernel_ops=2, min_kernel_ops=bad)  # type: ignore[arg-type]


def test_max_block_graphs_keeps_exactly_the_candidates_within_it() -> None:
    """The limit removes the µGraphs with more graph-defined kernels and nothing else (the subtree memo's key
    counts graph-defined kernels, so a replayed subtree never brings back one the limit excludes)."""
    limits = {"max_kernel_ops": 2, "max_block_ops": 1, "max_block_inputs": 2, "max_grid_dims": 1}
    p = two_matmul(2, 3)
    free = search_serial(SearchSpec(program=p, **limits))
    one = search_serial(SearchSpec(program=p, max_block_graphs=1, **limits))
    assert free.complete and one.complete
    assert any(graph_defined(c.ugraph) == 2 for c in free.candidates)
    assert all(graph_defined(c.ugraph) <= 1 for c in one.candidates)
    want = {c.structure_key() for c in free.candidates if graph_defined(c.ugraph) <= 1}
    assert {c.structure_key() for c in one.candidates} == want
    assert one.stats.states < free.stats.states


def custom_last(g: KernelGraph) -> bool:
    """No kernel operator follows a graph-defined one."""
    return all(not isinstance(op, GraphDefinedOp) for op in g.ops[:-1])


def test_graph_defined_last_keeps_exactly_the_candidates_whose_custom_kernel_is_last() -> None:
    """Pre-defined operators may feed the custom kernel, none may follow it: exactly those candidates of the free
    search, found with fewer states (its block graph is pruned as a last one)."""
    limits = {"max_kernel_ops": 2, "max_block_ops": 1, "max_block_inputs": 2, "max_grid_dims": 1}
    p = two_matmul(2, 3)
    free = search_serial(SearchSpec(program=p, **limits))
    last = search_serial(SearchSpec(program=p, graph_defined_last=True, **limits))
    assert free.complete and last.complete
    assert any(not custom_last(c.ugraph) for c in free.candidates)
    want = {c.structure_key() for c in free.candidates if custom_last(c.ugraph)}
    assert want and {c.structure_key() for c in last.candidates} == want
    assert last.stats.states < free.stats.states


def test_min_kernel_ops_keeps_exactly_the_candidates_with_that_many_kernel_operators() -> None:
    """With ``graph_defined_last``, a custom kernel alone is not generated at all (its header would be the last
    operator of a µGraph too short), and the other candidates stay."""
    limits = {"max_kernel_ops": 2, "max_block_ops": 2, "max_block_inputs": 3, "max_grid_dims": 1}
    p = two_matmul(2, 3)
    last = search_serial(SearchSpec(program=p, graph_defined_last=True, **limits))
    two = search_serial(SearchSpec(program=p, graph_defined_last=True, min_kernel_ops=2, **limits))
    assert last.complete and two.complete
    assert any(len(c.ugraph.ops) == 1 for c in last.candidates)
    want = {c.structure_key() for c in last.candidates if len(c.ugraph.ops) == 2}
    assert want and {c.structure_key() for c in two.candidates} == want
    assert two.stats.states < last.stats.states


def l2_matmul() -> Program:
    """Rows scaled to unit norm, then a projection: a custom kernel then a pre-defined matmul can make it."""
    p = Program(name="l2_matmul")
    x, w = p.input("X", (2, 3)), p.input("W", (3, 4))
    p.output(p.matmul(p.div(x, p.sqrt(p.sum(p.mul(x, x), 1))), w))
    return p


def test_the_bound_before_the_last_kernel_with_only_predefined_operators_after_keeps_every_candidate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``max_block_graphs`` reached, the kernels after a block graph are pre-defined operators (one node
    each), so the bound before the last kernel applies without a node limit: same candidates, fewer states."""
    spec = SearchSpec(
        program=l2_matmul(), max_kernel_ops=2, max_block_graphs=1, max_block_ops=4, max_grid_dims=1
    )
    with_bound, states_with = candidates_and_states(spec)
    monkeypatch.setattr(block_level, "earlier_site", lambda *a: None)
    without_bound, states_without = candidates_and_states(spec)
    assert with_bound == without_bound and with_bound
    assert states_with < states_without


# --------------------------------------------------------------------------------------------- task order


def _first_custom_kernel(spec: SearchSpec, path: tuple[int, ...]) -> tuple[set[str], bool] | None:
    """The program inputs the first graph-defined kernel on ``path`` was computed from, and whether it loops
    (None: the path holds none), by replaying the path and reading the kernel graph."""
    with replayed(spec, path) as w:
        st = w.state
        names = [t.name for t in spec.program.inputs]
        # Which program inputs each kernel operator's results depend on, through the operators before it.
        deps: list[set[str]] = []

        def of(r: Ref) -> set[str]:
            return {names[r.node]} if r.node < len(names) else deps[r.node - len(names)]

        got: tuple[set[str], bool] | None = None
        for op in st.ops:
            deps.append(set().union(*(of(r) for r in op.inputs)))
            if isinstance(op, GraphDefinedOp) and got is None:
                got = (deps[-1], op.block.forloop > 1)
        if got is None and st.block is not None:
            got = (set().union(*(of(st.ref[i]) for i in st.block.inputs)), st.block.looped)
    return got


@pytest.mark.parametrize("name", ["rmsnorm", "mha_incdec"])
def test_tasks_that_can_fuse_the_whole_program_run_first_and_cover_the_same_subtrees(name: str) -> None:
    # First the tasks whose first custom kernel reads every program input, directly or through the pre-defined
    # operators before it (at decode: after K's transpose), looped ones first; then the rest, each class in
    # walk order. The same tasks as in walk order, only permuted.
    p = derive_search_shapes(load_config(name)).program
    spec = SearchSpec(program=p, max_kernel_ops=2, max_block_ops=2, max_grid_dims=1, fused_first=True)
    tasks = enumerate_tasks(spec)
    assert [t.index for t in tasks] == list(range(len(tasks)))
    everything = {t.name for t in p.inputs}

    @functools.cache
    def klass(path: tuple[int, ...]) -> int:
        got = _first_custom_kernel(spec, path)
        return 2 if got is None or got[0] != everything else 0 if got[1] else 1

    walk_order = enumerate_tasks(dataclasses.replace(spec, fused_first=False))
    want = sorted(walk_order, key=lambda t: (klass(t.path), t.index))
    assert [(t.path, t.subtree) for t in tasks] == [(t.path, t.subtree) for t in want]
    assert [(t.path, t.subtree) for t in walk_order] != [(t.path, t.subtree) for t in tasks]
    first = {klass(t.path) for t in tasks[:1]}
    assert first == {0}


# -------------------------------------------------------------------------------- full mode without preset


def test_full_mode_without_a_preset_uses_limits_derived_from_the_program(tmp_path: Path) -> None:
    p = Program(name="softmax_rows")
    x = p.input("X", (8, 64), "float32")
    e = p.exp(x)
    p.output(p.div(e, p.sum(e, 1)))
    r = superoptimize(
        p,
        mode="full",
        workers=1,
        store=tmp_path / "s.sqlite",
        checkpoint=tmp_path / "c.sqlite",
        progress=False,
    )
    assert any(n.startswith("search limits derived from the program (3 operators") for n in r.notes)
    assert r.complete and r.search_stats is not None and r.search_stats["candidates"] > 0
    assert r.equivalence and r.origin.startswith("search") and r.num_kernels == 1
    xs = p.random_inputs(seed=2)
    np.testing.assert_allclose(r.run(*xs)[0], p.run(*xs)[0], rtol=1e-5)

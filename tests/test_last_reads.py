"""The last kernel's reads (rules/last_reads.py): the program's outputs must be a function of the tensors the last
kernel operator reads; the jets, the row-space test, FlashDecoding's split kernel with and without ``l``, and the
law (the same candidates with the rule switched off, in more states)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from search_walk import assert_rule_prunes_only
from test_rediscovery import _stable_split_kv_and_combine
from test_search_bounds import softmax_rows
from test_split_kv_rediscovery import flash_decoding_path, split_kv_preset_spec

from gensorage.arith import Float64Arith
from gensorage.exhaustive import SearchSpec, enumerate_tasks, run_task
from gensorage.exhaustive.results import ugraph_key
from gensorage.exhaustive.rules.last_reads import (
    REJECT,
    SEEDS,
    JetArith,
    LastReads,
    input_jets,
    jacobian,
    outside_share,
    row_basis,
)
from gensorage.exhaustive.walk import kernel_level
from gensorage.exhaustive.walk.search_context import SearchContext
from gensorage.program import Program
from gensorage.ugraph import examples
from gensorage.ugraph.evaluate import evaluate
from gensorage.ugraph.ir import Accumulator, GraphDefinedOp, KernelGraph, Ref


def _flash_decoding() -> tuple[Program, KernelGraph]:
    return examples.flash_decoding_stable(heads=2, kv_len=8, head_dim=3, splits=2, combine="matmul")


def _split_reads(g: KernelGraph) -> list[Ref]:
    """The split kernel's three saved tensors (o, l, m), which the combine reads."""
    combine = g.ops[-1]
    assert isinstance(combine, GraphDefinedOp)
    return list(combine.inputs)


def _without_l(g: KernelGraph) -> KernelGraph:
    """FlashDecoding's split kernel with the ``softmax_sum`` accumulator replaced by a running maximum of the
    scores: it saves two maxima and ``o``, the prefix the MQA preset's walk spent its time below."""
    split = g.ops[1]
    assert isinstance(split, GraphDefinedOp)
    nodes = list(split.block.nodes)
    (j,) = [j for j, n in enumerate(nodes) if isinstance(n, Accumulator) and n.kind == "softmax_sum"]
    nodes[j] = dataclasses.replace(nodes[j], kind="max")
    block = dataclasses.replace(split.block, nodes=tuple(nodes))
    return dataclasses.replace(g, ops=(g.ops[0], dataclasses.replace(split, block=block), g.ops[2]))


def test_jets_are_the_derivatives() -> None:
    # Central differences of the float64 program against the jets (max, exp, div, matmul, scale, transpose),
    # and FlashDecoding's µGraph (online accumulators, stacked blocks) has the program's Jacobian.
    p, g = _flash_decoding()
    shapes = [tuple(t.shape) for t in p.inputs]
    jets = input_jets(shapes, 7)
    j_prog = jacobian(p.evaluate(JetArith(), jets))
    x = np.concatenate([j.v.ravel() for j in jets])

    def f(flat: np.ndarray) -> np.ndarray:
        parts, at = [], 0
        for s in shapes:
            n = int(np.prod(s))
            parts.append(flat[at : at + n].reshape(s))
            at += n
        return np.concatenate([o.ravel() for o in p.evaluate(Float64Arith(), parts)])

    h = 1e-6
    fd = np.stack([(f(x + h * e) - f(x - h * e)) / (2 * h) for e in np.eye(x.size)], axis=1)
    assert np.allclose(j_prog, fd, atol=1e-7)
    for stack in (False, True):
        j_graph = jacobian(evaluate(g, JetArith(), jets, stack=stack))
        assert np.allclose(j_graph, j_prog, atol=1e-12)


def test_row_basis_spans_the_rows() -> None:
    rng = np.random.default_rng(3)
    a = rng.standard_normal((4, 9))
    j = np.concatenate([a, rng.standard_normal((3, 4)) @ a])  # rank 4
    basis = row_basis(j)
    assert basis.shape == (4, 9)
    assert np.allclose(basis @ basis.T, np.eye(4), atol=1e-12)
    assert outside_share(rng.standard_normal((2, 4)) @ a, j) < 1e-12
    assert outside_share(rng.standard_normal((2, 9)), j) > 0.1
    assert outside_share(np.zeros((2, 9)), j) == 0.0
    assert np.isnan(outside_share(np.full((2, 9), np.nan), j))


def test_a_function_of_the_reads_is_kept() -> None:
    # FlashDecoding's combine reads o, l and m: the output is a function of them.
    p, g = _flash_decoding()
    test = LastReads(p, range(len(p.inputs)))
    reads = _split_reads(g)
    for seed in SEEDS:
        values = evaluate(
            KernelGraph(g.inputs, g.ops[:2], tuple(reads)), JetArith(), input_jets(test.shapes, seed)
        )
        assert (
            outside_share(jacobian(p.evaluate(JetArith(), input_jets(test.shapes, seed))), jacobian(values))
            < 1e-12
        )
    assert test.admits(g.inputs, g.ops[:2], reads, 64, 64)
    # Reading a program input besides (more than needed) keeps it too, and reading every input needs no test.
    assert test.admits(g.inputs, g.ops[:2], [*reads, Ref(0)], 64, 64)
    assert test.admits(g.inputs, g.ops[:2], [Ref(0), Ref(1), Ref(2)], 64, 64)


def test_the_split_kernel_without_l_is_rejected() -> None:
    # Two maxima and o: the softmax's denominator is no function of them; nor of o and m alone.
    p, g = _flash_decoding()
    test = LastReads(p, range(len(p.inputs)))
    reads = _split_reads(g)
    no_l = _without_l(g)
    assert not test.admits(no_l.inputs, no_l.ops[:2], reads, 64, 64)
    o, _, m = reads
    assert not test.admits(g.inputs, g.ops[:2], [o, m], 64, 64)
    values = evaluate(KernelGraph(g.inputs, g.ops[:2], (o, m)), JetArith(), input_jets(test.shapes, SEEDS[0]))
    share = outside_share(
        jacobian(p.evaluate(JetArith(), input_jets(test.shapes, SEEDS[0]))), jacobian(values)
    )
    assert REJECT < share < 1.0


def test_the_rule_applies_with_prune_and_lipschitz_operators_only() -> None:
    p = softmax_rows()
    assert SearchContext(SearchSpec(program=p)).last_reads is not None
    assert SearchContext(SearchSpec(program=p, prune=False)).last_reads is None
    assert SearchContext(SearchSpec(program=p, ops=("exp", "sum", "div", "sqrt"))).last_reads is None


@pytest.mark.parametrize(
    ("kernels", "block_ops", "nodes"),
    [(3, 2, 2), (2, 3, 3)],
)
def test_switching_the_rule_off_finds_the_same_candidates_in_more_states(
    kernels: int, block_ops: int, nodes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = SearchSpec(
        program=softmax_rows(),
        max_kernel_ops=kernels,
        max_block_ops=block_ops,
        max_block_nodes=nodes,
        max_grid_dims=1,
        max_block_outputs=2,
    )
    assert_rule_prunes_only(spec, lambda: monkeypatch.setattr(kernel_level, "LAST_READS_RULE", False))


def test_reads_laid_out_differently_share_a_verdict() -> None:
    # FlashDecoding with m saved as [heads, 1, splits] (matmul combine) and as [heads, splits, 1] (sum combine):
    # the same scalar functions, so the second test is the first's verdict; the no-l kernel is tested anew.
    p, g = _flash_decoding()
    _, g_sum = examples.flash_decoding_stable(heads=2, kv_len=8, head_dim=3, splits=2, combine="sum")
    test = LastReads(p, range(len(p.inputs)))
    assert test.admits(g.inputs, g.ops[:2], _split_reads(g), 64, 64)
    assert test.admits(g_sum.inputs, g_sum.ops[:2], _split_reads(g_sum), 64, 64)
    assert len(test._decided) == 1
    no_l = _without_l(g)
    assert not test.admits(no_l.inputs, no_l.ops[:2], _split_reads(no_l), 64, 64)
    assert len(test._decided) == 2


def test_the_subtree_memo_tells_functions_apart() -> None:
    # The memo's key holds the tensors' abstract expressions, which drop scale factors; with the rule on, two
    # nodes with one key may hold different functions (a maximum of the scores or of the scaled scores) and get
    # different verdicts below them, so no subtree in which the rule made a numeric test is stored: reuse finds
    # what a walk without it finds. (This small search does not hit such a key; the slow test below, where it did, does.)
    spec = SearchSpec(
        program=softmax_rows(),
        max_kernel_ops=2,
        max_block_ops=3,
        max_block_nodes=3,
        max_grid_dims=1,
        max_block_outputs=2,
    )
    keys = {}
    for reuse in (True, False):
        found: set[str] = set()
        for task in enumerate_tasks(spec):
            found |= {ugraph_key(c.ugraph) for c in run_task(spec, task, reuse_subtrees=reuse).candidates}
        keys[reuse] = found
    assert keys[True] == keys[False] and keys[True]


@pytest.mark.slow
def test_the_gqa_presets_flash_decoding_task_keeps_flash_decoding() -> None:
    # The rule cuts 584 of the task's 976 last kernels; before the memo's key held the tensors' values, a cut
    # split kernel's (empty) subtree was replayed below FlashDecoding's and the task returned nothing.
    spec = split_kv_preset_spec("gqa_incdec_split_kv")
    path = flash_decoding_path(spec)
    (task,) = [t for t in enumerate_tasks(spec) if tuple(path[: len(t.path)]) == tuple(t.path)]
    res = run_task(spec, task)
    assert res.complete
    assert any(_stable_split_kv_and_combine(c.ugraph) for c in res.candidates)

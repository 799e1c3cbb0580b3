"""Index ties (gensorage.exhaustive.ties): factors, the program's classes, and the laws the search relies on."""

from __future__ import annotations

import pytest
from search_walk import candidates_and_states

from gensorage import opset
from gensorage.exhaustive import search_context
from gensorage.exhaustive.generator import SearchSpec
from gensorage.exhaustive.ties import (
    AXES,
    INSIDE,
    NONE,
    TIES,
    Atoms,
    TieRule,
    Ties,
    input_ties,
    loop_concat,
    loop_sum,
    norm,
    saved_ties,
    take_major,
    tie,
    tile_ties,
)
from gensorage.opset import Op
from gensorage.program import Program, load_config
from gensorage.ugraph import examples
from gensorage.ugraph.ir import (
    Accumulator,
    BlockOp,
    GraphDefinedOp,
    InputIterator,
    KernelGraph,
    KernelOp,
    OutputSaver,
    ThreadGraph,
)


def atom(inp: int, axis: int, inside: bool = False) -> int:
    return inp * AXES + axis | (INSIDE if inside else 0)


def A(*atoms: int) -> Atoms:
    return frozenset(atoms)


# ------------------------------------------------------------------------------------------------ factors


def test_tie_refines_both_sides_and_unions_atoms() -> None:
    a, b, c = A(1), A(2), A(3)
    assert tie(((16, a),), ((2, b), (8, c))) == ((2, a | b), (8, a | c))
    assert tie(((4, a), (4, b)), ((2, c), (8, c))) == ((4, a | c), (4, b | c))  # (2, a|c)(2, a|c) made one
    assert tie((), ((4, a),)) == ((4, a),)
    assert tie(((2, a), (3, b)), ((3, c), (2, c))) is None  # 2·3 against 3·2: no common refinement


def test_take_major_and_norm() -> None:
    a, b = A(1), A(2)
    assert take_major(((16, a),), 4) == (((4, a),), ((4, a),))
    assert take_major(((2, a), (8, b)), 4) == (((2, a), (2, b)), ((4, b),))
    assert take_major(((3, a),), 2) is None
    assert norm(((2, a), (8, a), (4, b))) == ((16, a), (4, b))


def test_ops_tie_and_bind() -> None:
    q = input_ties(0, (4, 1, 8))  # [heads, s, d]
    k = input_ties(1, (4, 8, 16))  # [heads, d, n]
    s = TIES.matmul(q, k)
    assert s.shape == (4, 1, 16)
    assert s.dims == (((4, A(atom(0, 0), atom(1, 0))),), (), ((16, A(atom(1, 2))),))
    assert s.bound == {A(atom(0, 2), atom(1, 1))}  # the contraction ties Q's d with K's d
    e = TIES.exp(s)
    assert e.dims[2] == ((16, A(atom(1, 2, inside=True))),)
    z = TIES.reduce_sum(e, 2, True)
    assert A(atom(1, 2, inside=True)) in z.bound and z.dims[2] == ()
    # Summing K over its head dim alone is a different class from the dot product's.
    lone = TIES.reduce_sum(k, 1, True)
    assert lone.bound == {A(atom(1, 1))}


def test_reshape_regroups_factors_and_repeat_adds_a_copy_factor() -> None:
    x = input_ties(0, (4, 6))
    r = TIES.reshape(x, (2, 12))
    assert r.dims == (((2, A(0)),), ((2, A(0)), (6, A(1))))
    assert TIES.reshape(r, (4, 6)).dims == x.dims
    assert not TIES.reshape(input_ties(0, (2, 3)), (3, 2)).known
    rep = TIES.repeat(input_ties(0, (2, 5)), 0, 3)
    assert rep.dims[0] == ((2, A(0)), (3, NONE))


def test_block_tiles_loops_and_savers() -> None:
    k = input_ties(1, (2, 8, 16))
    t = tile_ties(k, (0, 2), 2, (1, 8, 4), (2, 2), 2)  # grid 2x2 over heads and n; loop of 2 over n
    assert t.grid == (((2, A(atom(1, 0))),), ((2, A(atom(1, 2))),))
    assert t.loop == ((2, A(atom(1, 2))),) and t.dims[2] == ((4, A(atom(1, 2))),) and t.dims[0] == ()
    summed = loop_sum(TIES.reduce_sum(t, 2, True))
    assert summed.bound == {A(atom(1, 2))}  # tile sum and loop sum: the same index, one class
    laid = loop_concat(t, 2, 2)
    assert laid.dims[2] == ((8, A(atom(1, 2))),)
    out = saved_ties(laid, (0, 2), (2, 2))
    assert out.shape == (2, 8, 16) and out.dims == k.dims  # the blocks put back together: the input's own ties


# ------------------------------------------------------------------------------------------------ the rule


def test_attention_classes() -> None:
    program = load_config("gqa_incdec", {"b": 1, "kv": 2, "g": 2, "s": 1, "n": 16, "d": 8})
    rule = TieRule.for_search(program, [Op.MUL, Op.DIV, Op.EXP, Op.SUM, Op.MATMUL])
    assert rule is not None
    qk = A(atom(0, 2), atom(1, 1))  # Q's d with K's d
    denominator = A(atom(1, 2, inside=True))  # K's n, inside exp
    numerator = A(atom(1, 2, inside=True), atom(2, 1))  # ... with V's n
    assert rule.classes == {qk, denominator, numerator}
    assert TieRule.for_search(program, [Op.ADD, Op.SUM]) is None  # add splits sums: the rule is off


def test_missing_counts_classes_no_tensor_has() -> None:
    rule = TieRule(frozenset({A(1), A(2), A(3)}))
    t = Ties((4,), ((), ), frozenset({A(1)}))
    assert rule.missing([t]) == 2
    assert rule.missing([t, Ties((4,), ((),), frozenset({A(2), A(3)}))]) == 0
    assert rule.missing([t, Ties((4,), ((),), known=False)]) == 0  # unknown: the bound is not applied


def _graph_ties(kg: KernelGraph) -> dict[tuple[int, int], Ties]:
    """Every kernel tensor's ties in a µGraph, by (node, output), block graphs included."""
    vals: dict[tuple[int, int], Ties] = {(i, 0): input_ties(i, s.shape) for i, s in enumerate(kg.inputs)}
    for k, op in enumerate(kg.ops, start=len(kg.inputs)):
        ins = [vals[(r.node, r.out)] for r in op.inputs]
        if isinstance(op, KernelOp):
            got = [opset.apply(op.op, TIES, ins, op.attrs)]
        else:
            assert isinstance(op, GraphDefinedOp)
            got = _block_ties(op, ins)
        for j, t in enumerate(got):
            vals[(k, j)] = t
    return vals


def _block_ties(op: GraphDefinedOp, ins: list[Ties]) -> list[Ties]:
    b = op.block
    vals: dict[tuple[int, int], Ties] = {}
    saved = []
    for n, node in enumerate(b.nodes):
        if isinstance(node, InputIterator):
            t = ins[node.input]
            tile = list(t.shape)
            for g, d in enumerate(node.imap):
                if d is not None:
                    tile[d] //= b.grid[g]
            if node.fmap is not None:
                tile[node.fmap] //= b.forloop
            vals[(n, 0)] = tile_ties(t, node.imap, node.fmap, tuple(tile), b.grid, b.forloop)
        elif isinstance(node, BlockOp):
            vals[(n, 0)] = opset.apply(node.op, TIES, [vals[(r.node, r.out)] for r in node.inputs], node.attrs)
        elif isinstance(node, ThreadGraph):
            local = [vals[(r.node, r.out)] for r in node.inputs]
            for top in node.ops:
                local.append(opset.apply(top.op, TIES, [local[r.node] for r in top.inputs], top.attrs))
            for j, r in enumerate(node.outputs):
                vals[(n, j)] = local[r.node]
        elif isinstance(node, Accumulator):
            x = vals[(node.input.node, node.input.out)]
            vals[(n, 0)] = loop_sum(x) if node.fmap is None else loop_concat(x, b.forloop, node.fmap)
        else:
            assert isinstance(node, OutputSaver)
            saved.append(saved_ties(vals[(node.input.node, node.input.out)], node.omap, b.grid))
    return saved


EXAMPLES = {
    "gqa": lambda: examples.gqa(),
    "flash_attention": lambda: examples.flash_attention(),
    "flash_decoding": lambda: examples.flash_decoding(),
    "rmsnorm_matmul": lambda: examples.rmsnorm_matmul(),
    "gated_mlp": lambda: examples.gated_mlp(),
    "qknorm_attention": lambda: examples.qknorm_attention(),
}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_the_papers_ugraphs_keep_the_programs_classes(name: str) -> None:
    """A correct µGraph is never pruned: every tensor's classes are the program's, and the output has them all
    (so the missing-class bound never exceeds what the µGraph itself spends)."""
    program, kg = EXAMPLES[name]()
    assert isinstance(program, Program)
    rule = TieRule.for_search(program, [n.op for n in program.nodes if n.op is not None])
    assert rule is not None and rule.classes
    ties = _graph_ties(kg)
    assert all(t.known for t in ties.values())
    assert all(rule.admits(t) for t in ties.values())
    assert rule.missing([ties[(r.node, r.out)] for r in kg.outputs]) == 0


# ------------------------------------------------------------------------------------------------ the law


def _dot_exp() -> Program:
    p = Program("dot_exp")
    p.output(p.exp(p.matmul(p.input("X", (2, 4)), p.input("W", (4, 3)))))
    return p


def _row_softmax_matmul(n: int, o: int) -> Program:
    p = Program("row_softmax_matmul")
    e = p.exp(p.input("X", (2, n)))
    p.output(p.matmul(p.div(e, p.sum(e, dim=1)), p.input("W", (n, o))))
    return p


@pytest.mark.parametrize(("program", "kernels", "block_ops", "nodes"), [
    (_dot_exp(), 2, 2, None),
    (_row_softmax_matmul(4, 3), 1, 4, 6),  # attention's shape: fused in one kernel
    (_row_softmax_matmul(4, 2), 2, 3, 4),  # ... or in two
])
def test_the_rule_keeps_every_candidate(program: Program, kernels: int, block_ops: int, nodes: int | None,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """With and without the tie rule (classes and the missing-class bound), the same candidates; with it, fewer
    states."""
    spec = SearchSpec(program=program, max_kernel_ops=kernels, max_block_ops=block_ops, max_block_nodes=nodes,
                      max_grid_dims=1, max_block_outputs=2)
    with_rule, states_with = candidates_and_states(spec)
    monkeypatch.setattr(search_context.TieRule, "for_search", staticmethod(lambda *a: None))
    without_rule, states_without = candidates_and_states(spec)
    assert with_rule == without_rule and with_rule
    assert states_with < states_without

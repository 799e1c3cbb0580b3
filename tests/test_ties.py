"""Index ties (gensorage.exhaustive.expr.ties) and the tie rule (gensorage.exhaustive.rules.ties): factors, the
program's classes, and the laws the search relies on."""

from __future__ import annotations

import pytest
from search_walk import candidates_and_states

from gensorage import opset
from gensorage.exhaustive import SearchSpec
from gensorage.exhaustive.expr.ties import (
    AXES,
    COPIES,
    INSIDE,
    NONE,
    STRIDE,
    TIES,
    Atoms,
    TieArith,
    Ties,
    base,
    holds_copies,
    input_ties,
    loop_concat,
    loop_sum,
    norm,
    saved_ties,
    take_major,
    tie,
    tile_ties,
)
from gensorage.exhaustive.rules import ruleset
from gensorage.exhaustive.rules.ties import TieRule
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


def atom(inp: int, axis: int, inside: bool = False, stride: int = 1) -> int:
    """An atom part: axis ``axis`` of input ``inp`` (``inside`` a non-linear function) at ``stride``."""
    return (inp * AXES + axis | (INSIDE if inside else 0)) + stride * STRIDE


def A(*atoms: int) -> Atoms:
    return frozenset(atoms)


def C(*parts: int) -> frozenset[Atoms]:
    """The class of a reduction over one index whose factors all carry ``parts`` (strides dropped)."""
    return frozenset({frozenset(base(p) for p in parts)})


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
    assert s.bound == {C(atom(0, 2), atom(1, 1))}  # the contraction ties Q's d with K's d
    e = TIES.exp(s)
    assert e.dims[2] == ((16, A(atom(1, 2, inside=True))),)
    z = TIES.reduce_sum(e, 2, True)
    assert C(atom(1, 2, inside=True)) in z.bound and z.dims[2] == ()
    # Summing K over its head dim alone is a different class from the dot product's.
    lone = TIES.reduce_sum(k, 1, True)
    assert lone.bound == {C(atom(1, 1))}


def test_reshape_regroups_factors_and_repeat_adds_a_copy_factor() -> None:
    x = input_ties(0, (4, 6))
    r = TIES.reshape(x, (2, 12))
    # The major piece of an axis of 4 steps by 2 along it; the minor piece by 1.
    assert r.dims == (((2, A(atom(0, 0, stride=2))),), ((2, A(atom(0, 0))), (6, A(atom(0, 1)))))
    assert TIES.reshape(r, (4, 6)).dims == x.dims
    assert not TIES.reshape(input_ties(0, (2, 3)), (3, 2)).known
    rep = TIES.repeat(input_ties(0, (2, 5)), 0, 3)
    assert rep.dims[0] == ((2, A(atom(0, 0))), (3, NONE))


def test_block_tiles_loops_and_savers() -> None:
    k = input_ties(1, (2, 8, 16))
    t = tile_ties(k, (0, 2), 2, (1, 8, 4), (2, 2), 2)  # grid 2x2 over heads and n; loop of 2 over n
    # n = 16 as blocks (stride 8) x loop (stride 4) x tile (stride 1)
    assert t.grid == (((2, A(atom(1, 0))),), ((2, A(atom(1, 2, stride=8))),))
    assert (
        t.loop == ((2, A(atom(1, 2, stride=4))),) and t.dims[2] == ((4, A(atom(1, 2))),) and t.dims[0] == ()
    )
    summed = loop_sum(TIES.reduce_sum(t, 2, True))
    assert summed.bound == {C(atom(1, 2))}  # tile sum and loop sum: the same index, one class
    laid = loop_concat(t, 2, 2)
    assert laid.dims[2] == ((8, A(atom(1, 2))),)
    out = saved_ties(laid, (0, 2), (2, 2))
    assert (
        out.shape == (2, 8, 16) and out.dims == k.dims
    )  # the blocks put back together: the input's own ties


def test_strides_follow_the_pieces_of_an_axis() -> None:
    x = input_ties(0, (16,))
    major, rest = take_major(x.dims[0], 4)  # type: ignore[misc]
    assert major == ((4, A(atom(0, 0, stride=4))),) and rest == ((4, A(atom(0, 0))),)
    # Pieces in order make the axis again; the same pieces swapped are another index (a transpose).
    assert norm(major + rest) == x.dims[0]
    assert norm(rest + major) == rest + major
    # A tie of an unsplit axis with a split one: each piece carries the other axis's piece at its own stride.
    y = input_ties(1, (16,))
    assert tie(y.dims[0], major + rest) == ((16, A(atom(1, 0), atom(0, 0))),)  # the pieces line up: one index
    assert tie(y.dims[0], rest + major) == (
        (4, A(atom(1, 0, stride=4), atom(0, 0))),
        (4, A(atom(1, 0), atom(0, 0, stride=4))),
    )


def _gqa_rule() -> TieRule:
    program = load_config("gqa_incdec_papers", {"b": 1, "kv": 2, "g": 2, "s": 1, "n": 16, "d": 8})
    rule = TieRule.for_search(program, [Op.MUL, Op.DIV, Op.EXP, Op.SUM, Op.MATMUL, Op.REPEAT])
    assert rule is not None
    return rule


def test_links_admit_the_programs_ties_only() -> None:
    rule = _gqa_rule()  # Q [4 heads, 1, 8], K [2 kv heads, 8, 16], V [2, 16, 8]; head h reads kv head h // 2
    links = rule.links
    assert links is not None
    q_major, q_minor, kv_k = atom(0, 0, stride=2), atom(0, 0), atom(1, 0)
    assert links.admits(A(q_major, kv_k))  # QKᵀ: head h with kv head h // 2
    assert not links.admits(A(q_minor, kv_k))  # head h with kv head h % 2: another program
    assert not links.admits(A(atom(0, 2), atom(1, 2)))  # Q's d with K's keys: never tied
    # P·V ties V to the probabilities, whose Q and K atoms are inside exp.
    inside = atom(0, 0, inside=True, stride=2), atom(1, 0, inside=True)
    assert links.admits(A(*inside, atom(2, 0))) and not links.admits(A(q_major, atom(2, 0)))
    assert links.admits(A(inside[1], atom(2, 0)))  # never one index in the program; linked through Q's heads
    keys_k, keys_v = atom(1, 2, inside=True, stride=4), atom(2, 1, stride=4)
    assert links.admits(A(keys_k, keys_v))  # the same piece of K's and V's keys
    assert not links.admits(A(keys_k, atom(2, 1)))  # ... two different pieces


def test_misaligned_operators_are_marked_and_refused() -> None:
    rule = _gqa_rule()
    q = input_ties(0, (4, 1, 8))
    k = input_ties(1, (2, 8, 16))
    grouped = rule.arith.matmul(q, rule.arith.repeat(k, 0, 2))  # each kv head twice in a row: the program's
    assert grouped.aligned and rule.admits(grouped)
    # Copies in front (kv head h % 2): the same classes, but Q's minor head piece tied to K's kv heads.
    interleaved = rule.arith.matmul(
        q, rule.arith.reshape(rule.arith.repeat(rule.arith.reshape(k, (1, 2, 128)), 0, 2), (4, 8, 16))
    )
    assert interleaved.bound == grouped.bound
    assert not interleaved.aligned and not rule.admits(interleaved)
    assert not rule.arith.exp(interleaved).aligned  # and everything computed from it


def test_a_sum_over_copies_is_its_own_class() -> None:
    x = input_ties(0, (2, 5))
    copies = TIES.repeat(x, 1, 3)  # [2, 15]: each element three times
    assert TIES.reduce_sum(copies, 1, False).bound == {frozenset({frozenset({base(atom(0, 1))}), COPIES})}
    assert TIES.reduce_sum(TIES.repeat(TIES.reshape(x, (2, 5, 1)), 2, 3), 2, False).bound == {
        frozenset({COPIES})
    }
    assert TIES.reduce_max(copies, 1, False).bound == {
        C(atom(0, 1))
    }  # a maximum over copies is any one of them
    assert holds_copies(copies) and not holds_copies(x)


def test_a_sum_over_untied_indices_is_not_a_sum_over_tied_ones() -> None:
    x, y = input_ties(0, (4, 1)), input_ties(1, (1, 4))
    outer = TIES.reshape(TIES.mul(x, y), (16,))  # x_i * y_j: no index ties x's axis to y's
    dot = TIES.mul(input_ties(0, (4,)), input_ties(1, (4,)))  # x_i * y_i
    assert TIES.reduce_sum(outer, 0, False).bound == {
        frozenset({frozenset({base(atom(0, 0))}), frozenset({base(atom(1, 1))})})
    }
    assert TIES.reduce_sum(dot, 0, False).bound == {C(atom(0, 0), atom(1, 0))}


# ------------------------------------------------------------------------------------------------ the rule


def test_attention_classes() -> None:
    program = load_config("gqa_incdec_papers", {"b": 1, "kv": 2, "g": 2, "s": 1, "n": 16, "d": 8})
    rule = TieRule.for_search(program, [Op.MUL, Op.DIV, Op.EXP, Op.SUM, Op.MATMUL])
    assert rule is not None
    qk = C(atom(0, 2), atom(1, 1))  # Q's d with K's d
    denominator = C(atom(1, 2, inside=True))  # K's n, inside exp
    numerator = C(atom(1, 2, inside=True), atom(2, 1))  # ... with V's n
    assert rule.classes == {qk, denominator, numerator}
    assert TieRule.for_search(program, [Op.ADD, Op.SUM]) is None  # add splits sums: the rule is off


def test_missing_counts_classes_no_tensor_has() -> None:
    rule = TieRule(frozenset({A(1), A(2), A(3)}))
    t = Ties((4,), ((),), frozenset({A(1)}))
    assert rule.missing([t]) == 2
    assert rule.missing([t, Ties((4,), ((),), frozenset({A(2), A(3)}))]) == 0
    assert rule.missing([t, Ties((4,), ((),), known=False)]) == 0  # unknown: the bound is not applied


def _graph_ties(kg: KernelGraph, arith: TieArith = TIES) -> dict[tuple[int, int], Ties]:
    """Every kernel tensor's ties in a µGraph, by (node, output), block graphs included."""
    vals: dict[tuple[int, int], Ties] = {(i, 0): input_ties(i, s.shape) for i, s in enumerate(kg.inputs)}
    for k, op in enumerate(kg.ops, start=len(kg.inputs)):
        ins = [vals[(r.node, r.out)] for r in op.inputs]
        if isinstance(op, KernelOp):
            got = [opset.apply(op.op, arith, ins, op.attrs)]
        else:
            assert isinstance(op, GraphDefinedOp)
            got = _block_ties(op, ins, arith)
        for j, t in enumerate(got):
            vals[(k, j)] = t
    return vals


def _block_ties(op: GraphDefinedOp, ins: list[Ties], arith: TieArith) -> list[Ties]:
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
            vals[(n, 0)] = opset.apply(
                node.op, arith, [vals[(r.node, r.out)] for r in node.inputs], node.attrs
            )
        elif isinstance(node, ThreadGraph):
            local = [vals[(r.node, r.out)] for r in node.inputs]
            for top in node.ops:
                local.append(opset.apply(top.op, arith, [local[r.node] for r in top.inputs], top.attrs))
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
    """A correct µGraph is never pruned: every tensor's classes are the program's, every tie one the program
    makes, and the output has every class (so the missing-class bound never exceeds what the µGraph spends)."""
    program, kg = EXAMPLES[name]()
    assert isinstance(program, Program)
    rule = TieRule.for_search(program, [n.op for n in program.nodes if n.op is not None])
    assert rule is not None and rule.classes
    ties = _graph_ties(kg, rule.arith)
    assert all(t.known for t in ties.values())
    assert all(t.aligned and rule.admits(t) for t in ties.values())
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


def _grouped_dot() -> Program:
    """GQA's grouping at its smallest: row h of Q against row h // 2 of K, then exp."""
    p = Program("grouped_dot")
    k = p.repeat(p.input("K", (2, 3)), dim=0, times=2)
    p.output(p.exp(p.sum(p.mul(p.input("Q", (4, 3)), k), dim=1)))
    return p


@pytest.mark.parametrize(
    ("program", "kernels", "block_ops", "nodes"),
    [
        (_dot_exp(), 2, 2, None),
        (_grouped_dot(), 1, 4, 6),  # the links: K's rows tied to Q's row pairs, never to single rows
        (_row_softmax_matmul(4, 3), 1, 4, 6),  # attention's shape: fused in one kernel
        (_row_softmax_matmul(4, 2), 2, 3, 4),  # ... or in two
    ],
)
def test_the_rule_keeps_every_candidate(
    program: Program, kernels: int, block_ops: int, nodes: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With and without the tie rule (classes and the missing-class bound), the same candidates; with it, fewer
    states."""
    spec = SearchSpec(
        program=program,
        max_kernel_ops=kernels,
        max_block_ops=block_ops,
        max_block_nodes=nodes,
        max_grid_dims=1,
        max_block_outputs=2,
    )
    with_rule, states_with = candidates_and_states(spec)
    monkeypatch.setattr(ruleset.TieRule, "for_search", staticmethod(lambda *a: None))
    without_rule, states_without = candidates_and_states(spec)
    assert with_rule == without_rule and with_rule
    assert states_with < states_without

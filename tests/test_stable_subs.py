"""``SearchSpec(sub_stabilises_only=True)``: a ``sub`` only as a stable softmax's ``x − max(x)``, read by ``exp``;
``SearchSpec(exp_stabilised_only=True)``: an ``exp`` only of a ``sub``."""

from __future__ import annotations

import dataclasses
from builtins import sum as sum_

import pytest

from gensorage.errors import ConfigError
from gensorage.exhaustive import SearchSpec, run_task, search_serial
from gensorage.exhaustive.expr.abstract_expr import add, max_r, sum, var
from gensorage.exhaustive.walk.stable_subs import stabilises
from gensorage.opset import Op
from gensorage.program import Program
from gensorage.ugraph import examples
from gensorage.ugraph.ir import BlockOp, KernelGraph, KernelOp, ThreadGraph, ThreadOp
from tests.test_rediscovery import _transpose_k_task

S = sum(5, var("Q"))


@pytest.mark.parametrize(
    ("minuend", "subtrahend", "want"),
    [
        (S, max_r(7, S), True),  # a tile's or row's maximum of the scores
        (max_r(7, S), max_r(14, S), True),  # FlashDecoding's combine: m_i − max over the splits
        (max_r(14, S), max_r(7, S), False),  # a smaller maximum than the minuend's
        (max_r(7, S), S, False),  # max(x) − x: a maximum as minuend
        (S, max_r(7, var("K")), False),  # the maximum of other rows
        (S, var("K"), False),  # no maximum
        (add(S, max_r(7, S)), max_r(7, S), False),  # (S − m) − m: a sub's result again
    ],
)
def test_stabilises(minuend: object, subtrahend: object, want: bool) -> None:
    assert stabilises(minuend, subtrahend) is want  # type: ignore[arg-type]


def _exp_of_difference() -> Program:
    p = Program("exp_diff")
    x, y = (p.input(name, (4, 8), "float32") for name in "XY")
    p.output(p.exp(p.sub(x, y)))
    return p


def _subs(g: KernelGraph) -> int:
    """The µGraph's sub operators, pre-defined and block-level."""
    out = 0
    for op in g.ops:
        if isinstance(op, KernelOp):
            out += op.op is Op.SUB
        else:
            for n in op.block.nodes:  # block operators, and thread graphs' (thread fusion)
                inner = n.ops if isinstance(n, ThreadGraph) else (n,)
                out += sum_(isinstance(t, BlockOp | ThreadOp) and t.op is Op.SUB for t in inner)
    return out


def test_a_difference_that_stabilises_nothing_is_no_longer_searched() -> None:
    # exp(X − Y): correct µGraphs exist (a pre-defined sub, or one kernel of sub and exp), and the restriction
    # removes all of them: Y is no maximum of X. It narrows the space; it is no pruning rule.
    spec = SearchSpec(program=_exp_of_difference(), max_kernel_ops=1, max_block_ops=2, max_grid_dims=1)
    plain = search_serial(spec)
    assert plain.complete and plain.candidates
    assert all(_subs(c.ugraph) == 1 for c in plain.candidates)
    narrow = search_serial(dataclasses.replace(spec, sub_stabilises_only=True))
    assert narrow.complete and not narrow.candidates


def test_an_exp_of_no_difference_is_no_longer_searched() -> None:
    # exp(X) then a sum: the unstable form of an exponential; with exp_stabilised_only no µGraph is left.
    p = Program("exp_sum")
    x = p.input("X", (4, 8), "float32")
    p.output(p.sum(p.exp(x), 1, keepdim=True))
    spec = SearchSpec(program=p, max_kernel_ops=2, max_block_ops=2, max_grid_dims=1)
    plain = search_serial(spec)
    assert plain.complete and plain.candidates
    narrow = search_serial(dataclasses.replace(spec, exp_stabilised_only=True))
    assert narrow.complete and not narrow.candidates


def test_flash_attention2_is_found_as_without_the_restrictions() -> None:
    # FlashAttention-2 has no sub and no exp operator (the online accumulators subtract the running maximum
    # and exponentiate inside) and concatenates nothing: the stable prefill search finds the same candidates
    # with the split-KV presets' three restrictions (loop_concats off: tests/test_loop_concats.py).
    program, _ = examples.flash_attention2(heads=2, q_len=3, kv_len=4, head_dim=5, q_blocks=1, forloop=2)
    spec = SearchSpec(
        program=program, max_kernel_ops=2, max_block_ops=3, max_grid_dims=1, max_block_outputs=1
    )
    plain = run_task(spec, _transpose_k_task(spec))
    narrow_spec = dataclasses.replace(
        spec, sub_stabilises_only=True, exp_stabilised_only=True, loop_concats=False
    )
    narrow = run_task(narrow_spec, _transpose_k_task(narrow_spec))
    assert plain.complete and narrow.complete and plain.candidates
    assert [c.ugraph for c in narrow.candidates] == [c.ugraph for c in plain.candidates]
    assert narrow.stats.states <= plain.stats.states


def test_the_knob_is_a_spec_field_that_keeps_old_keys() -> None:
    spec = SearchSpec(program=_exp_of_difference())
    assert "sub_stabilises_only" not in spec.to_json()  # specs written before it keep their checkpoint keys
    on = dataclasses.replace(spec, sub_stabilises_only=True)
    assert on.to_json()["sub_stabilises_only"] is True
    assert SearchSpec.from_json(on.to_json()) == on and on.key() != spec.key()
    with pytest.raises(ConfigError, match="sub_stabilises_only must be true or false"):
        dataclasses.replace(spec, sub_stabilises_only=1)  # type: ignore[arg-type]
    assert "exp_stabilised_only" not in spec.to_json()
    both = dataclasses.replace(on, exp_stabilised_only=True)
    assert SearchSpec.from_json(both.to_json()) == both and both.key() != on.key()
    with pytest.raises(ConfigError, match="exp_stabilised_only must be true or false"):
        dataclasses.replace(spec, exp_stabilised_only="yes")  # type: ignore[arg-type]

"""Mutants of valid µGraphs that compute a different function must be rejected by the verifier."""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import cache

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gensorage.errors import NotLaxError
from gensorage.program import Program
from gensorage.ugraph import KernelGraph, from_program
from gensorage.ugraph.examples import EXAMPLES, flash_attention, flash_decoding
from gensorage.verify import equivalent
from gensorage.verify.mutate import MUTATIONS, differs_numerically, mutants, mutate


def layout_case() -> tuple[Program, KernelGraph]:
    """A direct µGraph with a concat and a repeat whose dims/factors can change without breaking shapes."""
    p = Program("layout")
    x, y = p.input("X", (4, 4)), p.input("Y", (4, 4))
    w = p.input("W", (8, 3))
    z = p.reshape(p.concat([x, y], 0), (4, 8))
    p.output(p.add(p.matmul(z, w), p.sum(p.repeat(x, 1, 2), dim=1)))
    return p, from_program(p)


def real_model_case() -> tuple[Program, KernelGraph]:
    """The ops real models write that the field verifier interprets: a transpose of a cube (so another pair of
    dims keeps the shape) and an epsilon (add_scalar)."""
    p = Program("real_model")
    x = p.input("X", (3, 3, 3))
    t = p.transpose(x, 0, 1)
    p.output(p.div(t, p.sqrt(p.add(p.sum(p.mul(t, t), 2), 1e-6))))
    return p, from_program(p)


def rotate_half_case() -> tuple[Program, KernelGraph]:
    """RoPE's rotate_half: two windows of the last dim, whose starts can move by one without changing shapes."""
    p = Program("rotate_half")
    x = p.input("X", (2, 3, 8))
    rotated = p.concat([p.scale(p.slice(x, -1, 5, 8), -1.0), p.slice(x, -1, 1, 4)], -1)  # windows with room
    s = p.slice(x, 2, 1, 7)
    p.output(p.add(p.mul(s, s), rotated))
    return p, from_program(p)


# Every paper example at its default (small) shapes, plus shapes/programs where the size-changing mutations
# (fmap, repeat, concat dim) can give valid graphs: FlashAttention with a loop that also divides the Q tile,
# GQA the FlashDecoding way (Repeat kernels), and the layout case.
CASES: dict[str, Callable[[], tuple[Program, KernelGraph]]] = {
    **{name: f for name, f in EXAMPLES.items()},
    "flash_attention_loop2": lambda: flash_attention(forloop=2),
    "flash_decoding_gqa": lambda: flash_decoding(group=2),
    "layout": layout_case,
    "real_model": real_model_case,
    "rotate_half": rotate_half_case,
}


@cache
def case(name: str) -> tuple[Program, KernelGraph]:
    return CASES[name]()


def rejected(prog: Program, graph: KernelGraph) -> bool:
    """The verifier's verdict on a mutant (a Lax violation the mutation introduced also counts as refusal)."""
    try:
        return not equivalent(prog, graph, seed=0, max_trials=8)
    except NotLaxError:
        return True


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(st.sampled_from(sorted(CASES)), st.sampled_from(sorted(MUTATIONS)), st.integers(0, 2**32 - 1))
def test_numerically_different_mutants_are_rejected(name: str, kind: str, seed: int) -> None:
    prog, graph = case(name)
    m = mutate(graph, random.Random(seed), kind)
    assume(m is not None)
    assert m is not None
    assume(differs_numerically(graph, m.graph))
    assert rejected(prog, m.graph), f"{name}: {kind} mutant accepted"


@pytest.mark.parametrize("kind", sorted(MUTATIONS))
def test_every_mutation_kind_produces_rejected_mutants(kind: str) -> None:
    """Each operator yields valid, numerically different mutants on some example, all of them rejected."""
    found = 0
    for name in sorted(CASES):
        prog, graph = case(name)
        for m in mutants(graph, 4, seed=11, kinds=[kind], attempts=20):
            assert m.kind == kind and m.graph != graph and m.graph.is_valid()
            if differs_numerically(graph, m.graph):
                found += 1
                assert rejected(prog, m.graph), f"{name}: {kind} mutant accepted"
    assert found > 0, f"no valid, different {kind} mutant on any example"


def test_equivalent_mutants_are_not_counted() -> None:
    """Swapping the operands of a commutative op is no mutation: the swap operator skips it."""
    prog, graph = case("lora")
    for m in mutants(graph, 20, seed=0, kinds=["swap_inputs"]):
        assert differs_numerically(graph, m.graph)

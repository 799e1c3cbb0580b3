"""``SearchSpec(loop_concats=False)``: no for-loop accumulator concatenates its iterations, a restriction of the
space (docs/search.md, "Restrictions of the space"), which the split-KV decode presets set."""

from __future__ import annotations

import dataclasses

import pytest
from test_constants import _stable_softmax  # the same program the constants rules are tested on

from gensorage.errors import ConfigError
from gensorage.exhaustive import SearchResult, SearchSpec, search_serial
from gensorage.ugraph.ir import Accumulator, GraphDefinedOp, KernelGraph


def _concatenations(g: KernelGraph) -> int:
    """The µGraph's concatenating accumulators."""
    return sum(
        isinstance(n, Accumulator) and n.fmap is not None
        for op in g.ops
        if isinstance(op, GraphDefinedOp)
        for n in op.block.nodes
    )


def _both(block_ops: int) -> tuple[SearchResult, SearchResult]:
    spec = SearchSpec(
        program=_stable_softmax(),
        max_kernel_ops=1,
        max_block_ops=block_ops,
        max_grid_dims=1,
        max_block_outputs=1,
    )
    return search_serial(spec), search_serial(dataclasses.replace(spec, loop_concats=False))


def test_a_loop_that_gathers_its_tiles_is_no_longer_searched() -> None:
    # At four block operators the stable softmax's only fused kernel concatenates the loop's tiles of X − max X
    # before its exp: a correct µGraph, which the restriction drops (it narrows the space; it is no pruning rule).
    plain, narrow = _both(4)
    assert plain.complete and narrow.complete
    assert plain.candidates and all(_concatenations(c.ugraph) for c in plain.candidates)
    assert not narrow.candidates
    assert narrow.stats.states < plain.stats.states


@pytest.mark.slow
def test_it_drops_exactly_the_concatenating_candidates() -> None:
    # At five block operators: 5 candidates, 4 of which concatenate; the restricted search finds the other one,
    # in 14,978 states against 322,940 (dev, 2026-11-27).
    plain, narrow = _both(5)
    assert plain.complete and narrow.complete
    kept = [c.ugraph for c in plain.candidates if not _concatenations(c.ugraph)]
    assert kept and len(kept) < len(plain.candidates)
    assert [c.ugraph for c in narrow.candidates] == kept
    assert narrow.stats.states < plain.stats.states


def test_the_knob_is_a_spec_field_that_keeps_old_keys() -> None:
    spec = SearchSpec(program=_stable_softmax())
    assert "loop_concats" not in spec.to_json()  # specs written before it keep their checkpoint keys
    off = dataclasses.replace(spec, loop_concats=False)
    assert off.to_json()["loop_concats"] is False
    assert SearchSpec.from_json(off.to_json()) == off and off.key() != spec.key()
    with pytest.raises(ConfigError, match="loop_concats must be true or false"):
        dataclasses.replace(spec, loop_concats=0)  # type: ignore[arg-type]

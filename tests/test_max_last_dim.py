"""``SearchSpec(max_last_dim_only=True)``: a block-level ``max`` only over its operand's last dim, a restriction of
the space (docs/search.md, "Restrictions of the space"): it removes µGraphs, it adds none."""

from __future__ import annotations

import dataclasses

import pytest
from test_parallel_first import _softmax_spec

from gensorage.errors import ConfigError
from gensorage.exhaustive import search_serial
from gensorage.opset import Op
from gensorage.ugraph.ir import BlockOp, GraphDefinedOp, KernelGraph


def _block_max_dims(g: KernelGraph) -> set[int]:
    """The dims the block-level maxima of ``g`` reduce (thread graphs hold none: a max is no element-wise op)."""
    return {
        int(dict(n.attrs)["dim"])
        for op in g.ops
        if isinstance(op, GraphDefinedOp)
        for n in op.block.nodes
        if isinstance(n, BlockOp) and n.op is Op.MAX
    }


def test_only_last_dim_maxima_and_a_subset_of_the_candidates() -> None:
    # The stable softmax over the rows of X [4, 6] with two grid dims: with the restriction every block max
    # reduces dim 1, the last, every candidate is one the unrestricted search finds too, and the maxima over
    # dim 0 the unrestricted walk tries are gone.
    spec = _softmax_spec()
    full = search_serial(spec)
    narrow = search_serial(dataclasses.replace(spec, max_last_dim_only=True))
    assert full.complete and narrow.complete and narrow.candidates
    assert all(_block_max_dims(c.ugraph) <= {1} for c in narrow.candidates)
    assert {str(c.ugraph) for c in narrow.candidates} <= {str(c.ugraph) for c in full.candidates}
    assert narrow.stats.states < full.stats.states


def test_the_knob_is_a_spec_field_that_keeps_old_keys() -> None:
    spec = _softmax_spec()
    assert "max_last_dim_only" not in spec.to_json()
    on = dataclasses.replace(spec, max_last_dim_only=True)
    assert on.to_json()["max_last_dim_only"] is True
    assert type(spec).from_json(on.to_json()) == on and on.key() != spec.key()
    with pytest.raises(ConfigError, match="max_last_dim_only must be true or false"):
        dataclasses.replace(spec, max_last_dim_only=1)  # type: ignore[arg-type]

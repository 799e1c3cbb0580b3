"""A 2-D matmul at a new row count from its symbolic schedule (gensorage/codegen/matmul_rows.py): the same
block-lowered text as the schedule at that row count, the layer's results as before."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from test_torch_frontend import (  # noqa: E402
    DecoderLayer,
    assert_close,
    gensorage_subgraphs,
    layer_inputs,
)

import gensorage.torch as gtorch  # noqa: E402
from gensorage.codegen import matmul_rows  # noqa: E402
from gensorage.torch import subgraph  # noqa: E402


def test_new_lengths_specialise_the_projections_to_the_scheduled_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Lengths that divide the tiles and lengths that do not (bounds guards), one of them equal to the hidden
    size (64): with :data:`matmul_rows.CHECK` every specialised matmul is also scheduled at its rows and the
    block-lowered texts compared (a difference raises, and the layer would stay in torch); each length runs in
    gensorage, within 1e-4 of the layer in float64 (the answer of a second call: the first is torch's while the
    kernels are checked)."""
    from gensorage.codegen.predefined_matmul import _scheduled
    from gensorage.hw import load_profile
    from gensorage.superopt.dispatch import Dispatcher

    _scheduled.cache_clear()  # lengths another test scheduled would not come here
    monkeypatch.setattr(matmul_rows, "ENABLED", True)
    monkeypatch.setattr(matmul_rows, "CHECK", True)
    monkeypatch.setattr(matmul_rows, "_SYMBOLIC", {})
    # untiered: the tiered llvm first tier runs the generic matmul (gensorage.codegen.generic_matmul) instead
    untiered = Dispatcher(load_profile(subgraph.Options().hw), tiered=False)
    monkeypatch.setattr(subgraph, "_DISPATCHERS", {(subgraph.Options(), None): untiered})
    used = []
    specialised = matmul_rows.specialised

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        out = specialised(*args, **kwargs)
        used.append(out is not None)
        return out

    monkeypatch.setattr(matmul_rows, "specialised", counted)
    torch.manual_seed(0)
    layer = DecoderLayer().eval()
    exact = copy.deepcopy(layer).double()
    compiled = gtorch.compile(layer)
    lengths = (8, 12, 33, 57, 64, 100)
    with torch.no_grad():
        for t in lengths:
            args = layer_inputs(t, torch.float32, seed=t)
            compiled(*args)
            assert_close(compiled(*args), exact(*(a.double() for a in args)), 1e-4)
    assert len(gensorage_subgraphs(compiled.explain())) == len(lengths), compiled.explain()
    assert sum(used) >= 2 * len(lengths), used  # the projections at every length (two keys: q/o, k/v)
    assert any(v is not None for v in matmul_rows._SYMBOLIC.values())


def test_no_symbolic_schedule_for_batched_or_single_row_matmuls() -> None:
    from gensorage.codegen.predefined_matmul import _MatmulShape

    def build(ms, epi):  # type: ignore[no-untyped-def]
        raise AssertionError("not built")

    from gensorage.construction import construct_schedule, matmul_workload
    from gensorage.hw import load_profile

    hw = load_profile("h100")
    one = _MatmulShape((1, 16), (16, 8), (1, 8))
    batched = _MatmulShape((2, 4, 16), (2, 16, 8), (2, 4, 8))
    for ms in (one, batched):
        schedule = construct_schedule(matmul_workload(*ms.dims, "float32"), hw, 0)
        assert matmul_rows.specialised(ms, ("float32",) * 3, schedule, None, build) is None

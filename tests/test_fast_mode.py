"""Fast mode: stored µGraph structures re-instantiated at new shapes (reshape_structure, structure_store, API)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gensorage
from gensorage.errors import StoreError
from gensorage.hw import load_profile
from gensorage.opset import Op
from gensorage.program import dump_program, parse_program
from gensorage.store import Store
from gensorage.superopt import StructureRecord, StructureStore, superoptimize
from gensorage.superopt.reshape_structure import reinstantiate, structure_signature
from gensorage.superopt.size_map import ReshapeFailed, SizeMap, reshape_target, size_map
from gensorage.superopt.structure_store import KIND, record_key
from gensorage.ugraph import GraphDefinedOp, KernelGraph, ThreadGraph, ThreadOp, from_program, validate
from gensorage.ugraph.cost import predict_ugraph_time
from gensorage.ugraph.examples import flash_attention, flash_decoding, gated_mlp, gqa, lora, rmsnorm_matmul
from gensorage.verify.equivalent import equivalent

H100 = load_profile("h100")
ROOT = Path(__file__).resolve().parents[1]


def _cost(g: KernelGraph) -> float:
    return predict_ugraph_time(g, H100)


# (example builder, kwargs at the old shapes, kwargs at the new shapes)
CASES: list[tuple[Callable[..., Any], dict[str, int], dict[str, int]]] = [
    (rmsnorm_matmul, {"batch": 4, "hidden": 16, "out": 12}, {"batch": 8, "hidden": 64, "out": 96}),
    (gated_mlp, {"m": 4, "k": 16, "n": 12}, {"m": 8, "k": 128, "n": 64}),
    (lora, {"m": 4, "k": 8, "n": 12, "rank": 2}, {"m": 8, "k": 32, "n": 48, "rank": 4}),
    (
        flash_attention,
        {"heads": 2, "q_len": 8, "kv_len": 12, "head_dim": 4},
        {"heads": 4, "q_len": 16, "kv_len": 48, "head_dim": 8},
    ),
    (
        flash_decoding,
        {"heads": 4, "kv_len": 24, "head_dim": 4, "group": 2},
        {"heads": 8, "kv_len": 96, "head_dim": 8, "group": 4},
    ),
    (
        gqa,
        {"kv_heads": 2, "group": 4, "q_len": 2, "kv_len": 24, "head_dim": 8},
        {"kv_heads": 2, "group": 8, "q_len": 4, "kv_len": 48, "head_dim": 8},
    ),
]


@pytest.mark.parametrize(("builder", "old_kw", "new_kw"), CASES, ids=[c[0].__name__ for c in CASES])
def test_reinstantiated_paper_graphs_compute_the_new_program(
    builder: Callable[..., Any], old_kw: dict[str, int], new_kw: dict[str, int]
) -> None:
    old, graph = builder(**old_kw, dtype="float32")
    new, _ = builder(**new_kw, dtype="float32")
    g = reinstantiate(graph, old, new, H100, _cost)
    validate(g, H100)
    assert [s.shape for s in g.inputs] == [t.shape for t in new.inputs]
    # The same structure: same kernel count and kinds, same block-node kinds.
    assert [type(op) for op in g.ops] == [type(op) for op in graph.ops]
    for a, b in zip(g.ops, graph.ops, strict=True):
        if isinstance(a, GraphDefinedOp):
            assert [type(n) for n in a.block.nodes] == [type(n) for n in b.block.nodes]  # type: ignore[union-attr]
    x = new.random_inputs(1)
    for got, want in zip(g.run(*x), new.run(*x), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
    assert equivalent(new, g, 1e-6, seed=0, max_trials=8)


def test_reinstantiation_picks_the_cheapest_grid_the_cost_model_knows() -> None:
    old, graph = rmsnorm_matmul(4, 16, 12, blocks=3, forloop=4)
    new = rmsnorm_matmul(16, 256, 1024)[0]
    g = reinstantiate(graph, old, new, H100, _cost)
    best = _cost(g)
    # Every other valid grid/loop choice of the same structure is predicted no faster.
    for blocks in (1, 2, 4, 8, 16, 32, 64, 128):
        for loop in (2, 4, 8, 16):
            other = rmsnorm_matmul(16, 256, 1024, blocks=blocks, forloop=loop)[1]
            if other.is_valid(H100):
                assert _cost(other) >= best - 1e-15


def test_structure_signature_ignores_sizes_only() -> None:
    _, a = rmsnorm_matmul(4, 16, 12, blocks=3, forloop=4)
    _, b = rmsnorm_matmul(8, 16, 24, blocks=2, forloop=2)
    _, no_loop = rmsnorm_matmul(4, 16, 12, blocks=3, forloop=1)
    _, other = gated_mlp(4, 16, 12, blocks=3, forloop=4)
    assert structure_signature(a) == structure_signature(b)
    assert structure_signature(a) != structure_signature(no_loop)
    assert structure_signature(a) != structure_signature(other)


def test_reinstantiation_rejects_another_structure() -> None:
    old, graph = rmsnorm_matmul(4, 16, 12)
    other, _ = gated_mlp(4, 16, 12)
    with pytest.raises(ReshapeFailed, match="structure"):
        reinstantiate(graph, old, other, H100, _cost)


def test_a_graph_with_a_factor_the_program_does_not_have_does_not_carry_over() -> None:
    old, graph = rmsnorm_matmul(4, 16, 12, blocks=3, forloop=4)
    new, _ = rmsnorm_matmul(4, 64, 12)
    broken = _with_thread_op(graph, lambda t: ThreadOp(Op.SCALE, t.inputs, (("factor", 0.123),)))
    with pytest.raises(ReshapeFailed, match="scale factor"):
        reinstantiate(broken, old, new, H100, _cost)


def _with_thread_op(graph: KernelGraph, change: Callable[[ThreadOp], ThreadOp]) -> KernelGraph:
    """``graph`` with the first op of its first thread graph replaced by ``change(op)``."""
    op = graph.ops[0]
    assert isinstance(op, GraphDefinedOp)
    nodes = list(op.block.nodes)
    j = next(i for i, n in enumerate(nodes) if isinstance(n, ThreadGraph))
    tg = nodes[j]
    assert isinstance(tg, ThreadGraph)
    nodes[j] = ThreadGraph(tg.inputs, (change(tg.ops[0]), *tg.ops[1:]), tg.outputs)
    block = dataclasses.replace(op.block, nodes=tuple(nodes))
    return KernelGraph(graph.inputs, (GraphDefinedOp(block, op.inputs), *graph.ops[1:]), graph.outputs)


# ------------------------------------------------------------------------------------------- size mapping


def test_size_map_drops_sizes_that_become_two_different_sizes() -> None:
    text = "param a = 4\nparam b = 4\ninput X [a, b] float32\nO = sum(X, dim=1)\noutput O\n"
    smap = size_map(parse_program(text), parse_program(text, {"a": 8, "b": 16}))
    assert smap.size(4) is None
    assert 4 in smap.ambiguous["size"]
    smap2 = size_map(parse_program(text, {"a": 2}), parse_program(text, {"a": 8, "b": 16}))
    assert smap2.size(2) == 8 and smap2.size(4) == 16


def test_attribute_tables_disambiguate_what_the_size_table_cannot() -> None:
    # The repeat count g equals the head count kv at the old shapes, not at the new ones.
    text = (
        "param kv = 2\nparam g = 2\ninput K [kv, 4] float32\nR = repeat(K, dim=0, times=g)\n"
        "O = scale(R, 1/g)\noutput O\n"
    )
    smap = size_map(parse_program(text), parse_program(text, {"kv": 2, "g": 8}))
    assert smap.size(2) is None
    assert smap.size(2, "times") == 8
    assert smap.factor(0.5) == 0.125


@pytest.mark.parametrize(
    ("old_in", "old_out", "new_in", "want"),
    [
        ((4, 2, 8), (1, 8, 8), (8, 32, 8), (1, 256, 8)),  # merge, unit dim kept
        ((2, 3, 4), (6, 4), (4, 5, 8), (20, 8)),
        ((6, 4), (2, 3, 4), (10, 8), (2, 5, 8)),  # split: the mapped part (2 -> 2) fixes the other
        ((1, 8, 1, 4), (8, 4), (1, 16, 1, 2), (16, 2)),
    ],
)
def test_reshape_target_follows_the_dims(
    old_in: tuple[int, ...], old_out: tuple[int, ...], new_in: tuple[int, ...], want: tuple[int, ...]
) -> None:
    smap = SizeMap()
    smap.add_size(2, 2)
    assert reshape_target(old_in, old_out, new_in, smap, "test") == want


def test_reshape_target_refuses_what_it_cannot_tell() -> None:
    with pytest.raises(ReshapeFailed, match="was 1"):
        reshape_target((4, 1, 8), (32,), (4, 3, 8), SizeMap(), "test")
    with pytest.raises(ReshapeFailed, match="split"):
        reshape_target((6,), (2, 3), (12,), SizeMap(), "test")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 6), min_size=1, max_size=4), st.lists(st.integers(1, 6), min_size=1, max_size=4)
)
def test_merging_reshapes_carry_over_exactly(old: list[int], new: list[int]) -> None:
    """A reshape that flattens a tensor stays a flattening of the new tensor, for any new sizes."""
    n = min(len(old), len(new))
    old_in, new_in = tuple(d + 1 for d in old[:n]), tuple(d + 1 for d in new[:n])
    target = reshape_target(old_in, (math.prod(old_in),), new_in, SizeMap(), "test")
    assert target == (math.prod(new_in),)


# ------------------------------------------------------------------------------------------------ store


def _rmsnorm_record(dtype: str = "float32") -> tuple[StructureRecord, Any]:
    old, graph = rmsnorm_matmul(4, 16, 12, blocks=3, forloop=4, dtype=dtype)
    rec = StructureRecord(
        old.structure_key(),
        "h100",
        gensorage.__version__,
        dump_program(old),
        {},
        (graph,),
        _cost(graph),
        _cost(from_program(old)),
        {"complete": True},
    )
    return rec, old


def test_structure_records_round_trip(tmp_path: Path) -> None:
    rec, _ = _rmsnorm_record()
    with StructureStore(tmp_path / "s.sqlite") as store:
        assert store.get(rec.structure_key, "h100") is None
        store.put(rec)
        got = store.get(rec.structure_key, "h100")
        assert store.get(rec.structure_key, "a100") is None
    assert got is not None
    assert got.ugraphs == rec.ugraphs and got.program_text == rec.program_text and got.created_at > 0
    assert got.program().key() == rec.program().key()


def test_a_corrupt_record_is_a_store_error(tmp_path: Path) -> None:
    rec, _ = _rmsnorm_record()
    with Store(tmp_path / "s.sqlite") as raw:
        raw.put(
            KIND,
            record_key(rec.structure_key, "h100"),
            {"format": "gensorage.ugraph-structure", "version": 1, "ugraphs": "nope"},
        )
        with pytest.raises(StoreError, match="malformed"):
            StructureStore(raw).get(rec.structure_key, "h100")


# ---------------------------------------------------------------------------------------------- fast mode


def _rmsnorm_file(tmp_path: Path) -> Path:
    """configs/programs/rmsnorm.gsp in float32 (so kernels match float64 references closely)."""
    text = (ROOT / "configs" / "programs" / "rmsnorm.gsp").read_text().replace("float16", "float32")
    path = tmp_path / "rmsnorm32.gsp"
    path.write_text(text)
    return path


def test_fast_mode_reuses_a_stored_structure_at_a_new_shape(tmp_path: Path) -> None:
    path = _rmsnorm_file(tmp_path)
    stored = parse_program(path.read_text(), {"b": 4, "h": 16, "d": 12})
    _, graph = rmsnorm_matmul(4, 16, 12, blocks=3, forloop=4, dtype="float32")
    db = tmp_path / "store.sqlite"
    _store_structure(db, stored, graph)
    r = superoptimize(path, params={"b": 8, "h": 64, "d": 256}, mode="fast", store=db, progress=False)
    assert r.mode == "fast" and r.equivalence and r.equivalence.method == "equivalence check"
    # What it chose among, best first by the model: the stored structure (one kernel at these shapes), the
    # direct µGraph and its row-fused form.
    ranked = [(o, t) for o, _, t in r.candidates]
    assert ranked[0] == (r.origin, r.predicted_time_s) and [t for _, t in ranked] == sorted(
        t for _, t in ranked
    )
    assert {o for o, _ in ranked} == {"stored #0", "direct", "fused"}
    carried, t = next((g, t) for o, g, t in r.candidates if o == "stored #0")
    assert len(carried.ops) == 1 and t < r.naive_predicted_time_s
    assert r.from_store == (r.origin == "stored #0") and r.predicted_time_s < r.naive_predicted_time_s
    x = r.program.random_inputs(0)
    np.testing.assert_allclose(carried.run(*x)[0], r.program.run(*x)[0], rtol=1e-9)
    got = r.run(*[a.astype(np.float32) for a in x])
    np.testing.assert_allclose(got[0], r.program.run(*x)[0], rtol=1e-4, atol=1e-4)
    assert "__global__" in r.cuda_source()


def test_fast_mode_without_a_stored_structure_uses_the_direct_ugraph(tmp_path: Path) -> None:
    r = superoptimize(
        _rmsnorm_file(tmp_path),
        params={"b": 2, "h": 8, "d": 4},
        mode="fast",
        store=tmp_path / "empty.sqlite",
        progress=False,
    )
    assert not r.from_store and r.fallback_reason and "no structure" in r.fallback_reason
    # the direct µGraph after row fusion: the normalisation in one kernel, then the matmul
    assert r.origin == "fused" and r.equivalence.method == "equivalence check" and r.equivalence
    assert r.num_kernels == 2 < r.naive_num_kernels == 7 and r.predicted_time_s < r.naive_predicted_time_s


def _store_structure(db: Path, program: Any, graph: KernelGraph, hw: str = "h100") -> None:
    with StructureStore(db) as store:
        store.put(
            StructureRecord(
                program.structure_key(),
                hw,
                gensorage.__version__,
                dump_program(program),
                dict(program.params),
                (graph,),
                _cost(graph),
                _cost(from_program(program)),
            )
        )


def test_fast_mode_falls_back_when_the_stored_structure_is_wrong(tmp_path: Path) -> None:
    path = _rmsnorm_file(tmp_path)
    stored = parse_program(path.read_text(), {"b": 4, "h": 16, "d": 12})
    _, graph = rmsnorm_matmul(4, 16, 12, blocks=3, forloop=4, dtype="float32")
    # The thread graph's scale -> exp: still valid at every shape, but no longer the program.
    wrong = _with_thread_op(graph, lambda t: ThreadOp(Op.EXP, t.inputs))
    assert wrong.is_valid(H100)
    db = tmp_path / "store.sqlite"
    _store_structure(db, stored, wrong)
    r = superoptimize(path, params={"b": 8, "h": 32, "d": 64}, mode="fast", store=db, progress=False)
    assert r.origin in ("direct", "fused") and not r.from_store and r.equivalence and r.fallback_reason
    assert r.candidates[0][0] == "stored #0"  # ranked first by the model, so checked first, and refused
    assert any("rejected by the equivalence check" in n for n in r.notes)


def test_a_stored_structure_is_only_used_for_its_gpu(tmp_path: Path) -> None:
    path = _rmsnorm_file(tmp_path)
    stored = parse_program(path.read_text(), {"b": 4, "h": 16, "d": 12})
    _, graph = rmsnorm_matmul(4, 16, 12, blocks=3, forloop=4, dtype="float32")
    db = tmp_path / "store.sqlite"
    _store_structure(db, stored, graph, hw="a100")
    new = {"b": 4, "h": 32, "d": 24}
    assert not superoptimize(path, params=new, hw="h100", mode="fast", store=db, progress=False).from_store
    assert superoptimize(path, params=new, hw="a100", mode="fast", store=db, progress=False).from_store
    assert not superoptimize(
        path, params=new, hw="a100", mode="fast", store=db, use_store=False, progress=False
    ).from_store


def test_reinstantiation_keeps_broadcasts() -> None:
    """A dim that broadcast in the verified tiles must broadcast the same way after re-instantiation."""
    from gensorage.opset import Op
    from gensorage.superopt.reshape_structure import same_broadcast
    from gensorage.superopt.size_map import ReshapeFailed

    same_broadcast(Op.DIV, [(2, 3, 5), (2, 3, 1)], [(32, 64, 128), (32, 64, 1)], "here")  # broadcast kept
    same_broadcast(Op.MATMUL, [(1, 3, 5), (1, 5, 7)], [(1, 64, 128), (1, 128, 64)], "here")
    with pytest.raises(ReshapeFailed, match="broadcasts"):  # was a broadcast, now elementwise by coincidence
        same_broadcast(Op.DIV, [(1, 1, 5), (1, 1, 1)], [(1, 64, 128), (1, 64, 128)], "here")
    with pytest.raises(ReshapeFailed, match="broadcasts"):  # was elementwise on ones, now a broadcast
        same_broadcast(Op.MUL, [(2, 3, 1), (2, 3, 1)], [(32, 512, 2), (32, 512, 1)], "here")
    with pytest.raises(ReshapeFailed, match="broadcasts"):  # matmul batch dims
        same_broadcast(Op.MATMUL, [(2, 3, 5), (1, 5, 7)], [(4, 3, 5), (4, 5, 7)], "here")

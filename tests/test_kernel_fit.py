"""Launch limits in the choice: a graph-defined kernel's shared memory and threads as the CUDA build emits them
(gensorage.codegen.kernel_fit), in re-instantiation, full/fast mode's candidates and the dispatcher."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

import gensorage
from gensorage.codegen.cuda_build import cubin_unavailable_reason, ptx_and_resources
from gensorage.codegen.gpu_limits import block_resources
from gensorage.codegen.kernel_fit import graph_kernel_resources, launch_problem
from gensorage.codegen.module import compile_ugraph, ir_module
from gensorage.errors import UnsupportedOpError
from gensorage.hw import load_profile
from gensorage.program import dump_program
from gensorage.superopt import StructureRecord, StructureStore, superoptimize
from gensorage.superopt.choice import cost_fn
from gensorage.superopt.reshape_structure import reinstantiate
from gensorage.ugraph import GraphDefinedOp, KernelGraph, from_program, validate
from gensorage.ugraph.examples import flash_attention2, gated_mlp, qknorm_attention, rmsnorm_matmul
from gensorage.ugraph.optimize.memory_plan import shared_footprint

H200 = load_profile("h200")
# FlashAttention-2 found at small shapes (what full mode re-instantiates) and the shapes it is asked for.
SMALL = dict(heads=2, q_len=64, kv_len=256, head_dim=32, q_blocks=1, forloop=4)
ASKED = dict(heads=2, q_len=128, kv_len=256, head_dim=64)


def _with_grid(g: KernelGraph, grid: tuple[int, ...], forloop: int) -> KernelGraph:
    """``g`` with its last kernel's grid and trip count replaced."""
    op = g.ops[-1]
    assert isinstance(op, GraphDefinedOp)
    block = dataclasses.replace(op.block, grid=grid, forloop=forloop)
    return dataclasses.replace(g, ops=(*g.ops[:-1], GraphDefinedOp(block, op.inputs)))


# The loop at one stage: the fewest shared bytes a kernel can declare (the emitter drops the pipeline's extra
# stages where they do not fit), so a limit below them is one the kernel cannot launch under.
ONE_STAGE = dataclasses.replace(H200, calibration=dataclasses.replace(H200.calibration, block_max_stages=1.0))


def _need(g: KernelGraph) -> int:
    """Shared bytes kernel op 1 of ``g`` declares with its loop at one stage."""
    return graph_kernel_resources(g, 1, validate(g, ONE_STAGE), ONE_STAGE).shared_bytes


def _tight(limit: int) -> Any:
    """The H200 with ``limit`` bytes of shared memory per block."""
    return dataclasses.replace(H200, shared_mem_per_block=limit)


def _lowered_shared(g: KernelGraph) -> list[int]:
    """Shared bytes per block of every graph-defined kernel as TVM lowers it (what the CUDA build checks)."""
    compiled = compile_ugraph(g, H200, "cuda")
    return [
        block_resources(ir_module([k])).shared_bytes
        for k in compiled.kernels("cuda")
        if isinstance(g.ops[k.op_index], GraphDefinedOp)
    ]


# Static tiles, an arena shared by liveness, reductions' scratch, online accumulators on tensor cores.
EXAMPLES = [
    gated_mlp(m=16, k=64, n=48, blocks=3, forloop=2),
    rmsnorm_matmul(batch=16, hidden=64, out=48, blocks=3, forloop=2),
    qknorm_attention(heads=2, q_len=64, kv_len=64, head_dim=16, q_blocks=2, forloop=2),
    flash_attention2(**SMALL),
    rmsnorm_matmul(batch=4, hidden=16, out=12, blocks=3, forloop=4, dtype="float32"),
]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e[0].name)
def test_emitted_shared_bytes_are_what_the_cuda_build_allocates(example: Any) -> None:
    _, g = example
    info = validate(g, H200)
    emitted = [
        graph_kernel_resources(g, k, info, H200).shared_bytes
        for k, op in enumerate(g.ops)
        if isinstance(op, GraphDefinedOp)
    ]
    assert emitted == _lowered_shared(g)
    assert all(b > 0 for b in emitted)


def test_fa2_at_two_heads_of_64_rows_does_not_launch_on_the_h200() -> None:
    # mha_prefill's FA-2 (32 heads, 512 queries, 4,096 keys, head dim 128) at 2 heads x 64 rows a block, 128
    # keys an iteration: the model's memory plan fits (229,376 bytes), the kernel's padded rows do not.
    _, g = flash_attention2(heads=32, q_len=512, kv_len=4096, head_dim=128, q_blocks=8, forloop=32)
    big = _with_grid(g, (16, 8), 32)
    info = validate(big, H200)
    assert shared_footprint(big.ops[1].block, info.blocks[1]) <= H200.shared_mem_per_block  # type: ignore[union-attr]
    assert launch_problem(big, H200) == (
        "kernel op 1 (graph-defined): 241664 bytes of shared memory per block exceed h200's limit of 232448"
    )
    assert launch_problem(_with_grid(g, (32, 4), 32), H200) is None  # 1 head x 128 rows: 204,800 bytes


@pytest.mark.slow
def test_the_cuda_build_refuses_what_launch_problem_refuses() -> None:
    _, g = flash_attention2(heads=32, q_len=512, kv_len=4096, head_dim=128, q_blocks=8, forloop=32)
    with pytest.raises(UnsupportedOpError, match="241664 bytes of shared memory per block exceed"):
        compile_ugraph(_with_grid(g, (16, 8), 32), H200, "cuda")


def test_reinstantiation_takes_the_next_best_grid_that_launches() -> None:
    old, graph = flash_attention2(**SMALL)
    new, _ = flash_attention2(**ASKED, q_blocks=1, forloop=2)
    best = reinstantiate(graph, old, new, H200, cost_fn(H200))
    info = validate(best, H200)
    need = _need(best)
    plan = shared_footprint(best.ops[1].block, info.blocks[1])  # type: ignore[union-attr]
    assert plan < need
    # A GPU whose limit lies between the model's bytes and the kernel's: the model's choice is valid there, but
    # does not launch; re-instantiation takes another grid or loop, which launches.
    tight = _tight((plan + need) // 2)
    validate(best, tight)
    assert "bytes of shared memory per block exceed" in (launch_problem(best, tight) or "")
    chosen = reinstantiate(graph, old, new, tight, cost_fn(tight))
    assert chosen != best
    assert launch_problem(chosen, tight) is None
    # (Not cheaper or dearer than ``best`` by construction: under ``tight`` the model also prices ``best`` at the
    # pipeline stages that fit there, so ``best`` need not be the model's choice at ``tight``.)


def _store(db: Path, program: Any, graph: KernelGraph, hw: str) -> None:
    cost = cost_fn(H200)
    with StructureStore(db) as st:
        st.put(
            StructureRecord(
                program.structure_key(),
                hw,
                gensorage.__version__,
                dump_program(program),
                dict(program.params),
                (graph,),
                cost(graph),
                cost(from_program(program)),
            )
        )


def test_fast_mode_drops_a_stored_candidate_that_does_not_launch(tmp_path: Path) -> None:
    program, graph = flash_attention2(**ASKED, q_blocks=16, forloop=2)
    need = _need(graph)
    tight = _tight(need - 16)
    db = tmp_path / "store.sqlite"
    _store(db, program, graph, tight.name)  # stored at these shapes: used as it is, not re-instantiated
    res = superoptimize(program, hw=tight, mode="fast", store=db, progress=False)
    assert res.origin in ("direct", "fused")
    assert not any(origin.startswith("stored") for origin, _, _ in res.candidates)
    notes = " ".join(res.notes)
    assert (
        f"stored #0: not a candidate, it does not launch on h200: kernel op 1 (graph-defined): {need} "
        in notes
    )


def test_fast_mode_reinstantiates_to_a_grid_that_launches(tmp_path: Path) -> None:
    old, graph = flash_attention2(**SMALL)
    new, _ = flash_attention2(**ASKED, q_blocks=1, forloop=2)
    model_choice = reinstantiate(graph, old, new, H200, cost_fn(H200))
    tight = _tight(_need(model_choice) - 16)
    db = tmp_path / "store.sqlite"
    _store(db, old, graph, tight.name)
    res = superoptimize(new, hw=tight, mode="fast", store=db, progress=False)
    for origin, g, _ in res.candidates:
        assert origin == "direct" or launch_problem(g, tight) is None
    stored = [g for origin, g, _ in res.candidates if origin == "stored #0"]
    assert stored, res.notes
    assert stored[0] != model_choice


@pytest.mark.slow
@pytest.mark.skipif(cubin_unavailable_reason() is not None, reason=str(cubin_unavailable_reason()))
def test_the_chosen_fa2_at_mha_prefill_builds_without_spills() -> None:
    # full mode's re-instantiation of the small FA-2 at mha_prefill's shapes: nvcc's resource report.
    old, graph = flash_attention2(**SMALL)
    new, _ = flash_attention2(heads=32, q_len=512, kv_len=4096, head_dim=128, q_blocks=8, forloop=64)
    chosen = reinstantiate(graph, old, new, H200, cost_fn(H200))
    assert launch_problem(chosen, H200) is None
    compiled = compile_ugraph(chosen, H200, "cuda")
    built = ptx_and_resources(compiled.cuda_source(), "sm_90a")
    assert built is not None
    ptx, report = built
    assert "mma.sync" in ptx
    for name, res in report.items():
        assert res.spill_stores == 0 and res.spill_loads == 0, (name, res)


def test_the_dispatcher_builds_a_new_shape_on_a_grid_that_launches() -> None:
    from gensorage.superopt.dispatch import Dispatcher, _Structure

    old, graph = flash_attention2(**SMALL)
    new, _ = flash_attention2(**ASKED, q_blocks=1, forloop=2)
    model_choice = reinstantiate(graph, old, new, H200, cost_fn(H200))
    tight = _tight(_need(model_choice) - 16)
    d = Dispatcher(tight, use_store=False)
    d._structures[new.structure_key()] = _Structure(old, graph, "stored #0")  # chosen at the small shapes
    # The CUDA build checks the lowered kernels against the limits (gensorage.codegen.gpu_limits).
    e = d.kernels(new, target="cuda")
    assert e.reused and e.origin == "stored #0" and e.equivalence, e.notes
    assert e.graph != model_choice and launch_problem(e.graph, tight) is None
    assert d.stats.direct_fallbacks == 0

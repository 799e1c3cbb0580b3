"""The cost of graph-defined kernels as emitted (gensorage.ugraph.block_cost)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from benchmarks.gpu_prepare import EXTRA_UGRAPHS
from gensorage.codegen.scalar import FloatScalar
from gensorage.codegen.ugraph_tir import compute_dtype, emit_graph_defined, plan_threads
from gensorage.hw import load_profile
from gensorage.opset import Op
from gensorage.ugraph import KernelGraph, examples
from gensorage.ugraph.block_cost import Work, block_cycles, block_threads, plan_block
from gensorage.ugraph.cost import kernel_costs, predict_ugraph_time
from gensorage.ugraph.ir import BlockGraph, BlockOp, GraphDefinedOp, InputIterator, OutputSaver, TensorSpec
from gensorage.ugraph.validate import validate

H200 = load_profile("h200")

LOOPED = {
    "gated_mlp": lambda: examples.gated_mlp(m=8, k=1024, n=1024, blocks=16, forloop=16)[1],
    "rmsnorm_matmul": lambda: examples.rmsnorm_matmul(batch=16, hidden=256, out=512, blocks=8, forloop=4)[1],
    "flash_attention": lambda: examples.flash_attention(
        heads=2, q_len=128, kv_len=512, head_dim=64, q_blocks=2, forloop=8
    )[1],
    "flash_attention2": lambda: examples.flash_attention2(
        heads=2, q_len=128, kv_len=512, head_dim=64, q_blocks=2, forloop=8
    )[1],
    "qknorm_attention": lambda: examples.qknorm_attention(
        heads=2, q_len=64, kv_len=512, head_dim=64, q_blocks=2, forloop=8
    )[1],
}


def _loop_barriers(text: str) -> int:
    """Barriers inside the emitted kernel's ``for it`` loop."""
    indent, count = None, 0
    for line in text.splitlines():
        depth = len(line) - len(line.lstrip())
        if indent is None:
            indent = depth if line.strip().startswith("for it in") else None
            continue
        if line.strip() and depth <= indent:
            break
        count += "tvm_storage_sync" in line
    return count


def _looped_kernels(g: KernelGraph) -> list[int]:
    return [k for k, op in enumerate(g.ops) if isinstance(op, GraphDefinedOp) and op.block.forloop > 1]


@pytest.mark.parametrize("name", sorted(LOOPED))
def test_barriers_per_iteration_are_the_emitted_kernels(name: str) -> None:
    g = LOOPED[name]()
    info = validate(g)
    kernels = _looped_kernels(g)
    assert kernels
    for k in kernels:
        choice = plan_threads(g, k, info, H200)
        text = emit_graph_defined(
            g, k, info, choice, target="cuda", scalar=FloatScalar(compute_dtype(g, info)), name="k"
        ).text
        plan = plan_block(g, k, info, H200)
        assert plan.threads == choice.threads
        assert plan.body.barriers == _loop_barriers(text) > 0


def test_tensor_core_block_matmuls_are_priced_faster_than_cuda_cores() -> None:
    g = LOOPED["flash_attention"]()
    (k,) = _looped_kernels(g)
    plan = plan_block(g, k, validate(g), H200)
    assert plan.mma and plan.body.mmas > 0
    on_cuda_cores = sum(c.time_s for c in kernel_costs(g, H200, block_mma=False))
    assert on_cuda_cores > predict_ugraph_time(g, H200)


def test_fewer_loads_in_flight_make_an_element_wise_loop_slower_and_cp_async_does_not_care() -> None:
    g = LOOPED["gated_mlp"]()
    info = validate(g)
    k = _looped_kernels(g)[0]
    op = g.ops[k]
    assert isinstance(op, GraphDefinedOp)
    choice = block_threads(g, k, info, H200)
    cal = H200.calibration

    def cycles(runs: bool) -> list[float]:
        out = []
        for f in (0.25, 1.0, 4.0):
            hw = dataclasses.replace(
                H200,
                calibration=dataclasses.replace(cal, block_load_flight_bytes=cal.block_load_flight_bytes * f),
            )
            plan = plan_block(g, k, info, hw, True, dataclasses.replace(choice, runs=runs))
            out.append(block_cycles(plan, hw, math.prod(op.block.grid), op.block.forloop)[0])
        return out

    element_wise, runs = cycles(False), cycles(True)
    assert element_wise[0] > element_wise[1] > element_wise[2]
    assert runs[0] == runs[1] == runs[2] <= element_wise[1]
    assert runs[0] < element_wise[0]


def test_resident_blocks_share_the_pipes_not_the_latency() -> None:
    busy = Work(ops=4000.0, shared=1000.0)
    waiting = Work(latency=5000.0, barriers=2)
    assert busy.cycles(H200, 2) == 2 * busy.cycles(H200, 1)
    assert waiting.cycles(H200, 4) == waiting.cycles(H200, 1)


def test_a_kernel_the_generator_refuses_is_never_chosen() -> None:
    # 70,000 blocks along y: CUDA allows 65,535 (the generator refuses it in one line).
    rows = 70_000
    block = BlockGraph(
        (1, rows), 1, (InputIterator(0, (None, 0)), BlockOp(Op.EXP, (0,)), OutputSaver(1, (1, 0)))
    )
    g = KernelGraph((TensorSpec("X", (rows, 32)),), (GraphDefinedOp(block, (0,)),), (1,))
    assert g.is_valid(H200)
    assert predict_ugraph_time(g, H200) == math.inf


@pytest.mark.parametrize("name", sorted(EXTRA_UGRAPHS))
def test_the_model_plans_the_generators_threads_on_the_bundled_fused_kernels(name: str) -> None:
    # The model widens the block tile at one element per thread instead of running the construction; the
    # generator's plan agrees while the construction's register tile is 1, and so do the loop's stages.
    g = EXTRA_UGRAPHS[name]()[1]
    info = validate(g)
    for k, op in enumerate(g.ops):
        if isinstance(op, GraphDefinedOp):
            model, generator = block_threads(g, k, info, H200), plan_threads(g, k, info, H200)
            assert (model.threads, model.stages) == (generator.threads, generator.stages)

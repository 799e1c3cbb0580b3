"""Every fused example µGraph builds for CUDA the way a GPU bundle builds it (no GPU, no nvcc).

A bundle (benchmarks/gpu_prepare.py) builds the kernels with its own ``tvm.compile`` and reads the launch table
through TVM's lowering pipeline, not through :class:`~gensorage.codegen.module.CompiledUGraph`'s build. Kernels
that place their own barriers (dynamic shared memory) must build on that path too: they once failed there with
TVM's "Cannot insert syncs inside condition" at the bundled programs' shapes and the paper's. Checked here at
those shapes, and over drawn grids, for-loops and tile sizes; the reduced shapes of the bundled structures run
their CPU twins against float64.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.gpu_prepare import EXTRA_UGRAPHS
from benchmarks.kernel_resources import PAPER
from gensorage.codegen.barriers import divergent_barriers, has_explicit_barriers
from gensorage.codegen.cuda_build import cuda_target
from gensorage.codegen.launch import launch_specs
from gensorage.codegen.module import compile_ugraph, ir_module
from gensorage.codegen.tensor_core import build_config
from gensorage.dtypes import numpy_dtype
from gensorage.errors import UGraphError
from gensorage.hw import load_profile
from gensorage.precision import PRECISIONS
from gensorage.ugraph.examples import EXAMPLES, ONLINE_EXAMPLES
from gensorage.ugraph.ir import KernelGraph

HW = load_profile("h200")
ALL_EXAMPLES = {**EXAMPLES, **ONLINE_EXAMPLES}


def _build_as_a_bundle(g: KernelGraph) -> str:
    """The CUDA source of ``g``'s kernels built as gpu_prepare builds them; checks their barriers and launches."""
    import tvm

    kernels = compile_ugraph(g, HW, "cuda").kernels("cuda")
    for k in kernels:
        assert divergent_barriers(k.func) == 0, k.name
    mod, config = ir_module(kernels), build_config(k.rule for k in kernels)
    with tvm.transform.PassContext(config=config):
        ex = tvm.compile(mod, target=cuda_target(HW))
    launches = launch_specs(mod, cuda_target(HW), config, order=[k.name for k in kernels])
    assert {la.function for la in launches} == {k.name for k in kernels}
    src = str(ex.mod.imports[0].inspect_source())
    for k in kernels:
        assert f"{k.name}_kernel(" in src
    return src


@pytest.mark.parametrize("name", sorted(set(EXTRA_UGRAPHS) - {"fused_lora"}))
def test_bundled_fused_ugraphs_build_for_cuda(name: str) -> None:
    _, g = EXTRA_UGRAPHS[name]()
    _build_as_a_bundle(g)


def test_bundled_fused_lora_is_refused_for_its_shared_memory() -> None:
    # 4096 x 4096 LoRA in one block column per 16 output columns: its block graph needs 386 KiB.
    _, g = EXTRA_UGRAPHS["fused_lora"]()
    with pytest.raises(UGraphError, match="shared memory"):
        compile_ugraph(g, HW, "cuda").kernels("cuda")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", sorted(PAPER))
def test_paper_shapes_build_for_cuda(name: str, dtype: str) -> None:
    _, g = ALL_EXAMPLES[name](**PAPER[name], dtype=dtype)
    _build_as_a_bundle(g)


def test_kernels_placing_their_own_barriers_are_among_those_built() -> None:
    # The property above is about them: at least the bundled decode structures use dynamic shared memory.
    _, g = EXTRA_UGRAPHS["fused_mha_incdec"]()
    assert any(has_explicit_barriers(k.func) for k in compile_ugraph(g, HW, "cuda").kernels("cuda"))


# ------------------------------------------------------------------------------------------ drawn shapes

# Tile extents: 1 and odd ones leave guarded tails, multiples of 16 reach the tensor-core matmuls.
_TILE = st.sampled_from([1, 2, 3, 5, 8, 16, 24, 32])
_GRID = st.integers(1, 4)


@st.composite
def _shapes(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """An example and its keyword arguments: grid and for-loop sizes times drawn tile extents."""
    name = draw(st.sampled_from(sorted(ALL_EXAMPLES)))
    grid, loop, tile = (lambda: draw(_GRID)), (lambda: draw(_GRID)), (lambda: draw(_TILE))
    kw: dict[str, Any]
    if name in ("flash_attention", "flash_attention2", "qknorm_attention"):
        kw = dict(heads=grid(), q_blocks=grid(), forloop=loop(), head_dim=tile())
        kw |= dict(q_len=kw["q_blocks"] * tile(), kv_len=kw["forloop"] * tile())
    elif name in ("flash_decoding", "flash_decoding_stable"):
        kw = dict(heads=grid(), splits=grid(), forloop=loop(), head_dim=tile())
        kw["kv_len"] = kw["splits"] * kw["forloop"] * tile()
        if name == "flash_decoding_stable":
            kw["combine"] = draw(st.sampled_from(["sum", "matmul"]))
    elif name == "gqa":
        kw = dict(kv_heads=grid(), group=grid(), q_len=draw(st.integers(1, 3)), kv_splits=grid())
        kw |= dict(forloop=loop(), out_splits=grid())
        kw |= dict(kv_len=kw["kv_splits"] * kw["forloop"] * tile(), head_dim=kw["out_splits"] * tile())
    elif name == "gated_mlp":
        kw = dict(m=tile(), blocks=grid(), forloop=loop())
        kw |= dict(n=kw["blocks"] * tile(), k=kw["forloop"] * tile())
    elif name == "rmsnorm_matmul":
        kw = dict(batch=tile(), blocks=grid(), forloop=loop())
        kw |= dict(out=kw["blocks"] * tile(), hidden=kw["forloop"] * tile())
    else:
        assert name == "lora", name
        kw = dict(n_blocks=grid(), m_blocks=grid(), k=tile(), rank=tile())
        kw |= dict(n=kw["n_blocks"] * tile(), m=kw["m_blocks"] * tile())
    kw["dtype"] = draw(st.sampled_from(["float16", "bfloat16", "float32"]))
    return name, kw


@settings(max_examples=15)  # each example an nvcc build (12 s idle at 40)
@given(shape=_shapes(), precision=st.sampled_from(PRECISIONS))
def test_any_grid_loop_and_tile_builds_for_cuda(shape: tuple[str, dict[str, Any]], precision: str) -> None:
    name, kw = shape
    _, g = ALL_EXAMPLES[name](**kw)
    _build_as_a_bundle(dataclasses.replace(g, precision=precision))


# ------------------------------------------------------------------------------------------ the CPU twins

#: The bundled structures that failed to build (EXTRA_UGRAPHS), same grids and splits, smaller extents.
REDUCED: dict[str, Callable[[], Any]] = {
    "fused_mha_specdec": lambda: ALL_EXAMPLES["flash_attention"](
        heads=2, q_len=32, kv_len=256, head_dim=32, q_blocks=2, forloop=8
    ),
    "fused_mha_incdec": lambda: ALL_EXAMPLES["flash_decoding"](
        heads=2, kv_len=512, head_dim=32, splits=4, forloop=4
    ),
    "fused_gqa_incdec": lambda: ALL_EXAMPLES["gqa"](
        kv_heads=2, group=8, q_len=1, kv_len=512, head_dim=32, kv_splits=4, forloop=4, out_splits=2
    ),
    "fused_qknorm": lambda: ALL_EXAMPLES["qknorm_attention"](
        heads=2, q_len=64, kv_len=512, head_dim=64, q_blocks=4, forloop=8
    ),
    "llama3_flash_decoding_stable": lambda: ALL_EXAMPLES["flash_decoding_stable"](
        heads=2, kv_len=512, head_dim=32, splits=4, forloop=4
    ),
}


@pytest.mark.parametrize("name", sorted(REDUCED))
def test_reduced_bundled_structures_match_float64_on_cpu(name: str) -> None:
    program, g = REDUCED[name]()
    _build_as_a_bundle(g)
    rng = np.random.default_rng(7)
    # Magnitudes as attention sees them: logits up to about ±8 after the 1/√d scale.
    xs = [(rng.standard_normal(s.shape) * 2.0).astype(numpy_dtype(s.dtype)) for s in g.inputs]
    want = program.run(*xs)[0]
    got = compile_ugraph(g, HW, "llvm").run(*xs)[0].astype(np.float64)
    assert want.dtype == np.float64
    # float32 arithmetic, float16 operands of the tensor-core matmuls and one float16 output rounding; P (exp,
    # kept in float32) goes to a bfloat16 fragment, rounded by the twin as on the GPU: 2^-9 per element, one sign.
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 4e-3


# ------------------------------------------------------------------------------------------ the barrier check


def _with_barrier_after(script: str, line_start: str) -> str:
    """``script`` with a barrier as the first statement of the block opened by the first line starting so."""
    lines = script.splitlines()
    i = next(n for n, ln in enumerate(lines) if ln.strip().startswith(line_start))
    indent = len(lines[i + 1]) - len(lines[i + 1].lstrip())
    return "\n".join(lines[: i + 1] + [" " * indent + 'T.tvm_storage_sync("shared")'] + lines[i + 1 :])


@pytest.mark.parametrize("opening", ["for tx in T.thread_binding", "if "])
def test_a_barrier_some_threads_may_not_reach_is_found(opening: str) -> None:
    import tvm

    _, g = EXTRA_UGRAPHS["fused_mha_incdec"]()
    kernel = compile_ugraph(g, HW, "cuda").kernels("cuda")[0]
    assert divergent_barriers(kernel.func) == 0
    bad = tvm.script.from_source(_with_barrier_after(kernel.script, opening))
    assert divergent_barriers(bad) == 1

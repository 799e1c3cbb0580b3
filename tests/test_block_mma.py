"""Block matmuls of graph-defined kernels on tensor cores (gensorage.codegen.block_mma): the fragment layouts,
the rule, the CPU twins of the warp tiling against float64, and the PTX of every fused example."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gensorage.codegen import block_mma
from gensorage.codegen.block_mma import (
    A_ELEMS,
    B_ELEMS,
    C_ELEMS,
    WARP,
    a_element,
    b_element,
    c_element,
    ldmatrix_row,
    mma_tiling,
)
from gensorage.codegen.field_twin import check_field_twin
from gensorage.codegen.module import compile_ugraph
from gensorage.codegen.tensor_core import fragment_lane
from gensorage.codegen.tir_text import Ix
from gensorage.construction.block_threads import ThreadChoice
from gensorage.dtypes import numpy_dtype
from gensorage.errors import ScheduleError
from gensorage.hw import load_profile
from gensorage.opset import Op
from gensorage.ugraph.examples import EXAMPLES, ONLINE_EXAMPLES
from gensorage.ugraph.ir import (
    Accumulator,
    BlockGraph,
    BlockNode,
    BlockOp,
    GraphDefinedOp,
    InputIterator,
    KernelGraph,
    OutputSaver,
    Ref,
    TensorSpec,
)
from gensorage.ugraph.validate import validate

HW = load_profile("h100")

# The fused examples at tile shapes that fit m16n8k16 (every tile a multiple of 16 rows, 8 columns, 16 deep).
MMA_SHAPES = {
    "gated_mlp": dict(m=16, k=64, n=48, blocks=3, forloop=2),
    "rmsnorm_matmul": dict(batch=16, hidden=64, out=48, blocks=3, forloop=2),
    "flash_attention": dict(heads=2, q_len=64, kv_len=64, head_dim=16, q_blocks=2, forloop=2),
    "flash_attention2": dict(heads=2, q_len=64, kv_len=64, head_dim=16, q_blocks=2, forloop=2),
    "lora": dict(m=16, k=64, n=64, rank=16, n_blocks=2, m_blocks=1),
    "qknorm_attention": dict(heads=2, q_len=64, kv_len=64, head_dim=16, q_blocks=2, forloop=2),
    # 8 query heads of one KV head stacked into 8 rows by a reshape view: one padded MMA row tile.
    "gqa": dict(kv_heads=2, group=8, q_len=1, kv_len=128, head_dim=16, kv_splits=2, forloop=2, out_splits=2),
}
# Block matmuls per example that take the tensor-core path: flash_attention2's P @ V is its online accumulator,
# qknorm_attention's normalised q and k are float16 (a norm's normalised value is bounded by √d: the precision
# policy's "normalised" range), so q @ kᵀ takes the tensor cores too; its P @ V converts P to bfloat16.
MMA_MATMULS = {
    "gated_mlp": 2,
    "rmsnorm_matmul": 1,
    "flash_attention": 2,
    "flash_attention2": 1,
    "lora": 2,
    "qknorm_attention": 2,
    "gqa": 2,
}
ALL_EXAMPLES = {**EXAMPLES, **ONLINE_EXAMPLES}


def _ix(v: Ix) -> int:
    assert v.is_const
    return v.const


# ------------------------------------------------------------------------------------------ layouts


def test_fragment_layouts_are_the_ldmatrix_layout_tvms_intrinsics_use() -> None:
    # fragment_lane is TVM's shared_16x16_to_ldmatrix_32x8 layout: (lane, element) of (row, col) of a 16 x 16
    # A tile, and of the 16 x 16 accumulator of two m16n8k16 (columns 0-7: elements 0-3). B's .col fragment
    # holds B^T's rows, as ldmatrix (not transposed) of the [n, k] tile would load them: elements 0, 1, 4, 5.
    for lane in range(WARP):
        for e in range(A_ELEMS):
            row, col = a_element(Ix.of(lane), e)
            assert fragment_lane(_ix(row), _ix(col)) == (lane, e)
        for e in range(B_ELEMS):
            k, n = b_element(Ix.of(lane), e)
            assert fragment_lane(_ix(n), _ix(k)) == (lane, (0, 1, 4, 5)[e])
        for c in range(C_ELEMS):
            row, col = c_element(Ix.of(lane), Ix.of(c))
            assert fragment_lane(_ix(row), _ix(col)) == (lane, c)


def _ldmatrix(lane: int, q: int, h: int, trans: bool) -> tuple[int, int]:
    """(row, col) in the 16 x 16 block of half ``h`` of register ``q`` of ``lane`` after ldmatrix.x4 (PTX ISA):
    matrix ``q``'s row ``r`` is the 8 elements at the address lane ``8q + r`` gives; without .trans a lane gets
    row lane/4, columns 2*(lane%4) + h of it; with .trans the transposed matrix's."""
    r, c = (2 * (lane % 4) + h, lane // 4) if trans else (lane // 4, 2 * (lane % 4) + h)
    row, col = ldmatrix_row(Ix.of(8 * q + r))
    return _ix(row), _ix(col) + c


def test_ldmatrix_rows_load_the_mma_fragments() -> None:
    # A (rows i, columns k) through ldmatrix.x4: register q holds elements 2q, 2q + 1 of a_element's fragment.
    # B (rows k, columns n) through ldmatrix.x4.trans: registers 0-1 the fragment of the B tile at columns 0-7,
    # registers 2-3 that of the tile at columns 8-15 (b_element's k, n).
    for lane in range(WARP):
        for q in range(4):
            for h in range(2):
                assert _ldmatrix(lane, q, h, False) == tuple(
                    _ix(x) for x in a_element(Ix.of(lane), 2 * q + h)
                )
                k, n = (_ix(x) for x in b_element(Ix.of(lane), 2 * (q % 2) + h))
                assert _ldmatrix(lane, q, h, True) == (k, n + 8 * (q // 2))


def test_a_thread_index_reads_its_lanes_layout() -> None:
    # The emitter passes the thread index itself as the lane: warp 3's lane 5 is thread 101.
    assert [_ix(x) for x in a_element(Ix.of(3 * WARP + 5), 6)] == [_ix(x) for x in a_element(Ix.of(5), 6)]
    assert [_ix(x) for x in b_element(Ix.of(3 * WARP + 5), 3)] == [_ix(x) for x in b_element(Ix.of(5), 3)]


# ------------------------------------------------------------------------------------------ the rule


def _matmul_graph(
    a: tuple[int, ...], b: tuple[int, ...], dtypes: tuple[str, str], forloop: int = 2, grid: int = 1
) -> KernelGraph:
    """One kernel: ``a`` tiles looped over k, ``b`` tiles over k (and over n by the grid), summed in registers."""
    specs = (
        TensorSpec("A", a[:-1] + (a[-1] * forloop,), dtypes[0]),
        TensorSpec("B", b[:-2] + (b[-2] * forloop, b[-1] * grid), dtypes[1]),
    )
    nodes: tuple[BlockNode, ...] = (
        InputIterator(0, (None,), len(a) - 1),
        InputIterator(1, (len(b) - 1,), len(b) - 2),
        BlockOp(Op.MATMUL, (0, 1)),
        Accumulator(2),
        OutputSaver(3, (max(len(a), len(b)) - 1,)),
    )
    op = GraphDefinedOp(BlockGraph((grid,), forloop, nodes), (0, 1))
    return KernelGraph(specs, (op,), (Ref(2),))


def _rule(a: tuple[int, ...], b: tuple[int, ...], dtypes: tuple[str, str], threads: int) -> object:
    g = _matmul_graph(a, b, dtypes)
    binfo = validate(g).blocks[0]
    assert binfo is not None
    node = g.ops[0].block.nodes[2]  # type: ignore[union-attr]
    assert isinstance(node, BlockOp)
    return mma_tiling(binfo, node, 2, threads)


@pytest.mark.parametrize(
    ("a", "b", "dtypes", "threads", "why"),
    [
        ((1, 64), (64, 64), ("float16", "float16"), 128, "a decode row would waste 15/16 of each MMA"),
        ((12, 64), (64, 64), ("float16", "float16"), 128, "rows are not a multiple of 8"),
        ((16, 24), (24, 64), ("float16", "float16"), 128, "k is not whole 16-wide chunks"),
        ((16, 32), (32, 12), ("float16", "float16"), 128, "n is not whole 8-wide MMA tiles"),
        ((16, 32), (32, 64), ("float32", "float32"), 128, "two float32 operands stay on CUDA cores"),
        ((16, 32), (32, 64), ("float16", "float16"), 48, "the block is not whole warps"),
    ],
)
def test_the_rule_leaves_what_does_not_fit_m16n8k16(
    a: tuple[int, ...], b: tuple[int, ...], dtypes: tuple[str, str], threads: int, why: str
) -> None:
    assert _rule(a, b, dtypes, threads) is None, why


def test_the_rule_takes_16_bit_operands_and_converts_a_float32_one_to_bfloat16() -> None:
    t = _rule((2, 32, 32), (2, 32, 64), ("bfloat16", "bfloat16"), 128)
    assert t is not None and t.dtype == "bfloat16" and t.batch == (2,)  # type: ignore[attr-defined]
    t = _rule((32, 32), (32, 64), ("float32", "float16"), 128)
    assert t is not None and t.dtype == "bfloat16"  # type: ignore[attr-defined]
    t = _rule((8, 32), (32, 64), ("float16", "float16"), 128)  # 8 rows: one MMA tile, padded
    assert t is not None and t.padded and t.m_tiles == 1  # type: ignore[attr-defined]


def test_the_rule_spreads_the_mmas_over_the_warps_then_reuses_fragments() -> None:
    # 64 x 64 on 4 warps: 32 MMA tiles of 16 x 8, 8 per warp at best, as one warp tile of 8 MMA tiles (each
    # fragment feeds the most MMAs), the squarest: 32 x 32 loads 16 + 16 fragment elements per k chunk.
    t = _rule((64, 32), (32, 64), ("float16", "float16"), 128)
    assert t is not None
    assert (t.warp_m, t.warp_n, t.steps, t.regs) == (2, 4, 1, 32)  # type: ignore[attr-defined]
    # One warp, 16 x 8 output: one MMA tile, one step.
    t = _rule((16, 16), (16, 8), ("float16", "float16"), 32)
    assert t is not None and (t.warp_m, t.warp_n, t.steps) == (1, 1, 1)  # type: ignore[attr-defined]
    # 1024 threads leave 64 registers a thread: the accumulators get a quarter of them, 16 (a 32 x 16 tile).
    t = _rule((64, 32), (32, 64), ("float16", "float16"), 1024)
    assert t is not None and t.regs <= 16 and t.warps == 32  # type: ignore[attr-defined]


def test_the_cost_models_read_the_layout_the_kernel_is_emitted_with() -> None:
    from gensorage.codegen.ugraph_tir import planned_mma_tilings

    _, g = ALL_EXAMPLES["flash_attention"](
        heads=16, q_len=256, kv_len=1024, head_dim=64, q_blocks=4, forloop=16
    )
    tilings = planned_mma_tilings(g, 0, validate(g), HW)
    (kernel,) = compile_ugraph(g, HW, "llvm").kernels("llvm")
    assert sorted(tilings) == [3, 6]
    for j, t in tilings.items():
        assert f"block matmul #{j} on {t.describe()}" in kernel.rule


def test_more_warps_than_the_block_has_is_a_one_line_error() -> None:
    g = _matmul_graph((16, 32), (32, 64), ("float16", "float16"))
    binfo = validate(g).blocks[0]
    assert binfo is not None
    node = g.ops[0].block.nodes[2]  # type: ignore[union-attr]
    assert isinstance(node, BlockOp)
    with pytest.raises(ScheduleError, match="5 warps for block matmul #2 on 128 threads"):
        mma_tiling(binfo, node, 2, 128, 5)


# ------------------------------------------------------------------------------------------ the CPU twins


def _tolerance(dtype: str, want: np.ndarray) -> float:
    # float32 accumulation, then one rounding to the output dtype (2^-11 float16, 2^-8 bfloat16; bounded below by
    # what rounding float64's answer itself loses).
    rounding = np.linalg.norm(want.astype(numpy_dtype(dtype)).astype(np.float64) - want)
    return (2e-3 if dtype == "float16" else 8e-3) * float(np.linalg.norm(want)) + 2 * float(rounding)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batch=st.sampled_from([(), (2,)]),
    broadcast=st.booleans(),
    m=st.sampled_from([8, 16, 24, 32, 48]),
    n=st.sampled_from([8, 16, 24, 64]),
    k=st.sampled_from([16, 32]),
    warps=st.sampled_from([1, 2, 3, 4]),
    idle=st.sampled_from([0, 1, 3]),
    scale=st.sampled_from([1e-3, 1.0, 30.0]),
    dtype=st.sampled_from(["float16", "bfloat16"]),
    seed=st.integers(0, 2**16),
)
def test_any_warp_tiling_computes_the_matmul(
    batch: tuple[int, ...],
    broadcast: bool,
    m: int,
    n: int,
    k: int,
    warps: int,
    idle: int,
    scale: float,
    dtype: str,
    seed: int,
) -> None:
    # Several steps per warp, warps with no tile (guards), warps of the block the matmul leaves idle, padded
    # rows, batch dims and a broadcast B: the twin's warps, lanes and slots reach every output element once,
    # through the register accumulator across the loop.
    b_batch = (1,) * len(batch) if broadcast else batch
    g = _matmul_graph(batch + (m, k), b_batch + (k, n), (dtype, dtype), grid=2)
    plan = ThreadChoice((warps + idle) * WARP, None, None, "hypothesis", ((2, warps),))
    cg = compile_ugraph(g, HW, "llvm", plans={0: plan})
    assert "on tensor cores" in cg.kernels("llvm")[0].rule
    rng = np.random.default_rng(seed)
    xs = [(rng.standard_normal(s.shape) * scale).astype(numpy_dtype(dtype)) for s in g.inputs]
    want = g.run(*xs)[0]
    got = cg.run(*xs)[0].astype(np.float64)
    assert np.linalg.norm(got - want) <= _tolerance(dtype, want)
    assert check_field_twin(g, None, trials=1, seed=seed, hw=HW)


def _matmuls_on_tensor_cores(rules: list[str]) -> int:
    return sum(len(re.findall(r"block matmul #\d+ on tensor cores", r)) for r in rules)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", sorted(MMA_SHAPES))
def test_fused_examples_on_tensor_cores_match_float64(name: str, dtype: str) -> None:
    program, g = ALL_EXAMPLES[name](**MMA_SHAPES[name], dtype=dtype)
    cg = compile_ugraph(g, HW, "llvm")
    assert _matmuls_on_tensor_cores([k.rule for k in cg.kernels("llvm")]) == MMA_MATMULS[name]
    rng = np.random.default_rng(3)
    xs = [rng.uniform(-1.0, 1.0, s.shape).astype(numpy_dtype(dtype)) for s in g.inputs]
    want = program.run(*xs)[0]
    got = cg.run(*xs)[0].astype(np.float64)
    # About one output rounding (2^-11 float16, 2^-8 bfloat16) in norm. bfloat16 MMA operands (a float32 one
    # converted to bfloat16, as the GPU does and the twin does too, included) add their own 2^-9, which does not
    # average out where the operand has one sign (flash_attention's P: exp).
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    in_bfloat16 = dtype == "bfloat16" or any("bfloat16)" in k.rule for k in cg.kernels("llvm"))
    assert rel < (6e-3 if in_bfloat16 else 1e-3)


def test_a_float32_operand_is_rounded_to_bfloat16_in_the_twin_as_on_the_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # flash_attention's P (exp kept in float32) times V (float16): both go to bfloat16 fragments on the GPU, and
    # the llvm twin rounds both the same way before its float32 products. TVM's llvm build drops a cast to
    # bfloat16 and back, so the twin rounds by the bits; without that its products were float32's.
    program, g = ALL_EXAMPLES["flash_attention"](**MMA_SHAPES["flash_attention"])
    cg = compile_ugraph(g, HW, "llvm")
    kernel = cg.kernels("llvm")[0]
    assert "on tensor cores (mma.m16n8k16 bfloat16)" in kernel.rule
    assert re.search(r'T\.reinterpret\("uint32", T\.Cast\("float32", s\d+\[', kernel.script)
    cuda = compile_ugraph(g, HW, "cuda").kernels("cuda")[0]
    assert re.search(r'T\.Cast\("bfloat16", s\d+\[', cuda.script) and "reinterpret" not in cuda.script
    rng = np.random.default_rng(11)
    xs = [rng.uniform(-1.0, 1.0, s.shape).astype(numpy_dtype("float16")) for s in g.inputs]
    want = program.run(*xs)[0]
    rounded = cg.run(*xs)[0].astype(np.float64)
    monkeypatch.setattr(block_mma, "to_mma_dtype", lambda v, t, gpu: v)  # float32 products: what llvm did
    unrounded = compile_ugraph(g, HW, "llvm").run(*xs)[0].astype(np.float64)
    err_rounded = np.linalg.norm(rounded - want) / np.linalg.norm(want)
    err_unrounded = np.linalg.norm(unrounded - want) / np.linalg.norm(want)
    assert not np.array_equal(rounded, unrounded)
    assert err_rounded < 6e-3 and err_unrounded <= err_rounded


@pytest.mark.parametrize("name", ["gated_mlp", "rmsnorm_matmul", "flash_attention", "lora"])
def test_field_twin_of_the_warp_tiling(name: str) -> None:
    program, g = ALL_EXAMPLES[name](**MMA_SHAPES[name])
    assert check_field_twin(g, program, trials=1, seed=5, hw=HW)


# ------------------------------------------------------------------------------------------ CUDA


def _entries(ptx: str) -> dict[str, str]:
    """PTX text of each kernel entry."""
    parts = re.split(r"\.visible \.entry (\w+)\(", ptx)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


# float16 by default (its attention kernels also hold bfloat16 MMAs: P converted); bfloat16 with -m slow (33 s).
@pytest.mark.parametrize("dtype", ["float16", pytest.param("bfloat16", marks=pytest.mark.slow)])
def test_every_fused_example_compiles_to_mma_for_sm_90(dtype: str) -> None:
    from gensorage.codegen.cuda_build import cubin_unavailable_reason, ptx_and_resources

    if cubin_unavailable_reason() is not None:
        pytest.skip(cubin_unavailable_reason())
    with_ldmatrix: list[str] = []
    with_copies: list[str] = []
    for name in sorted(MMA_SHAPES):
        _, g = ALL_EXAMPLES[name](**MMA_SHAPES[name], dtype=dtype)
        cg = compile_ugraph(g, HW, "cuda")
        built = ptx_and_resources(cg.cuda_source(), HW.arch)
        assert built is not None
        ptx, resources = built
        entries = _entries(ptx)
        for kernel in cg.kernels("cuda"):
            body = entries[f"{kernel.name}_kernel"]
            on_tc = set(re.findall(r"on tensor cores \(mma\.m16n8k16 (\w+)\)", kernel.rule))
            found = set(re.findall(r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.(\w+)\.", body))
            assert found == {{"float16": "f16", "bfloat16": "bf16"}[d] for d in on_tc}, (name, kernel.name)
            emitted = "T.ptx_legacy.ldmatrix" in kernel.script
            assert emitted == ("ldmatrix.sync.aligned.m8n8" in body), (name, kernel.name)
            with_ldmatrix += [name] if emitted else []
            copies = 'T.ptx["cp.async.cg.shared.global"]' in kernel.script
            assert copies == ("cp.async.cg.shared.global" in body), (name, kernel.name)
            with_copies += [name] if copies else []
            res = resources[f"{kernel.name}_kernel"]
            assert res.spill_stores == 0 and res.stack_bytes == 0 and res.registers <= 255
    # ldmatrix wherever an operand is a tile of its own in the MMA dtype: every example (qknorm_attention's
    # q @ kᵀ of its float16 normalised q and k; its P @ V converts both operands to bfloat16).
    assert sorted(with_ldmatrix) == sorted(MMA_SHAPES)
    # cp.async tile loads (16-byte runs of float16 rows) in every example.
    assert set(with_copies) == set(MMA_SHAPES)


def test_the_chosen_layout_at_the_papers_flash_attention_shape_does_not_spill() -> None:
    # 64 x 64 tiles: the threads and warps the block cost model chooses together (codegen/mma_threads.py, which
    # prices spills past a thread's share of the registers) keep the accumulators within the registers, with
    # ldmatrix fragments and cp.async tiles.
    from gensorage.codegen.cuda_build import cubin_unavailable_reason, ptx_and_resources

    if cubin_unavailable_reason() is not None:
        pytest.skip(cubin_unavailable_reason())
    _, g = ALL_EXAMPLES["flash_attention"](
        heads=16, q_len=256, kv_len=1024, head_dim=64, q_blocks=4, forloop=16
    )
    cg = compile_ugraph(g, HW, "cuda")
    (kernel,) = cg.kernels("cuda")
    assert "by the block cost model" in kernel.rule
    built = ptx_and_resources(cg.cuda_source(), HW.arch)
    assert built is not None
    ptx, resources = built
    res = resources[f"{kernel.name}_kernel"]
    assert res.spill_stores == 0 and res.stack_bytes == 0
    # The fragment width follows the chosen warp tile (x4.trans for B tiles 16 wide, x2.trans for 8 wide).
    assert "ldmatrix.sync.aligned.m8n8" in ptx and ".trans" in ptx and "cp.async.cg.shared.global" in ptx


def test_the_ptxas_report_is_read_per_kernel() -> None:
    from gensorage.codegen.cuda_build import KernelResources, parse_ptxas_report

    report = """ptxas info    : Compiling entry function 'a_kernel' for 'sm_90'
ptxas info    : Function properties for a_kernel
    16 bytes stack frame, 4 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 42 registers, used 1 barriers, 2048 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function 'b_kernel' for 'sm_90'
ptxas info    : Used 10 registers, used 0 barriers
"""
    assert parse_ptxas_report(report) == {
        "a_kernel": KernelResources(42, 2048, 16, 4, 8),
        "b_kernel": KernelResources(10, 0, 0, 0, 0),
    }


def test_the_cost_model_prices_block_matmuls_that_fit_at_the_tensor_core_peak() -> None:
    import dataclasses

    from gensorage.ugraph.cost import predict_ugraph_time

    no_tensor_cores = dataclasses.replace(HW, peak_flops=tuple((d, c, 0.0) for d, c, _ in HW.peak_flops))
    fits = _matmul_graph((64, 512), (512, 64), ("float16", "float16"))
    assert predict_ugraph_time(fits, HW) < 0.5 * predict_ugraph_time(fits, no_tensor_cores)
    decode = _matmul_graph((1, 512), (512, 64), ("float16", "float16"))  # 1 row: CUDA cores either way
    assert predict_ugraph_time(decode, HW) == predict_ugraph_time(decode, no_tensor_cores)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", sorted(MMA_SHAPES))
def test_fused_examples_on_tensor_cores_run_on_a_gpu(name: str, dtype: str) -> None:
    # The check the CPU cannot make: the fragment layouts and the MMAs themselves, against float64 and against
    # the llvm twin (same roundings; only the order of the float32 sums inside an MMA may differ).
    from gensorage.codegen.cuda_build import cuda_device_available

    if cuda_device_available() is not None:
        pytest.skip(f"needs a CUDA GPU: {cuda_device_available()}")
    program, g = ALL_EXAMPLES[name](**MMA_SHAPES[name], dtype=dtype)
    cg = compile_ugraph(g, HW, "cuda")
    rng = np.random.default_rng(4)
    xs = [rng.uniform(-1.0, 1.0, s.shape).astype(numpy_dtype(dtype)) for s in g.inputs]
    want = program.run(*xs)[0]
    got = np.asarray(cg.run(*xs, target="cuda")[0], dtype=np.float64)
    twin = compile_ugraph(g, HW, "llvm").run(*xs)[0].astype(np.float64)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < (1e-3 if dtype == "float16" else 6e-3)
    assert np.linalg.norm(got - twin) / np.linalg.norm(twin) < (1e-3 if dtype == "float16" else 6e-3)


def test_the_thread_graph_after_a_tensor_core_matmul_runs_on_its_registers() -> None:
    # flash_attention: S = Q K^T (node 3) feeds only the scale-and-exp thread graph (node 4), which runs on the
    # accumulators in the MMA phase: S has no shared tile and no barrier separates the two.
    _, g = ALL_EXAMPLES["flash_attention"](**MMA_SHAPES["flash_attention"])
    script = compile_ugraph(g, HW, "cuda").kernels("cuda")[0].script
    assert "s3 = T." not in script and "s4 = T." in script  # tiles: static arrays, or views of one arena
    mma_phase = script.split("T.ptx_legacy.mma", 1)[1].split("T.tvm_storage_sync", 1)[0]
    assert "T.exp(" in mma_phase and "s4[" in mma_phase

"""Graph-defined kernel ops lowered to TIR: CPU numerics of the lowered code, CUDA builds, golden TVMScript."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gensorage.codegen.barriers import EXPLICIT_BARRIERS
from gensorage.codegen.field_twin import check_field_twin
from gensorage.codegen.module import compile_ugraph
from gensorage.codegen.scalar import FloatScalar
from gensorage.codegen.ugraph_tir import emit_graph_defined
from gensorage.construction.block_threads import MatmulTiling, ThreadChoice
from gensorage.errors import DeviceError, UnsupportedOpError
from gensorage.hw import load_profile
from gensorage.opset import Op
from gensorage.ugraph.examples import EXAMPLES, gated_mlp
from gensorage.ugraph.ir import (
    Accumulator,
    BlockGraph,
    BlockNode,
    BlockOp,
    GraphDefinedOp,
    InputIterator,
    KernelGraph,
    KernelOp,
    OutputSaver,
    Ref,
    TensorSpec,
    ThreadGraph,
    ThreadOp,
)
from gensorage.ugraph.validate import validate

HW = load_profile("h100")


def _inputs(g: KernelGraph, seed: int = 0, dtype: str | None = None) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1.0, 1.0, s.shape).astype(dtype or s.dtype) for s in g.inputs]


def _rel_err(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    return max(
        float(np.abs(a.astype(np.float64) - b).max() / max(1.0, np.abs(b).max()))
        for a, b in zip(got, want, strict=True)
    )


# ------------------------------------------------------------------------------------------ paper examples


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_llvm_matches_program_float32(name: str) -> None:
    program, g = EXAMPLES[name](dtype="float32")
    xs = _inputs(g)
    got = compile_ugraph(g, HW, "llvm").run(*xs)
    assert _rel_err(got, program.run(*xs)) < 1e-5
    assert _rel_err(got, g.run(*xs)) < 1e-5


@pytest.mark.parametrize("name", ["gqa"])
def test_example_llvm_matches_program_float16(name: str) -> None:
    program, g = EXAMPLES[name]()  # float16 tensors, float32 arithmetic
    xs = _inputs(g)
    got = compile_ugraph(g, HW, "llvm").run(*xs)
    assert got[0].dtype == np.float16
    assert _rel_err(got, program.run(*xs)) < 3e-3


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_cuda_source(name: str) -> None:
    _, g = EXAMPLES[name](dtype="float32")  # the float32 test's schedules (construction is memoised)
    cg = compile_ugraph(g, HW, "cuda")
    src = cg.cuda_source()
    kernels = cg.kernels("cuda")
    for k in kernels:
        assert f"{k.name}_kernel(" in src
    assert "__shared__" in src and "__syncthreads()" in src
    for k in kernels:
        # Every phase is a threadIdx.x loop of the block's thread count, chosen once per kernel.
        extents = set(re.findall(r'T\.thread_binding\((\d+), thread="threadIdx\.x"\)', k.script))
        assert extents == {str(k.threads)}


def test_cuda_kernels_have_no_barrier_inside_loops_for_accumulators() -> None:
    # Accumulators live in registers across the for-loop: TVM's barrier insertion finds no shared-memory
    # read-modify-write to protect, so every barrier is one the emitter placed between phases.
    _, g = EXAMPLES["flash_attention"](dtype="float32")
    cg = compile_ugraph(g, HW, "cuda")
    emitted = cg.tir().count("T.tvm_storage_sync")
    assert cg.cuda_source().count("__syncthreads()") == emitted


def _kernel_body(src: str, name: str) -> str:
    """The definition of CUDA kernel ``name`` in ``src`` (from its opening brace to the next kernel)."""
    start = src.index("{", src.index(f"{name}_kernel(", src.index(f"{name}_kernel(") + 1))
    end = src.find('extern "C"', start)
    return src[start : end if end >= 0 else len(src)]


def test_dynamic_shared_memory_kernels_place_every_barrier_themselves() -> None:
    # Two 96 x 100 float32 tiles (75 KiB) need dynamic shared memory; 100 elements per row and 7 * 32 threads
    # leave guarded tails. TVM's dyn barrier planner would refuse (a barrier inside the guard); the kernel
    # carries its own barriers after every phase and the scheduled matmul next to it keeps TVM's.
    specs = (
        TensorSpec("A", (96, 200), "float32"),
        TensorSpec("B", (16, 24), "float32"),
        TensorSpec("C", (24, 8), "float32"),
    )
    nodes: tuple[BlockNode, ...] = (
        InputIterator(0, (1,)),  # [96, 100]
        BlockOp(Op.EXP, (0,)),
        BlockOp(Op.SUM, (1,), {"dim": 1, "keepdim": True}),
        BlockOp(Op.DIV, (1, 2)),
        OutputSaver(3, (1,)),
    )
    g = KernelGraph(
        specs,
        (GraphDefinedOp(BlockGraph((2,), 1, nodes), (0,)), KernelOp(Op.MATMUL, (1, 2))),
        (Ref(3), Ref(4)),
    )
    cg = compile_ugraph(g, HW, "cuda")
    graph, matmul = cg.kernels("cuda")
    assert 'scope="shared.dyn"' in graph.script and EXPLICIT_BARRIERS in graph.script
    src = cg.cuda_source()
    assert "extern __shared__" in src
    # Exactly the emitted barriers in the graph kernel; TVM's own in the scheduled matmul.
    assert _kernel_body(src, graph.name).count("__syncthreads()") == graph.script.count("tvm_storage_sync")
    assert "__syncthreads()" in _kernel_body(src, matmul.name)
    xs = _inputs(g)
    assert _rel_err(compile_ugraph(g, HW, "llvm").run(*xs), g.run(*xs)) < 1e-5


def test_cuda_run_without_gpu_raises_device_error() -> None:
    from gensorage.codegen.cuda_build import cuda_device_available

    if cuda_device_available() is None:
        pytest.skip("a CUDA device is present")
    _, g = EXAMPLES["gated_mlp"](dtype="float32")
    with pytest.raises(DeviceError):
        compile_ugraph(g, HW, "llvm").run(*_inputs(g), target="cuda")


# ------------------------------------------------------------------------------------------ golden TVMScript


def _golden_choice() -> ThreadChoice:
    # Matmul tile [4, 4] (k 8): registers T0 = 2 rows as 2 vthread chunks, T1 = 4 x 2 -> 2 x 2 threads, 2 steps.
    t = MatmulTiling((1, 4, 4), 8, (1, 2, 1), (1, 4, 2), (1, 2, 1), "test")
    # Element-wise tile loads (runs=False): the golden spells out the index arithmetic of each element; the
    # 16-byte cp.async runs are checked by the twins and the PTX tests.
    return ThreadChoice(t.threads, 3, t, "golden", runs=False)


def test_golden_gated_mlp_tir() -> None:
    import tvm
    from tvm.script import tirx as T  # noqa: N812 - TVMScript's conventional name

    @T.prim_func
    def expected(
        in0: T.Buffer((4, 16), "float32"),
        in1: T.Buffer((16, 8), "float32"),
        in2: T.Buffer((16, 8), "float32"),
        out0: T.Buffer((4, 8), "float32"),
    ):
        T.func_attr({"global_symbol": "gated_mlp", "tir.noalias": True, EXPLICIT_BARRIERS: True})
        for bx in T.thread_binding(2, thread="blockIdx.x"):
            # One arena: the accumulators' tiles, written after the loop, reuse the loop's X tile bytes.
            smem = T.alloc_buffer((96,), "float32", scope="shared.dyn")
            s0 = T.decl_buffer((4, 8), "float32", data=smem.data, elem_offset=0, scope="shared.dyn")
            s1 = T.decl_buffer((8, 4), "float32", data=smem.data, elem_offset=32, scope="shared.dyn")
            s2 = T.decl_buffer((8, 4), "float32", data=smem.data, elem_offset=64, scope="shared.dyn")
            s5 = T.decl_buffer((4, 4), "float32", data=smem.data, elem_offset=0, scope="shared.dyn")
            s6 = T.decl_buffer((4, 4), "float32", data=smem.data, elem_offset=16, scope="shared.dyn")
            a5 = T.alloc_buffer((4,), "float32", scope="local")
            a6 = T.alloc_buffer((4,), "float32", scope="local")
            for it in T.serial(2):
                # X tile [4, 8]: fmap splits the k dim over the loop.
                for tx in T.thread_binding(4, thread="threadIdx.x"):
                    for e0 in range(8):
                        f0 = e0 * 4 + tx
                        s0[f0 // 8, f0 % 8] = in0[f0 // 8, it * 8 + f0 % 8]
                # W tiles [8, 4]: imap x splits columns, fmap splits rows; the three loads share one barrier.
                for tx in T.thread_binding(4, thread="threadIdx.x"):
                    for e1 in range(8):
                        f1 = e1 * 4 + tx
                        s1[f1 // 4, f1 % 4] = in1[it * 8 + f1 // 4, bx * 4 + f1 % 4]
                for tx in T.thread_binding(4, thread="threadIdx.x"):
                    for e2 in range(8):
                        f2 = e2 * 4 + tx
                        s2[f2 // 4, f2 % 4] = in2[it * 8 + f2 // 4, bx * 4 + f2 % 4]
                T.tvm_storage_sync("shared")
                # Row i = 2 * chunk + thread row (vthreads), column j = 2 * step + thread column.
                for tx in T.thread_binding(4, thread="threadIdx.x"):
                    acc0 = T.alloc_buffer((2,), "float32", scope="local")
                    for sj0 in range(2):
                        for r0 in T.unroll(2):
                            acc0[r0] = T.float32(0.0)
                        for k0 in range(8):
                            for ri0 in T.unroll(2):
                                acc0[ri0] = acc0[ri0] + s0[ri0 * 2 + tx // 2, k0] * s1[k0, sj0 * 2 + tx % 2]
                        for ri1 in T.unroll(2):
                            a5[sj0 * 2 + ri1] = T.if_then_else(
                                it == 0, acc0[ri1], a5[sj0 * 2 + ri1] + acc0[ri1]
                            )
                for tx in T.thread_binding(4, thread="threadIdx.x"):
                    acc1 = T.alloc_buffer((2,), "float32", scope="local")
                    for sj1 in range(2):
                        for r1 in T.unroll(2):
                            acc1[r1] = T.float32(0.0)
                        for k1 in range(8):
                            for ri2 in T.unroll(2):
                                acc1[ri2] = acc1[ri2] + s0[ri2 * 2 + tx // 2, k1] * s2[k1, sj1 * 2 + tx % 2]
                        for ri3 in T.unroll(2):
                            a6[sj1 * 2 + ri3] = T.if_then_else(
                                it == 0, acc1[ri3], a6[sj1 * 2 + ri3] + acc1[ri3]
                            )
                T.tvm_storage_sync("shared")
            # Register accumulators flushed with the same element-to-thread map.
            for tx in T.thread_binding(4, thread="threadIdx.x"):
                for sl0 in range(4):
                    s5[(sl0 % 2) * 2 + tx // 2, (sl0 // 2) * 2 + tx % 2] = a5[sl0]
                for sl1 in range(4):
                    s6[(sl1 % 2) * 2 + tx // 2, (sl1 // 2) * 2 + tx % 2] = a6[sl1]
            T.tvm_storage_sync("shared")
            # Thread graph silu(A) * B in registers, saved by omap x -> columns.
            for tx in T.thread_binding(4, thread="threadIdx.x"):
                for e3 in range(4):
                    f3 = e3 * 4 + tx
                    r2 = T.alloc_buffer((1,), "float32", scope="local")
                    r2[0] = s5[f3 // 4, f3 % 4]
                    r3 = T.alloc_buffer((1,), "float32", scope="local")
                    r3[0] = s6[f3 // 4, f3 % 4]
                    r4 = T.alloc_buffer((1,), "float32", scope="local")
                    r4[0] = r2[0] / (T.float32(1.0) + T.exp(T.float32(0.0) - r2[0]))
                    r5 = T.alloc_buffer((1,), "float32", scope="local")
                    r5[0] = r4[0] * r3[0]
                    out0[f3 // 4, f3 % 4 + bx * 4] = r5[0]

    _, g = gated_mlp(m=4, k=16, n=8, blocks=2, forloop=2, dtype="float32")
    kt = emit_graph_defined(
        g, 0, validate(g), _golden_choice(), target="cuda", scalar=FloatScalar(), name="gated_mlp"
    )
    tvm.ir.assert_structural_equal(tvm.script.from_source(kt.text), expected)


def test_golden_choice_runs_correctly_on_cpu() -> None:
    _, g = gated_mlp(m=4, k=16, n=8, blocks=2, forloop=2, dtype="float32")
    xs = _inputs(g)
    got = compile_ugraph(g, HW, "llvm", plans={0: _golden_choice()}).run(*xs)
    assert _rel_err(got, g.run(*xs)) < 1e-6


def test_cpu_variant_is_the_cuda_text_with_loops() -> None:
    _, g = gated_mlp(m=4, k=16, n=8, blocks=2, forloop=2, dtype="float32")
    info = validate(g)
    gpu = emit_graph_defined(g, 0, info, _golden_choice(), target="cuda", scalar=FloatScalar(), name="k").text
    cpu = emit_graph_defined(g, 0, info, _golden_choice(), target="llvm", scalar=FloatScalar(), name="k").text
    mapped = (
        gpu.replace('T.thread_binding(2, thread="blockIdx.x")', "T.parallel(2)")
        .replace('T.thread_binding(4, thread="threadIdx.x")', "T.serial(4)")
        .replace('scope="shared.dyn"', 'scope="global"')
        .replace(f', "{EXPLICIT_BARRIERS}": True', "")  # the CPU has no barriers to place
    )
    mapped = "\n".join(ln for ln in mapped.splitlines() if "tvm_storage_sync" not in ln) + "\n"
    # Registers that persist across phases get a row per (serial) thread on the CPU; nothing else differs.
    mapped = mapped.replace(
        'a5 = T.alloc_buffer((4,), "float32", scope="local")',
        'a5 = T.alloc_buffer((4, 4), "float32", scope="global")',
    ).replace(
        'a6 = T.alloc_buffer((4,), "float32", scope="local")',
        'a6 = T.alloc_buffer((4, 4), "float32", scope="global")',
    )
    mapped = re.sub(r"\b(a[56])\[", r"\1[tx, ", mapped)
    assert mapped == cpu


# ------------------------------------------------------------------------------------------ index arithmetic


def _eval_ix(text: str, env: dict[str, int]) -> int:
    """Evaluate index text made of names, integers, +, -, *, // and % (what :class:`Ix` prints)."""
    import ast

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return env[node.id]
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left), ev(node.right)
            ops = {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}
            if isinstance(node.op, ast.FloorDiv):
                return a // b
            if isinstance(node.op, ast.Mod):
                return a % b
            return ops[type(node.op)]
        raise AssertionError(f"unexpected index syntax {ast.dump(node)}")

    return ev(ast.parse(text, mode="eval"))


_dims = st.lists(st.sampled_from([1, 2, 3, 4, 6]), min_size=1, max_size=4)


@settings(max_examples=150, deadline=None)
@given(src=_dims, data=st.data())
def test_reshape_index_matches_numpy(src: list[int], data: st.DataObject) -> None:
    from gensorage.codegen.tir_text import Ix, reshape_index

    total = math.prod(src)
    # A destination shape of the same size: factor the element count at random.
    dst: list[int] = []
    rest = total
    while rest > 1 and len(dst) < 4:
        d = data.draw(st.sampled_from([x for x in range(1, rest + 1) if rest % x == 0]))
        dst.append(d)
        rest //= d
    dst.append(rest)
    flat = data.draw(st.integers(0, total - 1))
    didx = [int(i) for i in np.unravel_index(flat, dst)]
    names = [f"i{d}" for d in range(len(dst))]
    got = [
        _eval_ix(str(e), dict(zip(names, didx, strict=True)))
        for e in reshape_index([Ix.var(n) for n in names], src, dst)
    ]
    assert got == [int(i) for i in np.unravel_index(flat, src)]


# ------------------------------------------------------------------------------------------ tilings


@st.composite
def _tilings(draw: st.DrawFn, extents: tuple[int, int, int], k: int) -> MatmulTiling:
    t0, t1, v = [], [], []
    for e in extents:
        a = draw(st.integers(1, e))
        b = draw(st.integers(a, e))
        vt = draw(st.sampled_from([x for x in (1, 2, 4) if a % x == 0]))
        t0.append(a)
        t1.append(b)
        v.append(vt)
    return MatmulTiling(extents, k, tuple(t0), tuple(t1), tuple(v), "hypothesis")  # type: ignore[arg-type]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_register_tiling_computes_the_same(data: st.DataObject) -> None:
    # Non-dividing tiles (guards), vthread chunks and several T1 steps: all index the same elements.
    _, g = EXAMPLES["flash_attention"](
        heads=2, q_len=6, kv_len=12, head_dim=5, q_blocks=1, forloop=2, dtype="float32"
    )
    t = data.draw(_tilings((1, 6, 6), 5))
    choice = ThreadChoice(t.threads, 3, t, "hypothesis")
    xs = _inputs(g, seed=1)
    got = compile_ugraph(g, HW, "llvm", plans={0: choice}).run(*xs)
    assert _rel_err(got, g.run(*xs)) < 1e-5


def test_dynamic_shared_memory_decode_attention_builds_for_cuda() -> None:
    # Decode attention with 64 KiB K and V tiles: dynamic shared memory, and the scalar Σ exp tile is written
    # after the loop by one thread. TVM's shared-memory merge lost that tile's offset ("buffer_byte_offsets");
    # the kernel now lays its tiles out in one arena itself, which must not grow past the tiles it holds.
    from gensorage.codegen.gpu_limits import block_resources
    from gensorage.codegen.module import ir_module

    program, g = EXAMPLES["flash_attention"](
        heads=2, q_len=1, kv_len=1024, head_dim=64, q_blocks=1, forloop=4, dtype="float32"
    )
    cg = compile_ugraph(g, HW, "cuda")
    (kern,) = cg.kernels("cuda")
    shared = [line for line in kern.script.splitlines() if "T.alloc_buffer" in line and "shared" in line]
    assert len(shared) == 1 and 'scope="shared.dyn"' in shared[0]
    tiles = 2 * 64 * 256 * 4  # the K and V tiles alone
    assert tiles < block_resources(ir_module([kern])).shared_bytes < tiles + 8 * 1024
    assert cg.cuda_source().count("extern __shared__") == 1
    xs = _inputs(g)
    assert _rel_err(compile_ugraph(g, HW, "llvm").run(*xs), program.run(*xs)) < 1e-5


def test_inconsistent_tiling_is_rejected() -> None:
    _, g = gated_mlp(m=4, k=16, n=8, blocks=2, forloop=2, dtype="float32")
    t = MatmulTiling((1, 4, 4), 8, (1, 3, 1), (1, 4, 2), (1, 2, 1), "bad")  # vthreads 2 do not divide T0=3
    with pytest.raises(UnsupportedOpError, match="does not nest"):
        compile_ugraph(g, HW, "llvm", plans={0: ThreadChoice(t.threads, 3, t, "bad")})


def test_markov_construct_picks_threads_and_registers() -> None:
    from gensorage.construction import construct_schedule, matmul_workload
    from gensorage.markov.space import space_for

    # float32 tiles: the block matmuls run on CUDA cores, so the construction sizes the block (a block with a
    # tensor-core matmul gets its threads from the cost model: tests/test_mma_threads.py)
    _, g = EXAMPLES["flash_attention"](
        heads=2, q_len=64, kv_len=128, head_dim=32, q_blocks=2, forloop=4, dtype="float32"
    )
    cg = compile_ugraph(g, HW, "llvm")
    plan = cg.plans[0]
    wl = matmul_workload(1, 32, 32, 32, "float32")
    s = construct_schedule(wl, HW)
    assert plan.tiling is not None and plan.matmul_node == 3
    assert plan.tiling.constructed_t1 == (1, *s.tiles[1][:2])
    assert plan.tiling.t0 == (1, *s.tiles[0][:2]) and plan.tiling.vthreads == (1, *s.vthreads[:2])
    # 4 blocks cannot fill the GPU with the constructor's T1: it is widened to the whole 32 x 32 tile.
    assert plan.tiling.t1 == (1, 32, 32) and plan.threads == math.prod(
        -(-32 // t0) for t0 in plan.tiling.t0[1:]
    ) >= space_for(wl, HW).threads(s)
    assert "widened to the fixed grid" in plan.rule


def test_block_tile_widens_along_j_then_i_within_the_cap() -> None:
    from gensorage.construction.block_threads import widen_block_tile

    assert widen_block_tile((1, 1, 256), (1, 1, 1), (1, 1, 2), 1024) == (1, 1, 256)
    assert widen_block_tile((1, 64, 64), (1, 1, 1), (1, 8, 4), 1024) == (1, 16, 64)
    assert widen_block_tile((1, 64, 64), (1, 2, 2), (1, 8, 4), 1024) == (1, 64, 64)
    assert widen_block_tile((2, 8, 100), (1, 1, 1), (1, 1, 3), 64) == (1, 1, 48)  # 3 -> 6 -> 12 -> 24 -> 48
    assert widen_block_tile((1, 1, 2), (1, 1, 1), (1, 1, 2), 1) == (
        1,
        1,
        2,
    )  # never narrower than constructed


def test_decode_attention_block_gets_a_thread_per_score() -> None:
    # One query row against 256 keys per iteration on a 32-block grid: 256 threads, not the 2-4 the
    # constructor picks for a standalone 1 x 256 matmul (it would spread that over many tiny blocks).
    _, g = EXAMPLES["flash_attention"](heads=32, q_len=1, kv_len=4096, head_dim=128, q_blocks=1, forloop=16)
    plan = compile_ugraph(g, HW, "llvm").plans[0]
    assert plan.tiling is not None and plan.tiling.t1 == (1, 1, 256) and plan.threads == 256


def test_fallback_threads_without_matmul() -> None:
    _, g = EXAMPLES["flash_decoding"](dtype="float32")
    cg = compile_ugraph(g, HW, "llvm")
    assert cg.plans[1].tiling is None
    assert cg.plans[1].threads % HW.warp_size == 0
    assert "fallback" in cg.plans[1].rule


def test_block_without_a_construction_schedule_uses_the_fallback_rule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gensorage.codegen import ugraph_tir
    from gensorage.errors import ScheduleError

    def no_schedule(*args: object, **kwargs: object) -> None:
        raise ScheduleError("nothing fits")

    monkeypatch.setattr(ugraph_tir, "matmul_tiling", no_schedule)
    _, g = gated_mlp(m=4, k=16, n=8, blocks=2, forloop=2, dtype="float32")
    cg = compile_ugraph(g, HW, "llvm")
    assert cg.plans[0].tiling is None and "nothing fits" in cg.plans[0].rule
    xs = _inputs(g)
    assert _rel_err(cg.run(*xs), g.run(*xs)) < 1e-6


# ------------------------------------------------------------------------------------------ random µGraphs


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def _block_graphs(draw: st.DrawFn) -> KernelGraph:
    """A random valid one-kernel µGraph: 1-3 grid dims (replicas, nested splits of one dim), an optional loop
    with sum / concat accumulators, broadcasting block ops, a group sum, a thread graph with two outputs of
    different shapes, an optional reshape view, and random omaps."""
    rank = draw(st.sampled_from([2, 3]))
    shape = [draw(st.sampled_from([2, 3, 4, 6])) for _ in range(rank)]
    ngrid = draw(st.integers(1, rank))
    grid, imap, tile = [], [], list(shape)
    for _ in range(ngrid):
        d = draw(st.sampled_from([None, *range(rank)]))
        if d is None:
            grid.append(draw(st.sampled_from([1, 2])))
        else:
            grid.append(draw(st.sampled_from(_divisors(tile[d]))))
            tile[d] //= grid[-1]
        imap.append(d)
    loop_dims = [d for d in range(rank) if tile[d] % 2 == 0]
    forloop, fmap = (2, draw(st.sampled_from(loop_dims))) if loop_dims and draw(st.booleans()) else (1, None)
    if fmap is not None:
        tile[fmap] //= forloop
    last = rank - 1
    # The row operand [1, .., n] follows A's splits of the last dim and is replicated along the others.
    row_imap = tuple(last if d == last else None for d in imap)
    red = draw(st.integers(0, last))
    red2 = draw(st.integers(0, last))
    group = draw(st.sampled_from(_divisors(tile[red2])))
    nodes: list[BlockNode] = [
        InputIterator(0, tuple(imap), fmap),  # 0: A tile
        InputIterator(1, tuple(imap), fmap),  # 1: B tile
        InputIterator(2, row_imap, last if fmap == last else None),  # 2: row tile [1, .., t]
        BlockOp(Op.MUL, (0, 1)),  # 3
        BlockOp(Op.SUB, (3, 2)),  # 4: broadcast
        BlockOp(Op.SUM, (4,), {"dim": red, "keepdim": True}),  # 5: dim red reduced to 1
        ThreadGraph(
            (4, 5), (ThreadOp(Op.MUL, (0, 1)), ThreadOp(Op.SCALE, (1,), {"factor": 0.25})), (2, 3)
        ),  # 6: outputs of the full tile and of the reduced shape
        BlockOp(Op.SUM, (4,), {"dim": red2, "keepdim": True, "group": group}),  # 7: group sum
    ]
    outs = [Ref(6, 0), Ref(6, 1), Ref(7)]
    out_shapes = [
        list(tile),
        [1 if i == red else t for i, t in enumerate(tile)],
        [t // group if i == red2 else t for i, t in enumerate(tile)],
    ]
    if forloop > 1:
        for o in range(len(outs)):
            cat = draw(st.sampled_from([None, *range(rank)]))
            nodes.append(Accumulator(outs[o], "sum", cat))
            outs[o] = Ref(len(nodes) - 1)
            if cat is not None:
                out_shapes[o][cat] *= forloop
    out_rank = rank
    if ngrid <= 2 and draw(st.booleans()):
        s0 = out_shapes[0]
        nodes.append(BlockOp(Op.RESHAPE, (outs[0],), {"shape": (math.prod(s0[:-1]), s0[-1])}))
        outs[0] = Ref(len(nodes) - 1)
        out_rank = 2
    for o, r in enumerate(outs):
        dims = list(range(out_rank if o == 0 else rank))
        nodes.append(OutputSaver(r, tuple(draw(st.permutations(dims))[:ngrid])))
    block = BlockGraph(tuple(grid), forloop, tuple(nodes))
    row = [1] * last + [shape[-1]]
    return KernelGraph(
        _specs(shape, row), (GraphDefinedOp(block, (0, 1, 2)),), tuple(Ref(3, o) for o in range(3))
    )


def _specs(shape: list[int], row: list[int]) -> tuple[TensorSpec, ...]:
    return (
        TensorSpec("A", tuple(shape), "float32"),
        TensorSpec("B", tuple(shape), "float32"),
        TensorSpec("C", tuple(row), "float32"),
    )


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=_block_graphs())
def test_random_ugraphs_llvm_and_field_twin_match_the_evaluator(g: KernelGraph) -> None:
    validate(g)  # the strategy only builds valid graphs
    cg = compile_ugraph(g, HW, "llvm")
    xs = _inputs(g, seed=3)
    assert _rel_err(cg.run(*xs), g.run(*xs)) < 1e-5
    assert check_field_twin(g, None, trials=1, seed=5, twin=cg.field_twin())


# ------------------------------------------------------------------------------------------ more constructs


def _one_kernel(
    specs: tuple[TensorSpec, ...], grid: tuple[int, ...], forloop: int, nodes: tuple[BlockNode, ...]
) -> KernelGraph:
    return KernelGraph(
        specs,
        (GraphDefinedOp(BlockGraph(grid, forloop, nodes), tuple(range(len(specs)))),),
        (Ref(len(specs)),),
    )


def test_max_accumulator_repeat_view_and_nested_grid() -> None:
    # Two grid dims split one data dim (x outermost), a repeat view, max accumulation in registers.
    specs = (TensorSpec("A", (8, 6), "float32"),)
    nodes: tuple[BlockNode, ...] = (
        InputIterator(0, (0, 0), 1),  # tile [2, 3]
        BlockOp(Op.REPEAT, (0,), {"dim": 1, "times": 2}),  # [2, 6]
        BlockOp(Op.EXP, (1,)),
        Accumulator(2, "max"),
        OutputSaver(3, (0, 1)),
    )
    g = _one_kernel(specs, (2, 2), 2, nodes)
    xs = _inputs(g)
    got = compile_ugraph(g, HW, "llvm").run(*xs)
    assert _rel_err(got, g.run(*xs)) < 1e-6


def test_accumulating_a_loop_invariant_tile() -> None:
    # An iterator without fmap feeding an accumulator directly must be re-read every iteration.
    specs = (TensorSpec("A", (4, 4), "float32"), TensorSpec("B", (4, 8), "float32"))
    nodes: tuple[BlockNode, ...] = (
        InputIterator(0, (None,)),
        InputIterator(1, (None,), 1),
        Accumulator(0),
        Accumulator(1, "sum", 1),
        BlockOp(Op.MATMUL, (2, 3)),
        OutputSaver(4, (0,)),
    )
    g = _one_kernel(specs, (1,), 2, nodes)
    xs = _inputs(g)
    got = compile_ugraph(g, HW, "llvm").run(*xs)
    assert _rel_err(got, g.run(*xs)) < 1e-6


def test_batched_block_matmul_with_broadcast_and_sum_without_keepdim() -> None:
    specs = (TensorSpec("A", (3, 4, 6), "float32"), TensorSpec("B", (6, 5), "float32"))
    nodes: tuple[BlockNode, ...] = (
        InputIterator(0, (0,)),  # [1, 4, 6]
        InputIterator(1, (None,)),  # [6, 5] broadcast over the batch
        BlockOp(Op.MATMUL, (0, 1)),  # [1, 4, 5]
        BlockOp(Op.SUM, (2,), {"dim": 1, "keepdim": False}),  # [1, 5]
        BlockOp(Op.SQRT, (3,)),
        OutputSaver(4, (0,)),
    )
    g = _one_kernel(specs, (3,), 1, nodes)
    xs = [np.abs(x) for x in _inputs(g)]
    got = compile_ugraph(g, HW, "llvm").run(*xs)
    assert _rel_err(got, g.run(*xs)) < 1e-6


def test_saver_of_an_input_tile_and_two_outputs() -> None:
    specs = (TensorSpec("A", (4, 6), "float32"),)
    nodes: tuple[BlockNode, ...] = (
        InputIterator(0, (1, 0)),  # [2, 3]
        BlockOp(Op.RELU, (0,)),
        OutputSaver(0, (0, 1)),  # copy with dims swapped between grid and data: [2*3, 3*2]
        OutputSaver(1, (1, 0)),
    )
    g = KernelGraph(specs, (GraphDefinedOp(BlockGraph((2, 2), 1, nodes), (0,)),), (Ref(1, 0), Ref(1, 1)))
    xs = _inputs(g)
    got = compile_ugraph(g, HW, "llvm").run(*xs)
    assert _rel_err(got, g.run(*xs)) < 1e-7


def test_non_float_tensors_are_unsupported() -> None:
    specs = (TensorSpec("A", (4, 4), "int32"),)
    nodes: tuple[BlockNode, ...] = (InputIterator(0, (0,)), BlockOp(Op.ADD, (0, 0)), OutputSaver(1, (0,)))
    with pytest.raises(UnsupportedOpError, match="float"):
        compile_ugraph(_one_kernel(specs, (2,), 1, nodes), HW, "llvm")


def test_grid_beyond_cuda_limits_is_unsupported() -> None:
    specs = (TensorSpec("A", (2, 70000), "float32"),)
    nodes: tuple[BlockNode, ...] = (InputIterator(0, (0, 1)), BlockOp(Op.EXP, (0,)), OutputSaver(1, (0, 1)))
    with pytest.raises(UnsupportedOpError, match="grid dim y"):
        compile_ugraph(_one_kernel(specs, (2, 70000), 1, nodes), HW, "cuda")


# ------------------------------------------------------------------------------------------ paper shapes


PAPER_SHAPES = {
    "gated_mlp": dict(m=8, k=4096, n=4096, blocks=64, forloop=64),
    "rmsnorm_matmul": dict(batch=8, hidden=4096, out=4096, blocks=64, forloop=64),
    "lora": dict(m=16, k=1024, n=4096, rank=16, n_blocks=256, m_blocks=1),
    "flash_attention": dict(heads=16, q_len=256, kv_len=1024, head_dim=64, q_blocks=4, forloop=16),
    "gqa": dict(
        kv_heads=8, group=8, q_len=1, kv_len=4096, head_dim=128, kv_splits=16, forloop=8, out_splits=2
    ),
    "qknorm_attention": dict(heads=16, q_len=256, kv_len=1024, head_dim=64, q_blocks=4, forloop=16),
    "flash_decoding": dict(heads=32, kv_len=4096, head_dim=128, splits=16, forloop=8),
}


def test_paper_shape_flash_decoding() -> None:
    program, g = EXAMPLES["flash_decoding"](**PAPER_SHAPES["flash_decoding"])  # type: ignore[arg-type]
    xs = _inputs(g)
    assert _rel_err(compile_ugraph(g, HW, "llvm").run(*xs), program.run(*xs)) < 3e-3


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(PAPER_SHAPES) - {"flash_decoding"}))
def test_paper_shapes(name: str) -> None:
    program, g = EXAMPLES[name](**PAPER_SHAPES[name])  # type: ignore[arg-type]
    xs = _inputs(g)
    cg = compile_ugraph(g, HW, "llvm")
    assert _rel_err(cg.run(*xs), program.run(*xs)) < 3e-3
    assert "__global__" in cg.cuda_source()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gqa", "qknorm_attention"])
def test_nvcc_compiles_the_cuda_source(name: str) -> None:
    # gqa at the paper's shape uses static shared memory, qknorm_attention dynamic (explicit barriers).
    from gensorage.codegen.cuda_build import cubin_unavailable_reason

    if cubin_unavailable_reason() is not None:
        pytest.skip(cubin_unavailable_reason())
    _, g = EXAMPLES[name](**PAPER_SHAPES[name])  # type: ignore[arg-type]
    cubin = compile_ugraph(g, HW, "cuda").cubin()
    assert cubin is not None and len(cubin) > 0

"""Pre-defined kernel ops lowered to TIR: construction-tuned matmuls, thread-parallel elementwise/reduction ops."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gensorage.codegen.field_twin import check_field_twin
from gensorage.codegen.lower_schedule import threads_per_block
from gensorage.codegen.module import compile_ugraph
from gensorage.construction import construct_schedule, matmul_workload
from gensorage.hw import load_profile
from gensorage.opset import Op
from gensorage.ugraph.examples import EXAMPLES
from gensorage.ugraph.from_program import from_program
from gensorage.ugraph.ir import KernelGraph, KernelOp, Ref, TensorSpec

HW = load_profile("h100")


def _inputs(g: KernelGraph, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(0.1, 1.0, s.shape).astype(s.dtype) for s in g.inputs]


def _rel_err(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    return max(
        float(np.abs(a.astype(np.float64) - b).max() / max(1.0, np.abs(b).max()))
        for a, b in zip(got, want, strict=True)
    )


# lora, qknorm_attention and flash_decoding add no op kind the others lack; their (slow) construction runs
# in the slow set.
FAST = ["flash_attention", "gated_mlp", "gqa", "rmsnorm_matmul"]
SLOW = sorted(set(EXAMPLES) - set(FAST))


@pytest.mark.parametrize("name", [*FAST, *(pytest.param(n, marks=pytest.mark.slow) for n in SLOW)])
def test_direct_ugraph_of_each_example_program(name: str) -> None:
    # One pre-defined kernel per program op (matmul, batched matmul, repeat, sum, exp, div, silu, sqrt, ...).
    program, _ = EXAMPLES[name](dtype="float32")
    g = from_program(program)
    xs = _inputs(g)
    cg = compile_ugraph(g, HW, "llvm")
    assert _rel_err(cg.run(*xs), program.run(*xs)) < 1e-5
    src = cg.cuda_source()
    assert src.count('extern "C" __global__') == 2 * len(cg.kernels("cuda"))


@pytest.mark.parametrize("name", FAST)
def test_direct_ugraph_field_twin(name: str) -> None:
    program, _ = EXAMPLES[name](dtype="float32")  # the float32 tests' schedules (construction is memoised)
    g = from_program(program)
    result = check_field_twin(g, program, trials=2, seed=1, hw=HW)
    assert result, str(result)


def _graph(
    specs: list[tuple[str, tuple[int, ...]]], ops: list[KernelOp], dtype: str = "float32"
) -> KernelGraph:
    inputs = tuple(TensorSpec(n, s, dtype) for n, s in specs)
    return KernelGraph(inputs, tuple(ops), (Ref(len(inputs) + len(ops) - 1),))


MATMULS = [
    [("A", (2, 3, 4, 5)), ("B", (5, 6))],  # batch on one side only
    [("A", (4, 5)), ("B", (2, 3, 5, 6))],
    [("A", (2, 1, 4, 5)), ("B", (1, 3, 5, 6))],  # batch broadcast both ways
    [("A", (17, 9)), ("B", (9, 33))],  # extents the tiles do not divide
]


@pytest.mark.parametrize(
    "specs",
    MATMULS,
    ids=lambda s: "x".join(str(d) for d in s[0][1]) + "@" + "x".join(str(d) for d in s[1][1]),
)
def test_broadcast_matmul_numerics_and_twin(specs: list[tuple[str, tuple[int, ...]]]) -> None:
    g = _graph(specs, [KernelOp(Op.MATMUL, (0, 1))])
    xs = _inputs(g)
    cg = compile_ugraph(g, HW, "llvm")
    np.testing.assert_allclose(cg.run(*xs)[0], np.matmul(*[x.astype(np.float64) for x in xs]), rtol=1e-5)
    assert check_field_twin(g, None, trials=1, twin=cg.field_twin())


def test_float16_matmul_accumulates_in_float32_and_casts() -> None:
    g = _graph([("A", (8, 64)), ("B", (64, 16))], [KernelOp(Op.MATMUL, (0, 1))], dtype="float16")
    xs = _inputs(g)
    cg = compile_ugraph(g, HW, "llvm")
    got = cg.run(*xs)[0]
    assert got.dtype == np.float16
    want = xs[0].astype(np.float64) @ xs[1].astype(np.float64)
    assert np.abs(got - want).max() / np.abs(want).max() < 2e-3
    assert "float32" in cg.tir()  # the register accumulator


def test_float32_matmul_follows_the_construction_schedule() -> None:
    # float32 has no MMA path: the CUDA-core kernel of the Markov construction.
    g = _graph([("A", (8, 64)), ("B", (64, 16))], [KernelOp(Op.MATMUL, (0, 1))], dtype="float32")
    cg = compile_ugraph(g, HW, "cuda")
    (kernel,) = cg.kernels("cuda")
    wl = matmul_workload(1, 8, 16, 64, "float32")
    assert kernel.threads == threads_per_block(wl, construct_schedule(wl, HW))
    assert "markov construct" in kernel.rule
    assert "threadIdx.x" in kernel.script and "shared" in kernel.script
    assert "__syncthreads" in cg.cuda_source()


def test_float16_matmul_runs_on_tensor_cores_with_the_constructed_tiles() -> None:
    from gensorage.construction.tensor_core import construct_tensor_core

    g = _graph([("A", (2, 40, 64)), ("B", (64, 48))], [KernelOp(Op.MATMUL, (0, 1))], dtype="float16")
    cg = compile_ugraph(g, HW, "cuda")
    (kernel,) = cg.kernels("cuda")
    tiles, _ = construct_tensor_core((2, 40, 48, 64), HW)
    assert kernel.rule.startswith("tensor-core") and tiles.describe() in kernel.rule
    assert kernel.threads == tiles.threads
    assert "mma.sync.aligned.m16n8k16" in cg.cuda_source()
    xs = _inputs(g)
    cpu = compile_ugraph(g, HW, "llvm")
    want = np.matmul(*[x.astype(np.float64) for x in xs])
    assert np.abs(cpu.run(*xs)[0] - want).max() / np.abs(want).max() < 2e-3
    assert check_field_twin(g, None, trials=1, twin=cpu.field_twin())


def test_reductions_views_and_copies() -> None:
    specs = [("X", (4, 6, 8)), ("Y", (6, 1)), ("Z", (4, 6, 2))]
    ops = [
        KernelOp(Op.ADD, (0, 1)),  # %3 broadcast [4, 6, 8] + [6, 1]
        KernelOp(Op.SUM, (3,), {"dim": 2, "group": 4}),  # %4 [4, 6, 2]
        KernelOp(Op.CONCAT, (4, 2, 4), {"dim": 2}),  # %5 [4, 6, 6]
        KernelOp(Op.REPEAT, (5,), {"dim": 0, "times": 2}),  # %6 [8, 6, 6]
        KernelOp(Op.RESHAPE, (6,), {"shape": (48, 6)}),  # %7 a view, no kernel
        KernelOp(Op.SUM, (7,), {"dim": 0, "keepdim": False}),  # %8 [6]
        KernelOp(Op.SQRT, (8,)),
    ]
    g = _graph(specs, ops)
    xs = _inputs(g)
    cg = compile_ugraph(g, HW, "llvm")
    assert not any(k.name.endswith("reshape") for k in cg.kernels())
    assert _rel_err(cg.run(*xs), g.run(*xs)) < 1e-6
    assert check_field_twin(g, None, trials=1, twin=cg.field_twin())


def test_elementwise_ops_and_activations() -> None:
    specs = [("X", (3, 5)), ("Y", (5,))]
    ops = [
        KernelOp(Op.DIV, (0, 1)),  # %2
        KernelOp(Op.SUB, (2, 0)),
        KernelOp(Op.GELU, (3,)),
        KernelOp(Op.RELU, (4,)),
        KernelOp(Op.SCALE, (5,), {"factor": -1.5}),
        KernelOp(Op.SILU, (6,)),
        KernelOp(Op.EXP, (7,)),
    ]
    g = _graph(specs, ops)
    xs = _inputs(g)
    cg = compile_ugraph(g, HW, "llvm")
    assert _rel_err(cg.run(*xs), g.run(*xs)) < 1e-6
    assert check_field_twin(g, None, trials=2, twin=cg.field_twin())


def test_matmul_without_a_construction_schedule_falls_back_to_one_thread_per_element(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gensorage.codegen import predefined_matmul
    from gensorage.errors import ScheduleError

    def no_schedule(*args: object, **kwargs: object) -> None:
        raise ScheduleError("nothing fits")

    monkeypatch.setattr(predefined_matmul, "construct_schedule", no_schedule)
    # float32: the tensor-core path (float16 only) does not apply either.
    g = _graph([("A", (2, 3, 4, 5)), ("B", (5, 6))], [KernelOp(Op.MATMUL, (0, 1))], dtype="float32")
    cg = compile_ugraph(g, HW, "llvm")
    (kernel,) = cg.kernels()
    assert "fallback" in kernel.rule and kernel.threads % HW.warp_size == 0
    xs = _inputs(g)
    want = np.matmul(*[x.astype(np.float64) for x in xs])
    assert np.abs(cg.run(*xs)[0] - want).max() / np.abs(want).max() < 2e-3
    assert check_field_twin(g, None, trials=1, twin=cg.field_twin())


# ------------------------------------------------------------------------------------ cooperative sums


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.integers(1, 21),
    count=st.integers(64, 700),
    keep=st.booleans(),
    groups=st.integers(1, 3),
    lead=st.integers(1, 3),
)
def test_cooperative_sum_matches_numpy(rows: int, count: int, keep: bool, groups: int, lead: int) -> None:
    # Row sums (keepdim or not) and group sums over the last dim, any number of rows and any count, so the
    # lanes' tail guard, the outputs-per-block guard and every lane count are exercised.
    n = count * groups
    attrs: dict[str, object] = {"dim": -1, "keepdim": keep} if groups == 1 else {"dim": 2, "group": count}
    g = _graph([("X", (lead, rows, n))], [KernelOp(Op.SUM, (0,), attrs)])
    (kern,) = compile_ugraph(g, HW, "cuda").kernels("cuda")
    assert kern.rule.startswith("cooperative sum")
    xs = _inputs(g, seed=count)
    got = compile_ugraph(g, HW, "llvm").run(*xs)
    np.testing.assert_allclose(got[0], g.run(*xs)[0], rtol=1e-5)


def test_cooperative_sum_field_twin_and_a_wrong_lane_is_caught() -> None:
    g = _graph([("X", (3, 5, 200))], [KernelOp(Op.SUM, (0,), {"dim": 2}), KernelOp(Op.EXP, (1,))])
    cg = compile_ugraph(g, HW, "llvm")
    (kern,) = [k for k in cg.kernels("cuda") if k.name.endswith("sum")]
    assert kern.script.count('T.tvm_storage_sync("shared")') == 1 + 5  # after the partials, and per step
    twin = cg.field_twin()
    assert check_field_twin(g, None, trials=1, twin=twin)
    src = twin.source(kern.name)
    assert src.count("tx + 16]") == 2  # the first pairwise step (residues p and q): lanes 0-15 add 16-31
    bad = twin.with_source(kern.name, src.replace("tx + 16]", "tx + 15]"))
    assert not check_field_twin(g, None, trials=1, twin=bad)


def test_short_or_strided_sums_keep_one_thread_per_output() -> None:
    short = _graph([("X", (8, 63))], [KernelOp(Op.SUM, (0,), {"dim": 1})])
    strided = _graph([("X", (300, 8))], [KernelOp(Op.SUM, (0,), {"dim": 0})])
    for g in (short, strided):
        (kern,) = compile_ugraph(g, HW, "cuda").kernels("cuda")
        assert kern.rule.startswith("fallback")


# ------------------------------------------------------------------------------ cooperative matvec


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.integers(1, 4),
    inner=st.integers(1024, 1300),
    cols=st.integers(1, 70),
    heads=st.integers(1, 3),
    shared_b=st.booleans(),
)
def test_cooperative_matvec_matches_numpy(
    rows: int, inner: int, cols: int, heads: int, shared_b: bool
) -> None:
    # Batched A [heads, rows, inner] @ B [heads or 1, inner, cols]: column tails, lane tails and broadcast batch.
    g = _graph(
        [("A", (heads, rows, inner)), ("B", (1 if shared_b else heads, inner, cols))],
        [KernelOp(Op.MATMUL, (0, 1))],
    )
    (kern,) = compile_ugraph(g, HW, "cuda").kernels("cuda")
    assert kern.rule.startswith("cooperative matrix-vector product")
    xs = _inputs(g, seed=inner + cols)
    got = compile_ugraph(g, HW, "llvm").run(*xs)
    np.testing.assert_allclose(got[0], g.run(*xs)[0], rtol=1e-5)


def test_cooperative_matvec_field_twin_and_a_wrong_lane_is_caught() -> None:
    g = _graph([("P", (2, 1, 1024)), ("V", (2, 1024, 40))], [KernelOp(Op.MATMUL, (0, 1))])
    cg = compile_ugraph(g, HW, "llvm")
    twin = cg.field_twin()
    assert check_field_twin(g, None, trials=1, twin=twin)
    (kern,) = cg.kernels("cuda")
    src = twin.source(kern.name)
    first = f"tx + {kern.threads // 2}]"  # the first pairwise step: the upper half of the lanes added in
    assert src.count(first) == 2
    bad = twin.with_source(kern.name, src.replace(first, f"tx + {kern.threads // 2 - 1}]"))
    assert not check_field_twin(g, None, trials=1, twin=bad)


def test_wide_or_short_matmuls_keep_the_construction_schedule() -> None:
    wide = _graph([("A", (8, 2048)), ("B", (2048, 16))], [KernelOp(Op.MATMUL, (0, 1))])
    short = _graph([("A", (1, 512)), ("B", (512, 16))], [KernelOp(Op.MATMUL, (0, 1))])
    for g in (wide, short):
        (kern,) = compile_ugraph(g, HW, "cuda").kernels("cuda")
        assert kern.rule.startswith("markov construct")

"""The per-shape dispatch cache (:mod:`gensorage.superopt.dispatch`) and its prepared CPU runner
(:mod:`gensorage.codegen.runner`): what is cached, what a new shape reuses, and the answer at every shape."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gensorage.codegen.module import _same_code, compile_ugraph
from gensorage.codegen.runner import ALIGNMENT
from gensorage.errors import ProgramError
from gensorage.program import Program
from gensorage.superopt.dispatch import Dispatcher
from gensorage.superopt.presets import preset_from_dict

# One graph-defined kernel of at most three block ops: a fused softmax, found in seconds.
TINY = {"max_kernel_ops": 1, "max_block_ops": 3, "max_grid_dims": 1, "max_block_inputs": 2}


def softmax(m: int, n: int) -> Program:
    p = Program(name="softmax_rows")
    x = p.input("X", (m, n), "float32")
    e = p.exp(x)
    p.output(p.div(e, p.sum(e, 1)))
    return p


def rms_matmul(b: int, h: int = 32, d: int = 16) -> Program:
    p = Program(name="rms_matmul")
    x, g, w = p.input("X", (b, h), "float32"), p.input("G", (h,), "float32"), p.input("W", (h, d), "float32")
    p.output(p.matmul(p.mul(p.rms_norm(x), g), w))
    return p


def check(entry, p: Program, seed: int = 0) -> None:  # type: ignore[no-untyped-def]
    xs = [(x * 3).astype(np.float32) for x in p.random_inputs(seed)]  # magnitudes beyond N(0, 1)
    want = p.run(*xs)
    for got in (entry.run(*xs), entry.runner([_aligned(x) for x in xs], _empty)):
        for g, w in zip(got, want, strict=True):
            # float32 sums: an element that cancels is off by the rounding of its largest terms, so the absolute
            # tolerance scales with the output's magnitude.
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-5 * max(1.0, float(np.max(np.abs(w)))))


def _empty(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """An array whose data is aligned as TVM requires of what it takes through DLPack."""
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.empty(n + ALIGNMENT, np.uint8)
    skip = -raw.ctypes.data % ALIGNMENT
    return raw[skip : skip + n].view(dtype).reshape(shape)


def _aligned(x: np.ndarray) -> np.ndarray:
    out = _empty(x.shape, str(x.dtype))
    out[...] = x
    return out


def test_a_repeated_shape_hits_and_a_new_one_reuses_the_structure(tmp_path: Path) -> None:
    d = Dispatcher(store=tmp_path / "s.sqlite")
    first = d.kernels(rms_matmul(8))
    assert (d.stats.new_structures, d.stats.new_shapes, d.stats.hits) == (1, 0, 0)
    assert d.kernels(rms_matmul(8)) is first  # another Program object, same key
    assert d.stats.hits == 1 and len(d) == 1
    for b in (12, 5):
        e = d.kernels(rms_matmul(b))
        assert e.reused and e.origin == "fused" and e.equivalence  # the direct µGraph after row fusion
        check(e, rms_matmul(b), seed=b)
    assert (d.stats.new_structures, d.stats.new_shapes, d.stats.hits) == (1, 2, 1)
    check(first, rms_matmul(8))
    other = d.kernels(softmax(4, 8))  # another structure: superoptimised
    assert not other.reused and d.stats.new_structures == 2


def test_a_found_structure_is_reinstantiated_and_checked_at_new_shapes(tmp_path: Path) -> None:
    d = Dispatcher(
        mode="full",
        preset=preset_from_dict({"search": TINY}, name="tiny"),
        store=tmp_path / "s.sqlite",
        workers=1,
    )
    first = d.kernels(softmax(4, 16))
    assert first.origin.startswith("search") and first.num_kernels == 1
    for m, n in ((8, 32), (16, 12)):
        e = d.kernels(softmax(m, n))
        assert e.reused and e.origin == first.origin and e.num_kernels == 1
        assert e.equivalence.method == "equivalence check" and e.equivalence
        assert "reinstantiate" in e.timings and "verify" in e.timings
        check(e, softmax(m, n), seed=m)
    assert (d.stats.new_structures, d.stats.new_shapes, d.stats.direct_fallbacks) == (1, 2, 0)


def test_the_runner_returns_fresh_outputs_and_checks_shapes(tmp_path: Path) -> None:
    e = Dispatcher(store=tmp_path / "s.sqlite").kernels(softmax(4, 8))
    assert e.runner is not None
    x = _aligned(np.random.default_rng(0).normal(size=(4, 8)).astype(np.float32))
    a, b = e.runner([x], _empty)[0], e.runner([_aligned(2 * x)], _empty)[0]
    assert a is not b and not np.shares_memory(a, b)
    np.testing.assert_allclose(a, softmax(4, 8).run(x)[0], rtol=1e-5)
    with pytest.raises(ProgramError, match="shape"):
        e.runner([x[:2]], _empty)
    with pytest.raises(ProgramError, match="float32"):
        e.runner([_aligned(x.astype(np.float64))], _empty)
    unaligned = _empty((4 * 8 + 1,), "float32")[1:].reshape(4, 8)
    with pytest.raises(ProgramError, match="DLPack"):
        e.runner([unaligned], _empty)


def test_the_runner_takes_an_input_imported_once(tmp_path: Path) -> None:
    """A TVM tensor the caller imported once (a weight) is the caller's memory at every call, and is checked the
    first time it is seen at its position."""
    import tvm

    e = Dispatcher(store=tmp_path / "s.sqlite").kernels(softmax(4, 8))
    assert e.runner is not None
    x = _aligned(np.random.default_rng(2).normal(size=(4, 8)).astype(np.float32))
    imported = tvm.runtime.from_dlpack(x)
    np.testing.assert_allclose(e.runner([imported], _empty)[0], softmax(4, 8).run(x)[0], rtol=1e-5)
    x *= 3.0  # in place: the same memory, seen by the next call
    np.testing.assert_allclose(e.runner([imported], _empty)[0], softmax(4, 8).run(x)[0], rtol=1e-5)
    wrong = tvm.runtime.from_dlpack(_aligned(np.zeros((2, 8), np.float32)))
    with pytest.raises(ProgramError, match="shape"):
        e.runner([wrong], _empty)


class _OnAGpu(np.ndarray):
    is_cpu = False  # what a CUDA torch tensor says


def test_the_llvm_runner_checks_what_its_build_does_not(tmp_path: Path) -> None:
    """The llvm build has no argument checks (LLVM_CONFIG): the runner rejects a wrong dtype on every call (not
    only the first) and memory that is not the CPU's, with a one-line error, before any kernel runs."""
    e = Dispatcher(store=tmp_path / "s.sqlite").kernels(softmax(4, 8))
    assert e.runner is not None
    x = _aligned(np.random.default_rng(1).normal(size=(4, 8)).astype(np.float32))
    e.runner([x], _empty)  # float32 passes and is remembered
    for wrong in ("float64", "int32", "float16"):
        with pytest.raises(ProgramError, match=f"input 0 is {wrong}, the kernels take float32"):
            e.runner([_aligned(x.astype(wrong))], _empty)
    with pytest.raises(ProgramError, match="not in CPU memory"):
        e.runner([x.view(_OnAGpu)], _empty)
    np.testing.assert_allclose(e.runner([x], _empty)[0], softmax(4, 8).run(x)[0], rtol=1e-5)


def test_an_output_that_is_a_view_runs_on_the_general_path(tmp_path: Path) -> None:
    p = Program(name="flat_exp")
    x = p.input("X", (4, 8), "float32")
    p.output(p.reshape(p.exp(x), (32,)))
    e = Dispatcher(store=tmp_path / "s.sqlite").kernels(p)
    assert e.runner is None
    xs = p.random_inputs(0)
    np.testing.assert_allclose(e.run(*xs)[0], p.run(*xs)[0], rtol=1e-6)


def gate_up(t: int, h: int = 16, f: int = 24) -> Program:
    """SwiGLU's gate and up projections: two matmuls of one input whose kernels differ only in their names (both
    products are outputs too, so neither takes the gate as a matmul epilogue)."""
    p = Program(name="gate_up")
    x, w1, w2 = (
        p.input("X", (t, h), "float32"),
        p.input("W1", (h, f), "float32"),
        p.input("W2", (h, f), "float32"),
    )
    gate, up = p.matmul(x, w1), p.matmul(x, w2)
    p.output(p.mul(p.silu(gate), up))
    p.output(gate)
    p.output(up)
    return p


def test_a_new_shape_warm_starts_its_constructions_and_compiles_equal_kernels_once(tmp_path: Path) -> None:
    from gensorage.construction import schedule as memo
    from gensorage.construction.block_threads import matmul_workload

    d = Dispatcher(store=tmp_path / "s.sqlite")
    d.kernels(gate_up(8))
    for t in (12, 20):
        e = d.kernels(gate_up(t))
        assert e.reused
        d.wait_rebuilds()  # the length's own matmuls are constructed (warm) in the background build
        key = next(k for k in memo._WARM if k[0] == matmul_workload(1, t, 24, 16, "float32").key())
        assert (
            memo._WARM[key] not in memo._CACHE.values() or key not in memo._CACHE
        )  # a warm answer, kept apart
        # the two matmuls, then silu and mul fused into one row kernel
        assert _same_code(e.compiled.kernels("llvm")) == {"kernel1_matmul": "kernel0_matmul"}
        check(e, gate_up(t), seed=t)


def test_a_cuda_request_builds_the_cuda_kernels_only(tmp_path: Path) -> None:
    # A caller whose tensors are on a GPU: the kernels are lowered and built for CUDA (nvcc-free TVM codegen,
    # no GPU needed), no llvm kernels and no CPU runner; the llvm request of the same shape is its own entry,
    # and a new shape of the structure is served for CUDA from the structure found at the first.
    d = Dispatcher("h100", store=tmp_path / "s.sqlite")
    first = d.kernels(rms_matmul(8), target="cuda")
    assert first.target == "cuda" and first.runner is None
    assert "__global__" in first.compiled.cuda_source()
    assert set(first.compiled._executables) == {"cuda"}
    assert d.kernels(rms_matmul(8), target="cuda") is first
    cpu = d.kernels(rms_matmul(8))
    assert cpu is not first and cpu.target == "llvm" and cpu.runner is not None
    new = d.kernels(rms_matmul(12), target="cuda")
    assert new.reused and set(new.compiled._executables) == {"cuda"}
    assert d.stats.hits == 1 and d.stats.new_structures == 1


def test_a_cuda_build_compiles_kernels_of_the_same_code_once(tmp_path: Path) -> None:
    # The CUDA compiler takes the whole module at once; the gate and up projections' kernels (the same code but
    # for their names) go into it once, and the runner finds each under its own name.
    d = Dispatcher("h200", store=tmp_path / "s.sqlite")
    for t in (16, 40, 57):  # the structure's first shape, then new ones
        e = d.kernels(gate_up(t), target="cuda")
        kernels = e.compiled.kernels("cuda")
        same = _same_code(kernels)
        assert same == {"kernel1_matmul": "kernel0_matmul"}
        src = e.compiled.cuda_source()
        assert "kernel0_matmul_kernel(" in src and "kernel1_matmul_kernel(" not in src
        ex = e.compiled.executable("cuda")
        assert all(ex[k.name] is not None for k in kernels)
        full = compile_ugraph(e.graph, e.compiled.hw, "cuda")  # outside the dispatcher: every kernel
        assert "kernel1_matmul_kernel(" in full.cuda_source()


def test_a_new_shape_whose_row_fusion_forms_other_kernels_takes_the_direct_graph(tmp_path: Path) -> None:
    """A program too large to check at its shapes keeps its row-fused µGraph at a new shape only where the rule
    forms the kernels its first shape's check witnessed: rows of 2^18 no longer fit a block, so the softmax
    stays one kernel per op there while the norm still fuses."""

    def two_rows(m: int, n: int) -> Program:
        p = Program(name="two_rows")
        x, y = p.input("X", (m, n), "float32"), p.input("Y", (64, 4096), "float32")
        e = p.exp(x)
        p.output(p.div(e, p.sum(e, 1)))
        p.output(p.div(y, p.sqrt(p.sum(p.mul(y, y), 1))))
        return p

    d = Dispatcher(store=tmp_path / "s.sqlite")
    first = d.kernels(two_rows(1024, 4096))
    assert first.origin == "fused" and first.equivalence.method == "search shapes" and first.num_kernels == 2
    e = d.kernels(two_rows(16, 1 << 18))
    assert e.reused and d.stats.direct_fallbacks == 1 and any("other kernels" in n for n in e.notes)
    assert e.num_kernels == len(two_rows(16, 1 << 18).nodes) - 2  # one per op: the direct µGraph


def test_the_option_without_epilogues_is_carried_to_a_new_length_by_its_own_rule(tmp_path: Path) -> None:
    """A structure whose first shape took row fusion without epilogue fusion (gqa_prefill on the h200, where the
    model prices QKᵀ without its scale as an epilogue faster) gets the same rule at a new length, not the one
    that fuses epilogues first; too large to check there, with the kernels its first shape's check witnessed."""
    from gensorage.program import load_config
    from gensorage.superopt.row_fusion import FUSED_ROWS, fused_direct, kernel_kinds

    def gqa(n: int) -> Program:
        return load_config("gqa_prefill", {"s": 512, "n": n, "d": 128, "kv": 1, "g": 2})

    d = Dispatcher(hw="h200", store=tmp_path / "s.sqlite", use_store=False)
    first = d.kernels(gqa(1024))
    assert first.origin == FUSED_ROWS and first.equivalence.method == "search shapes"
    e = d.kernels(gqa(1536))
    assert e.reused and e.origin == FUSED_ROWS and e.equivalence and d.stats.direct_fallbacks == 0
    rows = fused_direct(gqa(1536), d.precision, d.hw, epilogues=False)
    assert e.graph == rows and e.graph != fused_direct(gqa(1536), d.precision, d.hw)
    assert kernel_kinds(e.graph) == kernel_kinds(first.graph)

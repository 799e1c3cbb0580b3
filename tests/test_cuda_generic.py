"""The CUDA first tier (gensorage.codegen.symbolic_kernels on the cuda target): text kernels compiled once in a
length-generic form, called at new lengths without a compiler call; exact at every length (compile-only here)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm_ffi

from gensorage.codegen.cuda_build import build_cubin, cubin_unavailable_reason
from gensorage.codegen.predefined_matmul import matmul_prim_func
from gensorage.codegen.script_templates import _bind
from gensorage.codegen.symbolic_kernels import BoundExecutable
from gensorage.codegen.tensor_core import TensorCoreTiles, schedule_tensor_core
from gensorage.codegen.wgmma import target_profile
from gensorage.dtypes import numpy_dtype
from gensorage.program import Program
from gensorage.superopt.dispatch import Dispatcher

#: After the first: primes, lengths larger than the first, lengths no tile divides.
NEW_LENGTHS = (13, 97, 200, 31, 257, 7, 64, 2)


def rows(t: int, h: int = 64) -> Program:
    """RMSNorm with its weight, a residual add and a softmax over ``t`` rows: row kernels and element-wise ones."""
    p = Program(name="rows")
    x, g = p.input("X", (t, h), "float32"), p.input("G", (h,), "float32")
    y = p.add(p.mul(p.rms_norm(x), g), x)
    p.output(p.softmax(y, 1))
    return p


def copies(t: int, heads: int = 8, d: int = 128) -> Program:
    """A rotary-style rearrangement over ``t`` tokens: transposes, slices, a scale, a concat and a repeat (each
    over 1,024 elements or more from 2 tokens on: below, a copy's block has fewer threads, another variant)."""
    p = Program(name="copies")
    x = p.input("X", (t, heads, d), "float32")
    xt = p.transpose(x, 0, 1)  # [heads, t, d]
    lo, hi = p.slice(xt, 2, 0, d // 2), p.slice(xt, 2, d // 2, d)
    rot = p.concat([p.scale(hi, -1.0), lo], 2)
    p.output(p.repeat(p.add(rot, xt), 0, 2))
    return p


def projection(t: int, h: int = 64, d: int = 96) -> Program:
    """A normalised projection over ``t`` tokens in bfloat16: a row kernel, then a matmul on tensor cores whose
    rows are the tokens (the normalised rows are float32: converted to bfloat16 in the matmul's copies)."""
    p = Program(name="projection")
    x, g = p.input("X", (t, h), "bfloat16"), p.input("G", (h,), "bfloat16")
    w = p.input("W", (h, d), "bfloat16")
    p.output(p.matmul(p.mul(p.rms_norm(x), g), w))
    return p


def attention(t: int, heads: int = 4, d: int = 16) -> Program:
    """Attention's two batched matmuls over ``t`` tokens in bfloat16 (scores ``Q Kᵀ``, then ``S V``): the
    length is the scores' rows and columns, and the second product's reduction."""
    p = Program(name="attention")
    q, k = p.input("Q", (heads, t, d), "bfloat16"), p.input("K", (heads, t, d), "bfloat16")
    v = p.input("V", (heads, t, d), "bfloat16")
    p.output(p.matmul(p.matmul(q, p.transpose(k, 1, 2)), v))
    return p


def run_copies_on_llvm(texts, rng: np.random.Generator) -> list[np.ndarray]:  # type: ignore[no-untyped-def]
    """Each float32 copy kernel text of ``texts`` (same parameters) built on llvm and run on one random draw."""
    import tvm

    from gensorage.codegen.module import _parse

    first = texts[0]
    ins = [rng.standard_normal(p.shape).astype("float32") for p in first.params if p.role == "input"]
    outs = []
    for kt in texts:
        ex = tvm.compile(_parse(kt.text, kt.name), target="llvm")
        out = tvm.runtime.empty(first.params[-1].shape, "float32", tvm.cpu())
        ex(*[tvm.runtime.tensor(a) for a in ins], out)
        outs.append(out.numpy())
    return outs


def _generic(entry) -> BoundExecutable:  # type: ignore[no-untyped-def]
    ex = entry.compiled.executable("cuda")
    assert isinstance(ex, BoundExecutable)
    return ex


@pytest.mark.parametrize("make", [rows, copies, projection])
def test_new_lengths_make_no_compiler_call(make) -> None:  # type: ignore[no-untyped-def]
    d = Dispatcher(use_store=False)
    d.kernels(make(128), "cuda")
    assert d.stats.builds == 1
    for t in NEW_LENGTHS:
        e = d.kernels(make(t), "cuda")
        assert "no build: every kernel from compiled variants" in e.notes, (t, e.notes)
    assert d.stats.builds == 1 and d.stats.new_shapes == len(NEW_LENGTHS)


@pytest.mark.parametrize("make", [rows, copies])
def test_the_generic_kernel_at_a_length_is_the_emitters_kernel_there(make) -> None:  # type: ignore[no-untyped-def]
    # Golden: the variant each length calls, its parameters bound to that length's values, is structurally the
    # PrimFunc the emitter wrote for that length.
    d = Dispatcher(use_store=False, tiered=False)
    for t in (128, *NEW_LENGTHS, 1, 3, 5):
        e = d.kernels(make(t), "cuda")
        ex = _generic(e)
        for kern in e.compiled.kernels("cuda"):
            variant, values = ex.calls[kern.name]
            assert variant.func is not None
            dynamic = [values[i] for i in variant.dynamic]
            bound = _bind(variant.func, dynamic, kern.name) if dynamic else variant.func
            assert tvm_ffi.structural_equal(bound.with_attr("global_symbol", kern.name), kern.func), (
                t,
                kern.name,
            )


def test_a_variant_keeps_the_threads_and_passes_the_grid_and_shapes() -> None:
    d = Dispatcher(use_store=False)
    d.kernels(rows(128), "cuda")  # its own kernels; the generic variants in the background
    e = d.kernels(rows(200), "cuda")
    ex = _generic(e)
    for kern in e.compiled.kernels("cuda"):
        variant, _ = ex.calls[kern.name]
        script = variant.func.script()
        threads = re.findall(r"T\.thread_binding\((\w+), thread=\"threadIdx", script)
        assert threads and all(n.isdigit() for n in threads), kern.name  # a block's threads: constants
        grid = re.findall(r"T\.thread_binding\((\w+), thread=\"blockIdx", script)
        assert grid and not any(n.isdigit() for n in grid), kern.name  # the grid: parameters


def test_the_length_s_own_kernels_replace_the_generic_ones() -> None:
    d = Dispatcher(use_store=False)  # tiered: the length's own kernels are built in the background
    first = d.kernels(rows(128), "cuda")  # the first length serves its own kernels, the variants follow
    assert not isinstance(first.compiled.executable("cuda"), BoundExecutable)
    e = d.kernels(rows(97), "cuda")
    ex = _generic(e)
    first = {k.name: ex[k.name] for k in e.compiled.kernels("cuda")}
    assert all(callable(f) for f in first.values())
    d.wait_rebuilds()
    assert ex.generation == 1 and d._variants["cuda"].rebuild_errors == []
    for kern in e.compiled.kernels("cuda"):
        assert not hasattr(ex[kern.name], "args")  # a plain function: no literal passed at the call


@pytest.mark.skipif(cubin_unavailable_reason() is not None, reason="nvcc not available")
@pytest.mark.parametrize("make", [rows, copies, projection, attention])
def test_the_generic_variants_compile_with_nvcc(make) -> None:  # type: ignore[no-untyped-def]
    d = Dispatcher(use_store=False, tiered=False)
    e = d.kernels(make(128), "cuda")
    built = d._variants["cuda"].last_build
    arch = target_profile(e.compiled.hw, [k.rule for k in e.compiled.kernels("cuda")]).arch
    assert build_cubin(str(built.mod.imports[0].inspect_source()), arch)


def test_a_projection_is_one_kernel_at_every_length() -> None:
    d = Dispatcher(use_store=False, tiered=False)
    funcs = []
    for t in (128, 97, 1, 200):
        e = d.kernels(projection(t), "cuda")
        (mm,) = [k for k in e.compiled.kernels("cuda") if k.name.endswith("_matmul")]
        assert mm.rule.endswith("generic in the rows"), mm.rule
        assert "(rows + 63) // 64" in mm.script or "rows" in mm.script  # the grid from the rows
        funcs.append(mm.func)
    assert all(tvm_ffi.structural_equal(f, funcs[0]) for f in funcs[1:])


def test_attention_s_matmuls_are_one_kernel_each_at_every_length() -> None:
    d = Dispatcher(use_store=False)
    d.kernels(attention(128), "cuda")
    for t in NEW_LENGTHS:
        e = d.kernels(attention(t), "cuda")
        assert "no build: every kernel from compiled variants" in e.notes, (t, e.notes)
        assert all(
            k.rule.endswith("generic in the rows")
            for k in e.compiled.kernels("cuda")
            if k.name.endswith("_matmul")
        )
    assert d.stats.builds == 1


@pytest.mark.parametrize(
    ("batch", "m", "n", "k"), [((), None, 64, 96), ((3,), None, None, None), ((3,), None, None, 16)]
)
def test_the_symbolic_batched_schedule_is_right_at_every_length(
    batch: tuple[int, ...], m: int | None, n: int | None, k: int | None
) -> None:
    # The dims given as None are variables (the length), bound at each call; the llvm twin against float64.
    import tvm
    from tvm import tirx

    dtype, tiles = "bfloat16", TensorCoreTiles(32, 32, 32, 16, 16, 2)
    dims = [tirx.Var(name, "int32") if d is None else d for name, d in (("m", m), ("n", n), ("k", k))]
    func = matmul_prim_func(
        (*batch, dims[0], dims[2]), (*batch, dims[2], dims[1]), (*batch, dims[0], dims[1]), dtype, dtype
    )
    ex = tvm.compile(schedule_tensor_core(func, tiles, gpu=False).mod, target="llvm")
    rng = np.random.default_rng(1)
    for t in (1, 5, 13, 32, 97):
        mm, nn, kk = (t if d is None else d for d in (m, n, k))
        a = rng.standard_normal((*batch, mm, kk)).astype(numpy_dtype(dtype))
        b = (rng.standard_normal((*batch, kk, nn)) / np.sqrt(kk)).astype(numpy_dtype(dtype))
        want = a.astype(np.float64) @ b.astype(np.float64)
        out = tvm.runtime.empty((*batch, mm, nn), dtype, tvm.cpu())
        ex(tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
        got = out.numpy().astype(np.float64)
        rounding = np.linalg.norm(want.astype(numpy_dtype(dtype)).astype(np.float64) - want)
        assert np.linalg.norm(got - want) <= 8e-3 * np.linalg.norm(want) + 2 * rounding, t


@pytest.mark.parametrize("outlier", [1.0, 300.0])
@pytest.mark.parametrize("layout", ["nn", "nt"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_symbolic_matmul_schedule_is_right_at_every_row_count(
    layout: str, dtype: str, outlier: float
) -> None:
    # The llvm twin of the same symbolic schedule (the same splits, row padding, guards and fragment layouts;
    # each MMA tile by its scalar semantics), compiled once, against float64 at row counts that divide no tile;
    # ``outlier``: one activation channel that large, as LLaMA's massive activations (|x| ~ 300).
    import tvm
    from tvm import tirx

    k, n = 96, 64
    tiles = TensorCoreTiles(64, 64, 32, 32, 64, 2, layout=layout)
    rows = tirx.Var("rows", "int32")
    func = matmul_prim_func((rows, k), (k, n), (rows, n), dtype, dtype, layout=layout)
    ex = tvm.compile(schedule_tensor_core(func, tiles, gpu=False).mod, target="llvm")
    rng = np.random.default_rng(0)
    for m in (1, 2, 3, 7, 13, 31, 64, 97, 128, 200, 257):
        a = rng.standard_normal((m, k))
        a[:, 5] *= outlier
        a = a.astype(numpy_dtype(dtype))
        b = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(numpy_dtype(dtype))
        want = a.astype(np.float64) @ b.astype(np.float64)
        stored_b = np.ascontiguousarray(b.T) if layout == "nt" else b
        out = tvm.runtime.empty((m, n), dtype, tvm.cpu())
        ex(tvm.runtime.tensor(a), tvm.runtime.tensor(stored_b), out)
        got = out.numpy().astype(np.float64)
        # one rounding of the float32 accumulator to the output dtype (as tests/test_tensor_core.py bounds it)
        rounding = np.linalg.norm(want.astype(numpy_dtype(dtype)).astype(np.float64) - want)
        tol = (2e-3 if dtype == "float16" else 8e-3) * np.linalg.norm(want) + 2 * rounding
        assert np.linalg.norm(got - want) <= tol, m


def test_the_length_s_own_build_has_the_construction_s_matmul_there() -> None:
    # The background build of a length's own kernels takes a generic matmul as its construction there gives it
    # (its tiles, or wgmma), the steady state the same as without the first tier.
    from gensorage.codegen.symbolic_kernels import _own

    d = Dispatcher(use_store=False)
    d.kernels(projection(128), "cuda")
    e = d.kernels(projection(200), "cuda")
    (mm,) = [k for k in e.compiled.kernels("cuda") if k.name.endswith("_matmul")]
    plain = Dispatcher(use_store=False, symbolic=False).kernels(projection(200), "cuda")
    (want,) = [k for k in plain.compiled.kernels("cuda") if k.name.endswith("_matmul")]
    own = _own(mm)
    assert own.rule == want.rule and "generic" not in own.rule
    assert tvm_ffi.structural_equal(own.func, want.func)
    d.wait_rebuilds()
    assert d._variants["cuda"].rebuild_errors == []


def matvec(t: int, h: int = 1024, d: int = 64) -> Program:
    """A projection over ``t`` tokens with 1,024 terms: at 4 tokens or fewer a matrix-vector product."""
    p = Program(name="matvec")
    p.output(p.matmul(p.input("X", (t, h), "bfloat16"), p.input("W", (h, d), "bfloat16")))
    return p


def test_copies_of_fewer_elements_than_a_block_make_no_compiler_call() -> None:
    # 2 heads of 16: 32 elements a token, so 2, 3, 7 and 13 tokens copy fewer than 1,024 elements (fewer threads
    # a block at their own lengths); the generic copy keeps a whole block, its guard skipping the threads past
    # the elements, and the length's own build takes the emitter's kernel back.
    d = Dispatcher(use_store=False)
    d.kernels(copies(128, 2, 16), "cuda")
    for t in (13, 2, 7, 3, 64):
        e = d.kernels(copies(t, 2, 16), "cuda")
        assert "no build: every kernel from compiled variants" in e.notes, (t, e.notes)
        small = [k for k in e.compiled.kernels("cuda") if k.own is not None]
        assert all(k.threads == 1024 for k in e.compiled.kernels("cuda"))
        assert len(small) == (7 if t < 16 else 0), (t, [k.name for k in small])  # at most 64·t elements each
        for kern in small:
            func, rule = kern.own()
            assert rule.startswith(f"fallback (pre-defined {kern.rule.split()[2]}")
            threads = re.search(r'T\.thread_binding\((\d+), thread="threadIdx', func.script())
            assert threads is not None and int(threads.group(1)) < 1024
    assert d.stats.builds == 1
    d.wait_rebuilds()
    assert d._variants["cuda"].rebuild_errors == []


@pytest.mark.parametrize("t", [1, 2, 3, 13, 31])
def test_a_copy_with_a_whole_block_computes_what_the_emitter_s_copy_does(t: int) -> None:
    # The llvm twin of each copy's text (its blocks a parallel loop, its threads a serial one) with a whole
    # block of 1,024 threads against the emitter's own at this length: bitwise equal outputs.

    from gensorage.codegen.predefined import _simple
    from gensorage.codegen.scalar import FloatScalar

    d = Dispatcher(use_store=False, symbolic=False)
    e = d.kernels(copies(t, 2, 16), "llvm")
    g, info = e.graph, e.compiled.info
    rng = np.random.default_rng(t)
    checked = 0
    for kern in e.compiled.kernels("llvm"):
        if "one output element each" not in kern.rule:
            continue
        k = kern.op_index
        own = _simple(g, k, info, d.hw, "llvm", FloatScalar("float32"), kern.name)
        wide = _simple(g, k, info, d.hw, "llvm", FloatScalar("float32"), kern.name, threads=1024)
        if own.threads == 1024:  # 1,024 elements or more: the same kernel
            continue
        assert wide.threads == 1024
        outs = run_copies_on_llvm((own, wide), rng)
        assert np.array_equal(outs[0], outs[1]), (t, kern.name)
        checked += 1
    assert checked >= 5


def test_a_projection_of_few_rows_runs_the_generic_matmul_and_its_own_build_is_the_matrix_vector_product() -> (
    None
):
    d = Dispatcher(use_store=False)
    first = d.kernels(matvec(128), "cuda")
    assert d.stats.builds == 1 and not any("cooperative" in k.rule for k in first.compiled.kernels("cuda"))
    for t in (2, 4, 1, 3):
        e = d.kernels(matvec(t), "cuda")
        assert "no build: every kernel from compiled variants" in e.notes, (t, e.notes)
        (mm,) = e.compiled.kernels("cuda")
        assert mm.rule.endswith("generic in the rows")
        plain = Dispatcher(use_store=False, symbolic=False).kernels(matvec(t), "cuda")
        (want,) = plain.compiled.kernels("cuda")
        assert want.rule.startswith("cooperative matrix-vector product")
        func, rule = mm.own()  # the matrix-vector product, the generic split-k kernel's scratch unused
        assert mm.params[-1].role == "scratch" and len(func.params) == len(want.func.params) + 1
        assert rule == want.rule + "; the generic kernel's scratch unused"
        assert tvm_ffi.structural_equal(func.body, want.func.body, map_free_vars=True)
    assert d.stats.builds == 1
    d.wait_rebuilds()
    assert d._variants["cuda"].rebuild_errors == []

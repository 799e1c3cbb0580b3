"""The CUDA first tier's row kernels and split-k projections generic in the length (gensorage.codegen.generic_rows,
gensorage.codegen.generic_matmul): new lengths make no compiler call, and the kernel a length runs is the
emitter's (compile-only here; the llvm twin of the split-k schedule against float64)."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import tvm_ffi

from gensorage.codegen.cuda_build import build_cubin, cubin_unavailable_reason
from gensorage.codegen.generic_matmul import concrete
from gensorage.codegen.generic_rows import (
    CAPACITIES,
    CAPACITY,
    LLVM_ROW_THREADS,
    ROW,
    _at_capacity,
    _split_dims,
    emitter,
    generic_kernel,
    generic_text,
)
from gensorage.codegen.kernel_text import Target
from gensorage.codegen.module import _parse, compile_ugraph
from gensorage.codegen.predefined import MAX_COOPERATIVE_ROWS
from gensorage.codegen.scalar import FloatScalar
from gensorage.codegen.wgmma import target_profile
from gensorage.program import Program
from gensorage.superopt.dispatch import Dispatcher
from gensorage.ugraph.ir import KernelGraph

#: After the first (128): primes, lengths larger than the first, lengths no block's rows divide.
NEW_LENGTHS = (13, 97, 200, 31, 257, 7, 64, 2, 300, 512)


def rotary(t: int, heads: int = 4, d: int = 16) -> Program:
    """A rotary-style product over ``t`` tokens (``x·cos + y·sin``, the tables per token): one fused row kernel
    whose rows a block follow the length (4 at 128 tokens, 5 at 200, 1 at primes)."""
    p = Program(name="rotary")
    x, c = p.input("X", (heads, t, d), "bfloat16"), p.input("C", (t, d), "bfloat16")
    y, s = p.input("Y", (heads, t, d), "bfloat16"), p.input("S", (t, d), "bfloat16")
    p.output(p.add(p.mul(x, c), p.mul(y, s)))
    return p


def layer(t: int, h: int = 1024, d: int = 128) -> Program:
    """An RMSNorm, a projection the construction splits over its reduction at 128 tokens (split-k 8) and a
    residual: the kinds of kernels a decoder layer has besides attention's softmax over the keys."""
    p = Program(name="layer")
    x, g = p.input("X", (t, h), "bfloat16"), p.input("G", (h,), "bfloat16")
    w, r = p.input("W", (h, d), "bfloat16"), p.input("R", (t, d), "bfloat16")
    p.output(p.add(p.matmul(p.mul(p.rms_norm(x), g), w), r))
    return p


def scores(t: int, heads: int = 4) -> Program:
    """A softmax over ``t`` keys for ``t`` queries (attention's): a row kernel whose rows' own length is the
    length, so each block's tile is a whole row of keys."""
    p = Program(name="scores")
    p.output(p.softmax(p.input("S", (heads, t, t), "float32"), 2))
    return p


def _row_kernels(entry, target: Target = "cuda") -> list:  # type: ignore[no-untyped-def]
    return [k for k in entry.compiled.kernels(target) if "generic in the rows" in k.rule]


@pytest.fixture(autouse=True)
def _first_sight(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test meets its structures first: the generic texts and first rows are process-wide by structure, so
    a structure another file saw first at another length would keep that length's rows a block here."""
    from gensorage.codegen import generic_rows

    monkeypatch.setattr(generic_rows, "_FIRST_ROWS", {})
    monkeypatch.setattr(generic_rows, "_TEXTS", {})


def _generic_rows(target: Target) -> Dispatcher:
    """A dispatcher whose ``target`` kernels have generic row forms (on llvm, its first tier's)."""
    return Dispatcher(use_store=False, tiered=target == "llvm")


@pytest.mark.parametrize("make", [rotary, layer])
def test_new_lengths_make_no_compiler_call(make) -> None:  # type: ignore[no-untyped-def]
    d = Dispatcher(use_store=False)
    e = d.kernels(make(128), "cuda")
    assert d.stats.builds == 1 and e.origin == "fused"
    first = [k.rule for k in e.compiled.kernels("cuda")]
    assert any("split-k" in r for r in first) or make is rotary, first
    # the first length serves its own kernels; the generic variants are built in the background, and the next
    # length (asked for at once here) waits for them rather than compile its own
    assert not any("generic" in r for r in first), first
    # a projection of MAX_COOPERATIVE_ROWS rows or fewer is another kernel (the matrix-vector product)
    lengths = [t for t in NEW_LENGTHS if make is rotary or t > MAX_COOPERATIVE_ROWS]
    for t in lengths:
        e = d.kernels(make(t), "cuda")
        assert "no build: every kernel from compiled variants" in e.notes, (t, e.notes)
    assert d.stats.builds == 1 and d.stats.new_shapes == len(lengths)
    d.wait_rebuilds()
    assert d._variants["cuda"].rebuild_errors == []


def _forced(graph: KernelGraph, k: int, grid: tuple[int, ...]) -> KernelGraph:
    """``graph`` with kernel ``k``'s grid replaced (row fusion's block graphs name dims, not sizes)."""
    op = graph.ops[k]
    ops = list(graph.ops)
    ops[k] = dataclasses.replace(op, block=dataclasses.replace(op.block, grid=grid))  # type: ignore[arg-type]
    return dataclasses.replace(graph, ops=tuple(ops))


def _simplified(func, name: str, target: Target = "cuda"):  # type: ignore[no-untyped-def]
    import tvm

    with tvm.target.Target(target):
        mod = tvm.tirx.transform.StmtSimplify()(tvm.IRModule({name: func.with_attr("global_symbol", name)}))
    return mod[name]


@pytest.mark.parametrize("target", ["cuda", "llvm"])
def test_the_generic_row_kernel_is_the_emitter_s_kernel_with_the_first_length_s_rows(target: Target) -> None:
    # Golden: at lengths the first length's rows a block divide, the generic kernel bound there (guards and all)
    # is structurally the emitter's kernel for the same block graph with those rows a block.
    d = _generic_rows(target)
    first = d.kernels(rotary(128), target)
    (kern,) = _row_kernels(first, target)
    grid = first.graph.ops[kern.op_index].block.grid  # type: ignore[union-attr]
    rows = 128 // grid[1]
    assert rows > 1
    others = 0  # lengths whose µGraph has other rows a block (the generic kernel keeps the first's)
    for t in (256, 512, 96, 384):
        e = d.kernels(rotary(t), target)
        (got,) = _row_kernels(e, target)
        others += e.graph.ops[kern.op_index].block.grid != (grid[0], t // rows)  # type: ignore[union-attr]
        forced = _forced(e.graph, kern.op_index, (grid[0], t // rows))
        (want,) = [k for k in compile_ugraph(forced, d.hw, target).kernels(target) if k.name == got.name]
        a, b = _simplified(concrete(got).func, got.name, target), _simplified(want.func, got.name, target)
        assert tvm_ffi.structural_equal(a, b), t
    assert others
    d.wait_rebuilds()


@pytest.mark.parametrize(
    "target, heads, tokens",
    [
        (
            "cuda",
            'T.thread_binding(n0, thread="blockIdx.x")',
            'T.thread_binding((n1 + 3) // 4, thread="blockIdx.y")',
        ),
        ("llvm", "for bx in T.parallel(n0):", "for by in T.serial((n1 + 3) // 4):"),
    ],
)
def test_every_row_a_generic_kernel_touches_is_guarded_by_its_bound(
    target: Target, heads: str, tokens: str
) -> None:
    d = _generic_rows(target)
    (kern,) = _row_kernels(d.kernels(rotary(128), target), target)
    lines = kern.script.splitlines()
    # the heads' grid dim (1 head a block) and the tokens' (the first length's 4 rows a block) from the shapes
    assert heads in kern.script and tokens in kern.script
    touching = [i for i, ln in enumerate(lines) if re.search(r"\b(?:in\d|out\d)(?:\.ptr_to\(\[|\[)", ln)]
    assert touching
    for i in touching:
        assert re.match(r"\s*if .*< n1", lines[i - 1]), lines[i]  # the row's bound, on the line before
        assert "shuffle" not in lines[i] and "storage_sync" not in lines[i]
    d.wait_rebuilds()


def test_a_guarded_statement_with_a_warp_shuffle_stays_per_length() -> None:
    text = "\n".join(
        [
            "@T.prim_func",
            'def k(in0: T.Buffer((8, 16), "float32"), out0: T.Buffer((8, 16), "float32")):',
            '    for bx in T.thread_binding(2, thread="blockIdx.x"):',
            '        for tx in T.thread_binding(64, thread="threadIdx.x"):',
            "            out0[bx * 4 + tx // 16, tx % 16] = T.tvm_warp_shuffle_down(T.uint32(4294967295),"
            " in0[bx * 4 + tx // 16, tx % 16], 1, 32, 32)",
        ]
    )
    dims = {"in0": {0: 0}, "out0": {0: 0}}
    assert generic_text(text, "k", (2,), (4,), dims) is None
    plain = text.replace("T.tvm_warp_shuffle_down(T.uint32(4294967295), ", "(").replace(", 1, 32, 32)", ")")
    out = generic_text(plain, "k", (2,), (4,), dims)
    assert out is not None and "if (bx * 4 + tx // 16) < n0:" in out and "(n0 + 3) // 4" in out


def test_a_split_k_projection_is_one_kernel_at_every_length_and_its_own_build_is_the_construction_s() -> None:
    from gensorage.codegen.symbolic_kernels import _own

    d = Dispatcher(use_store=False, tiered=False)
    funcs = []
    for t in (128, 97, 200, 5):
        e = d.kernels(layer(t), "cuda")
        (mm,) = [k for k in e.compiled.kernels("cuda") if k.grid is None and "split-k" in k.rule]
        assert mm.rule.endswith("generic in the rows") and mm.params[-1].role == "scratch"
        assert mm.params[-1].shape[1] >= t  # the partials' rows: the length's, padded to the block's
        funcs.append(mm.func)
        # the construction at this length: its own kernel, the scratch unused where it has none
        own = _own(mm)
        plain = Dispatcher(use_store=False, symbolic=False).kernels(layer(t), "cuda")
        (want,) = [k for k in plain.compiled.kernels("cuda") if k.name == mm.name]
        if want.params == mm.params:
            assert own.rule == want.rule and tvm_ffi.structural_equal(own.func, want.func)
        elif want.params == mm.params[:-1]:  # no split here: its kernel, the generic kernel's scratch unused
            assert own.rule == want.rule + "; the generic kernel's scratch unused"
            assert len(own.func.params) == len(want.func.params) + 1
        else:  # another split here (other partials): the generic tiles stay, with this length's extents
            assert own.rule == mm.rule and tvm_ffi.structural_equal(own.func, concrete(mm).func)
    assert all(tvm_ffi.structural_equal(f, funcs[0]) for f in funcs[1:])


@pytest.mark.parametrize("split", [2, 8])
def test_the_symbolic_split_k_schedule_is_right_at_every_row_count(split: int) -> None:
    # The llvm twin of the generic split-k schedule (rows a variable, padded to the block's in the partials),
    # compiled once, against float64 at row counts 1, primes and non-multiples of the block.
    import tvm
    from tvm import tirx

    from gensorage.codegen.predefined_matmul import _matmul_build, _MatmulShape
    from gensorage.codegen.tensor_core import TensorCoreTiles, schedule_tensor_core
    from gensorage.dtypes import numpy_dtype

    dtype, k, n = "bfloat16", 256, 64
    tiles = TensorCoreTiles(64, 64, 32, 32, 64, 2, split_k=split)
    rows = tirx.Var("rows", "int32")
    ms = _MatmulShape((rows, k), (k, n), (rows, n), False, False)
    build = _matmul_build(ms, dtype, dtype, None, split, tiles.block_m, dtype, None, None, cast_by_bits=True)
    ex = tvm.compile(schedule_tensor_core(build(), tiles, gpu=False).mod, target="llvm")
    rng = np.random.default_rng(0)
    for m in (1, 2, 3, 7, 13, 31, 64, 97, 128, 200, 257):
        a = rng.standard_normal((m, k)).astype(numpy_dtype(dtype))
        b = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(numpy_dtype(dtype))
        want = a.astype(np.float64) @ b.astype(np.float64)
        out = tvm.runtime.empty((m, n), dtype, tvm.cpu())
        partials = tvm.runtime.empty((split, -(-m // 64) * 64, n), "float32", tvm.cpu())
        ex(tvm.runtime.tensor(a), tvm.runtime.tensor(b), out, partials)
        got = out.numpy().astype(np.float64)
        rounding = np.linalg.norm(want.astype(numpy_dtype(dtype)).astype(np.float64) - want)
        assert np.linalg.norm(got - want) <= 8e-3 * np.linalg.norm(want) + 2 * rounding, m


def test_the_small_decoder_layer_makes_no_compiler_call_at_new_lengths() -> None:
    # The front end's decoder layer (bfloat16; its Programs as gensorage.torch captures them): norms, rotary
    # products, projections, attention's matmuls and softmax, copies; after 128 tokens, new lengths (primes,
    # larger, non-multiples of every block, and below 64 tokens, where its copies of a key head's half have
    # fewer than 1,024 elements, and one token: a prefill of one, gensorage.folds) compile nothing.
    pytest.importorskip("torch")
    from benchmarks.newlen_cuda import capture

    lengths = [128, 200, 97, 257, 64, 509, 31, 3, 2, 1]
    d = Dispatcher("h200")
    for t, p in zip(lengths, capture(lengths), strict=True):
        e = d.kernels(p, "cuda")
        assert t == 128 or "no build: every kernel from compiled variants" in e.notes, (t, e.notes)
    assert d.stats.builds == 1 and d.stats.new_shapes == len(lengths) - 1
    d.wait_rebuilds()
    variants = d._variants["cuda"]
    assert variants.rebuild_errors == []
    if cubin_unavailable_reason() is None:  # the generic module the first length prepared, through nvcc
        (generic,) = {
            id(v.executable): v.executable for s in variants._skeletons.values() for v in s.variants
        }.values()
        assert build_cubin(str(generic.mod.imports[0].inspect_source()), "sm_90a")
        # and one token's own kernels, built in the background (row kernels with a grid dim of extent 1)
        assert build_cubin(str(e.compiled.executable("cuda").mod.imports[0].inspect_source()), "sm_90a")


@pytest.mark.skipif(cubin_unavailable_reason() is not None, reason="nvcc not available")
@pytest.mark.parametrize("make", [rotary, layer, scores])
def test_the_generic_row_and_split_k_kernels_compile_with_nvcc(make) -> None:  # type: ignore[no-untyped-def]
    d = Dispatcher(use_store=False, tiered=False)
    e = d.kernels(make(128), "cuda")
    assert _row_kernels(e)
    built = d._variants["cuda"].last_build
    arch = target_profile(e.compiled.hw, [k.rule for k in e.compiled.kernels("cuda")]).arch
    assert build_cubin(str(built.mod.imports[0].inspect_source()), arch)


def test_a_softmax_over_the_keys_makes_no_compiler_call_at_new_lengths() -> None:
    d = Dispatcher(use_store=False)
    d.kernels(scores(128), "cuda")
    for t in NEW_LENGTHS:
        e = d.kernels(scores(t), "cuda")
        assert "no build: every kernel from compiled variants" in e.notes, (t, e.notes)
        (kern,) = _row_kernels(e)
        assert kern.rule.endswith(f"rows of up to {CAPACITY}")
    assert d.stats.builds == 1
    d.wait_rebuilds()
    assert d._variants["cuda"].rebuild_errors == []


@pytest.mark.parametrize("target", ["cuda", "llvm"])
@pytest.mark.parametrize("cap", CAPACITIES)
def test_the_generic_softmax_is_the_emitter_s_kernel_at_its_capacity_with_every_key_beyond_skipped(
    cap: int, target: Target
) -> None:
    # Golden: bound at its capacity of keys, the generic kernel is structurally the emitter's kernel for rows of
    # that many keys (one row a block, element loads), the guards folded; every load, store and reduction step is
    # guarded by the key count (a step at nr or beyond is an element-wise one: never reduced, never stored).
    d = _generic_rows(target)
    e = d.kernels(scores(128), target)
    (kern,) = _row_kernels(e, target)
    k = kern.op_index
    plan = e.compiled.plans[k]
    emit = emitter(e.graph, k, e.compiled.info, plan, target, FloatScalar("float32"), kern.name)
    split = _split_dims(e.graph.ops[k], e.compiled.info, k)  # type: ignore[arg-type]
    assert split is not None and split[0] == (1, 4)  # the first length's rows a block: 1 head, 4 queries
    got = _at_capacity(emit, split[0], d.hw, 0, cap)
    assert got is not None
    wide, grid, rows = got
    assert grid == (4, 128) and rows == (1, 1)
    script = kern.script
    if cap != CAPACITY:  # the form a first length lowers beside the one it uses (generic_rows.wider)
        other = generic_kernel(e.graph.ops[k], k, e.compiled.info, emit, d.hw, 0, cap)  # type: ignore[arg-type]
        assert other is not None and other[1].endswith(f"rows of up to {cap}")
        script = re.sub(r"\bgeneric_rows_kernel\b", kern.name, other[0])
    lines = script.splitlines()
    touching = [i for i, ln in enumerate(lines) if re.search(r"\b(?:in0|out0)\[", ln)]
    steps = [i for i, ln in enumerate(lines) if re.match(r"\s*acc\d\[0\] = .*acc\d\[0\].*\bs\d\[", ln)]
    assert touching and len(steps) == 2  # the max's and the sum's accumulations from the row's tiles
    for i in touching + steps:
        assert re.match(r"\s*if .*< nr", lines[i - 1]), lines[i]
    # each loop over a row's elements runs the steps that hold one below nr (8 of 512 at 4,096 keys; on llvm
    # 128 steps of a warp's 32 threads)
    threads = 512 if target == "cuda" else LLVM_ROW_THREADS
    loops = [ln.strip() for ln in lines if re.match(r"\s*for \w+ in range\(T\.min", ln)]
    bound = f"in range(T.min({cap // threads}, (nr + {threads - 1}) // {threads})):"
    assert len(loops) == 5 and all(ln.endswith(bound) for ln in loops)
    # the generic text without its guards and with its sizes written back is the emitter's at the capacity
    plain = _parse(_without_guards(script, {"n0": 4, "n1": 128, "nr": cap}), kern.name)
    want = _parse(wide.text.replace(wide.name, kern.name), kern.name)
    assert tvm_ffi.structural_equal(
        _simplified(plain, kern.name, target), _simplified(want, kern.name, target)
    )
    d.wait_rebuilds()


def _without_guards(script: str, sizes: dict[str, int]) -> str:
    """A generic kernel's text with the bound guards it adds removed and its size variables given values."""
    out: list[str] = []
    lines = script.splitlines()
    skip = False
    for ln in lines:
        if skip:
            out.append(ln.replace("    ", "", 1))
            skip = False
        elif re.match(r"\s*if .*< n(?:\d|r)(?: and .*)?:$", ln):
            skip = True
        elif not re.match(r"\s*n(?:\d|r) = T\.int32\(\)$", ln):
            out.append(ln)
    text = "\n".join(out)
    for name, value in sizes.items():
        text = re.sub(rf'"{name}"|\b{name}\b', str(value), text)
    return text


def test_a_reduction_seeded_from_a_row_element_stays_per_length() -> None:
    text = "\n".join(
        [
            "@T.prim_func",
            f'def k(in0: T.Buffer((8, {CAPACITY}), "float32"), out0: T.Buffer((8, 1), "float32")):',
            '    for bx in T.thread_binding(8, thread="blockIdx.x"):',
            f'        s0 = T.alloc_buffer((1, {CAPACITY}), "float32", scope="shared")',
            '        for tx in T.thread_binding(512, thread="threadIdx.x"):',
            '            acc0 = T.alloc_buffer((1,), "float32", scope="local")',
            "            acc0[0] = s0[0, tx]",
        ]
    )
    dims = {"in0": {0: 0, 1: ROW}, "out0": {0: 0}}
    assert generic_text(text, "k", (8,), (1,), dims, row=CAPACITY) is None
    seeded = text.replace("acc0[0] = s0[0, tx]", "acc0[0] = T.max(acc0[0], s0[0, tx])")
    out = generic_text(seeded, "k", (8,), (1,), dims, row=CAPACITY)
    assert out is not None and "if tx < nr:" in out


def test_a_softmax_over_more_keys_than_the_first_capacity_makes_no_compiler_call() -> None:
    # Decode steps at long contexts: rows of 4,097 to 16,384 keys run the form for rows of up to 16,384, lowered
    # and compiled with the first length's generic forms (no compiler call at those lengths); a row longer than
    # every capacity is emitted at its length.
    d = Dispatcher(use_store=False)
    d.kernels(scores(128, 1), "cuda")
    for t in (5000, 4097, 16384, 4099, 4096, 9001):
        e = d.kernels(scores(t, 1), "cuda")
        assert "no build: every kernel from compiled variants" in e.notes, (t, e.notes)
        (kern,) = _row_kernels(e)
        cap = min(c for c in CAPACITIES if c >= t)
        assert kern.rule.endswith(f"rows of up to {cap}"), kern.rule
        steps = cap // kern.threads
        assert f"in range(T.min({steps}, (nr + {kern.threads - 1}) // {kern.threads})):" in kern.script
    assert d.stats.builds == 1
    e = d.kernels(scores(CAPACITIES[-1] + 1, 1), "cuda")
    assert d.stats.builds == 2 and not _row_kernels(e)
    d.wait_rebuilds()
    variants = d._variants["cuda"]
    assert variants.rebuild_errors == []
    if (
        cubin_unavailable_reason() is None
    ):  # the first length's generic module, every capacity in it, via nvcc
        (generic,) = {
            id(v.executable): v.executable
            for s in variants._skeletons.values()
            for v in s.variants
            if "_rows" in v.executable.mod.imports[0].inspect_source()
        }.values()
        source = str(generic.mod.imports[0].inspect_source())
        assert f"kernel0_graph_rows{CAPACITIES[-1]}" in source
        assert build_cubin(source, "sm_90a")


def _loop_text(body: list[str]) -> str:
    head = [
        "@T.prim_func",
        f'def k(in0: T.Buffer((8, {CAPACITY}), "float32"), out0: T.Buffer((8, {CAPACITY}), "float32")):',
        '    for bx in T.thread_binding(8, thread="blockIdx.x"):',
        f'        s0 = T.alloc_buffer((1, {CAPACITY}), "float32", scope="shared")',
        '        s1 = T.alloc_buffer((1, 8), "float32", scope="shared")',
        '        for tx in T.thread_binding(512, thread="threadIdx.x"):',
        "            for e0 in range(8):",
    ]
    return "\n".join(head + [f"                {ln}" for ln in body])


def test_a_loop_over_a_row_stops_at_its_keys_only_where_the_steps_beyond_write_nothing_read() -> None:
    dims = {"in0": {0: 0, 1: ROW}, "out0": {0: 0, 1: ROW}}
    bounded = "for e0 in range(T.min(8, (nr + 511) // 512)):"
    plain = ["f0 = e0 * 512 + tx", "s0[0, f0] = in0[bx, f0]", "out0[bx, f0] = s0[0, f0]"]
    out = generic_text(_loop_text(plain), "k", (8,), (1,), dims, row=CAPACITY)
    assert out is not None and bounded in out and "if bx < n0 and f0 < nr:" in out
    # a step writing a tile that is not a whole row's (read by every later step) keeps every step
    narrow = [*plain, "s1[0, tx % 8] = s0[0, f0]"]
    out = generic_text(_loop_text(narrow), "k", (8,), (1,), dims, row=CAPACITY)
    assert out is not None and bounded not in out and "for e0 in range(8):" in out
    # the loop variable used otherwise than as an element's index keeps every step
    other = ["f0 = e0 * 512 + tx", "s0[0, f0] = in0[bx, f0] * T.float32(e0)"]
    out = generic_text(_loop_text(other), "k", (8,), (1,), dims, row=CAPACITY)
    assert out is not None and bounded not in out


def test_a_capacity_whose_tiles_do_not_fit_a_block_s_shared_memory_is_not_used() -> None:
    # The RTX 4090 allows 99 KiB a block: two float32 tiles of 16,384 keys (132 KiB) do not fit, so a row of
    # 5,000 keys is emitted at its length (its own tiles: 40 KiB), not run in a form that could not launch.
    d = Dispatcher("rtx4090", use_store=False)
    d.kernels(scores(128, 1), "cuda")
    e = d.kernels(scores(200, 1), "cuda")
    (kern,) = _row_kernels(e)
    assert kern.rule.endswith(f"rows of up to {CAPACITY}") and d.stats.builds == 1
    e = d.kernels(scores(5000, 1), "cuda")
    assert not _row_kernels(e) and d.stats.builds == 2
    d.wait_rebuilds()
    assert d._variants["cuda"].rebuild_errors == []


def decode(t: int, heads: int = 4) -> Program:
    """A decode step's softmax: one query over ``t`` keys (no grid dim is as long as the row)."""
    p = Program(name="decode")
    p.output(p.softmax(p.input("S", (heads, 1, t), "float32"), 2))
    return p


def test_a_decode_step_s_softmax_makes_no_compiler_call_at_new_context_lengths() -> None:
    # The row (the keys) is as long as no dim the grid splits: the first length keeps its own row's form, and a
    # length whose row differs takes the capacity's, lowered and compiled with the first length's generic forms.
    d = Dispatcher(use_store=False)
    d.kernels(decode(128), "cuda")
    for t in (200, 97, 1000, 5000, 16384, 7):
        e = d.kernels(decode(t), "cuda")
        assert "no build: every kernel from compiled variants" in e.notes, (t, e.notes)
        (kern,) = _row_kernels(e)
        cap = min(c for c in CAPACITIES if c >= t)
        assert kern.rule.endswith(f"rows of up to {cap}"), (t, kern.rule)
        # golden: without its guards and with the capacity for nr, the emitter's kernel for rows of cap keys
        k = kern.op_index
        plan = e.compiled.plans[k]
        emit = emitter(e.graph, k, e.compiled.info, plan, "cuda", FloatScalar("float32"), kern.name)
        split = _split_dims(e.graph.ops[k], e.compiled.info, k)  # type: ignore[arg-type]
        assert split is not None
        got = _at_capacity(emit, split[0], d.hw, 0, cap)
        assert got is not None
        sizes = {"n0": 4, "n1": 1, "nr": cap}
        plain = _parse(_without_guards(kern.script, sizes), kern.name)
        want = _parse(got[0].text, kern.name)
        assert tvm_ffi.structural_equal(_simplified(plain, kern.name), _simplified(want, kern.name)), t
    assert d.stats.builds == 1
    # a norm's row (its hidden dim) does not follow the length: it keeps its own row's form at every length
    for t in (128, 200, 97):
        e = d.kernels(layer(t), "cuda")
        assert not any("rows of up to" in k.rule for k in e.compiled.kernels("cuda")), t
    d.wait_rebuilds()
    assert d._variants["cuda"].rebuild_errors == []

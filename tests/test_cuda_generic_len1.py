"""One token on the CUDA first tier (gensorage.folds): a copy's index folds, row fusion's grid dims and a batched
matmul's extra dims of 1 are the first length's where that is exact, so a length of 1 runs the generic kernels
compiled at the first length (no compiler call); each replayed form computes what the emitter's own length-1
kernel does (the llvm twin: copies bitwise, matmuls and row kernels against float64)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tvm
import tvm_ffi
from test_cuda_generic import attention, copies, rows, run_copies_on_llvm
from test_cuda_generic_rows import rotary, scores

from gensorage.codegen.generic_matmul import generic_matmuls
from gensorage.codegen.generic_rows import emitter
from gensorage.codegen.module import _parse, compile_ugraph
from gensorage.codegen.predefined import _simple
from gensorage.codegen.scalar import FloatScalar
from gensorage.codegen.script_templates import skeleton
from gensorage.codegen.tir_text import Ix, broadcast_index
from gensorage.dtypes import numpy_dtype
from gensorage.folds import same_folds, scope
from gensorage.program import Program
from gensorage.superopt.dispatch import Dispatcher
from gensorage.superopt.row_fusion import fuse_rows
from gensorage.ugraph import from_program

NO_BUILD = "no build: every kernel from compiled variants"


def masked(t: int, heads: int = 4, d: int = 16) -> Program:
    """Attention's scores with a scale and a mask over ``t`` tokens: a batched matmul whose epilogue reads a
    ``[t, t]`` operand, all of whose dims are 1 at one token (taken for broadcast dims without the replay)."""
    p = Program(name="masked")
    q, k = p.input("Q", (heads, t, d), "bfloat16"), p.input("K", (heads, t, d), "bfloat16")
    m = p.input("M", (t, t), "bfloat16")
    p.output(p.add(p.scale(p.matmul(q, p.transpose(k, 1, 2)), 0.25), m))
    return p


def gated(t: int, h: int = 4096) -> Program:
    """An MLP's gate over ``t`` tokens (``silu(a) · b``): a row kernel whose rows (of more elements than a block's
    tile) the grid splits too, so it is emitted per length as text (generic_rows does not apply), its grid dim
    over the tokens of extent 1 at one token."""
    p = Program(name="gated")
    a, b = p.input("A", (t, h), "float32"), p.input("B", (t, h), "float32")
    p.output(p.mul(p.silu(a), b))
    return p


def test_a_replayed_decision_is_taken_only_where_it_is_exact() -> None:
    f = Ix.var("f")
    store: dict = {}  # type: ignore[type-arg]
    with scope(store):
        # recorded at f < 16 (folds to 0); at f < 64 that fold is wrong: the replay stops, the plain text
        assert same_folds("a", lambda: str(f.floordiv(16, 16))) == "0"
        assert same_folds("a", lambda: str(f.floordiv(16, 64))) == "f // 16"
        # recorded unfolded at f < 64; at f < 16 the term is kept (exact: it is 0 there)
        assert same_folds("b", lambda: str(f.floordiv(16, 64).mod(4, 4))) == "f // 16"
        assert same_folds("b", lambda: str(f.floordiv(16, 16).mod(1, 1))) == "f // 16"
        assert same_folds("c", lambda: str(f.floordiv(16, 256).mod(4, 16))) == "(f // 16) % 4"
        assert same_folds("c", lambda: str(f.floordiv(16, 16).mod(1, 1))) == "(f // 16) % 1"
        # a broadcast dim's index: the output's only where the output's dim is 1 too
        assert same_folds("d", lambda: broadcast_index([f, f], [8, 4], [8, 4])) == [f, f]
        assert same_folds("d", lambda: broadcast_index([f, f], [1, 4], [1, 4])) == [f, f]
        assert same_folds("d", lambda: broadcast_index([f, f], [1, 4], [8, 4])) == [Ix(), f]
    assert store == {"a": ("zero",), "b": ("term", "same"), "c": ("term", "term"), "d": ("index", "index")}
    # outside a scope: the value rule alone
    assert str(f.floordiv(16, 16).mod(1, 1)) == "0" and broadcast_index([f, f], [1, 4], [1, 4]) == [Ix(), f]


@pytest.mark.parametrize("make", [rows, copies, rotary, scores, attention, masked, gated])
def test_one_token_after_the_first_length_makes_no_compiler_call(make) -> None:  # type: ignore[no-untyped-def]
    d = Dispatcher(use_store=False)
    d.kernels(make(128), "cuda")
    for t in (1, 2, 1, 97):  # 1 again: a hit
        e = d.kernels(make(t), "cuda")
        assert NO_BUILD in e.notes, (t, e.notes)
        assert e.equivalence  # the µGraph at this length checked as before (or the direct one)
    assert d.stats.builds == 1 and d.stats.hits == 1
    d.wait_rebuilds()
    assert d._variants["cuda"].rebuild_errors == []  # the length-1 own kernels built in the background


def test_a_copy_with_its_first_length_s_folds_computes_what_the_emitter_s_copy_does_at_one_token() -> None:
    # The llvm twin of each copy's text at one token with the folds of 128 tokens (its whole block and guard,
    # as the CUDA first tier's) against the emitter's own copy at one token: the same code as at 128 tokens,
    # bitwise equal outputs.
    plain = Dispatcher(use_store=False, symbolic=False)
    first, one = (plain.kernels(copies(t, 2, 16), "llvm") for t in (128, 1))
    sc = FloatScalar("float32")
    store: dict = {}  # type: ignore[type-arg]
    rng = np.random.default_rng(1)
    replayed = 0
    for kern in one.compiled.kernels("llvm"):
        if "one output element each" not in kern.rule:
            continue
        (at_first,) = [k for k in first.compiled.kernels("llvm") if k.name == kern.name]
        name = kern.name

        def emit(entry, k: int, name: str = name):  # type: ignore[no-untyped-def]
            g, info = entry.graph, entry.compiled.info
            return _simple(g, k, info, plain.hw, "llvm", sc, name, threads=1024, guard=True)

        with scope(store):
            wide = same_folds(name, functools.partial(emit, first, at_first.op_index))
            mine = same_folds(name, functools.partial(emit, one, kern.op_index))
        assert skeleton(mine.text, name)[0] == skeleton(wide.text, name)[0], name  # the first length's code
        own = _simple(one.graph, kern.op_index, one.compiled.info, plain.hw, "llvm", sc, name)
        replayed += skeleton(own.text, name)[0] != skeleton(wide.text, name)[0]
        outs = run_copies_on_llvm((own, mine), rng)
        assert np.array_equal(outs[0], outs[1]), name
    assert replayed >= 3  # copies whose own code at one token differs (folded), now the first length's


def test_a_masked_batched_matmul_at_one_token_is_the_first_length_s_generic_kernel_and_right() -> None:
    # The mask's dims of 1 are the output's (as at 128 tokens), not broadcast: the generic kernel of 128 tokens,
    # its llvm twin run at one token against float64 and against the emitter's own form there.
    hw = Dispatcher(use_store=False).hw
    store: dict = {}  # type: ignore[type-arg]
    funcs, got = [], []
    rng = np.random.default_rng(2)
    bf16 = numpy_dtype("bfloat16")
    q, k = (rng.standard_normal((4, 1, 16)).astype(bf16) for _ in range(2))
    m = rng.standard_normal((1, 1)).astype(bf16)
    want = np.float64(0.25) * (q.astype(np.float64) @ k.astype(np.float64).transpose(0, 2, 1)) + m
    for t, replay in ((128, True), (1, True), (1, False)):
        with generic_matmuls(), scope(store if replay else {}):
            c = compile_ugraph(fuse_rows(from_program(masked(t)), hw), hw, "llvm")
        (mm,) = [kern for kern in c.kernels("llvm") if kern.name.endswith("_matmul")]
        funcs.append(mm.func)
        if t == 1:
            (out,) = c.run(q, k, m)
            got.append(np.asarray(out).astype(np.float64))
    assert tvm_ffi.structural_equal(funcs[1], funcs[0])  # one kernel for 128 tokens and one
    assert not tvm_ffi.structural_equal(funcs[2], funcs[0])  # without the replay: the mask broadcast
    for out in got:
        assert np.allclose(out, want, rtol=1e-2, atol=1e-2), (out, want)
    assert np.allclose(got[0], got[1], rtol=1e-2, atol=1e-2)


def test_row_kernels_at_one_token_keep_the_first_length_s_grid_dims_and_compute_the_program() -> None:
    # Row fusion at one token splits no dim (every other dim is 1); with the first length's grid dims (extent 1
    # here) its kernels are the first length's generic ones. The µGraph so made is checked at one token by the
    # dispatcher, and its llvm build computes the program (float64 reference).
    d = Dispatcher(use_store=False)
    first = d.kernels(rotary(128), "cuda")
    e = d.kernels(rotary(1), "cuda")
    assert NO_BUILD in e.notes and e.equivalence.method == "equivalence check", e.notes
    assert all("generic in the rows" in k.rule for k in e.compiled.kernels("cuda"))
    (op,) = e.graph.ops
    (want_op,) = first.graph.ops
    assert op.block.nodes == want_op.block.nodes  # type: ignore[union-attr]  # the same dims split
    assert op.block.grid == (4, 1) and want_op.block.grid == (4, 32)  # type: ignore[union-attr]
    rng = np.random.default_rng(3)
    bf16 = numpy_dtype("bfloat16")
    x, c, y, s = (rng.standard_normal(shape).astype(bf16) for shape in ((4, 1, 16), (1, 16)) * 2)
    (out,) = compile_ugraph(e.graph, d.hw, "llvm").run(x, c, y, s)
    f64 = [a.astype(np.float64) for a in (x, c, y, s)]
    ref = f64[0] * f64[1] + f64[2] * f64[3]
    assert np.allclose(np.asarray(out).astype(np.float64), ref, rtol=1e-2, atol=1e-2)


def test_a_decode_step_after_a_one_token_prefill_makes_no_compiler_call() -> None:
    # The LLaMA-style layer's KV-cache decode step (tests/test_torch_decode.py) with a cache of 128, then of 1
    # (the step after a one-token prefill) and 2 keys: the cache's dims of 1 fold nothing new.
    torch = pytest.importorskip("torch")
    dynamo = pytest.importorskip("torch._dynamo")
    from test_torch_decode import DecodeStep, decode_inputs

    import gensorage.torch as gtorch
    import gensorage.torch.subgraph as subgraph
    from gensorage.errors import GensorageError

    programs: list[Program] = []

    def record(program: Program, options: object, device: object = None) -> None:
        programs.append(program)
        raise GensorageError("captured only")

    torch.manual_seed(0)
    step = DecodeStep().to(torch.bfloat16).eval()
    real = subgraph.compiled
    subgraph.compiled = record  # type: ignore[assignment]
    try:
        for past in (128, 1, 2):
            dynamo.reset()
            with torch.no_grad():
                gtorch.compile(step, hw="h200")(*decode_inputs(past, torch.bfloat16, seed=past))
    finally:
        subgraph.compiled = real  # type: ignore[assignment]
    d = Dispatcher("h200")
    for past, p in zip((128, 1, 2), programs, strict=True):
        e = d.kernels(p, "cuda")
        assert past == 128 or NO_BUILD in e.notes, (past, e.notes)
    assert d.stats.builds == 1
    d.wait_rebuilds()
    assert d._variants["cuda"].rebuild_errors == []


def test_a_row_kernel_emitted_per_length_has_its_first_length_s_code_at_one_token_and_computes_the_same() -> (
    None
):
    # The gate's row kernel (no generic row form: the grid splits its rows' last dim) at one token, emitted with
    # the folds of 128 tokens (its token grid dim of one block keeps its index): the first length's code, and
    # its llvm twin computes bitwise what the emitter's own kernel at one token does.
    d = Dispatcher(use_store=False)
    first = d.kernels(gated(128), "cuda")
    one = d.kernels(gated(1), "cuda")
    assert NO_BUILD in one.notes, one.notes
    (kern,) = one.compiled.kernels("cuda")
    assert "generic in the rows" not in kern.rule and kern.own is not None
    assert (
        skeleton(kern.own()[0].script(), kern.name)[0] != skeleton(kern.script, kern.name)[0]
    )  # folded there
    sc, name, k = FloatScalar("float32"), kern.name, kern.op_index
    store: dict = {}  # type: ignore[type-arg]
    with scope(store):
        texts = [
            same_folds(name, emitter(e.graph, k, e.compiled.info, e.compiled.plans[k], "llvm", sc, name)).text
            for e in (first, one)
        ]
    own = emitter(one.graph, k, one.compiled.info, one.compiled.plans[k], "llvm", sc, name)().text
    assert skeleton(texts[1], name)[0] == skeleton(texts[0], name)[0] != skeleton(own, name)[0]
    rng = np.random.default_rng(4)
    ins = [rng.standard_normal((1, 4096)).astype("float32") for _ in range(2)]
    outs = []
    for text in (own, texts[1]):
        ex = tvm.compile(_parse(text, name), target="llvm")
        out = tvm.runtime.empty((1, 4096), "float32", tvm.cpu())
        ex(*[tvm.runtime.tensor(a) for a in ins], out)
        outs.append(out.numpy())
    assert np.array_equal(outs[0], outs[1])
    a, b = (x.astype(np.float64) for x in ins)
    assert np.allclose(outs[0], a / (1 + np.exp(-a)) * b, rtol=1e-5, atol=1e-5)

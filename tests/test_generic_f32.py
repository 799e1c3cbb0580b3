"""float32 matmuls (the construction tuner's CUDA-core schedules) generic in their length-dependent extents
(gensorage.codegen.generic_matmul): a projection's rows, attention's rows, columns and reduction TIR variables,
one PrimFunc per key at every length on llvm and CUDA, exact at every length (CUDA: compile-only here)."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import tvm_ffi
from test_symbolic_kernels import check_float64

from gensorage.codegen import generic_matmul
from gensorage.codegen.cuda_build import build_cubin, cubin_unavailable_reason
from gensorage.codegen.predefined_matmul import _MatmulShape
from gensorage.codegen.symbolic_kernels import BoundExecutable
from gensorage.codegen.wgmma import target_profile
from gensorage.program import Program
from gensorage.superopt.dispatch import Dispatcher

#: After the first (64): 1, 2, primes, lengths larger than the first, lengths no tile divides.
NEW_LENGTHS = (1, 2, 13, 97, 200, 31, 7)


def projection32(t: int, h: int = 64, d: int = 96) -> Program:
    """A normalised float32 projection over ``t`` tokens with a residual added in its epilogue."""
    p = Program(name="projection32")
    x, g = p.input("X", (t, h), "float32"), p.input("G", (h,), "float32")
    w, r = p.input("W", (h, d), "float32"), p.input("R", (t, d), "float32")
    p.output(p.add(p.matmul(p.mul(p.rms_norm(x), g), w), r))
    return p


def attention32(t: int, heads: int = 4, d: int = 16) -> Program:
    """Attention's two batched float32 matmuls over ``t`` tokens (scores ``Q Kᵀ``, then ``S V``)."""
    p = Program(name="attention32")
    q, k = p.input("Q", (heads, t, d), "float32"), p.input("K", (heads, t, d), "float32")
    v = p.input("V", (heads, t, d), "float32")
    p.output(p.matmul(p.matmul(q, p.transpose(k, 1, 2)), v))
    return p


def _matmuls(e: Any, target: str = "llvm") -> list[Any]:
    return [k for k in e.compiled.kernels(target) if k.name.endswith("_matmul")]


@pytest.mark.parametrize(
    ("batch", "a", "b"),
    [((), (64, 96), (96, 48)), ((4,), (64, 16), (16, 64)), ((4,), (64, 64), (64, 16))],
    ids=["projection", "scores", "pv"],
)
def test_the_generic_float32_schedule_is_right_at_every_length(
    batch: tuple[int, ...], a: tuple[int, int], b: tuple[int, int]
) -> None:
    # The key's schedule (the construction tuner's at 64 tokens), compiled once with its variables, against
    # float64 at lengths no tile divides: a projection's rows, a batched matmul's dims of 64 (the length).
    import tvm

    from gensorage.construction import construct_schedule, matmul_workload
    from gensorage.hw import load_profile

    hw = load_profile("h100")
    ms = _MatmulShape((*batch, *a), (*batch, *b), (*batch, a[0], b[1]))
    got = generic_matmul.generic_kernel(
        ms,
        ("float32",) * 3,
        None,
        None,
        hw,
        0,
        lambda: construct_schedule(matmul_workload(*ms.dims, "float32"), hw, 0),
        "llvm",
        cuda_core=True,
    )
    assert got is not None
    ex = tvm.compile(tvm.IRModule({"main": got[1]}), target="llvm")
    rng = np.random.default_rng(0)
    for t in (1, 2, 3, 7, 13, 31, 64, 97, 200):
        sa, sb = ((t if d == 64 else d) for d in a), ((t if d == 64 else d) for d in b)
        x = rng.standard_normal((*batch, *sa)).astype(np.float32)
        y = rng.standard_normal((*batch, *sb)).astype(np.float32)
        want = x.astype(np.float64) @ y.astype(np.float64)
        out = tvm.runtime.empty(want.shape, "float32", tvm.cpu())
        ex(tvm.runtime.tensor(x), tvm.runtime.tensor(y), out)
        assert np.abs(out.numpy() - want).max() <= 1e-5 * np.abs(want).max(), t


@pytest.mark.parametrize("make", [projection32, attention32])
def test_new_lengths_build_nothing_and_are_right(make) -> None:  # type: ignore[no-untyped-def]
    # llvm: no build at a new length (at 1 the projection's row kernel folds its dims of 1: another kernel,
    # its matmul the same variant); float64 on the generic variants (the background builds held back), then on
    # the length's own kernels swapped in.
    d = Dispatcher(use_store=False)
    e = d.kernels(make(64))
    d.wait_rebuilds()
    assert all(k.rule.endswith("generic in the rows") for k in _matmuls(e))
    variants = d._variants["llvm"]
    first = {k.name: _bound(e).variant_of(k.name)[0] for k in _matmuls(e)}
    for t in NEW_LENGTHS:
        p = make(t)
        with variants._rebuild_lock:
            e = d.kernels(p)
            if t > 1 or make is attention32:
                assert "no build: every kernel from compiled variants" in e.notes, (t, e.notes)
            assert {k.name: _bound(e).variant_of(k.name)[0] for k in _matmuls(e)} == first, t
            assert _bound(e).generation == 0
            check_float64(e, p, seed=t, scale=3.0)
        d.wait_rebuilds()
        assert _bound(e).generation == 1 and variants.rebuild_errors == []
        check_float64(e, p, seed=t + 1, scale=3.0)


def _bound(entry: Any) -> BoundExecutable:
    ex = entry.compiled.executable("llvm")
    assert isinstance(ex, BoundExecutable)
    return ex


@pytest.mark.parametrize("make", [projection32, attention32])
def test_the_length_s_own_build_has_the_construction_s_matmul_there(make) -> None:  # type: ignore[no-untyped-def]
    from gensorage.codegen.symbolic_kernels import _own

    d = Dispatcher(use_store=False)
    d.kernels(make(64))
    e = d.kernels(make(97))
    plain = Dispatcher(use_store=False, symbolic=False).kernels(make(97))
    for mm, want in zip(_matmuls(e), _matmuls(plain), strict=True):
        own = _own(mm)
        assert own.rule == want.rule and "generic" not in own.rule
        assert tvm_ffi.structural_equal(own.func, want.func)
    d.wait_rebuilds()


def test_the_float32_small_layer_builds_nothing_at_new_lengths() -> None:
    """The float32 small decoder layer (tests/test_torch_frontend.py) on llvm: after its first length, new
    lengths make no build (its projections and attention's matmuls generic), within 1e-4 of float64."""
    torch = pytest.importorskip("torch")
    from test_torch_frontend import DecoderLayer, assert_close, layer_inputs

    import gensorage.torch as gtorch
    from gensorage.torch import subgraph

    torch.manual_seed(0)
    layer = DecoderLayer().eval()
    exact = copy.deepcopy(layer).double()
    compiled = gtorch.compile(layer)
    d = subgraph.dispatcher(subgraph.Options())
    with torch.no_grad():
        for t in (8, 12, 2, 33):
            builds = d.stats.builds
            args = layer_inputs(t, torch.float32, seed=t)
            compiled(*args)
            assert_close(compiled(*args), exact(*(a.double() for a in args)), 1e-4)
            assert d.stats.builds - builds == (t == 8), (t, d.stats)
    d.wait_rebuilds()
    assert d._variants["llvm"].rebuild_errors == []


@pytest.mark.skipif(cubin_unavailable_reason() is not None, reason="nvcc not available")
@pytest.mark.parametrize("make", [projection32, attention32])
def test_the_cuda_generic_float32_matmuls_compile_with_nvcc(make) -> None:  # type: ignore[no-untyped-def]
    d = Dispatcher(use_store=False, tiered=False)
    e = d.kernels(make(128), "cuda")
    built = d._variants["cuda"].last_build
    assert _matmuls(e, "cuda") and all(k.rule.endswith("generic in the rows") for k in _matmuls(e, "cuda"))
    for t in (97, 200):  # the same compiled kernels: no compiler call
        assert "no build: every kernel from compiled variants" in d.kernels(make(t), "cuda").notes, t
    arch = target_profile(e.compiled.hw, [k.rule for k in e.compiled.kernels("cuda")]).arch
    assert build_cubin(str(built.mod.imports[0].inspect_source()), arch)

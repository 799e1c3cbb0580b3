"""The llvm first tier (gensorage.codegen.symbolic_kernels, tiered, on the llvm target): text kernels generic at
first sight and matmuls with the rows a variable (the llvm twin of CUDA's symbolic schedules), called at new
lengths without a build, exact at every length; the length's own kernels are built in the background."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tvm_ffi
from test_cuda_generic import attention, copies, projection
from test_cuda_generic_rows import rotary, scores
from test_symbolic_kernels import check_float64

from gensorage.codegen.script_templates import _bind
from gensorage.codegen.symbolic_kernels import BoundExecutable, _block_free
from gensorage.program import Program
from gensorage.superopt.dispatch import Dispatcher

#: After the first (64): 1, primes, lengths larger than the first, lengths no tile divides.
NEW_LENGTHS = (1, 13, 97, 200, 31, 7, 2, 128)


def _bound(entry: Any) -> BoundExecutable:
    ex = entry.compiled.executable("llvm")
    assert isinstance(ex, BoundExecutable)
    return ex


def _check_bf16(entry: Any, p: Program, seed: int) -> None:
    """The runner's outputs against the Program in float64 on the same bfloat16 inputs (a relative bound: the
    float32 accumulators and bfloat16 roundings between the matmuls)."""
    import torch  # bfloat16 through DLPack

    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randn(t.shape, generator=gen).to(torch.bfloat16) for t in p.inputs]
    want = p.run(*[x.double().numpy() for x in xs])
    got = entry.runner(xs, lambda shape, dtype: torch.empty(shape, dtype=getattr(torch, dtype)))
    for g, w in zip(got, want, strict=True):
        g = g.double().numpy()
        assert np.linalg.norm(g - w) <= 2e-2 * np.linalg.norm(w) + 1e-6, (p.inputs[0].shape, seed)


@pytest.mark.parametrize("make", [copies, attention, rotary, scores])
def test_new_lengths_make_no_build(make) -> None:  # type: ignore[no-untyped-def]
    d = Dispatcher(use_store=False)
    d.kernels(make(64))
    lengths = [t for t in NEW_LENGTHS if t > 1]  # at 1 the copies' flat index drops its dims of 1: other code
    for t in lengths:
        e = d.kernels(make(t))
        assert "no build: every kernel from compiled variants" in e.notes, (t, e.notes)
    assert d.stats.builds == 1 and d.stats.new_shapes == len(lengths)
    d.wait_rebuilds()
    assert d._variants["llvm"].rebuild_errors == []


def test_a_projection_s_matmul_is_one_variant_at_every_length() -> None:
    d = Dispatcher(use_store=False)
    seen = set()
    for t in (64, *NEW_LENGTHS):
        e = d.kernels(projection(t))
        ex = _bound(e)
        (mm,) = [
            k for k in e.compiled.kernels("llvm") if "generic in the rows" in k.rule and "matmul" in k.name
        ]
        seen.add(ex.variant_of(mm.name)[0])
    assert len(seen) == 1, seen
    d.wait_rebuilds()


@pytest.mark.parametrize("make", [copies, projection, attention])
def test_the_variant_at_a_length_is_the_emitters_kernel_there(make) -> None:  # type: ignore[no-untyped-def]
    # Golden: the variant each length calls, its parameters bound to that length's values, is structurally the
    # PrimFunc the emitter wrote for that length (a matmul's through the build's block lowering).
    d = Dispatcher(use_store=False)
    for t in (64, *NEW_LENGTHS, 3, 5):
        e = d.kernels(make(t))
        ex = _bound(e)
        for kern in e.compiled.kernels("llvm"):
            variant, values = ex.calls[kern.name]
            dynamic = [values[i] for i in variant.dynamic]
            bound = _bind(variant.func, dynamic, kern.name) if dynamic else variant.func
            want = _block_free(kern).func
            assert tvm_ffi.structural_equal(bound.with_attr("global_symbol", kern.name), want), (t, kern.name)
    d.wait_rebuilds()


@pytest.mark.parametrize("make", [copies, projection, attention, rotary, scores])
def test_the_first_tier_and_the_length_s_own_kernels_are_right(make) -> None:  # type: ignore[no-untyped-def]
    # float64 at 1, primes and lengths beyond the first: first on the generic variants (the background builds
    # held back), then on the length's own kernels swapped in.
    d = Dispatcher(use_store=False)
    d.kernels(make(64))
    d.wait_rebuilds()
    variants = d._variants["llvm"]
    for t in (1, 13, 97, 2, 200):
        p = make(t)
        with variants._rebuild_lock:
            e = d.kernels(p)
            assert _bound(e).generation == 0
            _check(e, p, t)
        d.wait_rebuilds()
        assert _bound(e).generation == 1 and variants.rebuild_errors == []
        _check(e, p, t + 1)


def _check(entry: Any, p: Program, seed: int) -> None:
    if all(t.dtype == "float32" for t in p.inputs):
        check_float64(entry, p, seed=seed, scale=3.0)
    else:
        _check_bf16(entry, p, seed)

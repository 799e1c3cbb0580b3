"""Kernels compiled over their length-dependent literals (gensorage.codegen.symbolic_kernels) through the
dispatcher: right at every length, and new lengths in a compiled variant's bucket build nothing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_dispatch import _aligned, _empty, rms_matmul

from gensorage.errors import ScheduleError
from gensorage.program import Program
from gensorage.superopt.dispatch import Dispatcher

#: Lengths 1, primes, and others that are multiples of no tile.
LENGTHS = st.sampled_from([1, 2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 53, 9, 15, 21, 33, 50, 64])


def rms_rows(t: int, h: int = 48) -> Program:
    """RMSNorm with its weight and a residual add over ``t`` rows: row kernels and elementwise ones, no matmul."""
    p = Program(name="rms_rows")
    x, g = p.input("X", (t, h), "float32"), p.input("G", (h,), "float32")
    p.output(p.add(p.mul(p.rms_norm(x), g), x))
    return p


def check_float64(entry, p: Program, seed: int, scale: float) -> None:  # type: ignore[no-untyped-def]
    """The runner's and the general path's outputs against the Program in float64."""
    rng = np.random.default_rng(seed)
    xs = [(scale * rng.standard_normal(t.shape)).astype(np.float32) for t in p.inputs]
    want = p.run(*[x.astype(np.float64) for x in xs])
    for got in (entry.run(*xs), entry.runner([_aligned(x) for x in xs], _empty)):
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * max(1.0, float(np.max(np.abs(w)))))


_SHARED = Dispatcher(use_store=False)  # one dispatcher across the examples: later lengths meet built variants


@settings(max_examples=25)
@given(t=LENGTHS, scale=st.sampled_from([1e-3, 1.0, 30.0, 1e3]), seed=st.integers(0, 2**16))
def test_compiled_variants_are_right_at_every_length(t: int, scale: float, seed: int) -> None:
    for make in (rms_rows, rms_matmul):
        p = make(t)
        check_float64(_SHARED.kernels(p), p, seed, scale)


def test_new_lengths_in_a_bucket_build_nothing() -> None:
    # Untiered: the first length builds every kernel as written; the second builds each kernel again with the
    # literals that changed left as parameters; later lengths of the same skeletons call those, with no build.
    # (Tiered, the kernels are generic at first sight: tests/test_llvm_generic.py.)
    d = Dispatcher(use_store=False, tiered=False)
    for t in (8, 12):
        d.kernels(rms_rows(t))
    assert d.stats.builds == 2
    for t in (16, 24, 40, 64, 10, 20):
        e = d.kernels(rms_rows(t))
        assert "no build: every kernel from compiled variants" in e.notes
        ex = e.compiled.executable("llvm")
        assert all(ex.variant_of(k.name)[1] for k in e.compiled.kernels("llvm")), (
            "a literal left as a parameter"
        )
        check_float64(e, rms_rows(t), seed=t, scale=10.0)
    assert d.stats.builds == 2 and d.stats.new_shapes == 7


def test_switched_off_every_new_length_builds() -> None:
    d = Dispatcher(use_store=False, symbolic=False)
    for t in (8, 12, 16):
        d.kernels(rms_rows(t))
    assert d.stats.builds == 3


def test_a_failed_build_of_variants_keeps_none_and_the_kernels_are_built_as_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gensorage.codegen import symbolic_kernels

    d = Dispatcher(use_store=False, tiered=False)  # the second length builds widened variants
    d.kernels(rms_rows(8))
    real = symbolic_kernels.compile_kernels

    def fail(*args: object, **kwargs: object) -> None:
        raise ScheduleError("llvm build of the µGraph kernels failed: injected")

    monkeypatch.setattr(symbolic_kernels, "compile_kernels", fail)
    e = d.kernels(rms_rows(12))
    assert any("compiled variants failed" in n for n in e.notes), e.notes
    check_float64(e, rms_rows(12), seed=12, scale=3.0)  # the kernels' own build (CompiledUGraph.executable)
    assert all(v.executable is not None for s in d._variants["llvm"]._skeletons.values() for v in s.variants)
    monkeypatch.setattr(symbolic_kernels, "compile_kernels", real)
    e = d.kernels(rms_rows(16))  # the variants are made afresh
    assert "no build: every kernel from compiled variants" not in e.notes
    check_float64(e, rms_rows(16), seed=16, scale=3.0)
    assert "no build: every kernel from compiled variants" in d.kernels(rms_rows(20)).notes


def gqa_rows(t: int, heads: int = 4, kv_heads: int = 2, d: int = 8) -> Program:
    """GQA attention over ``t`` tokens: repeats (a flat index split by the length), a scaled score matmul whose
    columns are the length, a softmax, a P·V matmul reducing over it."""
    p = Program(name="gqa_rows")
    q = p.input("Q", (heads, t, d), "float32")
    k = p.input("K", (kv_heads, d, t), "float32")
    v = p.input("V", (kv_heads, t, d), "float32")
    g = heads // kv_heads
    s = p.scale(p.matmul(q, p.repeat(k, 0, g)), d**-0.5)
    p.output(p.matmul(p.softmax(s, 2), p.repeat(v, 0, g)))
    return p


#: New lengths after a first one of 8: non-multiples of every tile, primes, far apart, below and beyond it.
NEW_LENGTHS = (12, 20, 33, 34, 57, 100, 1, 5, 64, 41, 77, 96)


def test_variants_are_right_at_new_prefill_lengths() -> None:
    """Attention with repeats (flat indices split by the length) and matmuls whose columns or reduction are the
    length (partial tiles guarded), against float64. Magnitudes up to 3: at 30 the scores reach thousands and
    float32's softmax of them is 1e-3 from float64 (the kernels as written at each length are too)."""
    d = Dispatcher(use_store=False)
    for t in (8, *NEW_LENGTHS):
        p = gqa_rows(t)
        check_float64(d.kernels(p), p, seed=t, scale=3.0 if t % 2 else 1e-3)

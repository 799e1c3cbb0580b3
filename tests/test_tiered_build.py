"""Tiered builds of compiled variants (gensorage.codegen.symbolic_kernels): a new length is served by kernels
generic at first sight and built without LLVM's optimisation, rebuilt at the full level in the background, and
the length's own kernels built in the background, each swapped into the runners."""

from __future__ import annotations

import ctypes
import gc
import logging
from typing import Any

import pytest
from test_symbolic_kernels import check_float64, gqa_rows

from gensorage.codegen import library
from gensorage.errors import ScheduleError
from gensorage.superopt.dispatch import Dispatcher


def _functions(entry: Any) -> set[int]:
    """The compiled functions the entry's prepared runner calls (a partial binds a variant's literals)."""
    return {id(getattr(fn, "func", fn)) for fn, _ in entry.runner._plan_calls}


def _variants(d: Dispatcher) -> list[Any]:
    return [v for s in d._variants["llvm"]._skeletons.values() for v in s.variants]


def test_the_first_tier_is_right_and_its_rebuild_is_swapped_into_the_runner() -> None:
    d = Dispatcher(use_store=False)
    first = d.kernels(gqa_rows(8))
    d.wait_rebuilds()
    variants = d._variants["llvm"]
    # the first tier's build rebuilt at the full level, and the length's own kernels swapped in
    assert variants.rebuilds == 2 and not any(v.quick for v in _variants(d))
    assert first.compiled.executable("llvm").generation == 1
    with variants._rebuild_lock:  # hold the rebuilds back: the new length runs on its first tier
        e = d.kernels(gqa_rows(1))  # at one token its row kernels build (its matmuls are generic)
        quick = [v for v in _variants(d) if v.quick]
        assert quick and any("first tier" in n for n in e.notes), e.notes
        first_tier = [
            getattr(fn, "func", fn) for fn, _ in e.runner._plan_calls
        ]  # held: their ids stay theirs
        assert {id(v.function) for v in quick} <= _functions(e)
        check_float64(e, gqa_rows(1), seed=33, scale=3.0)
    d.wait_rebuilds()
    assert variants.rebuilds == 4 and not variants.rebuild_errors
    assert not any(v.quick for v in quick)
    assert e.compiled.executable("llvm").generation == 1  # the length's own kernels
    served = _functions(e)
    assert not {id(f) for f in first_tier} & served, "the runner still calls a first-tier function"
    check_float64(e, gqa_rows(1), seed=34, scale=3.0)
    assert d.stats.builds == 2  # the rebuilds are not counted as builds


def test_switched_off_the_kernels_are_built_at_the_full_level_before_serving() -> None:
    d = Dispatcher(use_store=False, tiered=False)
    for t in (8, 33):
        e = d.kernels(gqa_rows(t))
        assert not any("first tier" in n for n in e.notes)
        assert not any(v.quick for v in _variants(d))
        check_float64(e, gqa_rows(t), seed=t, scale=3.0)
    d.wait_rebuilds()
    assert d._variants["llvm"].rebuilds == 0 and d._variants["llvm"]._worker.thread is None


def test_a_failed_rebuild_keeps_the_first_tier(monkeypatch: pytest.MonkeyPatch) -> None:
    from gensorage.codegen import symbolic_kernels

    real = symbolic_kernels.compile_kernels

    def full_fails(*args: Any, quick: bool = False, **kwargs: Any) -> Any:
        if not quick:  # the rebuild at the full level and the length's own build
            raise ScheduleError("llvm build of the µGraph kernels failed: injected")
        return real(*args, quick=quick, **kwargs)

    monkeypatch.setattr(symbolic_kernels, "compile_kernels", full_fails)
    d = Dispatcher(use_store=False)
    e = d.kernels(gqa_rows(12))
    d.wait_rebuilds()
    variants = d._variants["llvm"]
    assert variants.rebuilds == 0 and all("injected" in err for err in variants.rebuild_errors)
    assert all(v.quick for v in _variants(d)) and e.compiled.executable("llvm").generation == 0
    check_float64(e, gqa_rows(12), seed=12, scale=3.0)


def test_lengths_requested_while_rebuilds_run_end_on_the_full_level() -> None:
    from gensorage.codegen import symbolic_kernels

    d = Dispatcher(use_store=False)
    entries, first_tier = {}, []
    for t in (8, 12, 20, 33, 5, 57):  # back to back: each build meets the rebuilds of the lengths before
        entries[t] = d.kernels(gqa_rows(t))
        with symbolic_kernels._SWAP:  # a consistent view: a swap holds it
            first_tier += [v.function for v in _variants(d) if v.quick and v.function is not None]
        check_float64(entries[t], gqa_rows(t), seed=t, scale=3.0)
    d.wait_rebuilds()
    variants = d._variants["llvm"]
    assert first_tier and not variants.rebuild_errors
    assert not any(v.quick for v in _variants(d))
    for t, e in entries.items():
        assert e.compiled.executable("llvm").generation == 1, f"length {t} lacks its own kernels"
        assert not _functions(e) & {id(f) for f in first_tier}, (
            f"length {t} still calls a first-tier function"
        )
        check_float64(e, gqa_rows(t), seed=t + 1, scale=3.0)


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_size_t)
        for n in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _heap_used() -> int:
    """glibc's heap in use (every arena; ``mallinfo2``), after a collection: native memory live objects hold."""
    gc.collect()
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    return int(info.uordblks + info.hblkhd)


def test_background_builds_are_served_from_a_loaded_library_and_keep_no_llvm_heap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    d = Dispatcher(use_store=False)
    e = d.kernels(gqa_rows(8))
    d.wait_rebuilds()
    bound = e.compiled.executable("llvm")
    assert bound.generation == 1
    exact = bound._exact
    assert getattr(exact, "_ex", exact).kind == "library"  # not the build's JIT module
    # the variants' rebuilds at the full level too (kept for the process's lifetime)
    assert {getattr(v.executable, "_ex", v.executable).kind for v in _variants(d)} == {"library"}
    check_float64(e, gqa_rows(8), seed=8, scale=3.0)
    # what one more build of the length's kernels keeps while it is held, its functions looked up
    variants, kernels = d._variants["llvm"], e.compiled.kernels("llvm")
    kept: dict[bool, float] = {}
    for as_library in (False, True):
        monkeypatch.setattr(library, "AS_LIBRARY", as_library)
        before = _heap_used()
        held = [variants._exact_build(kernels) for _ in range(2)]
        for ex in held:
            for k in kernels:
                ex[k.name]  # LLVM's JIT runs here
        kept[as_library] = (_heap_used() - before) / 2
        del held, ex
    # measured: 1.45 MB a build from the JIT, none from the library
    assert kept[False] > 500_000 and kept[True] < kept[False] / 4, kept


def test_without_a_linker_the_jit_serves_and_says_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    class NoLinker:
        def export_library(self, path: str) -> None:
            raise RuntimeError("cc not found")

    monkeypatch.setattr(library, "_failed", [])
    ex = NoLinker()
    with caplog.at_level(logging.WARNING, logger="gensorage.codegen"):
        assert library.as_library(ex) is ex and library.as_library(ex) is ex
    assert [r.getMessage() for r in caplog.records] == [
        "kernels stay in LLVM's JIT (about 5 MB a length): linking them failed: RuntimeError: cc not found"
    ]

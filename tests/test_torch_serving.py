"""A compiled model in a long-running server: background rebuilds on one thread, calls from several threads,
Ctrl-C during a build, and a process that exits while rebuilds are queued."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from test_symbolic_kernels import check_float64, gqa_rows  # noqa: E402
from torch import nn  # noqa: E402

import gensorage.torch as gtorch  # noqa: E402
from gensorage.codegen import symbolic_kernels  # noqa: E402
from gensorage.codegen.background import BackgroundBuilds  # noqa: E402
from gensorage.errors import ScheduleError  # noqa: E402
from gensorage.superopt.dispatch import Dispatcher  # noqa: E402
from gensorage.torch import subgraph  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENSORAGE_HOME", str(tmp_path / "home"))


def _workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "gensorage-rebuild"]


def test_queued_builds_share_one_thread_and_run_in_order() -> None:
    """Forty builds queued behind a running one: one thread, not one waiting thread per build."""
    started, gate, ran = threading.Event(), threading.Event(), []
    others = set(_workers())  # an earlier test's dispatcher may still be building (its link, say)
    builds = BackgroundBuilds("gensorage-rebuild")
    builds.submit([lambda: (started.set(), gate.wait(10))])
    assert started.wait(10)
    builds.submit([lambda i=i: ran.append(i) for i in range(40)])  # type: ignore[misc]
    assert len(set(_workers()) - others) == 1 and builds.queued == 40
    gate.set()
    builds.join(10)
    assert ran == list(range(40)) and builds.thread is None and not set(_workers()) - others
    builds.submit([lambda: ran.append(40)])  # a later build starts the worker again
    builds.join(10)
    assert ran[-1] == 40


class Mlp(nn.Module):
    """An RMSNorm'd two-layer MLP: row kernels and matmuls whose rows are the length."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(dim))
        self.up, self.down = nn.Linear(dim, 2 * dim, bias=False), nn.Linear(2 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
        return x + self.down(torch.nn.functional.silu(self.up(h)))


class Gated(nn.Module):
    """A code object of its own: dynamo's cache of another test's Mlp graphs does not serve it."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.proj(x))


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return bool((got - want).abs().max() <= 1e-3 * want.abs().max())


def test_threads_calling_one_compiled_model_at_mixed_lengths_get_eagers_answers() -> None:
    """Four threads, lengths new and repeated, while the background rebuilds swap kernels in: every answer
    within the float32 tolerance of eager, no exception, no deadlock (each call's result is awaited with a
    timeout)."""
    torch.manual_seed(0)
    model = Mlp().eval()
    compiled = gtorch.compile(model)
    lengths = [3, 5, 3, 5, 3, 5, 3, 5]

    def call(t: int) -> bool:
        x = torch.randn(t, 32, generator=torch.Generator().manual_seed(t))
        with torch.no_grad():
            return _close(compiled(x), model(x))

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(call, t) for t in lengths]
        assert all(f.result(timeout=240) for f in futures)
    assert len([ln for ln in compiled.explain().splitlines() if ": gensorage: " in ln]) >= 3


def test_two_compiled_models_in_two_threads() -> None:
    torch.manual_seed(1)
    models = [Mlp(16).eval(), Mlp(24).eval()]  # other programs than the test above's
    compiled = [gtorch.compile(m) for m in models]

    def serve(i: int) -> bool:
        ok = True
        for t in (4, 9, 4):
            x = torch.randn(t, models[i].weight.shape[0])
            with torch.no_grad():
                ok &= _close(compiled[i](x), models[i](x))
        return ok

    with ThreadPoolExecutor(2) as pool:
        assert all(f.result(timeout=240) for f in [pool.submit(serve, i) for i in range(2)])


def _interrupt_the_first_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C (a KeyboardInterrupt) from the next compile in the main thread, where SIGINT lands."""
    real = symbolic_kernels.compile_kernels
    presses = [KeyboardInterrupt()]

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        if presses and threading.current_thread() is threading.main_thread():
            raise presses.pop()
        return real(*args, **kwargs)

    monkeypatch.setattr(symbolic_kernels, "compile_kernels", interrupted)


def test_an_interrupted_build_leaves_no_variant_without_its_functions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ctrl-C inside the first build of a length (KeyboardInterrupt from the compile): the variants it had
    listed are dropped, so the next request builds them again instead of calling a variant with no functions."""
    _interrupt_the_first_compile(monkeypatch)
    d = Dispatcher(use_store=False)
    with pytest.raises(KeyboardInterrupt):
        d.kernels(gqa_rows(8))
    variants = d._variants["llvm"]
    assert all(v.executable is not None for s in variants._skeletons.values() for v in s.variants)
    entry = d.kernels(gqa_rows(8))
    check_float64(entry, gqa_rows(8), seed=8, scale=3.0)
    d.wait_rebuilds()


def test_ctrl_c_during_a_first_call_and_the_next_call_runs_in_gensorage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _interrupt_the_first_compile(monkeypatch)
    monkeypatch.setattr(subgraph, "_DISPATCHERS", {})  # kernels built afresh: no other test's variants
    torch.manual_seed(2)
    model = Gated().eval()
    compiled = gtorch.compile(model)
    x = torch.randn(6, 32)
    with torch.no_grad(), pytest.raises(KeyboardInterrupt):
        compiled(x)
    with torch.no_grad():
        assert _close(compiled(x), model(x))
    assert any(": gensorage: " in ln for ln in compiled.explain().splitlines()), compiled.explain()


_EXIT = """
import sys, threading, time
from gensorage.codegen.background import BackgroundBuilds
builds = BackgroundBuilds("gensorage-rebuild")
builds.submit([lambda i=i: (time.sleep(1.0), print("ran", i, flush=True)) for i in range(30)])
time.sleep(0.2)
{end}
"""


@pytest.mark.parametrize(
    ("end", "code"),
    [("pass", 0), ("sys.exit(3)", 3), ("raise RuntimeError('main failed')", 1)],
)
def test_exit_waits_for_the_build_in_flight_only(end: str, code: int) -> None:
    """Thirty one-second builds queued, then the main thread ends (returns, ``sys.exit``, raises): the process
    exits after the one build in flight (not thirty seconds), with no traceback but the main thread's own."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_EXIT.format(end=end))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.perf_counter() - start
    assert done.returncode == code, done.stderr
    assert done.stdout.split() == ["ran", "0"], done.stdout
    assert took < 10, took
    tracebacks = done.stderr.count("Traceback")
    assert tracebacks == (1 if code == 1 else 0), done.stderr


def test_failing_background_builds_keep_the_first_tier_and_log_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Both background builds of a length fail: its first-tier kernels serve it, right, and one warning line
    says so (not one per failure, and no traceback)."""
    import logging

    real = symbolic_kernels.compile_kernels

    def full_fails(*args: Any, quick: bool = False, **kwargs: Any) -> Any:
        if not quick:
            raise ScheduleError("llvm build failed: injected")
        return real(*args, quick=quick, **kwargs)

    monkeypatch.setattr(symbolic_kernels, "compile_kernels", full_fails)
    d = Dispatcher(use_store=False)
    with caplog.at_level(logging.WARNING, logger="gensorage.codegen"):
        entry = d.kernels(gqa_rows(12))
        d.wait_rebuilds()
    check_float64(entry, gqa_rows(12), seed=12, scale=3.0)
    assert len(d._variants["llvm"].rebuild_errors) == 2  # the rebuild at the full level, the length's own
    records = [r for r in caplog.records if r.name == "gensorage.codegen"]
    assert len(records) == 1 and "injected" in records[0].getMessage() and records[0].exc_info is None


@pytest.mark.slow
def test_stress_decoder_layer_six_threads_forty_lengths() -> None:
    """The small decoder layer served by six threads, lengths 1..40 twice in a shuffled order: every answer
    within 1e-3 of eager, no call over its timeout, a single background worker."""
    import random

    from test_torch_frontend import DecoderLayer, layer_inputs

    torch.manual_seed(0)
    layer = DecoderLayer().eval()
    compiled = gtorch.compile(layer)
    lengths = [*range(1, 41), *range(1, 41)]
    random.Random(0).shuffle(lengths)
    workers: set[int] = set()

    def call(t: int) -> bool:
        args = layer_inputs(t, torch.float32, seed=t)
        with torch.no_grad():
            ok = _close(compiled(*args), layer(*args))
        workers.add(len(_workers()))
        return ok

    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(call, t) for t in lengths]
        assert all(f.result(timeout=600) for f in futures)
    assert max(workers) <= 1


def test_a_call_while_another_thread_traces_waits_for_the_trace() -> None:
    """FX marks a trace in a module global, and dynamo refuses a compiled function called meanwhile in any
    thread ("Detected that you are using FX to symbolically trace a dynamo-optimized function"): a server's
    thread calling while another captures a new length. The call waits for dynamo's compile lock, which the
    traces hold, and runs compiled. Simulated: a thread holds the lock with the flag set for half a second."""
    import torch.fx._symbolic_trace as fx_trace
    from torch._dynamo.convert_frame import compile_lock

    torch.manual_seed(4)
    model = Gated().eval()
    compiled = gtorch.compile(model)
    x = torch.randn(5, 32)
    with torch.no_grad():
        compiled(x)  # captured and checked
    tracing, done = threading.Event(), threading.Event()

    def trace() -> None:
        with compile_lock:
            fx_trace._is_fx_tracing_flag = True
            tracing.set()
            time.sleep(0.5)
            fx_trace._is_fx_tracing_flag = False
        done.set()

    threading.Thread(target=trace).start()
    assert tracing.wait(10)
    with torch.no_grad():
        got = compiled(x)
    assert done.is_set() and _close(got, model(x))
    assert "the model raised" not in compiled.explain(), compiled.explain()

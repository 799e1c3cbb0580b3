"""``gensorage.superoptimize``: full mode (search, choice, verification, store), presets, the result object."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gensorage.errors import ConfigError, DeviceError
from gensorage.exhaustive.run import runner
from gensorage.exhaustive.spec import SearchSpec
from gensorage.program import list_configs, load_config, parse_program
from gensorage.superopt import (
    StructureStore,
    SuperoptInterrupted,
    SuperoptResult,
    list_presets,
    load_preset,
    superoptimize,
)
from gensorage.superopt.presets import preset_from_dict
from gensorage.ugraph import GraphDefinedOp

ROOT = Path(__file__).resolve().parents[1]

SOFTMAX = """program softmax
param m = 4
param n = 16
input X [m, n] float32
E = exp(X)
O = div(E, sum(E, dim=1))
output O
"""
# One graph-defined kernel of at most three block ops: enough for a fused softmax, small enough to finish in
# seconds (56 tasks).
TINY = {
    "max_kernel_ops": 1,
    "max_block_ops": 3,
    "max_grid_dims": 1,
    "max_block_inputs": 2,
    "max_block_outputs": 1,
}
# Limits under which no µGraph of RMSNorm+MatMul or the gated MLP exists: the search is complete and empty.
EMPTY = {
    "max_kernel_ops": 1,
    "max_block_ops": 2,
    "max_grid_dims": 1,
    "max_block_inputs": 2,
    "max_block_outputs": 1,
}


def _preset(limits: dict[str, Any], **extra: Any) -> Any:
    return preset_from_dict({"search": limits, **extra}, name="test")


@pytest.fixture(scope="module")
def softmax_full(tmp_path_factory: pytest.TempPathFactory) -> tuple[SuperoptResult, Path]:
    d = tmp_path_factory.mktemp("softmax")
    (d / "softmax.gsp").write_text(SOFTMAX)
    r = superoptimize(
        d / "softmax.gsp",
        mode="full",
        preset=_preset(TINY),
        workers=1,
        store=d / "store.sqlite",
        checkpoint=d / "ckpt.sqlite",
        progress=False,
    )
    return r, d


def test_full_mode_finds_a_fused_kernel_and_verifies_it(softmax_full: tuple[SuperoptResult, Path]) -> None:
    r, _ = softmax_full
    assert r.mode == "full" and r.complete and r.stopped_by is None
    assert r.num_kernels == 1 < r.naive_num_kernels == 3
    assert isinstance(r.best.ops[0], GraphDefinedOp)
    assert r.predicted_time_s < r.naive_predicted_time_s and r.speedup > 1
    assert r.equivalence and r.equivalence.report is not None and r.equivalence.report.trials >= 1
    assert r.origin.startswith("search #")
    assert r.search_stats is not None and r.search_stats["tasks_done"] == r.search_stats["tasks_total"] > 0
    assert r.search_stats["candidates"] >= 1 and r.search_time_s > 0


def test_full_mode_result_runs_and_prints(softmax_full: tuple[SuperoptResult, Path]) -> None:
    r, _ = softmax_full
    x = r.program.random_inputs(3)
    (got,) = r.run(*[a.astype(np.float32) for a in x])
    np.testing.assert_allclose(got, r.program.run(*x)[0], rtol=1e-5, atol=1e-6)
    assert "__global__" in r.cuda_source()
    assert "T.prim_func" in r.tir() or "prim_func" in r.tir()
    assert r.to_dot().startswith("digraph")
    assert "graph-defined" in str(r.best) and "full mode" in str(r)
    data = json.loads(json.dumps(r.to_json()))
    assert data["num_kernels"] == 1 and data["verified"] is True and data["ugraph"] == r.best.to_json()


def test_full_mode_stores_the_structure_and_fast_mode_reuses_it(
    softmax_full: tuple[SuperoptResult, Path],
) -> None:
    r, d = softmax_full
    with StructureStore(d / "store.sqlite") as st:
        rec = st.get(r.program.structure_key(), "h100")
    # The program has no preset: it was searched at shapes derived from its own (m=4, n=16 -> 2, 4).
    assert rec is not None and rec.search["complete"] and rec.params == r.search_params == {"m": 2, "n": 4}
    assert rec.ugraphs[0].inputs[0].shape == (2, 4) and len(rec.ugraphs[0].ops) == len(r.best.ops)
    fast = superoptimize(
        d / "softmax.gsp", params={"m": 32, "n": 128}, mode="fast", store=d / "store.sqlite", progress=False
    )
    assert fast.from_store and fast.num_kernels == 1 and fast.equivalence
    assert fast.search_params == {"m": 2, "n": 4}
    x = fast.program.random_inputs(0)
    np.testing.assert_allclose(
        fast.run(*[a.astype(np.float32) for a in x])[0], fast.program.run(*x)[0], rtol=1e-5, atol=1e-6
    )


def test_too_large_to_check_relies_on_the_search_shapes_check(
    softmax_full: tuple[SuperoptResult, Path],
) -> None:
    r, d = softmax_full
    small_check = _preset({}, verify_max_elements=16)
    fast = superoptimize(
        d / "softmax.gsp",
        params={"m": 8, "n": 32},
        mode="fast",
        preset=small_check,
        store=d / "store.sqlite",
        progress=False,
    )
    assert fast.from_store and fast.equivalence.method == "search shapes" and fast.equivalence.report is None
    assert fast.equivalence.search_report is not None and fast.equivalence.search_report["equivalent"]
    assert "search shapes only" in str(fast.equivalence)


def test_a_rerun_resumes_the_checkpoint(softmax_full: tuple[SuperoptResult, Path]) -> None:
    r, d = softmax_full
    again = superoptimize(
        d / "softmax.gsp",
        mode="full",
        preset=_preset(TINY),
        workers=1,
        use_store=False,
        checkpoint=d / "ckpt.sqlite",
        progress=False,
    )
    assert again.search_stats is not None
    assert again.search_stats["tasks_resumed"] == again.search_stats["tasks_total"]
    assert again.best == r.best


@pytest.mark.parametrize(
    ("name", "params"), [("rmsnorm", {"b": 2, "h": 8, "d": 4}), ("gated_mlp", {"t": 2, "k": 4, "f": 8})]
)
def test_full_mode_on_benchmark_programs_never_returns_worse_than_direct(
    tmp_path: Path, name: str, params: dict[str, int]
) -> None:
    r = superoptimize(
        name,
        params=params,
        mode="full",
        preset=_preset(EMPTY),
        workers=1,
        store=tmp_path / "s.sqlite",
        checkpoint=tmp_path / "c.sqlite",
        progress=False,
    )
    assert r.complete and r.equivalence and r.predicted_time_s <= r.naive_predicted_time_s
    # nothing exists under these limits: the direct µGraph, after row fusion where the model prices it faster
    assert r.origin in ("direct", "fused") and (r.origin == "direct") == r.is_direct
    x = r.program.random_inputs(0)
    got = r.run(*[a.astype(np.float16) for a in x])
    np.testing.assert_allclose(got[0], r.program.run(*x)[0], rtol=2e-2, atol=2e-2)
    # The (empty) search's verdict is stored; fast mode at another shape takes the direct µGraph from it.
    bigger = {k: v * 2 for k, v in params.items()}
    fast = superoptimize(name, params=bigger, mode="fast", store=tmp_path / "s.sqlite", progress=False)
    assert fast.from_store and fast.origin == r.origin


def test_a_time_budget_stops_the_search_and_keeps_a_verified_answer(tmp_path: Path) -> None:
    r = superoptimize(
        "gated_mlp",
        params={"t": 2, "k": 8, "f": 16},
        mode="full",
        time_budget_s=2.0,
        preset=_preset({"max_kernel_ops": 2, "max_block_ops": 4}),
        workers=1,
        store=tmp_path / "s.sqlite",
        checkpoint=tmp_path / "c.sqlite",
        progress=False,
    )
    assert not r.complete and r.stopped_by == "time budget"
    assert r.equivalence and r.predicted_time_s <= r.naive_predicted_time_s
    assert r.search_stats is not None
    with StructureStore(tmp_path / "s.sqlite") as st:  # an unfinished search stores only what it found
        stored = st.get(r.program.structure_key(), "h100")
    assert (stored is None) == (r.search_stats["candidates"] == 0)


def test_ctrl_c_returns_what_was_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = runner.run_search

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise runner.SearchInterrupted(real(*args, **kwargs))

    monkeypatch.setattr(runner, "run_search", interrupted)
    (tmp_path / "softmax.gsp").write_text(SOFTMAX)
    with pytest.raises(SuperoptInterrupted) as info:
        superoptimize(
            tmp_path / "softmax.gsp",
            mode="full",
            preset=_preset(TINY),
            workers=1,
            store=tmp_path / "s.sqlite",
            checkpoint=tmp_path / "c.sqlite",
            progress=False,
        )
    assert info.value.result.num_kernels == 1 and info.value.result.equivalence
    with StructureStore(tmp_path / "s.sqlite") as st:  # what was found is stored too
        assert st.get(info.value.result.program.structure_key(), "h100") is not None


@pytest.mark.parametrize("phase", ["verify", "carry_over"])
def test_ctrl_c_after_the_search_reports_the_direct_ugraph_and_stores_what_was_found(
    phase: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A Ctrl-C that lands after the search (while its candidates are carried over or checked at the requested
    # shapes) used to escape as a bare KeyboardInterrupt: nothing was reported and nothing stored.
    import os
    import signal

    from gensorage.superopt import choice, run

    pressed: list[int] = []

    def press() -> None:  # once: a second Ctrl-C would abort
        if not pressed:
            pressed.append(1)
            os.kill(os.getpid(), signal.SIGINT)  # the handler runs before kill returns (main thread)

    if phase == "verify":
        real_verify = choice.verify_option

        def verify(*args: Any, **kwargs: Any) -> Any:
            press()
            return real_verify(*args, **kwargs)

        monkeypatch.setattr(choice, "verify_option", verify)
    else:
        real_signature = run.structure_signature

        def signature(g: Any) -> str:
            press()
            return real_signature(g)

        monkeypatch.setattr(run, "structure_signature", signature)
    (tmp_path / "softmax.gsp").write_text(SOFTMAX)
    with pytest.raises(SuperoptInterrupted) as info:
        superoptimize(
            tmp_path / "softmax.gsp",
            mode="full",
            params={"m": 2, "n": 8},
            preset=_preset(TINY),
            workers=1,
            store=tmp_path / "s.sqlite",
            checkpoint=tmp_path / "c.sqlite",
            progress=False,
        )
    r = info.value.result
    assert r.is_direct and r.equivalence and r.stopped_by == "interrupt" and r.complete
    assert any("interrupted" in n for n in r.notes)
    assert "__global__" in r.cuda_source()  # built on demand
    with StructureStore(tmp_path / "s.sqlite") as st:  # the finished search's structure is stored
        assert st.get(r.program.structure_key(), "h100") is not None
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is gone again


def test_a_built_program_is_accepted(tmp_path: Path) -> None:
    p = parse_program(SOFTMAX, {"m": 2, "n": 8})
    r = superoptimize(p, mode="fast", use_store=False, progress=False)
    assert r.program is p and r.origin == "fused" and r.num_kernels == 1  # exp, sum, div: one row kernel


def test_bad_arguments_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="mode"):
        superoptimize("rmsnorm", mode="slow", progress=False)
    with pytest.raises(ConfigError, match="no program file or bundled config"):
        superoptimize("no_such_program", progress=False)
    with pytest.raises(ConfigError, match="no such program file"):
        superoptimize(tmp_path / "missing.gsp", progress=False)
    with pytest.raises(ConfigError, match="time budget"):
        superoptimize("rmsnorm", time_budget_s=-1, progress=False)
    with pytest.raises(ConfigError, match="params"):
        superoptimize(load_config("rmsnorm"), params={"b": 2}, progress=False)
    with pytest.raises(ConfigError, match="hardware profile"):
        superoptimize("rmsnorm", hw="no_such_gpu", mode="fast", progress=False)


def test_running_on_cuda_without_a_gpu_is_a_device_error(softmax_full: tuple[SuperoptResult, Path]) -> None:
    from gensorage.codegen.cuda_build import cuda_device_available

    if cuda_device_available() is None:
        pytest.skip("a GPU is present")
    r, _ = softmax_full
    with pytest.raises(DeviceError):
        r.run(*[a.astype(np.float32) for a in r.program.random_inputs(0)], target="cuda")


# ------------------------------------------------------------------------------------------------ presets


def test_every_benchmark_program_has_a_preset_that_fits_it() -> None:
    presets = set(list_presets())
    for path in list_configs():
        assert path.stem in presets, f"no preset for {path.stem}"
        pre = load_preset(path.stem)
        full = load_config(path.stem)
        small = load_config(path.stem, pre.search_params)
        assert small.structure_key() == full.structure_key()
        assert sum(np.prod(t.shape) for t in small.inputs) < sum(np.prod(t.shape) for t in full.inputs)
        SearchSpec(program=small, **pre.search)  # the limits are valid fields


def test_the_default_preset_is_small() -> None:
    pre = load_preset("default")
    assert pre.modes == ("fast", "full") and pre.time_budget_s is not None and pre.time_budget_s < 60
    load_config(pre.program, pre.run_params)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("top_k = 0", "top_k"),
        ("bogus = 1", "unknown field"),
        ("[search]\nmax_blocks = 3", "unknown search field"),
        # checked when loaded, whatever mode runs (fast mode builds no search spec)
        ("[search]\nmax_kernel_ops = 'three'", "max_kernel_ops must be a positive integer"),
        ("[search]\nmax_block_ops = -4", "max_block_ops must be a positive integer"),
        ("[search]\nmin_kernel_ops = 3", "min_kernel_ops"),
        ("[search]\nparallel_first = true", "needs fused_first"),
        ("[search]\nmax_trials = 'lots'", "max_trials"),
        ("[search]\nops = ['exp', 'frobnicate']", "unsupported op 'frobnicate'"),
        ("[search_params]\nb = -1", "search_params.b"),
        ("delta = 2.0", "delta"),
        ("modes = ['slow']", "modes"),
        ("time_budget_s = 0", "time_budget_s"),
        ("program = [", "not valid TOML"),
    ],
)
def test_broken_presets_are_one_line_config_errors(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "broken.toml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError, match=match) as info:
        load_preset(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)

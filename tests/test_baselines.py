"""Baselines (Roller-like, Optuna TPE, random) and the METHODS table: same space, same scoring."""

from __future__ import annotations

import math

import numpy as np
import pytest

import gensorage.workloads as workloads
from gensorage.baselines import optuna_search, random_search, roller
from gensorage.baselines.sampling import decode, parameters
from gensorage.errors import ScheduleError
from gensorage.hw import load_profile
from gensorage.markov import SearchOutcome, construct
from gensorage.markov.cost_model import predict_schedule_time
from gensorage.markov.space import space_for
from gensorage.tuning import METHODS

H100 = load_profile("h100")
SMALL = [
    workloads.gemm(1024, 1024, 1024),
    workloads.gemv(8192, 1000),
    workloads.conv2d(16, 32, 28, 28, 64, 3, 3, padding=1),
    workloads.avgpool2d(8, 32, 32, 32, 2, 2, stride=2),
]


def _check(out: SearchOutcome, wl, method: str) -> None:
    space = space_for(wl, H100)
    assert out.method == method
    assert space.fits(out.schedule)
    assert out.predicted_time_s == predict_schedule_time(wl, H100, out.schedule) < math.inf
    bests = [b for _, b in out.trace]
    assert bests == sorted(bests, reverse=True) and bests[-1] == out.predicted_time_s


def test_methods_table() -> None:
    assert set(METHODS) == {"markov", "roller", "optuna", "random"}
    assert METHODS["markov"] is construct
    wl = workloads.gemm(256, 256, 256)
    kwargs = {"optuna": {"trials": 20}, "random": {"trials": 50}}
    for name, fn in METHODS.items():
        _check(fn(wl, H100, seed=0, **kwargs.get(name, {})), wl, name)


@pytest.mark.parametrize("wl", SMALL, ids=lambda w: w.name)
def test_random_search_is_feasible_deterministic_and_counts_every_trial(wl) -> None:
    a = random_search.search(wl, H100, seed=5, trials=150)
    b = random_search.search(wl, H100, seed=5, trials=150)
    _check(a, wl, "random")
    assert a.evaluated == 150
    assert (a.schedule, a.predicted_time_s) == (b.schedule, b.predicted_time_s)


@pytest.mark.parametrize("wl", SMALL[:3], ids=lambda w: w.name)
def test_optuna_search_is_feasible_and_deterministic(wl) -> None:
    a = optuna_search.search(wl, H100, seed=3, trials=25)
    b = optuna_search.search(wl, H100, seed=3, trials=25)
    _check(a, wl, "optuna")
    assert a.evaluated == 25
    assert (a.schedule, a.predicted_time_s) == (b.schedule, b.predicted_time_s)


def test_infeasible_samples_still_count_as_trials() -> None:
    wl = workloads.gemm(8192, 8192, 8192)
    space = space_for(wl, H100)
    params = parameters(space)
    rng = np.random.default_rng(0)
    draws = [decode(space, {p.name: int(rng.integers(0, p.high + 1)) for p in params}) for _ in range(200)]
    assert any(not space.fits(s) for s in draws)  # the space does contain infeasible points ...
    out = random_search.search(wl, H100, seed=0, trials=200)
    assert out.evaluated == 200  # ... and they are counted
    assert space.fits(out.schedule)


def test_sampling_covers_the_markov_space() -> None:
    wl = workloads.gemm(256, 1000, 64)
    space = space_for(wl, H100)
    s = space.make((4, 125, 2), (64, 1000, 64), (4, 1, 1))
    values: dict[str, int] = {}
    for a, name in enumerate(space.axes):
        c = space.candidates[a]
        values[f"{name}.t0"] = c.index(s.tiles[0][a])
        values[f"{name}.t1_offset"] = c.index(s.tiles[1][a]) - c.index(s.tiles[0][a])
        if not space.is_reduce[a]:
            values[f"{name}.vthread_exp"] = s.vthreads[a].bit_length() - 1
    assert decode(space, values) == s


@pytest.mark.parametrize("wl", SMALL, ids=lambda w: w.name)
def test_roller_is_greedy_aligned_and_deterministic(wl) -> None:
    a = roller.construct(wl, H100)
    b = roller.construct(wl, H100, seed=9)
    _check(a, wl, "roller")
    assert a.schedule == b.schedule and a.evaluated == 1
    assert set(a.schedule.vthreads) == {1}
    space = space_for(wl, H100)
    threads = space.resources(a.schedule).threads
    assert threads % H100.warp_size == 0 or threads == math.prod(space.extents[i] for i in space.spatial)


def test_roller_grows_the_register_tile_of_a_gemm() -> None:
    wl = workloads.gemm(4096, 4096, 4096)
    s = roller.construct(wl, H100).schedule
    space = space_for(wl, H100)
    # Reuse needs both output axes tiled in registers; the K step never helps its ratio, so stays 1.
    assert s.tile(0, "i") > 1 and s.tile(0, "j") > 1 and s.tile(0, "k") == 1
    blocks = math.prod(space.tile_counts(s, 1)[a] for a in space.spatial)
    assert blocks >= H100.sm_count


def test_markov_beats_roller_on_average() -> None:
    wls = [
        workloads.gemm(4096, 4096, 4096),
        workloads.gemv(16384, 8192),
        workloads.conv2d(128, 128, 28, 28, 128, 3, 3, padding=1),
    ]
    ratios = [
        roller.construct(wl, H100).predicted_time_s / construct(wl, H100, seed=0).predicted_time_s
        for wl in wls
    ]
    assert math.prod(ratios) ** (1 / len(ratios)) > 1.0


def test_bad_trial_counts_are_rejected() -> None:
    wl = workloads.gemm(64, 64, 64)
    with pytest.raises(ScheduleError):
        random_search.search(wl, H100, trials=0)
    with pytest.raises(ScheduleError):
        optuna_search.search(wl, H100, trials=0)
    with pytest.raises(ScheduleError, match="unknown option"):
        roller.construct(wl, H100, depth=3)


_SHARED = """
import json, sys
import gensorage.workloads as workloads
from gensorage.baselines import optuna_search
from gensorage.hw import load_profile
out = optuna_search.search(workloads.gemm(1024, 1024, 1024), load_profile("h100"), seed=int(sys.argv[2]),
                           trials=12, storage=sys.argv[1], study_name="shared")
print(json.dumps(out.predicted_time_s))
"""


def test_optuna_processes_share_one_study_through_a_journal_file(tmp_path) -> None:
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    import optuna

    journal = tmp_path / "study.journal"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _SHARED, str(journal), str(seed)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in (1, 2)
    ]
    found = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        found.append(json.loads(out))
    study = optuna.load_study(study_name="shared", storage=optuna_search._storage(journal))
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 24, "both processes' trials are in the one study"
    wl = workloads.gemm(1024, 1024, 1024)
    space = space_for(wl, H100)
    best = min(predict_schedule_time(wl, H100, decode(space, t.params)) for t in done)
    # The process that finished last saw every trial: its answer is the study's best.
    assert min(found) == best < math.inf
    # Another call joins the same study (RDB or journal alike) and answers with the study's best so far.
    again = optuna_search.search(wl, H100, seed=3, trials=1, storage=journal, study_name="shared")
    assert again.predicted_time_s <= best and space.fits(again.schedule)


def test_a_shared_optuna_study_of_another_workload_is_refused(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    optuna_search.search(workloads.gemm(256, 256, 256), H100, trials=20, storage=url, study_name="s")
    with pytest.raises(ScheduleError, match="optuna study 's' searches gemm"):
        optuna_search.search(workloads.gemm(512, 256, 256), H100, trials=2, storage=url, study_name="s")
    with pytest.raises(ScheduleError, match="needs a study_name"):
        optuna_search.search(workloads.gemm(256, 256, 256), H100, trials=2, storage=url)

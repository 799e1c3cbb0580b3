"""The spec-level context tasks share (search_context): sharing it changes no candidate and no logical counter."""

from __future__ import annotations

import pytest

from gensorage.exhaustive import enumerate_tasks, run_task
from gensorage.exhaustive.spec import SearchSpec
from gensorage.exhaustive.walk import search_context
from gensorage.exhaustive.walk.search_context import SearchContext, process_context
from tests.test_walk import _candidate_json, exp_matmul


def _spec() -> SearchSpec:
    return SearchSpec(program=exp_matmul(), max_kernel_ops=2, max_block_ops=1, max_grid_dims=1)


def test_tasks_sharing_a_context_find_what_fresh_ones_find() -> None:
    spec = _spec()
    tasks = enumerate_tasks(spec)
    fresh = [run_task(spec, t) for t in tasks]
    shared_ctx = SearchContext(spec)
    # In reverse order, so each task meets memos filled by tasks that ran after it in the fresh run.
    shared = [run_task(spec, t, context=shared_ctx) for t in reversed(tasks)][::-1]
    assert sum(len(r.candidates) for r in fresh) > 0
    for a, b in zip(fresh, shared, strict=True):
        assert _candidate_json(a.candidates) == _candidate_json(b.candidates)
        assert a.stats.logical() == b.stats.logical()
    # Each task counts only its own queries: the shared oracle answered some from what earlier tasks asked.
    assert sum(r.stats.solver_queries for r in shared) == shared_ctx.oracle.queries
    assert sum(r.stats.cache_hits for r in shared) > sum(r.stats.cache_hits for r in fresh)


def test_process_context_is_kept_per_spec_and_restarts_its_oracle_past_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = _spec()
    ctx = process_context(spec)
    assert process_context(spec) is ctx
    other = SearchSpec(program=exp_matmul(3, 3, 4), max_kernel_ops=2, max_block_ops=1, max_grid_dims=1)
    assert process_context(other) is not ctx
    ctx = process_context(spec)
    run_task(spec, enumerate_tasks(spec)[0], context=ctx)
    assert ctx.oracle_entries() > 0
    old = ctx.oracle
    monkeypatch.setattr(search_context, "MAX_ORACLE_ENTRIES", 0)
    assert process_context(spec) is ctx and ctx.oracle is not old
    assert ctx.oracle_entries() == SearchContext(spec).oracle_entries()
    tasks = enumerate_tasks(spec)
    fresh = [run_task(spec, t) for t in tasks]
    again = [run_task(spec, t, context=ctx) for t in tasks]
    assert [_candidate_json(r.candidates) for r in fresh] == [_candidate_json(r.candidates) for r in again]

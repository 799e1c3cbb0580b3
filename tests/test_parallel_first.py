"""``SearchSpec(parallel_first=True)``: with ``fused_first``, the looped fusing tasks are split one level further
and their siblings run with the most thread blocks first (docs/search.md, "Tasks, stops and resumption"). An
order, not a restriction: the tasks cover the same search, and a complete search finds the same candidates."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from search_walk import replayed
from test_rediscovery import _stable_split_kv_and_combine

from gensorage.errors import ConfigError
from gensorage.exhaustive import SearchSpec, Task, enumerate_tasks, run_search, run_task, search_serial
from gensorage.exhaustive.walk.search_context import SearchContext
from gensorage.exhaustive.walk.subtree_memo import Memo
from gensorage.program import Program
from gensorage.superopt import load_preset
from gensorage.superopt.sources import resolve_program, search_program
from gensorage.ugraph.ir import GraphDefinedOp


def _softmax_spec(**changes: object) -> SearchSpec:
    # The stable softmax at a shape whose rows and columns both split (2 and 4 rows, 2 and 3 columns), so the
    # first block operator's siblings have grids of different sizes.
    p = Program("stable_softmax")
    x = p.input("X", (4, 6))
    e = p.exp(p.sub(x, p.max(x, dim=1, keepdim=True)))
    p.output(p.div(e, p.sum(e, dim=1)))
    spec = SearchSpec(
        program=p, max_kernel_ops=1, max_block_ops=4, max_grid_dims=2, max_block_outputs=1, fused_first=True
    )
    return dataclasses.replace(spec, **changes)  # type: ignore[arg-type]


def _at(spec: SearchSpec, path: tuple[int, ...]) -> tuple[int, bool, int]:
    """Replaying ``path``: its number of children, whether its first graph-defined kernel has a loop, and that
    kernel's thread blocks there (the grid sizes chosen so far)."""
    with replayed(spec, path) as w:
        st = w.state
        first = next((op for op in st.ops if isinstance(op, GraphDefinedOp)), None)
        if first is not None:
            looped, grid = first.block.forloop > 1, list(first.block.grid)
        elif st.block is not None:
            looped, grid = st.block.looped, list(st.block.grid)
        else:
            looped, grid = False, []
        children = w.children()
        n = sum(1 for _ in children)
        children.close()
    return n, looped, math.prod(g for g in grid if g is not None)


def test_looped_fusing_tasks_are_split_and_their_siblings_ordered_by_blocks() -> None:
    spec = _softmax_spec()
    plain = enumerate_tasks(spec)
    tasks = enumerate_tasks(dataclasses.replace(spec, parallel_first=True))
    assert [t.index for t in tasks] == list(range(len(tasks)))
    # Every looped task with children (the program's one input read: they all fuse) gives way to its children,
    # where it stood; the other tasks stay, in the same order.
    want: list[tuple[tuple[int, ...], bool]] = []
    split = set()
    for t in plain:
        n, looped, _ = _at(spec, t.path)
        if t.subtree and looped and n:
            split.add(t.path)
            kids = [((*t.path, i), True) for i in range(n)]
            kids.sort(key=lambda k: (-_at(spec, k[0])[2], k[0]))
            want += kids
        else:
            want.append((t.path, t.subtree))
    assert split and [(t.path, t.subtree) for t in tasks] == want
    # The order is not walk order: some siblings with more blocks come before ones with fewer.
    assert [p for p, _ in want] != sorted(p for p, _ in want)


# A complete search twice (9 s idle): the slow run; the ordered tasks' stop and resume stay default.
@pytest.mark.slow
def test_a_complete_search_finds_the_same_candidates() -> None:
    spec = _softmax_spec()
    plain, ordered = search_serial(spec), search_serial(dataclasses.replace(spec, parallel_first=True))
    assert plain.complete and ordered.complete and plain.candidates
    assert [c.ugraph for c in ordered.candidates] == [c.ugraph for c in plain.candidates]
    # The split nodes themselves are walked by no task (their children are), so the logical counters may fall
    # by at most one state per split node.
    assert 0 <= plain.stats.states - ordered.stats.states <= ordered.tasks_total


def test_the_runner_stops_and_resumes_the_ordered_tasks(tmp_path: Path) -> None:
    # A budget stops the run inside the ordered tasks; the next run continues from the checkpoint and ends with
    # the one-process result.
    spec = _softmax_spec(parallel_first=True)
    ckpt = tmp_path / "c.sqlite"
    first = run_search(spec, checkpoint=ckpt, workers=1, time_budget_s=0.5, progress=False)
    assert not first.complete
    rest = run_search(spec, checkpoint=ckpt, workers=1, progress=False)
    assert rest.complete
    assert [c.ugraph for c in rest.candidates] == [c.ugraph for c in search_serial(spec).candidates]


def test_a_split_task_is_a_subtree_of_the_plain_one() -> None:
    # Each task of a split node walks exactly the part of the node's subtree below its child.
    spec = _softmax_spec(parallel_first=True)
    parent = next(t.path[:-1] for t in enumerate_tasks(spec) if len(t.path) == 3)
    whole = run_task(spec, Task(0, parent, True))
    kids = [run_task(spec, t) for t in enumerate_tasks(spec) if t.path[:-1] == parent]
    assert sum(k.stats.states for k in kids) == whole.stats.states - 1  # the parent node itself
    assert sorted(str(c.ugraph) for k in kids for c in k.candidates) == sorted(
        str(c.ugraph) for c in whole.candidates
    )


def test_the_knob_is_a_spec_field_that_keeps_old_keys() -> None:
    spec = _softmax_spec()
    assert "parallel_first" not in spec.to_json()  # specs written before it keep their checkpoint keys
    on = dataclasses.replace(spec, parallel_first=True)
    assert on.to_json()["parallel_first"] is True
    assert SearchSpec.from_json(on.to_json()) == on and on.key() != spec.key()
    with pytest.raises(ConfigError, match="parallel_first must be true or false"):
        dataclasses.replace(spec, parallel_first=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="parallel_first orders the fusing tasks and needs fused_first"):
        dataclasses.replace(spec, fused_first=False, parallel_first=True)


@pytest.mark.slow
def test_the_split_kv_preset_reaches_flash_decoding_before_the_one_block_per_head_kernels() -> None:
    # The mha_incdec_split_kv preset's tasks in its order (fused_first, parallel_first), run one after another
    # as search_serial runs them: every task up to the first that returns stable FlashDecoding completes, and
    # that task comes before the one-block-per-head score kernel below K's transpose (path (4, 22, 24)), whose
    # combines outlast any budget. Before parallel_first the two were one task, (4, 22), walked in that order.
    # 261 s on dev (load average 2.2-2.4, 2026-11-27).
    preset = load_preset("mha_incdec_split_kv")
    spec = SearchSpec(
        program=search_program(resolve_program(preset.program), preset, True, []), **preset.search
    )
    assert spec.parallel_first
    tasks = enumerate_tasks(spec)
    unsplit = next(t.index for t in tasks if t.path == (4, 22, 24))
    memo, context = Memo(), SearchContext(spec)
    for task in tasks[:unsplit]:
        res = run_task(spec, task, memo=memo, context=context)
        assert res.complete
        if any(_stable_split_kv_and_combine(c.ugraph) for c in res.candidates):
            assert task.path[:2] == (4, 22)
            return
    pytest.fail("no task before the one-block-per-head kernels returned FlashDecoding")

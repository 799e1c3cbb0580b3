"""``SearchSpec(program_ops_first=True)``: with ``fused_first``, tasks at nodes of pre-defined operators only are
split one level further, and within each class the tasks whose pre-defined operators the program itself applies
run first (docs/search.md, "Tasks, stops and resumption"). An order, not a restriction: the tasks cover the same
search, and a complete search finds the same candidates."""

from __future__ import annotations

import dataclasses

import pytest
from search_walk import replayed
from test_parallel_first import _at
from test_split_kv_rediscovery import flash_decoding_path, split_kv_preset_spec

from gensorage.errors import ConfigError
from gensorage.exhaustive import SearchSpec, enumerate_tasks, search_serial
from gensorage.exhaustive.walk import tasks as task_module
from gensorage.opset import Op
from gensorage.program import Program
from gensorage.ugraph.ir import GraphDefinedOp, KernelOp


def _xwt_spec(**changes: object) -> SearchSpec:
    # exp(X Wᵀ): the program transposes W, not X, so a kernel-level transpose of W is the program's own operator
    # and one of X is not; two grid dims give enough first kernels to split.
    p = Program("xwt")
    x, w = p.input("X", (2, 6)), p.input("W", (4, 6))
    p.output(p.exp(p.matmul(x, p.transpose(w, 0, 1))))
    spec = SearchSpec(
        program=p,
        max_kernel_ops=2,
        max_block_ops=2,
        max_grid_dims=2,
        max_block_outputs=1,
        ops=("transpose", "matmul", "exp"),
        fused_first=True,
    )
    return dataclasses.replace(spec, **changes)  # type: ignore[arg-type]


def _prefix_ops(spec: SearchSpec, path: tuple[int, ...]) -> list[KernelOp] | None:
    """The pre-defined operators before the first graph-defined kernel at ``path``'s node; None if the node
    holds pre-defined operators only (no graph-defined kernel, no block graph open)."""
    with replayed(spec, path) as w:
        st = w.state
        k = next((i for i, op in enumerate(st.ops) if isinstance(op, GraphDefinedOp)), None)
        bare = k is None and st.block is None
        ops = [op for op in st.ops[: len(st.ops) if k is None else k] if isinstance(op, KernelOp)]
    return None if bare else ops


def _transposes_x(ops: list[KernelOp]) -> bool:
    return any(op.op is Op.TRANSPOSE and op.inputs[0].node == 0 for op in ops)


@pytest.mark.parametrize("parallel", [False, True], ids=["fused_first", "parallel_first"])
def test_the_programs_own_operators_first_and_the_same_candidates(parallel: bool) -> None:
    spec = _xwt_spec(parallel_first=parallel)
    ordered = dataclasses.replace(spec, program_ops_first=True)
    tasks = enumerate_tasks(ordered)
    assert [t.index for t in tasks] == list(range(len(tasks)))
    # Among the looped fusing tasks, every one below W's transpose runs before every one below X's.
    fusing = [t for t in tasks if t.subtree and _at(ordered, t.path)[1]]
    foreign = [i for i, t in enumerate(fusing) if _transposes_x(_prefix_ops(ordered, t.path) or [])]
    assert foreign and foreign == list(range(foreign[0], len(fusing)))
    # An order: a complete search finds the same candidates in the same ranking.
    plain, own = search_serial(spec), search_serial(ordered)
    assert plain.complete and own.complete and plain.candidates
    assert [c.ugraph for c in own.candidates] == [c.ugraph for c in plain.candidates]


def test_tasks_of_pre_defined_operators_only_are_split(monkeypatch: pytest.MonkeyPatch) -> None:
    # With fewer target tasks the search splits at depth 1, where K's transpose alone is a task (as in the
    # mqa_incdec_split_kv preset): program_ops_first splits it, so its fusing children can be classed.
    monkeypatch.setattr(task_module, "TARGET_TASKS", 4)
    spec = _xwt_spec()
    plain = enumerate_tasks(spec)
    assert any(t.subtree and _prefix_ops(spec, t.path) is None and _at(spec, t.path)[0] for t in plain)
    ordered = dataclasses.replace(spec, program_ops_first=True)
    tasks = enumerate_tasks(ordered)
    assert not [
        t for t in tasks if t.subtree and _prefix_ops(ordered, t.path) is None and _at(ordered, t.path)[0]
    ]
    # The split tasks cover the plain ones' subtrees exactly.
    covered = [t.path for t in tasks]
    for t in plain:
        below = [p for p in covered if p[: len(t.path)] == t.path]
        assert below, t.path
    assert sorted(str(c.ugraph) for c in search_serial(ordered).candidates) == sorted(
        str(c.ugraph) for c in search_serial(spec).candidates
    )


def test_the_knob_is_a_spec_field_that_keeps_old_keys() -> None:
    spec = _xwt_spec()
    assert "program_ops_first" not in spec.to_json()
    on = dataclasses.replace(spec, program_ops_first=True)
    assert on.to_json()["program_ops_first"] is True
    assert SearchSpec.from_json(on.to_json()) == on and on.key() != spec.key()
    with pytest.raises(ConfigError, match="program_ops_first must be true or false"):
        dataclasses.replace(spec, program_ops_first="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="program_ops_first orders the fusing tasks and needs fused_first"):
        dataclasses.replace(spec, fused_first=False, program_ops_first=True)


@pytest.mark.parametrize("preset", ["gqa_incdec_split_kv", "mqa_incdec_split_kv"])
def test_the_split_kv_presets_run_flash_decodings_task_before_qs_transpose(preset: str) -> None:
    # FlashDecoding's split kernel reads K's transpose, which the program applies; Q's transpose (a transposed
    # form of the same attention, whose combines outlast a budget in GQA) is no operator of the program. In
    # the MQA preset the search splits at depth 1, where K's transpose alone was one task, run late.
    spec = split_kv_preset_spec(preset)
    assert spec.program_ops_first
    tasks = enumerate_tasks(spec)
    path = flash_decoding_path(spec, shared_kv=preset.startswith("mqa"))
    fd = next(t for t in tasks if t.path == path[: len(t.path)])
    assert len(fd.path) >= 3 and _at(spec, fd.path)[1]  # a fusing task of its own, with a loop
    qt = [t.index for t in tasks if _transposes_x(_prefix_ops(spec, t.path) or [])]
    assert qt and fd.index < min(qt)

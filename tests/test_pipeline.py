"""Software pipelining of graph-defined kernels' for-loops (gensorage.codegen.block_loads): the llvm twin of the
staged kernels against the unstaged one and float64, the emitted schedule's copies, waits, barriers and reads
replayed against the rules that keep a stage from being read early or overwritten while read, the memory plan,
the fallback to one stage, and the CUDA build (nvcc for sm_90a)."""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pytest

from gensorage.codegen.cuda_build import cubin_unavailable_reason, ptx_and_resources
from gensorage.codegen.module import compile_ugraph
from gensorage.codegen.ugraph_tir import plan_threads
from gensorage.construction.block_threads import ThreadChoice
from gensorage.dtypes import numpy_dtype
from gensorage.hw import load_profile
from gensorage.hw.profile import HwProfile
from gensorage.ugraph.block_cost import BlockPlan
from gensorage.ugraph.examples import EXAMPLES, ONLINE_EXAMPLES
from gensorage.ugraph.ir import GraphDefinedOp, KernelGraph
from gensorage.ugraph.validate import validate

HW = load_profile("h200")
ALL_EXAMPLES = {**EXAMPLES, **ONLINE_EXAMPLES}

#: The bundled fused programs with a for-loop, at shapes the llvm twin runs in seconds (tiles whose rows are
#: whole 16-byte runs, so the loop's tiles are copied with cp.async and can be staged).
LOOPED = {
    "flash_attention2": dict(heads=2, q_len=64, kv_len=96, head_dim=16, q_blocks=2, forloop=3),
    "flash_attention": dict(heads=2, q_len=64, kv_len=64, head_dim=16, q_blocks=2, forloop=2),
    "rmsnorm_matmul": dict(batch=16, hidden=96, out=48, blocks=3, forloop=3),
    "gated_mlp": dict(m=16, k=96, n=48, blocks=3, forloop=3),
}


def _graph_kernel(g: KernelGraph) -> int:
    return next(k for k, op in enumerate(g.ops) if isinstance(op, GraphDefinedOp) and op.block.forloop > 1)


def _plans(g: KernelGraph, stages: int) -> dict[int, ThreadChoice]:
    k = _graph_kernel(g)
    return {k: dataclasses.replace(plan_threads(g, k, validate(g), HW), stages=stages)}


def _script(g: KernelGraph, stages: int, target: str = "cuda") -> str:
    cg = compile_ugraph(g, HW, target, plans=_plans(g, stages))  # type: ignore[arg-type]
    return next(k.script for k in cg.kernels(target) if k.op_index == _graph_kernel(g))  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ llvm twin


@pytest.mark.parametrize("name", sorted(LOOPED))
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_staged_twin_computes_what_the_unstaged_one_does(name: str, dtype: str) -> None:
    # The same arithmetic in the same order: staged and unstaged agree bit for bit, so a stage read before its
    # iteration's copy (or after the next one's) would show; both against float64 too.
    program, g = ALL_EXAMPLES[name](**LOOPED[name], dtype=dtype)
    rng = np.random.default_rng(7)
    xs = [(3.0 * rng.standard_normal(s.shape)).astype(numpy_dtype(dtype)) for s in g.inputs]
    (want,) = program.run(*(x.astype(np.float64) for x in xs))
    outs = {}
    for stages in (1, 2, 3):
        cg = compile_ugraph(g, HW, "llvm", plans=_plans(g, stages))
        text = next(k.script for k in cg.kernels("llvm") if k.op_index == _graph_kernel(g))
        kept = min(stages, LOOPED[name]["forloop"])  # no more stages than iterations
        assert (f"it % {kept}" in text) == (kept > 1), (name, stages)
        outs[stages] = np.asarray(cg.run(*xs)[0], dtype=np.float64)
    assert np.array_equal(outs[1], outs[2]) and np.array_equal(outs[1], outs[3])
    assert np.linalg.norm(outs[2] - want) / np.linalg.norm(want) < 2e-2


# ------------------------------------------------------------------------------------------ the schedule


class ScheduleViolation(AssertionError):
    pass


def replay(script: str) -> int:
    """Run the block-level schedule of a graph-defined kernel's emitted text, every iteration of its loop, and
    raise :class:`ScheduleViolation` where a staged tile's stage is read before its iteration's copies have landed
    and a barrier followed, or written while a read of it since the last barrier may still be running. Every
    thread runs the same copies, commits, waits and barriers (their guards on ``tx`` only pick which runs a
    thread copies), so one thread's group counts stand for all. Returns the reads checked."""
    # Staged tiles: those the loop's copies write at a stage that depends on the iteration.
    staged = set(
        re.findall(r'cp\.async\.cg\.shared\.global"\]\((s\d+)\.ptr_to\(\[\(it \+ \d+\) % \d+,', script)
    )
    loop = re.search(r"^( *)for it in T\.serial\((\d+)\):", script, re.M)
    assert loop is not None
    indent, forloop = len(loop.group(1)), int(loop.group(2))
    lines = script.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(loop.group(0)))
    end = next(
        (i for i in range(start + 1, len(lines)) if lines[i].strip() and _indent(lines[i]) <= indent),
        len(lines),
    )
    state = _Pipeline(staged)
    _run(lines[:start], state, None)
    for it in range(forloop):
        _run(lines[start + 1 : end], state, it)
    _run(lines[end:], state, None)
    return state.checked


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


class _Pipeline:
    def __init__(self, tiles: set[str]) -> None:
        self.tiles = tiles
        self.open: list[tuple[str, int, int]] = []  # copies issued since the last commit (tile, stage, data)
        self.groups: list[list[tuple[str, int, int]]] = []  # committed, not yet waited for
        self.landed: dict[tuple[str, int], int] = {}  # (tile, stage) -> iteration whose data landed
        self.visible: dict[tuple[str, int], int] = {}  # ... and a barrier followed
        self.read_since_barrier: set[tuple[str, int]] = set()
        self.checked = 0

    def copy(self, tile: str, stage: int, data: int) -> None:
        if (tile, stage) in self.read_since_barrier:
            raise ScheduleViolation(f"{tile} stage {stage} overwritten while a warp may still read it")
        self.visible.pop((tile, stage), None)
        self.landed.pop((tile, stage), None)
        self.open.append((tile, stage, data))

    def commit(self) -> None:
        self.groups.append(self.open)
        self.open = []

    def wait(self, pending: int) -> None:
        done = self.groups[: max(0, len(self.groups) - pending)]
        self.groups = self.groups[len(done) :]
        for group in done:
            for tile, stage, data in group:
                self.landed[(tile, stage)] = data

    def barrier(self) -> None:
        self.visible.update(self.landed)
        self.read_since_barrier.clear()

    def read(self, tile: str, stage: int, it: int) -> None:
        if self.visible.get((tile, stage)) != it:
            raise ScheduleViolation(
                f"iteration {it} reads {tile} stage {stage} holding {self.visible.get((tile, stage))}"
            )
        self.read_since_barrier.add((tile, stage))
        self.checked += 1


def _stage_of(expr: str, it: int | None) -> tuple[int, int]:
    """(stage, data iteration) of a stage expression such as ``(it + 1) % 2``, ``it % 3`` or ``1``."""
    m = re.fullmatch(r"\(?(it(?: \+ (\d+))?|\d+)\)? % (\d+)|(\d+)", expr.strip())
    assert m is not None, expr
    if m.group(4) is not None:
        return int(m.group(4)), int(m.group(4))
    assert it is not None, expr
    data = it + int(m.group(2) or 0) if m.group(1).startswith("it") else int(m.group(1))
    return data % int(m.group(3)), data


def _run(lines: list[str], state: _Pipeline, it: int | None) -> None:
    skip_below: int | None = None  # inside an ``if`` on ``it`` that is false
    for line in lines:
        depth = _indent(line)
        if skip_below is not None:
            if depth > skip_below:
                continue
            skip_below = None
        text = line.strip()
        cond = re.fullmatch(r"if (.*):", text)
        if cond and "tx" not in cond.group(1) and "it" in cond.group(1):
            if not eval(cond.group(1), {}, {"it": it}):  # noqa: S307 (our own emitted text: it + 1 < 3)
                skip_below = depth
            continue
        copy = re.search(r'cp\.async\.cg\.shared\.global"\]\((s\d+)\.ptr_to\(\[([^,]+),', text)
        if copy and copy.group(1) in state.tiles:
            state.copy(copy.group(1), *_stage_of(copy.group(2), it))
            continue
        if "cp.async.commit_group" in text:
            state.commit()
        elif m := re.search(r'cp\.async\.wait_group"\]\((\d+)\)', text):
            state.wait(int(m.group(1)))
        elif "T.tvm_storage_sync" in text:
            state.barrier()
        for tile in state.tiles:
            for expr in re.findall(rf"\b{tile}\[([^,\]]+),", text):
                assert it is not None, f"{tile} read outside the loop"
                state.read(tile, _stage_of(expr, it)[0], it)
            if f"# reads {tile}" in text:  # ldmatrix through the arena: the stage is the offset's it term
                m = re.search(r"\(?it(?: \+ \d+)?\)? % \d+", text)
                assert m is not None and it is not None, text
                state.read(tile, _stage_of(m.group(0), it)[0], it)


@pytest.mark.parametrize("name", sorted(LOOPED))
@pytest.mark.parametrize("stages", [2, 3])
def test_emitted_schedule_reads_no_stage_early_and_overwrites_none_in_use(name: str, stages: int) -> None:
    _, g = ALL_EXAMPLES[name](**LOOPED[name])
    script = _script(g, stages)
    assert replay(script) >= LOOPED[name]["forloop"]


def test_the_replay_catches_a_missing_barrier_and_a_short_wait() -> None:
    # The checker can fail: the same text without the iteration's last barrier (the next prefetch overwrites a
    # stage a warp may still read), or waiting for one group fewer (a stage read before its copies land).
    _, g = ALL_EXAMPLES["gated_mlp"](**LOOPED["gated_mlp"])
    script = _script(g, 2)
    replay(script)
    lines = script.splitlines()
    drain = next(i for i, line in enumerate(lines) if 'wait_group"](0)' in line)
    loop_end = max(i for i in range(drain) if lines[i].strip() == 'T.tvm_storage_sync("shared")')
    with pytest.raises(ScheduleViolation, match="overwritten"):
        replay("\n".join(lines[:loop_end] + lines[loop_end + 1 :]))
    with pytest.raises(ScheduleViolation, match="reads"):
        replay(script.replace('wait_group"](1)', 'wait_group"](2)'))


def test_emitted_text_of_a_small_two_stage_kernel() -> None:
    # gated_mlp over 3 iterations (x, W1 and W2 each sliced along k): their stage 0 is the prologue (one group,
    # before the loop); each iteration prefetches the next into stage (it + 1) % 2 under a guard, commits, waits
    # for all but one group, a barrier, and the matmuls read stage it % 2 (ldmatrix through the arena).
    _, g = ALL_EXAMPLES["gated_mlp"](**LOOPED["gated_mlp"])
    script = _script(g, 2)
    staged = re.findall(r"(s\d+) = T\.(?:decl|alloc)_buffer\(\(2, ", script)
    assert len(staged) == 3
    head, body = script.split("for it in T.serial(3):")
    for tile in staged:
        assert f"{tile}.ptr_to([0, " in head  # prologue: stage 0
        assert f"{tile}.ptr_to([(it + 1) % 2, " in body  # prefetch
    assert head.count("cp.async.commit_group") == 1 and "wait_group" not in head
    guard, commit, wait = (
        body.index("if it + 1 < 3:"),
        body.index("cp.async.commit_group"),
        body.index('cp.async.wait_group"](1)'),
    )
    assert guard < commit < wait < body.index('T.tvm_storage_sync("shared")', wait)
    assert body.count("(it % 2) * ") == 4  # the two matmuls' A and B fragment loads
    assert 'cp.async.wait_group"](0)' in body  # after the loop: nothing left in flight


def test_three_stages_have_two_prologue_groups_and_no_barrier_between_them() -> None:
    _, g = ALL_EXAMPLES["gated_mlp"](**LOOPED["gated_mlp"])
    head, body = _script(g, 3).split("for it in T.serial(3):")
    prologue = head[head.index("cp.async.cg") :]
    assert prologue.count("cp.async.commit_group") == 2 and "tvm_storage_sync" not in prologue
    assert "ptr_to([1, " in prologue and "ptr_to([(it + 2) % 3, " in body
    assert 'wait_group"](2)' in body and "if it + 2 < 3:" in body
    assert body.index("cp.async.commit_group") < body.index("tvm_storage_sync")


def test_one_stage_is_todays_kernel() -> None:
    # One stage: each iteration copies its own tiles and waits for all of them (wait_group 0) in the loop.
    _, g = ALL_EXAMPLES["gated_mlp"](**LOOPED["gated_mlp"])
    script = _script(g, 1)
    body = script.split("for it in T.serial(3):")[1]
    assert "it % 2" not in script and "(it + 1)" not in script and 'wait_group"](1)' not in script
    assert 'wait_group"](0)' in body and "ptr_to([it * 32 + " in body
    replay(script)  # nothing staged: only the loop's structure is walked


# ------------------------------------------------------------------------------------------ memory


def test_stages_take_their_own_bytes_across_the_loop() -> None:
    # Every stage of a staged tile lives from the prologue to the loop's end: no body tile shares its bytes.
    from gensorage.codegen.block_emitter import BlockEmitter
    from gensorage.codegen.scalar import FloatScalar

    _, g = ALL_EXAMPLES["flash_attention2"](**LOOPED["flash_attention2"])
    info = validate(g)
    k = _graph_kernel(g)
    e = BlockEmitter(g, k, info, _plans(g, 2)[k], "cuda", FloatScalar("float32"), "t")
    e.emit()
    assert e.staged and e.stages == 2
    for r in e.buffers:
        if r.node in e.staged:
            mine = e.memory.placement(r)
            assert mine.interval.start == 0
            assert mine.size >= 2 * int(np.prod(e.tile(r).shape)) * 2
            for p in e.memory.placements:
                if p.ref != r and p.interval.overlaps(mine.interval):
                    assert not mine.shares_bytes(p), (r, p.ref)


def test_stages_that_do_not_fit_fall_back_to_one() -> None:
    # Head dim 256, 128 keys per iteration: K and V tiles of 64 KiB each fit once (with Q and the scores), but
    # a second stage of both (128 KiB more) fits no GPU: one stage, the text asked for with one.
    _, g = ALL_EXAMPLES["flash_attention2"](
        heads=1, q_len=16, kv_len=256, head_dim=256, q_blocks=1, forloop=2
    )
    assert _script(g, 2) == _script(g, 1)
    # At 64 keys per iteration two stages fit (155 KiB), unless the plan carries a smaller GPU's limit (an
    # RTX 4090's 99 KiB holds one stage of these tiles, 82 KiB, not two).
    _, g = ALL_EXAMPLES["flash_attention2"](
        heads=1, q_len=16, kv_len=256, head_dim=256, q_blocks=1, forloop=4
    )
    assert "it % 2" in _script(g, 2)
    k = _graph_kernel(g)
    small = {k: dataclasses.replace(_plans(g, 2)[k], shared_limit=99 * 1024)}
    cg = compile_ugraph(g, HW, "cuda", plans=small)
    assert next(t.script for t in cg.kernels("cuda") if t.op_index == k) == _script(g, 1)


# ------------------------------------------------------------------------------------------ construction, model


def _plan(g: KernelGraph, stages: int, hw: HwProfile = HW) -> tuple[BlockPlan, float]:
    from gensorage.ugraph.block_cost import block_cycles, plan_block

    k = _graph_kernel(g)
    op = g.ops[k]
    assert isinstance(op, GraphDefinedOp)
    plan = plan_block(g, k, validate(g), hw, True, _plans(g, stages)[k])
    return plan, block_cycles(plan, hw, math.prod(op.block.grid), op.block.forloop)[0]


def test_the_model_prices_copy_and_compute_overlapped() -> None:
    # The gated MLP of one 8-row block per 64 columns (the bundled fused_gated_mlp's shape), latency-bound: with
    # one stage an iteration waits for its copies' round trips, then computes; with two the copies fly during
    # the previous iteration: max(compute, round trip) instead of their sum, plus one round trip before the loop.
    _, g = ALL_EXAMPLES["gated_mlp"](m=8, k=4096, n=4096, blocks=64, forloop=64)
    (one, c1), (two, c2), (three, c3) = (_plan(g, s) for s in (1, 2, 3))
    assert (one.stages, two.stages, three.stages) == (1, 2, 3)
    assert one.body.async_loads > 0 and two.body.async_loads == 0
    assert two.shared_bytes > one.shared_bytes and three.shared_bytes > two.shared_bytes
    assert c2 < c1 and c3 <= c2
    trip = HW.level("dram").latency_cycles
    compute = two.body.cycles(HW, two.resident)
    assert one.body.cycles(HW, one.resident) >= compute + trip  # one stage: round trip, then compute
    assert 64 * max(compute, trip) <= c2 < c1


def test_the_construction_keeps_one_stage_where_compute_hides_the_copies() -> None:
    # LLaMA's FlashAttention-2 (128 keys x 128 dims per iteration, two blocks an SM): the resident blocks'
    # tensor-core work is longer than the round trip, and a third stage would cost a resident block.
    from benchmarks.gpu_prepare import EXTRA_UGRAPHS

    _, g = EXTRA_UGRAPHS["llama3_flash_attention2"]()
    (one, c1), (_, c2), (three, c3) = (_plan(g, s) for s in (1, 2, 3))
    assert c2 >= c1 and three.resident < one.resident and c3 > c1
    k = _graph_kernel(g)
    assert plan_threads(g, k, validate(g), HW).stages == 1


def test_the_construction_chooses_stages_that_fit_the_gpu_and_pay() -> None:
    _, g = ALL_EXAMPLES["gated_mlp"](m=8, k=4096, n=4096, blocks=64, forloop=64)
    k = _graph_kernel(g)
    info = validate(g)
    chosen = plan_threads(g, k, info, HW)
    assert chosen.stages >= 2 and f"cp.async loop tiles in {chosen.stages} stages" in chosen.rule
    cycles = {s: _plan(g, s)[1] for s in (1, 2, 3)}
    assert cycles[chosen.stages] == min(cycles.values())
    # A GPU whose shared memory holds one stage only: one stage, deterministically.
    small = dataclasses.replace(HW, shared_mem_per_block=_plan(g, 1)[0].shared_bytes)
    assert plan_threads(g, k, info, small).stages == 1
    # A profile that allows one stage at most.
    one = dataclasses.replace(HW, calibration=dataclasses.replace(HW.calibration, block_max_stages=1.0))
    assert plan_threads(g, k, info, one).stages == 1


# ------------------------------------------------------------------------------------------ CUDA


#: The bundled looped programs at model-sized tiles (FA-2 at head dim 128, RMSNorm+MatMul and the gated MLP
#: at hidden 4096 in 64-wide k steps).
CUDA_SHAPES = {
    "flash_attention2": dict(heads=2, q_len=128, kv_len=512, head_dim=128, q_blocks=2, forloop=8),
    "rmsnorm_matmul": dict(batch=16, hidden=1024, out=512, blocks=8, forloop=16),
    "gated_mlp": dict(m=16, k=1024, n=512, blocks=8, forloop=16),
}


@pytest.mark.skipif(cubin_unavailable_reason() is not None, reason="needs nvcc")
@pytest.mark.parametrize("name", sorted(CUDA_SHAPES))
def test_pipelined_kernels_build_for_sm_90a_without_spills(name: str) -> None:
    _, g = ALL_EXAMPLES[name](**CUDA_SHAPES[name], dtype="bfloat16")
    for stages in (2, 3):
        cg = compile_ugraph(g, HW, "cuda", plans=_plans(g, stages))
        built = ptx_and_resources(cg.cuda_source(), "sm_90a")
        assert built is not None
        ptx, resources = built
        entry = re.split(r"\.visible \.entry ", ptx)
        graph = next(p for p in entry if p.startswith(f"kernel{_graph_kernel(g)}_"))
        assert f"cp.async.wait_group {stages - 1};" in graph
        assert "cp.async.cg.shared.global" in graph and "mma.sync.aligned.m16n8k16" in graph
        found = next(r for n, r in resources.items() if n.startswith(f"kernel{_graph_kernel(g)}_"))
        assert found.spill_stores == 0 and found.spill_loads == 0, (name, stages, found)

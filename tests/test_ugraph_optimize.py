"""The µGraph optimizer's passes (gensorage.ugraph.optimize): liveness, memory planning, operator order by depth,
and the kernels the code generator emits with them (shared bytes, barriers, the llvm twin)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gensorage.codegen.module import compile_ugraph, ir_module
from gensorage.codegen.ugraph_tir import plan_threads
from gensorage.hw import load_profile
from gensorage.opset import Op
from gensorage.ugraph.examples import EXAMPLES, ONLINE_EXAMPLES
from gensorage.ugraph.ir import (
    Accumulator,
    BlockGraph,
    BlockOp,
    GraphDefinedOp,
    InputIterator,
    KernelGraph,
    OutputSaver,
    Ref,
    TensorSpec,
    ThreadGraph,
    ThreadOp,
    node_inputs,
)
from gensorage.ugraph.optimize import Interval, live_intervals, plan_memory
from gensorage.ugraph.optimize.layouts import LAYOUTS, Access, Layout, address, choose_layout, wavefronts
from gensorage.ugraph.optimize.layouts import cost as layout_cost
from gensorage.ugraph.optimize.memory_plan import MemoryPlan, shared_footprint
from gensorage.ugraph.optimize.phase_order import depth_order
from gensorage.ugraph.optimize.views import is_view
from gensorage.ugraph.shapes import infer
from gensorage.ugraph.validate import loop_phases, tensor_bytes, validate

HW = load_profile("h100")
ALL_EXAMPLES = {**EXAMPLES, **ONLINE_EXAMPLES}


def _graph_kernels(g: KernelGraph) -> list[tuple[int, GraphDefinedOp]]:
    return [(k, op) for k, op in enumerate(g.ops) if isinstance(op, GraphDefinedOp)]


def _check_plan(plan: MemoryPlan) -> None:
    """Tiles live at one step share no byte; the arena is no larger than the unshared layout and no smaller
    than the most bytes live at one step."""
    ps = plan.placements
    for i, a in enumerate(ps):
        assert a.offset % min(16, a.size & -a.size) == 0
        for b in ps[i + 1 :]:
            if a.interval.overlaps(b.interval):
                assert not a.shares_bytes(b), (a, b)
    assert plan.bytes <= plan.unshared_bytes
    steps = {s for p in ps for s in (p.interval.start, p.interval.end)}
    peak = max((sum(p.size for p in ps if p.interval.start <= s <= p.interval.end) for s in steps), default=0)
    assert peak <= plan.bytes


# ------------------------------------------------------------------------------------------ liveness


def test_flash_attention_live_intervals() -> None:
    # Q (loop-invariant, loaded before the loop) lives to the loop end; K, V, S, E, their sum and E·V live
    # within an iteration (the accumulators read S's sum and E·V at the loop end, step 7); the accumulators'
    # tiles exist from the flush (8) and the division's result until the saver (10).
    _, g = EXAMPLES["flash_attention"]()
    live = live_intervals(g.ops[0].block)
    assert live.steps == 11
    assert [iv for _, iv in live.intervals] == [
        Interval(0, 7),  # Q
        Interval(1, 3),  # K
        Interval(2, 6),  # V
        Interval(3, 4),  # S = Q K
        Interval(4, 6),  # E = exp(S / sqrt(d))
        Interval(5, 7),  # sum E
        Interval(6, 7),  # E V
        Interval(8, 9),  # accumulated E V
        Interval(8, 9),  # accumulated sum
        Interval(9, 10),  # their quotient
    ]


def test_depth_order_groups_independent_operators() -> None:
    # FlashDecoding's combine: both products (depth 3) before both sums (depth 4), so one barrier serves each
    # pair; node order would alternate product, sum, product, sum.
    _, g = ONLINE_EXAMPLES["flash_decoding_stable"]()
    assert depth_order(g.ops[2].block) == ((0, 1, 2, 3, 4, 5, 7, 6, 8, 9), ())


# ------------------------------------------------------------------------------------------ memory plan

# (example, kernel op, bytes of the tiles unshared, bytes planned by liveness): float16 defaults; tiles whose
# values only flow into exp are float32 (the precision policy).
FOOTPRINTS = [
    ("flash_attention", 0, 448, 208),
    ("flash_attention2", 1, 336, 192),  # o / l in V's float16 (convex_rows), 32 bytes less
    ("flash_decoding", 0, 176, 96),
    ("flash_decoding", 1, 112, 80),
    ("flash_decoding_stable", 1, 160, 96),
    ("flash_decoding_stable", 2, 192, 128),
    ("gated_mlp", 0, 352, 192),
    ("gqa", 0, 608, 336),
    ("gqa", 1, 384, 304),
    ("lora", 0, 288, 208),
    ("qknorm_attention", 0, 448, 192),  # normalised q and k tiles in float16 (a norm's bound)
    ("rmsnorm_matmul", 0, 368, 176),
]


@pytest.mark.parametrize(("name", "k", "unshared", "planned"), FOOTPRINTS)
def test_example_footprints(name: str, k: int, unshared: int, planned: int) -> None:
    _, g = ALL_EXAMPLES[name]()
    info = validate(g)
    block, binfo = g.ops[k].block, info.blocks[k]  # type: ignore[union-attr]
    assert binfo is not None
    sizes = {
        Ref(j, o): tensor_bytes(t)
        for j, outs in enumerate(binfo.nodes)
        if not is_view(block.nodes[j])
        for o, t in enumerate(outs)
    }
    plan = plan_memory(block, sizes)
    _check_plan(plan)
    assert (plan.unshared_bytes, plan.bytes) == (unshared, planned)
    assert shared_footprint(block, binfo) == planned


def test_every_example_kernel_has_a_golden_footprint() -> None:
    have = {(name, k) for name, k, _, _ in FOOTPRINTS}
    want = {(name, k) for name, f in ALL_EXAMPLES.items() for k, _ in _graph_kernels(f()[1])}
    assert have == want


def test_planned_footprint_lets_a_refused_tile_fit() -> None:
    # FlashAttention with 128 x 128 tiles (head_dim 128, two query blocks, eight key iterations): its tiles
    # together need 394,240 bytes, past the H100's 232,448 per block, so validity refused it while tiles never
    # shared bytes; planned by liveness they need 197,120.
    _, g = EXAMPLES["flash_attention"](heads=16, q_len=256, kv_len=1024, head_dim=128, q_blocks=2, forloop=8)
    binfo = infer(g).blocks[0]
    assert binfo is not None
    assert sum(tensor_bytes(t) for outs in binfo.nodes for t in outs) > HW.shared_mem_per_block
    assert shared_footprint(g.ops[0].block, binfo) == 197_120 <= HW.shared_mem_per_block  # type: ignore[union-attr]
    validate(g, HW)


@pytest.mark.slow
def test_refused_tile_now_fits_in_the_emitted_kernel() -> None:
    from gensorage.codegen.gpu_limits import block_resources

    _, g = EXAMPLES["flash_attention"](heads=16, q_len=256, kv_len=1024, head_dim=128, q_blocks=2, forloop=8)
    (kern,) = compile_ugraph(g, HW, "cuda").kernels("cuda")
    assert block_resources(ir_module([kern])).shared_bytes <= HW.shared_mem_per_block


# ------------------------------------------------------------------------------------------ emitted kernels

# (example, kernel, shared bytes and barriers of the emitted float32 kernel before the optimizer passes (tiles
# never sharing bytes, TVM's own reuse of static buffers, a barrier after every phase that wrote shared memory,
# row-major tiles) and with them).
EMITTED = [
    ("flash_attention", "kernel0_graph", (320, 7), (272, 6)),
    ("flash_attention2", "kernel1_graph", (320, 7), (272, 6)),
    ("flash_decoding", "kernel0_graph", (176, 6), (160, 5)),
    ("flash_decoding", "kernel1_graph", (80, 4), (80, 3)),
    ("flash_decoding_stable", "kernel1_graph", (176, 6), (160, 5)),
    ("flash_decoding_stable", "kernel2_graph", (96, 9), (128, 6)),
    ("gated_mlp", "kernel0_graph", (192, 5), (192, 3)),
    ("gqa", "kernel0_graph", (512, 7), (448, 6)),
    ("gqa", "kernel1_graph", (304, 5), (304, 4)),
    ("lora", "kernel0_graph", (416, 7), (400, 4)),
    ("qknorm_attention", "kernel0_graph", (440, 13), (288, 9)),
    ("rmsnorm_matmul", "kernel0_graph", (272, 7), (288, 4)),
]


@pytest.mark.parametrize(("name", "kernel", "before", "after"), EMITTED)
def test_emitted_shared_bytes_and_barriers(
    name: str, kernel: str, before: tuple[int, int], after: tuple[int, int]
) -> None:
    from gensorage.codegen.gpu_limits import block_resources

    _, g = ALL_EXAMPLES[name](dtype="float32")
    # At one stage: software pipelining adds its stages' bytes (tests/test_pipeline.py), not these passes.
    info = validate(g)
    plans = {
        k: dataclasses.replace(plan_threads(g, k, info, HW), stages=1)
        for k, op in enumerate(g.ops)
        if isinstance(op, GraphDefinedOp)
    }
    cg = compile_ugraph(g, HW, "cuda", plans=plans)
    (kern,) = [k for k in cg.kernels("cuda") if k.name == kernel]
    got = (block_resources(ir_module([kern])).shared_bytes, kern.script.count("tvm_storage_sync"))
    assert got == after
    assert got[1] < before[1]
    # Depth order can keep more tiles live at once (FlashDecoding's combine: both products before both sums),
    # and a padded layout costs its rows' pads (RMSNorm's squared tile, 4 x 4 at this size: a one-element pad
    # takes fewer wavefronts than the 4-row swizzle, the only one that fits).
    assert got[0] <= before[0] or name in ("flash_decoding_stable", "rmsnorm_matmul")


# ------------------------------------------------------------------------------------------ random graphs


@st.composite
def _looped_graphs(draw: st.DrawFn) -> KernelGraph:
    """A random valid one-kernel µGraph built to stress liveness: loop-invariant and per-iteration tiles of
    random sizes, a random DAG of block ops and thread graphs reading any earlier tile, sum / max / concat
    accumulators of random body tiles, a random post-loop DAG over them, and savers of the post values."""
    rows = draw(st.sampled_from([1, 2, 4]))
    cols = draw(st.sampled_from([2, 4, 8]))
    forloop = draw(st.sampled_from([1, 2, 3]))
    n_in = draw(st.integers(2, 4))
    specs, nodes = [], []
    for i in range(n_in):
        looped = forloop > 1 and draw(st.booleans())
        specs.append(TensorSpec(f"x{i}", (rows, cols * (forloop if looped else 1)), "float32"))
        nodes.append(InputIterator(i, (None,), 1 if looped else None))
    body = list(range(n_in))
    for _ in range(draw(st.integers(1, 6))):
        a, b = draw(st.sampled_from(body)), draw(st.sampled_from(body))
        kind = draw(st.sampled_from(["add", "mul", "sub", "thread", "sum_keep"]))
        if kind == "thread":
            ops = (ThreadOp(Op.MUL, (0, 1)), ThreadOp(Op.SCALE, (2,), {"factor": 0.5}))
            nodes.append(ThreadGraph((a, b), ops, (3,)))
        elif kind == "sum_keep":  # [rows, 1], broadcast back by later ops
            nodes.append(BlockOp(Op.SUM, (a,), {"dim": 1, "keepdim": True}))
            nodes.append(BlockOp(Op.ADD, (a, len(nodes) - 1)))
        else:
            nodes.append(BlockOp(Op(kind), (a, b)))
        body.append(len(nodes) - 1)
    post = list(body)
    if forloop > 1:
        post = []
        for r in draw(st.lists(st.sampled_from(body[n_in:] or body), min_size=1, max_size=3)):
            kind = draw(st.sampled_from(["sum", "max", "cat"]))
            nodes.append(Accumulator(r, "sum" if kind == "cat" else kind, 1 if kind == "cat" else None))
            post.append(len(nodes) - 1)
        width = {j: cols * (forloop if nodes[j].fmap == 1 else 1) for j in post}  # type: ignore[union-attr]
        for _ in range(draw(st.integers(0, 3))):
            a = draw(st.sampled_from(post))
            same = [j for j in post if width[j] == width[a]]
            nodes.append(BlockOp(Op.MUL, (a, draw(st.sampled_from(same)))))
            post.append(len(nodes) - 1)
            width[len(nodes) - 1] = width[a]
    # Nothing is dead: a body value nobody reads is accumulated, a post value nobody reads is saved.
    read = {r.node for n in nodes for r in node_inputs(n)}
    if forloop > 1:
        for j in [j for j in body if j not in read]:
            nodes.append(Accumulator(j, "sum"))
            post.append(len(nodes) - 1)
    saved = [j for j in post if j not in read]
    for r in saved:
        nodes.append(OutputSaver(r, (0,)))
    block = BlockGraph((1,), forloop, tuple(nodes))
    op = GraphDefinedOp(block, tuple(range(n_in)))
    return KernelGraph(tuple(specs), (op,), tuple(Ref(n_in, o) for o in range(len(saved))))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=_looped_graphs(), sizes=st.data())
def test_tiles_live_at_once_never_share_bytes(g: KernelGraph, sizes: st.DataObject) -> None:
    validate(g)
    block = g.ops[0].block  # type: ignore[union-attr]
    live = live_intervals(block)
    # Sizes drawn over orders of magnitude (1 byte to 64 KiB), not only the tiles' own.
    drawn = {r: sizes.draw(st.integers(1, 1 << 16)) for r, _ in live.intervals}
    _check_plan(plan_memory(block, drawn))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=_looped_graphs(), sizes=st.data())
def test_staged_tiles_live_across_the_loop_and_share_no_byte_with_its_tiles(
    g: KernelGraph, sizes: st.DataObject
) -> None:
    # Software pipelining (gensorage.codegen.block_loads): a staged iterator's stages are written before the
    # loop and in every iteration, so its tile lives from step 0 to the loop's end, sharing no byte with any
    # body tile, and the plan still never overlaps two tiles live at once.
    validate(g)
    block = g.ops[0].block  # type: ignore[union-attr]
    iterators = [j for j, n in enumerate(block.nodes) if isinstance(n, InputIterator) and n.fmap is not None]
    staged = tuple(sizes.draw(st.lists(st.sampled_from(iterators), unique=True)) if iterators else [])
    live = live_intervals(block, (), staged)
    plain = live_intervals(block)
    in_body = [r for r, _ in plain.intervals if loop_phases(block)[r.node] == "body"]
    for r, interval in live.intervals:
        if r.node in staged:
            assert interval.start == 0 and all(interval.end >= plain.of(b).end for b in in_body)
        else:
            assert interval == plain.of(r)
    drawn = {r: sizes.draw(st.integers(1, 1 << 16)) for r, _ in live.intervals}
    plan = plan_memory(block, drawn, staged=staged)
    _check_plan(plan)
    for p in plan.placements:
        if p.ref.node in staged:
            assert not any(p.shares_bytes(plan.placement(b)) for b in in_body if b != p.ref)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=_looped_graphs())
def test_random_looped_graphs_llvm_twin_matches_the_evaluator(g: KernelGraph) -> None:
    # The llvm twin lays its tiles out in the planned arena too: a tile overwritten while still live changes
    # the result. Inputs span magnitudes (0.01 to 100), so a stale tile cannot pass by coincidence.
    validate(g)
    rng = np.random.default_rng(7)
    xs = [
        (rng.uniform(0.5, 1.0, s.shape) * 10.0 ** rng.integers(-2, 3, s.shape)).astype(s.dtype)
        for s in g.inputs
    ]
    got = compile_ugraph(g, HW, "llvm").run(*xs)
    want = g.run(*xs)
    for a, b in zip(got, want, strict=True):
        assert np.allclose(a, b, rtol=1e-4, atol=1e-6 * max(1.0, float(np.abs(b).max())))
    assert math.isfinite(sum(float(np.abs(a).sum()) for a in got))


# ------------------------------------------------------------------------------------------ barriers


def _staged(script: str) -> dict[str, int]:
    """Software-pipelined tiles (tests/test_pipeline.py) and their stages: a leading dim the loop's copies
    address by the iteration."""
    import re

    names = set(re.findall(r"(s\d+(?:_\d+)?)\.ptr_to\(\[\(it \+ \d+\) % \d+,", script))
    shapes = dict(re.findall(r"(s\d+(?:_\d+)?) = T\.(?:alloc|decl)_buffer\(\((\d+),", script))
    return {name: int(shapes[name]) for name in names}


def _tile_bytes(script: str) -> dict[str, set[int]]:
    """The bytes of every shared tile in an emitted script (an arena's views by their element offsets); a staged
    tile's stage ``k`` also as ``name#k``."""
    import re

    staged = _staged(script)
    spans: dict[str, set[int]] = {}
    for m in re.finditer(
        r'(\w+) = T\.(alloc|decl)_buffer\(\(([\d, ]+)\), "(\w+)"(.*)scope="shared[^"]*"', script
    ):
        name, _, shape, dtype, rest = m.groups()
        if name == "smem":
            continue
        size = math.prod(int(d) for d in shape.replace(" ", "").strip(",").split(","))
        width = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}[dtype]
        off = re.search(r"elem_offset=(\d+)", rest)
        base = int(off.group(1)) * width if off else 0
        space = 0 if off else hash(name) << 32  # separate allocations never share bytes
        spans[name] = {space + base + i for i in range(size * width)}
        stage = size * width // staged.get(name, 1)
        for k in range(staged.get(name, 0)):
            spans[f"{name}#{k}"] = {space + base + k * stage + i for i in range(stage)}
    return spans


def _events(script: str) -> list[tuple[str, set[str], set[str]]]:
    """Phases (tiles read, tiles written) and barriers in program order, the loop body written out twice, as
    iterations 0 and 1 (so a hazard from one iteration into the next shows); a staged tile's accesses name the
    stage they address (``name#k``)."""
    import re

    lines = script.splitlines()
    staged = _staged(script)
    start = next((i for i, line in enumerate(lines) if re.match(r"\s*for it in T\.serial", line)), len(lines))
    indent = len(lines[start]) - len(lines[start].lstrip()) if start < len(lines) else 0
    end = next(
        (
            i
            for i in range(start + 1, len(lines))
            if lines[i].strip() and len(lines[i]) - len(lines[i].lstrip()) <= indent
        ),
        len(lines),
    )
    body = lines[start + 1 : end]
    return [
        *_phase_events(lines[:start], staged, None),
        *_phase_events(body, staged, 0),
        *_phase_events(body, staged, 1),
        *_phase_events(lines[end:], staged, None),
    ]


def _phase_events(
    lines: list[str], staged: dict[str, int], it: int | None
) -> list[tuple[str, set[str], set[str]]]:
    import re

    def named(tile: str, expr: str) -> str:
        if tile not in staged:
            return tile
        return f"{tile}#{eval(expr, {}, {'it': it}) % staged[tile]}"  # noqa: S307 (our own emitted text)

    out: list[tuple[str, set[str], set[str]]] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        indent = len(line) - len(line.lstrip())
        if "tvm_storage_sync" in line:
            out.append(("sync", set(), set()))
        elif "T.thread_binding" in line and "threadIdx" in line:
            reads: set[str] = set()
            writes: set[str] = set()
            i += 1
            while i < len(lines) and len(lines[i]) - len(lines[i].lstrip()) > indent:
                text = lines[i]
                lhs, _, rhs = text.partition(" = ")
                m = re.match(r"\s*(s\d+(?:_\d+)?)\[([^,\]]+)", lhs)
                if m and rhs:
                    writes.add(named(m.group(1), m.group(2)))
                for tile, first in re.findall(r"\b(s\d+(?:_\d+)?)\[([^,\]]+)", rhs if rhs else lhs):
                    reads.add(named(tile, first))
                # cp.async writes the tile it points into; an ldmatrix of an arena tile names it in a comment.
                for tile, first in re.findall(
                    r"cp\.async[^(]*\(\s*(s\d+(?:_\d+)?)\.ptr_to\(\[([^,\]]+)", text
                ):
                    writes.add(named(tile, first))
                for tile in re.findall(r"ldmatrix.*# reads (s\d+(?:_\d+)?)$", text) + re.findall(
                    r"ldmatrix.*\b(s\d+(?:_\d+)?)\.access_ptr", text
                ):
                    stage = re.search(r"\(?it(?: \+ \d+)?\)? % \d+", text)
                    reads.add(named(tile, stage.group(0)) if stage and tile in staged else tile)
                i += 1
            out.append(("phase", reads, writes))
            continue
        i += 1
    return out


def _unsynchronised_hazards(script: str) -> list[str]:
    """Every pair of phases with no barrier between them where one writes bytes the other reads or writes."""
    spans = _tile_bytes(script)
    events = _events(script)
    hazards = []
    for p, (kind, reads, writes) in enumerate(events):
        if kind != "phase":
            continue
        for q in range(p + 1, len(events)):
            kind2, reads2, writes2 = events[q]
            if kind2 == "sync":
                break
            w1 = set().union(*(spans[t] for t in writes))
            r1 = set().union(*(spans[t] for t in reads))
            if any(spans[t] & w1 for t in reads2) or any(spans[t] & (w1 | r1) for t in writes2):
                hazards.append(f"phase {p} ({sorted(reads)} -> {sorted(writes)}) and phase {q}")
    return hazards


def test_the_barrier_checker_finds_a_missing_barrier() -> None:
    _, g = EXAMPLES["gated_mlp"](dtype="float32")
    (kern,) = compile_ugraph(g, HW, "cuda").kernels("cuda")
    assert _unsynchronised_hazards(kern.script) == []
    first = kern.script.index('T.tvm_storage_sync("shared")')
    end = kern.script.index("\n", first)
    assert _unsynchronised_hazards(kern.script[:first] + kern.script[end + 1 :])


@pytest.mark.parametrize("name", sorted(ALL_EXAMPLES))
def test_every_hazard_of_the_example_kernels_has_a_barrier(name: str) -> None:
    _, g = ALL_EXAMPLES[name](dtype="float32")
    for kern in compile_ugraph(g, HW, "cuda").kernels("cuda"):
        assert _unsynchronised_hazards(kern.script) == [], kern.name


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=_looped_graphs())
def test_every_hazard_of_random_kernels_has_a_barrier(g: KernelGraph) -> None:
    validate(g)
    cg = compile_ugraph(g, HW, "cuda")
    (kern,) = cg.kernels("cuda")
    assert _unsynchronised_hazards(kern.script) == []
    # TVM builds it (static tiles or an arena) and adds no barrier of its own: the checked ones are all.
    assert cg.cuda_source().count("__syncthreads()") == kern.script.count("tvm_storage_sync")


# ------------------------------------------------------------------------------------------ layouts


def _lanes(f: Callable[[int], int], elem: int) -> list[int]:
    return [f(lane) * elem for lane in range(32)]


@pytest.mark.parametrize(
    ("addresses", "elem", "want"),
    [
        (_lanes(lambda t: t, 4), 4, 1),  # consecutive float32: one word per bank
        (_lanes(lambda t: 0, 4), 4, 1),  # one word for every lane: a broadcast
        (_lanes(lambda t: t, 2), 2, 1),  # consecutive float16: two lanes per word
        (_lanes(lambda t: 2 * t, 4), 4, 2),  # stride 2: banks 0, 2, .. serve two words each
        (_lanes(lambda t: 32 * t, 4), 4, 32),  # a column of a row-major [32, 32] float32 tile
        (_lanes(lambda t: 33 * t, 4), 4, 1),  # the same column with the rows padded by one
        (_lanes(lambda t: t, 8), 8, 2),  # consecutive float64: 64 words over 32 banks
        (_lanes(lambda t: 32 * t, 2), 2, 16),  # a column of [32, 32] float16: two banks serve it
    ],
)
def test_bank_conflict_model_on_known_patterns(addresses: list[int], elem: int, want: int) -> None:
    assert wavefronts(addresses, elem) == want


@pytest.mark.parametrize(
    ("layout", "want"),
    [(Layout(), 32), (Layout(pad=1), 1), (Layout(pad=2), 2), (Layout(swizzle=32), 1), (Layout(swizzle=8), 4)],
)
def test_layouts_of_a_column_read(layout: Layout, want: int) -> None:
    # One warp reading column 5 of a [32, 32] float32 tile: 32-way row-major; a one-element pad or a 32-row
    # swizzle spreads the rows over all banks, an 8-row swizzle over 8.
    lanes = [address((t, 5), (32, 32), layout, 4) for t in range(32)]
    assert wavefronts(lanes, 4) == want


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_chosen_layout_never_takes_more_wavefronts_than_row_major(data: st.DataObject) -> None:
    rows = data.draw(st.integers(2, 64))
    cols = data.draw(st.sampled_from([1, 2, 3, 8, 16, 31, 32, 64, 128]))
    elem = data.draw(st.sampled_from([2, 4, 8]))
    row_step, col_step = data.draw(st.integers(0, 3)), data.draw(st.integers(0, 3))
    sites = [
        Access(tuple(((t * row_step + s) % rows, (t * col_step) % cols) for t in range(32)))
        for s in range(data.draw(st.integers(1, 3)))
    ]
    chosen = choose_layout((rows, cols), elem, sites)
    assert chosen in LAYOUTS and chosen.fits((rows, cols), elem)
    if chosen.swizzle:  # the XOR permutes columns within the row
        assert {address((0, c), (rows, cols), chosen, elem) for c in range(cols)} == {
            c * elem for c in range(cols)
        }
    assert layout_cost((rows, cols), elem, sites, chosen) <= layout_cost((rows, cols), elem, sites, Layout())


def test_flash_attention_pads_the_tiles_of_its_tensor_core_phase() -> None:
    # At the paper's shape (64 x 64 tiles; on the H100 profile 1,024 threads, QK^T on tensor cores on all 32
    # warps, the block cost model's choice with cooperative row sums) the exp thread graph runs on QK^T's
    # accumulators, so the exp tile is written in the MMA's fragment layout (a lane writes rows tx/4 % 8 and +8
    # at columns 2*(tx % 4)): 98 wavefronts row-major over its access sites, 26 with rows padded by four
    # float32; the fragment loads read Q, K and V a column per lane group, so their tiles are padded too.
    from gensorage.codegen.block_emitter import BlockEmitter
    from gensorage.codegen.scalar import FloatScalar

    _, g = EXAMPLES["flash_attention"](heads=16, q_len=256, kv_len=1024, head_dim=64, q_blocks=4, forloop=16)
    cg = compile_ugraph(g, HW, "cuda")
    e = BlockEmitter(g, 0, validate(g), cg.plans[0], "cuda", FloatScalar(), "k")
    e.emit()
    exp_tile = Ref(4)
    shape = e.tile(exp_tile).shape
    costs = [
        layout_cost(shape, 4, e.recorder.accesses[exp_tile], lay) for lay in LAYOUTS if lay.fits(shape, 4)
    ]
    # (P·V on 16 warps: the layout priced at its best stages, two.)
    assert cg.plans[0].threads == 1024 and cg.plans[0].mma_warps == ((3, 32), (6, 16))
    assert costs == [98, 50, 50, 50, 50, 50, 50, 26, 26]  # row-major, swizzles 4..32, pads 1..8
    layouts = e.chosen_layouts()
    assert layouts[exp_tile] == Layout(pad=4)
    assert all(lay.pad > 0 for r, lay in layouts.items() if r.node in (0, 1, 2))  # Q, K and V tiles
    (kern,) = cg.kernels("cuda")
    assert 's4 = T.decl_buffer((1, 64, 68), "float32"' in kern.script


@pytest.mark.parametrize("name", ["flash_attention", "gated_mlp", "qknorm_attention"])
def test_swizzled_tiles_keep_the_llvm_twin_right(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Pads win the layout ties, so swizzles are rare: force the widest swizzle that fits every tile (where one
    # does) and check that the XOR indices reach the kernel and the llvm twin still computes the program.
    from gensorage.codegen import block_emitter

    def widest_swizzle(shape: tuple[int, ...], elem: int, accesses: object, row_align: int = 0) -> Layout:
        fits = [lay for lay in LAYOUTS if lay.swizzle and lay.fits(shape, elem)]
        return max(fits, key=lambda lay: lay.swizzle, default=Layout())

    monkeypatch.setattr(block_emitter, "choose_layout", widest_swizzle)
    program, g = ALL_EXAMPLES[name](dtype="float32")
    cg = compile_ugraph(g, HW, "llvm")
    assert any(" ^ (" in k.script for k in cg.kernels("llvm"))
    rng = np.random.default_rng(11)
    xs = [rng.uniform(-1.0, 1.0, s.shape).astype(s.dtype) for s in g.inputs]
    for got, want in zip(cg.run(*xs), program.run(*xs), strict=True):
        assert np.allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_tile_ldmatrix_reads_keeps_its_16_byte_rows() -> None:
    # A float16 [16, 64] tile read a column per lane (32-way conflicts row-major): unconstrained, the cheapest
    # layout pads a word; a tile ldmatrix reads a 16-byte row at a time may only pad whole 16-byte runs.
    accesses = [Access(tuple((lane, 0) for lane in range(16)) * 2)]
    free = choose_layout((16, 64), 2, accesses)
    aligned = choose_layout((16, 64), 2, accesses, row_align=16)
    assert free.pad * 2 % 16 != 0 or free.swizzle
    assert aligned.swizzle == 0 and aligned.pad * 2 % 16 == 0

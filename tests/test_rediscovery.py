"""Rediscovery: from the reference programs at small search shapes, the search finds the papers' µGraph structures.

Each test asserts the *structure* of some verified candidate (kernels, loop, accumulators, where the operators
sit relative to the loop) and compares it with the hand-built µGraph of the same figure in
:mod:`gensorage.ugraph.examples`. Search shapes are small and pairwise coprime where the program allows (see
docs/search.md). Only the gated MLP runs in the default suite; the others take minutes and are marked slow.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gensorage.codegen.module import compile_ugraph
from gensorage.dtypes import numpy_dtype
from gensorage.exhaustive import SearchSpec, Task, run_search, run_task, search_serial
from gensorage.exhaustive.derived_limits import derive_limits
from gensorage.exhaustive.dim_strategy import DimStrategy, load_dim_strategy
from gensorage.exhaustive.walk import Walk
from gensorage.exhaustive.walk.search_state import AccumRec, BlockOpRec
from gensorage.hw import load_profile
from gensorage.opset import Op
from gensorage.program import Program, load_config
from gensorage.superopt import load_preset
from gensorage.superopt.search_shapes import derive_search_shapes
from gensorage.ugraph import examples
from gensorage.ugraph.ir import (
    Accumulator,
    BlockOp,
    GraphDefinedOp,
    InputIterator,
    KernelGraph,
    KernelOp,
    OutputSaver,
    ThreadGraph,
)
from gensorage.ugraph.validate import loop_phases
from gensorage.verify import equivalent


@dataclass(frozen=True)
class KernelShape:
    """The structure of one graph-defined kernel: loop, what runs in it, what after it."""

    looped: bool
    body: Counter[str]
    post: Counter[str]
    accumulators: int
    imaps: tuple[tuple[int | None, ...], ...]
    fmaps: tuple[int | None, ...]


def kernel_shape(op: GraphDefinedOp) -> KernelShape:
    block = op.block
    phases = loop_phases(block)
    body: Counter[str] = Counter()
    post: Counter[str] = Counter()
    accs = 0
    for node, phase in zip(block.nodes, phases, strict=True):
        names: list[str] = []
        if isinstance(node, BlockOp):
            names = [node.op.value]
        elif isinstance(node, ThreadGraph):
            names = [t.op.value for t in node.ops]
        elif isinstance(node, Accumulator):
            accs += 1
        (body if phase == "body" else post).update(names)
    its = [n for n in block.nodes if isinstance(n, InputIterator)]
    return KernelShape(
        block.forloop > 1, body, post, accs, tuple(it.imap for it in its), tuple(it.fmap for it in its)
    )


def custom_kernels(g: KernelGraph) -> list[KernelShape]:
    return [kernel_shape(op) for op in g.ops if isinstance(op, GraphDefinedOp)]


def run(name: str, params: dict[str, int], **limits: int) -> list[KernelGraph]:
    spec = SearchSpec(
        program=load_config(name, params), max_kernel_ops=1, max_grid_dims=1, max_block_outputs=1, **limits
    )
    result = search_serial(spec)
    assert result.complete
    assert result.candidates
    return [c.ugraph for c in result.candidates]


def single_kernel(graphs: list[KernelGraph]) -> list[KernelShape]:
    """The structures of the candidates that are one graph-defined kernel."""
    return [custom_kernels(g)[0] for g in graphs if len(g.ops) == 1 and isinstance(g.ops[0], GraphDefinedOp)]


# ---------------------------------------------------------------------------------------------- gated MLP


def test_gated_mlp_two_matmuls_in_one_loop_then_silu_mul() -> None:
    graphs = run("gated_mlp", {"t": 3, "k": 4, "f": 5}, max_block_ops=4)
    found = [
        k
        for k in single_kernel(graphs)
        if k.looped
        and k.body == Counter({"matmul": 2})
        and k.accumulators == 2
        and k.post == Counter({"silu": 1, "mul": 1})
    ]
    assert found
    # Fig. 10b / examples.gated_mlp: X walks the hidden dim (fmap 1), W1 and W2 split by columns and walked by rows.
    program, example = examples.gated_mlp(m=3, k=4, n=5, blocks=5, forloop=2)
    assert kernel_shape(example.ops[0]) in found  # type: ignore[arg-type]
    assert any(k.fmaps == (1, 0, 0) and k.imaps == ((None,), (1,), (1,)) for k in found)


# ---------------------------------------------------------------------------------------------- RMSNorm


@pytest.mark.slow
def test_rmsnorm_matmul_one_kernel_accumulating_squares_and_matmul() -> None:
    # h = 2: the loop's trip count is 2 and each iteration sees one hidden element, so the sum of squares is
    # accumulated by the loop itself (the in-loop Sum of Fig. 3b needs h >= 4 and a 7-operator search).
    graphs = run("rmsnorm", {"b": 3, "h": 2, "d": 5}, max_block_ops=6)
    found = [
        k
        for k in single_kernel(graphs)
        if k.looped
        and k.fmaps[0] == 1
        and k.body["matmul"] == 1
        and k.accumulators == 2
        and k.post["sqrt"] == 1
        and k.post["div"] == 1
        and "matmul" not in k.post
    ]
    assert found
    ref = kernel_shape(examples.rmsnorm_matmul(batch=3, hidden=4, out=5, blocks=5, forloop=2)[1].ops[0])  # type: ignore[arg-type]
    assert any(
        k.post == ref.post and k.accumulators == ref.accumulators and k.imaps == ref.imaps for k in found
    )


@pytest.mark.slow
def test_rmsnorm_matmul_fused_kernel_at_derived_shapes_and_limits() -> None:
    """What full mode searches for the program without a preset: its derived search shapes (b=4, h=16, d=32)
    and derived limits (one kernel of up to seven block operators). The complete search (minutes) finds Fig. 3's
    kernel: a loop over h accumulating the matmul and the squares' sum, then sqrt and div after it."""
    program = derive_search_shapes(load_config("rmsnorm")).program
    spec = SearchSpec(program=program, **derive_limits(program).limits)
    result = search_serial(spec)
    assert result.complete and result.candidates
    found = [
        k
        for k in single_kernel([c.ugraph for c in result.candidates])
        if k.looped
        and k.body["matmul"] == 1
        and k.accumulators == 2
        and k.post["sqrt"] == 1
        and k.post["div"] == 1
        and "matmul" not in k.post
    ]
    assert found
    assert all(len(c.ugraph.ops) == 1 for c in result.candidates)  # one fused kernel, as the limits say


# ------------------------------------------------------------------------------------------------- LoRA


@pytest.mark.slow
def test_lora_concatenations_in_one_kernel() -> None:
    graphs = run("lora", {"t": 3, "k": 4, "m": 5, "r": 2}, max_block_ops=4, max_block_inputs=4)
    found = [
        k for k in single_kernel(graphs) if k.body == Counter({"concat": 2, "matmul": 2}) and not k.looped
    ]
    assert found
    ref = kernel_shape(examples.lora(m=3, k=4, n=5, rank=2, n_blocks=5, m_blocks=1)[1].ops[0])  # type: ignore[arg-type]
    assert ref.body == found[0].body
    # The second matmul multiplies the two concatenations: X ‖ XA by W ‖ B (Fig. 9b).
    for g in graphs:
        if len(g.ops) != 1 or not isinstance(g.ops[0], GraphDefinedOp):
            continue
        nodes = g.ops[0].block.nodes
        concats = {j for j, n in enumerate(nodes) if isinstance(n, BlockOp) and n.op is Op.CONCAT}
        if (
            any(
                isinstance(n, BlockOp) and n.op is Op.MATMUL and {r.node for r in n.inputs} == concats
                for n in nodes
            )
            and len(concats) == 2
        ):
            break
    else:
        pytest.fail("no candidate multiplies the two concatenations")


# -------------------------------------------------------------------------------------- attention (MHA)


def _flash_like(k: KernelShape, key_fmaps: tuple[int, int]) -> bool:
    """A loop over the keys (K and V walked along the key dim) with QK, exp and the PV matmul in the body, both
    partial results accumulated and one division after the loop."""
    return (
        k.looped
        and k.fmaps[1:] == key_fmaps
        and k.body["matmul"] == 2
        and k.body["exp"] == 1
        and k.accumulators == 2
        and k.post.get("div") == 1
        and "matmul" not in k.post
    )


@pytest.mark.slow
def test_mha_flash_attention() -> None:
    graphs = run("mha_prefill_papers", {"b": 1, "h": 2, "s": 3, "n": 7, "d": 5}, max_block_ops=6)
    found = [k for k in single_kernel(graphs) if _flash_like(k, (2, 1))]
    assert found
    ref = kernel_shape(
        examples.flash_attention(heads=2, q_len=3, kv_len=7, head_dim=5, q_blocks=1, forloop=7)[1].ops[0]
    )  # type: ignore[arg-type]
    assert _flash_like(ref, (2, 1))
    assert any(
        k.imaps == ((0,), (0,), (0,)) for k in found
    )  # one block per head, as examples.flash_attention


# -------------------------------------------------------------------------------------- attention (GQA)


@pytest.mark.slow
def test_gqa_fused_without_repeat() -> None:
    params = {"b": 1, "kv": 2, "g": 3, "s": 1, "n": 7, "d": 5}
    program = load_config("gqa_incdec_papers", params)
    graphs = run("gqa_incdec_papers", params, max_block_ops=6)
    found = []
    for g in graphs:
        kernels = single_kernel([g])
        if not kernels or any(isinstance(op, KernelOp) for op in g.ops):
            continue
        k = kernels[0]
        if _flash_like(k, (2, 1)) and k.body["repeat"] == 0 and k.post["repeat"] == 0:
            found.append((g, k))
    assert found
    # Fig. 4c: one block per KV head holds its g query heads (Q, K and V all split along the head dim), no repeat.
    g, k = next((g, k) for g, k in found if k.imaps == ((0,), (0,), (0,)))
    assert g.ops[0].block.grid == (2,)  # type: ignore[union-attr]
    assert equivalent(program, g, 1e-9, seed=5, max_trials=16)


# ------------------------------------------------------------------------------- attention (FlashDecoding)


def _split_kv_then_combine(g: KernelGraph) -> bool:
    """FlashDecoding (first paper, Fig. 4b): two graph-defined kernels. The first reads Q, K and V, splits the keys
    across blocks (one grid dim maps K's key dim 2 and V's key dim 1) and loops over its slice with both matmuls
    and the exp inside, accumulating the two partial results; the second reads only those partials and reduces
    them across the splits with one division, no matmul and no exp."""
    if len(g.ops) != 2 or not all(isinstance(op, GraphDefinedOp) for op in g.ops):
        return False
    first, second = g.ops
    assert isinstance(first, GraphDefinedOp) and isinstance(second, GraphDefinedOp)
    k1, k2 = kernel_shape(first), kernel_shape(second)
    if [r.node for r in first.inputs] != [0, 1, 2] or any(r.node < 3 for r in second.inputs):
        return False
    splits_keys = any(k1.imaps[1][dim] == 2 and k1.imaps[2][dim] == 1 for dim in range(len(first.block.grid)))
    first_ok = (
        k1.looped
        and k1.body["matmul"] == 2
        and k1.body["exp"] == 1
        and k1.accumulators == 2
        and "div" not in k1.body + k1.post
    )
    both = k2.body + k2.post
    second_ok = both["div"] == 1 and both["matmul"] == 0 and both["exp"] == 0 and both["sum"] >= 1
    return splits_keys and first_ok and second_ok


def _split_kv_task(spec: SearchSpec) -> Task:
    """A task of the node that is the first kernel's header reading Q, K and V on two grid dims with a loop, after
    its first operator matmul(Q, K) with K's keys split across blocks (imap (0, 2)): FlashDecoding's subtree."""
    paths: list[tuple[tuple[int, ...], bool]] = []
    for depth in (2, 3):
        Walk(spec).collect(0, depth, [], paths)
    for index, (path, subtree) in enumerate(paths):
        if not subtree:
            continue
        task = Task(index, path, True)
        s = Walk(spec)
        suspended = []  # each generator stays suspended on its child (closing it would undo the child)
        for ordinal in task.path:
            children = s.children()
            suspended.append(children)
            for i, _ in enumerate(children):
                if i == ordinal:
                    break
        b = s.state.block
        hit = (
            b is not None
            and b.inputs == (0, 1, 2)
            and b.r == 2
            and b.looped
            and len(b.recs) == 1
            and isinstance(b.recs[0], BlockOpRec)
            and b.recs[0].variant.op is Op.MATMUL
            and b.recs[0].inputs == (0, 1)
            and b.imap[1] == (0, 2)
            and b.fmap[1] == 2
        )
        for children in reversed(suspended):  # undo the path innermost first
            children.close()
        if hit:
            return task
    raise AssertionError("no task holds the split-KV header")


@pytest.mark.slow
def test_mha_decode_flash_decoding_split_kv_in_two_kernels() -> None:
    # One query token: the keys are split across blocks (a second grid dim beside the heads) and the partial
    # results are combined by a second kernel. n = 6 keys: 2 splits of a loop of 3 (one key per iteration). The
    # whole two-kernel search takes many minutes (benchmarks/flash_decoding.py), too long for a test, so this walks the subtree of the split-KV first kernel only: every first kernel starting that way,
    # followed by every second kernel.
    params = {"h": 2, "n": 6, "d": 5}
    spec = SearchSpec(
        program=load_config("mha_incdec_papers", params),
        max_kernel_ops=2,
        max_block_ops=4,
        max_grid_dims=2,
        max_block_outputs=2,
        dims=load_dim_strategy("attention"),
    )
    res = run_task(spec, _split_kv_task(spec))
    assert res.complete
    found = [c.ugraph for c in res.candidates if _split_kv_then_combine(c.ugraph)]
    assert found
    program, example = examples.flash_decoding(heads=2, kv_len=6, head_dim=5, splits=2, forloop=3)
    assert _split_kv_then_combine(example)
    assert equivalent(program, found[0], 1e-9, seed=5, max_trials=16)


# ------------------------------------------------------------------------- stable attention (FlashAttention-2)


def _transpose_k_task(spec: SearchSpec) -> Task:
    """The task of the node whose first kernel operator is K's transpose (the only way the block matmul can
    read K kept as models keep it, [heads, keys, dim]): every second kernel after it."""
    paths: list[tuple[tuple[int, ...], bool]] = []
    Walk(spec).collect(0, 1, [], paths)
    for index, (path, subtree) in enumerate(paths):
        s = Walk(spec)
        children = s.children()
        for i, _ in enumerate(children):
            if i == path[0]:
                break
        op = s.state.ops[0] if s.state.ops else None
        hit = isinstance(op, KernelOp) and op.op is Op.TRANSPOSE and op.inputs[0].node == 1
        children.close()
        if hit and subtree:
            return Task(index, path, True)
    raise AssertionError("no task starts with K's transpose")


def test_stable_attention_flash_attention2_online_softmax() -> None:
    # softmax(Q Kᵀ/√d) V with the max-subtracting softmax: after K's transpose, one kernel whose loop over the
    # keys keeps the online-softmax accumulators (running max, rescaled Σ exp(S − m) and exp(S − m)·V), one
    # division after the loop: FlashAttention-2. The rescale needs exp's law, so the second tier verifies it.
    h, s, n, d = 2, 3, 4, 5
    program, example = examples.flash_attention2(
        heads=h, q_len=s, kv_len=n, head_dim=d, q_blocks=1, forloop=2
    )
    spec = SearchSpec(
        program=program, max_kernel_ops=2, max_block_ops=3, max_grid_dims=1, max_block_outputs=1
    )
    res = run_task(spec, _transpose_k_task(spec))
    assert res.complete and res.candidates
    found = []
    for c in res.candidates:
        (k,) = custom_kernels(c.ugraph)
        op = c.ugraph.ops[1]
        assert isinstance(op, GraphDefinedOp)
        kinds = sorted(n.kind for n in op.block.nodes if isinstance(n, Accumulator))
        if k.looped and k.body == Counter({"matmul": 1, "scale": 1}) and k.post == Counter({"div": 1}):
            found.append((c.ugraph, k, kinds))
    assert found
    assert all(kinds == ["softmax_matmul", "softmax_sum"] for _, _, kinds in found)
    ref = kernel_shape(example.ops[1])  # type: ignore[arg-type]
    # Q whole per head, Kᵀ walked along its keys (dim 2) and V along its keys (dim 1), as flash_attention2.
    g, k, _ = next((g, k, kinds) for g, k, kinds in found if k.fmaps == (None, 1, 2))
    assert (ref.body, ref.post, ref.accumulators) == (k.body, k.post, k.accumulators)
    r = equivalent(program, g, 1e-9, seed=5)
    assert r and r.tier == 2
    # And it has kernels: the llvm build on the CPU against the program, with logits up to ~100.
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(t.shape).astype(np.float16) for t in program.inputs]
    xs[0] *= 30.0
    (got,) = compile_ugraph(g, load_profile("h100"), "llvm").run(*xs)
    (want,) = program.run(*(x.astype(np.float64) for x in xs))
    assert np.isfinite(got).all()
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-2


def test_a_bundled_stable_attention_preset_finds_flash_attention2(tmp_path: Path) -> None:
    # The bundled (stable) program's preset, searched completely as full mode does (gqa_incdec: the quickest):
    # every candidate is K's transpose, then one kernel looping over the keys with the online-softmax
    # accumulators and one division after the loop.
    preset = load_preset("gqa_incdec")
    program = load_config("gqa_incdec", preset.search_params)
    spec = SearchSpec(program=program, **preset.search)
    result = run_search(spec, checkpoint=tmp_path / "c.sqlite", workers=1, progress=False)
    assert result.complete and result.candidates
    for c in result.candidates:
        first, kernel = c.ugraph.ops
        assert isinstance(first, KernelOp) and first.op is Op.TRANSPOSE
        assert isinstance(kernel, GraphDefinedOp)
        (k,) = custom_kernels(c.ugraph)
        assert k.looped and k.body == Counter({"matmul": 1, "scale": 1}) and k.post == Counter({"div": 1})
        kinds = sorted(n.kind for n in kernel.block.nodes if isinstance(n, Accumulator))
        assert kinds == ["softmax_matmul", "softmax_sum"]


# --------------------------------------------------------------------------- stable attention (FlashDecoding)


def _guided_path(
    spec: SearchSpec, keep: Callable[[Walk], bool], done: Callable[[Walk], bool]
) -> tuple[int, ...]:
    """The path of the first node, depth first, where ``done`` holds, descending only into children ``keep``
    accepts: the search's own children, each one generated and pruned by the walk as in a full search."""
    s = Walk(spec)
    suspended: list[Generator[None, None, None]] = []

    def dfs(path: tuple[int, ...]) -> tuple[int, ...] | None:
        children = s.children()
        suspended.append(children)
        for i, _ in enumerate(children):
            if done(s):
                return (*path, i)
            if keep(s) and (got := dfs((*path, i))) is not None:
                return got
        suspended.pop().close()
        return None

    found = dfs(())
    for children in reversed(suspended):
        children.close()
    assert found is not None, "no node of that structure"
    return found


_ROLES_IN = {0: "Q", 2: "V", 3: "Kt"}
_SPLIT_MAPS = {0: ((0, None), None), 2: ((0, 1), 1), 3: ((0, 2), 2)}
_SPLIT = {
    (Op.MATMUL, ("Q", "Kt")): "S",
    ("softmax_sum", ("S",)): "l",
    ("softmax_matmul", ("S", "V")): "o",
    ("max", ("S",)): "m",
}
# With 1/√d in the program: the accumulators and the running max read the scaled scores (a max may read a
# scale's result for a positive factor, docs/search.md), so the saved maxima are the scaled scores'.
_SPLIT_SCALED = {
    (Op.MATMUL, ("Q", "Kt")): "QK",
    (Op.SCALE, ("QK",)): "S",
    **{key: role for key, role in _SPLIT.items() if key[0] is not Op.MATMUL},
}
_COMBINE = {
    (Op.MAX, ("m",)): "M",
    (Op.SUB, ("m", "M")): "D",
    (Op.EXP, ("D",)): "w",
    (Op.MATMUL, ("w", "o")): "A",
    (Op.MATMUL, ("w", "l")): "B",
    (Op.DIV, ("A", "B")): "out",
}


def _roles(names: list[str], recs: list[BlockOpRec | AccumRec], table: dict[Any, str]) -> list[str] | None:
    """The role of each block tensor (iterators first) if every operator so far is one of ``table``'s."""
    out = list(names)
    for rec in recs:
        ins = tuple(out[i] for i in rec.inputs)
        if isinstance(rec, BlockOpRec):
            if rec.variant.op is Op.MAX and dict(rec.variant.attrs).get("dim") != 2:
                return None  # the combine's maximum is over the splits
            role = table.get((rec.variant.op, ins))
        else:
            role = table.get((rec.kind, ins))
        if role is None or role in out:
            return None
        out.append(role)
    return out


def _saved_roles(op: GraphDefinedOp) -> dict[int, str]:
    """The split kernel's outputs (kernel tensors 4, 5, 6) by the accumulator each saves."""
    nodes = op.block.nodes
    kinds = {"max": "m", "softmax_sum": "l", "softmax_matmul": "o"}
    saved = [nodes[n.input.node] for n in nodes if isinstance(n, OutputSaver)]
    return {4 + i: kinds.get(getattr(a, "kind", ""), "?") for i, a in enumerate(saved)}


def _flash_decoding_prefix(
    s: Walk, split_table: dict[Any, str] = _SPLIT, split_maps: dict[int, Any] = _SPLIT_MAPS
) -> bool:
    """K's transpose, then a split-KV kernel of the online accumulators and a running max (the keys split over
    a second grid dim and walked by the loop; its operators ``split_table``'s, its maps ``split_maps``), then a
    combine kernel of the six operators above."""
    st = s.state
    first = st.ops[0] if st.ops else None
    if not (isinstance(first, KernelOp) and first.op is Op.TRANSPOSE and first.inputs[0].node == 1):
        return False
    b = st.block
    if len(st.ops) == 1:
        if b is None:
            return True
        if set(b.inputs) != {0, 2, 3} or b.r != 2 or not b.looped:
            return False
        for i, t in enumerate(b.inputs):  # heads on grid x; the keys of Kᵀ and V on grid y and the loop
            if b.imap[i] is not None and (b.imap[i], b.fmap[i]) != split_maps[t]:
                return False
        return _roles([_ROLES_IN[t] for t in b.inputs], b.recs, split_table) is not None
    split = st.ops[1]
    if len(st.ops) != 2 or not isinstance(split, GraphDefinedOp):
        return False
    saved = _saved_roles(split)
    if b is None:
        return sorted(saved.values()) == ["l", "m", "o"]
    return not b.looped and _roles([saved.get(t, "?") for t in b.inputs], b.recs, _COMBINE) is not None


def _stable_decode(scaled: bool, dtype: str = "float16") -> Program:
    """``softmax(Q Kᵀ/√d) V`` at decode (one query token), K as models keep it; ``scaled=False``: 1/√d folded
    into Q, the papers' attention programs' form."""
    h, n, d = 2, 6, 5
    p = Program("stable_decode")
    q, k, v = (p.input(name, (h, 1 if name == "Q" else n, d), dtype) for name in "QKV")
    s = p.matmul(q, p.transpose(k, 1, 2))
    p.output(p.matmul(p.softmax(p.scale(s, 1 / math.sqrt(d)) if scaled else s, 2), v))
    return p


def stable_decode_spec(
    scaled: bool, dims: DimStrategy | None = None, stable_only: bool = False
) -> SearchSpec:
    """The search space of stable FlashDecoding (three kernels: K's transpose, split-KV, combine), shared with
    ``benchmarks/flash_decoding.py --stable``; ``stable_only``: ``sub_stabilises_only`` and
    ``exp_stabilised_only`` on and ``loop_concats`` off, as the split-KV presets set them."""
    ops = ("transpose", "matmul", "max", "sub", "exp", "div", *(("scale",) if scaled else ()))
    return SearchSpec(
        program=_stable_decode(scaled),
        max_kernel_ops=3,
        max_block_ops=6,
        max_grid_dims=2,
        max_block_inputs=3,
        max_block_outputs=3,
        ops=ops,
        dims=dims,
        sub_stabilises_only=stable_only,
        exp_stabilised_only=stable_only,
        loop_concats=not stable_only,
    )


def _stable_split_kv_and_combine(g: KernelGraph) -> bool:
    """Stable FlashDecoding's structure: K's transpose, a looped split-KV kernel with the two online-softmax
    accumulators and a running max (the keys on a grid dim and the loop), a combine of max, sub, exp, two
    matmuls and a division (used by benchmarks/flash_decoding.py --stable too)."""
    if len(g.ops) != 3 or not (isinstance(g.ops[0], KernelOp) and g.ops[0].op is Op.TRANSPOSE):
        return False
    split, combine = g.ops[1], g.ops[2]
    if not (isinstance(split, GraphDefinedOp) and isinstance(combine, GraphDefinedOp)):
        return False
    kt = [
        it for it in split.block.nodes if isinstance(it, InputIterator) and split.inputs[it.input].node == 3
    ]
    kinds = sorted(a.kind for a in split.block.nodes if isinstance(a, Accumulator))
    k2 = kernel_shape(combine)
    return (
        split.block.forloop > 1
        and len(kt) == 1
        and kt[0].fmap == 2
        and 2 in kt[0].imap
        and kinds == ["max", "softmax_matmul", "softmax_sum"]
        and not k2.looped
        and k2.body + k2.post == Counter({"matmul": 2, "max": 1, "sub": 1, "exp": 1, "div": 1})
    )


@pytest.mark.parametrize("stable_subs", [False, True], ids=["all-subs", "stable-only"])
@pytest.mark.parametrize("scaled", [False, True], ids=["folded", "scaled"])
def test_stable_attention_decode_flash_decoding_split_kv_and_combine(scaled: bool, stable_subs: bool) -> None:
    # One query token, K as models keep it: the stable program at decode. The search's own children reach a
    # split-KV kernel saving each split's o, l and running max m, and a combine that rescales by exp(m_i − M)
    # with M the max over the splits, as two matmuls and a division: FlashDecoding. Its prefixes are kept by
    # the stabiliser laws (docs/search.md); the walk below the path completes, filters and verifies it (tier 2).
    # With 1/√d in the program (as models write it) the split kernel scales its scores once: the online
    # accumulators and the running max read the scaled scores (a max may read a positive scale's result), so
    # the saved maxima are the scaled scores' and the combine needs no second scale (examples.flash_decoding_stable).
    # With the split-KV presets' restrictions (sub_stabilises_only, exp_stabilised_only) the path is still there:
    # the combine's only sub, m − M, subtracts the maximum over the splits of the splits' maxima, only its exp
    # reads it, and that is the only exp (the split kernel's online accumulators exponentiate inside); and
    # no accumulator concatenates (loop_concats off): the split kernel's are two online ones and a running max.
    spec = stable_decode_spec(scaled, stable_only=stable_subs)
    p = spec.program
    table = _SPLIT_SCALED if scaled else _SPLIT
    path = _guided_path(
        spec,
        lambda s: _flash_decoding_prefix(s, table),
        lambda s: len(s.state.ops) == 3 and s.state.block is None,
    )
    res = run_task(spec, Task(0, path, True))
    assert res.complete and len(res.candidates) == 1 and res.stats.verified == 1
    g = res.candidates[0].ugraph
    assert _stable_split_kv_and_combine(g)
    split = g.ops[1]
    assert isinstance(split, GraphDefinedOp)
    assert kernel_shape(split).body == Counter({"matmul": 1, **({"scale": 1} if scaled else {})})
    r = equivalent(p, g, 1e-9, seed=5)
    assert r and r.tier == 2
    # Kernels on the CPU (llvm) against float64 with logits up to ~100, in float16 and bfloat16.
    for dtype in ("float16", "bfloat16"):
        typed = dataclasses.replace(g, inputs=tuple(dataclasses.replace(t, dtype=dtype) for t in g.inputs))
        rng = np.random.default_rng(0)
        xs = [rng.standard_normal(t.shape).astype(numpy_dtype(dtype)) for t in p.inputs]
        xs[0] *= 30.0 * (math.sqrt(5) if scaled else 1.0)
        (got,) = compile_ugraph(typed, load_profile("h100"), "llvm").run(*xs)
        (want,) = p.run(*(x.astype(np.float64) for x in xs))
        assert np.isfinite(got.astype(np.float64)).all()
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-2, dtype

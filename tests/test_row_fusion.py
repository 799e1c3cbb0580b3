"""Row fusion where users get kernels (gensorage.superopt.row_fusion): the fused direct µGraph as an option, and
search candidates whose remaining pre-defined ops are fused and checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gensorage.hw import load_profile
from gensorage.opset import epilogue
from gensorage.precision import DEFAULT_PRECISION as PRECISION
from gensorage.program import Program, load_config
from gensorage.superopt.choice import Option, cost_fn
from gensorage.superopt.row_fusion import (
    FUSED,
    FUSED_ROWS,
    check_fused_candidate,
    fused_candidate,
    fused_option,
    fused_options,
)
from gensorage.superopt.search_shapes import derive_search_shapes
from gensorage.ugraph import from_program, wrap_kernel_op
from gensorage.ugraph.ir import GraphDefinedOp, KernelGraph, KernelOp

HW = load_profile("h200")
COST = cost_fn(HW)
#: GQA prefill where the model prices row fusion without QKᵀ's epilogue faster on the h200 (the wgmma kernel
#: with an epilogue stores each element on its own); 6.6 M elements: checked at the search shapes.
GQA_ROWS = {"s": 512, "n": 1024, "d": 128, "kv": 1, "g": 2}


def attention(heads: int = 2, q: int = 4, kv: int = 8, d: int = 4) -> Program:
    p = Program("attn")
    qt, k = p.input("Q", (heads, q, d), "float32"), p.input("K", (heads, d, kv), "float32")
    v = p.input("V", (heads, kv, d), "float32")
    e = p.exp(p.scale(p.matmul(qt, k), 0.5))
    p.output(p.matmul(p.div(e, p.sum(e, dim=2)), v))
    return p


def test_fused_option_is_checked_at_search_shapes_when_too_large() -> None:
    p = load_config("rmsnorm")  # 4.3 M elements: over the default verification limit
    opt = fused_option(p, "float32", HW, COST, 1e-6, seed=0)
    assert opt is not None and opt.origin == FUSED and opt.predicted_time_s < COST(from_program(p))
    assert opt.search_report is not None and opt.search_report["equivalent"] is True
    small = derive_search_shapes(load_config("ntrans")).program
    opt = fused_option(small, "float32", HW, COST, 1e-6, seed=0)
    assert opt is not None and opt.search_report is None  # small enough: checked at its own shapes later
    two = Program("two_matmuls")
    a, b = two.input("A", (4, 8), "float32"), two.input("B", (8, 4), "float32")
    two.output(two.matmul(two.matmul(a, b), a))
    assert fused_option(two, "float32", HW, COST, 1e-6, seed=0) is None  # nothing to fuse


def test_no_fused_option_when_its_check_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    # A program too large to check at its own shapes whose check at the search shapes cannot run either (a
    # LLaMA-3-8B decoder layer's first tier could not bound its error there before its search shapes shrank
    # around head_dim): no fused option, and superoptimize keeps the direct µGraph instead of failing (the layer
    # fell back to torch on an H200).
    from gensorage.errors import VerificationError
    from gensorage.superopt import row_fusion, superoptimize

    def cannot(*args: object, **kwargs: object) -> dict[str, object]:
        raise VerificationError("cannot bound the first tier's error: too many function applications")

    monkeypatch.setattr(row_fusion, "small_shape_report", cannot)
    p = load_config("rmsnorm")
    assert fused_option(p, "float32", HW, COST, 1e-6, seed=0) is None
    res = superoptimize(p, hw=HW, mode="fast", use_store=False, progress=False)
    assert res.origin == "direct" and res.equivalence


def test_a_candidates_remaining_ops_are_fused_and_checked() -> None:
    p = attention()
    # a "candidate": the first matmul already a graph-defined kernel, the softmax still one kernel per op
    cand = wrap_kernel_op(from_program(p), 0, (2,), [(0,), (0,)], (0,))
    opt = Option(cand, COST(cand), "search #0", cand, {"equivalent": True})
    fused = fused_candidate(opt, HW, COST)
    assert fused is not opt and fused.predicted_time_s < opt.predicted_time_s
    kinds = [type(op) for op in fused.graph.ops]
    assert kinds == [GraphDefinedOp, GraphDefinedOp, KernelOp]  # QKᵀ, the softmax, PV
    checked = check_fused_candidate(fused, p, HW, 1e-6, seed=0)
    assert checked.search_report == {"equivalent": True, "row_fusion": True}
    # a candidate whose search found it wrong stays wrong after fusion
    bad = check_fused_candidate(
        Option(fused.graph, 0.0, "search #1", cand, {"equivalent": False}), p, HW, 1e-6, seed=0
    )
    assert bad.search_report is not None and bad.search_report["equivalent"] is False


def test_the_check_at_search_shapes_needs_the_same_kernels() -> None:
    """A softmax over rows of 2^18 does not fit a block at its own shapes (its ops stay one kernel each) but
    fuses at the search shapes (rows of 64): the check there would not witness the rewrite at the program's
    own shapes, so the fused option's report says not equivalent."""
    from gensorage.superopt.row_fusion import small_shape_report

    p = Program("two_rows")
    x, y = p.input("X", (8, 1 << 18), "float32"), p.input("Y", (64, 4096), "float32")
    e = p.exp(x)
    p.output(p.div(e, p.sum(e, dim=1)))
    p.output(p.div(y, p.sqrt(p.sum(p.mul(y, y), dim=1))))
    report = small_shape_report(p, "float32", HW, 1e-6, seed=0)
    assert report["equivalent"] is False and "other kernels" in str(report["reason"])
    opt = fused_option(p, "float32", HW, COST, 1e-6, seed=0)  # the norm alone fuses at the real shapes
    assert opt is not None and opt.search_report is not None and opt.search_report["equivalent"] is False


def _epilogues(g: KernelGraph) -> int:
    return sum(isinstance(op, KernelOp) and bool(epilogue(op.attrs)) for op in g.ops)


def test_the_option_without_epilogues_is_offered_checked_and_chosen_where_faster() -> None:
    from gensorage.superopt import superoptimize

    p = load_config("gqa_prefill", GQA_ROWS)
    options = {o.origin: o for o in fused_options(p, PRECISION, HW, COST, 1e-6, seed=0)}
    assert set(options) == {FUSED, FUSED_ROWS}
    rows, fused = options[FUSED_ROWS], options[FUSED]
    assert _epilogues(fused.graph) == 1 and _epilogues(rows.graph) == 0  # QKᵀ's scale: epilogue or row kernel
    assert rows.predicted_time_s < fused.predicted_time_s < COST(from_program(p, PRECISION))
    assert rows.search_report is not None and rows.search_report["equivalent"] is True
    res = superoptimize(p, hw=HW, mode="fast", use_store=False, progress=False)
    assert res.origin == FUSED_ROWS and res.equivalence.method == "search shapes" and res.equivalence
    assert [o for o, _, _ in res.candidates] == [FUSED_ROWS, FUSED, "direct"]
    assert _epilogues(res.best) == 0


def test_the_option_without_epilogues_only_where_it_differs() -> None:
    # rmsnorm: no matmul epilogue forms, so both rules give one µGraph; the MLP: row fusion alone fuses nothing
    for name in ("rmsnorm", "mlp"):
        p = load_config(name)
        assert [o.origin for o in fused_options(p, PRECISION, HW, COST, 1e-6, seed=0)] == [FUSED]


def test_a_wrong_rewrite_without_epilogues_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule without epilogue fusion goes through the same check: a rewrite that changes the scale of
    the row kernel it forms fails it at the search shapes, and the choice passes it over."""
    from gensorage.superopt import superoptimize

    _break_rows_alone(monkeypatch)
    p = load_config("gqa_prefill", GQA_ROWS)
    rows = fused_option(p, PRECISION, HW, COST, 1e-6, seed=0, epilogues=False)
    assert rows is not None and rows.origin == FUSED_ROWS
    assert rows.search_report is not None and rows.search_report["equivalent"] is False
    res = superoptimize(p, hw=HW, mode="fast", use_store=False, progress=False)
    assert res.origin == FUSED and any(n.startswith(f"{FUSED_ROWS}: rejected") for n in res.notes)


def _break_rows_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Row fusion that changes a scale factor of what it fuses, unless epilogue fusion ran first."""
    import random

    from gensorage.superopt import row_fusion
    from gensorage.verify.mutate import change_scale

    real = row_fusion._fuse_rows

    def wrong(g: KernelGraph, hw: object) -> KernelGraph:
        fused = real(g, hw)  # type: ignore[arg-type]
        if _epilogues(g):
            return fused  # the rule with epilogue fusion stays right
        return change_scale(fused, random.Random(0)) or fused

    monkeypatch.setattr(row_fusion, "_fuse_rows", wrong)


def test_full_mode_then_fast_mode_from_the_store_keep_the_option_without_epilogues(tmp_path: Path) -> None:
    """The structure store keeps the search's verdict (nothing found: the direct µGraph); fast mode at another
    shape offers the rule-made options again and takes the one without epilogues where it is faster there."""
    from gensorage.superopt import superoptimize
    from gensorage.superopt.presets import preset_from_dict

    empty = {"max_kernel_ops": 1, "max_block_ops": 2, "max_grid_dims": 1, "max_block_inputs": 2}
    kw: dict[str, Any] = {"hw": HW, "store": tmp_path / "s.sqlite", "progress": False}
    full = superoptimize(
        "gqa_prefill",
        params=GQA_ROWS,
        mode="full",
        preset=preset_from_dict({"search": empty}, name="empty"),
        workers=1,
        checkpoint=tmp_path / "c.sqlite",
        **kw,
    )
    assert full.complete and full.origin == FUSED_ROWS and full.equivalence
    fast = superoptimize("gqa_prefill", params={**GQA_ROWS, "s": 256, "n": 2048}, mode="fast", **kw)
    assert fast.from_store and fast.origin == FUSED_ROWS and fast.equivalence


def test_a_candidates_remaining_ops_are_fused_by_either_rule_and_checked_by_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A search candidate whose QKᵀ and softmax are still pre-defined ops: row fusion alone prices faster here
    (as for the direct µGraph), and its check at the search shapes applies that rule, not the other."""
    p = load_config("gqa_prefill", {"s": 512, "n": 512, "d": 128, "kv": 2, "g": 2})
    small = derive_search_shapes(p).program

    def candidate(q: Program, grid: tuple[int, int]) -> KernelGraph:  # P·V a graph-defined kernel
        return wrap_kernel_op(from_program(q, PRECISION), 10, grid, [(0, 1), (0, None)], (0, 1))

    heads = small.nodes[0].shape[0]
    big, search = candidate(p, (4, 32)), candidate(small, (heads, 1))
    opt = Option(big, COST(big), "search #0", search, {"equivalent": True})
    with_epilogues, rows = (fused_candidate(opt, HW, COST, e) for e in (True, False))
    assert rows.predicted_time_s < with_epilogues.predicted_time_s < opt.predicted_time_s
    assert _epilogues(with_epilogues.graph) == 1 and _epilogues(rows.graph) == 0
    checked = check_fused_candidate(rows, small, HW, 1e-6, seed=0, epilogues=False)
    assert checked.search_report == {"equivalent": True, "row_fusion": True}
    _break_rows_alone(monkeypatch)  # the check applies the rule it is told, and only that one
    broken = check_fused_candidate(rows, small, HW, 1e-6, seed=0, epilogues=False)
    assert broken.search_report == {"equivalent": False, "row_fusion": False}
    other = check_fused_candidate(with_epilogues, small, HW, 1e-6, seed=0, epilogues=True)
    assert other.search_report == {"equivalent": True, "row_fusion": True}

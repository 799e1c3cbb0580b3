"""Row fusion where users get kernels (gensorage.superopt.row_fusion): the fused direct µGraph as an option, and
search candidates whose remaining pre-defined ops are fused and checked."""

from __future__ import annotations

import pytest

from gensorage.hw import load_profile
from gensorage.program import Program, load_config
from gensorage.superopt.choice import Option, cost_fn
from gensorage.superopt.row_fusion import FUSED, check_fused_candidate, fused_candidate, fused_option
from gensorage.superopt.search_shapes import derive_search_shapes
from gensorage.ugraph import from_program, wrap_kernel_op
from gensorage.ugraph.ir import GraphDefinedOp, KernelOp

HW = load_profile("h200")
COST = cost_fn(HW)


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

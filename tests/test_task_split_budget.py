"""Splitting a search into tasks stays cheap where a level of the tree explodes, so a time budget bounds the search.

Found by a sweep of random programs (sixteenth session): a 29-operator float16 program (two GELUs in their tanh
form, ``x / (1 + exp(y))``, ``sqrt(x² + 1)``, a product, an RMSNorm) under ``time_budget_s=5`` searched for
98-112 s. The split reached 18,222 subtree tasks at its depth, then looked at the next level (3.3 million nodes,
88 s) for nodes to split further, and classed the tasks with a scan of every path per node (332 million
comparisons, 20 s); neither polls the budget. Now the next level is not looked at past ``MAX_REFINED_TASKS``
subtrees, and the classing walks only the nodes some path goes below.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import gensorage
from gensorage.exhaustive.walk import tasks
from gensorage.program.text_format import parse_program

PROGRAM = """
program fz
input I1 [24, 16, 40] float16
input I2 [24, 16, 40] float16
input I3 [24, 16, 40] float16
t1 = mul(I1, I1)
t2 = mul(t1, I1)
t4 = add(I1, scale(t2, factor=0.044715))
t7 = add_scalar(exp(scale(t4, factor=-1.5957691216057308)), value=1.0)
t8 = div(I1, t7)
t12 = div(t8, add_scalar(exp(I2), value=1.0))
t15 = sqrt(add_scalar(mul(t12, t12), value=1.0))
t17 = mul(mul(t15, t15), t15)
t19 = add(t15, scale(t17, factor=0.044715))
t23 = div(t15, add_scalar(exp(scale(t19, factor=-1.5957691216057308)), value=1.0))
t25 = mul(t23, I3)
t30 = sqrt(add_scalar(scale(sum(mul(t25, t25), dim=2, keepdim=true), factor=0.025), value=1e-06))
O = div(t25, t30)
output O
"""


def test_a_budget_bounds_a_search_whose_split_explodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GENSORAGE_HOME", str(tmp_path))
    depths: list[int] = []
    collect = tasks.Walk.collect

    def counted(self, node, depth, prefix, out, *rest):  # type: ignore[no-untyped-def]
        if node == 0 and not prefix:
            depths.append(depth)
        return collect(self, node, depth, prefix, out, *rest)

    monkeypatch.setattr(tasks.Walk, "collect", counted)
    res = gensorage.superoptimize(
        parse_program(PROGRAM), "h100", "full", time_budget_s=2, progress=False, use_store=False, workers=1
    )
    assert res.stopped_by == "time budget" and res.equivalence
    # Depths 1, 2, 3 (18,222 subtrees at 3); before, depth 4 too (3.3 million nodes).
    assert max(depths) == 3
    # The search's own time: the split and the budgeted run (before: 98-112 s; the split alone ~2 s idle now).
    assert res.timings["search"] < 60, res.timings

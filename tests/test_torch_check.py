"""The check of a subgraph's kernels on its first call: against torch, and against float64 where they differ.

In float16 and bfloat16 torch's own answer can be far from the exact one (scores rounded to bfloat16 before the
softmax of large logits, fp16 scores overflowing to inf): kernels that differ from it by more than the
tolerance are then judged against the subgraph run in float64 on the same inputs.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gensorage.torch as gt
from gensorage.errors import GensorageError
from gensorage.torch import subgraph
from gensorage.torch.report import Report
from gensorage.torch.subgraph import mismatch


class Attention(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.softmax(q @ k.transpose(-1, -2) / 4.0, dim=-1) @ v


def _inputs(dtype: torch.dtype, scale: float, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(1, 2, 8, 16), (1, 2, 12, 16), (1, 2, 12, 16)]
    return [torch.randn(s, generator=g) * (scale if i < 2 else 1.0) for i, s in enumerate(shapes)]


def _exact(args: list[torch.Tensor]) -> torch.Tensor:
    """The function on the inputs as given (already rounded to their dtype), in float64."""
    return Attention()(*[a.double() for a in args])


def test_bfloat16_kernels_closer_to_float64_than_torch_run() -> None:
    # Logits up to ~100: torch rounds the scores to bfloat16 before the softmax and misses float64 by ~5e-2;
    # the kernels keep them in float32. The two differ by more than the 2e-2 tolerance.
    args = [a.to(torch.bfloat16) for a in _inputs(torch.bfloat16, 6.0)]
    eager = Attention()(*args)
    assert mismatch((eager,), (_exact(args),), same_dtype=False) > 4e-2
    compiled = gt.compile(Attention())
    out = compiled(*args)
    report = compiled.explain()
    assert "of float64, torch's own answer" in report and "stays in torch" not in report, report
    ours = mismatch((out,), (_exact(args),), same_dtype=False)
    assert ours < 2e-2 and out.dtype == torch.bfloat16
    again = compiled(*args)  # later calls run the kernels that passed
    assert torch.equal(again, out)


def test_float16_scores_that_overflow_in_torch_are_finite_in_the_kernels() -> None:
    # |q·k| reaches ~1e5 > 65504 (q and k ~100): torch's float16 scores are inf and its softmax NaN; the kernels' are float32.
    args = [a.to(torch.float16) for a in _inputs(torch.float16, 100.0, seed=1)]
    eager = Attention()(*args)
    assert eager.isnan().any()
    compiled = gt.compile(Attention())
    out = compiled(*args)
    assert torch.isfinite(out).all(), compiled.explain()
    assert mismatch((out,), (_exact(args),), same_dtype=False) < 2e-2
    assert "of float64" in compiled.explain()


def test_kernels_off_from_both_stay_in_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    # A kernel 10 % off (simulated) differs from torch and from float64: torch's answer, and the report says so.
    run = subgraph.run_kernels

    def skewed(*a: object, **k: object) -> tuple[torch.Tensor, ...]:
        return tuple(t * 1.1 for t in run(*a, **k))  # type: ignore[arg-type]

    monkeypatch.setattr(subgraph, "run_kernels", skewed)
    args = [a.to(torch.bfloat16) for a in _inputs(torch.bfloat16, 1.0)]
    compiled = gt.compile(Attention())
    out = compiled(*args)
    assert torch.equal(out, Attention()(*args))
    report = compiled.explain()
    assert "stays in torch: kernels differ from torch by" in report and "from float64 by" in report, report


def test_a_float64_run_that_fails_keeps_torch_with_the_reason() -> None:
    # The judge itself cannot run (a subgraph that refuses float64): the kernels are not used, and why is said.
    class Refuses(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.dtype == torch.float64:
                raise TypeError("no float64 here")
            return torch.exp(x)

    sub = subgraph.GensorageSubgraph(Refuses(), "g", subgraph.Options(), Report())  # type: ignore[arg-type]
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    with pytest.raises(GensorageError, match="float64 run that would decide failed: no float64 here"):
        sub._against_float64((x,), (torch.exp(x) * 1.1,), (torch.exp(x),), 0.1, 2e-2)
    with pytest.raises(GensorageError, match="differ from torch"):  # other dtypes: nothing to decide
        sub._against_float64((x,), (torch.exp(x).float(),), (torch.exp(x),), 0.1, 2e-2)

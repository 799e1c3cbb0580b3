"""A batched matmul of one matrix (``bmm`` at batch 1: attention written by hand for one sequence).

Its construction workload is a gemm (no batch axis) while its TVM block keeps a batch loop of extent 1; the
schedule once found no workload axis for that loop, and every such subgraph stayed in torch ("iterator v_b
(extent 1) matches no workload axis"). The loop now takes one step.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import gensorage.torch as gtorch  # noqa: E402
from gensorage.program import Program  # noqa: E402
from gensorage.torch import subgraph  # noqa: E402
from gensorage.torch.device import run_on_device  # noqa: E402


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENSORAGE_HOME", str(tmp_path / "home"))


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    t = q.shape[1]
    mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
    scores = (q @ k.transpose(1, 2) / 4.0).masked_fill(mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def test_hand_written_attention_of_one_sequence_runs_in_gensorage() -> None:
    compiled = gtorch.compile(_attention)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 6, 16, generator=g) for _ in range(3))
    got, want = compiled(q, k, v), _attention(q, k, v)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))
    report = compiled.explain()
    assert ": gensorage: " in report and "stays in torch" not in report, report


def test_a_batch_of_one_builds_for_cuda() -> None:
    """The same loop in the CUDA build (compiled, not run: no GPU needed), and its llvm twin against float64."""
    from test_fused_cuda_build import _build_as_a_bundle

    p = Program(name="bmm_of_one")
    a, b = p.input("A", [1, 64, 48], "float32"), p.input("B", [1, 48, 40], "float32")
    p.output(p.exp(p.matmul(a, b)))
    res = subgraph.compiled(p, subgraph.Options(hw="h200"))
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(1, 64, 48, generator=g), 0.1 * torch.randn(1, 48, 40, generator=g)
    (out,) = run_on_device(res, [x, w])
    ref = torch.exp(x.double() @ w.double())
    assert float((out.double() - ref).abs().max() / ref.abs().max()) < 1e-5
    assert "_kernel(" in _build_as_a_bundle(res.compiled.ugraph)

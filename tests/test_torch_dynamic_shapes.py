"""``torch.compile(model, backend="gensorage")`` with dynamo's own ``dynamic`` setting: from the second new shape
on, dynamo captures the graph with symbolic sizes, and the backend partitions it again at each call's shapes
(:mod:`gensorage.torch.per_shape`) instead of leaving every op in torch."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import gensorage  # noqa: E402, F401  (registers the backend)
from gensorage.torch import per_shape  # noqa: E402


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENSORAGE_HOME", str(tmp_path / "home"))


def attention_like(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Sizes taken from the input (``view`` with ``s``), a matmul, a transpose, a softmax and causal SDPA (whose
    aten op has outputs nothing reads)."""
    b, s, h = x.shape
    y = (x @ w).view(b, s, 2, h // 2).transpose(1, 2)
    p = torch.softmax(y @ y.transpose(-1, -2) / 4.0, dim=-1)
    return F.scaled_dot_product_attention(y, y, p @ y, is_causal=True)


def test_symbolic_graph_is_partitioned_at_each_shape(capsys: pytest.CaptureFixture[str]) -> None:
    torch._dynamo.reset()
    compiled = torch.compile(attention_like, backend="gensorage", options={"explain": True})
    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, 8, generator=g)
    with torch.no_grad():
        for s in (4, 5, 7, 5, 11):  # from 5 on dynamo's graph has a symbolic length; 5 twice: cached
            x = torch.randn(2, s, 8, generator=g) * 3.0
            got, want = compiled(x, w), attention_like(x.double(), w.double())
            assert got.dtype == torch.float32 and got.shape == want.shape
            assert ((got.double() - want).abs().max() / want.abs().max()).item() < 1e-3
    torch._dynamo.reset()
    said = capsys.readouterr().err
    assert said.count("specialised to its inputs' shapes") == 3, said  # 5, 7, 11: the second 5 is cached
    assert "  torch (" not in said, said  # no op left in torch (a symbolic size was the reason before)
    assert "stays in torch" not in said, said  # every subgraph's kernels used
    graphs = [ln for ln in said.splitlines() if "ops in gensorage subgraphs" in ln]
    assert len(graphs) == 4 and all(not ln.split(": ")[1].startswith("0 of") for ln in graphs), said


def test_shape_key_separates_strides_and_dtypes() -> None:
    x = torch.randn(3, 4)
    assert per_shape.shape_key([x]) == per_shape.shape_key([torch.randn(3, 4)])
    assert per_shape.shape_key([x]) != per_shape.shape_key(
        [x.t().contiguous().t()]
    )  # same shape, other strides
    assert per_shape.shape_key([x]) != per_shape.shape_key([x.half()])
    assert per_shape.shape_key([x, 5]) != per_shape.shape_key([x, 6])


def test_specialisation_failure_runs_the_graph_in_torch(capsys: pytest.CaptureFixture[str]) -> None:
    """A graph make_fx cannot trace runs as captured (torch's answer), with the reason reported."""
    from gensorage.torch.report import Report

    def broken(*args: object) -> object:
        raise RuntimeError("cannot trace this")

    gm = torch.fx.symbolic_trace(lambda x: F.relu(x) + 1)
    report = Report()
    calls = per_shape.PerShape(gm, lambda g: g, report)
    calls.gm = torch.fx.symbolic_trace(lambda x: F.relu(x) + 1)
    real = per_shape.make_fx
    per_shape.make_fx = lambda *a, **k: broken  # type: ignore[assignment]
    try:
        x = torch.randn(3)
        assert torch.equal(calls(x), F.relu(x) + 1)
    finally:
        per_shape.make_fx = real
    assert "runs in torch at [[3]]: cannot trace this" in report.text()


class _VitBlock(torch.nn.Module):
    """A ViT block (LayerNorm with eps 1e-6, a fused qkv split by ``reshape(B, T, 3, heads, C // heads)`` and
    ``unbind``, SDPA, GELU): under ``dynamic=True`` dynamo restarts its analysis once
    (``TensorifyScalarRestartAnalysis``, a float scalar made a tensor) from inside the backend."""

    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.n1, self.n2 = torch.nn.LayerNorm(d, eps=1e-6), torch.nn.LayerNorm(d, eps=1e-6)
        self.qkv, self.o = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.m1, self.m2 = torch.nn.Linear(d, 2 * d), torch.nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        qkv = self.qkv(self.n1(x)).reshape(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        x = x + self.o(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, c))
        return x + self.m2(F.gelu(self.m1(self.n2(x))))


def test_dynamos_restart_from_inside_the_backend_is_no_failure(capsys: pytest.CaptureFixture[str]) -> None:
    # The restart is dynamo's control flow: the backend let it through, and the restarted trace runs in
    # gensorage (before, it was reported as "gensorage's backend failed" and the graph ran in torch).
    torch._dynamo.reset()
    torch.manual_seed(0)
    block = _VitBlock().eval()
    compiled = torch.compile(block, backend="gensorage", dynamic=True, options={"explain": True})
    x = torch.randn(1, 5, 32)
    with torch.no_grad():
        assert torch.allclose(compiled(x), block(x), rtol=1e-4, atol=1e-5)
    err = capsys.readouterr().err
    assert "backend failed" not in err and "ops in gensorage subgraphs" in err, err

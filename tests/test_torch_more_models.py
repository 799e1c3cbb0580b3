"""More architectures through the torch front end, as their authors write them: a Gemma-style block (RMSNorm
scaled by ``1 + weight``, the embedding scale √d, GQA by ``expand`` + ``reshape`` with a head dim that is not
hidden / heads, soft-capped scores ``tanh(s / c) · c``, a tanh-GELU gated MLP) and cross-attention (queries and
keys of different lengths) with an additive padding mask of ``finfo.min``, batch 2.

Each compares with the model in float64 and checks from the report that everything ran in gensorage.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from test_torch_frontend import assert_close, gensorage_subgraphs  # noqa: E402
from test_torch_new_models import _all_in_gensorage  # noqa: E402
from torch import nn  # noqa: E402

import gensorage.torch as gtorch  # noqa: E402


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENSORAGE_HOME", str(tmp_path / "home"))


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: in float32, scaled by ``1 + weight`` (the weight starts at 0), cast back."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(0.1 * torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return (h * (1.0 + self.weight.float())).type_as(x)


class GemmaBlock(nn.Module):
    def __init__(
        self, hidden: int = 40, heads: int = 4, kv_heads: int = 2, head_dim: int = 16, cap: float = 30.0
    ) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.cap = heads, kv_heads, head_dim, cap
        self.scale = hidden**0.5
        self.n1, self.n2 = GemmaRMSNorm(hidden), GemmaRMSNorm(hidden)
        self.q = nn.Linear(hidden, heads * head_dim, bias=False)
        self.kv = nn.Linear(hidden, 2 * kv_heads * head_dim, bias=False)
        self.o = nn.Linear(heads * head_dim, hidden, bias=False)
        self.gate_up = nn.Linear(hidden, 2 * 72, bias=False)
        self.down = nn.Linear(72, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        x = x * self.scale
        h = self.n1(x)
        q = self.q(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(h).view(b, t, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        groups = self.heads // self.kv_heads
        k, v = (z[:, :, None].expand(b, self.kv_heads, groups, t, self.head_dim) for z in (k, v))
        k, v = (z.reshape(b, self.heads, t, self.head_dim) for z in (k, v))
        s = q @ k.transpose(-1, -2) * self.head_dim**-0.5
        s = torch.tanh(s / self.cap) * self.cap
        a = torch.softmax(s, dim=-1) @ v
        x = x + self.o(a.transpose(1, 2).reshape(b, t, -1))
        gate, up = self.gate_up(self.n2(x)).chunk(2, dim=-1)
        return x + self.down(F.gelu(gate, approximate="tanh") * up)


def test_gemma_style_block_in_bfloat16() -> None:
    """``1 + weight``, GQA by expand + reshape (head dim 16 with hidden 40), scores soft-capped at 5 with the
    queries scaled ×16 (the cap changes the output by 2.8 %, more than the tolerance): one gensorage subgraph,
    within 2e-2 of float64."""
    dtype = torch.bfloat16
    torch.manual_seed(20)
    model = GemmaBlock(cap=5.0).eval()
    with torch.no_grad():
        model.q.weight.mul_(16.0)
    exact = copy.deepcopy(model).double()
    model.to(dtype)
    x = torch.randn(2, 7, 40, generator=torch.Generator().manual_seed(21))
    compiled = gtorch.compile(model)
    with torch.no_grad():
        got = compiled(x.to(dtype))
        want = exact(x.double())
    assert got.dtype == dtype
    assert_close(got, want, 2e-2)
    report = compiled.explain()
    _all_in_gensorage(report)
    assert len(gensorage_subgraphs(report)) == 1, report


class CrossAttention(nn.Module):
    """Encoder-decoder attention: queries from ``x``, keys and values from ``memory`` (another length), padded
    memory positions masked by ``(1 - keep) · finfo(dtype).min`` as HF writes it."""

    def __init__(self, hidden: int = 40, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.kv = nn.Linear(hidden, hidden), nn.Linear(hidden, 2 * hidden)
        self.o = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        m, hd = memory.shape[1], d // self.heads
        q = self.q(x).view(b, t, self.heads, hd).transpose(1, 2)
        k, v = self.kv(memory).view(b, m, 2, self.heads, hd).permute(2, 0, 3, 1, 4)
        mask = (1.0 - keep[:, None, None, :]) * torch.finfo(x.dtype).min
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + mask, dim=-1) @ v
        return x + self.o(a.transpose(1, 2).reshape(b, t, d))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cross_attention_with_a_padding_mask(dtype: torch.dtype) -> None:
    """5 queries against 6 keys, batch 2, the second padded after 4. In bfloat16 the mask (a reshape of a 16-bit
    input flowing only into exp) was stored as float32 while the kernels read the 16-bit tensor, so the padded
    keys got weight: the check against torch caught it and the block stayed in torch."""
    torch.manual_seed(22)
    model = CrossAttention().eval()
    exact = copy.deepcopy(model).double()
    model.to(dtype)
    g = torch.Generator().manual_seed(23)
    x, memory, keep = torch.randn(2, 5, 40, generator=g), torch.randn(2, 6, 40, generator=g), torch.ones(2, 6)
    keep[1, 4:] = 0.0
    compiled = gtorch.compile(model)
    with torch.no_grad():
        got = compiled(x.to(dtype), memory.to(dtype), keep.to(dtype))
        want = exact(x.double(), memory.double(), keep.double())
    assert got.dtype == dtype
    assert_close(got, want, 1e-3 if dtype == torch.float32 else 2e-2)
    report = compiled.explain()
    _all_in_gensorage(report)
    assert len(gensorage_subgraphs(report)) == 1, report


class SlidingWindowAttention(nn.Module):
    """Mistral's sliding-window causal mask, built in the graph from ``tril`` of a boolean ``ones``, ``&``, ``~``
    and ``where``: key j is seen by query i when ``i - window < j <= i``."""

    def __init__(self, hidden: int = 40, heads: int = 4, window: int = 3) -> None:
        super().__init__()
        self.heads, self.window = heads, window
        self.qkv, self.o = nn.Linear(hidden, 3 * hidden, bias=False), nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        ones = torch.ones(t, t, dtype=torch.bool, device=x.device)
        seen = torch.tril(ones) & ~torch.tril(ones, diagonal=-self.window)
        mask = torch.where(seen, 0.0, float("-inf")).to(x.dtype)
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // self.heads) + mask, dim=-1) @ v
        return x + self.o(a.transpose(1, 2).reshape(b, t, d))


def test_a_sliding_window_mask_is_built_in_torch_and_applied_in_gensorage() -> None:
    """The boolean mask's construction has no IR ops (booleans, a select), so it stays in torch with a reason per
    op; the float mask it yields enters the one gensorage subgraph as an input, and the answer is eager's."""
    torch.manual_seed(24)
    model = SlidingWindowAttention().eval()
    x = torch.randn(2, 7, 40, generator=torch.Generator().manual_seed(25))
    compiled = gtorch.compile(model)
    with torch.no_grad():
        assert_close(compiled(x), model(x), 1e-3)
    report = compiled.explain()
    for reason in (
        "aten.tril.default: no gensorage lowering",
        "aten.bitwise_and.Tensor: no gensorage lowering",
        "aten.where.self: a select by a boolean mask",
    ):
        assert reason in report, report
    assert len(gensorage_subgraphs(report)) == 1 and "stays in torch" not in report, report

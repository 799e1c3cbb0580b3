"""Forms the other front-end tests do not reach: a ViT block (conv patch embedding, a class token, torch's
MultiheadAttention, GELU MLP), a ConvNeXt block (depthwise conv, LayerNorm over channels-last, a layer scale),
BERT attention masks from a 0/1 integer ``attention_mask`` (additive ``finfo.min``, and SDPA's boolean mask),
an embedding tied to the output head, ``F.pad`` and Bloom's ``baddbmm(empty, q, k, beta=0)`` (torch ignores the
uninitialised input at ``beta=0``: a NaN there must not reach the scores).

Each runs through ``gensorage.torch.compile`` next to eager torch (float32) and checks that gensorage ran the
computation and that what stayed in torch is what cannot lower (convolutions, the mask's comparison, ...).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from test_torch_frontend import gensorage_subgraphs  # noqa: E402
from torch import nn  # noqa: E402

import gensorage.torch as gtorch  # noqa: E402


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENSORAGE_HOME", str(tmp_path / "home"))


def _compare(model: Callable[..., Any], *args: Any) -> str:
    """``model`` compiled agrees with eager within 1e-5 of the largest value, with no subgraph left in torch and
    at least one in gensorage; the report."""
    compiled = gtorch.compile(model)
    with torch.no_grad():
        got, want = compiled(*args), model(*args)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
    report = compiled.explain()
    assert gensorage_subgraphs(report) and "stays in torch" not in report, report
    return report


class ViTBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, 32, 4, 4)
        self.cls = nn.Parameter(torch.randn(1, 1, 32))
        self.ln1, self.ln2 = nn.LayerNorm(32), nn.LayerNorm(32)
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True)
        self.fc1, self.fc2 = nn.Linear(32, 64), nn.Linear(64, 32)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch(images).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls.expand(x.shape[0], -1, -1), x), dim=1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class ConvNeXtBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dw = nn.Conv2d(16, 16, 7, padding=3, groups=16)
        self.ln = nn.LayerNorm(16)
        self.pw1, self.pw2 = nn.Linear(16, 64), nn.Linear(64, 16)
        self.gamma = nn.Parameter(0.1 * torch.ones(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dw(x).permute(0, 2, 3, 1)  # channels last: the norm and the MLP act per pixel
        y = self.pw2(F.gelu(self.pw1(self.ln(y)))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


def test_vit_block() -> None:
    torch.manual_seed(0)
    report = _compare(ViTBlock().eval(), torch.randn(2, 3, 8, 8))
    assert "convolution" in report, report  # the patch embedding stays in torch, with its reason


def test_convnext_block() -> None:
    torch.manual_seed(0)
    report = _compare(ConvNeXtBlock().eval(), torch.randn(2, 16, 8, 8))
    assert "convolution" in report, report


class BertAttention(nn.Module):
    def __init__(self, sdpa: bool) -> None:
        super().__init__()
        self.sdpa = sdpa
        self.qkv, self.out, self.ln = nn.Linear(32, 96), nn.Linear(32, 32), nn.LayerNorm(32)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 4, 8).permute(2, 0, 3, 1, 4)
        keep = attention_mask[:, None, None, :]
        if self.sdpa:
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=keep.bool())
        else:  # HF's extended mask: 0 where kept, the dtype's least value where padded
            bias = (1.0 - keep.to(x.dtype)) * torch.finfo(x.dtype).min
            a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(8) + bias, dim=-1) @ v
        return self.ln(x + self.out(a.transpose(1, 2).reshape(b, t, 32)))


@pytest.mark.parametrize("sdpa", [False, True])
def test_bert_padding_mask_from_integer_attention_mask(sdpa: bool) -> None:
    torch.manual_seed(1)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    _compare(BertAttention(sdpa).eval(), torch.randn(2, 6, 32), mask)


class TiedHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.ln = nn.Embedding(50, 16), nn.LayerNorm(16)
        self.head = nn.Linear(16, 50, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln(self.emb(ids)))


def _bloom_scores(x: torch.Tensor, y: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
    scores = torch.baddbmm(torch.full((2, 4, 6), float("nan")), x, y, beta=0.0, alpha=0.25)
    return torch.softmax(scores, dim=-1) + F.pad(pad, (1, 2)) * 2.0


def test_tied_head_pad_and_baddbmm_at_beta_zero() -> None:
    torch.manual_seed(2)
    model = TiedHead().eval()
    _compare(model, torch.randint(0, 50, (2, 5)))
    with torch.no_grad():
        model.emb.weight.mul_(0.5)  # both uses see it: one tensor
        _compare(model, torch.randint(0, 50, (2, 5)))
    _compare(_bloom_scores, torch.randn(2, 4, 8), torch.randn(2, 8, 6), torch.randn(2, 4, 3))

"""The LLaMA-style layer's KV-cache decode step through ``gensorage.torch.compile``, and the layer at LLaMA-3-8B's
shapes (a slow test).

Decode: one new token; its K and V are concatenated to the cache's (``cat``) and its query attends to every key
without a mask; the step returns the layer's output and the grown cache. Each output is judged against its own
largest reference magnitude, and every shape is checked again on a fresh random draw after the one it was
compiled and checked on (a kernel that is right only for the first inputs, or that leaves an output stale, fails).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from test_torch_frontend import (  # noqa: E402
    DecoderLayer,
    assert_close,
    gensorage_subgraphs,
    layer_inputs,
    rope,
    rotate_half,
)

import gensorage.torch as gtorch  # noqa: E402
from gensorage.torch import subgraph  # noqa: E402


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENSORAGE_HOME", str(tmp_path / "home"))


class DecodeStep(DecoderLayer):
    """The layer for one new token with a KV cache: returns the output and the cache with the token's K/V."""

    def forward(  # type: ignore[override]
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        past_k: torch.Tensor,
        past_v: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, t, _ = x.shape
        h = self.attn_norm(x)
        q = self.q(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = torch.cat((past_k, k), dim=2), torch.cat((past_v, v), dim=2)
        groups = self.heads // self.kv_heads
        a = F.scaled_dot_product_attention(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1))
        x = x + self.o(a.transpose(1, 2).reshape(b, t, -1))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h)), k, v


def decode_inputs(past: int, dtype: torch.dtype, seed: int, *, hidden: int = 64, heads: int = 4, kv: int = 2):  # type: ignore[no-untyped-def]
    """A token at position ``past`` (its RoPE row) and a cache of ``past`` keys and values per kv head."""
    g = torch.Generator().manual_seed(seed)
    dim = hidden // heads
    x = 3.0 * torch.randn(1, 1, hidden, generator=g)
    cos, sin = (r[past : past + 1] for r in rope(past + 1, dim, torch.float64))
    past_k = 2.0 * torch.randn(1, kv, past, dim, generator=g)  # RoPE'd keys: a few units
    past_v = 0.5 * torch.randn(1, kv, past, dim, generator=g)
    return tuple(a.to(dtype) for a in (x, cos, sin, past_k, past_v))


def assert_outputs_close(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...], rel: float) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        assert_close(g, w, rel)  # each output against its own largest reference value


def test_decode_step_float32_two_cache_lengths(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two cache lengths in one process, float32 within 1e-3 of eager, each on a second draw too (no new search)."""
    torch.manual_seed(10)
    step = DecodeStep().eval()
    compiled = gtorch.compile(step)
    monkeypatch.setattr(subgraph, "_DISPATCHERS", {})
    stats = subgraph.dispatcher(subgraph.Options()).stats
    with torch.no_grad():
        for past in (8, 12):
            args = decode_inputs(past, torch.float32, seed=past)
            assert_outputs_close(compiled(*args), step(*args), 1e-3)
            built = (stats.new_structures, stats.new_shapes)
            fresh = decode_inputs(past, torch.float32, seed=100 + past)
            assert_outputs_close(compiled(*fresh), step(*fresh), 1e-3)
            assert (stats.new_structures, stats.new_shapes) == built  # nothing searched or built again
    assert stats.new_structures == 1 and stats.new_shapes == 1, stats  # the second length reuses the µGraph
    report = compiled.explain()
    assert len(gensorage_subgraphs(report)) == 2, report  # the whole step, once per cache length
    assert "no gensorage lowering" not in report and "stays in torch" not in report, report


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decode_step_16_bit(dtype: torch.dtype) -> None:
    """float16/bfloat16 within 2e-2 of the step computed in float64 (eager in ``dtype`` too), on two draws."""
    torch.manual_seed(11)
    step = DecodeStep().eval()
    exact = copy.deepcopy(step).double()
    compiled = gtorch.compile(step.to(dtype))
    with torch.no_grad():
        for seed in (1, 2):
            args = decode_inputs(8, dtype, seed=seed)
            want = exact(*(a.double() for a in args))
            got = compiled(*args)
            assert all(o.dtype == dtype for o in got)
            assert_outputs_close(got, want, 2e-2)
            assert_outputs_close(step(*args), want, 2e-2)
    assert len(gensorage_subgraphs(compiled.explain())) == 1, compiled.explain()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_prefill_16_bit_on_a_fresh_draw(dtype: torch.dtype) -> None:
    """Prefill in 16 bits: the kernels checked on the first draw stay within 2e-2 of float64 on a second."""
    torch.manual_seed(12)
    layer = DecoderLayer().eval()
    exact = copy.deepcopy(layer).double()
    compiled = gtorch.compile(layer.to(dtype))
    with torch.no_grad():
        for seed in (21, 22):
            args = layer_inputs(8, dtype, seed=seed)
            assert_close(compiled(*args), exact(*(a.double() for a in args)), 2e-2)
    assert len(gensorage_subgraphs(compiled.explain())) == 1, compiled.explain()


@pytest.mark.slow
def test_llama3_8b_layer_shapes_float32() -> None:
    """The layer at LLaMA-3-8B's config (hidden 4096, 32 heads, 8 kv heads, head dim 128, MLP 14336) on 16 tokens,
    then a decode step against a 16-key cache: float32 within 1e-3 of eager, each on a second draw too."""
    torch.manual_seed(13)
    shape = {"hidden": 4096, "heads": 32, "kv_heads": 8, "ffn": 14336}
    layer = DecoderLayer(**shape).eval()
    step = DecodeStep(**shape).eval()
    step.load_state_dict(layer.state_dict())
    prefill, decode = gtorch.compile(layer), gtorch.compile(step)
    with torch.no_grad():
        for seed in (31, 32):
            g = torch.Generator().manual_seed(seed)
            x = 3.0 * torch.randn(1, 16, 4096, generator=g)
            args = (x, *rope(16, 128, torch.float32))
            assert_close(prefill(*args), layer(*args), 1e-3)
            args = decode_inputs(16, torch.float32, seed=seed, hidden=4096, heads=32, kv=8)
            assert_outputs_close(decode(*args), step(*args), 1e-3)
    for compiled in (prefill, decode):
        assert len(gensorage_subgraphs(compiled.explain())) == 1, compiled.explain()

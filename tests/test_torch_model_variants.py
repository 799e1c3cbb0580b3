"""Architectures and uses the other front-end tests do not reach: Phi's partial rotary with attention and MLP in
parallel off one LayerNorm, GPT-J's interleaved rotary (step-2 slices), Qwen3's per-head q/k RMSNorm with SDPA's
own GQA (``enable_gqa``), a top-k mixture of experts by gather and a dense one by ``torch.stack``, token ids
through an embedding, BatchNorm and GroupNorm after a convolution, dropout in training mode,
``torch.inference_mode`` and an empty sequence.

Each compares with eager torch (in 16 bits, with the model in float64) and checks from the report what ran where.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from test_torch_frontend import assert_close, gensorage_subgraphs, rope, rotate_half  # noqa: E402
from test_torch_new_models import RMSNorm32, _all_in_gensorage  # noqa: E402
from torch import nn  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

import gensorage  # noqa: E402
import gensorage.torch as gtorch  # noqa: E402
from gensorage.baselines.torch_eager import TorchArith  # noqa: E402
from gensorage.errors import UnsupportedOpError  # noqa: E402
from gensorage.torch.subgraph import lower  # noqa: E402


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENSORAGE_HOME", str(tmp_path / "home"))


def _activations(shape: tuple[int, ...], seed: int, outlier: int) -> torch.Tensor:
    """N(0, 1) activations with one channel at |x| ~ 300 (LLaMA's massive activations)."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    x[..., outlier] *= 300.0
    return x


class PhiBlock(nn.Module):
    """Phi-2 / GPT-J: one LayerNorm feeds attention and the MLP in parallel; RoPE on the first ``rot`` dims of
    each head, the rest passed through; a causal mask built by ``full(-inf).triu(1)``."""

    def __init__(self, hidden: int = 32, heads: int = 2, rot: int = 4) -> None:
        super().__init__()
        self.heads, self.head_dim, self.rot = heads, hidden // heads, rot
        self.ln = nn.LayerNorm(hidden)
        self.qkv, self.dense = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.fc1, self.fc2 = nn.Linear(hidden, 2 * hidden), nn.Linear(2 * hidden, hidden)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.ln(x)
        q, k, v = self.qkv(h).view(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        r = self.rot
        q = torch.cat((q[..., :r] * cos + rotate_half(q[..., :r]) * sin, q[..., r:]), dim=-1)
        k = torch.cat((k[..., :r] * cos + rotate_half(k[..., :r]) * sin, k[..., r:]), dim=-1)
        mask = torch.full((t, t), float("-inf"), dtype=x.dtype).triu(1)
        s = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim) + mask
        attn = self.dense((torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(b, t, d))
        return x + attn + self.fc2(F.gelu(self.fc1(h), approximate="tanh"))


def test_phi_partial_rotary_parallel_block_in_float16() -> None:
    """Rotary slices of 4 of a head's 16 dims, cat with the 12 others; an outlier channel at |x| ~ 300. Only
    the mask's construction stays in torch."""
    dtype = torch.float16
    torch.manual_seed(30)
    model = PhiBlock().eval()
    exact = copy.deepcopy(model).double()
    model.to(dtype)
    x, (cos, sin) = _activations((1, 7, 32), seed=31, outlier=3), rope(7, 4, torch.float64)
    compiled = gtorch.compile(model)
    with torch.no_grad():
        got = compiled(*(a.to(dtype) for a in (x, cos, sin)))
        want = exact(x.double(), cos, sin)
    assert got.dtype == dtype
    assert_close(got, want, 2e-2)
    report = compiled.explain()
    for op in ("aten.full.default", "aten.triu.default"):
        assert f"{op}: no gensorage lowering" in report, report
    assert len(gensorage_subgraphs(report)) == 1 and "stays in torch" not in report, report


class GPTJAttention(nn.Module):
    """GPT-J's interleaved rotary: ``rotate_every_two`` pairs dims (0, 1), (2, 3), ... by step-2 slices,
    ``stack`` and ``flatten``; cos and sin repeat each angle twice."""

    def __init__(self, hidden: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.qkv, self.o = nn.Linear(hidden, 3 * hidden, bias=False), nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)

        def rotate_every_two(z: torch.Tensor) -> torch.Tensor:
            return torch.stack((-z[..., 1::2], z[..., ::2]), dim=-1).flatten(-2)

        q, k = q * cos + rotate_every_two(q) * sin, k * cos + rotate_every_two(k) * sin
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.o(a.transpose(1, 2).reshape(b, t, d))


def test_gptj_interleaved_rotary_by_step_2_slices() -> None:
    """The step-2 slices lower (a window reshaped to pairs, one column of them), so does the stack: the block is
    one gensorage subgraph (the slices and stacks were 8 ops in torch between three)."""
    torch.manual_seed(48)
    model = GPTJAttention().eval()
    x = torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(49))
    inv = 1.0 / 10000 ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    angles = torch.outer(torch.arange(6, dtype=torch.float64), inv).repeat_interleave(2, dim=-1)
    cos, sin = angles.cos().float(), angles.sin().float()
    compiled = gtorch.compile(model)
    with torch.no_grad():
        assert_close(compiled(x, cos, sin), model(x, cos, sin), 1e-3)
    report = compiled.explain()
    _all_in_gensorage(report)
    assert len(gensorage_subgraphs(report)) == 1, report


@pytest.mark.parametrize("seed", [48, 52])
def test_gptj_attention_in_float16_is_as_accurate_as_eager(seed: int) -> None:
    """Against the float64 model (the residual taken out): the row-fused softmax's probabilities stay float16,
    so P·V and the o-projection multiply float16 operands. They were float32, so both matmuls multiplied in
    bfloat16: 2.8e-3 to 3.9e-3 where eager is 0.9e-3 to 1.4e-3 (dev, 2026-11-28); now eager's level."""
    torch.manual_seed(seed)
    model = GPTJAttention().eval()
    exact = copy.deepcopy(model).double()
    model.half()
    x = torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(seed + 1))
    inv = 1.0 / 10000 ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    angles = torch.outer(torch.arange(6, dtype=torch.float64), inv).repeat_interleave(2, dim=-1)
    cos, sin = angles.cos(), angles.sin()

    def error(got: torch.Tensor, want: torch.Tensor) -> float:
        return float((got.double() - want).norm() / want.norm())

    with torch.no_grad():
        want = exact(x.double(), cos, sin) - x.double()
        args = (x.half(), cos.half(), sin.half())
        ours = error(gtorch.compile(model)(*args) - args[0], want)
        eager = error(model(*args) - args[0], want)
    assert ours < 1.5 * eager, (ours, eager)


@settings(deadline=None, max_examples=60)
@given(
    dim=st.integers(0, 2),
    start=st.none() | st.integers(-9, 9),
    end=st.none() | st.integers(-9, 12),
    step=st.integers(1, 5),
)
def test_a_strided_slice_lowers_to_its_elements_or_says_why(
    dim: int, start: int | None, end: int | None, step: int
) -> None:
    """Any slice of a 3 × 8 × 6 tensor of distinct values: its Program picks exactly torch's elements, or the
    lowering refuses it with a reason (no window of m × k elements fits, or nothing is picked)."""
    index = [slice(None)] * 3
    index[dim] = slice(start, end, step)
    gm = make_fx(lambda x: (x[tuple(index)] * 2,))(torch.zeros(3, 8, 6))
    x = torch.arange(3 * 8 * 6, dtype=torch.float64).reshape(3, 8, 6)
    try:
        lowered = lower(gm, "strided")
    except UnsupportedOpError as exc:
        n = x.shape[dim]
        picked = range(*slice(start, end, step).indices(n))
        assert not picked or picked.start + len(picked) * step > n, exc  # refused only where no window fits
        return
    (got,) = lowered.program.evaluate(TorchArith(torch), [x])
    assert torch.equal(got, x[tuple(index)] * 2)


class QKNormAttention(nn.Module):
    """Qwen3 / OLMo-2: RMSNorm over each head's dims on q and k before RoPE; SDPA repeats the kv heads itself."""

    def __init__(self, hidden: int = 48, heads: int = 4, kv_heads: int = 2, head_dim: int = 16) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q = nn.Linear(hidden, heads * head_dim, bias=False)
        self.kv = nn.Linear(hidden, 2 * kv_heads * head_dim, bias=False)
        self.o = nn.Linear(heads * head_dim, hidden, bias=False)
        self.qn, self.kn = RMSNorm32(head_dim), RMSNorm32(head_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.qn(self.q(x).view(b, t, self.heads, self.head_dim)).transpose(1, 2)
        k, v = self.kv(x).view(b, t, 2, self.kv_heads, self.head_dim).unbind(2)
        k, v = self.kn(k).transpose(1, 2), v.transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o(a.transpose(1, 2).reshape(b, t, -1))


def test_qk_norm_with_sdpas_own_gqa_in_bfloat16() -> None:
    """q scaled ×8 (logits up to ~40 before the norm evens them) and an outlier input channel: everything in one
    gensorage subgraph, within 2e-2 of float64."""
    dtype = torch.bfloat16
    torch.manual_seed(32)
    model = QKNormAttention().eval()
    with torch.no_grad():
        model.q.weight.mul_(8.0)
    exact = copy.deepcopy(model).double()
    model.to(dtype)
    x, (cos, sin) = _activations((2, 7, 48), seed=33, outlier=5), rope(7, 16, torch.float64)
    compiled = gtorch.compile(model)
    with torch.no_grad():
        got = compiled(*(a.to(dtype) for a in (x, cos, sin)))
        want = exact(x.double(), cos, sin)
    assert got.dtype == dtype
    assert_close(got, want, 2e-2)
    report = compiled.explain()
    _all_in_gensorage(report)
    assert len(gensorage_subgraphs(report)) == 1, report


class TopKExperts(nn.Module):
    """A Mixtral-style mixture of experts without a loop: the router's top-k picks each token's experts, whose
    SwiGLU weights are gathered by index and applied by einsum, weighted by the renormalised router weights."""

    def __init__(self, hidden: int = 32, ffn: int = 48, experts: int = 4, k: int = 2) -> None:
        super().__init__()
        self.k = k
        self.router = nn.Linear(hidden, experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts, ffn, hidden) / hidden**0.5)
        self.w3 = nn.Parameter(torch.randn(experts, ffn, hidden) / hidden**0.5)
        self.w2 = nn.Parameter(torch.randn(experts, hidden, ffn) / ffn**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        xf = x.reshape(-1, d)
        weights, picked = torch.topk(torch.softmax(self.router(xf), dim=-1), self.k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        w1, w3, w2 = self.w1[picked], self.w3[picked], self.w2[picked]  # [tokens, k, ...]
        h = F.silu(torch.einsum("nd,nkfd->nkf", xf, w1)) * torch.einsum("nd,nkfd->nkf", xf, w3)
        y = torch.einsum("nkf,nkdf->nkd", h, w2)
        return (y * weights[..., None]).sum(1).view(b, t, d)


def test_top_k_experts_route_in_torch_and_compute_in_gensorage() -> None:
    """The router's softmax and the experts' SwiGLU run in gensorage; ``topk`` (which experts: data) and the
    gathers by its int64 indices stay in torch, each with its reason."""
    torch.manual_seed(34)
    model = TopKExperts().eval()
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(35))
    compiled = gtorch.compile(model)
    with torch.no_grad():
        assert_close(compiled(x), model(x), 1e-3)
    report = compiled.explain()
    for reason in (
        "aten.topk.default: no gensorage lowering",
        "aten.index.Tensor: no gensorage lowering",
        "dtype torch.int64 (gensorage takes float32, float16, bfloat16)",
    ):
        assert reason in report, report
    assert len(gensorage_subgraphs(report)) == 2 and "stays in torch" not in report, report


class SoftExperts(nn.Module):
    """Every expert on every token, stacked and weighted by the router's softmax (a dense mixture)."""

    def __init__(self, hidden: int = 32, ffn: int = 48, experts: int = 3) -> None:
        super().__init__()
        self.router = nn.Linear(hidden, experts, bias=False)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(hidden, ffn), nn.SiLU(), nn.Linear(ffn, hidden)) for _ in range(experts)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = torch.softmax(self.router(x), dim=-1)
        return (torch.stack([e(x) for e in self.experts], dim=-2) * weights[..., None]).sum(-2)


def test_stacked_experts_run_in_one_subgraph() -> None:
    """``torch.stack`` lowers (a dim of 1 per part, then a concat): the router, the experts and their weighted
    sum are one gensorage subgraph (the stack split it in two, its own op in torch)."""
    torch.manual_seed(45)
    model = SoftExperts().eval()
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(46))
    compiled = gtorch.compile(model)
    with torch.no_grad():
        assert_close(compiled(x), model(x), 1e-3)
    report = compiled.explain()
    _all_in_gensorage(report)
    assert len(gensorage_subgraphs(report)) == 1, report


def test_stack_along_each_dim() -> None:
    """First, last and middle dims, one part, and 0-d parts (a ``(1,)`` tensor in a Program)."""

    def stacks(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.stack((a, b)) * 2,
            torch.stack((a, b, a), dim=-1).exp(),
            torch.stack((a,), 1) + 1,
            torch.stack((a.sum(), b.mean())) * 3,
        )

    a, b = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(47)).unbind()
    compiled = gtorch.compile(stacks)
    with torch.no_grad():
        for got, want in zip(compiled(a, b), stacks(a, b), strict=True):
            assert got.shape == want.shape
            assert_close(got, want, 1e-6)
    _all_in_gensorage(compiled.explain())


def test_a_concat_of_many_parts_builds() -> None:
    """A concat's kernel picks each element's part by halves: 120 parts (the strided-slice sweep made one of 174)
    nested one ``if`` per part past Python's 100 levels of indentation, and its TVMScript did not parse."""
    parts = 120
    p = gensorage.Program(name="many_parts")
    xs = [p.input(f"x{i}", (2, 1), "float32") for i in range(parts)]
    p.output(p.exp(p.concat(xs, 1)))
    res = gensorage.superoptimize(p, hw="h100", mode="fast", use_store=False, progress=False)
    arrays = [np.full((2, 1), i / parts, dtype=np.float32) for i in range(parts)]
    (got,) = res.run(*arrays, target="cpu")
    np.testing.assert_allclose(got, np.exp(np.concatenate(arrays, axis=1)), rtol=1e-6)


def _conv_stem() -> nn.Module:
    stem = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.GroupNorm(2, 8), nn.Flatten(2)
    )
    with torch.no_grad():  # running statistics as after training, not the initial 0 and 1
        stem[1].running_mean.uniform_(-1.0, 1.0)
        stem[1].running_var.uniform_(0.5, 2.0)
    return stem


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batch_norm_in_eval_and_group_norm_after_a_conv(dtype: torch.dtype) -> None:
    """The convolution stays in torch; BatchNorm with its running statistics, ReLU and GroupNorm are one
    gensorage subgraph (both norms stayed in torch)."""
    torch.manual_seed(50)
    model = _conv_stem().eval()
    exact = copy.deepcopy(model).double()
    model.to(dtype)
    x = 3.0 * torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(51))
    compiled = gtorch.compile(model)
    with torch.no_grad():
        got = compiled(x.to(dtype))
        want = exact(x.double())
    assert got.dtype == dtype
    assert_close(got, want, 1e-3 if dtype == torch.float32 else 2e-2)
    report = compiled.explain()
    assert "graph 1: 6 of 7 ops in gensorage subgraphs" in report, report
    assert "aten.convolution.default: no gensorage lowering" in report, report
    assert len(gensorage_subgraphs(report)) == 1 and "stays in torch" not in report, report


def test_batch_norm_in_training_stays_in_torch() -> None:
    """In training BatchNorm normalises by the batch and updates its running statistics: torch's op, as eager."""
    torch.manual_seed(52)
    model, twin = _conv_stem().train(), _conv_stem().train()
    twin.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(53))
    compiled = gtorch.compile(model)
    with torch.no_grad():
        assert_close(compiled(x), twin(x), 1e-3)
    assert torch.allclose(model[1].running_mean, twin[1].running_mean)
    assert "aten._native_batch_norm_legit_functional.default: no gensorage lowering" in compiled.explain()


def test_an_input_returned_as_a_copy_leaves_the_rest_in_gensorage() -> None:
    """``x.clone()`` among the outputs is a Program output that is its input unchanged, which no Program has: the
    whole subgraph stayed in torch for it. Now the clone alone does, and stays a copy (not ``x`` itself)."""

    def f(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.softmax(x @ w, dim=-1), x.clone()

    g = torch.Generator().manual_seed(54)
    x, w = torch.randn(4, 16, generator=g), torch.randn(16, 8, generator=g)
    compiled = gtorch.compile(f)
    with torch.no_grad():
        probs, copied = compiled(x, w)
    assert_close(probs, f(x, w)[0], 1e-3)
    assert torch.equal(copied, x) and copied.data_ptr() != x.data_ptr()
    report = compiled.explain()
    assert "an input passed on unchanged (torch's copy of it)  [clone]" in report, report
    assert len(gensorage_subgraphs(report)) == 1 and "stays in torch" not in report, report


class Mlp(nn.Module):
    def __init__(self, d: int = 32, p: float = 0.0) -> None:
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(d), nn.Linear(d, 64), nn.Linear(64, d)
        self.drop = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.down(F.silu(self.up(self.norm(x)))))


def test_token_ids_through_an_embedding() -> None:
    """int64 ids: the lookup stays in torch (its table is float, its indices are not), the block after it runs
    in gensorage."""
    torch.manual_seed(36)
    model = nn.Sequential(nn.Embedding(50, 32), Mlp()).eval()
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(37))
    compiled = gtorch.compile(model)
    with torch.no_grad():
        assert_close(compiled(ids), model(ids), 1e-3)
    report = compiled.explain()
    assert "aten.embedding.default: no gensorage lowering" in report, report
    assert len(gensorage_subgraphs(report)) == 1 and "stays in torch" not in report, report


def test_dropout_in_training_mode_then_eval() -> None:
    """``train()`` with p = 0.5: dropout stays in torch and draws from torch's generator as eager does (the same
    seed drops the same units); ``eval()`` is another graph (dynamo guards ``training``) with no dropout."""
    torch.manual_seed(38)
    model = Mlp(p=0.5).train()
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(39))
    compiled = gtorch.compile(model)
    with torch.no_grad():
        torch.manual_seed(40)
        got = compiled(x)
        torch.manual_seed(40)
        assert_close(got, model(x), 1e-3)
        assert not torch.allclose(compiled(x), got)  # a new draw
        model.eval()
        assert_close(compiled(x), model(x), 1e-3)
    report = compiled.explain()
    assert "aten.native_dropout.default: no gensorage lowering" in report, report
    assert len(gensorage_subgraphs(report)) == 3, report  # around the dropout, then the eval graph's one


def test_inference_mode_and_no_grad() -> None:
    """Under ``torch.inference_mode`` (inference tensors in, out) as under ``no_grad``: gensorage's kernels."""
    torch.manual_seed(41)
    model = Mlp().eval()
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(42))
    compiled = gtorch.compile(model)
    with torch.inference_mode():
        got = compiled(x)
        assert got.is_inference()
    assert_close(got, model(x), 1e-3)
    with torch.no_grad():
        assert_close(compiled(x), model(x), 1e-3)
    report = compiled.explain()
    assert len(gensorage_subgraphs(report)) == 2 and "stays in torch" not in report, report


class CausalAttention(nn.Module):
    def __init__(self, hidden: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv, self.o = nn.Linear(hidden, 3 * hidden, bias=False), nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.o(a.transpose(1, 2).reshape(b, t, d))


def test_an_empty_sequence_stays_in_torch_and_the_next_length_does_not() -> None:
    """Length 0 gives eager's empty output, its ops in torch ("an empty dim"; what SDPA decomposes to at length 0
    may still make a small subgraph, checked like any); lengths 1 and 5 run wholly in gensorage."""
    torch.manual_seed(43)
    model = CausalAttention().eval()
    compiled = gtorch.compile(model)
    with torch.no_grad():
        for t in (0, 1, 5):
            x = torch.randn(2, t, 32, generator=torch.Generator().manual_seed(44 + t))
            got, want = compiled(x), model(x)
            assert got.shape == want.shape
            if t:
                assert_close(got, want, 1e-3)
    report = compiled.explain()
    assert "shape [2, 0, 32] (an empty dim)" in report, report
    for graph in (2, 3):  # lengths 1 and 5: every op in gensorage
        (line,) = [ln for ln in report.splitlines() if ln.startswith(f"graph {graph}: ")]
        taken, _, total = line.split(": ")[1].split(" ops")[0].partition(" of ")
        assert taken == total, report
    assert "stays in torch" not in report, report

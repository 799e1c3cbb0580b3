"""Models the other front-end tests do not use, as a demanding new user writes them: a GPT-2 block (fused qkv
then split, LayerNorm with bias, tanh GELU), a Qwen-style block (GQA by repeat_interleave, an additive mask, q/k
RMSNorm computed in float32, RoPE), a T5 block (softmax in float32 then cast back), a BERT encoder with a padding
mask, odd hidden sizes (40, 72) and 16-bit dtypes.

Each test compares with eager torch (and, in 16 bits, with the model in float64), checks the output's dtype (a
later torch op rejects a tensor of the wrong dtype), and checks from the report that the ops it is about ran in
gensorage, not in a silent torch fallback.
"""

from __future__ import annotations

import contextlib
import copy
import io
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from captured_programs import capturing  # noqa: E402
from test_torch_frontend import assert_close, gensorage_subgraphs  # noqa: E402
from torch import nn  # noqa: E402

import gensorage  # noqa: E402
import gensorage.torch as gtorch  # noqa: E402


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENSORAGE_HOME", str(tmp_path / "home"))


def test_an_output_reshaped_from_a_float32_intermediate_keeps_the_program_dtype() -> None:
    """A reshape is a view, it cannot cast: the value it passes to a float16 output is stored in float16 (its
    producer casts on store), not in the float32 the precision policy gives a division."""
    p = gensorage.Program(name="reshaped_output")
    x, y = p.input("X", (6, 8), "float16"), p.input("Y", (6, 8), "float16")
    p.output(p.reshape(p.div(x, y), (2, 3, 8)))
    res = gensorage.superoptimize(p, hw="h100", mode="fast", use_store=False, progress=False)
    xs = [a.astype(np.float16) for a in p.random_inputs(seed=0)]
    (got,) = res.run(*xs, target="cpu")
    assert got.dtype == np.float16 and got.shape == (2, 3, 8)
    np.testing.assert_allclose(got, p.run(*xs)[0], rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_layer_norm_then_linear_in_16_bit_returns_the_model_dtype(dtype: torch.dtype) -> None:
    """LayerNorm (a float32 division) then a linear on 3-d activations: the linear's output is a reshape of its
    2-d product, and it must come back in the model's dtype (it did not: float32 reached the next linear)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.LayerNorm(40), nn.Linear(40, 72), nn.ReLU(), nn.Linear(72, 40)).eval()
    exact = copy.deepcopy(model).double()
    model.to(dtype)
    x = 3.0 * torch.randn(2, 7, 40)
    compiled = gtorch.compile(model)
    with torch.no_grad():
        got = compiled(x.to(dtype))
        want = exact(x.double())
    assert got.dtype == dtype
    assert_close(got, want, 2e-2)
    report = compiled.explain()
    assert len(gensorage_subgraphs(report)) == 1 and "model raised" not in report, report


class GPT2Block(nn.Module):
    """GPT-2's block: LayerNorm with bias, a fused qkv linear split into q, k and v, causal SDPA, tanh GELU."""

    def __init__(self, hidden: int = 40, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.fc, self.out = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)
        self.drop = nn.Dropout(0.1)  # eval mode: the identity

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.proj(a.transpose(1, 2).contiguous().view(b, t, d)))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh")))


class T5Block(nn.Module):
    """T5's block: RMSNorm without mean subtraction computed in float32, a relative bias added to the scores,
    softmax in float32 then cast back, no 1/√d scale."""

    def __init__(self, hidden: int = 40, heads: int = 4, ffn: int = 72) -> None:
        super().__init__()
        self.heads = heads
        self.w1, self.w2 = (nn.Parameter(1 + 0.1 * torch.randn(hidden)) for _ in range(2))
        self.q, self.k, self.v, self.o = (nn.Linear(hidden, hidden, bias=False) for _ in range(4))
        self.wi, self.wo = nn.Linear(hidden, ffn, bias=False), nn.Linear(ffn, hidden, bias=False)

    def norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        var = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        return w * (x * torch.rsqrt(var + 1e-6)).to(w.dtype)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.norm(x, self.w1)
        q, k, v = (m(h).view(b, t, self.heads, -1).transpose(1, 2) for m in (self.q, self.k, self.v))
        p = F.softmax((q @ k.transpose(3, 2) + bias).float(), dim=-1).type_as(q)
        x = x + self.o((p @ v).transpose(1, 2).contiguous().view(b, t, d))
        return x + self.wo(F.relu(self.wi(self.norm(x, self.w2))))


class BertLayer(nn.Module):
    """A BERT encoder layer: one qkv projection unbound into q, k, v, an additive padding mask built from a
    0/1 mask by ``1 - mask`` (rsub), post-LayerNorm, exact GELU."""

    def __init__(self, hidden: int = 40, heads: int = 4, ffn: int = 72) -> None:
        super().__init__()
        self.heads = heads
        self.qkv, self.o = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.ln1, self.ln2 = nn.LayerNorm(hidden, eps=1e-12), nn.LayerNorm(hidden, eps=1e-12)
        self.f1, self.f2 = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        mask = (1.0 - keep[:, None, None, :]) * -10000.0
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = self.ln1(x + self.o(a.transpose(1, 2).reshape(b, t, d)))
        return self.ln2(x + self.f2(F.gelu(self.f1(x))))


def _all_in_gensorage(report: str) -> None:
    """Every op of every captured graph ran in a gensorage subgraph, none fell back."""
    graphs = [ln for ln in report.splitlines() if ln.startswith("graph ") and " ops in gensorage" in ln]
    assert graphs, report
    for ln in graphs:
        taken, _, total = ln.split(": ")[1].split(" ops")[0].partition(" of ")
        assert taken == total, report
    assert "stays in torch" not in report and "model raised" not in report, report


def test_gpt2_block_16_bit_runs_entirely_in_gensorage() -> None:
    """The fused qkv ``split`` (getitem of any part), tanh GELU, dropout in eval: before, the split and the tanh
    GELU stayed in torch and the block ran as three subgraphs."""
    torch.manual_seed(4)
    model = GPT2Block().eval()
    exact = copy.deepcopy(model).double()
    model.half()
    x = 3.0 * torch.randn(2, 7, 40)
    compiled = gtorch.compile(model)
    with torch.no_grad():
        got = compiled(x.half())
        want = exact(x.double())
    assert got.dtype == torch.float16
    assert_close(got, want, 2e-2)
    report = compiled.explain()
    _all_in_gensorage(report)
    assert len(gensorage_subgraphs(report)) == 1, report


def test_t5_block_casts_to_float32_and_back_stay_in_gensorage() -> None:
    """``x.float()`` … ``.to(x.dtype)`` around the norms and the softmax: a cast between the model's dtype and
    float32 lowers to nothing (kernels compute in float32), a float32 value that is only cast down enters the
    kernels cast, and a float32 output comes back in float32. The two products of a bfloat16 and a float32
    tensor (torch's type promotion) lower too: probed alone, their Program computes in float32 (they stayed in
    torch as "mixed with bfloat16")."""
    torch.manual_seed(5)
    model = T5Block().eval()
    exact = copy.deepcopy(model).double()
    model.to(torch.bfloat16)
    g = torch.Generator().manual_seed(6)
    x, bias = 3.0 * torch.randn(2, 5, 40, generator=g), torch.randn(1, 4, 5, 5, generator=g)
    torch._dynamo.reset()
    compiled = gtorch.compile(model)
    with torch.no_grad():
        got = compiled(x.bfloat16(), bias.bfloat16())
        want = exact(x.double(), bias.double())
    assert got.dtype == torch.bfloat16
    assert_close(got, want, 2e-2)
    report = compiled.explain()
    assert "_to_copy" not in report and "stays in torch" not in report, report
    assert "72 of 72 ops in gensorage" in report, report
    _all_in_gensorage(report)


def test_stacked_qkv_unbind_select_and_rsub() -> None:
    """The pieces of BERT's attention that stayed in torch, small: ``unbind`` of a stacked qkv, ``x[:, i]``
    (select) and ``1.0 - mask`` (rsub)."""

    def f(qkv: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        q, k, v = qkv.unbind(0)
        s = torch.softmax(q @ k.transpose(-1, -2) + (1.0 - keep[:, None, :]) * -1e4, dim=-1)
        return (s @ v)[:, -1] + qkv[1, :, 0]

    g = torch.Generator().manual_seed(15)
    qkv, keep = torch.randn(3, 2, 5, 8, generator=g), torch.ones(2, 5)
    keep[1, 3:] = 0.0
    compiled = gtorch.compile(f)
    with torch.no_grad():
        assert_close(compiled(qkv, keep), f(qkv, keep), 1e-3)
    _all_in_gensorage(compiled.explain())


@pytest.mark.slow
def test_bert_layer_with_a_padding_mask_through_the_registered_backend(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``unbind`` of the stacked q, k, v and ``1 - mask`` lower too; float32 within 1e-3 of eager."""
    torch.manual_seed(7)
    model = BertLayer().eval()
    x = torch.randn(2, 7, 40)
    keep = torch.ones(2, 7)
    keep[0, 5:] = 0.0
    compiled = torch.compile(model, backend="gensorage", dynamic=False, options={"explain": True})
    with torch.no_grad():
        assert_close(compiled(x, keep), model(x, keep), 1e-3)
    report = "\n".join(ln.removeprefix("gensorage: ") for ln in capsys.readouterr().err.splitlines())
    _all_in_gensorage(report)


class HandNorm(nn.Module):
    """A norm written by hand with ``var`` (biased and Bessel-corrected) and powers other than 2."""

    def __init__(self, hidden: int = 72) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True, unbiased=False)
        h = (x - mean) / torch.sqrt(var + 1e-5) + 1e-3 * x.var(dim=-1, keepdim=True)
        return self.proj(h) + 1e-4 * h.pow(3) - 0.1 * (h.pow(2) + 1.0).pow(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_hand_written_norm_with_var_and_powers(dtype: torch.dtype) -> None:
    """``var`` and ``pow(x, 3)``/``pow(x, -1)`` lower (they stayed in torch); one channel at 600 (massive
    activation)."""
    torch.manual_seed(8)
    model = HandNorm().eval()
    exact = copy.deepcopy(model).double()
    model.to(dtype)
    x = 2.0 * torch.randn(3, 11, 72)
    x[..., 7] = 600.0
    compiled = gtorch.compile(model)
    with torch.no_grad():
        got = compiled(x.to(dtype))
        want = exact(x.double())
    assert got.dtype == dtype
    assert_close(got, want, 1e-3 if dtype == torch.float32 else 2e-2)
    _all_in_gensorage(compiled.explain())


def test_a_fully_masked_row_gives_nan_where_torch_does() -> None:
    """softmax of a row that is all −inf is NaN in torch; the kernels give NaN at the same places, which the
    check against torch accepts (NaN ≠ NaN made it reject them)."""

    def f(s: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.softmax(s + mask, dim=-1)

    s = torch.randn(2, 5, 5, generator=torch.Generator().manual_seed(9))
    mask = torch.zeros(5, 5)
    mask[0], mask[2:, 3:] = -torch.inf, -torch.inf
    compiled = gtorch.compile(f)
    with torch.no_grad():
        got, want = compiled(s, mask), f(s, mask)
    assert torch.equal(got.isnan(), want.isnan()) and got.isnan().any()
    assert_close(got.nan_to_num(), want.nan_to_num(), 1e-3)
    assert len(gensorage_subgraphs(compiled.explain())) == 1, compiled.explain()


def test_sigmoid_gate_at_large_magnitudes() -> None:
    """``sigmoid`` lowers in a form whose exps never overflow: a gate (GLU) and SiLU written by hand, inputs up
    to ±300 in bfloat16 (exp(300) overflows even float32)."""

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h = x @ w
        a, gate = h.chunk(2, dim=-1)
        return a * torch.sigmoid(gate) + x[..., :24] * torch.sigmoid(x[..., :24])

    g = torch.Generator().manual_seed(10)
    x = 3.0 * torch.randn(4, 40, generator=g)
    x[:, 3], x[:, 5] = 300.0, -300.0
    w = torch.randn(40, 48, generator=g) / 6.0
    compiled = gtorch.compile(f)
    with torch.no_grad():
        got = compiled(x.bfloat16(), w.bfloat16())
    assert got.dtype == torch.bfloat16
    assert_close(got, f(x.double(), w.double()), 2e-2)
    _all_in_gensorage(compiled.explain())


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qwen_style_block(dtype: torch.dtype) -> None:
    """GQA by repeat_interleave, q/k RMSNorm in float32 then cast back (HF's form), q/k/v biases, RoPE with
    rotate_half, an explicit additive causal mask, softmax in float32, SwiGLU; hidden 72 (6 heads of 12), batch
    1 at length 1 and batch 3 at length 13."""
    torch.manual_seed(11)
    model = QwenBlock().eval()
    exact = copy.deepcopy(model).double()
    model.to(dtype)
    compiled = gtorch.compile(model)
    for b, t in ((1, 1), (3, 13)):
        x = 3.0 * torch.randn(b, t, 72)
        x[..., 9] = 400.0  # a massive activation
        mask = torch.full((t, t), -torch.inf).triu(1)
        cos, sin = _rope(t, 12)
        with torch.no_grad():
            got = compiled(*(a.to(dtype) for a in (x, cos, sin, mask)))
            want = exact(*(a.double() for a in (x, cos, sin, mask)))
        assert got.dtype == dtype
        assert_close(got, want, 1e-3 if dtype == torch.float32 else 2e-2)
    _all_in_gensorage(compiled.explain())


def _rope(t: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / 10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(t, dtype=torch.float64), inv)
    return torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()


class RMSNorm32(nn.Module):
    """HF's RMSNorm: computed in float32, cast back to the input's dtype, then scaled."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32)
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)


class QwenBlock(nn.Module):
    def __init__(self, hidden: int = 72, heads: int = 6, kv_heads: int = 2, ffn: int = 100) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.n1, self.n2 = RMSNorm32(hidden), RMSNorm32(hidden)
        self.qn, self.kn = RMSNorm32(self.head_dim), RMSNorm32(self.head_dim)
        self.q = nn.Linear(hidden, heads * self.head_dim)
        self.k = nn.Linear(hidden, kv_heads * self.head_dim)
        self.v = nn.Linear(hidden, kv_heads * self.head_dim)
        self.o = nn.Linear(heads * self.head_dim, hidden, bias=False)
        self.gate, self.up = nn.Linear(hidden, ffn, bias=False), nn.Linear(hidden, ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.n1(x)
        q = self.qn(self.q(h).view(b, t, self.heads, self.head_dim)).transpose(1, 2)
        k = self.kn(self.k(h).view(b, t, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        half = self.head_dim // 2
        q = q * cos + torch.cat((-q[..., half:], q[..., :half]), -1) * sin
        k = k * cos + torch.cat((-k[..., half:], k[..., :half]), -1) * sin
        k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
        v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        s = q @ k.transpose(-1, -2) / self.head_dim**0.5 + mask
        a = torch.softmax(s.float(), dim=-1).to(q.dtype) @ v
        x = x + self.o(a.transpose(1, 2).reshape(b, t, -1))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def test_casts_that_do_not_undo_a_widening_stay_in_torch() -> None:
    """A float32 model that casts its result down to float16 keeps that cast in torch (its kernels compute the
    float32 part), with the reason; a float32 value computed in torch (a select by a boolean mask; a clamp lowers
    now) that the graph casts down enters the 16-bit kernels cast; a subgraph of a lone cast is layout only."""

    def down(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x @ w, dim=-1).half()

    def around(x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = torch.where(xf > 0.0, xf, -1.0).half()
        return torch.relu(y) + y.exp()

    g = torch.Generator().manual_seed(12)
    x, w = torch.randn(4, 16, generator=g), torch.randn(16, 8, generator=g)
    compiled = gtorch.compile(down)
    with torch.no_grad():
        got = compiled(x, w)
    assert got.dtype == torch.float16 and torch.equal(got, down(x, w))
    report = compiled.explain()
    assert "cast from torch.float32 to torch.float16 in a graph without that narrower dtype before" in report
    assert len(gensorage_subgraphs(report)) == 1, report

    compiled = gtorch.compile(around)
    with torch.no_grad():
        got = compiled(x.half())
    assert got.dtype == torch.float16
    assert_close(got, around(x.double()), 2e-2)
    report = compiled.explain()
    assert "layout only, no computation  [_to_copy]" in report and "stays in torch" not in report, report
    assert len(gensorage_subgraphs(report)) == 1, report


def test_alibi_scores_by_baddbmm_and_addmm_with_alpha_beta() -> None:
    """``baddbmm`` (Bloom's ALiBi scores) and ``addmm`` with alpha and beta lower; beta 0 ignores its input, NaN
    included, as torch does."""

    def alibi(q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        s = torch.baddbmm(bias, q, k.transpose(1, 2), beta=1.0, alpha=q.shape[-1] ** -0.5)
        return torch.softmax(s, dim=-1)

    def scaled(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, nan: torch.Tensor) -> torch.Tensor:
        return torch.addmm(b, x, w, beta=0.5, alpha=2.0).softmax(dim=0) + torch.addmm(nan, x, w, beta=0)

    g = torch.Generator().manual_seed(13)
    q, k, bias = (torch.randn(*s, generator=g) for s in ((2, 7, 8), (2, 7, 8), (2, 1, 7)))
    x, w, b = (torch.randn(*s, generator=g) for s in ((7, 8), (8, 5), (5,)))
    for f, args in ((alibi, (q, k, bias)), (scaled, (x, w, b, torch.full((5,), torch.nan)))):
        compiled = gtorch.compile(f)
        with torch.no_grad():
            assert_close(compiled(*args), f(*args), 1e-3)
        _all_in_gensorage(compiled.explain())


def _elementwise(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The new elementwise lowerings side by side (a variance too), one output each."""
    return (
        torch.sigmoid(x),
        F.gelu(x, approximate="tanh"),
        x.pow(3) / 1e6,
        (x.pow(2) + 1.0).pow(-1),
        x.var(-1, keepdim=True).expand_as(x) / 1e6,
    )


@pytest.fixture(scope="module")
def elementwise_program() -> gensorage.Program:
    """The Program the front end lowers :func:`_elementwise` to (captured; the kernels are not built)."""
    with capturing() as captured, torch.no_grad():
        gtorch.compile(_elementwise)(torch.randn(3, 8))
    (program,) = captured
    return program


@given(
    magnitude=st.floats(min_value=-2.0, max_value=3.0),
    values=st.lists(st.floats(min_value=-1.0, max_value=1.0), min_size=24, max_size=24),
)
def test_elementwise_lowerings_at_drawn_magnitudes(
    elementwise_program: gensorage.Program, magnitude: float, values: list[float]
) -> None:
    """sigmoid, tanh GELU, powers and var as lowered, run by the Program's float64 interpreter, against torch in
    float64, at magnitudes from 0.01 to 1,000: the forms never overflow into inf − inf or inf / inf."""
    x = torch.tensor(values, dtype=torch.float64).reshape(3, 8) * 10.0**magnitude
    outputs = elementwise_program.run(x.numpy())
    assert len(outputs) == 5
    for got, want in zip(outputs, _elementwise(x), strict=True):
        assert np.isfinite(got).all()
        scale = max(1.0, float(want.abs().max()))
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-9, atol=1e-12 * scale)


def test_size_arithmetic_is_reported_as_such(capsys: pytest.CaptureFixture[str]) -> None:
    """``torch.compile(backend="gensorage")`` as the README writes it (no ``dynamic=False``): a third shape makes
    dynamo capture symbolic shapes, whose size arithmetic (``operator.mul`` on sizes) stays in torch; the report
    says that rather than naming a ``<built-in function mul>``. The answers are torch's, right."""
    torch.manual_seed(14)
    model = nn.Sequential(nn.Linear(40, 72), nn.GELU(), nn.Linear(72, 40)).eval()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="gensorage", options={"explain": True})
    with torch.no_grad():
        for t in (5, 9, 13):
            x = torch.randn(2, t, 40)
            assert_close(compiled(x), model(x), 1e-3)
    report = capsys.readouterr().err
    assert "gensorage: graph 1:" in report and "<built-in function" not in report, report


class NewGELUMLP(nn.Module):
    """HF GPT-2's MLP with ``NewGELUActivation`` (``torch.tanh`` written out), inputs scaled by their absmax
    (``abs().amax``, as int8 quantisers do), and a 0-d auxiliary loss (``mean()`` over every dim)."""

    def __init__(self, hidden: int = 40) -> None:
        super().__init__()
        self.fc, self.proj = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x / x.abs().amax(-1, keepdim=True)
        h = self.fc(x)
        h = 0.5 * h * (1.0 + torch.tanh(0.7978845608028654 * (h + 0.044715 * torch.pow(h, 3.0))))
        out = self.proj(h)
        return out, out.pow(2).mean()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_new_gelu_absmax_and_a_0d_loss_run_in_gensorage(dtype: torch.dtype) -> None:
    """``tanh``, ``abs`` and a mean over every dim stayed in torch (the last as "shape []"); now the whole MLP is
    one gensorage subgraph, the loss comes back 0-d, through ``torch.compile(backend="gensorage")``."""
    torch.manual_seed(16)
    model = NewGELUMLP().eval()
    exact = copy.deepcopy(model).double()
    model.to(dtype)
    x = 3.0 * torch.randn(2, 9, 40)
    x[..., 4] = -500.0  # a massive activation: the absmax scale, tanh saturated
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="gensorage", dynamic=False, options={"explain": True})
    err = io.StringIO()
    with torch.no_grad(), contextlib.redirect_stderr(err):
        got = compiled(x.to(dtype))
    want = exact(x.double())
    assert [g.dtype for g in got] == [dtype, dtype] and got[1].shape == torch.Size([])
    for g, w in zip(got, want, strict=True):
        assert_close(g, w, 1e-3 if dtype == torch.float32 else 2e-2)
    report = "\n".join(ln.removeprefix("gensorage: ") for ln in err.getvalue().splitlines())
    _all_in_gensorage(report)
    assert len(gensorage_subgraphs(report)) == 1, report

"""The LLaMA decoder layer too large to check at its own shapes (issues 24/26): its row-fused direct µGraph is
checked at search shapes that shrink around the RoPE slice's pinned head_dim (:mod:`gensorage.superopt.
exponent_map`), chosen by the cost model, and its llvm kernels agree with torch; at LLaMA-3-8B's size (slow) the
program gets the row-fused option at 128 and 512 tokens."""

from __future__ import annotations

import copy

import pytest
import torch
from captured_programs import capturing
from test_torch_frontend import DecoderLayer, rope

import gensorage
import gensorage.torch as gtorch
from gensorage.hw import load_profile
from gensorage.superopt import superoptimize
from gensorage.superopt.choice import cost_fn, elements
from gensorage.superopt.presets import DEFAULT_VERIFY_MAX_ELEMENTS
from gensorage.superopt.row_fusion import FUSED, FUSED_ORIGINS, fused_direct
from gensorage.superopt.search_shapes import derive_search_shapes
from gensorage.torch import subgraph
from gensorage.ugraph import from_program

#: head_dim 64 (the slice pins 64 and 32) at 64 tokens: the sequence length is pinned with it, as 128 tokens
#: are at LLaMA-3-8B's head_dim 128; 16 heads over 4 KV heads shrink to 4 over 2.
REDUCED = dict(hidden=1024, heads=16, kv_heads=4, ffn=1024)


def captured_program(cfg: dict[str, int], t: int, dtype: torch.dtype) -> gensorage.Program:
    """The Program the front end lowers the layer to (captured; no kernels built, the layer runs in torch)."""
    try:
        with capturing() as got:
            torch.manual_seed(0)
            layer = DecoderLayer(**cfg).eval().to(dtype)
            with torch.no_grad():
                gtorch.compile(layer)(
                    torch.randn(1, t, cfg["hidden"]).to(dtype), *rope(t, cfg["hidden"] // cfg["heads"], dtype)
                )
    finally:
        torch._dynamo.reset()
    (program,) = got
    return program


@pytest.mark.parametrize("outliers", [False, True], ids=["normal", "outliers"])
def test_reduced_layer_runs_its_row_fused_kernels(monkeypatch: pytest.MonkeyPatch, outliers: bool) -> None:
    """``outliers``: real-model magnitudes, one massive-activation channel (|x| ~ 300) and a first token 30 times
    larger than the rest (an attention sink's large logits)."""
    results = []
    real = subgraph.compiled

    def record(program: gensorage.Program, options: subgraph.Options, device: object = None) -> object:
        assert elements(program) > DEFAULT_VERIFY_MAX_ELEMENTS  # checked at search shapes, not its own
        shapes = derive_search_shapes(program)
        assert shapes.shrunk and shapes.sizes[1024] == 256, shapes.note  # hidden 16 x 64 -> 4 x 64
        res = real(program, options, device)
        results.append(res)
        return res

    monkeypatch.setattr(subgraph, "compiled", record)
    monkeypatch.setattr(subgraph, "_DISPATCHERS", {})
    torch.manual_seed(0)
    layer = DecoderLayer(**REDUCED).eval()
    exact = copy.deepcopy(layer).double()
    layer = layer.to(torch.bfloat16)
    x = 3.0 * torch.randn(1, 64, 1024)
    if outliers:
        x[..., 7] *= 100.0
        x[:, 0] *= 30.0
    cos, sin = rope(64, 64, torch.float64)
    args = (x.to(torch.bfloat16), cos.to(torch.bfloat16), sin.to(torch.bfloat16))
    with torch.no_grad():
        got = gtorch.compile(layer, hw="h200")(*args)
        eager = layer(*args)
        want = exact(x.double(), cos, sin)
    (res,) = results
    assert res.origin == FUSED and res.equivalence.method == "search shapes"
    scale = want.abs().max()
    err, eager_err = (got.double() - want).abs().max() / scale, (eager.double() - want).abs().max() / scale
    assert err <= max(2 * eager_err, 1e-2), (err, eager_err)  # bfloat16 rounding, as torch's own


@pytest.mark.slow
@pytest.mark.parametrize("tokens", [128, 512])
def test_llama3_8b_layer_gets_the_row_fused_option(tokens: int) -> None:
    """LLaMA-3-8B's layer in bfloat16 (no kernels built): about 20 s of checking on two loaded cores."""
    cfg = dict(hidden=4096, heads=32, kv_heads=8, ffn=14336)
    p = captured_program(cfg, tokens, torch.bfloat16)
    hw = load_profile("h200")
    fused = fused_direct(p, "storage", hw)
    assert fused is not None
    cost = cost_fn(hw)
    assert cost(fused) < cost(from_program(p, "storage"))
    res = superoptimize(p, hw=hw, mode="fast", use_store=False, progress=False, precision="storage")
    # the rule-made form the model prices fastest: at 512 tokens row fusion alone (attention's QKᵀ without its
    # scale as an epilogue), at 128 epilogue then row fusion
    assert res.origin in FUSED_ORIGINS and res.origin == res.candidates[0][0]
    assert res.equivalence and res.equivalence.method == "search shapes"

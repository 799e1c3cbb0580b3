"""Models the other front-end tests do not use, as a demanding new user writes them: a GPT-2 block (fused qkv
then split, LayerNorm with bias, tanh GELU), a Qwen-style block (GQA by repeat_interleave, an additive mask, q/k
RMSNorm computed in float32, RoPE), a T5 block (softmax in float32 then cast back), a BERT encoder with a padding
mask, odd hidden sizes (40, 72) and 16-bit dtypes.

Each test compares with eager torch (and, in 16 bits, with the model in float64), checks the output's dtype (a
later torch op rejects a tensor of the wrong dtype), and checks from the report that the ops it is about ran in
gensorage, not in a silent torch fallback.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
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

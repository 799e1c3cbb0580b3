"""The torch front end on compiled variants (gensorage.codegen.symbolic_kernels): new sequence lengths at prefill
and a new key length at every KV-cache decode step, right against eager, with at most one build per length and
none for the lengths a variant covers."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from test_torch_decode import DecodeStep, assert_outputs_close, decode_inputs  # noqa: E402
from test_torch_frontend import RMSNorm, assert_close  # noqa: E402
from torch import nn  # noqa: E402

import gensorage.torch as gtorch  # noqa: E402
from gensorage.torch import subgraph  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENSORAGE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(subgraph, "_DISPATCHERS", {})


class GatedNorm(nn.Module):
    """RMSNorm, a SiLU gate and a residual: row and elementwise kernels, no matmul (whose tiles the construction
    picks per length)."""

    def __init__(self, hidden: int = 48) -> None:
        super().__init__()
        self.norm = RMSNorm(hidden)

    def forward(self, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return x + F.silu(g) * self.norm(x)


def test_new_prefill_lengths_build_nothing_after_the_first() -> None:
    torch.manual_seed(0)
    model = GatedNorm().eval()
    compiled = gtorch.compile(model)
    d = subgraph.dispatcher(subgraph.Options())
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for i, t in enumerate((8, 12, 5, 9, 17, 24, 31, 40)):
            scale = 10.0 ** (i % 4 - 1)  # magnitudes from 0.1 to 100
            x, g = (scale * torch.randn(1, t, 48, generator=gen) for _ in range(2))
            assert_close(compiled(x, g), model(x, g), 1e-5)
    # the first length builds its kernels (the norm's row kernel generic in its rows, the element-wise ones generic
    # at first sight: the llvm first tier); seven more lengths build nothing
    assert (d.stats.new_structures, d.stats.new_shapes, d.stats.builds) == (1, 7, 1), d.stats


def test_decode_steps_build_only_the_kernels_no_variant_covers() -> None:
    """A new key length each step: every step right against eager; after the first two, a step compiles at
    most the few kernels whose divisors or tiles change with the key length (the cache's concat and repeat, whose
    flat index is split by it, and the attention's P·V), not the layer's 25."""
    torch.manual_seed(10)
    step = DecodeStep().eval()
    compiled = gtorch.compile(step)
    d = subgraph.dispatcher(subgraph.Options())
    with torch.no_grad():
        for past in range(8, 16):
            if past == 10:
                variants = d._variants["llvm"].compiled
            args = decode_inputs(past, torch.float32, seed=past)
            assert_outputs_close(compiled(*args), step(*args), 1e-3)
    assert d.stats.new_shapes == 7 and d.stats.builds <= 8, d.stats
    assert d._variants["llvm"].compiled - variants <= 4 * 6, d._variants["llvm"].compiled - variants

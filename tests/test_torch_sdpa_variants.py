"""The attention ops SDPA decomposes to on a GPU lower like SDPA itself.

On a GPU, ``F.scaled_dot_product_attention`` reaches the captured graph as one of torch's backend ops (cuDNN's on
an H200 with torch 2.11, flash or memory-efficient elsewhere), each returning the attention as output 0 and
log-sum-exp and RNG state after it. They are traced here with fake CUDA-less tensors (their meta kernels), lowered
to a Program, and the Program is evaluated in float64 against torch's own SDPA on the CPU.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

from gensorage.baselines.torch_eager import TorchArith  # noqa: E402
from gensorage.torch.subgraph import lower  # noqa: E402

aten = torch.ops.aten

#: op -> how to call it on (q, k, v, is_causal); the attention is output 0 of each.
VARIANTS = {
    "cudnn": lambda q, k, v, c: aten._scaled_dot_product_cudnn_attention.default(
        q, k, v, None, False, 0.0, c
    ),
    "flash": lambda q, k, v, c: aten._scaled_dot_product_flash_attention.default(q, k, v, 0.0, c),
    "efficient": lambda q, k, v, c: aten._scaled_dot_product_efficient_attention.default(
        q, k, v, None, False, 0.0, c
    ),
    "overrideable": lambda q, k, v, c: aten._scaled_dot_product_fused_attention_overrideable.default(
        q, k, v, None, 0.0, c
    ),
}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_gpu_attention_ops_lower_to_sdpa(name: str, causal: bool) -> None:
    call = VARIANTS[name]
    shape = (1, 4, 8, 16)
    try:
        gm = make_fx(lambda q, k, v: (call(q, k, v, causal)[0],), tracing_mode="fake")(
            *(torch.randn(shape) for _ in range(3))
        )
    except (RuntimeError, NotImplementedError) as exc:  # no meta kernel for this op in this torch build
        pytest.skip(f"{name}: cannot trace without a GPU: {str(exc).splitlines()[0]}")
    gm.graph.eliminate_dead_code()
    gm.recompile()
    lowered = lower(gm, f"sdpa_{name}")
    gen = torch.Generator().manual_seed(7)
    q, k, v = (10.0 * torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(3))
    inputs = [q, k, v] + [e.make(torch.float64, torch.device("cpu")) for e in lowered.extras]
    (got,) = lowered.program.evaluate(TorchArith(torch), inputs)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert torch.allclose(got, want, rtol=1e-10, atol=1e-10), (got - want).abs().max()

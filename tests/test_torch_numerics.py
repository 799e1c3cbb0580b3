"""Our kernels (llvm build on the CPU) against torch's own implementations on real-model data.

SDPA with ``enable_gqa`` at LLaMA-3-8B's attention shapes (32 query heads, 8 key/value heads, head dim 128, 1,024
keys) with an attention-sink logit, ``F.rms_norm`` with massive activations, softmax of large logits; float16 and
bfloat16; the direct µGraph and the searched FlashAttention µGraph. Every output must be finite and within 2e-2
relative error of float64 (torch's reference computed in float64).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from gensorage.codegen.module import compile_ugraph, run_cpu
from gensorage.dtypes import numpy_dtype
from gensorage.hw import load_profile
from gensorage.program import Program
from gensorage.ugraph import examples, from_program

HW = load_profile("h100")
LOW = ("float16", "bfloat16")
TOL = 2e-2


def _rounded(x: np.ndarray, dtype: str) -> np.ndarray:
    """``x`` as the kernels see it (rounded to ``dtype``), in float64."""
    return np.asarray(x).astype(numpy_dtype(dtype)).astype(np.float64)


def _check(got: np.ndarray, want: np.ndarray) -> None:
    g = np.asarray(got).astype(np.float64)
    assert np.isfinite(g).all(), "non-finite output"
    err = float(np.linalg.norm(g - want) / np.linalg.norm(want))
    assert err < TOL, f"relative error {err:.3g}"


def _t(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64))


def llama_attention(dtype: str, queries: int, *, stable: bool, heads: int = 32, kv_heads: int = 8) -> Program:
    """LLaMA-3-8B attention as models write it: K [kv heads, keys, 128], GQA by repeat, stable or papers' softmax."""
    p = Program("llama_attention")
    q = p.input("Q", (heads, queries, 128), dtype)
    k = p.input("K", (kv_heads, 1024, 128), dtype)
    v = p.input("V", (kv_heads, 1024, 128), dtype)
    group = heads // kv_heads
    s = p.scale(p.matmul(q, p.transpose(p.repeat(k, 0, group), 1, 2)), 128**-0.5)
    if stable:
        probs = p.softmax(s, dim=2)
    else:
        e = p.exp(s)
        probs = p.div(e, p.sum(e, dim=2))
    p.output(p.matmul(probs, p.repeat(v, 0, group)))
    return p


def sink_inputs(seed: int, heads: int, kv_heads: int, queries: int, logit: float) -> list[np.ndarray]:
    """Q, K, V where key 0 gets a logit of about ``logit`` from every query (an attention sink)."""
    rng = np.random.default_rng(seed)
    q = 0.5 * rng.standard_normal((heads, queries, 128))
    q[..., 0] = 1.0
    k = rng.standard_normal((kv_heads, 1024, 128))
    k[:, 0, :] = 0.0
    k[:, 0, 0] = logit * np.sqrt(128)
    return [q, k, rng.standard_normal((kv_heads, 1024, 128))]


def sdpa(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    out = F.scaled_dot_product_attention(_t(q)[None], _t(k)[None], _t(v)[None], enable_gqa=True)[0]
    return out.numpy()


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize(("stable", "logit"), [(True, 100.0), (False, 14.0)])
def test_llama3_gqa_attention_against_sdpa(dtype: str, stable: bool, logit: float) -> None:
    # A sink of 100 overflows float32's exp too, so only the stable form can take it; the papers' form must
    # survive ~14 (exp(14) > float16's 65504) through float32 intermediates.
    p = llama_attention(dtype, 8, stable=stable)
    xs = [_rounded(x, dtype) for x in sink_inputs(0, 32, 8, 8, logit)]
    want = sdpa(*xs)
    np.testing.assert_allclose(p.run(*xs)[0], want, rtol=1e-9, atol=1e-12)  # our program is SDPA's
    _check(run_cpu(from_program(p), HW, *xs)[0], want)


@pytest.mark.parametrize("dtype", LOW)
def test_searched_flash_attention_with_a_sink_against_sdpa(dtype: str) -> None:
    """The FlashAttention µGraph the search finds (papers' form, K as [heads, dim, keys]) with a logit of 13."""
    program, fused = examples.flash_attention(
        heads=4, q_len=16, kv_len=64, head_dim=16, q_blocks=2, forloop=4, dtype=dtype
    )
    rng = np.random.default_rng(1)
    q = 0.5 * rng.standard_normal((4, 16, 16))
    q[..., 0] = 1.0
    k = rng.standard_normal((4, 16, 64))
    k[:, :, 0] = 0.0
    k[:, 0, 0] = 13.0 * 4  # head dim 16: the logit is k·q / 4
    xs = [_rounded(x, dtype) for x in (q, k, rng.standard_normal((4, 64, 16)))]
    want = sdpa(xs[0], np.swapaxes(xs[1], 1, 2), xs[2])
    np.testing.assert_allclose(program.run(*xs)[0], want, rtol=1e-9, atol=1e-12)
    _check(run_cpu(fused, HW, *xs)[0], want)


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("peak", [300.0, 1000.0])
def test_rms_norm_with_massive_activations_against_torch(dtype: str, peak: float) -> None:
    p = Program("rms")
    x = p.input("X", (4, 4096), dtype)
    w = p.input("G", (4096,), dtype)
    p.output(p.mul(p.rms_norm(x, 1e-6), w))
    rng = np.random.default_rng(2)
    xv = rng.standard_normal((4, 4096))
    xv[:, 1234] = peak * np.array([1, -1, 1, -1])  # one massive channel, as in LLaMA
    xs = [_rounded(xv, dtype), _rounded(1 + 0.1 * rng.standard_normal(4096), dtype)]
    want = F.rms_norm(_t(xs[0]), (4096,), _t(xs[1]), eps=1e-6).numpy()
    _check(run_cpu(from_program(p), HW, *xs)[0], want)


_SOFTMAX: dict[str, object] = {}


def _softmax_kernels(dtype: str):  # type: ignore[no-untyped-def]
    if dtype not in _SOFTMAX:
        p = Program("softmax")
        p.output(p.softmax(p.input("X", (8, 512), dtype), dim=1))
        _SOFTMAX[dtype] = compile_ugraph(from_program(p), HW, "llvm")
    return _SOFTMAX[dtype]


@settings(max_examples=12, deadline=None)
@given(
    dtype=st.sampled_from(LOW),
    magnitude=st.sampled_from([1e-2, 1.0, 30.0, 100.0, 1e4]),
    seed=st.integers(0, 2**16),
)
def test_softmax_of_large_logits_against_torch(dtype: str, magnitude: float, seed: int) -> None:
    x = _rounded(magnitude * np.random.default_rng(seed).standard_normal((8, 512)), dtype)
    want = torch.softmax(_t(x), dim=1).numpy()
    got = _softmax_kernels(dtype).run(x, target="cpu")[0]  # type: ignore[attr-defined]
    _check(got, want)

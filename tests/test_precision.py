"""The precision policy: float32 intermediates where the program's dtype overflows, outputs in the program's dtype.

End to end on the CPU (llvm build of the kernels) against float64, on the data that broke float16 kernels: a
massive-activation channel before RMSNorm + matmul, and an attention-sink logit in the papers' (unstabilised)
form of attention. Each numeric test also runs the ``"storage"`` policy and sees it overflow, so it can fail.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gensorage import superoptimize
from gensorage.codegen.module import compile_ugraph, run_cpu
from gensorage.errors import ConfigError, UGraphError
from gensorage.hw import load_profile
from gensorage.opset import Op
from gensorage.precision import PRECISIONS, check_precision, promote, stored_dtype
from gensorage.program import Program
from gensorage.ugraph import KernelGraph, from_program
from gensorage.ugraph.shapes import infer

HW = load_profile("h100")
LOW = ("float16", "bfloat16")


def _rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))


def rms_matmul(dtype: str, rows: int = 8, hidden: int = 256, out: int = 64) -> Program:
    """LLaMA's RMSNorm (weight G) followed by a projection W."""
    p = Program("rms_matmul")
    x = p.input("X", (rows, hidden), dtype)
    g = p.input("G", (hidden,), dtype)
    w = p.input("W", (hidden, out), dtype)
    ms = p.scale(p.sum(p.mul(x, x), dim=1), 1 / hidden)
    p.output(p.matmul(p.div(p.mul(x, g), p.sqrt(ms)), w))
    return p


def papers_attention(dtype: str, heads: int = 2, q: int = 8, kv: int = 32, d: int = 16) -> Program:
    """softmax(Q K / sqrt(d)) V with the papers' unstabilised softmax: exp(S) V / sum(exp(S))."""
    p = Program("papers_attention")
    qq = p.input("Q", (heads, q, d), dtype)
    k = p.input("K", (heads, d, kv), dtype)
    v = p.input("V", (heads, kv, d), dtype)
    e = p.exp(p.scale(p.matmul(qq, k), d**-0.5))
    p.output(p.div(p.matmul(e, v), p.sum(e, dim=2)))
    return p


def massive_activation(rng: np.random.Generator, rows: int, hidden: int, out: int, peak: float) -> list:
    x = rng.standard_normal((rows, hidden))
    x[:, 7] = peak * rng.choice([-1.0, 1.0], rows)  # one channel of massive activations, as LLaMA's
    return [x, 1 + 0.1 * rng.standard_normal(hidden), rng.standard_normal((hidden, out)) / np.sqrt(hidden)]


def attention_sink(rng: np.random.Generator, heads: int, q: int, kv: int, d: int, logit: float) -> list:
    """Inputs whose key 0 gets logit ≈ ``logit`` from every query (an attention sink)."""
    qq = 0.3 * rng.standard_normal((heads, q, d))
    qq[..., 0] = 1.0
    k = rng.standard_normal((heads, d, kv))
    k[:, :, 0] = 0.0
    k[:, 0, 0] = logit * np.sqrt(d)
    return [qq, k, rng.standard_normal((heads, kv, d))]


# ------------------------------------------------------------------------------------------------ the policy


def test_policy_rules() -> None:
    assert stored_dtype(Op.EXP, ["float16"], False, "float32") == "float32"
    assert stored_dtype(Op.EXP, ["float16"], False, "storage") == "float16"
    assert stored_dtype(Op.MUL, ["bfloat16", "bfloat16"], True, "float32") == "float32"  # a square
    assert stored_dtype(Op.MUL, ["float16", "float16"], False, "float32") == "float16"
    assert stored_dtype(Op.MATMUL, ["float32", "float16"], False, "float32") == "float32"  # promotion
    assert stored_dtype(Op.SUM, ["float64"], False, "float32") == "float64"  # never narrows
    assert promote(["float16", "bfloat16"]) == "float32"
    assert set(PRECISIONS) == {"float32", "storage"}


def test_unknown_precision_is_a_one_line_error() -> None:
    with pytest.raises(ConfigError, match="unknown precision 'fp8'"):
        check_precision("fp8")
    with pytest.raises(ConfigError, match="unknown precision"):
        superoptimize(rms_matmul("float16"), mode="fast", use_store=False, progress=False, precision="half")
    g = from_program(rms_matmul("float16"))
    with pytest.raises(UGraphError, match="precision"):
        KernelGraph.from_json({**g.to_json(), "precision": "half"})


def test_intermediates_are_float32_and_outputs_keep_the_program_dtype() -> None:
    for dtype in LOW:
        g = from_program(papers_attention(dtype))
        info = infer(g)
        stored = [info.nodes[len(g.inputs) + k][0].dtype for k in range(len(g.ops))]
        # matmul, scale (both flow only into exp: float32), exp, matmul(exp, V), sum, div (the output)
        assert stored == ["float32", "float32", "float32", "float32", "float32", dtype]
        narrow = infer(dataclasses.replace(g, precision="storage"))
        assert {t.dtype for outs in narrow.nodes for t in outs} == {dtype}
        assert KernelGraph.from_json(g.to_json()) == g
        assert (
            KernelGraph.from_json(narrow_json := dataclasses.replace(g, precision="storage").to_json()) != g
        )
        assert narrow_json["precision"] == "storage"


# ------------------------------------------------------------------------------------------ end to end (CPU)


@pytest.mark.parametrize("dtype", LOW)
def test_massive_activation_rmsnorm_matmul(dtype: str) -> None:
    p = rms_matmul(dtype)
    xs = massive_activation(np.random.default_rng(0), 8, 256, 64, peak=1000.0)
    want = p.run(*xs)[0]
    got = run_cpu(from_program(p), HW, *xs)[0]
    assert np.isfinite(got.astype(np.float64)).all()
    assert _rel_err(got, want) < 2e-2
    if dtype == "float16":  # 1000² overflows float16: storing the squares in the program's dtype fails
        narrow = run_cpu(from_program(p, "storage"), HW, *xs)[0]
        assert not (np.isfinite(narrow.astype(np.float64)).all() and _rel_err(narrow, want) < 2e-2)


@pytest.mark.parametrize("dtype", LOW)
def test_attention_sink_in_the_papers_form(dtype: str) -> None:
    p = papers_attention(dtype)
    xs = attention_sink(np.random.default_rng(1), 2, 8, 32, 16, logit=14.0)
    want = p.run(*xs)[0]
    got = run_cpu(from_program(p), HW, *xs)[0]
    assert np.isfinite(got.astype(np.float64)).all()
    assert _rel_err(got, want) < 2e-2
    if dtype == "float16":  # exp(14) > 65504: the unstabilised form overflows when stored in float16
        narrow = run_cpu(from_program(p, "storage"), HW, *xs)[0]
        assert not np.isfinite(narrow.astype(np.float64)).all()


def test_superoptimize_chooses_the_policy() -> None:
    p = papers_attention("float16")
    xs = attention_sink(np.random.default_rng(2), 2, 8, 32, 16, logit=13.0)
    want = p.run(*xs)[0]
    safe = superoptimize(p, mode="fast", use_store=False, progress=False)
    assert safe.best.precision == "float32"
    assert _rel_err(safe.run(*[x.astype(np.float16) for x in xs])[0], want) < 2e-2
    narrow = superoptimize(p, mode="fast", use_store=False, progress=False, precision="storage")
    assert narrow.best.precision == "storage"
    assert not np.isfinite(narrow.run(*[x.astype(np.float16) for x in xs])[0].astype(np.float64)).all()


@settings(max_examples=6, deadline=None)
@given(
    peak=st.floats(1.0, 1000.0),
    scale=st.sampled_from([1e-3, 1.0, 30.0]),
    dtype=st.sampled_from(LOW),
    seed=st.integers(0, 2**16),
)
def test_rmsnorm_matmul_over_magnitudes(peak: float, scale: float, dtype: str, seed: int) -> None:
    p = rms_matmul(dtype, rows=4, hidden=64, out=16)
    xs = massive_activation(np.random.default_rng(seed), 4, 64, 16, peak)
    xs[0] = xs[0] * scale
    want = p.run(*xs)[0]
    got = _cpu_program(p)(*xs)[0]
    assert np.isfinite(got.astype(np.float64)).all()
    assert _rel_err(got, want) < 2e-2


_BUILT: dict[str, object] = {}


def _cpu_program(p: Program):  # type: ignore[no-untyped-def]
    """The llvm build of ``p``'s direct µGraph, built once per program key (hypothesis draws many inputs)."""
    key = p.key()
    if key not in _BUILT:
        _BUILT[key] = compile_ugraph(from_program(p), HW, "llvm")
    built = _BUILT[key]
    return lambda *xs: built.run(*xs, target="cpu")  # type: ignore[attr-defined]


def test_a_stable_softmax_is_bounded_and_stays_in_the_program_dtype() -> None:
    def dtypes(build) -> list[str]:  # type: ignore[no-untyped-def]
        p = Program("softmax")
        x = p.input("X", (4, 32), "float16")
        p.output(p.matmul(build(p, x), p.input("V", (32, 8), "float16")))
        g = from_program(p)
        info = infer(g)
        return [info.nodes[len(g.inputs) + k][0].dtype for k in range(len(g.ops))]

    # max and sub flow only into exp (float32); exp (in (0, 1]), sum, div (in [0, 1]), matmul: only the sum
    # needs float32 after the exp.
    stable = dtypes(lambda p, x: p.softmax(x, dim=1))
    assert stable == ["float32", "float32", "float16", "float32", "float16", "float16"]
    # exp(−(x − m)) is not bounded: a negative factor breaks the proof, so exp and div stay float32.
    flipped = dtypes(
        lambda p, x: p.div(e := p.exp(p.scale(p.sub(x, p.max(x, 1, keepdim=True)), -1.0)), p.sum(e, dim=1))
    )
    assert flipped == ["float32", "float32", "float32", "float32", "float32", "float32", "float16"]
    # Dividing by the sum of something else proves nothing either.
    other = dtypes(
        lambda p, x: p.div(e := p.exp(p.sub(x, p.max(x, 1, keepdim=True))), p.sum(p.mul(e, e), dim=1))
    )
    assert other[-2] == "float32"


def test_values_flowing_only_into_exp_are_float32() -> None:
    """The split-KV kernel's score tiles (matmul, scale) and maxima flow only into exp: float32 under the
    float32 policy, the program's dtype under "storage"; a value that also feeds a matmul keeps the ordinary
    rule (a matmul of 16-bit operands stores 16 bits)."""
    from gensorage.ugraph import examples
    from gensorage.ugraph.exp_operands import exp_operands
    from gensorage.ugraph.ir import Ref

    _, g = examples.flash_decoding_stable(dtype="bfloat16")
    into = exp_operands(g)
    assert into.kernel == frozenset({Ref(4, 2)})  # the saved running maxima
    assert {(1, 3, 0), (1, 4, 0), (1, 5, 0), (2, 2, 0), (2, 3, 0)} <= into.block  # S, scaled S, maxima
    split = infer(g).blocks[1]
    assert split is not None
    assert [split.nodes[j][0].dtype for j in (3, 4, 5)] == ["float32"] * 3
    narrow = infer(dataclasses.replace(g, precision="storage")).blocks[1]
    assert narrow is not None and [narrow.nodes[j][0].dtype for j in (3, 4, 5)] == ["bfloat16"] * 3

    p = Program("shared_scores")
    x = p.input("X", (8, 8), "bfloat16")
    w = p.input("W", (8, 8), "bfloat16")
    s = p.matmul(x, w)
    p.output(p.matmul(p.exp(s), s))  # S feeds the exp and a matmul
    info = infer(gs := from_program(p))
    assert info.nodes[len(gs.inputs)][0].dtype == "bfloat16"


@pytest.mark.parametrize("dtype", LOW)
def test_a_reshaped_mask_input_keeps_its_dtype_into_exp(dtype: str) -> None:
    """A padding mask ``keep[:, None, :]`` (a kernel-level reshape of a 16-bit input) added to the scores flows
    only into exp, but a reshape is a view of its input: it keeps the input's dtype. It was stored as float32,
    so the kernels read the 16-bit mask's bytes as float32 and batch 1's padded keys got weights up to 0.45."""
    p = Program("padding_mask")
    keep = p.input("Keep", (2, 5), dtype)
    q, k = p.input("Q", (2, 4, 8), dtype), p.input("K", (2, 8, 5), dtype)
    scores = p.add(p.scale(p.matmul(q, k), 8**-0.5), p.reshape(keep, (2, 1, 5)))
    p.output(p.softmax(scores, dim=2))
    g = from_program(p)
    info = infer(g)
    (view,) = (k for k, op in enumerate(g.ops) if getattr(op, "op", None) is Op.RESHAPE)
    assert info.nodes[len(g.inputs) + view][0].dtype == dtype
    rng = np.random.default_rng(0)
    mask = np.zeros((2, 5))
    mask[1, 3:] = -1e4
    xs = [mask, rng.standard_normal((2, 4, 8)), rng.standard_normal((2, 8, 5))]
    (got,) = run_cpu(g, HW, *xs)
    (want,) = p.run(*xs)
    assert np.abs(got[1, :, 3:]).max() < 1e-3  # the padded keys get no weight
    assert _rel_err(got, want) < 2e-2

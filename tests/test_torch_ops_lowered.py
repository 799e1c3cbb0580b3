"""The ops that stayed in torch on real models and lower now: ``tanh`` (the IR's op), ``abs``, means and sums
over every dim (a 0-d value, ``(1,)`` in the Program), products of a 16-bit and a float32 tensor (torch's type
promotion: the Program computes in float32), ``log``, ``log_softmax`` and the clamps to scalar bounds (``clamp``,
``clamp_min``, ``clamp_max``, ``hardtanh``); and the ops kept in torch on purpose, each with its reason
(``masked_fill``/``where`` by a boolean mask, a clamp to tensor bounds).

The lowered forms run through both entry points on float32, float16 and bfloat16 at drawn magnitudes (0, ±inf,
NaN, 1e-3 to 1e3) and are compared with torch at the same dtype: dtype, positions of NaN and inf, values within the
front end's tolerance. The Programs also run in the float64 interpreter against torch in float64.
"""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
from captured_programs import capturing  # noqa: E402
from test_torch_frontend import gensorage_subgraphs  # noqa: E402

import gensorage  # noqa: E402
import gensorage.torch as gtorch  # noqa: E402
from gensorage.torch.subgraph import TOLERANCE  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SPECIAL = [0.0, -0.0, math.inf, -math.inf, math.nan]


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENSORAGE_HOME", str(tmp_path / "home"))


def _elementwise(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return torch.tanh(x), torch.sigmoid(x), x.abs()


def _logs_and_clamps(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (
        torch.log_softmax(x, dim=-1),
        torch.log(x),
        x.clamp(-0.5, 2.0),
        x.clamp_min(0.25),
        x.clamp(max=-1e-3).clamp_max(-0.5),
        torch.nn.functional.hardtanh(x),
        torch.nn.functional.relu6(x),
    )


def _reductions(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """0-d results, and a 0-d value used inside the graph."""
    return x.mean(), x.sum(), x - x.mean() * 0.5


def _drawn(magnitude: float, values: list[float], specials: list[tuple[int, float]]) -> torch.Tensor:
    x = torch.tensor(values, dtype=torch.float64).reshape(3, 8) * 10.0**magnitude
    for i, v in specials:
        x.view(-1)[i] = v
    return x


VALUES = st.lists(st.floats(min_value=-1.0, max_value=1.0), min_size=24, max_size=24)
MAGNITUDE = st.floats(min_value=-3.0, max_value=3.0)
SPECIALS = st.lists(st.tuples(st.integers(0, 23), st.sampled_from(SPECIAL)), max_size=4)


class _Compiled:
    """``f`` compiled through ``entry`` and called once on ``warm`` (finite: the check against torch passes);
    the report must put every op in one gensorage subgraph, so the later calls run the kernels."""

    def __init__(self, f: Callable[..., tuple[torch.Tensor, ...]], entry: str, warm: torch.Tensor) -> None:
        torch._dynamo.reset()
        self.err = io.StringIO()
        if entry == "gensorage.torch.compile":
            self.fn: Callable[..., tuple[torch.Tensor, ...]] = gtorch.compile(f)
        else:
            self.fn = torch.compile(f, backend="gensorage", dynamic=False, options={"explain": True})
        self(warm)
        assert len(gensorage_subgraphs(self.report())) == 1 and "torch (" not in self.report(), self.report()

    def __call__(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with contextlib.redirect_stderr(self.err), torch.no_grad():
            return self.fn(*args)

    def report(self) -> str:
        """What ran where; no subgraph may have fallen back to torch (on the first call or a later one)."""
        explain = getattr(self.fn, "explain", None)
        lines = (
            explain()
            if explain
            else "\n".join(ln.removeprefix("gensorage: ") for ln in self.err.getvalue().splitlines())
        )
        assert "stays in torch" not in lines, lines
        return lines


def _same(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...], tolerance: float) -> None:
    """Same dtypes and shapes, NaN and inf where torch has them, finite values within ``tolerance`` of the
    largest finite reference value."""
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype, g.shape, w.shape)
        g64, w64 = g.double(), w.double()
        assert torch.equal(g64.isnan(), w64.isnan()), (g, w)
        assert torch.equal(g64[w64.isinf()], w64[w64.isinf()]) and torch.equal(g64.isinf(), w64.isinf()), (
            g,
            w,
        )
        finite = torch.isfinite(w64)
        if finite.any():
            scale = max(float(w64[finite].abs().max()), 1e-30)
            assert float((g64[finite] - w64[finite]).abs().max()) <= tolerance * scale, (g, w)


ENTRIES = ["gensorage.torch.compile", 'torch.compile(backend="gensorage")']


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("f", [_elementwise, _logs_and_clamps], ids=["tanh-sigmoid-abs", "logs-clamps"])
def test_elementwise_kernels_match_torch(
    entry: str, dtype: torch.dtype, f: Callable[..., tuple[torch.Tensor, ...]]
) -> None:
    """The kernels of tanh, sigmoid and abs, and of log, log_softmax and the clamps, at drawn magnitudes with
    0, −0, ±inf and NaN in the input: ±1, 1/0 and inf at the infinities (the forms never compute inf − inf),
    −inf at log(0), NaN where torch has NaN (relu and clamp keep it; log below 0; a log_softmax row with +inf
    or NaN), torch's dtype, and values within tolerance."""
    warm = torch.linspace(0.5, 4.0, 24).reshape(3, 8).to(dtype)  # finite everywhere (log of a positive)
    compiled = _Compiled(f, entry, warm)

    @settings(max_examples=15, deadline=None)
    @given(magnitude=MAGNITUDE, values=VALUES, specials=SPECIALS)
    def check(magnitude: float, values: list[float], specials: list[tuple[int, float]]) -> None:
        x = _drawn(magnitude, values, specials).to(dtype)
        with torch.no_grad():
            _same(compiled(x), f(x), TOLERANCE[str(dtype).removeprefix("torch.")])

    check()
    compiled.report()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("entry", ENTRIES)
def test_means_and_sums_over_every_dim_match_torch(entry: str, dtype: torch.dtype) -> None:
    """``mean()``/``sum()`` give 0-d tensors (they stayed in torch: "shape []"); the Program holds them as
    ``(1,)``, which broadcasts as a 0-d value does, and the outputs come back 0-d."""
    warm = torch.linspace(-4.0, 4.0, 24).reshape(3, 8).to(dtype)
    compiled = _Compiled(_reductions, entry, warm)

    @settings(max_examples=10, deadline=None)
    @given(magnitude=MAGNITUDE, values=VALUES)
    def check(magnitude: float, values: list[float]) -> None:
        x = _drawn(magnitude, values, []).to(dtype)
        got = compiled(x)
        with torch.no_grad():
            want = _reductions(x)
        assert [g.shape for g in got] == [torch.Size([]), torch.Size([]), torch.Size([3, 8])]
        # torch sums 16-bit values in float32 and rounds once, as the kernels do
        _same(got, want, TOLERANCE[str(dtype).removeprefix("torch.")])

    check()
    compiled.report()


def _norms(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``torch.linalg.vector_norm`` of orders 2 (``Tensor.norm``), 1 (every dim: 0-d) and inf, and
    ``F.normalize`` (a 2-norm, ``clamp_min`` and a division)."""
    return (
        x.norm(dim=-1),
        torch.linalg.vector_norm(x, ord=1),
        torch.linalg.vector_norm(x, ord=math.inf, dim=0, keepdim=True),
        torch.nn.functional.normalize(x, dim=-1),
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("entry", ENTRIES)
def test_vector_norms_match_torch(entry: str, dtype: torch.dtype) -> None:
    warm = torch.linspace(-4.0, 4.0, 24).reshape(3, 8).to(dtype)
    compiled = _Compiled(
        _norms, entry, warm
    )  # one gensorage subgraph: linalg_vector_norm stays in torch no more

    @settings(max_examples=10, deadline=None)
    @given(magnitude=MAGNITUDE, values=VALUES)
    def check(magnitude: float, values: list[float]) -> None:
        x = _drawn(magnitude, values, []).to(dtype)
        got = compiled(x)
        with torch.no_grad():  # torch in float32, as the kernels compute: in float16, F.normalize's eps
            want = tuple(w.to(dtype) for w in _norms(x.float()))  # (1e-12) is 0, and a zero row gives 0 / 0
        assert [g.shape for g in got] == [
            torch.Size([3]),
            torch.Size([]),
            torch.Size([1, 8]),
            torch.Size([3, 8]),
        ]
        _same(got, want, TOLERANCE[str(dtype).removeprefix("torch.")])

    check()
    compiled.report()


def test_vector_norms_of_other_orders_stay_in_torch() -> None:
    torch._dynamo.reset()
    compiled = gtorch.compile(lambda x: torch.linalg.vector_norm(x, ord=3, dim=-1) + 1.0)
    x = torch.randn(3, 8)
    with torch.no_grad():
        assert torch.allclose(compiled(x), torch.linalg.vector_norm(x, ord=3, dim=-1) + 1.0)
    assert "a vector norm of order 3 (gensorage lowers 1, 2 and inf)" in compiled.explain()


@pytest.fixture(scope="module")
def lowered_programs() -> dict[str, gensorage.Program]:
    """The Programs the front end lowers :func:`_elementwise`, :func:`_logs_and_clamps` and :func:`_reductions`
    to (kernels not built)."""
    captured: dict[str, gensorage.Program] = {}
    for f in (_elementwise, _logs_and_clamps, _reductions):
        torch._dynamo.reset()
        with capturing() as got, torch.no_grad():
            gtorch.compile(f)(torch.randn(3, 8))
        (captured[f.__name__],) = got
    return captured


@settings(deadline=None)
@given(magnitude=st.floats(min_value=-8.0, max_value=3.0), values=VALUES, specials=SPECIALS)
def test_lowered_forms_in_float64_match_torch(
    lowered_programs: dict[str, gensorage.Program],
    magnitude: float,
    values: list[float],
    specials: list[tuple[int, float]],
) -> None:
    """The lowered Programs in the float64 interpreter against torch in float64, down to magnitudes of 1e-8."""
    x = _drawn(magnitude, values, specials)
    for f in (_elementwise, _logs_and_clamps):
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            got = lowered_programs[f.__name__].run(x.numpy())
        for g, w in zip(got, f(x), strict=True):
            assert np.array_equal(np.isnan(g), w.isnan().numpy()) and np.array_equal(
                np.isinf(g), w.isinf().numpy()
            )
            np.testing.assert_allclose(g, w.numpy(), rtol=1e-12, atol=1e-15)
    x = _drawn(magnitude, values, [])
    got = lowered_programs["_reductions"].run(x.numpy())
    for g, w in zip(got, _reductions(x), strict=True):
        scale = float(x.abs().max()) * 24
        np.testing.assert_allclose(g.reshape(w.shape), w.numpy(), rtol=1e-12, atol=1e-14 * scale)


def test_tanh_error_near_zero_in_float32() -> None:
    """tanh is the IR's op now (it was two exps near 1 subtracted: 1.4e-2 relative at 1e-5, and tanh(−0) = +0):
    in float32 within 1e-6 relative of torch at every magnitude, −0 kept, ±1 beyond |x| = 9."""
    compiled = _Compiled(_elementwise, "gensorage.torch.compile", torch.linspace(-4.0, 4.0, 24).reshape(3, 8))
    x = torch.tensor([-0.0, 1e-7, -1e-6, 1e-5, -1e-4, 1e-3, 0.01, -0.1, 0.5, 1.0, -3.0, 9.5] * 2).reshape(
        3, 8
    )
    x[1] *= 1.7
    got, want = compiled(x)[0], torch.tanh(x)
    rel = ((got.double() - want.double()).abs() / want.double().abs().clamp_min(1e-300))[x != 0]
    assert float(rel.max()) <= 1e-6, rel
    assert (
        got[0, 0] == 0.0 and torch.signbit(got[0, 0]) and torch.equal(got.abs()[x.abs() > 9], torch.ones(2))
    )


@pytest.mark.parametrize(("a", "b"), [(torch.bfloat16, torch.float32), (torch.float16, torch.bfloat16)])
def test_products_of_a_16_bit_and_a_wider_tensor_compute_in_float32(a: torch.dtype, b: torch.dtype) -> None:
    """A 16-bit tensor times a float32 one (T5's RMSNorm: ``x * rsqrt(var)`` with a float32 var), and float16
    times bfloat16, are float32 in torch; the subgraph's Program computes in float32 (16-bit inputs cast up on
    entry, exact), the outputs come back in torch's dtypes. Magnitudes 1e-3 to 1e3."""

    def f(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = x * w
        return y, y.sum(-1), x.to(torch.float32).pow(2).mean(-1)

    g = torch.Generator().manual_seed(24)
    x = torch.randn(4, 16, generator=g) * 10.0 ** torch.linspace(-3, 3, 16)
    w = torch.randn(4, 16, generator=g) * 10.0 ** torch.linspace(3, -3, 16)
    torch._dynamo.reset()
    compiled = gtorch.compile(f)
    with torch.no_grad():
        got, want = compiled(x.to(a), w.to(b)), f(x.to(a), w.to(b))
    assert [t.dtype for t in got] == [torch.float32] * 3
    _same(got, want, 1e-5)
    report = compiled.explain()
    assert len(gensorage_subgraphs(report)) == 1 and "torch (" not in report, report
    assert "float32; µGraph" in report, report


def test_ops_kept_in_torch_say_why_and_stay_right() -> None:
    """``masked_fill`` by a boolean mask (−inf before a softmax, with +inf and NaN scores where it masks: an
    additive mask would give NaN there) and a clamp to tensor bounds stay in torch with their reasons; the
    softmax after the fill, log_softmax and the scalar clamps run in gensorage, and the answers are torch's, NaN
    only in the fully masked row."""

    def f(s: torch.Tensor, masked: torch.Tensor) -> tuple[torch.Tensor, ...]:
        p = torch.softmax(s.masked_fill(masked, -math.inf), dim=-1)
        kept = torch.where(masked, 0.0, s).clamp_min(0.5)
        return p, torch.log_softmax(s.clamp(-50.0, 50.0), dim=-1), kept, s.clamp(min=kept - 1.0)

    g = torch.Generator().manual_seed(25)
    s = 3.0 * torch.randn(2, 5, 6, generator=g)
    masked = torch.zeros(2, 5, 6, dtype=torch.bool)
    masked[:, :, 4:], masked[1, 2] = True, True
    s[0, 0, 4], s[0, 1, 5] = math.inf, math.nan
    torch._dynamo.reset()
    compiled = gtorch.compile(f)
    with torch.no_grad():
        got, want = compiled(s, masked), f(s, masked)
    _same(got, want, 1e-3)
    assert torch.equal(
        got[0].isnan().any(-1), torch.tensor([[False] * 5, [False, False, True, False, False]])
    )
    report = compiled.explain()
    for why in ("a clamp to tensor bounds", "a select by a boolean mask"):
        assert why in report, report
    for gone in ("log_softmax needs log", "element-wise min/max with a constant"):
        assert gone not in report, report
    assert len(gensorage_subgraphs(report)) >= 1, report


def test_clamps_torch_defines_otherwise_stay_in_torch() -> None:
    """A clamp with min > max (torch gives max everywhere) and one to an infinite bound stay in torch with the
    reason; the answers are torch's."""

    def f(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x.clamp(2.0, 1.0) * 2.0, x.clamp(min=-math.inf) + 1.0

    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(26))
    torch._dynamo.reset()
    compiled = gtorch.compile(f)
    with torch.no_grad():
        got, want = compiled(x), f(x)
    _same(got, want, 1e-6)
    report = compiled.explain()
    assert "clamp with min 2.0 > max 1.0" in report and "is not a finite number" in report, report

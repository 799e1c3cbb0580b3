"""Bad input to ``gensorage.torch.compile``: each case gets torch's answer (or torch's own exception) and one line
in the report saying why, never a wrong answer.

Unsupported dtypes, a data-dependent shape (``nonzero``, boolean-mask indexing; inside a loop), a model that raises,
a call eager torch rejects too, a tensor subclass input, a failure inside torch.compile, TVM errors and wrong kernel
outputs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from test_torch_frontend import assert_close, gensorage_subgraphs  # noqa: E402

import gensorage.torch as gtorch  # noqa: E402
from gensorage.torch import backend, subgraph  # noqa: E402


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENSORAGE_HOME", str(tmp_path / "home"))
    torch._dynamo.reset()  # the tests compile the same functions: each starts from dynamo's empty cache


def _draw(seed: int, scale: float = 3.0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(4, 16, generator=g), torch.randn(16, 8, generator=g)


def _softmax_product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x @ w, dim=-1)


def _one_line_reasons(report: str) -> None:
    assert all(ln.strip() for ln in report.splitlines()), report  # no blank or multi-line entries


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float64])
def test_unsupported_dtype_runs_in_torch(dtype: torch.dtype) -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x @ w).sum(-1) * 2

    x, w = (t.round().to(dtype) for t in _draw(1))
    compiled = gtorch.compile(f)
    with torch.no_grad():
        got = compiled(x, w)
    want = f(x, w)
    assert got.dtype == want.dtype and torch.equal(got, want)
    report = compiled.explain()
    assert f"dtype {dtype} (gensorage takes float32, float16, bfloat16)" in report, report
    assert not gensorage_subgraphs(report), report
    _one_line_reasons(report)


@pytest.mark.parametrize("how", ["nonzero", "boolean mask"])
def test_data_dependent_shape_splits_the_graph(how: str) -> None:
    """A shape that depends on the values: dynamo breaks the graph there and torch runs it; the softmax before it
    still runs in gensorage. Two draws whose masks keep different counts."""

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = torch.softmax(x @ w, dim=-1)
        if how == "nonzero":
            return y * torch.nonzero(y > 0.2).shape[0]
        return y[y > 0.2].exp().sum() + y

    compiled = gtorch.compile(f)
    kept = set()
    with torch.no_grad():
        for seed in (2, 3):
            x, w = _draw(seed, scale=0.5)
            kept.add(int((torch.softmax(x @ w, -1) > 0.2).sum()))
            assert_close(compiled(x, w), f(x, w), 1e-3)
    assert len(kept) == 2  # the draws differ in the data-dependent size
    report = compiled.explain()
    assert (
        "graph break, runs in torch: Dynamic shape operator: Operator `aten.nonzero.default`'s output shape "
        in (report)
    )
    assert gensorage_subgraphs(report), report
    _one_line_reasons(report)


def test_a_model_that_raises_raises_as_in_eager() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if (x < 0).all():
            raise ValueError("all inputs negative")
        return _softmax_product(x, w)

    compiled = gtorch.compile(f)
    x, w = _draw(4)
    with torch.no_grad():
        assert_close(compiled(x, w), f(x, w), 1e-3)
        with pytest.raises(ValueError, match="^all inputs negative$"):
            compiled(-x.abs() - 1, w)
    report = compiled.explain()
    assert "the model raised ValueError: all inputs negative" in report, report
    _one_line_reasons(report)


def test_a_shape_error_is_torchs_own() -> None:
    """Mismatched matmul shapes: the call raises torch's RuntimeError as eager does, not a dynamo wrapper."""
    x, w = _draw(5)
    with pytest.raises(RuntimeError) as eager:
        _softmax_product(x, w.t())
    compiled = gtorch.compile(_softmax_product)
    with torch.no_grad(), pytest.raises(RuntimeError) as got:
        compiled(x, w.t())
    assert type(got.value) is type(eager.value)
    assert "the model raised RuntimeError" in compiled.explain()


def test_a_call_eager_rejects_leaves_the_model_compiled() -> None:
    """A call whose input eager torch rejects too (shapes a matmul cannot multiply) raises torch's error, and
    the next call at a new shape still compiles and runs in gensorage: the failure was the input's, not the
    capture's (one such call turned gensorage off for the model's life)."""
    compiled = gtorch.compile(_softmax_product)
    x, w = _draw(11)
    with torch.no_grad():
        assert_close(compiled(x, w), _softmax_product(x, w), 1e-3)
        with pytest.raises(RuntimeError) as raised:
            compiled(x, w.t())
        x5 = torch.cat((x, x[:1]))  # a new shape: captured and compiled again
        assert_close(compiled(x5, w), _softmax_product(x5, w), 1e-3)
    assert raised.value.__suppress_context__  # eager's error, not chained to dynamo's about it
    report = compiled.explain()
    assert "the model raised RuntimeError: mat1 and mat2 shapes cannot be multiplied" in report, report
    assert "torch.compile failed" not in report and len(gensorage_subgraphs(report)) == 2, report
    _one_line_reasons(report)


class _Marked(torch.Tensor):
    """A tensor subclass eager torch runs as a tensor (no ``__torch_function__`` of its own)."""


def test_a_tensor_subclass_input_runs_in_eager_and_plain_ones_stay_compiled() -> None:
    """torch.compile's capture fails on a subclass input that eager torch takes (its dispatch declines the fake
    tensors; inductor's too): that call gets eager's answer with the reason, and plain inputs still compile."""
    compiled = gtorch.compile(_softmax_product)
    x, w = _draw(12)
    with torch.no_grad():
        got = compiled(x.as_subclass(_Marked), w)
        assert type(got) is _Marked and torch.equal(got, _softmax_product(x.as_subclass(_Marked), w))
        assert_close(compiled(x, w), _softmax_product(x, w), 1e-3)
    report = compiled.explain()
    assert "a _Marked input, which torch.compile could not take (TypeError: " in report, report
    assert "eager torch runs this call" in report and len(gensorage_subgraphs(report)) == 1, report
    _one_line_reasons(report)


def test_a_graph_break_in_a_loop_is_reported() -> None:
    """Experts picked per token by ``torch.where`` in a loop (Mixtral's routing as HF writes it): a
    data-dependent shape inside a loop makes dynamo skip the whole function, so no graph reaches gensorage.
    The answer is eager's and the report says why (it was empty)."""

    def routed(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        pick = torch.softmax(x @ w, dim=-1).argmax(-1)
        out = torch.zeros_like(x)
        for e in range(w.shape[1]):
            rows = torch.where(pick == e)[0]
            out = out.index_add(0, rows, x.index_select(0, rows) * (e + 1))
        return out

    compiled = gtorch.compile(routed)
    with torch.no_grad():
        for seed in (12, 13):
            x, w = _draw(seed)
            assert torch.equal(compiled(x, w), routed(x, w))
    report = compiled.explain()
    assert report.startswith(
        "not captured, runs in torch: Dynamic shape operator: Operator `aten.nonzero.default`'s output shape "
        "depends on input Tensor data; then graph break in loop: "
    ), report
    assert len(report.splitlines()) == 1, report  # said once: the second call runs the skipped code as it is
    _one_line_reasons(report)


def test_a_failing_backend_leaves_the_graph_in_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(node: Any) -> str | None:
        raise KeyError("a lowering bug")

    monkeypatch.setattr(backend, "why_unsupported", broken)
    compiled = gtorch.compile(_softmax_product)
    with torch.no_grad():
        for seed in (6, 7):
            x, w = _draw(seed)
            assert torch.equal(compiled(x, w), _softmax_product(x, w))
    report = compiled.explain()
    assert report == "graph 1 runs in torch, partitioning failed: 'a lowering bug'", report  # said once


def test_the_registered_backend_leaves_a_failing_graph_in_torch(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``torch.compile(model, backend="gensorage")`` too: a failure inside gensorage's backend is a report
    line and torch's answer, not an exception."""
    import torch._dynamo

    def broken(gm: Any, options: Any, report: Any) -> Any:
        raise KeyError("a partitioning bug")

    monkeypatch.setattr(backend, "partition", broken)
    torch._dynamo.reset()
    compiled = torch.compile(_softmax_product, backend="gensorage", options={"explain": True})
    with torch.no_grad():
        x, w = _draw(8)
        assert torch.equal(compiled(x, w), _softmax_product(x, w))
    torch._dynamo.reset()
    said = capsys.readouterr().err
    assert "runs in torch, partitioning failed: 'a partitioning bug'" in said, said


@pytest.mark.parametrize("when", ["first call", "later call"])
def test_kernel_errors_leave_the_subgraph_in_torch(monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    """An error of TVM's own class from the kernels, at the checked first call or a later one: torch's answer."""
    real = subgraph.run_on_device
    failing = {"on": when == "first call"}

    def run(cg: Any, args: Any, *kept: Any) -> Any:
        if failing["on"]:
            raise RuntimeError("TVM: device mismatch\nlong trace")
        return real(cg, args, *kept)

    monkeypatch.setattr(subgraph, "run_on_device", run)
    compiled = gtorch.compile(_softmax_product)
    with torch.no_grad():
        for seed in (8, 9):
            x, w = _draw(seed)
            assert_close(compiled(x, w), _softmax_product(x, w), 1e-3)
            failing["on"] = True
    report = compiled.explain()
    prefix = "internal error" if when == "first call" else "kernels failed on a later call"
    assert f"stays in torch: {prefix}: RuntimeError: TVM: device mismatch" in report, report
    _one_line_reasons(report)


def test_wrong_kernel_outputs_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernels off by 1% are not used: the check against torch on the first call rejects them."""
    real = subgraph.run_on_device
    monkeypatch.setattr(
        subgraph, "run_on_device", lambda cg, args, *kept: [1.01 * t for t in real(cg, args, *kept)]
    )
    compiled = gtorch.compile(_softmax_product)
    x, w = _draw(10)
    with torch.no_grad():
        assert torch.equal(compiled(x, w), _softmax_product(x, w))
    assert "stays in torch: kernels differ from torch by 1.00e-02 (tolerance 1e-03)" in compiled.explain()

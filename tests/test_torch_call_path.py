"""What a compiled model's repeated call keeps of eager torch on its short path (dynamo's wrapper of the module's
own ``__call__``, the partitioned graph's ``forward`` called straight, the subgraph's and the runner's inline
checks), through both entry points: gradients reach the parameters and the input, an input updated in place (a
KV cache) is updated, the module's hooks run once per call, and a subgraph called at other shapes than it was
checked at gives torch's answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from test_torch_frontend import assert_close  # noqa: E402

import gensorage.torch as gtorch  # noqa: E402
from gensorage.codegen.runner import KernelRunner  # noqa: E402
from gensorage.errors import ProgramError  # noqa: E402
from gensorage.torch import backend, subgraph  # noqa: E402

ENTRIES = ("gensorage.torch.compile", 'torch.compile(backend="gensorage")')


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENSORAGE_HOME", str(tmp_path / "home"))


def _compile(model: Any, entry: str) -> Any:
    return gtorch.compile(model) if entry == ENTRIES[0] else torch.compile(model, backend="gensorage")


class Mlp(torch.nn.Module):
    def __init__(self, d: int = 32, f: int = 64) -> None:
        super().__init__()
        self.up = torch.nn.Linear(d, f, bias=False)
        self.down = torch.nn.Linear(f, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.silu(self.up(x)))


class CacheStep(torch.nn.Module):
    """Writes the new token's key into the last row of the cache it is given (in place), then reads the cache."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.k = torch.nn.Linear(d, d, bias=False)
        self.o = torch.nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
        cache[:, -1:].copy_(self.k(x))
        return self.o(torch.softmax(cache * 0.5, dim=-1).sum(dim=1, keepdim=True))


class Viewing(torch.nn.Module):
    """Returns a view of its input next to a computed value: the view must alias the input, as in eager."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return F.silu(self.lin(x)), x.transpose(0, 1)


def assert_gradients_match(model: Any, compiled: Any, rows: int, seed: int) -> None:
    """The input's and the parameters' gradients through ``compiled`` equal eager ``model``'s, on a fresh
    ``rows`` × 32 input."""
    x = torch.randn(rows, 32, generator=torch.Generator().manual_seed(seed), requires_grad=True)
    x_eager = x.detach().clone().requires_grad_(True)
    model.zero_grad()
    compiled(x).square().sum().backward()
    got = [x.grad, *(p.grad for p in model.parameters())]
    model.zero_grad()
    model(x_eager).square().sum().backward()
    want = [x_eager.grad, *(p.grad for p in model.parameters())]
    for g, w in zip(got, want, strict=True):
        assert g is not None and w is not None
        assert_close(g, w, 1e-3)


def _ran_in_gensorage(compiled: Any) -> bool:
    if isinstance(compiled, gtorch.Compiled):
        return any(": gensorage: " in ln for ln in compiled.explain().splitlines())
    return True  # the registered backend's report is process-wide: the outputs are judged instead


@pytest.mark.parametrize("entry", ENTRIES)
def test_gradients_reach_the_parameters_and_the_input(entry: str) -> None:
    torch.manual_seed(0)
    model = Mlp()
    compiled = _compile(model, entry)
    for seed in (1, 2):  # the second call is a repeated shape
        assert_gradients_match(model, compiled, 8, seed)
    assert _ran_in_gensorage(compiled)


@pytest.mark.parametrize("entry", ENTRIES)
def test_an_input_updated_in_place_is_updated(entry: str) -> None:
    torch.manual_seed(0)
    model = CacheStep().eval()
    compiled = _compile(model, entry)
    with torch.no_grad():
        for seed in (1, 2, 3):
            g = torch.Generator().manual_seed(seed)
            x, cache = torch.randn(2, 1, 32, generator=g), torch.randn(2, 6, 32, generator=g)
            before, cache_eager = cache.clone(), cache.clone()
            got, want = compiled(x, cache), model(x, cache_eager)
            assert_close(got, want, 1e-3)
            assert torch.equal(cache[:, :-1], before[:, :-1])  # the other rows untouched
            assert not torch.equal(cache[:, -1:], before[:, -1:])
            assert_close(cache[:, -1:], cache_eager[:, -1:], 1e-3)  # the new row written (maybe by kernels)
    assert _ran_in_gensorage(compiled)


def test_the_modules_hooks_run_once_per_call() -> None:
    torch.manual_seed(0)
    model = Mlp().eval()
    calls: list[str] = []
    model.register_forward_pre_hook(lambda m, a: (calls.append("pre"), (2.0 * a[0],))[1])
    model.register_forward_hook(lambda m, a, out: (calls.append("post"), out + 1.0)[1])
    compiled = gtorch.compile(model)
    with torch.no_grad():
        x = torch.randn(8, 32, generator=torch.Generator().manual_seed(1))
        want = model(x)
        calls.clear()
        for _ in range(3):
            assert_close(compiled(x), want, 1e-3)
    assert calls == ["pre", "post"] * 3
    assert _ran_in_gensorage(compiled)


def test_a_subgraph_called_at_other_shapes_gives_torchs_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A checked subgraph takes the first call's shapes at once; other shapes (a guard that let them through)
    get torch's answer, and its kernels stay for the shapes they were checked at."""
    seen: list[tuple[Any, tuple[torch.Tensor, ...]]] = []
    real = subgraph.GensorageSubgraph.forward

    def spy(self: Any, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        seen.append((self, args))
        return real(self, *args)

    monkeypatch.setattr(subgraph.GensorageSubgraph, "__call__", spy)
    torch.manual_seed(0)
    model = Mlp().eval()
    compiled = gtorch.compile(model)
    with torch.no_grad():
        compiled(torch.randn(8, 32))
        (sub, args), *_ = seen
        assert sub._kernels is not None
        other = [torch.randn(4, *a.shape[1:]) if a.shape[0] == 8 else a for a in args]
        ran: list[bool] = []
        monkeypatch.setattr(subgraph, "run_kernels", lambda *a: ran.append(True) or [])
        got = sub(*other)
        assert not ran and sub._kernels is not None
        for g, w in zip(got, sub.sub(*other), strict=True):
            assert torch.equal(g, w)


def test_a_later_call_casts_where_the_checked_call_did(monkeypatch: pytest.MonkeyPatch) -> None:
    """The arguments the checked call had to cast (a 0-d value, ``(1,)`` in the Program) are cast at every
    call; an argument in another dtype where the checked call had none to cast (a call no guard of dynamo's
    lets through) gets torch's answer, the subgraph staying in torch with the runner's reason."""
    seen: list[tuple[Any, tuple[torch.Tensor, ...]]] = []
    real = subgraph.GensorageSubgraph.forward

    def spy(self: Any, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        seen.append((self, args))
        return real(self, *args)

    monkeypatch.setattr(subgraph.GensorageSubgraph, "__call__", spy)

    def scaled(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x * s, dim=-1) + s

    compiled = gtorch.compile(scaled)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 16, generator=g)
    with torch.no_grad():
        for v in (0.5, 2.0, -1.0):  # the first call checks; the others take the precomputed casts
            s = torch.tensor(v)
            assert_close(compiled(x, s), scaled(x, s), 1e-5)
        (sub, args), *_ = seen
        assert sub._kernels is not None and sub._cast == tuple(
            i for i, a in enumerate(args) if a.dim() == 0
        ), sub._cast
        other = [a.double() if a.dim() else a for a in args]  # a float64 tensor where float32 was checked
        got = sub(*other)
        for gt, w in zip(got, sub.sub(*other), strict=True):
            assert gt.dtype == w.dtype and torch.equal(gt, w)
    assert sub._kernels is None and "float64" in compiled.explain(), compiled.explain()


def test_the_runner_checks_torch_tensors_at_every_call(tmp_path: Path) -> None:
    """The inline check passes a CPU torch tensor of the kernels' shape and a dtype seen before; anything else
    gets the full check: a wrong shape or dtype is a one-line error at any call, not only the first."""
    from test_dispatch import softmax

    from gensorage.superopt.dispatch import Dispatcher
    from gensorage.torch.device import _empty

    e = Dispatcher(store=tmp_path / "s.sqlite").kernels(softmax(4, 8))
    runner = e.runner
    assert isinstance(runner, KernelRunner)
    x = torch.randn(4, 8)
    want = torch.softmax(x, dim=-1)
    for _ in range(2):
        assert_close(runner([x], _empty)[0], want, 1e-5)
    with pytest.raises(ProgramError, match="shape"):
        runner([torch.randn(2, 8)], _empty)
    with pytest.raises(ProgramError, match="float64"):
        runner([x.double()], _empty)
    assert_close(runner([x], _empty)[0], want, 1e-5)


def test_an_input_tvm_refuses_is_prepared_only_where_it_must_be(tmp_path: Path) -> None:
    """The runner imports each array as it is; a strided or misaligned one is a one-line error, or with
    ``prepare`` (the torch call path's :func:`~gensorage.torch.device.aligned`) it is copied, and only it: an
    aligned contiguous array reaches the kernels by pointer. Outputs are fresh tensors at every call."""
    from test_dispatch import softmax

    from gensorage.superopt.dispatch import Dispatcher
    from gensorage.torch.device import _empty, aligned, run_on_device

    e = Dispatcher(store=tmp_path / "s.sqlite").kernels(softmax(4, 8))
    runner = e.runner
    assert isinstance(runner, KernelRunner)
    prepared: list[torch.Tensor] = []

    def prepare(a: torch.Tensor) -> torch.Tensor:
        prepared.append(a)
        return aligned(a)

    base = torch.randn(8, 9)
    strided = (base[:4, :8], torch.randn(8, 4).t(), torch.randn(8, 4, requires_grad=True).t())
    for x in (*strided, torch.randn(33)[1:].view(4, 8)):  # and a misaligned one
        with pytest.raises(ProgramError, match="cannot take these arrays through DLPack"):
            runner([x], _empty)
        assert_close(runner([x], _empty, prepare)[0], torch.softmax(x.detach(), dim=-1), 1e-5)
        assert prepared[-1] is x
    x = torch.randn(4, 8)
    prepared.clear()
    first = runner([x], _empty, prepare)[0]
    second = run_on_device(e, [x])[0]
    assert not prepared and first.data_ptr() != second.data_ptr()
    assert_close(first, torch.softmax(x, dim=-1), 1e-5)
    assert_close(second, torch.softmax(x, dim=-1), 1e-5)


def test_outputs_keep_torchs_layout_at_every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """An output in a layout of torch's (an elementwise op on a transpose keeps its strides) has that layout at
    every later call, not only the checked one: ``run_kernels`` learns at the first run that its outputs need the
    copy; a graph whose outputs are the kernels' own tensors returns them, fresh at every call."""
    lowered: list[subgraph.Lowered] = []
    real = subgraph.run_kernels

    def spy(low: subgraph.Lowered, *rest: Any) -> Any:
        lowered.append(low)
        return real(low, *rest)

    monkeypatch.setattr(subgraph, "run_kernels", spy)

    def transposed(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.softmax(x * 2.0, dim=-1)
        return y.t() + 1.0, y * 3.0

    def plain(x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x * 2.0, dim=-1) * 3.0

    for f, want_plain in ((transposed, False), (plain, True)):
        compiled, kept = gtorch.compile(f), []
        for seed in range(4):
            x = torch.randn(8, 16, generator=torch.Generator().manual_seed(seed))
            got, want = compiled(x), f(x)
            got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
            for g, w in zip(got, want, strict=True):
                assert g.stride() == w.stride()
                assert_close(g, w, 1e-5)
                kept.append(g)  # alive: a pointer seen twice is memory shared by two results
        assert _ran_in_gensorage(compiled), compiled.explain()
        assert lowered[-1].plain is want_plain and len({g.data_ptr() for g in kept}) == len(kept)


@pytest.mark.parametrize("entry", ENTRIES)
def test_aotautograds_runtime_wrapper_is_skipped_only_where_it_would_do_nothing(
    entry: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain inference graph is called without AOTAutograd's runtime wrapper; a graph that mutates an input,
    returns a view of one, or needs autograd keeps it, and each gives eager's answer and aliasing."""
    decisions: list[bool] = []
    real = backend.runtime_wrapper_marks

    def spy(fw: Any, inputs: Any) -> Any:
        marks = real(fw, inputs)
        decisions.append(marks == ())  # static shapes: nothing to mark
        return marks

    monkeypatch.setattr(backend, "runtime_wrapper_marks", spy)
    torch._dynamo.reset()  # the registered backend's earlier captures of these classes would be reused
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 32, generator=g)
    with torch.no_grad():
        mlp = Mlp().eval()
        assert_close(_compile(mlp, entry)(x), mlp(x), 1e-3)
        assert decisions == [True]
        step, cache = CacheStep().eval(), torch.randn(2, 6, 32, generator=g)
        before = cache.clone()
        _compile(step, entry)(x[:2, None], cache)
        assert decisions[1:] == [False] and not torch.equal(cache[:, -1:], before[:, -1:])
        viewing = Viewing().eval()
        got, view = _compile(viewing, entry)(x)
        assert decisions[2:] == [False]
        assert_close(got, viewing(x)[0], 1e-3)
        assert view.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()  # a view of x, not a copy
    xg = x.clone().requires_grad_(True)
    _compile(Mlp(), entry)(xg).sum().backward()  # a training graph: AOTAutograd's own path, not asked
    assert decisions[3:] == [] and xg.grad is not None

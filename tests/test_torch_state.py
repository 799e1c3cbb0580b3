"""State that changes between or during calls of a compiled model: weights updated after compiling (an optimizer
step, ``load_state_dict``, a cast of the whole model), buffers written inside ``forward`` (a KV cache by slice
assignment and by ``index_copy_``, a RoPE table rebuilt for a longer sequence), an input changed in place,
Python attributes and globals read by ``forward``, and outputs that alias one another.

Each runs the compiled model next to an eager twin (a deep copy given the same changes) through both entry
points, compares outputs, inputs and buffers after every call, and checks that gensorage ran a subgraph.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import gensorage.torch as gtorch  # noqa: E402
from gensorage.torch import backend  # noqa: E402

Step = tuple[Callable[[nn.Module], None] | None, Callable[[], tuple[Any, ...]]]


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENSORAGE_HOME", str(tmp_path / "home"))


def _compiled(model: nn.Module, entry: str) -> tuple[Callable[..., Any], Callable[[], str]]:
    """``model`` compiled through ``entry`` and a function giving the report's new lines since."""
    if entry == "gensorage.torch.compile":
        compiled = gtorch.compile(model)
        return compiled, compiled.explain
    torch._dynamo.reset()  # the registered backend's graphs for an earlier model are not reused
    seen = len(backend._REGISTERED_REPORT.lines)
    return torch.compile(model, backend="gensorage"), lambda: "\n".join(
        backend._REGISTERED_REPORT.lines[seen:]
    )


def _same(got: Any, want: Any, rel: float = 1e-5) -> None:
    if isinstance(want, tuple | list):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _same(g, w, rel)
        return
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape)
    torch.testing.assert_close(got, want, rtol=rel, atol=rel * float(want.detach().abs().max()))


def _run_twins(make: Callable[[], nn.Module], steps: Sequence[Step], entry: str, rel: float = 1e-5) -> str:
    """Run ``steps`` (a change made to both models, then the call's arguments) on ``make()`` compiled and on an
    eager copy; outputs, the arguments after the call and the buffers agree at every step. The report."""
    torch.manual_seed(0)
    mine = make()
    eager = copy.deepcopy(mine)
    compiled, report = _compiled(mine, entry)
    for change, make_args in steps:
        if change is not None:
            change(eager)
            change(mine)
        args = make_args()
        theirs = copy.deepcopy(args)
        _same(compiled(*args), eager(*theirs), rel)
        _same(
            [a for a in args if isinstance(a, torch.Tensor)],
            [a for a in theirs if isinstance(a, torch.Tensor)],
        )
        _same(list(mine.buffers()), list(eager.buffers()), rel)
    text = report()
    assert ": gensorage: " in text, text
    return text


ENTRIES = ["gensorage.torch.compile", "backend=gensorage"]


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(16, 32), nn.Linear(32, 16, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.up(x))) * 2.0


def _x(dtype: torch.dtype = torch.float32) -> Callable[[], tuple[torch.Tensor]]:
    return lambda: (torch.randn(2, 5, 16).to(dtype),)


def _sgd_step(model: nn.Module) -> None:
    """One optimizer step on ``model`` (grad mode on: a training graph, its backward in torch)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model(torch.ones(2, 5, 16)).square().sum().backward()
    optimizer.step()


def _other_state(model: nn.Module) -> None:
    torch.manual_seed(7)
    model.load_state_dict(_Mlp().state_dict())


WEIGHT_CASES: dict[str, tuple[list[Step], float]] = {
    "optimizer step": ([(None, _x()), (_sgd_step, _x()), (None, _x())], 1e-5),
    "load_state_dict, then bfloat16": (
        [(None, _x()), (_other_state, _x()), (lambda m: m.to(torch.bfloat16), _x(torch.bfloat16))],
        2e-2,
    ),
}


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("case", WEIGHT_CASES)
def test_weights_changed_after_compiling_are_used(case: str, entry: str) -> None:
    """The next call after the weights change uses the new weights (nothing is baked into the kernels), as
    eager does: updated in place by an optimizer, loaded from another model, the model cast to bfloat16."""
    steps, rel = WEIGHT_CASES[case]
    with torch.set_grad_enabled(case == "optimizer step"):
        _run_twins(_Mlp, steps, entry, rel)


class _KVCache(nn.Module):
    """Keys and values written into buffers inside forward (slice assignment at ``pos``: one graph per position)
    and read back in the same call and the next."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(16, 16, bias=False) for _ in range(3))
        self.register_buffer("keys", torch.zeros(2, 12, 16))
        self.register_buffer("values", torch.zeros(2, 12, 16))

    def forward(self, x: torch.Tensor, pos: int) -> torch.Tensor:
        end = pos + x.shape[1]
        self.keys[:, pos:end] = self.k(x)
        self.values[:, pos:end] = self.v(x)
        scores = self.q(x) @ self.keys[:, :end].transpose(1, 2) / 4.0
        return torch.softmax(scores, dim=-1) @ self.values[:, :end]


class _IndexCopyCache(_KVCache):
    """The same with the positions as a tensor (HF StaticCache's ``index_copy_``): one graph for every step."""

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        self.keys.index_copy_(1, pos, self.k(x))
        self.values.index_copy_(1, pos, self.v(x))
        return torch.softmax(self.q(x) @ self.keys.transpose(1, 2) / 4.0, dim=-1) @ self.values


class _RebuiltRope(nn.Module):
    """A cos/sin table kept as buffers and rebuilt (new buffers) when a longer sequence comes, as HF's rotary
    embeddings did."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(16, 16, bias=False)
        self._build(4)

    def _build(self, length: int) -> None:
        inv = 1.0 / 10000 ** (torch.arange(0, 16, 2).float() / 16)
        angles = torch.outer(torch.arange(length).float(), inv).repeat(1, 2)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        self.length = length

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        if t > self.length:
            self._build(t)
        q = self.q(x)
        return q * self.cos[:t] + torch.cat((-q[..., 8:], q[..., :8]), dim=-1) * self.sin[:t]


def _tokens(n: int, *rest: Any) -> Callable[[], tuple[Any, ...]]:
    return lambda: (torch.randn(2, n, 16), *rest)


BUFFER_CASES: dict[str, tuple[Callable[[], nn.Module], list[Step]]] = {
    "kv cache by slices": (_KVCache, [(None, _tokens(4, 0)), (None, _tokens(1, 4)), (None, _tokens(1, 5))]),
    "kv cache by index_copy_": (
        _IndexCopyCache,
        [(None, _tokens(2, torch.tensor([0, 1]))), (None, _tokens(1, torch.tensor([2])))],
    ),
    "rope table rebuilt": (_RebuiltRope, [(None, _tokens(4)), (None, _tokens(7)), (None, _tokens(3))]),
}


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("case", BUFFER_CASES)
def test_buffers_written_inside_forward(case: str, entry: str) -> None:
    """Buffers written in forward and read back in the same call and the next (a prefill, then decode steps), or
    replaced by new ones: outputs and buffers match eager's after each call."""
    make, steps = BUFFER_CASES[case]
    with torch.no_grad():
        _run_twins(make, steps, entry)


class _AddsToInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.sigmoid(self.lin(x))
        x.mul_(y)  # the caller's tensor, changed by a value gensorage computes
        return y + 1.0


SCALE = 1.0


class _ReadsPythonState(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.use_exp = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x) * SCALE
        return torch.softmax(y, dim=-1) if self.use_exp else torch.relu(y)


@pytest.mark.parametrize("entry", ENTRIES)
def test_inputs_changed_in_place_and_python_state_between_calls(entry: str) -> None:
    """The caller's input is changed as eager changes it; a flag on the module and a global read by forward,
    changed between calls, take effect at the next call (dynamo guards them)."""

    def flag(model: nn.Module) -> None:
        model.use_exp = True

    def scale(model: nn.Module) -> None:
        global SCALE
        SCALE = 3.0  # both twins read it; the second call of this step sets it again

    with torch.no_grad():
        _run_twins(_AddsToInput, [(None, _x()), (None, _x())], entry)
        try:
            _run_twins(_ReadsPythonState, [(None, _x()), (flag, _x()), (scale, _x())], entry)
        finally:
            globals()["SCALE"] = 1.0


class _Aliasing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 48)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = torch.sigmoid(self.lin(x))
        q, k, _ = y.split(16, dim=-1)
        return y, y.transpose(-1, -2), q[..., 2:], k


@pytest.mark.parametrize("entry", ENTRIES)
def test_outputs_that_alias_each_other_still_do(entry: str) -> None:
    """Outputs that are views of one value share its memory, as in eager torch and inductor: a write into one
    shows in the others. The views stay in torch (the report says why), the value is computed by gensorage.
    (With grad mode off AOTAutograd leaves the aliasing to the compiled graph: each view was a kernel's new
    tensor.)"""
    torch.manual_seed(0)
    model = _Aliasing()
    compiled, report = _compiled(model, entry)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        got, want = compiled(x), model(x)
        _same(got, want)
        for outs in (got, want):
            outs[0][0, 0, 2] = 7.0
        _same(got, want)
        assert got[1][0, 2, 0] == 7.0 and got[2][0, 0, 0] == 7.0
        assert [o.stride() for o in got] == [o.stride() for o in want]
    text = report()
    assert ": gensorage: " in text and "a view of another output" in text, text


@pytest.mark.parametrize("entry", ENTRIES)
def test_hooks_added_after_compiling_with_dynamo_guarding_them(entry: str) -> None:
    """torch.compile does not guard submodules' hooks by default (``skip_nnmodule_hook_guards``, with any
    backend: a hook added after the first call is not run). With it off, as the docs say to set it, a hook added
    or removed later recompiles the graph and gensorage runs the new one."""

    def hook(model: nn.Module) -> None:
        model.up.register_forward_pre_hook(lambda module, args: (args[0] + 1.0,))

    def unhook(model: nn.Module) -> None:
        model.up._forward_pre_hooks.clear()

    with torch.no_grad(), torch._dynamo.config.patch(skip_nnmodule_hook_guards=False):
        _run_twins(_Mlp, [(None, _x()), (hook, _x()), (unhook, _x())], entry)

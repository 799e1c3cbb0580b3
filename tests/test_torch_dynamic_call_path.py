"""A repeated call of a graph dynamo captured with symbolic shapes (``torch.compile(model, backend="gensorage")``
from the second new shape on): the per-shape graph is looked up by the symbols' values alone and, for a plain
inference graph, called without AOTAutograd's runtime wrapper, making the wrapper's marks of the outputs' dynamic
dims itself. Other strides and dtypes still give eager's answer (dynamo's guards), an input updated in place is
updated and gradients reach the parameters (the wrapper kept there)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from test_torch_call_path import CacheStep, Mlp, assert_gradients_match  # noqa: E402
from test_torch_frontend import assert_close  # noqa: E402

import gensorage  # noqa: E402, F401  (registers the backend)
from gensorage.torch import backend, per_shape  # noqa: E402

MARKS = "_dynamo_propagated_dynamic_indices"


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENSORAGE_HOME", str(tmp_path / "home"))


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Any:
    torch._dynamo.reset()  # earlier captures of these classes (another backend, static shapes) would be reused
    yield
    torch._dynamo.reset()


class CacheRead(torch.nn.Module):
    """Attends over a cache extended by the new token's key, and returns the extended cache (a dynamic dim)."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.k = torch.nn.Linear(d, d, bias=False)
        self.o = torch.nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor, past: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k = torch.cat((past, self.k(x)), dim=0)
        return self.o(torch.softmax(x @ k.T / 4.0, dim=-1) @ k), k


def _inputs(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 16, generator=g), torch.randn(n, 16, generator=g)


def _spy_per_shape(monkeypatch: pytest.MonkeyPatch) -> dict[tuple[Any, Any], set[Any]]:
    """Each per-shape graph's specialisation (graph, key): the full keys (shapes, strides, dtypes, devices of
    every input) of the calls it served."""
    served: dict[tuple[Any, Any], set[Any]] = {}
    real = per_shape.PerShape.__call__

    def spy(self: Any, *args: Any) -> Any:
        served.setdefault((self, self._key(args)), set()).add(per_shape.shape_key(args))
        return real(self, *args)

    monkeypatch.setattr(per_shape.PerShape, "__call__", spy)
    return served


def test_a_symbolic_graph_is_keyed_by_its_symbols_and_marks_its_outputs_as_aot_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    marks: list[Any] = []
    real = backend.runtime_wrapper_marks
    monkeypatch.setattr(
        backend, "runtime_wrapper_marks", lambda fw, ex: marks.append(real(fw, ex)) or marks[-1]
    )
    served = _spy_per_shape(monkeypatch)
    torch.manual_seed(0)
    model = CacheRead().eval()
    compiled = torch.compile(model, backend="gensorage")
    reference = torch.compile(model, backend="aot_eager")  # AOTAutograd's wrapper, torch's kernels
    with torch.no_grad():
        for n in (4, 5, 7, 5, 7):  # from 5 on a symbolic graph; 5 and 7 again: looked up
            x, past = _inputs(n, seed=n)
            (got, k), (want, k_want) = compiled(x, past), model(x, past)
            assert_close(got, want, 1e-3)
            assert_close(k, k_want, 1e-3)
            _, k_aot = reference(x, past)
            assert getattr(k, MARKS, None) == getattr(k_aot, MARKS, None)
            if n != 4:
                assert getattr(k, MARKS) == {0}  # the cache's length: dynamic for a graph that takes k
    assert marks[0] == () and len(marks) == 2 and marks[1], marks  # static, then symbolic: wrapper skipped
    (graph,) = {g for g, _ in served}
    assert sorted(graph.graphs) == [5, 7]  # the cache length, as dynamo passes it: the whole key


def test_other_strides_and_dtypes_of_a_symbolic_graph_give_eagers_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The key leaves out what dynamo's guards check: an input at other strides or in another dtype is
    captured again (or served by a graph of its own), never run by a graph specialised for other ones."""
    served = _spy_per_shape(monkeypatch)
    torch.manual_seed(0)
    model = CacheRead().eval()
    compiled = torch.compile(model, backend="gensorage")
    with torch.no_grad():
        for n in (4, 5, 7):
            compiled(*_inputs(n, seed=n))
        x, past = _inputs(7, seed=1)
        for other in (
            torch.randn(16, 7).t(),  # same sizes, other strides
            torch.randn(7, 32)[:, ::2],  # a strided view
            torch.randn(9, 16)[2:],  # an offset into a larger cache
            past.half(),  # another dtype (promoted to float32 by the cat)
            past.bfloat16(),
        ):
            (got, k), (want, k_want) = compiled(x, other), model(x, other)
            assert got.dtype == want.dtype and k.dtype == k_want.dtype
            assert_close(got, want, 1e-3)
            assert_close(k, k_want, 1e-3)
    assert len(served) >= 2, served  # 5 and 7 at least
    for (_, key), calls in served.items():
        assert len(calls) == 1, (
            key,
            calls,
        )  # each specialisation ran at the layout and dtypes it was made for


def test_key_positions_key_a_tensor_by_its_sizes_where_no_integer_input_carries_its_symbol() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    mode = FakeTensorMode(shape_env=ShapeEnv())
    both = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.DYNAMIC])
    a = mode.from_tensor(torch.randn(5, 7), symbolic_context=both)
    w = mode.from_tensor(torch.randn(4, 4), static_shapes=True)
    assert per_shape.key_positions([w, a, a.shape[0], a.shape[1]]) == ((2, 3), ())  # both carried
    assert per_shape.key_positions([w, a, a.shape[0]]) == ((2,), (1,))  # a's second size only in a
    assert per_shape.key_positions([w, a]) == ((), (1,))
    assert per_shape.key_positions([w, 2.5]) == ((1,), ())


def test_a_symbolic_graph_that_updates_an_input_in_place_keeps_the_wrapper_and_updates_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    marks: list[Any] = []
    real = backend.runtime_wrapper_marks
    monkeypatch.setattr(
        backend, "runtime_wrapper_marks", lambda fw, ex: marks.append(real(fw, ex)) or marks[-1]
    )
    torch.manual_seed(0)
    model = CacheStep().eval()
    compiled = torch.compile(model, backend="gensorage")
    with torch.no_grad():
        for n in (6, 7, 9, 7):
            g = torch.Generator().manual_seed(n)
            x, cache = torch.randn(2, 1, 32, generator=g), torch.randn(2, n, 32, generator=g)
            cache_eager = cache.clone()
            assert_close(compiled(x, cache), model(x, cache_eager), 1e-3)
            assert_close(cache, cache_eager, 1e-3)  # the new row written, the others untouched
    assert len(marks) == 2 and marks[1] is None, marks  # the symbolic graph keeps AOTAutograd's wrapper


def test_gradients_of_a_symbolic_graph_reach_the_parameters_and_the_input() -> None:
    torch.manual_seed(0)
    model = Mlp()
    compiled = torch.compile(model, backend="gensorage")
    for rows in (8, 9, 11, 9):
        assert_gradients_match(model, compiled, rows, rows)

"""A compiled model called at many sequence lengths: what dynamo keeps per length, and a repeated length's lookup.

``gensorage.torch.compile`` captures one static graph per length: dynamo keeps one cache entry (graph and guards)
per length and checks them newest first, moving the entry a call hits to the front, so a repeated length checks
one entry's guards however many lengths were seen (``benchmarks/call_overhead.py --lengths-seen`` measures the
call). ``torch.compile(model, backend="gensorage")`` keeps one symbolic entry from the second length on (length
1 has one of its own: dynamo specialises sizes 0 and 1), and a static partition per length in it (:class:`gensorage.torch.per_shape.PerShape`). Behaviour only, no timing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import gensorage.torch as gtorch  # noqa: E402
from gensorage.torch import per_shape  # noqa: E402

LENGTHS = (5, 1, 2, 3, 4, 6, 7, 9, 10, 11, 12, 13)


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENSORAGE_HOME", str(tmp_path / "home"))


def block() -> nn.Module:
    """A model of the class defined here, with dynamo's caches emptied: its entries are per code object (the
    same ``forward`` for every call of this function), and automatic dynamic shapes remember the code's sizes."""
    torch._dynamo.reset()

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.proj(x)) * 2.0

    torch.manual_seed(0)
    return Block().eval()


def entries(model: nn.Module) -> list:
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return list(_debug_get_cache_entry_list(type(model).forward.__code__))


def run_all(compiled: object, model: nn.Module) -> None:
    with torch.no_grad():
        for t in LENGTHS:
            x = torch.randn(1, t, 8)
            got, want = compiled(x), model(x)  # type: ignore[operator]
            assert got.shape == want.shape
            assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item() + 1e-6, t


def test_static_capture_keeps_one_entry_per_length_and_a_hit_moves_to_the_front() -> None:
    model = block()
    compiled = gtorch.compile(model)
    run_all(compiled, model)
    kept = entries(model)
    assert len(kept) == len(LENGTHS)
    said = compiled.explain().splitlines()
    assert len([ln for ln in said if ": gensorage: " in ln]) == len(LENGTHS), said  # one subgraph a length
    x = torch.randn(1, LENGTHS[0], 8)  # the oldest entry: checked last until it is hit
    with torch.no_grad():  # grad mode is among the guards
        compiled(x)
        kept = entries(model)
        assert len(kept) == len(LENGTHS)  # a hit, no new capture
        # the hit entry is now the first dynamo checks: its guards pass for the repeated length, the next's fail
        assert kept[0].guard_manager.check({"self": model, "x": x})
        assert not kept[1].guard_manager.check({"self": model, "x": x})


def test_symbolic_capture_keeps_one_symbolic_entry_and_a_partition_per_length(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    made: list[per_shape.PerShape] = []
    init = per_shape.PerShape.__init__

    def recording_init(self: per_shape.PerShape, *a: object, **k: object) -> None:
        init(self, *a, **k)  # type: ignore[arg-type]
        made.append(self)

    monkeypatch.setattr(per_shape.PerShape, "__init__", recording_init)
    model = block()
    compiled = torch.compile(model, backend="gensorage", options={"explain": True})
    run_all(compiled, model)
    # static entries for the first length and for length 1 (dynamo specialises sizes 0 and 1), then one
    # symbolic entry (dynamo's automatic dynamic shapes) with a static partition per length for the rest
    symbolic = len(LENGTHS) - 2
    assert len(entries(model)) == 3
    assert len(made) == 1 and len(made[0].graphs) == symbolic
    run_all(compiled, model)  # every length again: no new entry
    assert len(entries(model)) == 3
    # the symbolic entry, newer, is checked before the first length's own and takes it: one partition more
    assert len(made[0].graphs) == symbolic + 1
    run_all(compiled, model)
    assert len(entries(model)) == 3 and len(made[0].graphs) == symbolic + 1
    said = capsys.readouterr().err
    assert said.count("specialised to its inputs' shapes") == symbolic + 1, said
    assert "stays in torch" not in said, said  # every subgraph's kernels used
    graphs = [ln for ln in said.splitlines() if "ops in gensorage subgraphs" in ln]
    assert len(graphs) == len(LENGTHS) + 1 and all(" 0 of" not in ln for ln in graphs), said

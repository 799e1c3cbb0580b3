"""A sigmoid as the torch front end lowers it, ``a / (a + b)`` of two exps, is in [0, 1], so the float32 policy
stores it in the program's dtype (gensorage.precision.value_range, "unit") and a matmul after a sigmoid-gated
value multiplies 16-bit operands instead of a float32 one in bfloat16.

Found on CLIP's quick_gelu ``h · sigmoid(1.702 h)`` before a projection, float16 through the torch front end:
2.55e-3 from the float64 model where eager is 3.9e-4 (the gate alone: equal to eager's, 3.1e-4).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest

from gensorage.program import Program, Tensor
from gensorage.ugraph import from_program
from gensorage.ugraph.shapes import infer


def _division_dtype(share: Callable[[Program, Tensor], tuple[Tensor, Tensor, Tensor]]) -> str:
    """The stored dtype of ``num / (t1 + t2)`` (``share`` gives the three) in a float16 gate before a matmul."""
    p = Program("gate")
    h = p.input("H", (8, 64), "float16")
    num, t1, t2 = share(p, h)
    gate = p.div(num, p.add(t1, t2))
    p.output(p.matmul(p.mul(h, gate), p.input("W", (64, 32), "float16")))
    g = from_program(p)
    info = infer(g)
    dtypes = [info.nodes[len(g.inputs) + k][0].dtype for k in range(len(g.ops))]
    (k,) = [k for k, op in enumerate(g.ops) if op.op.value == "div"]
    return dtypes[k]


def _exps(p: Program, h: Tensor) -> tuple[Tensor, Tensor]:
    """exp_pair's two exps: ``exp(−relu(−h))`` and ``exp(−relu(h))``."""
    return p.exp(p.scale(p.relu(p.scale(h, -1.0)), -1.0)), p.exp(p.scale(p.relu(h), -1.0))


def _share(which: int) -> Callable[[Program, Tensor], tuple[Tensor, Tensor, Tensor]]:
    def build(p: Program, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        a, b = _exps(p, h)
        return (a, b)[which], a, b

    return build


def test_a_share_of_two_exps_is_stored_in_the_program_dtype() -> None:
    assert _division_dtype(_share(0)) == "float16"  # a / (a + b): the sigmoid
    assert _division_dtype(_share(1)) == "float16"  # b / (a + b)


def test_what_is_not_a_share_of_exps_stays_float32() -> None:
    def no_exp_term(p: Program, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        a, _ = _exps(p, h)
        return a, a, h  # h may be negative: a / (a + h) is unbounded

    def other_numerator(p: Program, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return p.exp(h), *_exps(p, h)  # exp(h) / (a + b) can be as large as exp(h)

    assert _division_dtype(no_exp_term) == "float32"
    assert _division_dtype(other_numerator) == "float32"


def test_quick_gelu_then_a_projection_in_float16_is_as_accurate_as_eager(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = pytest.importorskip("torch")
    import gensorage.torch as gtorch

    monkeypatch.setenv("GENSORAGE_HOME", str(tmp_path))

    class QuickGeluMlp(torch.nn.Module):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(16, 64), torch.nn.Linear(64, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[name-defined]
            h = self.fc1(x)
            return self.fc2(h * torch.sigmoid(1.702 * h))

    torch.manual_seed(0)
    exact = QuickGeluMlp().double()
    model = copy.deepcopy(exact).half()
    compiled = gtorch.compile(model)
    x = (10 * torch.randn(2, 5, 16, dtype=torch.float64)).half()
    with torch.no_grad():
        want, got, eager = exact(x.double()), compiled(x), model(x)

    def error(t: torch.Tensor) -> float:  # type: ignore[name-defined]
        return float((t.double() - want).abs().max() / want.abs().max())

    assert ": gensorage: " in compiled.explain(), compiled.explain()
    assert error(got) <= 1.5 * error(eager), (error(got), error(eager))

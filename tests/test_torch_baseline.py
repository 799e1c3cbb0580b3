"""The torch baseline of the GPU benchmark computes the program's function (skipped where torch is missing)."""

from __future__ import annotations

import numpy as np
import pytest

from gensorage.baselines.torch_eager import torch_program
from gensorage.program import list_configs, load_config
from gensorage.superopt import load_preset

torch = pytest.importorskip("torch")

NAMES = [p.stem for p in list_configs()]


@pytest.mark.parametrize("name", NAMES)
def test_torch_baseline_matches_the_float64_reference(name: str) -> None:
    program = load_config(name, load_preset(name).search_params)
    xs = program.random_inputs(7)
    outs = torch_program(program, torch, [torch.from_numpy(x) for x in xs])()
    want = program.run(*xs)
    assert len(outs) == len(want)
    for got, ref in zip(outs, want, strict=True):
        np.testing.assert_allclose(got.numpy(), ref, rtol=1e-12, atol=1e-12)


def test_a_wrong_baseline_is_caught() -> None:
    program = load_config("rmsnorm", load_preset("rmsnorm").search_params)
    xs = program.random_inputs(0)
    outs = torch_program(program, torch, [torch.from_numpy(x) for x in xs])()
    assert not np.allclose(outs[0].numpy(), program.run(*[x * 2.0 for x in xs])[0])

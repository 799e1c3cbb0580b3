"""Dim strategies (Mirage's candidate imaps, omaps and fmaps): files, spec field, and the restriction law."""

from __future__ import annotations

import dataclasses
import itertools
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gensorage.errors import ConfigError
from gensorage.exhaustive import SearchSpec
from gensorage.exhaustive.dim_strategy import (
    DimStrategy,
    fits,
    imap_placements,
    list_dim_strategies,
    load_dim_strategy,
    slotted,
)
from gensorage.exhaustive.results import ugraph_key
from gensorage.superopt.presets import load_preset
from gensorage.ugraph.ir import GraphDefinedOp, InputIterator, KernelGraph, OutputSaver
from tests.test_walk import Recorder, exp_matmul

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------ files


def test_bundled_strategies_load() -> None:
    assert {"attention", "mlp", "lora"} <= set(list_dim_strategies())
    att = load_dim_strategy("attention")
    assert att.name == "attention"
    assert (0, -1, 1) in att.imaps and (0, 2, 1) in att.omaps  # type: ignore[operator]
    assert att.allowed_fmaps() == frozenset({None, 1, 2})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("imaps = [[0, 0, 1]]", "two grid slots to one data dim"),
        ("imaps = [[0, 1]]", "is not [x, y, z]"),
        ("imaps = []", "non-empty list"),
        ("fmaps = [-2]", "fmaps must be"),
        ("omaps = 3", "omaps must be"),
        ("grid = [[16, 1, 1]]", "unknown field(s) grid"),
        ("imaps = [[0, -1, -1]", "cannot read dim strategy"),
    ],
)
def test_broken_strategy_files_are_one_line_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text + "\n")
    with pytest.raises(
        ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
    ):
        load_dim_strategy(str(path))


def test_unknown_strategy_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="unknown dim strategy 'nope' .*attention"):
        load_dim_strategy("nope")


def test_spec_round_trips_dims_and_keeps_old_keys() -> None:
    base = SearchSpec(program=exp_matmul())
    assert "dims" not in base.to_json()  # specs without a strategy keep the keys they had before it existed
    spec = dataclasses.replace(base, dims=load_dim_strategy("mlp"))
    again = SearchSpec.from_json(spec.to_json())
    assert again == spec and again.key() == spec.key() != base.key()
    with pytest.raises(ConfigError, match="dims must be a DimStrategy"):
        SearchSpec(program=exp_matmul(), dims="attention")  # type: ignore[arg-type]


def test_preset_names_a_strategy(tmp_path: Path) -> None:
    (tmp_path / "p.toml").write_text('program = "mha_prefill"\n[search]\ndims = "attention"\n')
    assert load_preset(str(tmp_path / "p.toml")).search["dims"] == load_dim_strategy("attention")
    (tmp_path / "q.toml").write_text('program = "mha_prefill"\n[search]\ndims = 3\n')
    with pytest.raises(ConfigError, match="search.dims must be the name"):
        load_preset(str(tmp_path / "q.toml"))


def test_cli_rejects_a_bad_strategy_in_one_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gensorage", "search", "gated_mlp", "--dims", "nope"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "unknown dim strategy 'nope'" in proc.stderr


def test_a_strategy_that_fits_no_tensor_of_the_program_is_refused(tmp_path: Path) -> None:
    """Maps beyond the tensors' rank never apply; a strategy all of whose imaps (or omaps, fmaps) are such admits
    nothing, so the spec refuses it in one line instead of searching for nothing."""
    program = exp_matmul()  # 2-d tensors
    ok = DimStrategy("some fit", imaps=((0, -1, -1), (5, -1, -1)), fmaps=(-1, 7))
    SearchSpec(program=program, dims=ok)
    for bad, kind in (
        (DimStrategy("x", imaps=((2, -1, -1), (0, 3, -1))), "imap"),
        (DimStrategy("x", omaps=((4, -1, -1),)), "omap"),
        (DimStrategy("x", fmaps=(2, 3)), "fmap"),
    ):
        with pytest.raises(
            ConfigError, match=f"every listed {kind} names a data dim beyond .*at most 2 dims"
        ):
            SearchSpec(program=program, dims=bad)
    path = tmp_path / "deep.toml"
    path.write_text("imaps = [[6, -1, -1]]\n")
    proc = subprocess.run(
        [sys.executable, "-m", "gensorage", "search", "gated_mlp", "--dims", str(path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode != 0 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "every listed imap" in proc.stderr


# ------------------------------------------------------------------------------------------ membership


_MAPS = st.lists(st.one_of(st.none(), st.sampled_from([0, 1, 2, None])), min_size=3, max_size=3)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), _MAPS), min_size=1, max_size=4), st.integers(1, 3))
def test_placement_bits_agree_with_fits(imaps: list[list[int | None] | None], r: int) -> None:
    """The walk's check of a binding's imap against the other iterators' (bit sets of placements, ANDed) says
    what ``fits`` says about all of them together."""
    strategy = load_dim_strategy("attention")
    maps = [None if m is None else tuple(m[:r]) for m in imaps]
    bits = -1
    for m in maps:
        bits &= imap_placements(strategy, r, m)
    assert bool(bits) == fits(strategy, r, maps)


def test_slotted_and_placements() -> None:
    assert slotted((2, None), (1, 0)) == (-1, 2, -1)
    s = DimStrategy("t", imaps=((0, -1, 1), (0, 2, -1)), omaps=((0, -1, 2),))
    # grid dims (a, b) placed on (x, z): input 1 splits dim 0 by a and dim 1 by b; input 2 only dim 0.
    assert fits(s, 2, [(0, 1)])
    assert fits(s, 2, [(0, 1), (0, None)]) is False  # (0, -1, -1) is not listed
    assert fits(s, 2, [(0, None)]) is False
    # one placement must serve every map: (0, 1) needs (x, z), (0, 2) needs (x, y)
    assert fits(s, 2, [(0, 1), None]) and not fits(s, 2, [(0, 1), (0, 2)])
    assert fits(s, 2, [(0, 1)], [(0, 2)]) and not fits(s, 2, [(0, 1)], [(2, 0)])


def _member(g: KernelGraph, s: DimStrategy) -> bool:
    """The definition, written independently of ``fits``: some placement of each block graph's grid dims makes
    every imap and omap listed, and every fmap is listed."""
    for op in g.ops:
        if not isinstance(op, GraphDefinedOp):
            continue
        its = [n for n in op.block.nodes if isinstance(n, InputIterator)]
        savers = [n for n in op.block.nodes if isinstance(n, OutputSaver)]
        if s.fmaps is not None and any((-1 if it.fmap is None else it.fmap) not in s.fmaps for it in its):
            return False
        r = len(op.block.grid)
        ok = False
        for place in itertools.permutations(range(3), r):

            def slots(m: tuple[int | None, ...]) -> tuple[int, ...]:
                out = [-1, -1, -1]
                for gdim, d in enumerate(m):
                    out[place[gdim]] = -1 if d is None else d  # noqa: B023
                return tuple(out)

            if (s.imaps is None or all(slots(it.imap) in s.imaps for it in its)) and (
                s.omaps is None or all(slots(sv.omap) in s.omaps for sv in savers)
            ):
                ok = True
                break
        if not ok:
            return False
    return True


SPEC = SearchSpec(program=exp_matmul(2, 4, 4), max_kernel_ops=1, max_block_ops=3, max_grid_dims=2)
SLOT_MAPS = [
    m
    for m in itertools.product((-1, 0, 1), repeat=3)
    if len([d for d in m if d >= 0]) == len({d for d in m if d >= 0})
]


@cache
def _all_complete() -> tuple[KernelGraph, ...]:
    r = Recorder(SPEC)
    r.visit(0)
    return tuple(r.complete)


@settings(max_examples=12, deadline=None)
@given(
    imaps=st.none() | st.lists(st.sampled_from(SLOT_MAPS), min_size=1, max_size=8),
    omaps=st.none() | st.lists(st.sampled_from(SLOT_MAPS), min_size=1, max_size=8),
    fmaps=st.none() | st.lists(st.sampled_from((-1, 0, 1)), min_size=1, max_size=3),
)
def test_a_strategy_generates_exactly_the_graphs_it_admits(
    imaps: list[tuple[int, int, int]] | None,
    omaps: list[tuple[int, int, int]] | None,
    fmaps: list[int] | None,
) -> None:
    strategy = DimStrategy(
        "t",
        None if imaps is None else tuple(dict.fromkeys(imaps)),
        None if omaps is None else tuple(dict.fromkeys(omaps)),
        None if fmaps is None else tuple(dict.fromkeys(fmaps)),
    )
    r = Recorder(dataclasses.replace(SPEC, dims=strategy))
    r.visit(0)
    got = {ugraph_key(g) for g in r.complete}
    assert len(got) == len(r.complete)
    assert got == {ugraph_key(g) for g in _all_complete() if _member(g, strategy)}


def test_the_law_is_not_vacuous() -> None:
    everything = _all_complete()
    att = load_dim_strategy("mlp")
    admitted = [g for g in everything if _member(g, att)]
    assert 0 < len(admitted) < len(everything)
    assert any(isinstance(op, GraphDefinedOp) and len(op.block.grid) == 2 for g in everything for op in g.ops)

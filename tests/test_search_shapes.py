"""Automatic search shapes (:mod:`gensorage.superopt.search_shapes`): small shapes derived from a program's own,
compared with the bundled presets' hand-picked ones, and full mode searching at them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gensorage.program import Program, Tensor, list_configs, load_config
from gensorage.superopt import load_preset, superoptimize
from gensorage.superopt.presets import preset_from_dict
from gensorage.superopt.search_shapes import derive_search_shapes, program_sizes, size_choice

# Presets whose search shapes are powers of two, shrunk from the real ones as the derivation does; the attention
# presets pick pairwise coprime sizes instead (h=2, s=3, n=14, d=5: docs/search.md, "Choosing search shapes").
POWER_OF_TWO_PRESETS = ("gated_mlp", "lora", "mlp", "moe", "ntrans", "qknorm", "rmsnorm")


def _derived_params(name: str) -> tuple[dict[str, int], dict[str, int]]:
    p = load_config(name)
    s = derive_search_shapes(p)
    assert s.shrunk and s.program.structure_key() == p.structure_key()
    return {k: s.sizes[v] for k, v in p.params.items()}, load_preset(name).search_params


@pytest.mark.parametrize("name", POWER_OF_TWO_PRESETS)
def test_derived_shapes_are_within_a_factor_two_of_the_hand_made_presets(name: str) -> None:
    got, preset = _derived_params(name)
    for k, want in preset.items():
        assert want / 2 <= got[k] <= want * 2, (k, got, preset)


@pytest.mark.parametrize("name", [c.stem for c in list_configs() if c.stem not in POWER_OF_TWO_PRESETS])
def test_derived_shapes_of_the_attention_programs_are_small(name: str) -> None:
    """The attention presets' coprime sizes are smaller than powers of two can be (distinct powers of two for
    s, n, d and the head products): within 16x per dim, and no tensor of more than 2^16 elements."""
    got, preset = _derived_params(name)
    p = load_config(name)
    for k, want in preset.items():
        if p.params[k] % 2:  # an odd size (71 query heads) keeps its real size
            assert got[k] == p.params[k]
        else:
            assert got[k] <= max(16 * want, 2), (k, got, preset)
    small = derive_search_shapes(p).program
    assert max(int(np.prod(n.shape)) for n in small.nodes) <= 1 << 16


def _mlp(t: int, k: int, f: int) -> Program:
    p = Program(name="mlp")
    x, w1, w2 = p.input("X", (t, k)), p.input("W1", (k, f)), p.input("W2", (f, k))
    p.output(p.matmul(p.relu(p.matmul(x, w1)), w2))
    return p


def _rms_matmul(b: int, h: int, d: int) -> Program:
    p = Program(name="rms_matmul")
    x, g, w = p.input("X", (b, h)), p.input("G", (h,)), p.input("W", (h, d))
    p.output(p.matmul(p.mul(p.rms_norm(x), g), w))
    return p


POW = st.integers(0, 12).map(lambda e: 1 << e)
SIZE = st.one_of(POW, st.integers(1, 600))


@settings(max_examples=60, deadline=None)
@given(b=SIZE, h=SIZE, d=SIZE, mlp=st.booleans())
def test_derived_shapes_keep_the_structure(b: int, h: int, d: int, mlp: bool) -> None:
    p = _mlp(b, h, d) if mlp else _rms_matmul(b, h, d)
    s = derive_search_shapes(p)
    assert s.program.structure_key() == p.structure_key()
    sizes = s.sizes
    assert set(sizes) == program_sizes(p)
    assert len(set(sizes.values())) == len(sizes)  # equal sizes stay equal, distinct ones distinct
    for a in sizes:
        assert 1 <= sizes[a] <= a and (a < 2 or sizes[a] >= 2)  # a reduction keeps at least two elements
        assert sizes[a] % 2 == 0 or sizes[a] == a  # an odd size is kept
        for c in sizes:
            if c % a == 0:
                assert sizes[c] % sizes[a] == 0  # what divides still divides
    # The small program computes the same function at its shapes: its rebuilt ops are the program's ops.
    q = s.program
    assert [n.op for n in q.nodes if n.op] == [n.op for n in p.nodes if n.op]
    xs = q.random_inputs(seed=1)
    assert all(np.all(np.isfinite(o)) for o in q.run(*xs))


def test_powers_of_two_shrink_as_the_presets_do() -> None:
    assert size_choice({8, 4096}) == {8: 2, 4096: 16}
    assert size_choice({16, 1024, 4096}) == {16: 4, 1024: 16, 4096: 32}
    assert size_choice({1, 2, 3}) == {1: 1, 2: 2, 3: 3}


def test_a_prime_dim_keeps_its_size_and_says_so() -> None:
    s = derive_search_shapes(_mlp(71, 4096, 14336))
    assert s.sizes[71] == 71 and 71 in s.kept and "71 (odd" in s.note
    assert s.sizes[14336] % 7 == 0 and s.sizes[14336] < 14336  # 2^11 * 7: the power of two shrinks


def test_a_sliced_dim_keeps_its_size() -> None:
    p = Program(name="half")
    x = p.input("X", (64, 128))
    w = p.input("W", (64, 256))
    y = p.matmul(p.slice(x, 1, 0, 64), w)
    p.output(y)
    s = derive_search_shapes(p)
    assert s.program.structure_key() == p.structure_key()
    assert "a slice cuts it" in s.note or not s.shrunk
    assert dict(s.program.nodes[2].attrs)["stop"] == 64


def test_a_reshape_whose_sizes_no_longer_multiply_up_searches_the_own_shapes() -> None:
    p = Program(name="flatten")
    x = p.input("X", (32, 128))
    w = p.input("W", (4096, 8))
    p.output(p.matmul(p.reshape(x, (1, 4096)), w))
    s = derive_search_shapes(p)
    assert s.program is p and not s.shrunk and "own shapes" in s.note


def test_full_mode_without_a_preset_searches_at_derived_shapes(tmp_path: Path) -> None:
    p = Program(name="softmax_rows")
    x = p.input("X", (8, 64), "float32")
    e = p.exp(x)
    p.output(p.div(e, p.sum(e, 1)))
    limits = {"max_kernel_ops": 1, "max_block_ops": 3, "max_grid_dims": 1, "max_block_inputs": 2}
    r = superoptimize(
        p,
        mode="full",
        preset=preset_from_dict({"search": limits}, name="limits"),
        workers=1,
        store=tmp_path / "s.sqlite",
        checkpoint=tmp_path / "c.sqlite",
        progress=False,
    )
    assert any(n.startswith("search shapes derived") for n in r.notes)
    assert r.search_stats is not None and r.search_stats["candidates"] > 0
    assert r.equivalence and r.origin.startswith("search") and r.num_kernels == 1
    xs = p.random_inputs(seed=2)
    np.testing.assert_allclose(r.run(*xs)[0], p.run(*xs)[0], rtol=1e-5)


def _rope_heads(t: int, h: int, d: int, kv: int) -> Program:
    """Q and K projections split into heads, RoPE's rotate_half (slices at d/2: d is pinned), GQA's repeat of
    the K heads, QKᵀ: the shape of LLaMA's attention input, where the sequence length may equal head_dim."""
    p = Program(name="rope_heads")
    x = p.input("X", (t, h * d))
    wq, wk = p.input("WQ", (h * d, h * d)), p.input("WK", (h * d, kv * d))

    def heads(y: Tensor, n: int) -> Tensor:
        y = p.transpose(p.reshape(y, (t, n, d)), 0, 1)
        half = p.concat([p.scale(p.slice(y, 2, d // 2, d), -1.0), p.slice(y, 2, 0, d // 2)], dim=2)
        return p.add(y, half)

    q, k = heads(p.matmul(x, wq), h), heads(p.matmul(x, wk), kv)
    k = p.reshape(p.repeat(p.reshape(k, (kv, 1, t, d)), 1, h // kv), (h, t, d))
    p.output(p.matmul(q, p.transpose(k, 1, 2)))
    return p


@pytest.mark.parametrize(("t", "h", "d", "kv"), [(128, 32, 128, 8), (512, 32, 128, 8), (64, 16, 64, 4)])
def test_pinned_head_dim_still_lets_the_other_sizes_shrink(t: int, h: int, d: int, kv: int) -> None:
    """A slice pins head_dim (and its half); the sizes a reshape multiplies with it (heads · head_dim) are solved
    for (:mod:`gensorage.superopt.exponent_map`) instead of the program keeping every real size."""
    p = _rope_heads(t, h, d, kv)
    s = derive_search_shapes(p)
    assert s.shrunk and s.program.structure_key() == p.structure_key(), s.note
    assert s.sizes[d] == d and s.sizes[d // 2] == d // 2 and s.sizes[h * d] < h * d
    assert s.sizes[h * d] == s.sizes[h] * d  # the product the reshape needs
    assert len(set(s.sizes.values())) == len(s.sizes)
    for a in s.sizes:
        for b in s.sizes:
            assert b % a or s.sizes[b] % s.sizes[a] == 0  # what divides still divides

"""``own_predefined_only``: pre-defined operators the program applies, which may read a scale's result as the
program's do (``X − mean X``), and the limits derived for a program too large for one block graph whose chain of
its own cannot be split off (LayerNorm + matmul, ``tests/data/user_programs/layernorm_matmul.gsp``, with its
centred rows ``C`` an output too; without, ``tests/test_chain_split.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from search_walk import replayed

from gensorage.exhaustive import SearchSpec, enumerate_tasks, search_serial
from gensorage.exhaustive.derived_limits import MAX_BLOCK_OPS, derive_limits, mixes_factors
from gensorage.exhaustive.walk.tasks import MAX_SPLIT_DEPTH
from gensorage.program import Program, load_config, parse_program
from gensorage.ugraph.ir import GraphDefinedOp, KernelOp

LAYERNORM = Path(__file__).parent / "data" / "user_programs" / "layernorm_matmul.gsp"


def layernorm_matmul() -> Program:
    """LayerNorm + matmul with its centred rows ``C = X − mean X`` an output as well: the chain's result is then
    no input of a rest (``chain_split`` returns None), so the whole program is searched under the restriction."""
    p = parse_program(LAYERNORM.read_text(), source=str(LAYERNORM))
    p.output(p.tensor("C"))
    return p


def centred_squares(rows: int = 2, cols: int = 4) -> Program:
    """``Σ (X − mean X)²`` over rows: five operators, the mean's scale read by a ``sub``."""
    p = Program(name="centred_squares")
    x = p.input("X", (rows, cols))
    c = p.sub(x, p.scale(p.sum(x, 1), 1 / cols))
    p.output(p.sum(p.mul(c, c), 1))
    return p


def test_a_program_of_ten_operators_gets_three_of_its_own_predefined_operators() -> None:
    d = derive_limits(layernorm_matmul())
    assert d.limits["max_kernel_ops"] == d.limits["min_kernel_ops"] == 10 - MAX_BLOCK_OPS + 1 == 4
    assert d.limits["own_predefined_only"] and d.limits["graph_defined_last"]
    assert "3 pre-defined operators, each one the program applies" in d.note


def test_only_a_program_whose_form_is_outside_the_space_gets_them() -> None:
    """Attention's ``c·S − max(c·S)`` carries ``c`` on both sides (searched as ``c·(S − max S)``): its nine
    operators keep one pre-defined operator of any kind; LayerNorm's ``X − (Σ X)/8`` mixes factors."""
    assert mixes_factors(layernorm_matmul()) and mixes_factors(centred_squares())
    for name in ("mha_prefill", "gqa_incdec", "qknorm"):
        p = load_config(name)
        assert not mixes_factors(p)
        assert (
            derive_limits(p).limits["max_kernel_ops"] == 2
            and "own_predefined_only" not in derive_limits(p).limits
        )


def test_eight_operators_keep_one_predefined_operator_of_any_kind() -> None:
    p = Program(name="rms_eps_matmul")
    x, g, w = p.input("X", (8, 64)), p.input("G", (64,)), p.input("W", (64, 128))
    p.output(p.matmul(p.mul(p.rms_norm(x), g), w))
    limits = derive_limits(p).limits
    assert limits["max_kernel_ops"] == 2 and "own_predefined_only" not in limits


def test_the_field_round_trips_and_changes_the_key() -> None:
    p = centred_squares()
    off = SearchSpec(program=p)
    on = SearchSpec(program=p, own_predefined_only=True)
    assert "own_predefined_only" not in off.to_json()
    assert SearchSpec.from_json(on.to_json()) == on and on.key() != off.key()


def test_layernorm_starts_with_its_own_mean_subtraction() -> None:
    """The only chain of three of the program's own operators is ``sum``, ``scale``, ``sub``; the ``sub`` reads
    the scale's result, which the space without the restriction never lets a ``sub`` read."""
    spec = SearchSpec(program=layernorm_matmul(), **derive_limits(layernorm_matmul()).limits)
    with replayed(spec, ()) as w:
        assert (
            sum(1 for _ in w.children()) == 1
        )  # sum(X, dim=1): no other operator of the program reads inputs
    with replayed(spec, (0, 0, 0)) as w:
        ops = w.state.ops
        assert [op.op.value for op in ops if isinstance(op, KernelOp)] == ["sum", "scale", "sub"]
        assert w.state.scaled[w.state.ref.index(ops[2].inputs[1])]  # X − (sum X)/8


def test_tasks_split_below_the_chain() -> None:
    """The split depth counts from the chain of pre-defined operators every µGraph starts with, so a search
    under the restriction is many tasks, not one."""
    limits = dict(max_kernel_ops=4, min_kernel_ops=4, graph_defined_last=True, max_block_ops=2)
    limits |= dict(max_block_inputs=1, max_grid_dims=1, max_block_graphs=1, own_predefined_only=True)
    tasks = enumerate_tasks(SearchSpec(program=centred_squares(), **limits))
    assert len(tasks) > 1 and {t.path[:3] for t in tasks} == {(0, 0, 0)}
    assert all(len(t.path) <= 3 + MAX_SPLIT_DEPTH + 1 for t in tasks)


def test_without_the_restriction_no_sub_reads_the_scale() -> None:
    """The space without ``own_predefined_only`` holds no ``X − c·S`` (a scale's result is read only by a
    non-linear unary operator); with it, the program's own ``sub`` does and the search finds fused kernels."""
    limits = dict(max_kernel_ops=4, min_kernel_ops=4, graph_defined_last=True, max_block_ops=2)
    limits |= dict(max_block_inputs=1, max_grid_dims=1, max_block_graphs=1)
    p = centred_squares()
    mixed = search_serial(SearchSpec(program=p, **limits))
    own = search_serial(SearchSpec(program=p, own_predefined_only=True, **limits))
    assert mixed.complete and own.complete
    assert not mixed.candidates
    assert own.candidates
    for c in own.candidates:
        pre = [op for op in c.ugraph.ops if isinstance(op, KernelOp)]
        assert [op.op.value for op in pre] == ["sum", "scale", "sub"]
        assert isinstance(c.ugraph.ops[-1], GraphDefinedOp)


@pytest.mark.parametrize("bad", [1, "yes"])
def test_the_switch_must_be_a_bool(bad: object) -> None:
    from gensorage.errors import ConfigError

    with pytest.raises(ConfigError, match="own_predefined_only"):
        SearchSpec(program=centred_squares(), own_predefined_only=bad)  # type: ignore[arg-type]

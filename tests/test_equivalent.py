"""equivalent(): identities accepted, near misses rejected, Lax violations refused, result API, CLI, float test."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from gensorage.cli import main as cli_main
from gensorage.errors import NotLaxError, VerificationError
from gensorage.program import Program, Tensor, dump_program
from gensorage.ugraph import from_program
from gensorage.ugraph.examples import EXAMPLES, flash_decoding
from gensorage.verify import EquivalenceResult, equivalent, float_check, plan
from gensorage.verify.field import FieldArith
from gensorage.verify.mutate import mutate

Body = Callable[..., Tensor]


def program(shapes: list[tuple[int, ...]], body: Body, name: str = "p") -> Program:
    p = Program(name)
    xs = [p.input(f"x{i}", s, "float32") for i, s in enumerate(shapes)]
    out = body(p, *xs)
    for t in out if isinstance(out, tuple) else (out,):
        p.output(t)
    return p


def check(shapes: list[tuple[int, ...]], a: Body, b: Body, **kw: object) -> EquivalenceResult:
    kw.setdefault("seed", 0)
    return equivalent(program(shapes, a), program(shapes, b), **kw)  # type: ignore[arg-type]


def float_agrees(shapes: list[tuple[int, ...]], a: Body, b: Body) -> bool:
    pa, pb = program(shapes, a), program(shapes, b)
    inputs = pa.random_inputs(1)
    return all(np.allclose(x, y) for x, y in zip(pa.run(*inputs), pb.run(*inputs), strict=True))


SQ = [(3, 3), (3, 3), (3, 3)]

# (name, shapes, A, B) pairs computing the same function
IDENTITIES = [
    (
        "distributivity",
        [(2, 3), (2, 3), (3, 4)],
        lambda p, x, y, z: p.matmul(p.add(x, y), z),
        lambda p, x, y, z: p.add(p.matmul(x, z), p.matmul(y, z)),
    ),
    (
        "associativity",
        [(2, 3), (3, 4), (4, 2)],
        lambda p, a, b, c: p.matmul(p.matmul(a, b), c),
        lambda p, a, b, c: p.matmul(a, p.matmul(b, c)),
    ),
    (
        "sum over concat",
        [(3, 2), (3, 4)],
        lambda p, x, y: p.sum(p.concat([x, y], 1), dim=1),
        lambda p, x, y: p.add(p.sum(x, dim=1), p.sum(y, dim=1)),
    ),
    (
        "exp homomorphism",
        [(2, 3), (2, 3)],
        lambda p, a, b: p.mul(p.exp(a), p.exp(b)),
        lambda p, a, b: p.exp(p.add(a, b)),
    ),
    (
        "softmax in two orders",
        [(2, 3), (3, 2), (2, 3)],
        lambda p, q, k, v: p.div(p.matmul(p.exp(p.matmul(q, k)), v), p.sum(p.exp(p.matmul(q, k)), dim=1)),
        lambda p, q, k, v: p.matmul(p.div(p.exp(p.matmul(q, k)), p.sum(p.exp(p.matmul(q, k)), dim=1)), v),
    ),
    (
        "scaled exp split",
        [(2, 4)],
        lambda p, x: p.exp(p.scale(x, 0.125)),
        lambda p, x: p.mul(p.exp(p.scale(x, 0.0625)), p.exp(p.scale(x, 0.0625))),
    ),
    (
        "group sum",
        [(2, 6)],
        lambda p, x: p.sum(x, dim=1, group=3),
        lambda p, x: p.sum(p.reshape(x, (2, 2, 3)), dim=2, keepdim=False),
    ),
    (
        "repeat then sum",
        [(2, 3)],
        lambda p, x: p.sum(p.repeat(x, 1, 2), dim=1),
        lambda p, x: p.scale(p.sum(x, dim=1), 2.0),
    ),
    (
        "division by a product",
        [(2, 3), (2, 3), (2, 3)],
        lambda p, x, y, z: p.div(p.div(x, y), z),
        lambda p, x, y, z: p.div(x, p.mul(y, z)),
    ),
    (
        "relu is a function",
        [(2, 3), (2, 3)],
        lambda p, a, b: p.relu(p.add(a, b)),
        lambda p, a, b: p.relu(p.add(b, a)),
    ),
    (
        "sqrt is multiplicative",
        [(2, 3), (2, 3)],
        lambda p, a, b: p.sqrt(p.mul(p.mul(a, a), p.mul(b, b))),
        lambda p, a, b: p.mul(p.sqrt(p.mul(a, a)), p.sqrt(p.mul(b, b))),
    ),
]

NEAR_MISSES = [
    (
        "non-commuting matmul",
        SQ,
        lambda p, x, y, z: p.add(p.matmul(x, z), p.matmul(y, z)),
        lambda p, x, y, z: p.add(p.matmul(x, z), p.matmul(z, y)),
    ),
    (
        "wrong layout",
        [(4, 6)],
        lambda p, x: p.reshape(p.sum(p.reshape(x, (4, 2, 3)), dim=2), (4, 2)),
        lambda p, x: p.reshape(p.sum(p.reshape(x, (4, 3, 2)), dim=1), (4, 2)),
    ),
    ("repeat vs tile", [(2, 3)], lambda p, x: p.repeat(x, 0, 2), lambda p, x: p.concat([x, x], 0)),
    (
        "off-by-one repeat",
        [(2, 3)],
        lambda p, x: p.sum(p.repeat(x, 1, 2), dim=1),
        lambda p, x: p.sum(p.repeat(x, 1, 3), dim=1),
    ),
    (
        "dropped scale",
        [(2, 3), (3, 2)],
        lambda p, x, y: p.scale(p.matmul(x, y), 0.5),
        lambda p, x, y: p.matmul(x, y),
    ),
    (
        "relu does not distribute",
        [(2, 3), (2, 3)],
        lambda p, a, b: p.add(p.relu(a), p.relu(b)),
        lambda p, a, b: p.relu(p.add(a, b)),
    ),
    (
        "softmax over the wrong dim",
        [(2, 3), (3, 3)],
        lambda p, q, k: p.div(p.exp(p.matmul(q, k)), p.sum(p.exp(p.matmul(q, k)), dim=1)),
        lambda p, q, k: p.div(p.exp(p.matmul(q, k)), p.sum(p.exp(p.matmul(q, k)), dim=0)),
    ),
    (
        "exp of a sum vs sum of exps",
        [(2, 3), (2, 3)],
        lambda p, a, b: p.exp(p.add(a, b)),
        lambda p, a, b: p.add(p.exp(a), p.exp(b)),
    ),
    ("scale factor off", [(2, 4)], lambda p, x: p.scale(x, 1 / 3), lambda p, x: p.scale(x, 0.3333)),
]


@pytest.mark.parametrize(("name", "shapes", "a", "b"), IDENTITIES, ids=[i[0] for i in IDENTITIES])
def test_identities_are_accepted(name: str, shapes: list[tuple[int, ...]], a: Body, b: Body) -> None:
    r = check(shapes, a, b)
    assert r and r.equivalent, str(r)
    assert r.trials == r.required_trials and r.achieved_delta <= r.delta
    assert r.counterexample is None


@pytest.mark.parametrize(("name", "shapes", "a", "b"), NEAR_MISSES, ids=[n[0] for n in NEAR_MISSES])
def test_near_misses_are_rejected(name: str, shapes: list[tuple[int, ...]], a: Body, b: Body) -> None:
    if name != "relu does not distribute":  # over the reals these really differ (relu only for mixed signs)
        assert not float_agrees(shapes, a, b)
    r = check(shapes, a, b)
    assert not r and r.counterexample is not None, str(r)
    assert "NOT equivalent" in str(r)


def test_counterexample_points_at_a_differing_element() -> None:
    assert equivalent(
        program([(3, 4)], lambda p, x: p.scale(x, 2.0)), program([(3, 4)], lambda p, x: p.add(x, x))
    )

    def halves(second: float) -> Body:
        return lambda p, x: p.concat(
            [p.scale(p.sum(x, dim=1, group=2), 2.0), p.scale(p.sum(x, dim=1, group=2), second)], 1
        )

    r = equivalent(program([(3, 4)], halves(1.0)), program([(3, 4)], halves(2.0)), seed=3)
    assert not r and r.counterexample is not None
    ce = r.counterexample
    assert ce.output == 0 and ce.index[1] >= 2  # only the second half differs
    # Decided by the first tier (no exp: its difference is final), whose one field leaves x_q absent.
    assert ce.trial == 0 and ce.a != ce.b and ce.a[1] is None and r.tier == 1


def test_result_api() -> None:
    r = check(SQ, lambda p, x, y, z: p.matmul(x, y), lambda p, x, y, z: p.matmul(x, y), delta=1e-12)
    assert isinstance(r, EquivalenceResult) and bool(r) is True
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.equivalent = False  # type: ignore[misc]
    assert r.delta == 1e-12 and r.p == 2**61 - 1 and r.tier == 1 and r.trials == r.required_trials <= 2
    assert r.method == "uninterpreted" and r.degree == 2 and r.k == 1
    assert r.elapsed_s > 0 and r.degenerate_trials == 0 and not r.capped
    doc = r.to_json()
    assert json.loads(json.dumps(doc))["equivalent"] is True
    # the seed makes a check reproducible
    again = check(SQ, lambda p, x, y, z: p.matmul(x, y), lambda p, x, y, z: p.matmul(y, x), seed=r.seed)
    once_more = check(SQ, lambda p, x, y, z: p.matmul(x, y), lambda p, x, y, z: p.matmul(y, x), seed=r.seed)
    assert not again and again.counterexample == once_more.counterexample


def shifted_softmax_pair(shapes: list[tuple[int, ...]]) -> tuple[Program, Program]:
    """``exp(S)V / Σexp(S)`` and the same with a row value z subtracted first (equal by the exp law only)."""

    def attention(shift: bool) -> Body:
        def body(p: Program, q: Tensor, k: Tensor, v: Tensor, z: Tensor) -> Tensor:
            s = p.matmul(q, k)
            e = p.exp(p.sub(s, z) if shift else s)
            return p.div(p.matmul(e, v), p.sum(e, dim=1))

        return body

    return program(shapes, attention(False)), program(shapes, attention(True))


def test_max_trials_caps_and_reports_the_reached_delta() -> None:
    a, b = shifted_softmax_pair([(2, 3), (3, 4), (4, 3), (2, 1)])
    r = equivalent(a, b, 1e-9, seed=0, max_trials=10)
    assert r and r.tier == 2 and r.capped and r.trials == 10 < r.required_trials
    assert r.achieved_delta > r.delta
    assert "actually reached" in str(r)
    assert r.trials_first_paper is not None and r.trials_later_paper is not None
    assert r.required_trials == max(r.trials_first_paper, r.trials_later_paper)
    full = equivalent(a, b, 1e-3, seed=0)
    assert full and full.tier == 2 and full.trials == full.required_trials and full.achieved_delta <= 1e-3


def test_lax_violations_are_refused() -> None:
    with pytest.raises(NotLaxError, match="B: .*two exps on one path"):
        check([(2, 3)], lambda p, x: p.exp(x), lambda p, x: p.exp(p.exp(x)))
    with pytest.raises(NotLaxError, match="A: .*two exps on one path"):
        check(
            [(2, 3)],
            lambda p, x: p.exp(p.matmul(p.exp(p.reshape(x, (3, 2))), p.exp(x))),
            lambda p, x: p.exp(p.matmul(p.reshape(x, (3, 2)), x)),
        )


def test_mismatched_inputs_and_outputs() -> None:
    with pytest.raises(VerificationError, match="input 0 has shape"):
        equivalent(program([(2, 3)], lambda p, x: x), program([(3, 2)], lambda p, x: x))
    with pytest.raises(VerificationError, match="numbers of inputs"):
        equivalent(program([(2, 3)], lambda p, x: x), program([(2, 3), (2, 3)], lambda p, x, y: x))
    with pytest.raises(VerificationError, match="not a program"):
        equivalent(program([(2, 3)], lambda p, x: x), 42)
    r = equivalent(
        program([(2, 3)], lambda p, x: p.sum(x, dim=1)), program([(2, 3)], lambda p, x: p.sum(x, dim=0))
    )
    assert not r and r.reason is not None and "shape" in r.reason and r.trials == 0
    r = equivalent(program([(2, 3)], lambda p, x: (x, p.scale(x, 2.0))), program([(2, 3)], lambda p, x: x))
    assert not r and "numbers of outputs" in (r.reason or "")


def test_multiple_outputs_compared_by_position() -> None:
    a = program([(2, 3), (2, 3)], lambda p, x, y: (p.add(x, y), p.sub(x, y)))
    b = program([(2, 3), (2, 3)], lambda p, x, y: (p.add(y, x), p.sub(x, y)))
    c = program([(2, 3), (2, 3)], lambda p, x, y: (p.add(y, x), p.sub(y, x)))
    assert equivalent(a, b, seed=0)
    r = equivalent(a, c, seed=0)
    assert not r and r.counterexample is not None and r.counterexample.output == 1


def test_degenerate_trials_are_replaced_not_passed() -> None:
    # p = 23, q = 11 (the second tier, reached because exp(2x) = exp(x)² needs the exp law): a divisor is zero
    # in about 13% of trials, so degenerate trials happen and are resampled.
    a = program([(1, 1), (1, 1)], lambda p, x, y: p.div(p.mul(p.exp(p.add(x, x)), y), y))
    b = program([(1, 1), (1, 1)], lambda p, x, y: p.mul(p.exp(x), p.exp(x)))
    r = equivalent(a, b, 1e-30, seed=0, p=23, q=11)
    assert r and r.tier == 2 and r.trials == r.required_trials and r.degenerate_trials > 0
    # A pair that differs only where the divisor is non-zero: degenerate trials (where the field's 0^-1 = 0
    # makes both sides 0) must not count as passes.
    c = program([(1, 1), (1, 1)], lambda p, x, y: p.div(x, y))
    d = program([(1, 1), (1, 1)], lambda p, x, y: p.div(p.scale(x, 2.0), y))
    r = equivalent(c, d, 1e-30, seed=0, p=23, q=11)
    assert not r


def test_identically_zero_divisor_is_an_error() -> None:
    a = program([(2, 2)], lambda p, x: p.div(x, p.sub(x, x)))
    with pytest.raises(VerificationError, match="divided by zero"):
        equivalent(a, a, seed=0)


def test_batches_do_not_change_the_outcome() -> None:
    shapes = [(2, 3), (3, 4), (4, 3)]
    a = program(
        shapes,
        lambda p, q, k, v: p.div(p.matmul(p.exp(p.matmul(q, k)), v), p.sum(p.exp(p.matmul(q, k)), dim=1)),
    )
    b = program(
        shapes,
        lambda p, q, k, v: p.matmul(p.div(p.exp(p.matmul(q, k)), p.sum(p.exp(p.matmul(q, k)), dim=1)), v),
    )
    for batch in (1, 7, 1000):
        r = equivalent(a, b, 1e-2, seed=5, batch=batch)
        assert r and r.trials == r.required_trials


# ------------------------------------------------------------------------------------------- µGraphs


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_paper_ugraphs_equal_their_programs(name: str) -> None:
    prog, graph = EXAMPLES[name]()
    tp = plan(prog, graph)
    # exp-free examples run the full theorem count; exp ones a capped run (their counts are in the tens of
    # thousands even at these shapes; see benchmarks/verify.py)
    r = equivalent(prog, graph, seed=1, max_trials=None if tp.method == "schwartz-zippel" else 32)
    assert r, str(r)
    assert equivalent(graph, from_program(prog), seed=2, max_trials=16)


def test_ugraph_with_a_wrong_split_is_rejected() -> None:
    prog, graph = flash_decoding(group=2)
    assert equivalent(prog, graph, seed=0, max_trials=16)
    # the second kernel divides by the partial sums: give it the numerators twice
    k2 = graph.ops[-1]
    broken = dataclasses.replace(k2, inputs=(k2.inputs[0], k2.inputs[0]))
    from gensorage.ugraph import KernelGraph

    bad = KernelGraph(graph.inputs, graph.ops[:-1] + (broken,), graph.outputs)
    assert bad.is_valid()
    assert not equivalent(prog, bad, seed=0, max_trials=16)


# ---------------------------------------------------------------------------------------------- float test


def test_float_check_flags_cancellation() -> None:
    a = program([(8, 8)], lambda p, x: x)
    b = program([(8, 8)], lambda p, x: p.sub(p.add(p.scale(x, 1000.0), x), p.scale(x, 1000.0)))
    fc16 = float_check(a, b, dtype="float16")
    assert not fc16 and fc16.max_rel_error > fc16.rtol
    assert fc16.float64_rel_error < 1e-10  # same function, only the rounding differs
    assert float_check(a, b, dtype="float32")
    assert float_check(a, a, dtype="float16").max_rel_error < 1e-3


def test_float_check_flags_overflow() -> None:
    a = program([(4, 4)], lambda p, x: p.exp(x))
    b = program([(4, 4)], lambda p, x: p.div(p.exp(p.scale(x, 2.0)), p.exp(x)))
    fc = float_check(a, b, dtype="float16", scale=6.0)  # exp(2x) overflows float16 for x > 5.5
    assert not fc and fc.nonfinite


def test_rounding_to_low_precision() -> None:
    from gensorage.verify.floatcheck import round_to

    x = np.array([1 + 2**-8, 1 + 3 * 2**-8, 65504.0, 70000.0, -1e-8, np.nan])
    bf = round_to(x, "bfloat16")  # 8 significant bits, round to nearest even
    assert bf[0] == 1.0 and bf[1] == 1 + 2**-6 and np.isnan(bf[5])
    fp = round_to(x, "float16")
    assert fp[2] == 65504.0 and np.isinf(fp[3]) and fp[0] == 1 + 2**-8
    assert (round_to(x[:5], "float64") == x[:5]).all()
    with pytest.raises(VerificationError, match="dtype"):
        round_to(x, "int8")


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_float_check_accepts_the_paper_ugraphs(name: str) -> None:
    prog, graph = EXAMPLES[name]()
    fc = float_check(prog, graph)
    assert fc, fc
    assert fc.float64_rel_error < 1e-12


# ------------------------------------------------------------------------------------------------- CLI


def test_cli_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prog, graph = EXAMPLES["rmsnorm_matmul"]()
    gsp = tmp_path / "p.gsp"
    gsp.write_text(dump_program(prog))
    good = tmp_path / "g.json"
    good.write_text(json.dumps(graph.to_json()))
    mutant = None
    rng = random.Random(0)
    while mutant is None:
        mutant = mutate(graph, rng, "change_scale")
    bad = tmp_path / "m.json"
    bad.write_text(json.dumps(mutant.graph.to_json()))
    assert cli_main(["verify", str(gsp), str(good), "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "equivalent" in out and "tier 1" in out
    assert cli_main(["verify", str(gsp), str(bad), "--seed", "1"]) == 1
    assert "NOT equivalent" in capsys.readouterr().out
    assert cli_main(["verify", str(gsp), str(good), "--json", "--float-check"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["equivalent"] is True and doc["float_check"]["ok"] is True and doc["tier"] == 1
    (tmp_path / "broken.json").write_text("{not json")
    assert cli_main(["verify", str(gsp), str(tmp_path / "broken.json")]) == 6
    other = tmp_path / "o.gsp"
    other.write_text("input X [2, 2] float32\nY = exp(exp(X))\noutput Y\n")
    other2 = tmp_path / "o2.gsp"
    other2.write_text("input X [2, 2] float32\noutput X\n")
    assert cli_main(["verify", str(other), str(other2)]) == 4
    assert "two exps" in capsys.readouterr().err
    assert cli_main(["verify", str(gsp), str(other2)]) == 9
    assert cli_main(["verify", str(gsp), str(good), "--delta", "2"]) == 9


def test_field_arith_drives_both_evaluators() -> None:
    prog, graph = EXAMPLES["lora"]()
    arith = FieldArith(3, np.random.default_rng(0))
    inputs = [arith.random_input(t.shape) for t in prog.inputs]
    (x,), (y,) = prog.evaluate(arith, inputs), graph.evaluate(arith, inputs)
    assert arith.equal(x, y).all() and x.shape == tuple(prog.outputs[0].shape)
    assert math.prod(x.shape) * 3 * 2 == x.data.size

"""The probabilistic equivalence check of two programs or µGraphs, in two tiers.

:func:`equivalent` works on any two objects with ``.inputs`` (each with ``.shape``) and
``.evaluate(arith, values) -> list``: :class:`gensorage.program.Program` and
:class:`gensorage.ugraph.KernelGraph` alike. Each tier

1. runs both through :class:`~gensorage.verify.bounds.BoundsArith` (degrees, function applications; in the
   second tier the Lax check and term counts),
2. derives the trial count for δ (:mod:`gensorage.verify.trials`),
3. evaluates both on the same fresh uniform inputs, many trials per vectorised batch, discarding degenerate
   trials (a zero divisor) and stopping at the first disagreement.

The first tier (:class:`~gensorage.verify.uninterpreted.UninterpretedArith`) treats exp, sqrt, activations and
max as random functions over ``Z_M61``; the second (:class:`~gensorage.verify.field.FieldArith`, Mirage's
``ω^x`` test over ``Z_p × Z_q``) runs only when the first found a difference and a side uses exp or sqrt.
Equivalent programs pass the first tier unless their identity needs a law of exp or sqrt (or max's
idempotence); a pass bounds the false-accept probability by δ under the conditions listed in the result's
``notes`` (see docs/verification.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gensorage.errors import NotLaxError, VerificationError
from gensorage.verify import mersenne
from gensorage.verify.bounds import BoundsArith, BoundValue, DiffBound, difference
from gensorage.verify.field import KEYED, FieldArith, FieldValue
from gensorage.verify.primes import DEFAULT_P, DEFAULT_Q
from gensorage.verify.result import Counterexample, EquivalenceResult
from gensorage.verify.shared import SharedArith
from gensorage.verify.trials import TrialPlan, plan_trials, plan_uninterpreted
from gensorage.verify.uninterpreted import UninterpretedArith

#: Memory one batch may use (bytes); the batch size follows from the programs' element counts.
BATCH_BYTES = 64 << 20
#: Largest batch (trials per vectorised evaluation).
MAX_BATCH = 4096
#: Trials in the first batch: most non-equivalent candidates fail there, at the cost of a small batch.
FIRST_BATCH = 8
# Bytes per element per trial: two int64 residues, times headroom for temporaries (matmul limbs, pow).
_BYTES_PER_ELEMENT = 16 * 3


class VerificationStopped(Exception):
    """The caller's ``should_stop`` ended :func:`equivalent` before a verdict (not an error: nothing is decided)."""


# ------------------------------------------------------------------------------------------------ helpers


Evaluator = Callable[[Any, list[Any]], list[Any]]


def _evaluator(obj: Any) -> Evaluator:
    """``obj.evaluate``; for a µGraph, validated once here instead of on every batch."""
    from gensorage.ugraph import KernelGraph
    from gensorage.ugraph.evaluate import evaluate

    if isinstance(obj, KernelGraph):
        obj.validate()
        return lambda arith, values: evaluate(obj, arith, values, check=False)
    return lambda arith, values: list(obj.evaluate(arith, values))


def _input_shapes(obj: Any, label: str) -> list[tuple[int, ...]]:
    if not hasattr(obj, "inputs") or not callable(getattr(obj, "evaluate", None)):
        raise VerificationError(f"{label} is not a program or µGraph (got {type(obj).__name__})")
    return [tuple(int(d) for d in t.shape) for t in obj.inputs]


def _check_inputs(sa: list[tuple[int, ...]], sb: list[tuple[int, ...]]) -> None:
    if len(sa) != len(sb):
        raise VerificationError(f"the two sides take different numbers of inputs ({len(sa)} vs {len(sb)})")
    for i, (x, y) in enumerate(zip(sa, sb, strict=True)):
        if x != y:
            raise VerificationError(f"input {i} has shape {list(x)} on one side and {list(y)} on the other")


def _bounds(
    run: Evaluator, label: str, arith: BoundsArith, shapes: list[tuple[int, ...]]
) -> list[BoundValue]:
    try:
        return run(arith, [arith.variable(s) for s in shapes])
    except NotLaxError as exc:
        raise NotLaxError(f"{label}: {exc}") from None


def _output_mismatch(oa: list[BoundValue], ob: list[BoundValue]) -> str | None:
    if len(oa) != len(ob):
        return f"the sides have different numbers of outputs ({len(oa)} vs {len(ob)})"
    for i, (x, y) in enumerate(zip(oa, ob, strict=True)):
        if x.shape != y.shape:
            return f"output {i} has shape {list(x.shape)} on one side and {list(y.shape)} on the other"
    return None


def _worst(diffs: list[DiffBound]) -> DiffBound:
    return DiffBound(
        k=max(d.k for d in diffs),
        degree=max(d.degree for d in diffs),
        numerator_degree=max(d.numerator_degree for d in diffs),
        denominator_degree=max(d.denominator_degree for d in diffs),
        log2_coeff=max(d.log2_coeff for d in diffs),
        has_exp=any(d.has_exp for d in diffs),
    )


def _notes(arith: BoundsArith) -> tuple[str, ...]:
    notes: list[str] = []
    if arith.opaque and not arith.uninterpreted:
        ops = ", ".join(sorted(arith.opaque))
        notes.append(
            f"{ops} evaluated as uninterpreted functions (sqrt: x^((m+1)/4)) and bounded as fresh degree-1 "
            "variables; the theorems do not cover this, so δ is heuristic"
        )
    if arith.exp_divisor:
        notes.append(
            "a divisor contains exp terms: the degenerate-trial probability is not bounded by a degree"
        )
    return tuple(notes)


def plan(
    a: Any, b: Any, delta: float = 1e-9, *, p: int = DEFAULT_P, q: int = DEFAULT_Q, tier: int = 1
) -> TrialPlan:
    """The :class:`~gensorage.verify.trials.TrialPlan` of one tier of :func:`equivalent` (no trials are run).

    ``tier=1`` (what :func:`equivalent` runs first) or ``tier=2`` (the homomorphic test, run after a first-tier
    difference when a side uses exp or sqrt). Raises :class:`~gensorage.errors.NotLaxError` when ``tier=2`` and
    a side is outside the Lax fragment, and :class:`~gensorage.errors.VerificationError` when the inputs or
    outputs do not correspond.
    """
    sa, sb = _input_shapes(a, "A"), _input_shapes(b, "B")
    _check_inputs(sa, sb)
    prepare = _prepare_first if tier == 1 else _prepare_second
    result = prepare(_evaluator(a), _evaluator(b), sa, delta, p, q)
    if isinstance(result, str):
        raise VerificationError(result)
    return result[0]


Prepared = tuple[TrialPlan, int, bool] | str


def _diff(
    run_a: Evaluator, run_b: Evaluator, shapes: list[tuple[int, ...]], arith: BoundsArith
) -> DiffBound | str:
    """The worst difference bound over the outputs, or the reason the outputs cannot be equal."""
    oa = _bounds(run_a, "A", arith, shapes)
    ob = _bounds(run_b, "B", arith, shapes)
    mismatch = _output_mismatch(oa, ob)
    if mismatch is not None:
        return mismatch
    return _worst([difference(x.bound, y.bound) for x, y in zip(oa, ob, strict=True)])


def _prepare_first(
    run_a: Evaluator, run_b: Evaluator, shapes: list[tuple[int, ...]], delta: float, p: int, q: int
) -> Prepared:
    """(first-tier plan, elements per trial, whether a side uses exp or sqrt), or why the outputs differ."""
    arith = BoundsArith(uninterpreted=True)
    diff = _diff(run_a, run_b, shapes, arith)
    if isinstance(diff, str):
        return diff
    plan1 = plan_uninterpreted(
        diff,
        delta,
        mersenne.M61,
        arith.applications,
        divisor_degree=arith.divisor_degree_p,
        notes=_notes(arith),
    )
    return plan1, arith.total_numel, bool({"exp", "sqrt"} & arith.applications.keys())


def _prepare_second(
    run_a: Evaluator, run_b: Evaluator, shapes: list[tuple[int, ...]], delta: float, p: int, q: int
) -> Prepared:
    """(second-tier plan, elements per trial, True), or the reason the outputs cannot be equal."""
    arith = BoundsArith()
    diff = _diff(run_a, run_b, shapes, arith)
    if isinstance(diff, str):
        return diff
    trial_plan = plan_trials(
        diff,
        delta,
        p,
        q,
        divisor_degree_p=arith.divisor_degree_p,
        divisor_degree_q=arith.divisor_degree_q,
        notes=_notes(arith),
    )
    return trial_plan, arith.total_numel, True


def _residues(v: Any, t: int, flat: int) -> tuple[int, int | None]:
    """``(x_p, x_q)`` of element ``flat`` in trial ``t`` (``x_q`` None where it is filler or absent)."""
    if isinstance(v, FieldValue):
        pv = int(v.data[0, t].ravel()[flat])
        return pv, None if v.tainted else int(v.data[1, t].ravel()[flat])
    return int(v.data[t].ravel()[flat]), None


def _counterexample(arith: Any, oa: Any, ob: Any, output: int, t: int, first_trial: int) -> Counterexample:
    mism = arith.mismatch(oa, ob)[t]
    flat = int(np.flatnonzero(mism.ravel())[0])
    index = tuple(int(i) for i in np.unravel_index(flat, mism.shape)) if mism.ndim else ()
    return Counterexample(output, index, first_trial + t, _residues(oa, t, flat), _residues(ob, t, flat))


@dataclass(slots=True)
class _Run:
    """The outcome of one tier's trials."""

    passed: int = 0
    degenerate: int = 0
    counterexample: Counterexample | None = None


def _trials(
    make_arith: Callable[[int], Any],
    run_a: Evaluator,
    run_b: Evaluator,
    shapes: list[tuple[int, ...]],
    target: int,
    full: int,
    first: int,
    should_stop: Callable[[], bool] | None,
) -> _Run:
    """Run ``target`` non-degenerate trials in batches (the first of ``first``) until one disagrees."""
    run = _Run()
    size = first
    while run.passed < target:
        if should_stop is not None and should_stop():
            raise VerificationStopped(f"stopped after {run.passed} of {target} trials")
        n = min(size, target - run.passed)
        size = full
        arith = make_arith(n)
        inputs = [arith.random_input(s) for s in shapes]
        shared = SharedArith(arith)  # what both sides compute alike is computed once
        oa, ob = run_a(shared, inputs), run_b(shared, inputs)
        del shared
        valid = ~arith.degenerate
        for i, (x, y) in enumerate(zip(oa, ob, strict=True)):
            bad = ~arith.equal(x, y) & valid
            if bad.any():
                t = int(np.flatnonzero(bad)[0])
                run.counterexample = _counterexample(arith, x, y, i, t, run.passed + run.degenerate)
                run.passed += int(valid[:t].sum()) + 1
                run.degenerate += int((~valid[:t]).sum())
                return run
        run.passed += int(valid.sum())
        run.degenerate += n - int(valid.sum())
        if run.degenerate >= 32 and run.degenerate > 4 * run.passed:
            raise VerificationError(
                f"{run.degenerate} of {run.degenerate + run.passed} trials divided by zero: a divisor is (almost) "
                "always zero"
            )
    return run


# ------------------------------------------------------------------------------------------------ entry point


def equivalent(
    a: Any,
    b: Any,
    delta: float = 1e-9,
    *,
    seed: int | None = None,
    max_trials: int | None = None,
    batch: int | None = None,
    p: int = DEFAULT_P,
    q: int = DEFAULT_Q,
    should_stop: Callable[[], bool] | None = None,
    on_second_tier: Callable[[TrialPlan], None] | None = None,
) -> EquivalenceResult:
    """Test whether ``a`` and ``b`` compute the same function, with false-accept probability ≤ ``delta``.

    Two tiers (docs/verification.md). The first evaluates exp, sqrt, activations and max as random functions
    over ``Z_M61`` and needs one or two trials; a pass there is final. A first-tier difference is final too
    unless a side uses exp or sqrt: the identity may then need ``exp(a + b) = exp(a)·exp(b)`` (an online-softmax
    rescale) or sqrt's law, and the second tier, the homomorphic ``ω^x`` test of Mirage over ``Z_p × Z_q``,
    decides.

    Parameters
    ----------
    a, b : Program or KernelGraph
        Anything with ``.inputs`` (``.shape`` each) and ``.evaluate(arith, values)``; same input count and
        shapes by position.
    delta : float
        Target false-accept probability, 0 < δ < 1.
    seed : int, optional
        Seed of all randomness (inputs, ω, function keys); drawn from the OS when None and reported.
    max_trials : int, optional
        Stop after this many passing trials even if the bound needs more; the result then reports the δ
        actually reached in ``achieved_delta``.
    batch : int, optional
        Trials per vectorised evaluation; by default batches are sized so a batch stays within ``BATCH_BYTES``.
        The second tier's first batch has at most ``FIRST_BATCH`` trials (cheap rejection).
    p, q : int
        The second tier's field moduli (primes ≡ 3 mod 4 with ``q | p - 1``, ``p < 2^31``).
    should_stop : callable, optional
        Polled before each batch of trials; when it returns True the test ends with :class:`VerificationStopped`
        (no verdict), so a long search can stop in the middle of a large candidate's check.
    on_second_tier : callable, optional
        Called with the second tier's plan before its trials run (the command line warns of long runs).

    Returns
    -------
    EquivalenceResult
        Truthy exactly when equivalent; ``tier`` says which test decided.

    Raises
    ------
    NotLaxError
        The first tier found a difference, a side uses exp or sqrt, and the second tier does not apply (two
        exps on one path).
    VerificationError
        Inputs that do not correspond, a bad δ, or a divisor that is zero in every trial.
    VerificationStopped
        ``should_stop`` returned True before the verdict.
    """
    start = time.perf_counter()
    if max_trials is not None and max_trials < 1:
        raise VerificationError(f"max_trials must be at least 1, got {max_trials}")
    if batch is not None and batch < 1:
        raise VerificationError(f"batch must be at least 1, got {batch}")
    if seed is None:
        seed = int(np.random.SeedSequence().entropy) % (1 << 63)  # type: ignore[arg-type]
    shapes = _input_shapes(a, "A")
    _check_inputs(shapes, _input_shapes(b, "B"))
    run_a, run_b = _evaluator(a), _evaluator(b)

    def result(tier: int, tp: TrialPlan, run: _Run, modulus: int) -> EquivalenceResult:
        ok = run.counterexample is None
        return EquivalenceResult(
            ok,
            run.passed,
            tp.required,
            modulus,
            q,
            delta,
            tp.achieved_delta(run.passed) if ok else 1.0,
            tp.k,
            tp.degree,
            run.degenerate,
            time.perf_counter() - start,
            run.counterexample,
            None,
            tp.method,
            tp.trials_first_paper,
            tp.trials_later_paper,
            seed,
            tp.notes,
            tier,
        )

    first = _prepare_first(run_a, run_b, shapes, delta, p, q)
    if isinstance(first, str):
        return EquivalenceResult(
            False,
            0,
            0,
            p,
            q,
            delta,
            1.0,
            0,
            0,
            0,
            time.perf_counter() - start,
            reason=first,
            seed=seed,
            tier=0,
        )
    plan1, numel, interpreted = first
    # Every trial draws its own function keys (one arithmetic serves both sides, so they share them).
    rng1 = np.random.default_rng((seed, 1))
    cap = plan1.required if max_trials is None else min(plan1.required, max_trials)
    full = batch or max(1, min(MAX_BATCH, BATCH_BYTES // max(1, numel * _BYTES_PER_ELEMENT)))
    run1 = _trials(lambda n: UninterpretedArith(n, rng1), run_a, run_b, shapes, cap, full, full, should_stop)
    if run1.counterexample is None or not interpreted:
        return result(1, plan1, run1, mersenne.M61)

    try:
        prepared = _prepare_second(run_a, run_b, shapes, delta, p, q)
    except NotLaxError as exc:
        raise NotLaxError(
            f"the first tier found a difference with exp and sqrt as uninterpreted functions, and the exp-law "
            f"test does not apply: {exc}"
        ) from None
    assert not isinstance(prepared, str)  # the first tier already compared the output shapes
    plan2, numel, _ = prepared
    if on_second_tier is not None:
        on_second_tier(plan2)
    target = plan2.required if max_trials is None else min(plan2.required, max_trials)
    full = batch or max(1, min(MAX_BATCH, BATCH_BYTES // max(1, numel * _BYTES_PER_ELEMENT)))
    rng2 = np.random.default_rng(seed)
    field_keys: dict[str, int] = {k: int(rng2.integers(0, 2**63)) for k in KEYED}
    run2 = _trials(
        lambda n: FieldArith(n, rng2, p=p, q=q, keys=field_keys),
        run_a,
        run_b,
        shapes,
        target,
        full,
        min(FIRST_BATCH, full) if batch is None else full,
        should_stop,
    )
    return result(2, plan2, run2, p)


__all__ = [
    "BATCH_BYTES",
    "MAX_BATCH",
    "Counterexample",
    "EquivalenceResult",
    "VerificationStopped",
    "equivalent",
    "plan",
]

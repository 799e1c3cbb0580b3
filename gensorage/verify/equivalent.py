"""The probabilistic equivalence check of two programs or µGraphs (random tests over Z_p × Z_q).

:func:`equivalent` works on any two objects with ``.inputs`` (each with ``.shape``) and
``.evaluate(arith, values) -> list``: :class:`gensorage.program.Program` and
:class:`gensorage.ugraph.KernelGraph` alike. It

1. runs both through :class:`~gensorage.verify.bounds.BoundsArith` (Lax check, term counts, degrees),
2. derives the trial count for δ (:mod:`gensorage.verify.trials`),
3. evaluates both on the same fresh uniform inputs in :class:`~gensorage.verify.field.FieldArith`, many trials
   per vectorised batch, discarding degenerate trials (a zero divisor) and stopping at the first disagreement.

Equivalent programs always pass (no false rejections): every op is a deterministic function of its inputs'
field values, identical for both sides. A pass bounds the false-accept probability by δ under the conditions
listed in the result's ``notes`` (see docs/verification.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gensorage.errors import NotLaxError, VerificationError
from gensorage.verify.bounds import BoundsArith, BoundValue, DiffBound, difference
from gensorage.verify.field import ACTIVATION_KINDS, FieldArith, FieldValue
from gensorage.verify.primes import DEFAULT_P, DEFAULT_Q
from gensorage.verify.trials import TrialPlan, format_count, plan_trials

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


@dataclass(frozen=True, slots=True)
class Counterexample:
    """Where the two sides disagreed: output ``output`` at ``index`` in trial ``trial`` (0-based, all trials).

    ``a`` and ``b`` are the ``(x_p, x_q)`` residues of each side there; ``x_q`` is None where it is filler
    (the value depends on an exp).
    """

    output: int
    index: tuple[int, ...]
    trial: int
    a: tuple[int, int | None]
    b: tuple[int, int | None]

    def __str__(self) -> str:
        return (
            f"output {self.output} at index {list(self.index)} in trial {self.trial}: A={self.a}, B={self.b}"
        )


@dataclass(frozen=True, slots=True)
class EquivalenceResult:
    """The outcome of :func:`equivalent`; truthy exactly when the programs were found equivalent.

    Attributes
    ----------
    equivalent : bool
        True when every trial run agreed (and at least one ran).
    trials : int
        Non-degenerate trials run (the last one is the failing one when rejected).
    required_trials : int
        Trials the bound needs for ``delta``.
    p, q : int
        The field moduli.
    delta : float
        The requested false-accept probability.
    achieved_delta : float
        The bound the trials run actually give (≤ ``delta`` when ``trials >= required_trials``; larger when
        ``max_trials`` capped the run).
    k, degree : int
        Exponential-term and degree bounds of the difference (see :class:`~gensorage.verify.trials.TrialPlan`).
    degenerate_trials : int
        Trials discarded because some divisor was zero.
    elapsed_s : float
        Wall time of the whole check.
    counterexample : Counterexample or None
        Where the sides differed (rejections found by a trial).
    reason : str or None
        Why the programs were rejected without trials (output count or shape mismatch).
    method : str
        ``"schwartz-zippel"`` or ``"lax-theorem"``.
    trials_first_paper, trials_later_paper : int or None
        The Lax theorems' counts ``k·ln(1/δ)`` and ``k²/ln q·ln(1/δ)`` (the larger is required).
    seed : int
        Seed of the random stream (re-running with it repeats the check).
    notes : tuple of str
        Unmet theorem conditions and heuristics in use.
    """

    equivalent: bool
    trials: int
    required_trials: int
    p: int
    q: int
    delta: float
    achieved_delta: float
    k: int
    degree: int
    degenerate_trials: int
    elapsed_s: float
    counterexample: Counterexample | None = None
    reason: str | None = None
    method: str = "schwartz-zippel"
    trials_first_paper: int | None = None
    trials_later_paper: int | None = None
    seed: int = 0
    notes: tuple[str, ...] = field(default=())

    def __bool__(self) -> bool:
        return self.equivalent

    @property
    def capped(self) -> bool:
        """The run stopped (passing) before the required trial count."""
        return self.equivalent and self.trials < self.required_trials

    def __str__(self) -> str:
        ms = f"{self.elapsed_s * 1e3:.1f} ms"
        fields_ = f"p={self.p}, q={self.q}"
        if not self.equivalent:
            why = self.reason or (str(self.counterexample) if self.counterexample else "no trial ran")
            return f"NOT equivalent: {why} (after {self.trials} trial(s), {fields_}, seed {self.seed}; {ms})"
        basis = f"{self.method}: k={format_count(self.k)}, degree={self.degree}"
        if self.trials_first_paper is not None:
            basis += (
                f", first paper k·ln(1/δ)={format_count(self.trials_first_paper)}, later paper "
                f"k²/ln q·ln(1/δ)={format_count(self.trials_later_paper or 0)}"
            )
        if self.capped:
            head = (
                f"equivalent on all {self.trials} trials run, but {format_count(self.required_trials)} are "
                f"required for δ={self.delta:g}: the δ actually reached is {self.achieved_delta:.4g}"
            )
        else:
            head = (
                f"equivalent: {self.trials} of {format_count(self.required_trials)} required trials passed, "
                f"false-accept probability ≤ {self.achieved_delta:.3g} (δ={self.delta:g})"
            )
        text = f"{head} [{basis}; {fields_}; {self.degenerate_trials} degenerate; seed {self.seed}; {ms}]"
        return text + "".join(f"\n  note: {n}" for n in self.notes)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (huge counts as strings)."""

        def num(x: int | None) -> int | str | None:
            return x if x is None or x < 1 << 63 else format_count(x)

        ce = self.counterexample
        return {
            "equivalent": self.equivalent,
            "trials": self.trials,
            "required_trials": num(self.required_trials),
            "p": self.p,
            "q": self.q,
            "delta": self.delta,
            "achieved_delta": self.achieved_delta,
            "k": num(self.k),
            "degree": self.degree,
            "degenerate_trials": self.degenerate_trials,
            "elapsed_s": self.elapsed_s,
            "method": self.method,
            "trials_first_paper": num(self.trials_first_paper),
            "trials_later_paper": num(self.trials_later_paper),
            "seed": self.seed,
            "reason": self.reason,
            "notes": list(self.notes),
            "counterexample": None
            if ce is None
            else {
                "output": ce.output,
                "index": list(ce.index),
                "trial": ce.trial,
                "a": list(ce.a),
                "b": list(ce.b),
            },
        }


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
    if arith.opaque:
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


def plan(a: Any, b: Any, delta: float = 1e-9, *, p: int = DEFAULT_P, q: int = DEFAULT_Q) -> TrialPlan:
    """The :class:`~gensorage.verify.trials.TrialPlan` :func:`equivalent` would follow (no trials are run).

    Raises :class:`~gensorage.errors.NotLaxError` when either side is outside the Lax fragment and
    :class:`~gensorage.errors.VerificationError` when the inputs or outputs do not correspond.
    """
    sa, sb = _input_shapes(a, "A"), _input_shapes(b, "B")
    _check_inputs(sa, sb)
    result = _prepare(_evaluator(a), _evaluator(b), sa, delta, p, q)
    if isinstance(result, str):
        raise VerificationError(result)
    return result[0]


def _prepare(
    run_a: Evaluator, run_b: Evaluator, shapes: list[tuple[int, ...]], delta: float, p: int, q: int
) -> tuple[TrialPlan, int] | str:
    """(plan, elements per trial), or the reason the outputs cannot be equal."""
    arith = BoundsArith()
    oa = _bounds(run_a, "A", arith, shapes)
    ob = _bounds(run_b, "B", arith, shapes)
    mismatch = _output_mismatch(oa, ob)
    if mismatch is not None:
        return mismatch
    diff = _worst([difference(x.bound, y.bound) for x, y in zip(oa, ob, strict=True)])
    trial_plan = plan_trials(
        diff,
        delta,
        p,
        q,
        divisor_degree_p=arith.divisor_degree_p,
        divisor_degree_q=arith.divisor_degree_q,
        notes=_notes(arith),
    )
    return trial_plan, arith.total_numel


def _counterexample(
    arith: FieldArith, oa: FieldValue, ob: FieldValue, output: int, t: int, first_trial: int
) -> Counterexample:
    mism = arith.mismatch(oa, ob)[t]
    flat = int(np.flatnonzero(mism.ravel())[0])
    index = tuple(int(i) for i in np.unravel_index(flat, mism.shape)) if mism.ndim else ()

    def at(v: FieldValue) -> tuple[int, int | None]:
        pv = int(v.data[0, t].ravel()[flat])
        return pv, None if v.tainted else int(v.data[1, t].ravel()[flat])

    return Counterexample(output, index, first_trial + t, at(oa), at(ob))


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
) -> EquivalenceResult:
    """Test whether ``a`` and ``b`` compute the same function, with false-accept probability ≤ ``delta``.

    Parameters
    ----------
    a, b : Program or KernelGraph
        Anything with ``.inputs`` (``.shape`` each) and ``.evaluate(arith, values)``; same input count and
        shapes by position.
    delta : float
        Target false-accept probability, 0 < δ < 1.
    seed : int, optional
        Seed of all randomness (inputs, ω, activation keys); drawn from the OS when None and reported.
    max_trials : int, optional
        Stop after this many passing trials even if the bound needs more; the result then reports the δ
        actually reached in ``achieved_delta``.
    batch : int, optional
        Trials per vectorised evaluation; by default batches are sized so a batch stays within ``BATCH_BYTES``.
        The first batch has at most ``FIRST_BATCH`` trials (cheap rejection).
    p, q : int
        Field moduli (primes ≡ 3 mod 4 with ``q | p - 1``, ``p < 2^31``).
    should_stop : callable, optional
        Polled before each batch of trials; when it returns True the test ends with :class:`VerificationStopped`
        (no verdict), so a long search can stop in the middle of a large candidate's check.

    Returns
    -------
    EquivalenceResult
        Truthy exactly when equivalent.

    Raises
    ------
    NotLaxError
        A side has two exps on one path or a max reduction.
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
    prepared = _prepare(run_a, run_b, shapes, delta, p, q)
    if isinstance(prepared, str):
        return EquivalenceResult(
            False, 0, 0, p, q, delta, 1.0, 0, 0, 0, time.perf_counter() - start, reason=prepared, seed=seed
        )
    trial_plan, numel = prepared
    target = trial_plan.required if max_trials is None else min(trial_plan.required, max_trials)
    full = batch or max(1, min(MAX_BATCH, BATCH_BYTES // max(1, numel * _BYTES_PER_ELEMENT)))
    rng = np.random.default_rng(seed)
    keys: dict[str, int] = {k: int(rng.integers(0, 2**63)) for k in ACTIVATION_KINDS}
    passed = degenerate = 0
    size = min(FIRST_BATCH, full) if batch is None else full

    def result(ok: bool, ce: Counterexample | None = None) -> EquivalenceResult:
        return EquivalenceResult(
            ok,
            passed,
            trial_plan.required,
            p,
            q,
            delta,
            trial_plan.achieved_delta(passed) if ok else 1.0,
            trial_plan.k,
            trial_plan.degree,
            degenerate,
            time.perf_counter() - start,
            ce,
            None,
            trial_plan.method,
            trial_plan.trials_first_paper,
            trial_plan.trials_later_paper,
            seed,
            trial_plan.notes,
        )

    while passed < target:
        if should_stop is not None and should_stop():
            raise VerificationStopped(f"stopped after {passed} of {target} trials")
        n = min(size, target - passed)
        size = full
        arith = FieldArith(n, rng, p=p, q=q, keys=keys)
        inputs = [arith.random_input(s) for s in shapes]
        oa, ob = run_a(arith, inputs), run_b(arith, inputs)
        valid = ~arith.degenerate
        for i, (x, y) in enumerate(zip(oa, ob, strict=True)):
            bad = ~arith.equal(x, y) & valid
            if bad.any():
                t = int(np.flatnonzero(bad)[0])
                ce = _counterexample(arith, x, y, i, t, passed + degenerate)
                passed += int(valid[:t].sum()) + 1
                degenerate += int((~valid[:t]).sum())
                return result(False, ce)
        passed += int(valid.sum())
        degenerate += n - int(valid.sum())
        if degenerate >= 32 and degenerate > 4 * passed:
            raise VerificationError(
                f"{degenerate} of {degenerate + passed} trials divided by zero: a divisor is (almost) always zero"
            )
    return result(True)


__all__ = [
    "BATCH_BYTES",
    "MAX_BATCH",
    "Counterexample",
    "EquivalenceResult",
    "VerificationStopped",
    "equivalent",
    "plan",
]

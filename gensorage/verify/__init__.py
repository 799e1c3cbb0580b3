"""Probabilistic equivalence verification (Mirage §5): random tests over finite fields, and the float test.

- :func:`equivalent` — are two programs / µGraphs the same function? (:class:`EquivalenceResult`)
- :func:`plan` — the trial count a check needs, without running it (:class:`TrialPlan`)
- :func:`float_check` — numerical stability of a candidate in its dtype (:class:`FloatCheck`)
- :class:`UninterpretedArith` — the first tier's ``Z_M61`` arithmetic with uninterpreted functions
- :class:`FieldArith` — the second tier's ``Z_p × Z_q`` arithmetic; :class:`BoundsArith` — the bounds
- :mod:`gensorage.verify.mutate` — µGraph mutation operators for testing the verifier

See docs/verification.md for what a pass does and does not guarantee.
"""

from __future__ import annotations

from gensorage.verify.bounds import Bound, BoundsArith, BoundValue, DiffBound
from gensorage.verify.equivalent import equivalent, plan
from gensorage.verify.field import FieldArith, FieldValue
from gensorage.verify.floatcheck import FloatCheck, RoundingArith, float_check
from gensorage.verify.primes import DEFAULT_P, DEFAULT_Q, find_safe_prime_pair, is_prime
from gensorage.verify.result import Counterexample, EquivalenceResult
from gensorage.verify.trials import TrialPlan, plan_trials, plan_uninterpreted
from gensorage.verify.uninterpreted import UFValue, UninterpretedArith

__all__ = [
    "DEFAULT_P",
    "DEFAULT_Q",
    "Bound",
    "BoundValue",
    "BoundsArith",
    "Counterexample",
    "DiffBound",
    "EquivalenceResult",
    "FieldArith",
    "FieldValue",
    "FloatCheck",
    "RoundingArith",
    "TrialPlan",
    "UFValue",
    "UninterpretedArith",
    "equivalent",
    "find_safe_prime_pair",
    "float_check",
    "is_prime",
    "plan",
    "plan_trials",
    "plan_uninterpreted",
]

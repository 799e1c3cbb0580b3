"""How many random trials reach a false-accept probability δ, from the bounds of the two programs.

*First tier* (:func:`plan_uninterpreted`) — exp, sqrt, activations and max are random functions over
``Z_M61``; the per-trial bound is a collision term (two different arguments of one function meeting) plus a
Schwartz–Zippel term, both over ``p ≈ 2^61`` (Theorem 1 of docs/verification.md).

*Second tier*, two regimes (``k`` and the degrees come from :func:`gensorage.verify.bounds.difference`, maximised over the
output pairs; a non-equivalent pair differs in at least one output element, and every bound holds for each):

*No exp on either side* — Schwartz–Zippel over ``Z_p``. The difference ``A - B`` is a rational function whose
cross-multiplied numerator has degree ≤ ``d``; it vanishes at a uniform point with probability ≤ d/p. Trials
where some divisor vanishes (event D) are discarded and replaced, so the per-trial false-accept probability is
``ε = P[num = 0 | not D] ≤ (d/p) / (1 - P[D])`` with ``P[D] ≤ S_p/p + S_q/q`` (S = Σ of divisor numerator
degrees over every divisor element, both programs). Trials: ``ceil(ln δ / ln ε)``.

*Some exp* — the Lax theorems. The later Mirage paper (Theorem 3) needs ``Ω((k²/ln q)·ln(1/δ))`` trials, the
first one (Theorem 4, from a per-trial bound 1 - 1/k + o(1/k)) ``Ω(k·ln(1/δ))``. We take the constant of each
Ω to be 1, compute both, and use the larger (more conservative) one. For δ where both are tiny the o(1/k) term
of the first paper is ignored. The theorems' side conditions are checked and any that fails is reported in
:attr:`TrialPlan.notes` (the counts are still computed, but are then not backed by a proof).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from gensorage.errors import VerificationError
from gensorage.verify.bounds import K_CAP, Applications, DiffBound

Method = Literal["uninterpreted", "schwartz-zippel", "lax-theorem"]


@dataclass(frozen=True, slots=True)
class TrialPlan:
    """The trial count for one check and what it rests on.

    Attributes
    ----------
    method : {"uninterpreted", "schwartz-zippel", "lax-theorem"}
        ``"uninterpreted"`` is the first tier (Theorem 1 of docs/verification.md); the others the second.
    required : int
        Trials needed for the requested δ.
    k : int
        Exponential terms in the cross-multiplied difference (1 without exp).
    degree : int
        Degree bound used (numerator degree of the difference for Schwartz–Zippel; the largest polynomial degree
        for the Lax theorems).
    per_trial : float or None
        Per-trial false-accept bound ε (None for the Lax theorems).
    trials_first_paper, trials_later_paper : int or None
        ``ceil(k·ln(1/δ))`` and ``ceil(k²/ln q · ln(1/δ))`` (Lax theorems only).
    notes : tuple of str
        Theorem conditions that do not hold or heuristics in use.
    """

    method: Method
    required: int
    k: int
    degree: int
    per_trial: float | None
    trials_first_paper: int | None
    trials_later_paper: int | None
    q: int
    notes: tuple[str, ...] = ()

    def achieved_delta(self, trials: int) -> float:
        """The false-accept bound after ``trials`` passing trials (the larger of the two Lax bounds)."""
        if trials <= 0:
            return 1.0
        if self.per_trial is not None:
            return self.per_trial**trials
        first = math.exp(-float(Fraction(trials, self.k)))
        later = math.exp(-float(Fraction(trials, self.k * self.k)) * math.log(self.q))
        return max(first, later)


def _ceil(x: Fraction) -> int:
    return max(1, math.ceil(x))


def plan_trials(
    diff: DiffBound,
    delta: float,
    p: int,
    q: int,
    *,
    divisor_degree_p: int = 0,
    divisor_degree_q: int = 0,
    notes: tuple[str, ...] = (),
) -> TrialPlan:
    """The :class:`TrialPlan` for a difference bound ``diff`` and false-accept probability ``delta``."""
    if not 0.0 < delta < 1.0:
        raise VerificationError(f"delta must lie strictly between 0 and 1, got {delta!r}")
    log_inv = Fraction(math.log(1.0 / delta))
    if not diff.has_exp:
        return _schwartz_zippel(diff, delta, p, q, divisor_degree_p, divisor_degree_q, notes)
    k = diff.k
    first = _ceil(k * log_inv)
    later = _ceil(Fraction(k * k) * log_inv / Fraction(math.log(q)))
    extra = list(notes)
    if k >= K_CAP:
        extra.append("the exponential-term bound k saturated at 2^1024: the true count is larger still")
    if diff.degree * k**4 >= q:
        extra.append(
            f"the first paper's Theorem 3 needs d·k^4 < q, but d·k^4 = {format_count(diff.degree * k**4)} ≥ q = {q}"
        )
    if diff.log2_coeff + 1 >= math.log2(q):
        extra.append(
            f"the later paper's Theorem 2 needs q > 2w for integer coefficients in [-w, w]; the coefficient bound "
            f"w ≤ 2^{diff.log2_coeff:.1f} does not establish it (q ≈ 2^{math.log2(q):.1f})"
        )
    return TrialPlan("lax-theorem", max(first, later), k, diff.degree, None, first, later, q, tuple(extra))


def _schwartz_zippel(
    diff: DiffBound, delta: float, p: int, q: int, s_p: int, s_q: int, notes: tuple[str, ...]
) -> TrialPlan:
    d = diff.numerator_degree
    p_degenerate = s_p / p + s_q / q
    if p_degenerate >= 0.5:
        raise VerificationError(
            f"cannot bound the error: divisors of total degree {s_p} make a degenerate trial too likely "
            f"(bound {p_degenerate:.2f}) for p = {p}"
        )
    eps = (d / p) / (1.0 - p_degenerate)
    if eps >= 1.0:
        raise VerificationError(f"cannot bound the error: degree {d} is not below p = {p}")
    required = 1 if eps == 0.0 else max(1, math.ceil(math.log(delta) / math.log(eps)))
    return TrialPlan("schwartz-zippel", required, 1, d, eps, None, None, q, notes)


def plan_uninterpreted(
    diff: DiffBound,
    delta: float,
    p: int,
    applications: Mapping[str, Applications],
    *,
    divisor_degree: int = 0,
    notes: tuple[str, ...] = (),
) -> TrialPlan:
    """The first tier's :class:`TrialPlan` (Theorem 1 of docs/verification.md).

    Per trial ``ε = (C + d/p) / (1 − C − S/p)`` with the collision term ``C = Σ_f C(m_f, 2)·d_f / p`` over the
    uninterpreted symbols f (``m_f`` applications whose arguments differ by numerators of degree ≤ ``d_f``),
    ``d`` the numerator degree of the difference and ``S`` the divisors' total numerator degree.
    """
    if not 0.0 < delta < 1.0:
        raise VerificationError(f"delta must lie strictly between 0 and 1, got {delta!r}")
    collide = sum(
        Fraction(a.count * (a.count - 1), 2) * a.difference_degree for a in applications.values()
    ) / Fraction(p)
    degenerate = Fraction(divisor_degree, p)
    if collide + degenerate >= Fraction(1, 2):
        raise VerificationError(
            f"cannot bound the first tier's error: {sum(a.count for a in applications.values())} function "
            f"applications and divisors of total degree {divisor_degree} are too many for p = {p}"
        )
    eps = float((collide + Fraction(diff.numerator_degree, p)) / (1 - collide - degenerate))
    required = 1 if eps == 0.0 else max(1, math.ceil(math.log(delta) / math.log(eps)))
    extra = list(notes)
    log2_coeff = max([diff.log2_coeff + 1.0] + [a.difference_log2_coeff for a in applications.values()])
    if log2_coeff >= math.log2(p):
        extra.append(
            f"coefficients of the difference may reach 2^{log2_coeff:.0f} ≥ p: the bound proves equality over "
            f"Z_p, and a difference over the rationals escapes only if p divides every one of its coefficients"
        )
    return TrialPlan("uninterpreted", required, 1, diff.numerator_degree, eps, None, None, 0, tuple(extra))


def format_count(n: int) -> str:
    """An integer as text, in scientific notation once it has more than 12 digits (counts can be astronomic)."""
    if n < 10**12:
        return str(n)
    lg = math.log10(n)
    e = math.floor(lg)
    return f"{10 ** (lg - e):.2f}e{e}"


__all__ = ["Method", "TrialPlan", "format_count", "plan_trials", "plan_uninterpreted"]

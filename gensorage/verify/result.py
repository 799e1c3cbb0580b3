"""What :func:`gensorage.verify.equivalent` returns: the verdict, the bound it rests on, and a counterexample."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gensorage.verify.trials import format_count


@dataclass(frozen=True, slots=True)
class Counterexample:
    """Where the two sides disagreed: output ``output`` at ``index`` in trial ``trial`` (0-based, all trials).

    ``a`` and ``b`` are the ``(x_p, x_q)`` residues of each side there; ``x_q`` is None where it is filler
    (the value depends on an exp) and in the first tier (one field).
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
        The modulus of the deciding tier's field (``2^61 - 1`` in the first tier) and the second tier's q.
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
        ``"uninterpreted"`` (first tier), ``"schwartz-zippel"`` or ``"lax-theorem"`` (second tier).
    trials_first_paper, trials_later_paper : int or None
        The Lax theorems' counts ``k·ln(1/δ)`` and ``k²/ln q·ln(1/δ)`` (the larger is required).
    seed : int
        Seed of the random stream (re-running with it repeats the check).
    notes : tuple of str
        Unmet theorem conditions and heuristics in use.
    tier : int
        Which test decided: 1, uninterpreted functions over ``Z_M61``; 2, the homomorphic ``ω^x`` test over
        ``Z_p × Z_q``, run only when the first tier found a difference and a side uses exp or sqrt (an identity
        may need ``exp(a + b) = exp(a)·exp(b)``); 0, no trial (outputs that cannot correspond).
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
    tier: int = 1

    def __bool__(self) -> bool:
        return self.equivalent

    @property
    def capped(self) -> bool:
        """The run stopped (passing) before the required trial count."""
        return self.equivalent and self.trials < self.required_trials

    def __str__(self) -> str:
        ms = f"{self.elapsed_s * 1e3:.1f} ms"
        fields_ = f"tier {self.tier}, " + (
            "p=2^61-1" if self.method == "uninterpreted" else f"p={self.p}, q={self.q}"
        )
        if not self.equivalent:
            why = self.reason or (str(self.counterexample) if self.counterexample else "no trial ran")
            return f"NOT equivalent: {why} (after {self.trials} trial(s), {fields_}, seed {self.seed}; {ms})"
        basis = f"{self.method}: degree={self.degree}"
        if self.method != "uninterpreted":
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
            "tier": self.tier,
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


__all__ = ["Counterexample", "EquivalenceResult"]

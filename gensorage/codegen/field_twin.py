"""The finite-field twin of a µGraph's generated kernels: a polynomial-identity check of the emitted indexing.

The twin is every kernel of :mod:`gensorage.codegen.module` emitted by the *same* emitters with
:class:`~gensorage.codegen.scalar.FieldScalar` arithmetic (int64 residues mod p and mod q, Mirage's Table 3;
pre-defined matmuls through the same construction schedule on an int64 ``truncmod`` reduction) and built for
the CPU. Run on uniformly random field inputs, its outputs must equal, bit for bit, the field evaluation of
the program (or of the µGraph itself) by :class:`gensorage.verify.field.FieldArith` with the same ω and
activation keys. A wrong index anywhere in the emitted code — a swapped imap, an off-by-one offset, a wrong
reshape — changes the polynomial a kernel computes, and a random point exposes that with probability
about ``1 - degree / p`` per trial, independently of floating-point tolerances.

Where the reference is the program, the comparison follows the verifier's rules: ``x_q`` is compared only
where the reference value does not depend on an exp, and trials with a zero divisor (where equivalent
programs may legitimately differ) are skipped. Against the µGraph's own field evaluation every component of
every trial is compared (both compute the same function).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gensorage.codegen.module import Kernel, _parse, compile_kernels, execute, lower_ugraph
from gensorage.codegen.scalar import FIELD_PARAMS, FieldScalar
from gensorage.codegen.ugraph_tir import plan_threads
from gensorage.construction.block_threads import ThreadChoice
from gensorage.hw.profile import HwProfile
from gensorage.ugraph.ir import GraphDefinedOp, KernelGraph
from gensorage.ugraph.validate import validate
from gensorage.verify.field import ACTIVATION_KINDS, FieldArith, FieldValue
from gensorage.verify.primes import DEFAULT_P, DEFAULT_Q


@dataclass(frozen=True, slots=True)
class TwinMismatch:
    """Where the twin and the reference first differ: ``(x_p, x_q)`` of each (``x_q`` None where not compared)."""

    output: int
    trial: int
    index: tuple[int, ...]
    twin: tuple[int, int]
    reference: tuple[int, int | None]

    def __str__(self) -> str:
        return (
            f"output {self.output} at index {list(self.index)} in trial {self.trial}: "
            f"twin {self.twin}, reference {self.reference}"
        )


@dataclass(frozen=True, slots=True)
class TwinCheck:
    """Outcome of :func:`check_field_twin`; truthy exactly when every compared trial agreed."""

    ok: bool
    trials: int
    skipped: int
    reference: str
    p: int
    q: int
    seed: int
    mismatch: TwinMismatch | None = None

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        head = "field twin matches" if self.ok else f"field twin MISMATCH: {self.mismatch}"
        return (
            f"{head} ({self.trials} trial(s) against the {self.reference}, {self.skipped} degenerate skipped; "
            f"p={self.p}, q={self.q}, seed {self.seed})"
        )


class FieldTwin:
    """The µGraph's kernels in ``Z_p x Z_q`` arithmetic, built for the CPU (llvm).

    Parameters
    ----------
    ugraph, hw
        The µGraph and the profile whose thread plans the kernels follow (the same plans as
        :func:`gensorage.codegen.module.compile_ugraph` with this profile and ``seed``).
    p, q
        Field moduli (see :func:`gensorage.verify.field.check_moduli`).
    seed
        Seed of the Markov construction (thread/register tiling).
    plans
        Thread plans to reuse (e.g. ``CompiledUGraph.plans``); computed when None.
    """

    def __init__(
        self,
        ugraph: KernelGraph,
        hw: HwProfile,
        *,
        p: int = DEFAULT_P,
        q: int = DEFAULT_Q,
        seed: int = 0,
        plans: dict[int, ThreadChoice] | None = None,
        kernels: Sequence[Kernel] | None = None,
    ) -> None:
        from gensorage.codegen.predefined_matmul import gemm_epilogues

        if kernels is None:  # epilogues the field twin's GEMM kernels do not take run as their own kernels
            ugraph, moved = gemm_epilogues(ugraph, field=True)
            plans = None if plans is None else {moved[k]: v for k, v in plans.items()}
        self.ugraph = ugraph
        self.hw = hw
        self.p, self.q = p, q
        self.info = validate(ugraph)
        self.scalar = FieldScalar(p, q)
        if plans is None:
            plans = {
                k: plan_threads(ugraph, k, self.info, hw, seed)
                for k, op in enumerate(ugraph.ops)
                if isinstance(op, GraphDefinedOp)
            }
        self.plans = plans
        self.seed = seed
        self.kernels = (
            list(kernels)
            if kernels is not None
            else lower_ugraph(ugraph, self.info, hw, plans, target="llvm", scalar=self.scalar, seed=seed)
        )
        self._ex: Any = None

    def with_source(self, name: str, text: str) -> FieldTwin:
        """A copy with kernel ``name`` replaced by the TVMScript ``text`` (e.g. to inject a fault in a test)."""
        kernels = []
        for k in self.kernels:
            if k.name == name:
                k = Kernel(
                    k.name,
                    k.op_index,
                    _parse(text, name),
                    text,
                    k.params,
                    k.grid,
                    k.threads,
                    k.rule,
                    k.component,
                )
            kernels.append(k)
        if not any(k.name == name for k in self.kernels):
            raise KeyError(name)
        return FieldTwin(
            self.ugraph, self.hw, p=self.p, q=self.q, seed=self.seed, plans=self.plans, kernels=kernels
        )

    def source(self, name: str) -> str:
        """TVMScript of kernel ``name``."""
        return next(k.script for k in self.kernels if k.name == name)

    def run(self, inputs: Sequence[np.ndarray], omega: int, keys: dict[str, int]) -> list[np.ndarray]:
        """Outputs (int64, ``(2, *shape)``) for one trial: residue arrays ``(2, *shape)`` per input, ω, keys."""
        import tvm

        if self._ex is None:
            self._ex = compile_kernels(self.kernels, "llvm", self.hw)
        dev = tvm.cpu(0)
        tensors = []
        for spec, x in zip(self.ugraph.inputs, inputs, strict=True):
            arr = np.ascontiguousarray(x, dtype=np.int64)
            if arr.shape != (2, *spec.shape):
                raise ValueError(
                    f"input {spec.name}: expected residues of shape {(2, *spec.shape)}, got {arr.shape}"
                )
            tensors.append(tvm.runtime.tensor(arr, device=dev))
        params = np.zeros(FIELD_PARAMS, dtype=np.int64)
        params[0] = omega
        for i, kind in enumerate(ACTIVATION_KINDS):
            params[1 + i] = keys.get(kind, 0)
        outs = execute(
            self.ugraph,
            self.info,
            self.kernels,
            self._ex,
            tensors,
            dev,
            self.scalar,
            tvm.runtime.tensor(params, device=dev),
        )
        return [np.asarray(o.numpy()) for o in outs]


def _first_mismatch(twin: np.ndarray, ref: FieldValue, t: int, compare_q: bool) -> tuple[int, ...] | None:
    diff = twin[0] != ref.data[0, t]
    if compare_q:
        diff |= twin[1] != ref.data[1, t]
    if not diff.any():
        return None
    return tuple(int(i) for i in np.unravel_index(int(np.flatnonzero(diff.ravel())[0]), diff.shape))


def check_field_twin(
    ugraph: KernelGraph,
    program: Any = None,
    *,
    trials: int = 2,
    seed: int = 0,
    hw: HwProfile | None = None,
    twin: FieldTwin | None = None,
    p: int = DEFAULT_P,
    q: int = DEFAULT_Q,
) -> TwinCheck:
    """Run the field twin of ``ugraph``'s kernels on random field inputs and compare with the reference.

    Parameters
    ----------
    ugraph : KernelGraph
        The µGraph whose generated kernels are checked.
    program : Program, optional
        The reference (anything with ``.evaluate(arith, values)``); default: ``ugraph`` itself.
    trials : int
        Random trials (each a fresh input point, ω and the same activation keys).
    seed : int
        Seed of inputs, ω and keys (and of the thread plans when the twin is built here).
    hw : HwProfile, optional
        Profile the kernels are planned for (default: ``"h100"``); ignored when ``twin`` is given.
    twin : FieldTwin, optional
        A prebuilt (or deliberately altered) twin.
    p, q : int
        Field moduli; ignored when ``twin`` is given.

    Returns
    -------
    TwinCheck
        Truthy when every compared trial agreed; otherwise ``mismatch`` says where.

    Raises
    ------
    NotLaxError
        The µGraph or program has no field semantics (max accumulation or reduction, two exps on a path,
        an online-softmax accumulator).
    """
    if trials < 1:
        raise ValueError(f"trials must be positive, got {trials}")
    if twin is None:
        if hw is None:
            from gensorage.hw import load_profile

            hw = load_profile("h100")
        twin = FieldTwin(ugraph, hw, p=p, q=q, seed=seed)
    reference = ugraph if program is None else program
    rng = np.random.default_rng(seed)
    arith = FieldArith(trials, rng, p=twin.p, q=twin.q)
    inputs = [arith.random_input(spec.shape) for spec in ugraph.inputs]
    ref = reference.evaluate(arith, inputs)
    if len(ref) != len(ugraph.outputs):
        raise ValueError(f"reference has {len(ref)} outputs, the µGraph {len(ugraph.outputs)}")
    skipped = 0
    for t in range(trials):
        if program is not None and arith.degenerate[t]:
            skipped += 1
            continue
        outs = twin.run([x.data[:, t] for x in inputs], int(arith.omega[t]), arith.keys)
        for o, (got, want) in enumerate(zip(outs, ref, strict=True)):
            compare_q = program is None or not want.tainted
            at = _first_mismatch(got, want, t, compare_q)
            if at is not None:
                pair = (int(got[0][at]), int(got[1][at]))
                ref_pair = (int(want.data[0, t][at]), int(want.data[1, t][at]) if compare_q else None)
                return TwinCheck(
                    False,
                    t + 1 - skipped,
                    skipped,
                    "program" if program is not None else "µGraph",
                    twin.p,
                    twin.q,
                    seed,
                    TwinMismatch(o, t, at, pair, ref_pair),
                )
    return TwinCheck(
        True, trials - skipped, skipped, "program" if program is not None else "µGraph", twin.p, twin.q, seed
    )


__all__ = ["FieldTwin", "TwinCheck", "TwinMismatch", "check_field_twin"]

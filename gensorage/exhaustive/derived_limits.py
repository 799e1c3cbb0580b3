"""Search limits derived from the program, for a search nobody gave limits to (a program without a preset).

:class:`~gensorage.exhaustive.spec.SearchSpec`'s own defaults are one fixed space for every program: two kernel
operators, any number of them graph-defined, five compute operators per block graph, three grid dims. That space
is too small for a fused RMSNorm + MatMul (seven block operators) and far too large to finish for it without a
time budget, even at its small search shapes. Mirage sizes
its space the other way round, and so does :func:`derive_limits`:

* **one graph-defined kernel** (``max_block_graphs = 1``, Mirage's default ``max_num_threadblock_graphs``), and
  no other kernel operator when the program's operators fit one block graph (``max_kernel_ops = 1``): the
  space of single fused kernels, where Mirage's results for such programs lie (RMSNorm + MatMul, gated MLP,
  LoRA). A larger program gets a second kernel operator, pre-defined (a library matmul, an elementwise op),
  which feeds the custom kernel (``graph_defined_last``): a kernel that is not the last is the expensive part
  of a search, since nothing ties its outputs to the program's, so its block graphs are pruned far less than
  a last one's. The custom kernel is then never alone (``min_kernel_ops = 2``): by the rule below it holds
  fewer operators than the program has, and a kernel alone would have to compute every one of them. A program
  of more than eight operators fits no such pair (seven block operators and one pre-defined one compute eight
  once each). Where its form is not in the space either (it adds or subtracts operands with different constant
  factors, :func:`mixes_factors`), the operators such an ``add`` or ``sub`` depends on are its own pre-defined
  operators and the rest is searched as a program of its own over their results (:attr:`DerivedLimits.split`,
  :mod:`~gensorage.exhaustive.chain_split`, a restriction: LayerNorm's mean subtraction ``X − (Σ X)/n`` is its
  own ``sum``, ``scale`` and ``sub``, and the rest an RMSNorm + matmul over ``C = X − mean X``); the limits are
  then the rest's. Where that split does not apply (a chain result is an output), it gets ``n − 7`` pre-defined
  operators before the custom kernel (``min_kernel_ops = max_kernel_ops = n − 6``), each one the program applies
  (``own_predefined_only``, a restriction, which lets a ``sub`` read a scale's result as the program's does).
* **block operators from the program's op count**: a fused kernel computes each program operator once, so it
  needs about as many compute operators as the program has (partial sums of a split reduction are for-loop
  accumulators, which do not count). ``max_block_ops`` is the program's operator count, at least
  :data:`MIN_BLOCK_OPS` and at most :data:`MAX_BLOCK_OPS` (Mirage's ``MAX_NUM_THREADBLOCK_GRAPH_OP``, 7): an
  RMSNorm + MatMul (7 operators without epsilon, 8 with) gets 7, two chained matmuls get 2.
* **grid dims from the program's ranks**: a block graph's output saver maps grid dims injectively to output
  dims, so a grid has at most as many dims as the tensors it writes; ``max_grid_dims`` is the largest rank
  among the program's tensors (at most 3).
* **fused kernels first** (``fused_first``): the tasks whose first graph-defined kernel reads every program
  input (directly or through the pre-defined operator before it) run first, with a for-loop first, so a search
  stopped early has looked where Mirage's fused kernels are.
* **block inputs**: at most three (Mirage's ``max_num_threadblock_graph_inputs``), and no more than the program
  has inputs plus one (the pre-defined operator's result).
* **the program's softmax form** (``sub_stabilises_only``, ``exp_stabilised_only``, ``loop_concats = false``):
  where every ``sub`` and ``exp`` of the program is a stable softmax's
  (:func:`~gensorage.exhaustive.opcatalog.stable_softmax_only`), the space keeps the forms a fused softmax takes,
  the row-fused one and the online one (a loop that reduces). These three are restrictions of the space, the
  split-KV presets', not limits (docs/search.md says which µGraphs they drop); with the first a ``sub`` changes
  no index-tie class, so the tie rule prunes the search.

These are limits (and the four restrictions), not pruning: they choose the space, which the search then covers completely (docs/search.md,
"What Theorem 1 still guarantees"). A preset's ``[search]`` table, or limits given to the spec, replace them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gensorage.exhaustive.chain_split import ChainSplit, chain_split, mixing_nodes
from gensorage.exhaustive.opcatalog import stable_softmax_only
from gensorage.program import Program

#: Mirage's ``MAX_NUM_THREADBLOCK_GRAPH_OP`` (outputs not counted): the most block operators derived.
MAX_BLOCK_OPS = 7
#: The fewest derived (a one-operator program still gets room for a split reduction's partial sum).
MIN_BLOCK_OPS = 2
#: Mirage's ``max_num_threadblock_graphs``.
BLOCK_GRAPHS = 1
KERNEL_OPS = 2
MAX_BLOCK_INPUTS = 3
MAX_BLOCK_OUTPUTS = 2


@dataclass(frozen=True, slots=True)
class DerivedLimits:
    """The limits :func:`derive_limits` chose (SearchSpec field -> value) and a line saying why; with ``split``,
    the search is of ``split.rest`` under ``limits``, its candidates joined behind ``split``'s chain
    (:func:`~gensorage.exhaustive.chain_split.spliced_candidates`)."""

    limits: dict[str, Any]
    note: str
    split: ChainSplit | None = None


def derive_limits(program: Program) -> DerivedLimits:
    """SearchSpec limits for ``program`` (see the module docstring)."""
    n_ops = sum(1 for n in program.nodes if n.op is not None)
    if n_ops > MAX_BLOCK_OPS + 1 and (split := chain_split(program)) is not None:
        # Its form is outside the space and no pair fits it: its own chain, then the rest as a program of its own.
        rest = derive_limits(split.rest)
        chain = ", ".join(split.chain_ops)
        note = (
            f"search limits derived from the program ({n_ops} operators): its own pre-defined {chain}, then the "
            f"rest searched as a program of its own over their results; for the rest, " + rest.note
        )
        return DerivedLimits(rest.limits, note, split)
    rank = max((len(n.shape) for n in program.nodes), default=1)
    limits: dict[str, Any] = {
        "max_kernel_ops": 1 if n_ops <= MAX_BLOCK_OPS else KERNEL_OPS,
        "max_block_graphs": BLOCK_GRAPHS,
        "max_block_ops": max(MIN_BLOCK_OPS, min(MAX_BLOCK_OPS, n_ops)),
        "max_block_inputs": max(1, min(MAX_BLOCK_INPUTS, len(program.inputs) + 1)),
        "max_block_outputs": MAX_BLOCK_OUTPUTS,
        "max_grid_dims": max(1, min(3, rank)),
        "fused_first": True,
    }
    if stable_softmax_only(program):
        # Restrictions of the space to the program's own form of softmax (docs/search.md); with them a sub
        # changes no index-tie class, so the tie rule prunes this search too.
        limits["sub_stabilises_only"] = True
        limits["exp_stabilised_only"] = True
        limits["loop_concats"] = False
    if n_ops > MAX_BLOCK_OPS:
        limits["graph_defined_last"] = True
        limits["min_kernel_ops"] = KERNEL_OPS
    if n_ops > MAX_BLOCK_OPS + 1 and mixes_factors(program):
        # One pre-defined operator and a full block graph compute each operator once for at most eight, and the
        # program's form (x − c·y) is not in the space: the other operators come before the custom kernel, each
        # a pre-defined operator of the program's own (a restriction), which may read a scale's result.
        limits["max_kernel_ops"] = limits["min_kernel_ops"] = n_ops - MAX_BLOCK_OPS + 1
        limits["own_predefined_only"] = True
    k = limits["max_kernel_ops"]
    kernels = (
        "one graph-defined kernel"
        if k == 1
        else "a pre-defined operator, then one graph-defined kernel"
        if k == KERNEL_OPS
        else f"{k - 1} pre-defined operators, each one the program applies, then one graph-defined kernel"
    )
    note = (
        f"search limits derived from the program ({n_ops} operators, rank {rank}): {kernels} of up to "
        f"{limits['max_block_ops']} block operators, {limits['max_block_inputs']} inputs, "
        f"{limits['max_block_outputs']} outputs and {limits['max_grid_dims']} grid dims"
        + ("; subs and exps only in the stable softmax form" if "sub_stabilises_only" in limits else "")
    )
    return DerivedLimits(limits, note)


def mixes_factors(program: Program) -> bool:
    """Whether an ``add`` or ``sub`` of ``program`` adds operands that carry different constant factors
    (:func:`~gensorage.exhaustive.chain_split.mixing_nodes`): ``X − (Σ X)/n``. The space's placement of
    constants never generates one (a scale's result is read by a non-linear unary operator or a maximum only,
    docs/search.md, "Restrictions of the space"); a stable softmax's ``c·S − max(c·S)`` carries ``c`` on both
    sides and is searched as ``c·(S − max S)``."""
    return bool(mixing_nodes(program))


__all__ = [
    "BLOCK_GRAPHS",
    "MAX_BLOCK_OPS",
    "MIN_BLOCK_OPS",
    "DerivedLimits",
    "derive_limits",
    "mixes_factors",
]

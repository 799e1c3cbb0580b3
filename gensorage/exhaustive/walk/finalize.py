"""From a complete µGraph to a ranked candidate: fusion, verification, numeric sizes, float test, cost.

For every complete kernel graph the walk reaches (its outputs have the program's shapes):

1. (in the walk) optionally, its output expressions must equal the program's under ``A_eq``
   (``SearchSpec.expr_filter``);
2. thread graphs are built by fusion (:mod:`.thread_fusion`);
3. the µGraph is verified against the program with :func:`gensorage.verify.equivalent` (seeded from the spec's
   seed and the µGraph, so every process draws the same trials);
4. with ``schedule="markov"`` its structure (the µGraph with grid and loop sizes left out) is sized by
   construction (:mod:`gensorage.construction.block_sizes`), validated on the GPU profile and verified again; a structure already
   sized in this task is skipped;
5. :func:`gensorage.verify.float_check` rejects numerically unstable candidates;
6. :func:`gensorage.ugraph.cost.predict_ugraph_time` prices it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import TYPE_CHECKING, Any

from gensorage.construction.block_sizes import constructed_sizes, size_options
from gensorage.errors import GensorageError
from gensorage.exhaustive.results import Candidate
from gensorage.exhaustive.walk.thread_fusion import fuse
from gensorage.ugraph.cost import predict_ugraph_time
from gensorage.ugraph.ir import BlockGraph, GraphDefinedOp, KernelGraph
from gensorage.ugraph.validate import validate

if TYPE_CHECKING:
    from gensorage.exhaustive.spec import SearchSpec
    from gensorage.exhaustive.walk.walk import Walk
    from gensorage.program import Program
    from gensorage.verify import EquivalenceResult


def _seed(base: int, g: KernelGraph, salt: str) -> int:
    blob = json.dumps(g.to_json(), sort_keys=True, separators=(",", ":")) + salt + str(base)
    return int.from_bytes(hashlib.sha256(blob.encode()).digest()[:8], "big") >> 1


def structure_key(g: KernelGraph) -> str:
    """The µGraph with every grid size and loop trip count replaced by a marker (sizes-free structure)."""
    doc = g.to_json()
    for op in doc["ops"]:
        if op.get("kind") == "graph":
            op["block"]["grid"] = len(op["block"]["grid"])
            op["block"]["forloop"] = op["block"]["forloop"] > 1
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def _verify(s: Walk, g: KernelGraph, *, count: bool = True) -> EquivalenceResult | None:
    """The equivalence result when ``g`` passes, else None (counted as rejected when ``count``)."""
    from gensorage.verify import equivalent

    try:
        res = equivalent(
            s.spec.program,
            g,
            s.spec.delta,
            seed=_seed(s.spec.seed, g, "eq"),
            max_trials=s.spec.max_trials,
            should_stop=s.may_stop_checks,
        )
    except GensorageError:
        res = None
    if not res:
        s.counters.rejected += int(count)
        return None
    return res


def _summary(res: EquivalenceResult, stable: Any) -> dict[str, Any]:
    """The deterministic part of the checks (no wall times), as JSON."""
    doc = res.to_json()
    doc.pop("elapsed_s", None)
    doc["capped"] = res.capped
    doc["float_check"] = {
        "ok": bool(stable.ok),
        "dtype": stable.dtype,
        "max_rel_error": stable.max_rel_error,
        "reference_rel_error": stable.reference_rel_error,
        "rtol": stable.rtol,
    }
    return doc


def checked(program: Program, g: KernelGraph, spec: SearchSpec) -> dict[str, Any] | None:
    """The checks of a complete µGraph ``g`` against ``program`` as the walk makes them (the equivalence check,
    then the float test, seeded from ``spec``'s seed and ``g``), summarised as a candidate's; None if either
    rejects it. For a µGraph the walk did not make itself (:mod:`gensorage.exhaustive.chain_split`)."""
    from gensorage.verify import equivalent, float_check

    try:
        res = equivalent(program, g, spec.delta, seed=_seed(spec.seed, g, "eq"), max_trials=spec.max_trials)
    except GensorageError:
        return None
    if not res:
        return None
    stable = float_check(program, g, seed=_seed(spec.seed, g, "float"))
    return _summary(res, stable) if stable else None


def _with_block(g: KernelGraph, k: int, grid: tuple[int, ...], forloop: int) -> KernelGraph:
    op = g.ops[k]
    assert isinstance(op, GraphDefinedOp)
    block = BlockGraph(grid, forloop, op.block.nodes)
    ops = g.ops[:k] + (dataclasses.replace(op, block=block),) + g.ops[k + 1 :]
    return KernelGraph(g.inputs, ops, g.outputs, g.precision)


def resize(s: Walk, g: KernelGraph) -> KernelGraph:
    """``g`` with each graph-defined operator's sizes constructed (greedily, in order; invalid options skipped)."""
    for k, op in enumerate(g.ops):
        if not isinstance(op, GraphDefinedOp):
            continue
        info = validate(g)
        args = [info.of(r).shape for r in op.inputs]
        binfo = info.blocks[k]
        assert binfo is not None
        dtype = info.of(op.inputs[0]).dtype
        target = constructed_sizes(
            op.block, args, binfo, dtype, s.context.hw, s.spec.seed, s.context.construct_cache
        )
        if target is None:
            continue
        for grid, forloop in size_options(op.block, args, target):
            if (grid, forloop) == (op.block.grid, op.block.forloop):
                break
            trial = _with_block(g, k, grid, forloop)
            try:
                validate(trial, s.context.hw)
            except GensorageError:
                continue
            g = trial
            break
    return g


def finalize(s: Walk, g: KernelGraph, task_index: int) -> Candidate | None:
    """The candidate ``g`` yields, or None (filtered, rejected, unstable, or a structure already sized)."""
    from gensorage.verify import float_check

    g = fuse(g)
    # A structure already sized in this task gives no further candidate whatever the check says, so it is not
    # checked again (most complete µGraphs of a 7-node search repeat a structure at other probe sizes).
    key = structure_key(g) if s.spec.schedule == "markov" else None
    if key is not None and key in s.sized_structures:
        return None
    res = _verify(s, g)
    if res is None:
        return None
    if key is not None:
        s.sized_structures[key] = None
        sized = resize(s, g)
        if sized != g:
            sized_res = _verify(s, sized, count=False)  # the probe-sized µGraph stays if this fails
            if sized_res is not None:
                g, res = sized, sized_res
    s.counters.verified += 1
    stable = float_check(s.spec.program, g, seed=_seed(s.spec.seed, g, "float"))
    if not stable:
        s.counters.unstable += 1
        return None
    return Candidate(
        ugraph=g,
        predicted_time_s=predict_ugraph_time(g, s.context.hw),
        equivalence=_summary(res, stable),
        found_in_task=task_index,
    )


__all__ = ["checked", "finalize", "resize", "structure_key"]

"""The block cost model's predictions for the bundled fused µGraphs with a for-loop, with the loop's ``cp.async``
tiles in one stage (as before software pipelining) and in the stages the construction chooses
(:mod:`gensorage.construction.pipeline_stages`), model only (no GPU)::

    python benchmarks/pipeline_model.py --hw h200 --out benchmarks/results/pipeline_model-2026-11-27.json
    python benchmarks/pipeline_model.py --hw h200 --totals-only --out before.json   # from the code before
    python benchmarks/pipeline_model.py --hw h200 --before before.json --nvcc --out RESULT.json

``--totals-only`` writes each µGraph's predicted time alone (``predict_ugraph_time``; it runs on the code from
before software pipelining too), and ``--before FILE`` embeds such a file as ``predicted_us_before``. Per µGraph:
the predicted time at one stage and as chosen, and per looped graph-defined kernel its stages, the
shared bytes priced, resident blocks and the rule. With ``--nvcc``, both versions are also compiled for sm_90a
(:func:`gensorage.codegen.cuda_build.ptx_and_resources`): registers and spills of the looped kernels, and the
``cp.async.wait_group`` counts and ``mma.sync`` instructions in their PTX.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from datetime import date
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import machine_info  # noqa: E402
from benchmarks.gpu_prepare import EXTRA_UGRAPHS  # noqa: E402
from gensorage.codegen.ugraph_tir import plan_threads  # noqa: E402
from gensorage.construction.block_threads import ThreadChoice  # noqa: E402
from gensorage.hw import load_profile  # noqa: E402
from gensorage.hw.profile import HwProfile  # noqa: E402
from gensorage.ugraph.block_cost import plan_block  # noqa: E402
from gensorage.ugraph.cost import kernel_costs, predict_ugraph_time  # noqa: E402
from gensorage.ugraph.ir import GraphDefinedOp, KernelGraph  # noqa: E402
from gensorage.ugraph.validate import validate  # noqa: E402

WHAT = (
    "issue 26 item 1: the block cost model's predictions (model only, no GPU) for the bundled fused µGraphs with a "
    "for-loop, with the loop's cp.async tiles in one stage (as before software pipelining) and in the stages the "
    "construction chooses (gensorage.construction.pipeline_stages); block_stage_cycles and block_max_stages are "
    "estimates, unmeasured on a GPU"
)


def looped_kernels(g: KernelGraph) -> list[int]:
    return [k for k, op in enumerate(g.ops) if isinstance(op, GraphDefinedOp) and op.block.forloop > 1]


def predictions(g: KernelGraph, hw: HwProfile, nvcc: bool = False) -> dict[str, Any]:
    """One stage against the chosen stages for µGraph ``g`` on ``hw``."""
    info = validate(g, hw)
    chosen = {k: plan_threads(g, k, info, hw) for k in looped_kernels(g)}
    one: dict[int, ThreadChoice] = {k: dataclasses.replace(c, stages=1) for k, c in chosen.items()}
    kernels = []
    for k, choice in chosen.items():
        plans = {s: plan_block(g, k, info, hw, True, c) for s, c in ((1, one[k]), (choice.stages, choice))}
        kernels.append(
            {
                "op": k,
                "threads": choice.threads,
                "stages": choice.stages,
                "shared_bytes": {str(s): p.shared_bytes for s, p in plans.items()},
                "resident_blocks": {str(s): p.resident for s, p in plans.items()},
                "rule": choice.rule,
            }
        )
    before = sum(c.time_s for c in kernel_costs(g, hw, plans=one))
    after = sum(c.time_s for c in kernel_costs(g, hw))
    out = {"predicted_us_one_stage": before * 1e6, "predicted_us_chosen": after * 1e6, "kernels": kernels}
    if nvcc:
        out["nvcc_sm_90a"] = {"one_stage": _built(g, hw, one), "chosen": _built(g, hw, dict(chosen))}
    return out


def _built(g: KernelGraph, hw: HwProfile, plans: dict[int, ThreadChoice]) -> dict[str, Any]:
    """Registers, spills, waits and MMAs of the looped kernels as nvcc builds them for sm_90a."""
    from gensorage.codegen.cuda_build import ptx_and_resources
    from gensorage.codegen.module import compile_ugraph

    cg = compile_ugraph(g, hw, "cuda", plans=plans)
    built = ptx_and_resources(cg.cuda_source(), "sm_90a")
    assert built is not None
    ptx, resources = built
    parts = re.split(r"\.visible \.entry (\w+)\(", ptx)
    entries = dict(zip(parts[1::2], parts[2::2], strict=True))
    found = {}
    for k in plans:
        name, res = next((n, r) for n, r in resources.items() if n.startswith(f"kernel{k}_"))
        body = entries[name]
        found[name] = {
            "registers": res.registers,
            "spill_stores": res.spill_stores,
            "spill_loads": res.spill_loads,
            "wait_group": {
                n: body.count(f"cp.async.wait_group {n};") for n in range(3) if f"wait_group {n};" in body
            },
            "mma_sync": body.count("mma.sync.aligned"),
        }
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hw", default="h200")
    ap.add_argument("--out", default=None, help="result JSON")
    ap.add_argument("--totals-only", action="store_true", help="each µGraph's predicted time alone")
    ap.add_argument("--before", default=None, help="a --totals-only file from the code before, embedded")
    ap.add_argument("--nvcc", action="store_true", help="also build both versions for sm_90a (nvcc)")
    ap.add_argument(
        "--names", nargs="*", default=None, help="EXTRA_UGRAPHS names (default: every looped one)"
    )
    args = ap.parse_args(argv)
    hw = load_profile(args.hw)
    results: dict[str, Any] = {}
    before = json.loads(Path(args.before).read_text())["predicted_us"] if args.before else {}
    for name in args.names or sorted(EXTRA_UGRAPHS):
        _, g = EXTRA_UGRAPHS[name]()
        if not looped_kernels(g):
            continue
        if args.totals_only:
            results[name] = predict_ugraph_time(g, hw) * 1e6
            print(f"{name:32s} {results[name]:9.1f} us", flush=True)
            continue
        results[name] = predictions(g, hw, args.nvcc)
        r = results[name]
        if name in before:
            r["predicted_us_before"] = before[name]
        stages = [k["stages"] for k in r["kernels"]]
        print(
            f"{name:32s} {r['predicted_us_one_stage']:9.1f} -> {r['predicted_us_chosen']:9.1f} us  stages {stages}",
            flush=True,
        )
    if args.out and args.totals_only:
        Path(args.out).write_text(
            json.dumps({"hw_profile": args.hw, "predicted_us": results}, indent=1) + "\n"
        )
    elif args.out:
        meta = {"what": WHAT, "date": str(date.today()), "hw_profile": args.hw, "machine": machine_info()}
        Path(args.out).write_text(json.dumps({**meta, "programs": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

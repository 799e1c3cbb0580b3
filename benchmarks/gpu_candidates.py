"""Full mode's candidates, bundled for the device (``gpu_suite.py --prepare DIR --candidates N``).

Per program, full mode (:func:`gensorage.superoptimize`, ``mode="full"``) runs here within ``--search-budget``
seconds, with no store and no GPU, so it chooses by the cost model. Its top ``N`` candidates by the model (at
the program's shapes), the one it chose and the direct µGraph are bundled as cases
``program_<name>_c<rank>`` (``_direct`` for the direct µGraph; none predicted over :data:`MAX_SLOWDOWN` times
the direct µGraph's time), each recording under ``candidate`` its origin, its
rank among all of full mode's candidates, its predicted time and whether full mode chose it. The runner's
summary (:func:`candidate_lines`) then says, per program, whether full mode's choice was the fastest measured. A
candidate the CUDA build refuses is skipped (for the next in rank) and its µGraph written to
``DIR/program_<name>_c<rank>.failed.json`` with the error.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the device's runner imports this module, and nothing of gensorage (no TVM there)
    from gensorage.hw.profile import HwProfile


#: A candidate predicted this many times slower than the direct µGraph is not bundled (unless chosen): one
#: such kernel (a grid of a few blocks) can take seconds a run, and the device's time is short.
MAX_SLOWDOWN = 20.0


def candidate_cases(
    name: str, hw: HwProfile, out: Path, top: int, budget_s: float, precision: str
) -> list[dict[str, Any]]:
    """The bundled cases of program ``name``'s full-mode candidates (see the module docstring)."""
    from benchmarks import gpu_prepare
    from gensorage import superoptimize
    from gensorage.superopt.row_fusion import FUSED_ORIGINS, FUSED_ROWS

    program = gpu_prepare.load_program(name)
    res = superoptimize(
        program,
        hw,
        mode="full",
        time_budget_s=budget_s,
        use_store=False,
        progress=False,
        precision=precision,
    )
    ranked = list(res.candidates)
    direct_s = next(t for o, _, t in ranked if o == "direct")
    cases: list[dict[str, Any]] = []
    searched = 0
    for rank, (origin, g, predicted) in enumerate(ranked):
        # The top N that the generator builds (a candidate it cannot build is skipped for the next), and
        # full mode's choice and the direct µGraph wherever they rank.
        hopeless = predicted > MAX_SLOWDOWN * direct_s  # seconds of device time for nothing
        baseline = origin == "direct" or origin in FUSED_ORIGINS  # one kernel per op, and its row-fused forms
        wanted = (not baseline and searched < top and not hopeless) or baseline or origin == res.origin
        if not wanted:
            continue
        label = ("rows" if origin == FUSED_ROWS else origin) if baseline else f"c{rank}"  # a file name
        try:
            case = gpu_prepare.program_case(f"{name}_{label}", program, hw, out, precision, g)
        except Exception as exc:  # one candidate the generator cannot build: the others still go, and its
            # µGraph is kept beside the bundle to reproduce the failure (KernelGraph.from_json)
            failed = out / f"program_{name}_{label}.failed.json"
            failed.write_text(json.dumps({"error": f"{type(exc).__name__}: {exc}", "ugraph": g.to_json()}))
            print(
                f"program {name} {origin}: not bundled ({failed}): {type(exc).__name__}: {exc}",
                file=sys.stderr,
            )
            continue
        searched += not baseline
        # The device loads the program itself (its config), not one named after the candidate.
        case["program"] = {"path": gpu_prepare.program_path(name, program, out), "params": {}}
        case["candidate"] = {
            "program": name,
            "origin": origin,
            "rank": rank,
            "candidates": len(ranked),
            "predicted_s": predicted,
            "chosen": origin == res.origin,
            "search": {"budget_s": budget_s, "stopped_by": res.stopped_by, "complete": res.complete},
        }
        cases.append(case)
    return cases


def candidate_lines(cases: list[dict[str, Any]]) -> list[str]:
    """Per program with measured candidates: full mode's choice, the fastest measured, and whether they agree."""
    by_program: dict[str, list[dict[str, Any]]] = {}
    failed: dict[str, str] = {}  # program -> how its choice failed (a wrong kernel is the worst outcome)
    for c in cases:
        cand = c.get("candidate")
        ours = (c.get("methods") or {}).get("ours", {})
        if cand and "median_s" in ours:
            by_program.setdefault(cand["program"], []).append(c)
        elif cand and cand["chosen"] and c.get("status") == "failed":
            errs = ours.get("rel_err") or []
            failed[cand["program"]] = (
                f"failed its float64 check (rel err {max(errs, default=float('nan')):.1e})"
            )
    lines = []
    agree = 0
    for program, group in by_program.items():
        group.sort(key=lambda c: c["methods"]["ours"]["median_s"])
        fastest = group[0]
        chosen = next((c for c in group if c["candidate"]["chosen"]), None)
        by_model = min(group, key=lambda c: c["candidate"]["predicted_s"])
        ok = chosen is fastest
        agree += ok
        us = fastest["methods"]["ours"]["median_s"] * 1e6
        what = (
            f"{failed.get(program, 'a µGraph not measured (not bundled: see the bundle’s *.failed.json; or not run)')}"
            if chosen is None
            else f"{chosen['candidate']['origin']} {chosen['methods']['ours']['median_s'] * 1e6:.1f} us"
        )
        lines.append(
            f"{program:<28} full mode chose {what}; fastest measured {fastest['candidate']['origin']} {us:.1f} us"
            f" of {len(group)}; model's best of those {by_model['candidate']['origin']}: "
            + ("choice = fastest" if ok else "choice != fastest")
        )
    if lines:
        lines.append(
            f"full mode's choice is the fastest measured candidate for {agree} of {len(lines)} programs"
        )
    return lines


__all__ = ["candidate_cases", "candidate_lines"]

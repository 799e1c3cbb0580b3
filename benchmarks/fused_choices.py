"""The rule-made options of every bundled program, and full mode's choice among them (no GPU needed).

For each program (``configs/programs/*.gsp`` at its own shapes) and GPU profile: the cost model's price of the
direct µGraph, of the direct µGraph after epilogue then row fusion (option ``"fused"``) and after row fusion alone
(``"fused without epilogues"``), the options :func:`gensorage.superopt.row_fusion.fused_options` offers (a form
whose µGraph equals another's is no option) with their checks, and what ``superoptimize(mode="full")`` chooses
when its search adds nothing: limits under which no µGraph of these programs exists (one kernel op of at most two
block ops), no store, no GPU, so the choice is the cost model's among the direct µGraph and the rule-made options,
each verified and lowered as full mode does.

Then, against the committed GPU runs that measured a program's three forms (cases ``program_X`` (epilogue and
row fusion), ``program_X_rows`` (row fusion alone) and ``program_X_perop`` (direct)), each rebuilt as it was
measured (:func:`benchmarks.calibrate_ugraph.measured_programs`): the model's price of each, the measured
median, the form the model ranks first (ties in the order direct, fused, without epilogues, as
:func:`gensorage.superopt.choice.rank` breaks them), the one it ranks first without the option
``"fused without epilogues"`` (before it existed), and the fastest measured. Writes
``benchmarks/results/fused_choices-<date>.json`` (or ``--out``) with the machine, commit and load.
Usage: ``python -m benchmarks.fused_choices [--hw h200 h100]``
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS_DIR as RESULTS  # noqa: E402
from benchmarks.common import machine_info, progress, result_path, write_json  # noqa: E402
from gensorage.hw import load_profile  # noqa: E402
from gensorage.precision import DEFAULT_PRECISION  # noqa: E402
from gensorage.program import list_configs, load_config  # noqa: E402
from gensorage.superopt import superoptimize  # noqa: E402
from gensorage.superopt.choice import cost_fn  # noqa: E402
from gensorage.superopt.presets import preset_from_dict  # noqa: E402
from gensorage.superopt.row_fusion import FUSED, FUSED_ORIGINS, FUSED_ROWS, fuse_rows  # noqa: E402
from gensorage.ugraph import from_program  # noqa: E402

NAME = "fused_choices"
#: Search limits under which the search finds no µGraph of a bundled program: full mode's choice is then among
#: the direct µGraph and the rule-made options only.
NOTHING = {
    "max_kernel_ops": 1,
    "max_block_ops": 2,
    "max_grid_dims": 1,
    "max_block_inputs": 2,
    "max_block_outputs": 1,
}


def choices(name: str, hw_name: str, budget_s: float) -> dict[str, Any]:
    hw = load_profile(hw_name)
    cost = cost_fn(hw)
    p = load_config(name)
    direct = from_program(p, DEFAULT_PRECISION)
    predicted = {"direct": cost(direct)}
    graphs = {"direct": direct}
    for origin, epilogues in FUSED_ORIGINS.items():
        graphs[origin] = fuse_rows(direct, hw, epilogues)
        predicted[origin] = cost(graphs[origin])
    same = {o: [q for q in graphs if q != o and graphs[q] == graphs[o]] for o in graphs}
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        r = superoptimize(
            p,
            hw=hw,
            mode="full",
            preset=preset_from_dict({"search": NOTHING}, name="nothing"),
            time_budget_s=budget_s,
            workers=1,
            use_store=False,
            checkpoint=Path(d) / "c.sqlite",
            progress=False,
        )
        wall = time.perf_counter() - t0
    return {
        "program": name,
        "hw": hw_name,
        "params": dict(p.params),
        "predicted_us": {o: round(t * 1e6, 3) for o, t in predicted.items()},
        "same_graph_as": {o: q for o, q in same.items() if q},
        "candidates": [(o, round(t * 1e6, 3)) for o, _, t in r.candidates],
        "chosen": r.origin,
        "chosen_predicted_us": round(r.predicted_time_s * 1e6, 3),
        "fastest_predicted": min(predicted, key=lambda o: predicted[o]),
        "equivalence": r.equivalence.method,
        "verified": bool(r.equivalence),
        "search_complete": r.complete,
        "notes": list(r.notes),
        "wall_s": round(wall, 2),
    }


#: The committed runs with the three forms of a program measured side by side (H200, session 11).
MEASURED = [
    RESULTS / f"gpu_suite-h200-session11{part}-2026-11-27.json" for part in ("", "-attention", "-narrowed")
]
#: A measured case's suffix -> the option it ran.
FORMS = {"_perop": "direct", "": FUSED, "_rows": FUSED_ROWS}


def measured_choices(paths: list[Path]) -> list[dict[str, Any]]:
    """Per program with all three forms measured in one run: predicted (as measured) and measured times."""
    from benchmarks.calibrate_ugraph import measured_programs, predict

    cases = {(m.source, m.name): m for m in measured_programs(paths)}
    out = []
    for source, name in sorted(cases):
        forms = {o: cases.get((source, name + suffix)) for suffix, o in FORMS.items()}
        if name.endswith(tuple(s for s in FORMS if s)) or any(m is None for m in forms.values()):
            continue
        ms = {o: m for o, m in forms.items() if m is not None}
        hw = load_profile(next(iter(ms.values())).hw)
        predicted = {o: predict(m, hw) for o, m in ms.items()}
        measured = {o: m.measured_s for o, m in ms.items()}
        chosen = min(predicted, key=lambda o: predicted[o])  # dict order: FORMS', rank's tie order
        before = min((o for o in predicted if o != FUSED_ROWS), key=lambda o: predicted[o])
        out.append(
            {
                "case": name,
                "source": source,
                "hw": hw.name,
                "predicted_us": {o: round(t * 1e6, 1) for o, t in predicted.items()},
                "measured_us": {o: round(t * 1e6, 1) for o, t in measured.items()},
                "model_choice": chosen,
                "fastest_measured": min(measured, key=lambda o: measured[o]),
                "choice_over_fastest": round(measured[chosen] / min(measured.values()), 3),
                "choice_without_the_option": before,
                "that_over_fastest": round(measured[before] / min(measured.values()), 3),
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hw", nargs="*", default=["h200", "h100"])
    ap.add_argument("--programs", nargs="*", default=[c.stem for c in list_configs()])
    ap.add_argument("--budget-s", type=float, default=60.0, help="full mode's search budget per program")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    load_before = os.getloadavg()
    runs = []
    for hw_name in args.hw:
        for name in args.programs:
            runs.append(choices(name, hw_name, args.budget_s))
            progress(f"{hw_name} {name}: {runs[-1]['predicted_us']} -> {runs[-1]['chosen']}")
    data = {
        "benchmark": NAME,
        "machine": machine_info(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "precision": DEFAULT_PRECISION,
        "runs": runs,
        "measured": measured_choices(MEASURED),
    }
    out = args.out or result_path(NAME)
    write_json(out, data)
    progress(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

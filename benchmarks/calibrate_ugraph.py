"""Calibrate the µGraph cost model's graph-defined kernels on measured programs, and report how well the model
predicts every measured program (direct µGraphs and fused ones, each on its own device's profile).

Reads GPU-suite results (``benchmarks/results/gpu_suite-*.json``): every program case that passed its check is
rebuilt as it was bundled (:func:`rebuild`: a fused µGraph, a program's direct or row-fused µGraph, full mode's
search candidates from :data:`CANDIDATES`, under the case's precision, its tensors in the dtypes the run stored
them in: :func:`as_measured`) and priced by :func:`gensorage.ugraph.cost.kernel_costs` on the profile the bundle
was prepared for;
a case whose kernels ran their block matmuls on CUDA cores (no "on tensor cores" in its rules: runs before
tensor-core block graphs) is priced that way. A grid search over the profile's ``block_*`` calibration
constants (:class:`gensorage.hw.profile.Calibration`; the GEMM ones stay), after ``predefined_dram_fraction``
on the direct µGraphs (mean |log error|: their element-wise kernels) and ``convert_flight_bytes`` on those with
a converting matmul (fewest misordered pairs of one program, :func:`misordered`; alone with
``--no-block-fit``), minimises the largest |log(predicted /
measured)| over the fused kernels of every file, then the mean (one set of constants for every profile given:
with a handful of kernels and four constants, the worst case keeps one kernel from being sacrificed to the
others)::

    python benchmarks/calibrate_ugraph.py benchmarks/results/gpu_suite-h200-fused-mma-2026-11-26.json \\
        benchmarks/results/gpu_suite-h100-final-2026-11-26.json \\
        benchmarks/results/gpu_suite-h100-stable-attention-2026-11-26.json

A later file's measurement of the same case on the same profile replaces an earlier one.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import re
import statistics
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.calibrate_tensor_core import spearman  # noqa: E402
from gensorage.construction.block_threads import ThreadChoice  # noqa: E402
from gensorage.hw import load_profile  # noqa: E402
from gensorage.hw.profile import HwProfile  # noqa: E402
from gensorage.precision import DEFAULT_PRECISION  # noqa: E402
from gensorage.superopt.row_fusion import FUSED, FUSED_ROWS  # noqa: E402
from gensorage.ugraph import KernelGraph  # noqa: E402
from gensorage.ugraph.shapes import GraphInfo  # noqa: E402

GRID = {
    "block_load_flight_bytes": [4.0, 8.0, 16.0, 32.0, 64.0],
    "block_barrier_cycles": [25.0, 50.0, 100.0, 200.0, 400.0],
    "block_mma_cycles": [16.0, 32.0, 64.0, 128.0],
    "block_element_cycles": [1.0, 2.0, 4.0, 8.0],
}
#: Fitted first, on the direct µGraphs (their element-wise kernels); the block constants then on the fused ones.
DIRECT_GRID = {"predefined_dram_fraction": [0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]}
#: Fitted second, on the cases with a converting tensor-core matmul (:func:`converting`).
CONVERT_GRID = {"convert_flight_bytes": [32.0, 48.0, 64.0, 80.0, 96.0, 128.0, 192.0, 256.0]}
#: Runs measured before tiles were loaded with cp.async and fragments with ldmatrix (16-byte runs,
#: ``ThreadChoice.runs``): their kernels are priced element by element.
BEFORE_RUNS = frozenset(
    f"gpu_suite-{name}-2026-11-26.json"
    for name in (
        "h100-final",
        "h100-stable-attention",
        "h200-fused-mma",
        "h200-fused-syncs",
        "h200-mma-warps",
    )
)
PRECISIONS = ("storage",)  # suffixes program_case adds to a case's name (besides the default precision)


@dataclasses.dataclass(frozen=True)
class Measured:
    """One measured program case, rebuilt."""

    name: str
    hw: str
    ugraph: KernelGraph
    fused: bool  # a fused µGraph (EXTRA_UGRAPHS), not the program's direct one
    block_mma: bool  # its block matmuls ran on tensor cores
    measured_s: float
    source: str
    plans: dict[int, ThreadChoice] | None = None  # the thread plans measured, read from the case's rules
    info: GraphInfo | None = None  # its tensors as the run stored them (:func:`as_measured`)
    program: str = ""  # the program it computes (its µGraphs in one run are ordered: :func:`misordered`)


def _split_precision(name: str) -> tuple[str, str]:
    for p in PRECISIONS:
        if name.endswith(f"_{p}"):
            return name.removesuffix(f"_{p}"), p
    return name, DEFAULT_PRECISION


_VARIANT = re.compile(r"_w(\d+(?:t\d+)?e?)$")  # gpu_prepare's --block-mma-warps variants
_THREADS = re.compile(r"(\d+) threads")
_WARPS = re.compile(r"block matmul #(\d+) on tensor cores \([^)]*\): (\d+)(?: of \d+)? warps?")
_STAGES = re.compile(r"cp\.async loop tiles in (\d+) stages")  # the construction's (pipeline_stages)
_STAGES_VARIANT = re.compile(r"_st(\d+)$")  # gpu_prepare's --block-stages variants
_ROW_THREADS = re.compile(r"_rt\d+$")  # gpu_prepare's row-thread variants (the rules say the threads)


def _split_variant(name: str) -> tuple[str, str | None]:
    """(the case's name without its warp variant, the variant) (``gpu_prepare.program_case``'s ``_w...``)."""
    m = _VARIANT.search(name)
    return (name, None) if m is None else (name[: m.start()], m.group(1))


def measured_plans(
    g: KernelGraph, rules: list[str], variant: str | None, runs: bool, stages: int | None = None
) -> dict[int, ThreadChoice] | None:
    """The thread plans a fused case ran, read back from its kernels' rules (one per op, in order): the
    threads, and each tensor-core block matmul's warps; loads in 16-byte runs when ``runs`` (and the variant
    does not end in ``e``); the loop's stages the variant forced (``stages``), else those the rule names, else 1
    (every run before software pipelining). None when the rules do not line up with the ops (the model's own
    plans are priced then)."""
    from gensorage.construction.block_threads import ThreadChoice
    from gensorage.ugraph.ir import GraphDefinedOp

    if len(rules) != len(g.ops):
        return None
    plans = {}
    for k, (op, rule) in enumerate(zip(g.ops, rules, strict=True)):
        threads = _THREADS.search(rule)
        if not isinstance(op, GraphDefinedOp) or threads is None:
            continue
        warps = tuple((int(j), int(w)) for j, w in _WARPS.findall(rule))
        runs_here = runs and (variant is None or not variant.endswith("e"))
        named = _STAGES.search(rule)
        staged = stages if stages is not None else int(named.group(1)) if named else 1
        plans[k] = ThreadChoice(int(threads.group(1)), None, None, "as measured", warps, runs_here, staged)
    return plans


def rebuild(name: str, precision: str, form: str | None = None) -> tuple[KernelGraph, bool]:
    """The µGraph ``gpu_suite --prepare`` bundles under ``name`` and ``precision``, and whether it has
    graph-defined kernels: without ``form``, the fused µGraph bundled under ``name``, else the program's direct
    µGraph; with one, that of program ``name`` (a fused µGraph's program, for full mode's candidates): its
    direct µGraph (``"direct"``), that after epilogue and row fusion (``"row-fused"``, what a program's plain
    case runs since row fusion) or after row fusion alone (``"rows"``), or one of full mode's search candidates
    (``"search #N"``: :data:`CANDIDATES`)."""
    from benchmarks import gpu_prepare
    from gensorage.hw import load_profile
    from gensorage.superopt.row_fusion import fuse_rows as fuse_epilogues_and_rows
    from gensorage.ugraph import from_program
    from gensorage.ugraph.optimize.fuse_rows import fuse_rows

    fused = gpu_prepare.load_ugraph(name) if form is None else None
    if fused is not None:
        return dataclasses.replace(fused, precision=precision), True
    if form is not None and form.startswith("search"):
        found = json.loads(CANDIDATES.read_text())["programs"].get(name, {}).get(form)
        if found is None:
            raise KeyError(f"{name}: no {form} in {CANDIDATES.name}")
        return dataclasses.replace(KernelGraph.from_json(found), precision=precision), True
    direct = from_program(gpu_prepare.load_program(name), precision)
    if form in (None, "direct"):
        return direct, False
    hw = load_profile("h200")  # row fusion reads the profile's thread limits only (as the bundle's did)
    return (fuse_epilogues_and_rows if form == "row-fused" else fuse_rows)(direct, hw), True


#: Full mode's search candidates of the candidates runs (``gpu_suite --candidates``), which record each
#: candidate's origin but not its µGraph: the same searches run again (:func:`save_candidates`), each µGraph
#: kept where its predicted time under the bundle's model equals the bundle's (the same µGraph).
CANDIDATES = Path(__file__).resolve().parent / "results" / "candidates-ugraphs-session11-2026-11-28.json"

#: When the precision policy began to store a row-fused softmax's probabilities (a thread graph's division of
#: exp by its row sum) in the program's dtype (commit ef22a10): runs prepared before stored them in float32.
BLOCK_RANGES_SINCE = "2026-11-28T07:58:57+00:00"
#: µGraphs whose dtypes changed since their runs (commit 753c8b0: a norm's normalised value in the program's
#: dtype, and the products after it; fused_qknorm's normalised q and k tiles, so its q·kᵀ runs on tensor
#: cores), which :func:`as_measured` does not restore: their direct µGraphs and the fused one are not rebuilt.
NORM_RANGE_SINCE = (
    "2026-11-28T08:19:55+00:00",
    frozenset({"qknorm", "llama3_norm_projection", "fused_qknorm"}),
)
#: Of those, programs none of whose forms is rebuilt as measured (llama3_norm_projection's bfloat16 norm was
#: narrowed for its matmul before 753c8b0, which :func:`as_measured` does not redo).
NOT_REBUILT = frozenset({"llama3_norm_projection"})


def save_candidates(programs: list[str], budget_s: float, path: Path = CANDIDATES) -> dict[str, Any]:
    """Full mode's search candidates of ``programs`` on the H200 profile (as ``gpu_suite --candidates`` runs
    it: no store, the default precision), their µGraphs by origin, written to ``path`` with the machine."""
    from benchmarks.common import machine_info, write_json
    from benchmarks.gpu_prepare import load_program
    from gensorage import superoptimize

    doc: dict[str, Any] = {
        "benchmark": "calibrate_ugraph --save-candidates",
        "machine": machine_info(),
        "budget_s": budget_s,
        "programs": {},
        "predicted_s": {},
    }
    for name in programs:
        res = superoptimize(
            load_program(name),
            load_profile("h200"),
            mode="full",
            time_budget_s=budget_s,
            use_store=False,
            progress=False,
            precision=DEFAULT_PRECISION,
        )
        found = [(o, g, t) for o, g, t in res.candidates if o.startswith("search")]
        doc["programs"][name] = {o: g.to_json() for o, g, _ in found}
        doc["predicted_s"][name] = {o: t for o, _, t in found}
    write_json(path, doc)
    return doc


def as_measured(g: KernelGraph, prepared: str) -> GraphInfo:
    """``g``'s tensors in the dtypes the run prepared at ``prepared`` stored them in: before
    :data:`BLOCK_RANGES_SINCE`, a graph-defined kernel's output that a thread graph's ``exp`` or division
    computes (not a program output) was stored in float32, so its readers read float32."""
    from gensorage.precision import FLOAT32_OPS
    from gensorage.ugraph.ir import GraphDefinedOp, OutputSaver, Ref, ThreadGraph
    from gensorage.ugraph.validate import validate

    info = validate(g)
    if prepared >= BLOCK_RANGES_SINCE:
        return info
    nodes, blocks = list(info.nodes), list(info.blocks)
    for k, op in enumerate(g.ops):
        if not isinstance(op, GraphDefinedOp):
            continue
        savers = [n for n in op.block.nodes if isinstance(n, OutputSaver)]
        widen = []
        for i, saver in enumerate(savers):
            src = op.block.nodes[saver.input.node]
            local = (
                src.outputs[saver.input.out].node - len(src.inputs) if isinstance(src, ThreadGraph) else -1
            )
            last = src.ops[local].op if isinstance(src, ThreadGraph) and local >= 0 else None
            if last in FLOAT32_OPS and Ref(len(g.inputs) + k, i) not in g.outputs:
                widen.append(i)
        if widen:
            n = len(g.inputs) + k
            nodes[n] = tuple(t.stored_as("float32") if i in widen else t for i, t in enumerate(nodes[n]))
            b = blocks[k]
            assert b is not None
            outs = tuple(t.stored_as("float32") if i in widen else t for i, t in enumerate(b.outputs))
            blocks[k] = dataclasses.replace(b, outputs=outs)
    return dataclasses.replace(info, nodes=tuple(nodes), blocks=tuple(blocks))


def measured_programs(paths: list[Path]) -> list[Measured]:
    """Every program case that passed its check, rebuilt (a later file replaces an earlier one's case)."""
    from benchmarks import gpu_prepare

    seen: dict[tuple[str, str], Measured] = {}
    for path in paths:
        data = json.loads(path.read_text())
        # Since row fusion a program's plain case is its row-fused µGraph ("_rows": row fusion without the
        # matmul epilogues), "_perop" the direct one.
        row_fused = {c["name"].removesuffix("_perop") for c in data["cases"] if c["name"].endswith("_perop")}
        hw = (data.get("prepared") or {}).get("hw", "h100")
        prepared = str((data.get("prepared") or {}).get("date", ""))
        for case in data["cases"]:
            ours = (case.get("methods") or {}).get("ours", {})
            if case.get("kind") != "program" or case.get("status") != "ok" or "median_s" not in ours:
                continue
            name, form = _form(case, row_fused)
            staged = _STAGES_VARIANT.search(name)
            stages = None if staged is None else int(staged.group(1))
            named, variant = _split_variant(name if staged is None else name[: staged.start()])
            base, precision = _split_precision(named)
            changed = base in NORM_RANGE_SINCE[1] and (form in (None, "direct") or base in NOT_REBUILT)
            if prepared < NORM_RANGE_SINCE[0] and changed:
                print(f"{case['name']}: not rebuilt: its dtypes changed since the run", file=sys.stderr)
                continue
            try:
                g, fused = rebuild(gpu_prepare.measured_as(base, prepared), precision, form)
            except Exception as exc:  # a program no longer bundled: reported, the others still count
                print(f"{case['name']}: not rebuilt: {type(exc).__name__}: {exc}", file=sys.stderr)
                continue
            rules = (case.get("meta") or {}).get("rules", [])
            mma = any("on tensor cores" in r for r in rules) or not fused
            plans = measured_plans(g, rules, variant, path.name not in BEFORE_RUNS, stages) if fused else None
            seen[(hw, case["name"])] = Measured(
                case["name"],
                hw,
                g,
                fused,
                mma,
                float(ours["median_s"]),
                path.name,
                plans,
                as_measured(g, prepared),
                base,
            )
    return list(seen.values())


def _form(case: dict[str, Any], row_fused: set[str]) -> tuple[str, str | None]:
    """(the case's name without prefix and form suffix, the µGraph form it measured: :func:`rebuild`; None:
    the bundled fused µGraph of that name, else the direct µGraph)."""
    name = _ROW_THREADS.sub("", case["name"])
    cand = case.get("candidate")
    # full mode's candidates: "_direct", "_fused" and "_rows" (the row-fused direct µGraphs), "_c<rank>"
    if cand:
        origin = cand["origin"]
        form = {FUSED: "row-fused", FUSED_ROWS: "rows"}.get(origin, origin)
        return cand["program"], form
    if name in row_fused:
        return name.removeprefix("program_"), "row-fused"
    if name.endswith("_rows") and name.removesuffix("_rows") in row_fused:
        return name.removeprefix("program_").removesuffix("_rows"), "rows"
    return name.removeprefix("program_").removesuffix("_perop"), None


def predict(m: Measured, hw: HwProfile) -> float:
    from gensorage.ugraph.cost import kernel_costs

    return sum(c.time_s for c in kernel_costs(m.ugraph, hw, m.info, block_mma=m.block_mma, plans=m.plans))


def score(cases: list[Measured], profiles: dict[str, HwProfile]) -> dict[str, Any]:
    """Median and mean |log(predicted / measured)|, the median error factor and Spearman, over ``cases``."""
    pred = [predict(m, profiles[m.hw]) for m in cases]
    meas = [m.measured_s for m in cases]
    errs = [abs(math.log(p / t)) for p, t in zip(pred, meas, strict=True)]
    if not errs:
        return {"kernels": 0}
    return {
        "kernels": len(errs),
        "mean_abs_log_error": statistics.fmean(errs),
        "max_abs_log_error": max(errs),
        "median_abs_log_error": statistics.median(errs),
        "median_error_factor": math.exp(statistics.median(errs)),
        "spearman": spearman(pred, meas) if len(errs) > 1 else 1.0,
    }


def with_block(hw: HwProfile, values: dict[str, float]) -> HwProfile:
    return dataclasses.replace(hw, calibration=dataclasses.replace(hw.calibration, **values))


def calibrate(
    cases: list[Measured], profiles: dict[str, HwProfile], blocks: bool = True
) -> tuple[dict[str, float], dict[str, Any]]:
    """The pre-defined kernels' constant on the direct cases (lowest mean |log error|), the converting copies'
    on the cases whose time it changes (:func:`converting`; lowest largest |log error|, then mean), then (with
    ``blocks``) the block constants on the fused cases (lowest largest |log error|, then mean, then
    Spearman)."""
    if not blocks:  # the converting copies' constant alone, beside the profile's others
        return _fit_convert(cases, profiles, {})
    direct = _fit(DIRECT_GRID, [m for m in cases if not m.fused], profiles, {}, worst_first=False)
    convert = _fit_convert(cases, profiles, direct[0])
    block = _fit(GRID, [m for m in cases if m.fused], profiles, direct[0] | convert[0], worst_first=True)
    return direct[0] | convert[0] | block[0], block[1]


def _fit_convert(
    cases: list[Measured], profiles: dict[str, HwProfile], fixed: dict[str, float]
) -> tuple[dict[str, float], dict[str, Any]]:
    """``convert_flight_bytes``: the fewest µGraphs of one program and run ordered against the measurement
    (:func:`misordered`: what full mode's choice needs), then the lowest largest and mean |log error| over
    the cases it changes (:func:`converting`)."""
    changed = converting(cases, profiles)
    best: tuple[tuple[float, ...], dict[str, float], dict[str, Any]] | None = None
    for point in itertools.product(*CONVERT_GRID.values()):
        values = fixed | dict(zip(CONVERT_GRID, point, strict=True))
        fitted = {k: with_block(hw, values) for k, hw in profiles.items()}
        s = score(changed, fitted)
        key = (len(misordered(cases, fitted)), s["max_abs_log_error"], s["mean_abs_log_error"])
        if best is None or key < best[0]:
            best = (key, values, s)
    assert best is not None
    return best[1], best[2]


#: Two µGraphs measured closer than this (relative) are not ordered (run-to-run noise, the same kernels).
ORDER_TOLERANCE = 0.05


def misordered(cases: list[Measured], profiles: dict[str, HwProfile]) -> list[tuple[str, str]]:
    """Pairs of µGraphs of one program measured in one run, more than :data:`ORDER_TOLERANCE` apart, that the
    model orders the other way (the slower measured first)."""
    pred = {id(m): predict(m, profiles[m.hw]) for m in cases}
    out = []
    for x, y in itertools.combinations(cases, 2):
        if (x.program, x.source, x.hw) != (y.program, y.source, y.hw) or not x.program:
            continue
        fast, slow = (x, y) if x.measured_s < y.measured_s else (y, x)
        if slow.measured_s > fast.measured_s * (1 + ORDER_TOLERANCE) and pred[id(fast)] >= pred[id(slow)]:
            out.append((fast.name, slow.name))
    return out


def converting(cases: list[Measured], profiles: dict[str, HwProfile]) -> list[Measured]:
    """The cases with a tensor-core matmul that converts an operand in its copies (a float32 operand): their
    predicted time depends on ``convert_flight_bytes``."""
    apart = [
        {k: with_block(hw, {"convert_flight_bytes": v}) for k, hw in profiles.items()} for v in (0.0, 64.0)
    ]
    return [m for m in cases if predict(m, apart[0][m.hw]) != predict(m, apart[1][m.hw])]


def _fit(
    grid: dict[str, list[float]],
    cases: list[Measured],
    profiles: dict[str, HwProfile],
    fixed: dict[str, float],
    worst_first: bool,
) -> tuple[dict[str, float], dict[str, Any]]:
    best: tuple[tuple[float, float, float], dict[str, float], dict[str, Any]] | None = None
    for point in itertools.product(*grid.values()):
        values = fixed | dict(zip(grid, point, strict=True))
        s = score(cases, {k: with_block(hw, values) for k, hw in profiles.items()})
        key = (
            (s["max_abs_log_error"], s["mean_abs_log_error"], -s["spearman"])
            if worst_first
            else (s["mean_abs_log_error"], s["max_abs_log_error"], -s["spearman"])
        )
        if best is None or key < best[0]:
            best = (key, values, s)
    assert best is not None
    return best[1], best[2]


def report(cases: list[Measured], profiles: dict[str, HwProfile]) -> dict[str, Any]:
    """Scores over every case, the direct and fused ones, per profile, and each case's prediction."""
    out: dict[str, Any] = {
        "all": score(cases, profiles),
        "direct": score([m for m in cases if not m.fused], profiles),
        "fused": score([m for m in cases if m.fused], profiles),
    }
    for hw in sorted(profiles):
        out[hw] = score([m for m in cases if m.hw == hw], profiles)
    out["misordered"] = misordered(cases, profiles)
    out["cases"] = [
        {
            "name": m.name,
            "hw": m.hw,
            "fused": m.fused,
            "tensor_cores": m.block_mma,
            "predicted_us": round(predict(m, profiles[m.hw]) * 1e6, 2),
            "measured_us": round(m.measured_s * 1e6, 2),
            "source": m.source,
        }
        for m in cases
    ]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="*", type=Path)
    ap.add_argument("--no-fit", action="store_true", help="only report the profiles as they are")
    ap.add_argument(
        "--no-block-fit",
        action="store_true",
        help="fit the converting copies' constant only (convert_flight_bytes; the others as the profile has them)",
    )
    ap.add_argument("--out", type=Path, help="also write the report here, with the machine, date and commit")
    ap.add_argument(
        "--save-candidates",
        nargs="+",
        metavar="PROGRAM",
        help=f"run full mode's searches of these programs and write their candidates to {CANDIDATES.name}",
    )
    args = ap.parse_args(argv)
    if args.save_candidates:
        save_candidates(args.save_candidates, 120.0)
        return 0
    cases = measured_programs(args.results)
    profiles = {hw: load_profile(hw) for hw in {m.hw for m in cases}}
    result: dict[str, Any] = {"profile": report(cases, profiles)}
    if not args.no_fit:
        values, _ = calibrate(cases, profiles, blocks=not args.no_block_fit)
        fitted = {k: with_block(hw, values) for k, hw in profiles.items()}
        result["calibration"] = values
        result["calibrated"] = report(cases, fitted)
    print(json.dumps(result, indent=1))
    if args.out:
        from benchmarks.common import machine_info, write_json

        machine = machine_info()
        head: dict[str, Any] = {"benchmark": "calibrate_ugraph" + (" --no-fit" if args.no_fit else "")}
        head |= {"machine": machine, "date": machine["date"], "commit": machine["git_commit"]}
        write_json(args.out, head | {"results": [p.name for p in args.results]} | result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

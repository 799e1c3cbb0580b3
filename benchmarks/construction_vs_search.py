"""Construction vs search: time-to-schedule and schedule quality of the Markov construction and baselines.

For every op configuration (``configs/ops/``), each method picks a schedule from the same space scored by the
same analytic cost model (``gensorage.markov.cost_model.predict_schedule_time``; nothing is measured):

* ``markov``       Gensor's Markov construction,
* ``roller``       the Roller-style greedy construction,
* ``optuna-10/100/1000``  Optuna TPE with that many trials,
* ``random-1000``  1000 uniformly random schedules,
* ``dlight``       TVM dlight's default GPU schedule of the same PrimFunc: only its time-to-schedule is
  recorded; its schedule is not a point of our space, so its quality is "n/a (not in schedule space)".

quality = best_known / predicted, where best_known is the lowest predicted time any method reached on that
workload (1.0 = the best schedule found). The summary reports the median time-to-schedule per method, the
markov / optuna-1000 quality ratio (goal >= 0.97) and markov vs roller, and a plot of quality against
time-to-schedule (like Gensor Fig. 10) is written beside the JSON.

``--measure`` (only with a GPU): also time the markov kernel, dlight's kernel and torch (cuBLAS, for the
matmul family) on the device. That path is separate from the analytic part and is skipped without a GPU.

Usage: ``python -m benchmarks.construction_vs_search [--quick] [--workloads M1,C2] [--hw h100] [--seed 0]``
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine_info, progress, result_path, write_json  # noqa: E402

NAME = "construction_vs_search"
QUICK_IDS = ("M1", "M2", "V1", "C1", "P1")
# (label, method, options)
METHOD_RUNS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("markov", "markov", {}),
    ("roller", "roller", {}),
    ("optuna-10", "optuna", {"trials": 10}),
    ("optuna-100", "optuna", {"trials": 100}),
    ("optuna-1000", "optuna", {"trials": 1000}),
    ("random-1000", "random", {"trials": 1000}),
)
QUICK_RUNS = ("markov", "roller", "optuna-10", "optuna-100", "random-1000")
DLIGHT = "dlight"
NOT_IN_SPACE = "n/a (not in schedule space)"
GOAL_MARKOV_VS_OPTUNA = 0.97


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"workloads {','.join(QUICK_IDS)} and no optuna-1000 (minutes instead of an hour)",
    )
    p.add_argument("--workloads", help="comma-separated op config ids (default: all of configs/ops)")
    p.add_argument("--hw", default="h100", help="hardware profile (default h100)")
    p.add_argument("--seed", type=int, default=0, help="seed of every method (default 0)")
    p.add_argument(
        "--methods", help=f"comma-separated subset of {','.join(r[0] for r in METHOD_RUNS)},{DLIGHT}"
    )
    p.add_argument("--no-dlight", action="store_true", help="skip TVM dlight")
    p.add_argument("--measure", action="store_true", help="also time kernels on the GPU (needs a GPU)")
    p.add_argument(
        "--out", type=Path, help="output JSON path (default benchmarks/results/<name>-<date>.json)"
    )
    return p.parse_args(argv)


def select_runs(args: argparse.Namespace) -> tuple[list[tuple[str, str, dict[str, Any]]], bool]:
    labels = [r[0] for r in METHOD_RUNS] + [DLIGHT]
    if args.methods:
        wanted = [m.strip() for m in args.methods.split(",") if m.strip()]
        unknown = [m for m in wanted if m not in labels]
        if unknown:
            raise SystemExit(
                f"construction_vs_search: unknown method(s) {', '.join(unknown)} (known: {', '.join(labels)})"
            )
    else:
        wanted = list(QUICK_RUNS if args.quick else labels[:-1]) + [DLIGHT]
    runs = [r for r in METHOD_RUNS if r[0] in wanted]
    return runs, DLIGHT in wanted and not args.no_dlight


def select_workloads(args: argparse.Namespace) -> list[tuple[str, Any]]:
    from gensorage.workloads import load_op_configs

    configs = load_op_configs()
    if args.workloads:
        wanted = [w.strip() for w in args.workloads.split(",") if w.strip()]
    elif args.quick:
        wanted = [w for w in QUICK_IDS if any(w == wid for wid, _ in configs)]
    else:
        return configs
    by_id = dict(configs)
    unknown = [w for w in wanted if w not in by_id]
    if unknown:
        raise SystemExit(
            f"construction_vs_search: unknown workload id(s) {', '.join(unknown)} (known: {', '.join(by_id)})"
        )
    return [(w, by_id[w]) for w in wanted]


# ------------------------------------------------------------------------------------------ analytic part
def run_method(workload: Any, hw: Any, method: str, seed: int, opts: dict[str, Any]) -> dict[str, Any]:
    from gensorage.errors import GensorageError
    from gensorage.tuning import METHODS

    start = time.perf_counter()
    try:
        outcome = METHODS[method](workload, hw, seed=seed, **opts)
    except GensorageError as exc:
        return {"time_to_schedule_s": time.perf_counter() - start, "error": str(exc)}
    elapsed = time.perf_counter() - start
    return {
        "time_to_schedule_s": elapsed,
        "predicted_time_s": outcome.predicted_time_s,
        "evaluated": outcome.evaluated,
        "schedule": outcome.schedule.to_json(),
    }


def prepare_dlight() -> float:
    """Import what dlight's tensor-core matmul rule imports, once, so it is not charged to one workload."""
    start = time.perf_counter()
    import tvm.s_tir.tensor_intrin  # noqa: F401  (registers the tensor intrinsics dlight's Matmul uses)
    from tvm.s_tir import dlight  # noqa: F401

    return time.perf_counter() - start


def run_dlight(workload: Any, hw: Any) -> dict[str, Any]:
    """dlight's default GPU schedule of the workload's PrimFunc: time to schedule, and whether it builds."""
    import tvm
    from tvm.s_tir import dlight as dl

    from gensorage.codegen.cuda_build import cuda_target

    mod = tvm.IRModule({"main": workload.build()})
    target = cuda_target(hw)
    start = time.perf_counter()
    try:
        with target:
            scheduled = dl.ApplyDefaultSchedule(
                dl.gpu.Matmul(),
                dl.gpu.GEMV(),
                dl.gpu.Reduction(),
                dl.gpu.GeneralReduction(),
                dl.gpu.Fallback(),
            )(mod)
    except Exception as exc:  # dlight raises assorted TVM errors; record, do not abort the benchmark
        return {
            "time_to_schedule_s": time.perf_counter() - start,
            "error": str(exc).splitlines()[-1][:200],
            "quality": NOT_IN_SPACE,
        }
    elapsed = time.perf_counter() - start
    start = time.perf_counter()
    try:
        tvm.compile(scheduled, target=target)
        built: bool | str = True
    except Exception as exc:  # noqa: BLE001 - the build result is data here
        built = str(exc).splitlines()[-1][:200]
    return {
        "time_to_schedule_s": elapsed,
        "codegen_s": time.perf_counter() - start,
        "builds": built,
        "quality": NOT_IN_SPACE,
    }


def add_quality(methods: dict[str, dict[str, Any]]) -> float | None:
    """Fill ``quality`` = best_known / predicted for every method with a finite prediction."""
    times = [
        m["predicted_time_s"]
        for m in methods.values()
        if isinstance(m.get("predicted_time_s"), float) and math.isfinite(m["predicted_time_s"])
    ]
    if not times:
        return None
    best = min(times)
    for m in methods.values():
        t = m.get("predicted_time_s")
        if isinstance(t, float):
            m["quality"] = best / t if math.isfinite(t) and t > 0 else 0.0
        elif "error" in m:
            m["quality"] = 0.0  # the method returned no schedule at all
    return best


# ---------------------------------------------------------------------------------------------- GPU part
def measure_on_gpu(workload: Any, hw: Any, entry: dict[str, Any], repeat: int = 50) -> dict[str, Any]:
    """Kernel times (ms) of the markov schedule, dlight and torch on GPU 0. Skipped without a GPU."""
    from gensorage.codegen.cuda_build import cuda_device_available

    reason = cuda_device_available()
    if reason is not None:
        return {"skipped": reason}
    out: dict[str, Any] = {}
    sched = entry["methods"].get("markov", {}).get("schedule")
    if sched is not None:
        out["markov_ms"] = _time_tvm(_markov_module(workload, hw, sched), workload, hw, repeat)
    if DLIGHT in entry["methods"]:
        out["dlight_ms"] = _time_tvm(_dlight_module(workload, hw), workload, hw, repeat)
    out["torch_ms"] = _time_torch(workload, repeat)
    return out


def _markov_module(workload: Any, hw: Any, sched: dict[str, Any]) -> Any:
    from gensorage.codegen.lower_schedule import lower
    from gensorage.markov.schedule import Schedule

    return lower(workload, Schedule.from_json(sched), "cuda", hw=hw)


def _dlight_module(workload: Any, hw: Any) -> Any:
    import tvm
    from tvm.s_tir import dlight as dl

    from gensorage.codegen.cuda_build import cuda_target

    with cuda_target(hw):
        return dl.ApplyDefaultSchedule(
            dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback()
        )(tvm.IRModule({"main": workload.build()}))


def _time_tvm(mod: Any, workload: Any, hw: Any, repeat: int) -> float | str:
    import tvm

    from gensorage.codegen.cuda_build import compile_cuda_module
    from gensorage.workloads import random_inputs

    try:
        ex = compile_cuda_module(mod, hw)
        dev = tvm.cuda(0)
        args = [tvm.runtime.tensor(a, device=dev) for a in random_inputs(workload, 0)]
        args.append(tvm.runtime.empty(workload.output.shape, workload.output.dtype, dev))
        timer = ex.jit().time_evaluator("main", dev, number=repeat, repeat=3)
        return float(min(timer(*args).results)) * 1e3
    except Exception as exc:  # noqa: BLE001 - a failed measurement is recorded, not fatal
        return f"error: {str(exc).splitlines()[-1][:200]}"


def _time_torch(workload: Any, repeat: int) -> float | str:
    """torch's kernel for the same op (cuBLAS / cuDNN), when torch with CUDA is installed."""
    try:
        import torch
    except ImportError:
        return "skipped: torch not installed"
    if not torch.cuda.is_available():
        return "skipped: torch has no CUDA"
    from gensorage.workloads import random_inputs

    fn = _torch_fn(workload, torch)
    if fn is None:
        return f"skipped: no torch equivalent for {workload.name}"
    xs = [torch.from_numpy(a).cuda() for a in random_inputs(workload, 0)]
    for _ in range(3):
        fn(*xs)
    torch.cuda.synchronize()
    best = math.inf
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeat):
            fn(*xs)
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / repeat)
    return best


def _torch_fn(workload: Any, torch: Any) -> Callable[..., Any] | None:
    p = dict(workload.params)
    if workload.name in ("gemm", "gemv", "batch_matmul"):
        return torch.matmul
    if workload.name == "conv2d":
        return lambda x, w: torch.nn.functional.conv2d(
            x, w, stride=(p["stride_h"], p["stride_w"]), padding=(p["pad_h"], p["pad_w"])
        )
    if workload.name == "avgpool2d":
        return lambda x: torch.nn.functional.avg_pool2d(
            x, (p["KH"], p["KW"]), (p["stride_h"], p["stride_w"]), (p["pad_h"], p["pad_w"])
        )
    return None


# ------------------------------------------------------------------------------------------------ summary
def geomean(values: Sequence[float]) -> float | None:
    vals = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def summarize(entries: list[dict[str, Any]], labels: Sequence[str]) -> dict[str, Any]:
    median_time = {}
    mean_quality = {}
    for label in labels:
        times = [e["methods"][label]["time_to_schedule_s"] for e in entries if label in e["methods"]]
        if times:
            median_time[label] = statistics.median(times)
        quals = [
            e["methods"][label]["quality"]
            for e in entries
            if isinstance(e["methods"].get(label, {}).get("quality"), float)
        ]
        if quals:
            mean_quality[label] = statistics.fmean(quals)
    summary: dict[str, Any] = {
        "workloads": len(entries),
        "median_time_to_schedule_s": median_time,
        "mean_quality": mean_quality,
    }
    for other, key in (("optuna-1000", "markov_vs_optuna_1000"), ("roller", "markov_vs_roller")):
        ratios = [
            e["methods"]["markov"]["quality"] / e["methods"][other]["quality"]
            for e in entries
            if _both(e, "markov", other)
        ]
        if ratios:
            summary[key] = {
                "geomean_quality_ratio": geomean(ratios),
                "min": min(ratios),
                "max": max(ratios),
                "workloads": len(ratios),
            }
    if "markov_vs_optuna_1000" in summary:
        g = summary["markov_vs_optuna_1000"]["geomean_quality_ratio"]
        summary["markov_vs_optuna_1000"]["goal"] = GOAL_MARKOV_VS_OPTUNA
        summary["markov_vs_optuna_1000"]["meets_goal"] = g is not None and g >= GOAL_MARKOV_VS_OPTUNA
    return summary


def _both(entry: dict[str, Any], a: str, b: str) -> bool:
    qa = entry["methods"].get(a, {}).get("quality")
    qb = entry["methods"].get(b, {}).get("quality")
    return isinstance(qa, float) and isinstance(qb, float) and qa > 0 and qb > 0


def plot(entries: list[dict[str, Any]], labels: Sequence[str], path: Path, title: str) -> bool:
    """Quality against time-to-schedule per method (one point per workload, the marker at the medians)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        progress("matplotlib not installed: no plot")
        return False
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    colors = plt.get_cmap("tab10")
    for i, label in enumerate(labels):
        pts = [
            (e["methods"][label]["time_to_schedule_s"], e["methods"][label]["quality"])
            for e in entries
            if isinstance(e["methods"].get(label, {}).get("quality"), float)
        ]
        if not pts:
            continue
        xs, ys = zip(*pts, strict=True)
        ax.scatter(xs, ys, s=14, alpha=0.35, color=colors(i))
        ax.scatter(
            [statistics.median(xs)],
            [statistics.median(ys)],
            s=90,
            marker="D",
            color=colors(i),
            edgecolor="black",
            label=f"{label} (median)",
        )
    dl_times = [e["methods"][DLIGHT]["time_to_schedule_s"] for e in entries if DLIGHT in e["methods"]]
    if dl_times:
        ax.axvline(
            statistics.median(dl_times),
            color="gray",
            linestyle="--",
            linewidth=1,
            label="dlight median time (quality n/a)",
        )
    ax.set_xscale("log")
    ax.set_xlabel("time to schedule (s, log scale)")
    ax.set_ylabel("quality = best known / predicted time")
    ax.set_ylim(0, 1.05)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return True


# --------------------------------------------------------------------------------------------------- main
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from gensorage.tuning import resolve_hw

    try:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
    except ImportError:
        pass
    hw = resolve_hw(args.hw)
    runs, with_dlight = select_runs(args)
    workloads = select_workloads(args)
    out = args.out or result_path(NAME)
    labels = [r[0] for r in runs]
    result: dict[str, Any] = {
        "benchmark": NAME,
        "machine": machine_info(),
        "hw": hw.name,
        "seed": args.seed,
        "quick": args.quick,
        "cost_model": "gensorage.markov.cost_model.predict_schedule_time (analytic, nothing measured)",
        "quality": "best_known / predicted_time; best_known = lowest predicted time of any method on the workload",
        "methods": {label: {"method": m, "options": o} for label, m, o in runs},
        "workloads": [],
        "summary": {},
    }
    if with_dlight:
        result["methods"][DLIGHT] = {
            "method": "tvm.s_tir.dlight default GPU schedule",
            "quality": NOT_IN_SPACE,
        }
        result["dlight_setup_s"] = prepare_dlight()
    for n, (wid, wl) in enumerate(workloads, 1):
        progress(f"[{n}/{len(workloads)}] {wid} {wl.key()}")
        entry: dict[str, Any] = {
            "id": wid,
            "workload": wl.key(),
            "op": wl.name,
            "flops": wl.flops,
            "methods": {},
        }
        for label, method, opts in runs:
            entry["methods"][label] = r = run_method(wl, hw, method, args.seed, opts)
            progress(
                f"    {label:<12} {r['time_to_schedule_s']:8.3f} s  "
                + (
                    f"{r['predicted_time_s'] * 1e6:10.2f} us"
                    if "predicted_time_s" in r
                    else r.get("error", "")
                )
            )
        entry["best_known_s"] = add_quality(entry["methods"])
        if with_dlight:
            entry["methods"][DLIGHT] = r = run_dlight(wl, hw)
            progress(
                f"    {DLIGHT:<12} {r['time_to_schedule_s']:8.3f} s  (builds: {r.get('builds', r.get('error'))})"
            )
        if args.measure:
            entry["gpu"] = measure_on_gpu(wl, hw, entry)
        result["workloads"].append(entry)
        result["summary"] = summarize(result["workloads"], labels + ([DLIGHT] if with_dlight else []))
        write_json(out, result)  # after every workload, so an interrupted run keeps what it measured
    png = out.with_suffix(".png")
    if plot(result["workloads"], labels, png, f"construction vs search on {hw.name} (cost model)"):
        result["plot"] = png.name
        write_json(out, result)
    progress(f"wrote {out}")
    _print_summary(result["summary"])
    return 0


def _print_summary(summary: dict[str, Any]) -> None:
    for label, t in summary.get("median_time_to_schedule_s", {}).items():
        q = summary.get("mean_quality", {}).get(label)
        progress(f"  {label:<12} median {t:8.3f} s" + (f"   mean quality {q:.3f}" if q is not None else ""))
    for key in ("markov_vs_optuna_1000", "markov_vs_roller"):
        if key in summary:
            s = summary[key]
            progress(
                f"  {key}: geomean quality ratio {s['geomean_quality_ratio']:.3f} "
                f"(min {s['min']:.3f}, max {s['max']:.3f}, {s['workloads']} workloads)"
            )


if __name__ == "__main__":
    sys.exit(main())

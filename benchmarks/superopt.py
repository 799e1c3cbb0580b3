"""Benchmark: superoptimise every bundled program (``configs/programs/``) at its own shapes, with its preset.

For each program, full mode runs the exhaustive search at the preset's small search shapes within a time
budget, re-instantiates what it found at the program's shapes and re-verifies it there (or at the search
shapes, for programs too large to check); then fast mode re-uses the stored structure at the same shapes.
Recorded per program: kernels of the best µGraph and of the naive program (one kernel per op), both predicted
times (the same µGraph cost model), the search's wall time, tasks, candidates and completeness, how the best
was verified, and fast mode's wall time. Results are written after every program (``--out``, default
``benchmarks/results/superopt-<date>.json``) with machine info, date and git commit.

``--gpu`` (only on a machine with a CUDA GPU and torch): full mode then also times its leading candidates on the
device before choosing, and the benchmark checks the best µGraph, the direct µGraph and torch (the program run
op by op, ``gensorage.baselines.torch_eager``) against float64 on fresh inputs, then times each the same way
(median of up to 100 samples, inputs on the device; ``gensorage.superopt.gpu``) and every kernel alone. See
docs/gpu.md.

Run from the repository root::

    python -m benchmarks.superopt --budget 60            # all programs, 60 s of search each
    python -m benchmarks.superopt rmsnorm gated_mlp      # some programs
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine_info, progress, result_path, write_json  # noqa: E402
from gensorage.errors import GensorageError  # noqa: E402
from gensorage.program import list_configs  # noqa: E402
from gensorage.superopt import SuperoptInterrupted, SuperoptResult, load_preset, superoptimize  # noqa: E402

GPU_REPEATS = 100
GPU_BUDGET_S = 5.0  # per timing: a slow µGraph is timed on fewer samples


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("programs", nargs="*", help="program names (default: every configs/programs/*.gsp)")
    ap.add_argument("--hw", default="h100", help="hardware profile (default h100)")
    ap.add_argument(
        "--budget", type=float, default=60.0, help="search time budget per program, s (default 60)"
    )
    ap.add_argument("--workers", type=int, default=None, help="search workers (default: all cores)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="result JSON (default benchmarks/results/...)")
    ap.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="where stores and checkpoints go (default: a fresh temporary folder, so every "
        "program is searched from scratch; give one to resume an interrupted benchmark)",
    )
    ap.add_argument("--gpu", action="store_true", help="also measure on the GPU against torch (needs both)")
    return ap.parse_args(argv)


def _summary(r: SuperoptResult) -> dict[str, Any]:
    stats = r.search_stats or {}
    return {
        "kernels": r.num_kernels,
        "naive_kernels": r.naive_num_kernels,
        "predicted_time_s": r.predicted_time_s,
        "naive_predicted_time_s": r.naive_predicted_time_s,
        "predicted_speedup": r.speedup,
        "direct": r.is_direct,
        "origin": r.origin,
        "verified": bool(r.equivalence),
        "verification": r.equivalence.method,
        "achieved_delta": None if r.equivalence.report is None else r.equivalence.report.achieved_delta,
        "wall_time_s": r.search_time_s,
        "timings": r.timings,
        "complete": r.complete,
        "stopped_by": r.stopped_by,
        "tasks_done": stats.get("tasks_done"),
        "tasks_total": stats.get("tasks_total"),
        "candidates": stats.get("candidates"),
        "search_stats": stats.get("stats"),
        "at_search_shapes": stats.get("at_search_shapes"),
        "from_store": r.from_store,
        "selection": r.selection,
        "measured_s": r.measured,
        "notes": r.notes,
    }


def run_program(name: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Full mode, then fast mode, for one program; errors are recorded, not raised."""
    preset = load_preset(name)
    entry: dict[str, Any] = {
        "program": name,
        "search_params": preset.search_params,
        "budget_s": args.budget,
        "preset": preset.to_json(),
    }
    store, ckpt = work / "store.sqlite", work / f"{name}.ckpt.sqlite"
    try:
        full = superoptimize(
            name,
            hw=args.hw,
            mode="full",
            time_budget_s=args.budget,
            checkpoint=ckpt,
            seed=args.seed,
            workers=args.workers,
            preset=preset,
            store=store,
            progress=True,
        )
    except SuperoptInterrupted as exc:  # Ctrl-C: keep what was found, the caller stops
        entry["params"] = dict(exc.result.program.params)
        entry["full"] = _summary(exc.result)
        entry["interrupted"] = True
        return entry
    except GensorageError as exc:
        entry["error"] = f"{type(exc).__name__}: {exc}"
        return entry
    entry["params"] = dict(full.program.params)
    entry["full"] = _summary(full)
    try:
        fast = superoptimize(
            name, hw=args.hw, mode="fast", seed=args.seed, preset=preset, store=store, progress=False
        )
        entry["fast"] = _summary(fast)
    except GensorageError as exc:
        entry["fast"] = {"error": f"{type(exc).__name__}: {exc}"}
    if args.gpu:
        try:
            entry["gpu"] = measure_against_torch(full, args.seed)
        except Exception as exc:  # noqa: BLE001  # a device failure is recorded and the next program runs
            entry["gpu"] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    return entry


# ------------------------------------------------------------------------------------------------ GPU only


def measure_against_torch(r: SuperoptResult, seed: int) -> dict[str, Any]:
    """Check, then time, on GPU 0: the best µGraph's kernels, the direct µGraph's, and torch op by op.

    Correct first: each is run on fresh random inputs (rounded to the program's dtype) and compared with the
    float64 reference by ||out - ref|| / ||ref||; the times are medians (see ``gensorage.superopt.gpu``).
    """
    from gensorage.codegen.module import compile_ugraph
    from gensorage.superopt.gpu import (
        gpu_name,
        gpu_unavailable_reason,
        measure_ugraph,
        median_time,
    )
    from gensorage.ugraph.from_program import from_program

    reason = gpu_unavailable_reason()
    if reason is not None:
        return {"error": reason}
    try:
        import torch
    except ImportError:
        return {"error": "torch is not installed"}
    out: dict[str, Any] = {
        "device": gpu_name(),
        "torch": str(torch.__version__),
        "dtype": r.program.inputs[0].dtype,
        "max_samples": GPU_REPEATS,
    }
    xs, ref = _check_inputs(r.program, seed + 1)
    runs = [("ugraph", r.compiled())]
    if not r.is_direct:
        runs.append(("direct", compile_ugraph(from_program(r.program), r.hw, "cuda", seed=r.seed)))
    for key, compiled in runs:
        try:
            out[f"{key}_rel_err"] = _rel_err(compiled.run(*xs, target="cuda"), ref)
            timing = measure_ugraph(
                compiled, r.program, seed=seed, repeats=GPU_REPEATS, budget_s=GPU_BUDGET_S
            )
            out[f"{key}_s"], out[f"{key}_timing"] = timing.median_s, timing.to_json()
            out[f"{key}_kernels"] = kernel_times(compiled, r.program, seed)
        except GensorageError as exc:
            out[f"{key}_error"] = f"{type(exc).__name__}: {exc}"
    from gensorage.baselines.torch_eager import torch_program

    dev = torch.device("cuda")
    run = torch_program(r.program, torch, [torch.as_tensor(x, device=dev) for x in xs])
    out["torch_rel_err"] = _rel_err([t.cpu().numpy() for t in run()], ref)
    timing = median_time(run, torch.cuda.synchronize, repeats=GPU_REPEATS, budget_s=GPU_BUDGET_S)
    out["torch_s"], out["torch_timing"] = timing.median_s, timing.to_json()
    for key in ("ugraph", "direct"):
        if f"{key}_s" in out:
            out[f"{key}_speedup_vs_torch"] = out["torch_s"] / out[f"{key}_s"]
    return out


def kernel_times(compiled: Any, program: Any, seed: int) -> list[dict[str, Any]]:
    """Median time of each kernel launched alone (inputs and buffers on the device), in launch order."""
    import tvm

    from gensorage.codegen.module import launch_plan
    from gensorage.codegen.scalar import FloatScalar
    from gensorage.superopt.gpu import median_time, program_inputs

    xs = program_inputs(program, seed)
    dev = tvm.cuda(0)
    calls, _ = launch_plan(
        compiled.ugraph,
        compiled.info,
        compiled.kernels("cuda"),
        compiled.executable("cuda"),
        [tvm.runtime.tensor(x, device=dev) for x in xs],
        dev,
        FloatScalar(compiled.compute),
    )
    out = []
    for kern, f, args in calls:
        t = median_time(lambda f=f, args=args: f(*args), dev.sync, repeats=GPU_REPEATS, budget_s=GPU_BUDGET_S)
        out.append({"kernel": kern.name, "threads": kern.threads, "rule": kern.rule, "median_s": t.median_s})
    return out


def _check_inputs(program: Any, seed: int) -> tuple[list[Any], list[Any]]:
    """Random inputs in the program's dtype and the float64 reference computed from exactly those values."""
    from gensorage.superopt.gpu import program_inputs

    xs = program_inputs(program, seed)
    return xs, program.run(*xs)


def _rel_err(got: list[Any], ref: list[Any]) -> float:
    """Largest ||out - ref|| / ||ref|| over the outputs; NaN when any output is not finite."""
    import numpy as np

    errs = []
    for g, w in zip(got, ref, strict=True):
        g64 = np.asarray(g, dtype=np.float64)
        if not np.isfinite(g64).all():
            return math.nan
        errs.append(float(np.linalg.norm(g64 - w) / max(np.linalg.norm(w), 1e-300)))
    return max(errs)


# ------------------------------------------------------------------------------------------------ driver


def _line(e: dict[str, Any]) -> str:
    if "error" in e:
        return f"{e['program']:12s} error: {e['error']}"
    f, fast = e["full"], e.get("fast", {})
    small = f.get("at_search_shapes") or {}
    found = (
        f"{small['best_kernels']} kernel(s), {small['naive_predicted_time_s'] / small['best_predicted_time_s']:.2f}x"
        if small.get("best_predicted_time_s")
        else "nothing"
    )
    return (
        f"{e['program']:12s} kernels {f['kernels']:2d} (naive {f['naive_kernels']:2d})  predicted "
        f"{f['predicted_time_s'] * 1e6:9.2f} µs vs {f['naive_predicted_time_s'] * 1e6:9.2f} µs "
        f"({f['predicted_speedup']:.2f}x)  search {f['wall_time_s']:6.1f} s "
        f"[{f['tasks_done']}/{f['tasks_total']} tasks, {f['candidates']} cand.; at search shapes: {found}]  "
        f"verified {f['verified']} ({f['verification']})  fast {fast.get('wall_time_s', math.nan):.1f} s"
        + _gpu_line(e.get("gpu"))
    )


def _gpu_line(g: dict[str, Any] | None) -> str:
    if not g:
        return ""
    if "ugraph_s" not in g or "torch_s" not in g:
        return f"  gpu: {g.get('error') or g.get('ugraph_error')}"
    return (
        f"  gpu {g['ugraph_s'] * 1e6:.1f} µs (err {g['ugraph_rel_err']:.1e}) vs torch {g['torch_s'] * 1e6:.1f} µs "
        f"(err {g['torch_rel_err']:.1e}): {g['ugraph_speedup_vs_torch']:.2f}x"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = args.programs or [p.stem for p in list_configs()]
    out = args.out or result_path("superopt")
    data: dict[str, Any] = {
        "benchmark": "superopt",
        "machine": machine_info(),
        "hw": args.hw,
        "budget_s": args.budget,
        "workers": args.workers,
        "seed": args.seed,
        "gpu": args.gpu,
        "programs": [],
    }
    with tempfile.TemporaryDirectory(prefix="gensorage-superopt-") as tmp:
        work = args.work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for name in names:
            progress(f"== {name}")
            t0 = time.perf_counter()
            entry = run_program(name, args, work)
            entry["benchmark_wall_s"] = time.perf_counter() - t0
            data["programs"].append(entry)
            write_json(out, data)
            progress(_line(entry))
            if entry.get("interrupted"):
                progress("interrupted: stopping after this program")
                break
    progress(f"wrote {out}")
    for e in data["programs"]:
        print(_line(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())

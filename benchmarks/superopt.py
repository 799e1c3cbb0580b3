"""Benchmark: superoptimise every bundled program (``configs/programs/``) at its own shapes, with its preset.

For each program, full mode runs the exhaustive search at the preset's small search shapes within a time
budget, re-instantiates what it found at the program's shapes and re-verifies it there (or at the search
shapes, for programs too large to check); then fast mode re-uses the stored structure at the same shapes.
Recorded per program: kernels of the best µGraph and of the naive program (one kernel per op), both predicted
times (the same µGraph cost model), the search's wall time, tasks, candidates and completeness, how the best
was verified, and fast mode's wall time. Results are written after every program (``--out``, default
``benchmarks/results/superopt-<date>.json``) with machine info, date and git commit.

``--gpu`` (only on a machine with a CUDA GPU and torch): also measure the best µGraph's kernels on the device
against torch running the program op by op (median of many runs, both with device-resident inputs).

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
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine_info, progress, result_path, write_json  # noqa: E402
from gensorage.errors import GensorageError  # noqa: E402
from gensorage.program import list_configs  # noqa: E402
from gensorage.superopt import SuperoptInterrupted, SuperoptResult, load_preset, superoptimize  # noqa: E402

GPU_REPEATS = 100


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("programs", nargs="*", help="program names (default: every configs/programs/*.gsp)")
    ap.add_argument("--hw", default="h100", help="hardware profile (default h100)")
    ap.add_argument("--budget", type=float, default=60.0, help="search time budget per program, s (default 60)")
    ap.add_argument("--workers", type=int, default=None, help="search workers (default: all cores)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="result JSON (default benchmarks/results/...)")
    ap.add_argument("--work-dir", type=Path, default=None,
                    help="where stores and checkpoints go (default: a fresh temporary folder, so every "
                         "program is searched from scratch; give one to resume an interrupted benchmark)")
    ap.add_argument("--gpu", action="store_true", help="also measure on the GPU against torch (needs both)")
    return ap.parse_args(argv)


def _summary(r: SuperoptResult) -> dict[str, Any]:
    stats = r.search_stats or {}
    return {
        "kernels": r.num_kernels, "naive_kernels": r.naive_num_kernels,
        "predicted_time_s": r.predicted_time_s, "naive_predicted_time_s": r.naive_predicted_time_s,
        "predicted_speedup": r.speedup, "direct": r.is_direct, "origin": r.origin,
        "verified": bool(r.equivalence), "verification": r.equivalence.method,
        "achieved_delta": None if r.equivalence.report is None else r.equivalence.report.achieved_delta,
        "wall_time_s": r.search_time_s, "timings": r.timings, "complete": r.complete, "stopped_by": r.stopped_by,
        "tasks_done": stats.get("tasks_done"), "tasks_total": stats.get("tasks_total"),
        "candidates": stats.get("candidates"), "search_stats": stats.get("stats"),
        "at_search_shapes": stats.get("at_search_shapes"),
        "from_store": r.from_store, "selection": r.selection, "notes": r.notes,
    }


def run_program(name: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Full mode, then fast mode, for one program; errors are recorded, not raised."""
    preset = load_preset(name)
    entry: dict[str, Any] = {"program": name, "search_params": preset.search_params, "budget_s": args.budget,
                             "preset": preset.to_json()}
    store, ckpt = work / "store.sqlite", work / f"{name}.ckpt.sqlite"
    try:
        full = superoptimize(name, hw=args.hw, mode="full", time_budget_s=args.budget, checkpoint=ckpt,
                             seed=args.seed, workers=args.workers, preset=preset, store=store, progress=True)
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
        fast = superoptimize(name, hw=args.hw, mode="fast", seed=args.seed, preset=preset, store=store,
                             progress=False)
        entry["fast"] = _summary(fast)
    except GensorageError as exc:
        entry["fast"] = {"error": f"{type(exc).__name__}: {exc}"}
    if args.gpu:
        entry["gpu"] = measure_against_torch(full)
    return entry


# ------------------------------------------------------------------------------------------------ GPU only


def measure_against_torch(r: SuperoptResult) -> dict[str, Any]:
    """Median time of the best µGraph's kernels and of torch's op-by-op program, on GPU 0 (CUDA only)."""
    from gensorage.superopt.gpu import gpu_name, gpu_unavailable_reason, measure_ugraph

    reason = gpu_unavailable_reason()
    if reason is not None:
        return {"error": reason}
    try:
        import torch
    except ImportError:
        return {"error": "torch is not installed"}
    try:
        ours = measure_ugraph(r.compiled(), r.program, seed=r.seed, repeats=GPU_REPEATS)
    except GensorageError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    theirs = _torch_time(r.program, torch)
    return {"device": gpu_name(), "torch": str(torch.__version__), "ugraph_s": ours, "torch_s": theirs,
            "speedup_vs_torch": theirs / ours if ours > 0 else math.nan, "repeats": GPU_REPEATS}


def _torch_time(program: Any, torch: Any) -> float:
    """Median time of the program run op by op in torch (eager), inputs on the GPU."""
    import numpy as np

    dev = torch.device("cuda")
    dtype = getattr(torch, program.inputs[0].dtype)
    xs = [torch.as_tensor(a, device=dev).to(dtype) for a in program.random_inputs(0)]

    def run() -> None:
        values: dict[int, Any] = dict(zip((t.id for t in program.inputs), xs, strict=True))
        for i in program.live_ids():
            n = program.nodes[i]
            if n.op is not None:
                values[i] = _torch_op(torch, n.op.value, [values[j] for j in n.inputs], dict(n.attrs))

    for _ in range(5):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(GPU_REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return float(np.median(times))


def _torch_op(torch: Any, op: str, xs: list[Any], attrs: dict[str, Any]) -> Any:
    f = torch.nn.functional
    match op:
        case "matmul":
            return torch.matmul(xs[0], xs[1])
        case "add" | "sub" | "mul" | "div":
            return getattr(torch, op)(xs[0], xs[1])
        case "exp" | "sqrt" | "relu":
            return getattr(torch, op)(xs[0])
        case "silu" | "gelu":
            return getattr(f, op)(xs[0])
        case "scale":
            return xs[0] * attrs["factor"]
        case "sum":
            x, dim = xs[0], attrs["dim"]
            group = attrs.get("group")
            if group is None or group == x.shape[dim]:
                return x.sum(dim=dim, keepdim=attrs.get("keepdim", True))
            shape = list(x.shape)
            return x.reshape(shape[:dim] + [shape[dim] // group, group] + shape[dim + 1:]).sum(dim=dim + 1)
        case "reshape":
            return xs[0].reshape(attrs["shape"])
        case "repeat":
            return torch.repeat_interleave(xs[0], attrs["times"], dim=attrs["dim"])
        case "concat":
            return torch.cat(xs, dim=attrs["dim"])
    raise ValueError(f"no torch form for {op}")


# ------------------------------------------------------------------------------------------------ driver


def _line(e: dict[str, Any]) -> str:
    if "error" in e:
        return f"{e['program']:12s} error: {e['error']}"
    f, fast = e["full"], e.get("fast", {})
    small = f.get("at_search_shapes") or {}
    found = (f"{small['best_kernels']} kernel(s), {small['naive_predicted_time_s'] / small['best_predicted_time_s']:.2f}x"
             if small.get("best_predicted_time_s") else "nothing")
    return (f"{e['program']:12s} kernels {f['kernels']:2d} (naive {f['naive_kernels']:2d})  predicted "
            f"{f['predicted_time_s'] * 1e6:9.2f} µs vs {f['naive_predicted_time_s'] * 1e6:9.2f} µs "
            f"({f['predicted_speedup']:.2f}x)  search {f['wall_time_s']:6.1f} s "
            f"[{f['tasks_done']}/{f['tasks_total']} tasks, {f['candidates']} cand.; at search shapes: {found}]  "
            f"verified {f['verified']} ({f['verification']})  fast {fast.get('wall_time_s', math.nan):.1f} s")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = args.programs or [p.stem for p in list_configs()]
    out = args.out or result_path("superopt")
    data: dict[str, Any] = {"benchmark": "superopt", "machine": machine_info(), "hw": args.hw,
                            "budget_s": args.budget, "workers": args.workers, "seed": args.seed,
                            "gpu": args.gpu, "programs": []}
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

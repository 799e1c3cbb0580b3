"""The LLaMA-style decoder layer end to end on a GPU: ``gensorage.torch.compile`` against eager torch and
``torch.compile`` (inductor), on CUDA tensors (issue 24, item 7).

The layer is the one the front end's tests use (``tests/test_torch_frontend.py: DecoderLayer``: RMSNorm, q/k/v/o
projections, RoPE, causal GQA attention, SwiGLU MLP), with random weights, at a small config and at LLaMA-3-8B's
(hidden 4096, 32 heads, 8 KV heads, MLP 14336), in bfloat16 by default.

For each config and sequence length:

1. **Correctness first.** Each method runs on two fresh random draws; each output is compared with the layer in
   float64 on the same inputs (on the device), as ``max |out - ref| / max |ref|``. A method over ``--tol`` is not
   timed.
2. **Timing.** CUDA events around ``--calls`` back-to-back calls after a warm-up, ``--samples`` times; the median
   per call. The calls include each method's host work as a user sees it (gensorage's dispatch, dynamo's guards),
   not CUDA-graph replays: gensorage's kernels are launched by TVM on torch's stream, one call at a time.
3. **First call**: wall time of gensorage's first call at a shape (capture, lowering, construction, verification,
   build and load), and of inductor's.

``gensorage``'s report (``explain()``) says which ops ran where. Writes one JSON (``--out``). Needs a CUDA GPU,
torch and a TVM that can compile (this script does not fall back to anything).
Usage: ``python benchmarks/torch_decoder.py --out decoder.json [--configs small llama3_8b] [--tokens 128 512]``
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import torch  # noqa: E402
from test_torch_frontend import DecoderLayer, rope  # noqa: E402

import gensorage.torch as gtorch  # noqa: E402
from benchmarks.common import machine_info  # noqa: E402

#: Where the layer runs (``--device``; cpu only to try the script without a GPU: host-timed there).
DEVICE = "cuda"

CONFIGS: dict[str, dict[str, int]] = {
    "small": dict(hidden=64, heads=4, kv_heads=2, ffn=128),
    "llama3_8b": dict(hidden=4096, heads=32, kv_heads=8, ffn=14336),
}


def inputs(cfg: dict[str, int], t: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = 3.0 * torch.randn(1, t, cfg["hidden"], generator=g)  # activations of a few units
    cos, sin = rope(t, cfg["hidden"] // cfg["heads"], dtype)
    return tuple(a.to(DEVICE) for a in (x.to(dtype), cos, sin))


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).abs().max() / want.abs().max())


def time_calls(fn: Callable[[], Any], calls: int, samples: int) -> dict[str, float]:
    """Median seconds per call over ``samples`` CUDA-event-timed runs of ``calls`` calls."""
    for _ in range(3):
        fn()
    per_call = []
    if DEVICE == "cpu":
        for _ in range(samples):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            per_call.append((time.perf_counter() - t0) / calls)
        return {"median_s": statistics.median(per_call), "min_s": min(per_call), "max_s": max(per_call)}
    torch.cuda.synchronize()
    for _ in range(samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) / 1e3 / calls)
    return {"median_s": statistics.median(per_call), "min_s": min(per_call), "max_s": max(per_call)}


def kernel_breakdown(fn: Callable[[], Any], calls: int = 5, top: int = 25) -> dict[str, Any]:
    """Where one call's device time goes: the kernels torch's profiler saw over ``calls`` calls (CUDA
    activity), by total time, per call; the sum of kernel times against the events' time shows host gaps."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    rows = [
        (e.key, e.count / calls, e.device_time_total / calls)
        for e in prof.key_averages()
        if e.device_time_total > 0
    ]
    rows.sort(key=lambda r: -r[2])
    return {
        "kernels_per_call": sum(r[1] for r in rows),
        "kernel_us_per_call": sum(r[2] for r in rows),
        "top": [{"kernel": k[:120], "count": c, "us": round(us, 2)} for k, c, us in rows[:top]],
    }


def measure(name: str, cfg: dict[str, int], t: int, dtype: torch.dtype, args: argparse.Namespace) -> dict:
    torch.manual_seed(0)
    layer = DecoderLayer(**cfg).eval()
    exact = copy.deepcopy(layer).double().to(DEVICE)
    layer = layer.to(dtype).to(DEVICE)
    makers: dict[str, Callable[[], Callable[..., torch.Tensor]]] = {
        "eager": lambda: layer,
        "inductor": lambda: torch.compile(layer),
        "gensorage": lambda: gtorch.compile(layer, hw=args.hw),
    }
    methods = {m: makers[m]() for m in args.methods}
    row: dict[str, Any] = {"config": name, **cfg, "tokens": t, "dtype": str(dtype).removeprefix("torch.")}
    draws = [inputs(cfg, t, dtype, seed) for seed in (1, 2)]
    with torch.no_grad():
        wants = [exact(*(a.double() for a in d)) for d in draws]
        for mname, fn in methods.items():
            m: dict[str, Any] = {}
            t0 = time.perf_counter()
            fn(*draws[0])
            if DEVICE == "cuda":
                torch.cuda.synchronize()
            m["first_call_s"] = time.perf_counter() - t0
            m["rel_err"] = [rel_err(fn(*d), w) for d, w in zip(draws, wants, strict=True)]
            m["ok"] = all(e <= args.tol for e in m["rel_err"])
            if mname == "gensorage":
                m["rebuild_wait_s"] = wait_rebuilds()
            if m["ok"]:
                m |= time_calls(lambda fn=fn: fn(*draws[0]), args.calls, args.samples)
                if args.profile and DEVICE == "cuda":
                    m["profile"] = kernel_breakdown(lambda fn=fn: fn(*draws[0]))
            row[mname] = m
            print(f"{name} t={t} {mname}: {m}", file=sys.stderr, flush=True)
        if "gensorage" in methods and args.new_lengths:
            row["gensorage_new_lengths"] = new_lengths(methods["gensorage"], exact, cfg, dtype, args)
    if "gensorage" in methods:
        row["gensorage_report"] = methods["gensorage"].explain()  # type: ignore[attr-defined]
    return row


def wait_rebuilds() -> float:
    """Wait for the background builds of the kernels a first call served at a first tier (the length's own
    kernels replace them); the seconds waited. The steady time is then the steady kernels'."""
    from gensorage.torch.subgraph import _DISPATCHERS

    t0 = time.perf_counter()
    for d in list(_DISPATCHERS.values()):
        d.wait_rebuilds()
    return time.perf_counter() - t0


def new_lengths(
    fn: Callable[..., torch.Tensor],
    exact: torch.nn.Module,
    cfg: dict[str, int],
    dtype: torch.dtype,
    args: argparse.Namespace,
) -> list[dict[str, Any]]:
    """The same compiled layer at lengths it has not seen (issue 24 item 4 on the device): the first call's wall
    time until its outputs are on the device (dispatch, verification, build and load included), its error
    against float64 on two draws, and its steady time per call."""
    rows = []
    for t in args.new_lengths:
        draws = [inputs(cfg, t, dtype, seed) for seed in (3, 4)]
        m: dict[str, Any] = {"tokens": t}
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(*draws[0])
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        m["first_call_s"] = time.perf_counter() - t0
        m["rel_err"] = [rel_err(fn(*d), exact(*(a.double() for a in d))) for d in draws]
        m["ok"] = all(e <= args.tol for e in m["rel_err"])
        m["rebuild_wait_s"] = wait_rebuilds()
        if m["ok"]:
            m |= time_calls(lambda d=draws[0]: fn(*d), args.calls, args.samples)
        print(f"  new length {t}: {m}", file=sys.stderr, flush=True)
        rows.append(m)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--configs", nargs="+", default=["small", "llama3_8b"], choices=sorted(CONFIGS))
    ap.add_argument("--tokens", nargs="+", type=int, default=[128, 512])
    ap.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16"])
    ap.add_argument("--hw", default="h100", help="gensorage hardware profile")
    ap.add_argument("--tol", type=float, default=2e-2)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--samples", type=int, default=15)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: try the script, no GPU")
    ap.add_argument(
        "--methods",
        nargs="+",
        default=["eager", "inductor", "gensorage"],
        choices=["eager", "inductor", "gensorage"],
        help="what to time (inductor's compile of a large layer takes a while)",
    )
    ap.add_argument(
        "--new-lengths",
        nargs="*",
        type=int,
        default=[],
        metavar="T",
        help="gensorage: then call the same compiled layer at these lengths (first call, error, steady time)",
    )
    ap.add_argument("--profile", action="store_true", help="record each method's kernels (torch.profiler)")
    ap.add_argument("--commit", default=None, help="the commit measured (the device's copy has no .git)")
    args = ap.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("torch_decoder: needs a CUDA GPU", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    info = machine_info()
    result: dict[str, Any] = {
        "benchmark": "torch_decoder",
        "machine": info,
        "gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else None,
        "torch": torch.__version__,
        "commit": args.commit or info.get("git_commit"),
        "hw": args.hw,
        "rows": [],
    }
    for name in args.configs:
        for t in args.tokens:
            try:
                result["rows"].append(measure(name, CONFIGS[name], t, dtype, args))
            except Exception as exc:  # one config's failure is recorded; the others still run
                result["rows"].append({"config": name, "tokens": t, "error": f"{type(exc).__name__}: {exc}"})
                print(f"{name} t={t}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            Path(args.out).write_text(json.dumps(result, indent=1))
    for r in result["rows"]:
        if "error" in r:
            print(f"{r['config']:10s} t={r['tokens']:5d}  error: {r['error'][:100]}")
            continue
        times = {k: r[k].get("median_s") for k in ("eager", "inductor", "gensorage") if k in r}
        print(
            f"{r['config']:10s} t={r['tokens']:5d}  "
            + "  ".join(f"{k} {v * 1e6:9.1f} us" if v else f"{k} -" for k, v in times.items())
            + (f"  gensorage err {max(r['gensorage']['rel_err']):.1e}" if "gensorage" in r else "")
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

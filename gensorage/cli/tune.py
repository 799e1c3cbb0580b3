"""``gensorage tune``: build a schedule for one operator, optionally emit its CUDA/TIR and check it on the CPU.

Examples::

    gensorage tune                                  # gemm 1024^3 float16 on h100 with the Markov construction
    gensorage tune M1 --method roller --json
    gensorage tune --op conv2d --shape N=1,C=64,H=56,W=56,F=64,KH=3,KW=3,padding=1 --dtype float32 --check
    gensorage tune --op gemm --shape M=512,N=512,K=512 --method optuna --trials 100 --emit cuda

Results go to stdout, progress and timings to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from gensorage.cli.argtypes import seed
from gensorage.errors import ConfigError, GensorageError

DEFAULT_SPEC: dict[str, Any] = {"op": "gemm", "M": 1024, "N": 1024, "K": 1024}
EMIT_CHOICES = ("cuda", "tir")
TRIAL_METHODS = ("optuna", "random")
EXIT_CHECK_FAILED = 1


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "tune",
        help="construct a schedule for one operator (and emit / check its kernel)",
        description="Construct a schedule for one operator on a hardware profile with the Markov construction "
        "or a baseline, lower it to TVM TIR / CUDA, optionally check it on the CPU. "
        "With no workload argument, tunes gemm M=N=K=1024.",
    )
    p.add_argument("config", nargs="?", metavar="CONFIG_ID", help="id of an op configuration (e.g. M1, C2)")
    p.add_argument("--op", help="operator name (gemm, gemv, batch_matmul, conv2d, avgpool2d)")
    p.add_argument("--shape", help="operator parameters, e.g. M=1024,N=1024,K=1024 (pairs as 2:1)")
    p.add_argument("--dtype", help="element type for --op (float16, bfloat16, float32; default float16)")
    p.add_argument("--hw", default="h100", help="hardware profile name or .toml path (default h100)")
    p.add_argument("--method", default="markov", help="markov | roller | optuna | random (default markov)")
    p.add_argument("--seed", type=seed, default=0, help="seed of the method (default 0)")
    p.add_argument("--trials", type=int, help="trials for optuna / random")
    p.add_argument("--emit", metavar="cuda|tir", help="print the CUDA source or the scheduled TIR")
    p.add_argument("--check", action="store_true", help="run the kernel on the CPU and compare with numpy")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--no-store", action="store_true", help="neither read nor write the result store")
    p.add_argument("--store", metavar="PATH", help="result store file (default $GENSORAGE_HOME/store.sqlite)")
    p.set_defaults(func=cmd_tune)


def parse_shape(text: str) -> dict[str, int | list[int]]:
    """``"M=1024,N=512"`` -> ``{"M": 1024, "N": 512}``; ``"stride=2:1"`` -> ``{"stride": [2, 1]}``."""
    out: dict[str, int | list[int]] = {}
    for item in text.split(","):
        name, sep, value = item.strip().partition("=")
        name = name.strip()
        try:
            if not sep or not name.isidentifier():
                raise ValueError(item)
            parts = [int(v) for v in value.split(":")]
            if len(parts) > 2:
                raise ValueError(item)
        except ValueError:
            raise ConfigError(
                f"--shape: expected NAME=INT[,NAME=INT...] (pairs as A:B), got {item.strip()!r}"
            ) from None
        if name in out:
            raise ConfigError(f"--shape: {name} given twice")
        out[name] = parts[0] if len(parts) == 1 else parts
    return out


def _workload(args: argparse.Namespace) -> Any:
    from gensorage.workloads import get_op_config, workload_from_spec

    if args.config is not None:
        if args.op or args.shape or args.dtype:
            raise GensorageError("give either CONFIG_ID or --op/--shape/--dtype, not both")
        return get_op_config(args.config)
    if args.shape and not args.op:
        raise GensorageError("--shape needs --op")
    if args.op is None:
        spec = dict(DEFAULT_SPEC)
    else:
        spec = {"op": args.op, **(parse_shape(args.shape) if args.shape else {})}
    if args.dtype is not None:
        spec["dtype"] = args.dtype
    return workload_from_spec(spec, where="--op/--shape" if args.op else "default workload")


def _options(args: argparse.Namespace) -> dict[str, Any]:
    from gensorage.tuning import method_names

    if args.method not in method_names():
        raise GensorageError(f"unknown method {args.method!r} (expected one of: {', '.join(method_names())})")
    if args.emit is not None and args.emit not in EMIT_CHOICES:
        raise GensorageError(f"--emit: expected one of {', '.join(EMIT_CHOICES)}, got {args.emit!r}")
    if args.trials is None:
        return {}
    if args.method not in TRIAL_METHODS:
        raise GensorageError(f"--trials applies to {' and '.join(TRIAL_METHODS)}, not {args.method}")
    if args.trials < 1:
        raise GensorageError(f"--trials must be >= 1, got {args.trials}")
    return {"trials": args.trials}


def cmd_tune(args: argparse.Namespace) -> int:
    from gensorage.tuning import check_tolerance, resolve_hw, tune

    opts = _options(args)
    wl = _workload(args)
    hw = resolve_hw(args.hw)
    _progress(f"tuning {wl.key()} on {hw.name} with {args.method} (seed {args.seed})")
    start = time.perf_counter()
    result = tune(wl, hw, args.method, args.seed, store=args.store, use_store=not args.no_store, **opts)
    _progress(
        f"schedule {'from store' if result.from_store else 'constructed'} in "
        f"{time.perf_counter() - start:.3f} s (method time {result.construction_time_s:.3f} s)"
    )
    data = result.to_json()
    if args.emit is not None:
        start = time.perf_counter()
        data[args.emit] = result.cuda_source() if args.emit == "cuda" else result.tir()
        _progress(f"lowered to {args.emit} in {time.perf_counter() - start:.3f} s")
    if args.check:
        start = time.perf_counter()
        err = result.check(raise_on_mismatch=False)
        tol = check_tolerance(wl.output.dtype)
        data["check"] = {"max_rel_error": err, "tolerance": tol, "ok": err <= tol}
        _progress(f"CPU check in {time.perf_counter() - start:.3f} s")
    _print(data, args)
    if args.check and not data["check"]["ok"]:
        print(
            f"gensorage: error: check failed: CPU result differs from the reference by "
            f"{data['check']['max_rel_error']:.3g} (tolerance {data['check']['tolerance']:.1g})",
            file=sys.stderr,
        )
        return EXIT_CHECK_FAILED
    return 0


def _progress(msg: str) -> None:
    print(f"gensorage tune: {msg}", file=sys.stderr, flush=True)


def _print(data: dict[str, Any], args: argparse.Namespace) -> None:
    if args.json:
        print(json.dumps(data, indent=2))
        return
    if args.emit is not None:
        print(data[args.emit])
        return
    s = data["schedule"]
    tflops = data["predicted_tflops"]
    rows = [
        ("workload", data["workload"]),
        ("hw", data["hw"]),
        (
            "method",
            f"{data['method']} (seed {data['seed']}"
            + "".join(f", {k}={v}" for k, v in data["options"].items())
            + ")",
        ),
        ("axes", " ".join(s["axes"])),
        ("T0 (registers)", " ".join(map(str, s["tiles"][0]))),
        ("T1 (block)", " ".join(map(str, s["tiles"][1]))),
        ("vthreads", " ".join(map(str, s["vthreads"]))),
        ("launch", f"{data['grid_blocks']} blocks x {data['threads_per_block']} threads"),
        (
            "predicted",
            f"{data['predicted_time_s'] * 1e6:.3f} us"
            + (f" ({tflops:.2f} TFLOP/s)" if tflops is not None else ""),
        ),
        (
            "construction",
            f"{data['construction_time_s']:.3f} s" + (" (stored)" if data["from_store"] else ""),
        ),
    ]
    if "check" in data:
        c = data["check"]
        rows.append(
            (
                "check",
                f"max rel error {c['max_rel_error']:.3g} (tolerance {c['tolerance']:.1g}) "
                + ("ok" if c["ok"] else "FAILED"),
            )
        )
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")

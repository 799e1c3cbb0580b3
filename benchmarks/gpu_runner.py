"""The device half of the GPU suite: run a bundle of prepared cubins on a CUDA GPU, check and time them.

``benchmarks/gpu_suite.py --prepare DIR`` (on a machine with TVM) writes the bundle (``benchmarks/gpu_bundle.py``:
``DIR/manifest.json`` and the cubins); this module, on the GPU machine, where TVM is absent, measures every
case and writes one JSON:

- correctness first: two fresh random draws, outputs and intermediates poisoned with NaN, ‖out − ref‖/‖ref‖
  against a float64 reference computed on the device; a case over 2e-2 (or NaN) is not timed;
- time: CUDA events around CUDA-graph replays (plain launches when capture fails, and the JSON says so), after
  a warm-up, cycling over enough copies of the inputs that L2 does not serve repeats; median, p10, p90 of
  ``SAMPLES`` samples, each lasting at least ``MIN_SAMPLE_S``;
- baselines checked and timed the same way: cuBLAS (``torch.matmul``) and ``torch.compile`` for GEMMs; torch
  eager (:func:`gensorage.baselines.torch_eager.torch_program`), ``torch.compile`` of it and, for attention
  programs, ``scaled_dot_product_attention``.

It imports no TVM and nothing of gensorage that does; torch and cupy are imported by :func:`run_bundle` and
passed to the helpers, so the inputs, reference, error, rotation and reporting helpers run (and are tested)
with a CPU-only torch. Call :func:`run_bundle`, or run ``python benchmarks/gpu_runner.py --bundle DIR --out FILE``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import git_commit, machine_info, progress, write_json  # noqa: E402
from benchmarks.gpu_bundle import (  # noqa: E402
    Case,
    ManifestError,
    allocate,
    draw_inputs,
    footprint,
    gemm_operands,
    load_case_program,
    one_line,
    parse_case,
    passes,
    poison,
    program_args,
    read_manifest,
    reference,
    rel_err,
)
from benchmarks.gpu_candidates import candidate_lines  # noqa: E402
from benchmarks.gpu_device import (  # noqa: E402
    Env,
    ceilings,
    device_facts,
    kernel_launches,
    kernel_times,
    load_kernels,
    ours,
    self_check,
    time_replays,
)
from gensorage.baselines.torch_eager import TorchArith, torch_program  # noqa: E402
from gensorage.program import Program  # noqa: E402

CHECK_DRAWS = 2
ROTATE_L2_FACTOR = 3  # inputs under this many L2 sizes are copied until the copies together reach it
MAX_COPIES = 256
COMPILE_RESERVE_S = 30.0  # torch.compile is tried only with this much time left (its compile is unbounded)
TIMING_RESERVE_S = 2.0
CASE_RESERVE_S = 5.0
BASELINE_LABELS = {
    "torch_matmul": "cuBLAS",
    "torch_conv2d": "cuDNN",
    "torch_eager": "eager",
    "torch_compile": "compile",
    "sdpa": "sdpa",
}
INPUTS_NOTE = (
    "standard normal drawn on the device (seeded torch.randn, Program.random_inputs' law); GEMM B / sqrt(K)"
)

Builder = Callable[[int], Callable[[], list[Any]]]  # copy index -> one run of the case on that copy's tensors


# -------------------------------------------------------------------------- tensors, inputs and references


def rotation_count(input_bytes: int, footprint_bytes: int, l2_bytes: int, memory_bytes: int) -> int:
    """Copies to cycle through so that no copy's inputs are still in L2 when it comes round again."""
    if input_bytes >= ROTATE_L2_FACTOR * l2_bytes:
        return 1
    want = math.ceil(ROTATE_L2_FACTOR * l2_bytes / max(input_bytes, 1))
    fits = memory_bytes // max(footprint_bytes, 1)
    return max(1, min(want, MAX_COPIES, fits))


# ------------------------------------------------------------------------------- methods: ours and baselines


def _library_baselines(
    env: Env,
    use_compile: bool,
    label: str,
    fn: Callable[[Any, Any], Any],
    operands: Callable[[int], tuple[Any, Any]],
) -> dict[str, Builder]:
    """The library call ``fn`` on copy ``i``'s two operands under ``label``, and ``torch.compile`` of it."""

    def builder(call: Callable[[Any, Any], Any]) -> Builder:
        def build(i: int) -> Callable[[], list[Any]]:
            x, y = operands(i)
            return lambda: [call(x, y)]

        return build

    methods = {label: builder(fn)}
    if use_compile:
        methods["torch_compile"] = builder(env.torch.compile(fn, dynamic=False))
    return methods


def gemm_baselines(env: Env, case: Case, sets: list[dict[str, Any]], use_compile: bool) -> dict[str, Builder]:
    """``torch.matmul`` (cuBLAS) on the case's A and B, and ``torch.compile`` of it."""
    torch = env.torch

    def matmul(a: Any, b: Any) -> Any:
        return torch.matmul(a, b)

    def operands(i: int) -> tuple[Any, Any]:
        return gemm_operands(case, *(sets[i][n] for n in case.inputs_order))

    return _library_baselines(env, use_compile, "torch_matmul", matmul, operands)


def conv_baselines(env: Env, case: Case, sets: list[dict[str, Any]], use_compile: bool) -> dict[str, Builder]:
    """``F.conv2d`` (cuDNN) on the case's X and W, and ``torch.compile`` of it."""
    torch = env.torch
    conv = case.raw["conv"]

    def conv2d(x: Any, w: Any) -> Any:
        return torch.nn.functional.conv2d(x, w, stride=conv["stride"], padding=conv["padding"])

    def operands(i: int) -> tuple[Any, Any]:
        x, w = (sets[i][n] for n in case.inputs_order)
        return x, w

    return _library_baselines(env, use_compile, "torch_conv2d", conv2d, operands)


def keys_last(program: Program) -> bool:
    """Whether K is [Hk, d, n] (the papers' form) rather than [Hk, n, d] transposed in the program (models')."""
    return not any(n.op is not None and n.op.value == "transpose" for n in program.nodes)


def sdpa_operands(program: Program) -> str | None:
    """Why the program's Q, K, V do not map onto SDPA (None when they do: Q [H,s,d], V [Hk,n,d], and K
    [Hk,d,n] or, when the program transposes it, [Hk,n,d])."""
    shapes = {t.name: t.shape for t in program.inputs}
    if sorted(shapes) != ["K", "Q", "V"] or any(len(s) != 3 for s in shapes.values()):
        return f"inputs {sorted(shapes)} are not Q, K, V of rank 3"
    (h, s, d), (hk, k1, k2), (hv, nv, dv) = shapes["Q"], shapes["K"], shapes["V"]
    dk, n = (k1, k2) if keys_last(program) else (k2, k1)
    if not (dk == dv == d and nv == n and hv == hk and h % hk == 0):
        return f"shapes Q {shapes['Q']}, K {shapes['K']}, V {shapes['V']} do not map onto SDPA's Q, K, V"
    if len(program.outputs) != 1 or program.outputs[0].shape != (h, s, d):
        return "the output is not one [H, s, d] tensor"
    return None


def sdpa_builder(env: Env, sets: list[dict[str, Any]], transpose_k: bool = True) -> Builder:
    """SDPA on the program's inputs as one batch of H heads; K [Hk,d,n] is transposed before the timed region."""
    torch = env.torch

    def build(i: int) -> Callable[[], list[Any]]:
        q, k, v = (sets[i][n] for n in ("Q", "K", "V"))
        if transpose_k:
            k = k.transpose(1, 2).contiguous()
        gqa = q.shape[0] != k.shape[0]  # enable_gqa maps head j to kv head j // (H / Hk): repeat_interleave
        sdpa = torch.nn.functional.scaled_dot_product_attention
        return lambda: [sdpa(q[None], k[None], v[None], enable_gqa=gqa)[0]]

    return build


def program_baselines(
    env: Env,
    case: Case,
    program: Program,
    sets: list[dict[str, Any]],
    use_compile: bool,
    notes: dict[str, Any],
) -> dict[str, Builder]:
    torch = env.torch

    def ordered(i: int) -> list[Any]:
        args = program_args(program, case, [sets[i][n] for n in case.inputs_order])
        return [args[t.name] for t in program.inputs] if isinstance(args, dict) else args

    def eager(i: int) -> Callable[[], list[Any]]:
        return torch_program(program, torch, ordered(i))

    methods: dict[str, Builder] = {"torch_eager": eager}
    if use_compile:
        compiled = torch.compile(lambda *xs: program.evaluate(TorchArith(torch), list(xs)), dynamic=False)

        def compiled_run(i: int) -> Callable[[], list[Any]]:
            xs = ordered(i)
            return lambda: compiled(*xs)

        methods["torch_compile"] = compiled_run
    if sorted(case.inputs_order) == ["K", "Q", "V"]:  # attention, whatever the program is called
        why = sdpa_operands(program)
        if why is None:
            methods["sdpa"] = sdpa_builder(env, sets, keys_last(program))
            notes["sdpa"] = (
                "K given as [Hk, n, d] (transposed outside the timed region); enable_gqa if Hk < H"
            )
        else:
            notes["sdpa_skipped"] = why
    return methods


def check_methods(
    env: Env, case: Case, program: Program | None, tensors: dict[str, Any], methods: dict[str, Builder]
) -> dict[str, dict[str, Any]]:
    """Each method run on ``CHECK_DRAWS`` fresh draws into copy 0 and compared with float64 (before timing)."""
    torch = env.torch
    recs: dict[str, dict[str, Any]] = {name: {"rel_err": []} for name in methods}
    for draw in range(CHECK_DRAWS):
        draw_inputs(torch, case, tensors, seed=draw)
        refs = reference(torch, case, program, [tensors[n] for n in case.inputs_order])
        for name, build in methods.items():
            rec = recs[name]
            if "error" in rec:
                continue
            try:
                poison(case, tensors)
                t0 = time.perf_counter()
                outs = build(0)()
                env.sync()
                rec.setdefault("first_call_s", time.perf_counter() - t0)  # torch.compile's compile time
                rec["rel_err"].append(rel_err(torch, outs, refs))
                rec["nan_elements"] = sum(int(torch.isnan(o).sum()) for o in outs if o.is_floating_point())
            except Exception as exc:
                rec["error"] = one_line(exc)
    for rec in recs.values():
        rec["ok"] = "error" not in rec and all(passes(e) for e in rec["rel_err"])
    return recs


# ----------------------------------------------------------------------------------------------- one case


@dataclass
class Deadline:
    end: float

    def left(self) -> float:
        return self.end - time.monotonic()


def case_header(case: Case) -> dict[str, Any]:
    raw = case.raw
    keys = (
        "name",
        "kind",
        "dtype",
        "gemm",
        "program",
        "predicted_s",
        "flops",
        "min_bytes",
        "meta",
        "candidate",
    )
    return {k: raw.get(k) for k in keys}


def case_methods(
    env: Env, case: Case, program: Program | None, sets: list[dict[str, Any]], rec: dict[str, Any]
) -> dict[str, Builder]:
    """Ours first, then the baselines; torch.compile only while its unbounded compile time still fits."""
    funcs = load_kernels(env, case)
    methods: dict[str, Builder] = {"ours": lambda i: ours(env, case, funcs, sets[i])}
    use_compile = env.use_compile and rec["deadline_left_s"] > COMPILE_RESERVE_S
    if env.use_compile and not use_compile:
        rec["torch_compile_skipped"] = "deadline"
    if case.kind == "conv":
        methods.update(conv_baselines(env, case, sets, use_compile))
    elif program is None:
        methods.update(gemm_baselines(env, case, sets, use_compile))
    else:
        methods.update(program_baselines(env, case, program, sets, use_compile, rec))
    return methods


def run_case(env: Env, case: Case, deadline: Deadline) -> dict[str, Any]:
    """Check then time our kernels and the baselines of one case; the record says what happened to each."""
    torch = env.torch
    rec = case_header(case) | {"status": "ok", "inputs": INPUTS_NOTE, "deadline_left_s": deadline.left()}
    torch._dynamo.reset()  # each case compiles afresh, under dynamo's recompile limit
    program = load_case_program(case)
    copies = rotation_count(case.input_bytes(), footprint(case), env.l2_bytes, env.memory_bytes)
    sets = [allocate(torch, case, env.device) for _ in range(copies)]
    for i, tensors in enumerate(sets):
        draw_inputs(torch, case, tensors, seed=100 + i)
    methods = case_methods(env, case, program, sets, rec)
    key = baseline_key(case)
    known = env.baselines.get(key, {})
    methods = {name: b for name, b in methods.items() if name not in known}
    rec["methods"] = check_methods(env, case, program, sets[0], methods)
    if not rec["methods"]["ours"]["ok"]:
        rec["status"] = "failed"
        return rec
    for name, build in methods.items():
        m = rec["methods"][name]
        if not m["ok"]:
            continue
        if deadline.left() < TIMING_RESERVE_S:
            m["skipped"] = "deadline"
            continue
        try:
            m.update(time_replays(torch, [build(i) for i in range(copies)]))
        except Exception as exc:
            m["error"] = one_line(exc)
    env.baselines[key] = known | {n: m for n, m in rec["methods"].items() if n != "ours"}
    rec["methods"] |= {n: m | {"reused": True} for n, m in known.items()}
    if env.per_kernel and program is not None and "median_s" in rec["methods"]["ours"]:
        if deadline.left() < TIMING_RESERVE_S * len(case.kernels):
            rec["kernels_skipped"] = "deadline"
        else:
            funcs = load_kernels(env, case)
            launch_sets = [kernel_launches(env, case, funcs, tensors) for tensors in sets]
            rec["kernels"] = kernel_records(case, kernel_times(torch, launch_sets))
    add_rates(rec)
    return rec


def kernel_records(case: Case, times: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each launch's own timing with its entry, the µGraph operator it belongs to (the bundle's
    ``meta.launch_ops``) and, on that operator's first launch, the model's time for the operator
    (``meta.op_predicted_s``; an operator's launches together stand against it)."""
    meta = case.raw.get("meta") or {}
    ops = meta.get("launch_ops") or [None] * len(case.kernels)
    predicted = meta.get("op_predicted_s") or []
    seen: set[int] = set()
    out = []
    for spec, op, timing in zip(case.kernels, ops, times, strict=True):
        rec = {"entry": spec.entry, "op": op} | timing
        if op is not None and op not in seen and op < len(predicted):
            rec["op_predicted_s"] = predicted[op]
            seen.add(op)
        out.append(rec)
    return out


def kernel_table(result: dict[str, Any]) -> str:
    """Per launch of every case timed kernel by kernel: measured and (per operator) predicted µs."""
    lines = []
    for c in result.get("cases", []):
        for k in c.get("kernels") or []:
            us = f"{k['median_s'] * 1e6:9.1f}" if "median_s" in k else f"{'-':>9}"
            pred = f"{k['op_predicted_s'] * 1e6:9.1f}" if "op_predicted_s" in k else f"{'':>9}"
            lines.append(f"{c['name'][:36]:<36} {k['entry'][:32]:<32} {us} {pred} {k.get('error', '')}")
    if not lines:
        return ""
    return "\n".join([f"{'case':<36} {'kernel':<32} {'ours_us':>9} {'pred_us':>9}", *lines])


def baseline_key(case: Case) -> str:
    """Cases with the same key compute the same function on the same shapes: their baselines are shared."""
    what = {"gemm": case.gemm, "program": case.program, "conv": case.raw.get("conv")}[case.kind]
    return f"{case.kind}:{sorted((what or {}).items())}:{case.dtype}"


def add_rates(rec: dict[str, Any]) -> None:
    """Speedups (baseline time / our time), achieved rates and predicted / measured."""
    ours_s = rec["methods"]["ours"].get("median_s")
    if not ours_s:
        return
    rec["speedup"] = {
        name: m["median_s"] / ours_s
        for name, m in rec["methods"].items()
        if name != "ours" and "median_s" in m
    }
    rec["ours_tflops"] = (rec.get("flops") or 0) / ours_s / 1e12
    rec["ours_gbps"] = (rec.get("min_bytes") or 0) / ours_s / 1e9
    if rec.get("predicted_s"):
        rec["predicted_over_measured"] = rec["predicted_s"] / ours_s


# ----------------------------------------------------------------------------------------- the whole run


def summary_table(result: dict[str, Any]) -> str:
    """A short fixed-width table: per case our time, error, and speedup over each baseline; geomeans last."""
    labels = list(BASELINE_LABELS)
    head = f"{'case':<44} {'status':<8} {'ours_us':>9} {'rel_err':>8} " + " ".join(
        f"{BASELINE_LABELS[b]:>8}" for b in labels
    )
    lines = [head]
    ratios: dict[str, list[float]] = {b: [] for b in labels}
    for c in result.get("cases", []):
        m = (c.get("methods") or {}).get("ours", {})
        errs = m.get("rel_err") or []
        us = f"{m['median_s'] * 1e6:9.1f}" if "median_s" in m else f"{'-':>9}"
        worst = math.nan if any(math.isnan(e) for e in errs) else max(errs, default=0.0)
        err = f"{worst:8.1e}" if errs else f"{'-':>8}"
        cols = []
        for b in labels:
            x = (c.get("speedup") or {}).get(b)
            cols.append(f"{x:7.2f}x" if x else f"{'-':>8}")
            if x:
                ratios[b].append(x)
        lines.append(f"{c['name'][:44]:<44} {c.get('status', '?'):<8} {us} {err} " + " ".join(cols))
    geo = [
        f"{BASELINE_LABELS[b]} {math.exp(statistics.fmean(map(math.log, r))):.2f}x"
        for b, r in ratios.items()
        if r
    ]
    lines.append("geomean speedup (baseline / ours): " + (", ".join(geo) or "none"))
    lines += candidate_lines(result.get("cases", []))
    if result.get("not_run"):
        lines.append(f"not run (deadline): {len(result['not_run'])} cases: {', '.join(result['not_run'])}")
    return "\n".join(lines)


def device_line(result: dict[str, Any]) -> str:
    """The GPU, its measured ceilings and the self-check, in one line above the table."""
    dev, ceil, check = result.get("device", {}), result.get("ceilings", {}), result.get("self_check", {})
    rates = f"copy {ceil.get('copy_gbps', 0):.0f} GB/s, fp16 matmul {ceil.get('matmul_fp16_tflops', 0):.0f} TFLOP/s"
    rates = f"ceilings failed: {ceil['error']}" if "error" in ceil else rates
    checked = "not run" if not check else ("ok" if check.get("ok") else f"FAILED {check}")
    return f"{dev.get('gpu')} ({dev.get('sm_count')} SMs, driver {dev.get('driver')}): {rates}; self-check {checked}"


def start_env(bundle_dir: Path, use_compile: bool, per_kernel: bool = False) -> Env:
    import cupy
    import numpy
    import torch

    props = torch.cuda.get_device_properties(0)
    free, _total = torch.cuda.mem_get_info()
    l2 = getattr(props, "L2_cache_size", 0) or 50 * 2**20
    env = Env(torch, cupy, numpy, Path(bundle_dir), "cuda", l2, free // 2, use_compile)
    env.per_kernel = per_kernel
    return env


def run_bundle(
    bundle_dir: Path | None,
    out: Path,
    deadline_s: float = 420.0,
    self_check_first: bool = True,
    use_compile: bool = True,
    only: list[str] | None = None,
    commit: str | None = None,
    per_kernel: bool = False,
) -> dict[str, Any]:
    """Measure every case of ``bundle_dir`` (None: only the self-check and the device facts) into ``out``;
    ``commit``: the commit of the code that runs (default: ``git rev-parse HEAD``, which on a lent machine is the
    checkout the session started from, not the tree that was sent); ``per_kernel``: also time each launch of a
    program case alone (``kernels`` in its record).

    The JSON is rewritten after every case, so a run cut short still leaves what it measured; cases past
    ``deadline_s`` (from the call) are listed under ``not_run``.
    """
    deadline = Deadline(time.monotonic() + deadline_s)
    manifest = read_manifest(bundle_dir) if bundle_dir is not None else {"prepared": {}, "cases": []}
    env = start_env(bundle_dir or Path("."), use_compile, per_kernel)
    result: dict[str, Any] = {"benchmark": "gpu_suite", "machine": machine_info(), "deadline_s": deadline_s}
    result["commit"] = {"prepared": manifest["prepared"].get("commit"), "runner": commit or git_commit()}
    result |= {"prepared": manifest["prepared"], "device": device_facts(env.torch, env.cupy)}
    if self_check_first:
        result["self_check"] = self_check(env)
        progress(f"self-check: {result['self_check']}")
    try:
        result["ceilings"] = ceilings(env.torch)
    except Exception as exc:
        result["ceilings"] = {"error": one_line(exc)}
    result |= {"cases": [], "not_run": []}
    for raw in manifest["cases"]:
        name = raw.get("name", "?") if isinstance(raw, dict) else "?"
        if only and not any(o in name for o in only):
            continue
        if deadline.left() <= CASE_RESERVE_S:
            result["not_run"].append(name)
            continue
        result["cases"].append(guarded_case(env, raw, deadline))
        result["elapsed_s"] = deadline_s - deadline.left()
        write_json(Path(out), result)
    write_json(Path(out), result)
    print(device_line(result))
    print(summary_table(result))
    if table := kernel_table(result):
        print(table)
    return result


def guarded_case(env: Env, raw: Any, deadline: Deadline) -> dict[str, Any]:
    """:func:`run_case` with any error recorded as one line; GPU memory is released after the case."""
    name = raw.get("name", "?") if isinstance(raw, dict) else "?"
    t0 = time.monotonic()
    try:
        rec = run_case(env, parse_case(raw, env.bundle_dir), deadline)
    except Exception as exc:
        rec = {"name": name, "status": "error", "error": one_line(exc)}
    rec["wall_s"] = time.monotonic() - t0
    try:
        env.torch.cuda.empty_cache()
    except Exception as exc:  # a kernel broke the context: later cases will say so too
        rec["after_case"] = one_line(exc)
    ours_rec = (rec.get("methods") or {}).get("ours", {})
    progress(
        f"{name}: {rec['status']} {ours_rec.get('median_s')} s, err {ours_rec.get('rel_err')}, {rec['wall_s']:.1f} s"
    )
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", type=Path, default=None, help="bundle folder (with manifest.json)")
    ap.add_argument("--out", type=Path, required=True, help="result JSON")
    ap.add_argument("--deadline-s", type=float, default=420.0, help="stop starting cases after this (s)")
    ap.add_argument("--self-check", action="store_true", help="check the launch path first (NVRTC kernel)")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile baselines")
    ap.add_argument("--only", nargs="*", default=None, help="run only cases whose name contains one of these")
    ap.add_argument("--per-kernel", action="store_true", help="also time each launch of a program case alone")
    args = ap.parse_args(argv)
    if args.bundle is None and not args.self_check:
        ap.error("give --bundle, --self-check, or both")
    try:
        run_bundle(
            args.bundle,
            args.out,
            args.deadline_s,
            args.self_check,
            not args.no_compile,
            args.only,
            per_kernel=args.per_kernel,
        )
    except ManifestError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

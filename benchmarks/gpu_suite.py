"""The GPU suite: every bundled program and the GEMM set against cuBLAS, torch eager and torch.compile.

Two halves, because the GPU machines have no TVM (see ``benchmarks/gpu_bundle.py``):

1. Here (TVM and nvcc, no GPU needed)::

       python benchmarks/gpu_suite.py --prepare gpu_bundle            # every case
       python benchmarks/gpu_suite.py --prepare gpu_bundle --gemms M1 --programs rmsnorm
       python benchmarks/gpu_suite.py --prepare gpu_bundle --gemms llama_qo_m128 --gemm-layouts nn nt \
           --constructed-only --convs none --programs                    # x @ W.T against cuBLAS NT
       python benchmarks/gpu_suite.py --prepare gpu_bundle --gemms --convs --programs fused_mha_prefill \
           --block-mma-warps 0e 0 4 8 4:128 8:256                       # warp layouts side by side
       python benchmarks/gpu_suite.py --prepare gpu_bundle --hw h200 --gemms none --convs none \
           --programs fused_gated_mlp fused_rmsnorm --block-stages 1 2 3   # software pipelining side by side
       python benchmarks/gpu_suite.py --prepare gpu_bundle --gemms none --convs none --programs gated_mlp \
           --candidates 3 --search-budget 60     # full mode's candidates (benchmarks/gpu_candidates.py)
       python benchmarks/gpu_suite.py --prepare gpu_bundle --hw h200 --gemms none --convs none \
           --programs gated_mlp mlp lora moe       # matmul epilogues fused, beside row fusion alone and per op
       python benchmarks/gpu_suite.py --prepare gpu_bundle --wgmma-only --wgmma-tma --gemms M1 M3 \
           --convs none --programs --dtypes float16   # TMA wgmma kernels beside the best cp.async ones

   writes ``gpu_bundle/manifest.json`` and one cubin (and its CUDA source) per case.
2. On the GPU machine (torch, CuPy; no TVM), in one call of at most 8 minutes::

       python3 benchmarks/gpu_suite.py --bundle gpu_bundle --out $OUT/gpu_suite.json

   checks every case against float64 on fresh inputs, then times it and its baselines with CUDA events over
   CUDA-graph replays, rotating inputs so L2 does not serve repeats (``benchmarks/gpu_runner.py``).

The JSON records the GPU, date and git commit; commit it under ``benchmarks/results/`` and update docs/gpu.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def prepare(args: argparse.Namespace) -> int:
    from benchmarks import gpu_convs, gpu_sweeps
    from benchmarks import gpu_prepare as gpu_bundle
    from benchmarks.common import machine_info
    from benchmarks.gpu_candidates import candidate_cases
    from gensorage.hw import load_profile
    from gensorage.superopt.row_fusion import fused_direct
    from gensorage.ugraph import from_program
    from gensorage.ugraph.optimize.fuse_rows import fuse_rows

    hw = load_profile(args.hw)
    out = Path(args.prepare)
    out.mkdir(parents=True, exist_ok=True)
    known = gpu_bundle.GEMMS | gpu_bundle.PREFILL_GEMMS
    gemms = {
        k: v
        for k, v in known.items()
        if k in (args.gemms or ()) or (args.gemms is None and k in gpu_bundle.GEMMS)
    }
    programs = args.programs if args.programs is not None else gpu_bundle.program_names()
    cases = []
    t0 = time.perf_counter()
    for dtype in args.dtypes if not args.wgmma_only else ():
        for layout in args.gemm_layouts:
            for name, dims in gemms.items():
                cases += gpu_bundle.gemm_cases(
                    hw,
                    out,
                    {name: dims},
                    dtype,
                    variants=not args.constructed_only,
                    searches=args.searches,
                    layout=layout,
                )
                print(
                    f"[{time.perf_counter() - t0:6.1f}s] gemm {name} {dtype} {layout}: {len(cases)} cases",
                    file=sys.stderr,
                )
    if args.wgmma_picks:
        from benchmarks import gpu_wgmma

        for dtype in args.dtypes:
            for layout in args.gemm_layouts:
                if layout == "nt":  # the smoke GEMMs check the K-major B layout one feature at a time
                    cases += gpu_wgmma.smoke_cases(hw, out, dtype, layout=layout)
                for name, dims in gemms.items():
                    cases += gpu_wgmma.wgmma_cases(
                        hw, out, {name: dims}, dtype, variants=(), tma=layout == "nn", layout=layout
                    )
        print(f"[{time.perf_counter() - t0:6.1f}s] wgmma picks: {len(cases)} cases", file=sys.stderr)
    if args.wgmma or args.wgmma_only:
        from benchmarks import gpu_wgmma

        for dtype in args.dtypes:
            smoke = gpu_wgmma.SMOKE_SHORT if args.wgmma_only else tuple(gpu_wgmma.SMOKE)
            variants = gpu_wgmma.WGMMA_VARIANTS
            if args.wgmma_tma:
                persistent = tuple(replace(t, persistent=hw.sm_count) for t in gpu_wgmma.TMA_PERSISTENT)
                smoke = gpu_wgmma.SMOKE_TMA
                variants = gpu_wgmma.WGMMA_BEST + gpu_wgmma.TMA_VARIANTS + persistent
            cases += gpu_wgmma.smoke_cases(hw, out, dtype, smoke)
            for name, dims in gemms.items():
                cases += gpu_wgmma.wgmma_cases(hw, out, {name: dims}, dtype, variants, args.wgmma_tma)
                print(
                    f"[{time.perf_counter() - t0:6.1f}s] wgmma {name} {dtype}: {len(cases)} cases",
                    file=sys.stderr,
                )
    convs = {k: v for k, v in gpu_bundle.CONVS.items() if args.convs is None or k in args.convs}
    for dtype in args.dtypes:
        cases += gpu_convs.conv_cases(hw, out, convs, dtype)
    print(f"[{time.perf_counter() - t0:6.1f}s] convs: {len(cases)} cases", file=sys.stderr)
    if args.split_sweep:
        shapes = {k: v for k, v in gpu_bundle.GEMMS.items() if k in args.split_sweep}
        shapes |= {s: gpu_bundle.EXTRA_GEMMS[s] for s in args.split_sweep if s in gpu_bundle.EXTRA_GEMMS}
        cases += gpu_sweeps.split_sweep_cases(hw, out, shapes)
        print(f"[{time.perf_counter() - t0:6.1f}s] split-k sweep: {len(cases)} cases", file=sys.stderr)
    if args.sweep:
        sweep = {k: v for k, v in gpu_bundle.GEMMS.items() if k in args.sweep}
        cases += gpu_sweeps.sweep_cases(hw, out, sweep)
        print(f"[{time.perf_counter() - t0:6.1f}s] sweep: {len(cases)} cases", file=sys.stderr)
    for name in programs:
        try:
            for precision in args.precisions:
                if args.candidates:
                    cases += candidate_cases(name, hw, out, args.candidates, args.search_budget, precision)
                    continue
                program, fused = gpu_bundle.load_program(name), gpu_bundle.load_ugraph(name)
                rows = None if fused is not None else fused_direct(program, precision, hw)
                # What users get: the direct µGraph after epilogue and row fusion; one kernel per op as
                # "_perop"; row fusion alone as "_rows" where the matmul epilogues changed it.
                cases.append(gpu_bundle.program_case(name, program, hw, out, precision, fused or rows))
                if rows is not None:
                    cases.append(gpu_bundle.program_case(name, program, hw, out, precision, label="_perop"))
                    direct = from_program(program, precision)
                    alone = fuse_rows(direct, hw)
                    if args.rows_alone and alone not in (rows, direct):
                        cases.append(
                            gpu_bundle.program_case(name, program, hw, out, precision, alone, label="_rows")
                        )
                for threads in args.row_threads if rows is not None else []:
                    cases.append(
                        gpu_bundle.program_case(name, program, hw, out, precision, rows, row_threads=threads)
                    )
                for stages in args.block_stages if fused is not None else []:
                    cases.append(
                        gpu_bundle.program_case(name, program, hw, out, precision, fused, stages=stages)
                    )
                for warps in args.block_mma_warps if fused is not None else []:
                    try:  # one layout's failure is recorded, the other layouts are still bundled
                        cases.append(gpu_bundle.program_case(name, program, hw, out, precision, fused, warps))
                    except Exception as exc:
                        print(
                            f"program {name} warps {warps}: not bundled: {type(exc).__name__}: {exc}",
                            file=sys.stderr,
                        )
        except Exception as exc:  # one program's failure is recorded, the bundle still gets the rest
            print(f"program {name}: not bundled: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        print(f"[{time.perf_counter() - t0:6.1f}s] program {name}", file=sys.stderr)
    info = machine_info()
    prepared = {"machine": info, "date": info.get("date"), "commit": info.get("git_commit"), "hw": args.hw}
    path = gpu_bundle.write_manifest(out, cases, prepared)
    print(f"{len(cases)} cases -> {path}")
    return 0


def run(args: argparse.Namespace) -> int:
    from benchmarks import gpu_runner

    gpu_runner.run_bundle(
        Path(args.bundle),
        Path(args.out),
        deadline_s=args.deadline,
        use_compile=not args.no_compile,
        only=args.only,
        commit=args.commit,
        per_kernel=args.per_kernel,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--prepare", metavar="DIR", help="build the bundle here (TVM + nvcc)")
    mode.add_argument("--bundle", metavar="DIR", help="measure a bundle on this machine's GPU")
    ap.add_argument("--out", default="gpu_suite.json", help="result JSON (with --bundle)")
    ap.add_argument("--deadline", type=float, default=420.0, help="seconds for all cases (with --bundle)")
    ap.add_argument(
        "--only", nargs="*", default=None, help="cases whose name contains one of these (with --bundle)"
    )
    ap.add_argument(
        "--no-compile", action="store_true", help="skip the torch.compile baselines (with --bundle)"
    )
    ap.add_argument(
        "--per-kernel",
        action="store_true",
        help="also time each launch of a program case alone, beside the model's time of its operator (with --bundle)",
    )
    ap.add_argument("--hw", default="h100", help="hardware profile (with --prepare)")
    ap.add_argument(
        "--commit",
        default=None,
        help="the commit of the tree sent to the device (with --bundle; its .git may be older)",
    )
    ap.add_argument(
        "--gemms", nargs="*", default=None, help="GEMM names (default: all; none when given without names)"
    )
    ap.add_argument(
        "--sweep", nargs="*", default=None, help="GEMM names to sweep many tilings of (with --prepare)"
    )
    ap.add_argument(
        "--programs",
        nargs="*",
        default=None,
        help="program names (default: all bundled, the attention programs' <name>_papers forms only when named)",
    )
    ap.add_argument(
        "--rows-alone",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also bundle each program with row fusion only (no matmul epilogues) as _rows",
    )
    ap.add_argument(
        "--dtypes", nargs="+", default=["float16", "bfloat16"], help="GEMM dtypes (with --prepare)"
    )
    ap.add_argument("--constructed-only", action="store_true", help="GEMMs: only the constructed tiling")
    ap.add_argument(
        "--gemm-layouts",
        nargs="+",
        choices=("nn", "nt"),
        default=["nn"],
        help="GEMMs: B as [K, N] (nn) and/or stored [N, K] and read in place (nt: x @ W.T, against cuBLAS NT)",
    )
    ap.add_argument(
        "--searches", action="store_true", help="GEMMs: also Optuna's and random search's tilings"
    )
    ap.add_argument(
        "--wgmma",
        action="store_true",
        help="GEMMs: also Hopper wgmma kernels (sm_90a) and the wgmma smoke GEMMs",
    )
    ap.add_argument(
        "--wgmma-picks",
        action="store_true",
        help="GEMMs: also the construction's wgmma pick where it picks wgmma, TMA kernels included (what a user's 2-D matmul runs)",
    )
    ap.add_argument(
        "--wgmma-only",
        action="store_true",
        help="GEMMs: only the wgmma kernels (no mma.sync or CUDA-core ones) and the short list of smoke GEMMs",
    )
    ap.add_argument(
        "--wgmma-tma",
        action="store_true",
        help="with --wgmma(-only): the warp-specialised TMA tilings beside the fastest cp.async ones, and the "
        "TMA smoke GEMMs",
    )
    ap.add_argument("--split-sweep", nargs="*", default=None, help="GEMM names to sweep split-k on")
    ap.add_argument(
        "--precisions",
        nargs="+",
        default=["float32"],
        help="programs: precision policies to bundle each under (float32, storage)",
    )
    ap.add_argument(
        "--convs",
        nargs="*",
        default=None,
        help="convolution names (default: Table IV's C1-C3; none when given without names)",
    )
    ap.add_argument(
        "--block-mma-warps",
        nargs="*",
        default=[],
        metavar="W[:T][e]",
        help="fused programs: also bundle each with its tensor-core block matmuls on W warps (0: all) of the "
        "planned block, or of a block of T threads; a trailing e: element-wise fragment and tile loads "
        "(no ldmatrix, no cp.async)",
    )
    ap.add_argument(
        "--block-stages",
        nargs="*",
        type=int,
        default=[],
        metavar="S",
        help="fused programs: also bundle each with its loops' cp.async tiles in S stages (1: not pipelined; "
        "the chosen stages are the plain case)",
    )
    ap.add_argument(
        "--row-threads",
        nargs="*",
        type=int,
        default=[],
        metavar="T",
        help="programs: also bundle each row-fused direct µGraph with its row kernels on T threads",
    )
    ap.add_argument(
        "--candidates",
        type=int,
        default=0,
        metavar="N",
        help="programs: full mode's top N candidates by the model, its choice and the direct µGraph (with --prepare)",
    )
    ap.add_argument(
        "--search-budget",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds of full mode's search per program (with --candidates)",
    )
    args = ap.parse_args(argv)
    return prepare(args) if args.prepare else run(args)


if __name__ == "__main__":
    raise SystemExit(main())

"""The CUDA build of a new sequence length, without a GPU (issue 24 item 4 on the GPU path).

The small decoder layer of the front end's tests (``tests/test_torch_frontend.py: DecoderLayer``, bfloat16) is
captured by ``gensorage.torch.compile`` on CPU tensors at each length (its Program only: nothing is built for the
capture), then one :class:`~gensorage.superopt.dispatch.Dispatcher` for ``--hw`` builds its CUDA kernels
(``kernels(program, "cuda")``) at the first length and then at each new one, in one process. Per length: the
dispatcher's ready time and parts (``lower``: the µGraph to TIR, construction and TVMScript parses included;
``build``: ``tvm.compile``), and, inside them, the time of the tensor-core construction, of TVMScript parses
and of the CUDA compiler. The last runs inside ``tvm.compile`` only where TVM has a CUDA runtime (a GPU
machine: NVRTC, one call for the module); without one TVM keeps the source, and ``--nvcc`` times nvcc on each
build's source instead (``nvcc_s``: the same shape of cost, not the device's time): for a tree with CUDA
compiled variants, the source of the variants that length compiled (none: 0 s), else the whole module (a
structure's first length: its own kernels, the generic variants being built in the background). Also per
length: ``builds`` (``tvm.compile`` calls before the length was served: on a GPU, CUDA compiler calls),
``missed`` (the kernels no compiled variant covered) and ``rebuild_wait_s`` (the background build of the
length's own kernels, waited for after the row's timings).

``--against DIR`` runs the same in processes importing ``DIR``'s ``gensorage`` (an older checkout), alternating
with this tree's, ``--repeats`` times each: paired under the same load. ``uptime`` is recorded with every run.

``--no-variants`` runs this tree's dispatcher without compiled variants (every length's whole module built, as
before the CUDA first tier): a baseline on a machine without another checkout.

``--config softmax`` runs attention's softmax alone (one head, float32) instead of a layer: lengths past
4,096 keys without a layer's check at that length; ``--config decode`` a decode step's softmax (8 heads, one
query over the keys).

Usage: ``python -m benchmarks.newlen_cuda [--lengths 128 200 300] [--config small|llama3_8b|softmax|decode]
[--against /work/main] [--repeats 2] [--nvcc] [--no-variants] [--out FILE]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
NAME = "newlen-cuda-build"

#: What the worker times inside a build: (module, function) -> step name.
STEPS = {
    ("gensorage.construction.tensor_core", "construct_predefined_matmul"): "tensor_core_construction",
    ("gensorage.codegen.script_templates", "parse_text"): "parse",
    ("tvm.support.nvcc", "compile_cuda"): "cuda_compiler",
}


def _timed(totals: dict[str, float], step: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    depth = [0]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if depth[0]:  # a recursive call is inside the outer one's time
            return fn(*args, **kwargs)
        depth[0] += 1
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            depth[0] -= 1
            totals[step] = totals.get(step, 0.0) + time.perf_counter() - t0

    return wrapper


def capture(lengths: list[int], config: str = "small") -> list[Any]:
    """The layer's Program at each length (``gensorage.torch.compile``'s capture; its subgraph stays in torch);
    ``config``: its widths (``benchmarks.torch_decoder.CONFIGS``), or ``softmax``: attention's softmax alone
    (one head, float32, as many queries as keys), for lengths past the first tier's 4,096 keys, or ``decode``:
    a decode step's (8 heads, float32, one query over the keys)."""
    if config in ("softmax", "decode"):
        from gensorage.program import Program

        def softmax(t: int) -> Any:
            p = Program(name="scores")
            shape = (1, t, t) if config == "softmax" else (8, 1, t)
            p.output(p.softmax(p.input("S", shape, "float32"), 2))
            return p

        return [softmax(t) for t in lengths]
    import torch
    import torch._dynamo
    from test_torch_frontend import DecoderLayer, rope

    import gensorage.torch as gtorch
    import gensorage.torch.subgraph as subgraph
    from benchmarks.torch_decoder import CONFIGS
    from gensorage.errors import GensorageError

    programs: list[Any] = []

    def record(program: Any, options: Any, device: Any = None) -> Any:
        programs.append(program)
        raise GensorageError("captured only")

    cfg = CONFIGS[config]
    torch.manual_seed(0)
    layer = DecoderLayer(**cfg).to(torch.bfloat16).eval()
    real = subgraph.compiled
    subgraph.compiled = record  # type: ignore[assignment]
    try:
        for t in lengths:
            torch._dynamo.reset()
            with torch.no_grad():
                x = 3.0 * torch.randn(1, t, cfg["hidden"], generator=torch.Generator().manual_seed(0))
                cos, sin = rope(t, cfg["hidden"] // cfg["heads"], torch.bfloat16)
                gtorch.compile(layer, hw="h200")(x.to(torch.bfloat16), cos, sin)
    finally:
        subgraph.compiled = real  # type: ignore[assignment]
    if len(programs) != len(lengths):
        raise SystemExit(f"expected one subgraph per length, captured {len(programs)}")
    return programs


def worker(
    lengths: list[int],
    hw_name: str,
    nvcc: bool = False,
    parts: list[int] | None = None,
    config: str = "small",
    variants: bool = True,
) -> dict[str, Any]:
    """One dispatcher's CUDA builds at ``lengths`` in order (the first: the structure's first shape); ``nvcc``:
    and nvcc's time on each build's CUDA source; ``parts``: :func:`split_compile` of the last one's."""
    import importlib

    import gensorage
    from gensorage.codegen.cuda_build import build_cubin
    from gensorage.codegen.wgmma import target_profile
    from gensorage.hw import load_profile
    from gensorage.superopt.dispatch import Dispatcher

    programs = capture(lengths, config)
    totals: dict[str, float] = {}
    for (module, fn), step in STEPS.items():
        mod = importlib.import_module(module)
        setattr(mod, fn, _timed(totals, step, getattr(mod, fn)))
    d = Dispatcher(load_profile(hw_name)) if variants else Dispatcher(load_profile(hw_name), symbolic=False)
    rows = []
    for t, p in zip(lengths, programs, strict=True):
        totals.clear()
        builds = d.stats.builds
        t0 = time.perf_counter()
        entry = d.kernels(p, "cuda")
        wall = time.perf_counter() - t0
        # this tree's compiled variants for CUDA (an older tree has none: it builds the whole module each time)
        variants = getattr(d, "_variants", {}).get("cuda")
        nvcc_s = None
        if nvcc:  # TVM here keeps the source (no CUDA runtime): nvcc on it stands in for the device's NVRTC
            kernels = entry.compiled.kernels("cuda")
            arch = target_profile(entry.compiled.hw, [k.rule for k in kernels]).arch
            built = variants.last_build if variants is not None else None
            t1 = time.perf_counter()
            if variants is None or (built is None and d.stats.builds > builds):  # the shape's own module
                build_cubin(entry.compiled.cuda_source(), arch)
            elif built is not None:  # the variants this length compiled, nothing else
                build_cubin(str(built.mod.imports[0].inspect_source()), arch)
            nvcc_s = time.perf_counter() - t1
        t1 = time.perf_counter()
        if hasattr(d, "wait_rebuilds"):  # the background build of the length's own kernels, not timed above
            d.wait_rebuilds()
        rebuild_wait = time.perf_counter() - t1
        rows.append(
            {
                "tokens": t,
                "wall_s": wall,
                "ready_s": entry.ready_s,
                "timings": dict(entry.timings),
                "steps_s": dict(totals),
                "nvcc_s": nvcc_s,
                "builds": d.stats.builds - builds,  # tvm.compile calls before the length was served
                "missed": list(variants.missed) if variants is not None else None,
                "rebuild_wait_s": rebuild_wait,
                "kernels": len(entry.compiled.kernels("cuda")),
                "method": entry.equivalence.method,
                "notes": list(entry.notes),
            }
        )
    split = None
    if parts:
        kernels = entry.compiled.kernels("cuda")
        arch = target_profile(entry.compiled.hw, [k.rule for k in kernels]).arch
        split = split_compile(entry.compiled.cuda_source(), arch, parts)
    return {"gensorage": str(Path(gensorage.__file__).parent), "rows": rows, "split_compile": split}


def _split_source(src: str) -> tuple[str, list[str]]:
    """TVM's CUDA module source as its preamble (without the kernels' forward declarations) and one text per
    kernel definition (what follows it up to the next one)."""
    lines = src.splitlines(keepends=True)
    kernel = [ln.startswith('extern "C" __global__') for ln in lines]
    heads = [i for i, ln in enumerate(lines) if kernel[i] and ln.rstrip().endswith("{")]
    pre = "".join(ln for ln, k in zip(lines[: heads[0]], kernel, strict=False) if not k)
    return pre, ["".join(lines[a:b]) for a, b in zip(heads, [*heads[1:], len(lines)], strict=True)]


def split_compile(src: str, arch: str, parts: list[int], repeats: int = 2) -> list[dict[str, Any]]:
    """The CUDA compiler TVM uses (``TVM_CUDA_COMPILE_MODE``: NVRTC by default, nvcc) on the whole module source,
    and on it split into ``k`` sources of every k-th kernel compiled by ``k`` threads at once: whether a split
    build would pay (it does if the compiler releases the GIL and its fixed cost per call is small)."""
    from concurrent.futures import ThreadPoolExecutor

    import tvm
    from tvm.support import nvcc as tvm_nvcc

    mode = os.environ.get("TVM_CUDA_COMPILE_MODE", "nvrtc").lower()
    pre, defs = _split_source(src)

    def compile_one(code: str) -> float:
        t0 = time.perf_counter()
        with tvm.target.Target({"kind": "cuda", "arch": arch}):
            tvm_nvcc.compile_cuda(code, target_format="cubin", arch=arch, compiler=mode)
        return time.perf_counter() - t0

    out = []
    for r in range(repeats):
        for k in [1, *parts] if r % 2 == 0 else [*parts, 1][::-1]:
            chunks = [src] if k == 1 else [pre + "".join(defs[j::k]) for j in range(k)]
            t0 = time.perf_counter()
            with ThreadPoolExecutor(len(chunks)) as pool:
                each = list(pool.map(compile_one, chunks))
            wall = time.perf_counter() - t0
            out.append({"parts": k, "compiler": mode, "wall_s": wall, "each_s": each, "uptime": _uptime()})
            print(f"split {k}: {wall:.2f}s (each {' '.join(f'{e:.2f}' for e in each)})", file=sys.stderr)
    return out


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def _run_side(
    tree: Path, lengths: list[int], hw: str, nvcc: bool, split: list[int], config: str, variants: bool = True
) -> dict[str, Any]:
    # the tree first; the rest of the caller's path stays (a GPU machine's TVM lives on it)
    env = dict(
        os.environ, PYTHONPATH=":".join([str(tree), str(tree / "tests"), os.environ.get("PYTHONPATH", "")])
    )
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--hw", hw, "--config", config]
    cmd += ["--lengths", *map(str, lengths), *(["--nvcc"] if nvcc else [])]
    cmd += ["--split", *map(str, split)] if split else []
    cmd += [] if variants else ["--no-variants"]
    before = _uptime()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise SystemExit(f"worker for {tree} failed:\n{proc.stderr[-3000:]}")
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"tree": str(tree), "uptime_before": before, "uptime_after": _uptime(), **got}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", nargs="+", type=int, default=[128, 200, 300])
    ap.add_argument("--hw", default="h200")
    ap.add_argument(
        "--config",
        default="small",
        help="the layer's widths (torch_decoder.CONFIGS), softmax or decode (see capture)",
    )
    ap.add_argument("--against", type=Path, default=None, help="an older checkout, run alternately")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--nvcc", action="store_true", help="time nvcc on each build's CUDA source too")
    ap.add_argument(
        "--split",
        nargs="*",
        type=int,
        default=[],
        metavar="K",
        help="split_compile of the last length's source",
    )
    ap.add_argument(
        "--no-variants",
        action="store_true",
        help="Dispatcher(symbolic=False): every length's whole module built (this tree's baseline)",
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(
            json.dumps(
                worker(args.lengths, args.hw, args.nvcc, args.split, args.config, not args.no_variants)
            )
        )
        return 0
    sys.path[:0] = [str(ROOT)]
    from benchmarks.common import machine_info, result_path, write_json

    runs = []
    for r in range(args.repeats):
        trees = [ROOT] if args.against is None else [ROOT, args.against]
        for tree in trees if r % 2 == 0 else trees[::-1]:
            run = _run_side(
                tree, args.lengths, args.hw, args.nvcc, args.split, args.config, not args.no_variants
            )
            run["side"] = "this" if tree == ROOT else "other"
            runs.append(run)
            for row in run["rows"]:
                steps = " ".join(f"{k} {v:.2f}" for k, v in row["steps_s"].items())
                print(
                    f"{run['side']:5} T={row['tokens']:4} ready {row['ready_s']:.2f}s "
                    f"lower {row['timings'].get('lower', 0):.2f} build {row['timings'].get('build', 0):.2f} "
                    f"nvcc {row['nvcc_s'] or 0:.2f} builds {row.get('builds')} "
                    f"missed {len(row['missed']) if row.get('missed') is not None else '-'} | {steps}",
                    flush=True,
                )
            print("  ", run["uptime_after"], flush=True)
    out = args.out or result_path(NAME)
    meta = {"machine": machine_info(), "hw": args.hw, "config": args.config, "lengths": args.lengths}
    meta["variants"] = not args.no_variants
    write_json(out, {**meta, "runs": runs})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

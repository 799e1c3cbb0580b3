"""The CUDA build of a new sequence length, without a GPU (issue 24 item 4 on the GPU path).

The small decoder layer of the front end's tests (``tests/test_torch_frontend.py: DecoderLayer``, bfloat16) is
captured by ``gensorage.torch.compile`` on CPU tensors at each length (its Program only: nothing is built for the
capture), then one :class:`~gensorage.superopt.dispatch.Dispatcher` for ``--hw`` builds its CUDA kernels
(``kernels(program, "cuda")``) at the first length and then at each new one, in one process. Per length: the
dispatcher's ready time and parts (``lower``: the µGraph to TIR, construction and TVMScript parses included;
``build``: ``tvm.compile``, its passes and the CUDA compiler), and, inside them, the time of the tensor-core
construction, of TVMScript parses and of the CUDA compiler (nvcc here: ``TVM_CUDA_COMPILE_MODE=nvcc``; the
device's NVRTC is faster per kernel but the same shape of cost).

``--against DIR`` runs the same in processes importing ``DIR``'s ``gensorage`` (an older checkout), alternating
with this tree's, ``--repeats`` times each: paired under the same load. ``uptime`` is recorded with every run.

Usage: ``python -m benchmarks.newlen_cuda [--lengths 128 200 300] [--against /work/main] [--repeats 2]
[--out FILE]``
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

os.environ.setdefault("TVM_CUDA_COMPILE_MODE", "nvcc")  # no NVRTC (cuda-bindings) here: TVM's nvcc path

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


def capture(lengths: list[int]) -> list[Any]:
    """The layer's Program at each length (``gensorage.torch.compile``'s capture; its subgraph stays in torch)."""
    import torch
    import torch._dynamo
    from test_torch_frontend import DecoderLayer, layer_inputs

    import gensorage.torch as gtorch
    import gensorage.torch.subgraph as subgraph
    from gensorage.errors import GensorageError

    programs: list[Any] = []

    def record(program: Any, options: Any, device: Any = None) -> Any:
        programs.append(program)
        raise GensorageError("captured only")

    torch.manual_seed(0)
    layer = DecoderLayer().to(torch.bfloat16).eval()
    real = subgraph.compiled
    subgraph.compiled = record  # type: ignore[assignment]
    try:
        for t in lengths:
            torch._dynamo.reset()
            with torch.no_grad():
                gtorch.compile(layer, hw="h200")(*layer_inputs(t, torch.bfloat16, 0))
    finally:
        subgraph.compiled = real  # type: ignore[assignment]
    if len(programs) != len(lengths):
        raise SystemExit(f"expected one subgraph per length, captured {len(programs)}")
    return programs


def worker(lengths: list[int], hw_name: str) -> dict[str, Any]:
    """One dispatcher's CUDA builds at ``lengths`` in order (the first: the structure's first shape)."""
    import importlib

    import gensorage
    from gensorage.hw import load_profile
    from gensorage.superopt.dispatch import Dispatcher

    programs = capture(lengths)
    totals: dict[str, float] = {}
    for (module, fn), step in STEPS.items():
        mod = importlib.import_module(module)
        setattr(mod, fn, _timed(totals, step, getattr(mod, fn)))
    d = Dispatcher(load_profile(hw_name))
    rows = []
    for t, p in zip(lengths, programs, strict=True):
        totals.clear()
        t0 = time.perf_counter()
        entry = d.kernels(p, "cuda")
        wall = time.perf_counter() - t0
        rows.append(
            {
                "tokens": t,
                "wall_s": wall,
                "ready_s": entry.ready_s,
                "timings": dict(entry.timings),
                "steps_s": dict(totals),
                "kernels": len(entry.compiled.kernels("cuda")),
                "method": entry.equivalence.method,
                "notes": list(entry.notes),
            }
        )
    return {"gensorage": str(Path(gensorage.__file__).parent), "rows": rows}


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def _run_side(tree: Path, lengths: list[int], hw: str) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=f"{tree}:{tree / 'tests'}")
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        "--hw",
        hw,
        "--lengths",
        *map(str, lengths),
    ]
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
    ap.add_argument("--against", type=Path, default=None, help="an older checkout, run alternately")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.lengths, args.hw)))
        return 0
    sys.path[:0] = [str(ROOT)]
    from benchmarks.common import machine_info, result_path, write_json

    runs = []
    for r in range(args.repeats):
        trees = [ROOT] if args.against is None else [ROOT, args.against]
        for tree in trees if r % 2 == 0 else trees[::-1]:
            run = _run_side(tree, args.lengths, args.hw)
            run["side"] = "this" if tree == ROOT else "other"
            runs.append(run)
            for row in run["rows"]:
                steps = " ".join(f"{k} {v:.2f}" for k, v in row["steps_s"].items())
                print(
                    f"{run['side']:5} T={row['tokens']:4} ready {row['ready_s']:.2f}s "
                    f"lower {row['timings'].get('lower', 0):.2f} build {row['timings'].get('build', 0):.2f} "
                    f"| {steps}",
                    flush=True,
                )
            print("  ", run["uptime_after"], flush=True)
    out = args.out or result_path(NAME)
    write_json(out, {"machine": machine_info(), "hw": args.hw, "lengths": args.lengths, "runs": runs})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What an early key could save at a new prefill length: per kernel of the small decoder layer, whether a compiled
variant already covers it and what its lowering cost.

The dispatcher finds a kernel's compiled variant (:mod:`gensorage.codegen.symbolic_kernels`) from the skeleton of
its lowered text, so a covered kernel is still emitted, parsed (or bound from its template) and, for a matmul,
constructed, scheduled and taken through TVM's block lowering. This script runs the layer through
``gensorage.torch.compile`` (static shapes, one process) at each length in turn and records, per kernel: its
emission (for a matmul: the construction and TVM's schedule primitives; 0 where memoised from a kernel of the
same shape), its parse, its block lowering, and whether a variant covered it before that length's build; per
length the sums over all kernels and over the covered ones (what skipping the covered kernels' lowering could
save at most), the lowering's total, the first call and the load average.

Usage: ``python -m benchmarks.covered_kernels [--lengths 8 12 20 33 34 57 100 200] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TVM_NUM_THREADS", "1")  # before TVM loads, as benchmarks.dispatch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine_info, progress, result_path, time_calls, write_json  # noqa: E402

NAME = "covered-kernels"


def run(lengths: list[int]) -> list[dict[str, Any]]:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from test_torch_frontend import DecoderLayer, layer_inputs

    import gensorage.torch as gtorch
    from gensorage.codegen import module, symbolic_kernels
    from gensorage.codegen.script_templates import skeleton

    emit: dict[str, float] = {}
    parse: dict[str, float] = {}
    lower: dict[str, float] = {}
    time_calls(module, "emit_graph_defined", emit, lambda *a, **k: k["name"])
    time_calls(module, "emit_predefined", emit, lambda *a, **k: k["name"])
    time_calls(module, "_parse", parse, lambda text, name: name)
    time_calls(module, "lower_ugraph", lower, lambda *a, **k: "total")
    kernels: list[dict[str, Any]] = []
    executable = symbolic_kernels.SymbolicKernels.executable

    def covered(self: Any, ks: Any) -> Any:
        """Per kernel, whether a variant covers it (asked before the build, as the real look-up asks)."""
        for kern in ks:
            t0 = time.perf_counter()
            free = symbolic_kernels._block_free(kern)  # memoised: the look-up below pays nothing again
            block = time.perf_counter() - t0
            body, values = skeleton(free.script, free.name)
            known = self._skeletons.get(body)
            hit = known is not None and any(v.matches(tuple(values)) for v in known.variants)
            kernels.append(
                {
                    "name": kern.name,
                    "scheduled": kern.grid is None,
                    "covered": hit,
                    "emit_ms": 1e3 * emit.get(kern.name, 0.0),
                    "parse_ms": 1e3 * parse.get(kern.name, 0.0),
                    "block_lowering_ms": 1e3 * block if kern.grid is None else 0.0,
                }
            )
        return executable(self, ks)

    symbolic_kernels.SymbolicKernels.executable = covered  # type: ignore[method-assign,assignment]
    torch.manual_seed(0)  # as benchmarks.dispatch
    layer = DecoderLayer().eval()
    compiled = gtorch.compile(layer)
    rows = []
    with torch.no_grad():
        for t in lengths:
            args = layer_inputs(t, torch.float32, seed=t)
            for d in (emit, parse, lower):
                d.clear()
            kernels.clear()
            load = os.getloadavg()[0]
            t0 = time.perf_counter()
            compiled(*args)
            first = time.perf_counter() - t0

            def total(rows: list[dict[str, Any]]) -> float:
                return sum(r["emit_ms"] + r["parse_ms"] + r["block_lowering_ms"] for r in rows)

            hit = [k for k in kernels if k["covered"]]
            row = {
                "size": t,
                "load_1min": load,
                "first_call_s": first,
                "lowering_ms": 1e3 * lower.get("total", 0.0),
                "kernels": len(kernels),
                "covered": len(hit),
                "covered_matmuls": sum(k["scheduled"] for k in hit),
                "matmuls": sum(k["scheduled"] for k in kernels),
                "kernel_lowering_ms": total(kernels),
                "covered_lowering_ms": total(hit),
                "covered_matmul_lowering_ms": total([k for k in hit if k["scheduled"]]),
                "per_kernel": list(kernels),
            }
            progress(
                f"{t}: first call {first:.2f} s, lowering {row['lowering_ms']:.0f} ms, covered "
                f"{len(hit)}/{len(kernels)} kernels ({row['covered_matmuls']}/{row['matmuls']} matmuls): "
                f"{row['covered_lowering_ms']:.0f} of {row['kernel_lowering_ms']:.0f} ms, load {load:.1f}"
            )
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[8, 12, 20, 33, 34, 57, 100, 200])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    info = machine_info()
    load_start = os.getloadavg()
    rows = run(args.lengths)
    out = args.out or result_path(NAME)
    loads = {"start": load_start, "end": os.getloadavg()}
    write_json(out, {"benchmark": NAME, "machine": info, "load_avg": loads, "lengths": rows})
    progress(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

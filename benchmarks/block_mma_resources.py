"""Resource report of the fused example kernels with their block matmuls on tensor cores (no GPU needed).

For every fused example µGraph (``gensorage.ugraph.examples``) at a small shape whose tiles fit m16n8k16 and at
the paper's shape, in float16 and bfloat16: the kernels' CUDA source from ``tvm.compile`` for sm_90, compiled by
nvcc; per kernel the block matmuls that took the tensor-core path (from the kernel's rule), the ``mma.sync``
instructions in its PTX by operand type, and ptxas's registers per thread, static shared memory (a kernel past
48 KiB of tiles has a dynamic arena instead, which ptxas does not see), stack frame and spills.

Writes ``benchmarks/results/block_mma_resources-<date>.json`` (or ``--out``). Usage:
``python -m benchmarks.block_mma_resources [--paper/--no-paper] [--out FILE]``
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine_info, progress, result_path, write_json  # noqa: E402
from gensorage.codegen.cuda_build import ptx_and_resources  # noqa: E402
from gensorage.codegen.module import compile_ugraph  # noqa: E402
from gensorage.hw import load_profile  # noqa: E402
from gensorage.ugraph.examples import EXAMPLES, ONLINE_EXAMPLES  # noqa: E402

NAME = "block_mma_resources"
DTYPES = ("float16", "bfloat16")
# Tiles that are whole m16n8k16 tiles (16 rows, 8 columns, 16 deep).
SMALL: dict[str, dict[str, int]] = {
    "gated_mlp": dict(m=16, k=64, n=48, blocks=3, forloop=2),
    "rmsnorm_matmul": dict(batch=16, hidden=64, out=48, blocks=3, forloop=2),
    "lora": dict(m=16, k=64, n=64, rank=16, n_blocks=2, m_blocks=1),
    "flash_attention": dict(heads=2, q_len=64, kv_len=64, head_dim=16, q_blocks=2, forloop=2),
    "flash_attention2": dict(heads=2, q_len=64, kv_len=64, head_dim=16, q_blocks=2, forloop=2),
    "qknorm_attention": dict(heads=2, q_len=64, kv_len=64, head_dim=16, q_blocks=2, forloop=2),
}
# The shapes of the Mirage paper's benchmarks (tests/test_codegen_ugraph.py's PAPER_SHAPES).
PAPER: dict[str, dict[str, int]] = {
    "gated_mlp": dict(m=8, k=4096, n=4096, blocks=64, forloop=64),
    "rmsnorm_matmul": dict(batch=8, hidden=4096, out=4096, blocks=64, forloop=64),
    "lora": dict(m=16, k=1024, n=4096, rank=16, n_blocks=256, m_blocks=1),
    "flash_attention": dict(heads=16, q_len=256, kv_len=1024, head_dim=64, q_blocks=4, forloop=16),
    "qknorm_attention": dict(heads=16, q_len=256, kv_len=1024, head_dim=64, q_blocks=4, forloop=16),
    "gqa": dict(
        kv_heads=8, group=8, q_len=1, kv_len=4096, head_dim=128, kv_splits=16, forloop=8, out_splits=2
    ),
    "flash_decoding": dict(heads=32, kv_len=4096, head_dim=128, splits=16, forloop=8),
}
_MMA = re.compile(r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.(\w+)\.")


def _entries(ptx: str) -> dict[str, str]:
    parts = re.split(r"\.visible \.entry (\w+)\(", ptx)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def report(name: str, shape: dict[str, int], dtype: str) -> dict[str, Any]:
    """One example at one shape and dtype: per kernel its rule, threads, MMAs in the PTX and resources."""
    hw = load_profile("h100")
    _, g = {**EXAMPLES, **ONLINE_EXAMPLES}[name](**shape, dtype=dtype)
    start = time.perf_counter()
    cg = compile_ugraph(g, hw, "cuda")
    built = ptx_and_resources(cg.cuda_source(), hw.arch)
    if built is None:
        raise SystemExit("nvcc not found: the resource report needs the CUDA toolkit")
    ptx, resources = built
    entries = _entries(ptx)
    kernels = []
    for k in cg.kernels("cuda"):
        entry = f"{k.name}_kernel"
        found = _MMA.findall(entries.get(entry, ""))
        res = resources[entry]
        kernels.append(
            {
                "kernel": k.name,
                "rule": k.rule,
                "threads": k.threads,
                "grid": list(k.grid),
                "block_matmuls_on_tensor_cores": len(
                    re.findall(r"block matmul #\d+ on tensor cores", k.rule)
                ),
                "mma_in_ptx": {t: found.count(t) for t in sorted(set(found))},
                "registers": res.registers,
                "static_shared_bytes": res.shared_bytes,
                "stack_bytes": res.stack_bytes,
                "spill_stores": res.spill_stores,
                "spill_loads": res.spill_loads,
            }
        )
    return {
        "example": name,
        "shape": shape,
        "dtype": dtype,
        "kernels": kernels,
        "build_s": round(time.perf_counter() - start, 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--paper", action=argparse.BooleanOptionalAction, default=True, help="also the paper shapes"
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    cases = [("small", n, s) for n, s in SMALL.items()]
    if args.paper:
        cases += [("paper", n, s) for n, s in PAPER.items()]
    rows = []
    for kind, name, shape in cases:
        for dtype in DTYPES:
            progress(f"{kind} {name} {dtype}")
            rows.append({"shapes": kind, **report(name, shape, dtype)})
    out = {"benchmark": NAME, "machine": machine_info(), "arch": load_profile("h100").arch, "results": rows}
    path = args.out or result_path(NAME)
    write_json(path, out)
    progress(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

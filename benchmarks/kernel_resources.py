"""What the bundled fused kernels use per block, from nvcc: registers, spills, static shared memory, and from the
emitted kernel: dynamic shared bytes (the arena) and barriers.

For every bundled example µGraph at the paper's shapes (float16, the H100 profile): the CUDA source of its
kernels is compiled by nvcc for sm_90 with ``-Xptxas -v``, whose report per kernel gives registers per thread,
spill stores and loads, static shared memory and stack; the block's shared bytes (static or dynamic, as TVM
lowers the kernel) and its ``__syncthreads`` count come from the emitted kernel. ``--before FILE`` embeds a
report written the same way by the code before a change (run this script from that checkout with
``--out FILE``) and adds the differences. No GPU is needed.

Writes ``benchmarks/results/kernel_resources-<date>.json`` (or ``--out``). Usage:
``python -m benchmarks.kernel_resources [--before FILE] [--out FILE] [--label TEXT]``
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine_info, progress, result_path, write_json  # noqa: E402

NAME = "kernel_resources"
ARCH = "sm_90"
PAPER_SHAPES: dict[str, dict[str, int]] = {
    "gated_mlp": dict(m=8, k=4096, n=4096, blocks=64, forloop=64),
    "rmsnorm_matmul": dict(batch=8, hidden=4096, out=4096, blocks=64, forloop=64),
    "lora": dict(m=16, k=1024, n=4096, rank=16, n_blocks=256, m_blocks=1),
    "flash_attention": dict(heads=16, q_len=256, kv_len=1024, head_dim=64, q_blocks=4, forloop=16),
    "gqa": dict(
        kv_heads=8, group=8, q_len=1, kv_len=4096, head_dim=128, kv_splits=16, forloop=8, out_splits=2
    ),
    "qknorm_attention": dict(heads=16, q_len=256, kv_len=1024, head_dim=64, q_blocks=4, forloop=16),
    "flash_decoding": dict(heads=32, kv_len=4096, head_dim=128, splits=16, forloop=8),
}
_PTXAS = {
    "registers": re.compile(r"Used (\d+) registers"),
    "spill_stores": re.compile(r"(\d+) bytes spill stores"),
    "spill_loads": re.compile(r"(\d+) bytes spill loads"),
    "static_smem": re.compile(r"(\d+) bytes smem"),
    "stack": re.compile(r"(\d+) bytes stack frame"),
}


def ptxas_report(src: str) -> dict[str, dict[str, int]]:
    """nvcc's ``-Xptxas -v`` numbers per kernel function of ``src`` (keyed by the function name)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise SystemExit("nvcc not found on PATH")
    with tempfile.TemporaryDirectory() as tmp:
        cu = Path(tmp) / "k.cu"
        cu.write_text(src, encoding="utf-8")
        proc = subprocess.run(
            [
                nvcc,
                "-cubin",
                f"-arch={ARCH}",
                "-O3",
                "-Xptxas",
                "-v",
                "-o",
                str(Path(tmp) / "k.cubin"),
                str(cu),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
    if proc.returncode != 0:
        raise SystemExit(f"nvcc failed: {proc.stderr.strip().splitlines()[-1]}")
    out: dict[str, dict[str, int]] = {}
    current = None
    for line in proc.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            current = m.group(1)
            out[current] = {}
            continue
        if current is None:
            continue
        for key, pat in _PTXAS.items():
            hit = pat.search(line)
            if hit:
                out[current][key] = int(hit.group(1))
    return out


def measure() -> dict[str, Any]:
    from gensorage.codegen.gpu_limits import block_resources
    from gensorage.codegen.module import compile_ugraph, ir_module
    from gensorage.hw import load_profile
    from gensorage.ugraph.examples import EXAMPLES

    hw = load_profile("h100")
    kernels: dict[str, Any] = {}
    for name, shape in PAPER_SHAPES.items():
        progress(f"{name} ...")
        _, g = EXAMPLES[name](**shape)
        cg = compile_ugraph(g, hw, "cuda")
        report = ptxas_report(cg.cuda_source())
        for k in cg.kernels("cuda"):
            if "_graph" not in k.name:
                continue  # the graph-defined (fused) kernels only
            nv = next((v for f, v in report.items() if k.name in f), {})
            kernels[f"{name}/{k.name}"] = {
                "shape": shape,
                "threads": k.threads,
                "shared_bytes": block_resources(ir_module([k])).shared_bytes,
                "dynamic_shared": "shared.dyn" in k.script,
                "barriers": k.script.count("tvm_storage_sync"),
                **nv,
            }
    return kernels


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, help="a report of the code before, to embed and compare")
    ap.add_argument("--label", default="", help="what this run is (kept in the JSON)")
    ap.add_argument(
        "--out", type=Path, help="output JSON (default benchmarks/results/kernel_resources-<date>.json)"
    )
    args = ap.parse_args(argv)
    data: dict[str, Any] = {
        "benchmark": NAME,
        "machine": machine_info(),
        "arch": ARCH,
        "hw_profile": "h100",
        "label": args.label,
        "kernels": measure(),
    }
    if args.before is not None:
        before = json.loads(args.before.read_text(encoding="utf-8"))
        data["before"] = {
            "machine": before["machine"],
            "label": before.get("label", ""),
            "kernels": before["kernels"],
        }
        data["change"] = {
            k: {
                f: v[f] - before["kernels"][k][f]
                for f in v
                if isinstance(v[f], int) and f in before["kernels"][k]
            }
            for k, v in data["kernels"].items()
            if k in before["kernels"]
        }
    out = args.out or result_path(NAME)
    write_json(out, data)
    progress(f"wrote {out}")


if __name__ == "__main__":
    main()

"""What the bundled fused kernels use per block, from nvcc and the emitted kernel (no GPU needed).

For every fused example µGraph (``gensorage.ugraph.examples``) at a small shape whose tiles are whole m16n8k16
tiles and at the paper's shape, in float16 and bfloat16, on the H100 profile: the kernels' CUDA source from
``tvm.compile`` is compiled by nvcc for the profile's arch (``codegen.cuda_build.ptx_and_resources``). Per
graph-defined (fused) kernel: ptxas's registers per thread, spills, stack frame and static shared memory (a
dynamic arena is not seen by ptxas); the ``mma.sync`` instructions in its PTX by operand type and the block
matmuls its rule put on tensor cores; the block's shared bytes as TVM lowers it (static or dynamic) and its
barriers (``__syncthreads`` in the kernel text, not executions). ``--before FILE`` embeds a report written the
same way by the code before a change (run this script from that checkout with ``--out FILE``) and adds the
differences. ``--epilogues`` reports instead the matmul kernels that run an epilogue
(:mod:`gensorage.ugraph.optimize.fuse_epilogues`) in the bundled matmul programs on the H200 profile, at
their own (decode) shapes and at 1,024 tokens: registers, spills, and the ``mma.sync`` / ``wgmma`` instructions
in their PTX.

Writes ``benchmarks/results/kernel_resources-<date>.json`` (or ``--out``). Usage:
``python -m benchmarks.kernel_resources [--paper/--no-paper] [--epilogues] [--before FILE] [--label TEXT] [--out FILE]``
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine_info, progress, result_path, write_json  # noqa: E402
from gensorage.codegen.cuda_build import ptx_and_resources  # noqa: E402
from gensorage.codegen.gpu_limits import block_resources  # noqa: E402
from gensorage.codegen.module import compile_ugraph, ir_module  # noqa: E402
from gensorage.codegen.wgmma import target_profile  # noqa: E402
from gensorage.hw import load_profile  # noqa: E402
from gensorage.ugraph.examples import EXAMPLES, ONLINE_EXAMPLES  # noqa: E402

NAME = "kernel_resources"
HW_PROFILE = "h100"
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
    """The PTX text of each kernel entry, keyed by its name."""
    parts = re.split(r"\.visible \.entry (\w+)\(", ptx)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def measure(name: str, shape: dict[str, int], dtype: str) -> dict[str, dict[str, Any]]:
    """One example at one shape and dtype: its fused kernels' resources, keyed by kernel name."""
    hw = load_profile(HW_PROFILE)
    _, g = {**EXAMPLES, **ONLINE_EXAMPLES}[name](**shape, dtype=dtype)
    cg = compile_ugraph(g, hw, "cuda")
    arch = target_profile(hw, [k.rule for k in cg.kernels("cuda")]).arch  # sm_90a with wgmma kernels
    built = ptx_and_resources(cg.cuda_source(), arch)
    if built is None:
        raise SystemExit("nvcc not found: the resource report needs the CUDA toolkit")
    ptx, resources = built
    entries = _entries(ptx)
    kernels: dict[str, dict[str, Any]] = {}
    for k in cg.kernels("cuda"):
        if "_graph" not in k.name:
            continue  # the graph-defined (fused) kernels only
        entry = f"{k.name}_kernel"
        found = _MMA.findall(entries.get(entry, ""))
        res = resources[entry]
        kernels[k.name] = {
            "rule": k.rule,
            "threads": k.threads,
            "grid": list(k.grid),
            "registers": res.registers,
            "spill_stores": res.spill_stores,
            "spill_loads": res.spill_loads,
            "stack_bytes": res.stack_bytes,
            "static_shared_bytes": res.shared_bytes,
            "shared_bytes": block_resources(ir_module([k])).shared_bytes,
            "dynamic_shared": "shared.dyn" in k.script,
            "barriers": k.script.count("tvm_storage_sync"),
            "block_matmuls_on_tensor_cores": len(re.findall(r"block matmul #\d+ on tensor cores", k.rule)),
            "mma_in_ptx": {t: found.count(t) for t in sorted(set(found))},
        }
    return kernels


#: Bundled programs whose matmuls take epilogues, and the token count of their prefill-sized variant.
EPILOGUE_PROGRAMS = ("gated_mlp", "mlp", "lora", "moe")
PREFILL_TOKENS = 1024
_WGMMA = re.compile(r"wgmma\.mma_async")


def measure_epilogues() -> dict[str, dict[str, Any]]:
    """Every matmul kernel with an epilogue of the bundled matmul programs (see the module docstring), keyed
    ``<program>/<tokens>/<dtype>/<kernel>``."""
    from gensorage.program.configs import config_dir
    from gensorage.program.text_format import parse_program
    from gensorage.ugraph import from_program
    from gensorage.ugraph.optimize.fuse_epilogues import fuse_epilogues, has_epilogue

    hw = load_profile("h200")
    out: dict[str, dict[str, Any]] = {}
    for name in EPILOGUE_PROGRAMS:
        for tokens in (None, PREFILL_TOKENS):
            for dtype in DTYPES:
                params = None if tokens is None else {"t": tokens}
                text = (config_dir() / f"{name}.gsp").read_text().replace("float16", dtype)
                program = parse_program(text, params=params)
                progress(f"epilogues {name} t={tokens or 'own'} {dtype}")
                cg = compile_ugraph(fuse_epilogues(from_program(program), hw), hw, "cuda")
                arch = target_profile(hw, [k.rule for k in cg.kernels("cuda")]).arch
                built = ptx_and_resources(cg.cuda_source(), arch)
                if built is None:
                    raise SystemExit("nvcc not found: the resource report needs the CUDA toolkit")
                ptx, resources = built
                for k in cg.kernels("cuda"):
                    if not has_epilogue(cg.ugraph.ops[k.op_index]):
                        continue
                    for entry, text in _entries(ptx).items():
                        if not entry.startswith(f"{k.name}_"):
                            continue
                        res = resources[entry]
                        out[f"{name}/{tokens or 'own'}/{dtype}/{entry}"] = {
                            "rule": k.rule,
                            "arch": arch,
                            "registers": res.registers,
                            "spill_stores": res.spill_stores,
                            "spill_loads": res.spill_loads,
                            "stack_bytes": res.stack_bytes,
                            "mma_sync_in_ptx": len(_MMA.findall(text)),
                            "wgmma_in_ptx": len(_WGMMA.findall(text)),
                        }
    return out


def measure_all(paper: bool) -> dict[str, dict[str, Any]]:
    """Every case, keyed ``<shapes>/<dtype>/<example>/<kernel>`` (``shapes`` is ``small`` or ``paper``)."""
    cases = [("small", n, s) for n, s in SMALL.items()]
    if paper:
        cases += [("paper", n, s) for n, s in PAPER.items()]
    out: dict[str, dict[str, Any]] = {}
    for kind, name, shape in cases:
        for dtype in DTYPES:
            progress(f"{kind} {name} {dtype}")
            for kernel, row in measure(name, shape, dtype).items():
                out[f"{kind}/{dtype}/{name}/{kernel}"] = {"shape": shape, **row}
    return out


def change(now: dict[str, dict[str, Any]], before: dict[str, dict[str, Any]]) -> dict[str, dict[str, int]]:
    """This run minus ``before``, per kernel both have and per integer field both have."""
    return {
        k: {f: v - before[k][f] for f, v in row.items() if type(v) is int and type(before[k].get(f)) is int}
        for k, row in now.items()
        if k in before
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--paper", action=argparse.BooleanOptionalAction, default=True, help="also the paper shapes"
    )
    ap.add_argument("--epilogues", action="store_true", help="the matmul kernels with epilogues instead")
    ap.add_argument("--before", type=Path, help="a report of the code before, to embed and compare")
    ap.add_argument("--label", default="", help="what this run is (kept in the JSON)")
    ap.add_argument(
        "--out", type=Path, help="output JSON (default benchmarks/results/kernel_resources-<date>.json)"
    )
    args = ap.parse_args(argv)
    data: dict[str, Any] = {
        "benchmark": NAME,
        "machine": machine_info(),
        "arch": load_profile(HW_PROFILE).arch,
        "hw_profile": HW_PROFILE,
        "label": args.label,
        "kernels": measure_epilogues() if args.epilogues else measure_all(args.paper),
    }
    if args.before is not None:
        before = json.loads(args.before.read_text(encoding="utf-8"))
        data["before"] = {k: before.get(k) for k in ("machine", "label", "kernels")}
        data["change"] = change(data["kernels"], before["kernels"])
    out = args.out or result_path(NAME)
    write_json(out, data)
    progress(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""New prefill lengths of the small decoder layer (or new key lengths of its KV-cache decode step, ``--decode``)
with and without tiered builds (or, with ``--against DIR``, this tree against another checkout), paired length by
length.

Two worker processes (``Dispatcher(tiered=True)`` and ``tiered=False`` behind ``gensorage.torch.compile``, each
with its own caches) take the same sequence of sequence lengths in lockstep: at each length one worker makes its
first call, then the other, the order alternating from length to length, so both sides of a pair run within
seconds of each other under the same load. Per length and side: the first call end to end (dynamo's capture,
lowering, build, the check against torch), the dispatcher's ready time and parts, the second call (the first
tier's kernels while their rebuild runs), the wait for the rebuild, and the steady state after it (the prepared
runner and its kernels launched directly, paired, as in :mod:`benchmarks.dispatch`). The first call's
``steps_s`` split it: ``capture`` (everything outside the subgraphs' first calls: dynamo's capture, AOTAutograd,
the partition), ``program`` (the subgraph lowered to a Program), ``dispatch`` (the dispatcher: ready),
``check`` (the kernels run on the call's inputs and compared with torch's outputs) and ``reference`` (the rest of
the subgraphs' first calls: torch running the subgraph).

``--against DIR`` compares this tree (side ``this``) with the ``gensorage`` of another checkout (side ``other``:
an older commit), both tiered: the workers are this file's, the other side imports ``DIR``'s package (and its
tests' models).

Usage: ``python -m benchmarks.dispatch_paired [--lengths 8 12 20 33 34 57 100] [--calls 300] [--dynamo-dynamic]
[--decode] [--against DIR] [--out FILE]`` (the first length is the structure's first: both sides superoptimise
there).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TVM_NUM_THREADS", "1")  # before TVM loads, as benchmarks.dispatch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import git_commit, machine_info, progress, result_path, time_calls, write_json  # noqa: E402

NAME = "dispatch-paired"
SIDES = ("tiered", "untiered")
TREES = ("this", "other")


def worker(tiered: bool, calls: int, dynamo_dynamic: bool, decode: bool, tree: Path | None = None) -> None:
    """Serve lengths read from stdin, one JSON row per length on stdout (``tree``: import its gensorage)."""
    root = tree or Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))  # before gensorage is imported
    import torch

    from benchmarks.dispatch import _compile, overhead_us

    sys.path.insert(0, str(root / "tests"))
    from test_torch_decode import DecodeStep, decode_inputs
    from test_torch_frontend import DecoderLayer, layer_inputs

    from gensorage.torch import subgraph

    assert Path(subgraph.__file__).resolve().is_relative_to(root.resolve()), subgraph.__file__
    steps: dict[str, float] = {}
    time_calls(subgraph.GensorageSubgraph, "_prepare", steps, "first_calls")
    for attr, label in (("lower", "program"), ("compiled", "dispatch")):
        time_calls(subgraph, attr, steps, label)
    for attr in ("run_kernels", "mismatch"):
        time_calls(subgraph, attr, steps, "check")

    torch.manual_seed(10 if decode else 0)  # as benchmarks.dispatch
    layer = (DecodeStep() if decode else DecoderLayer()).eval()
    make_inputs = decode_inputs if decode else layer_inputs
    compiled = _compile(layer, dynamo_dynamic)
    d = subgraph.dispatcher(subgraph.Options())
    d.tiered = tiered
    print("ready", flush=True)
    with torch.no_grad():
        for line in sys.stdin:
            t = int(line)
            args = make_inputs(t, torch.float32, seed=t)
            known = set(d._shapes)
            load = os.getloadavg()[0]
            steps.clear()
            t0 = time.perf_counter()
            got = compiled(*args)
            first = time.perf_counter() - t0
            split = dict(steps)
            first_calls = split.pop("first_calls", 0.0)
            split["capture"] = first - first_calls
            split["reference"] = first_calls - sum(
                split.get(k, 0.0) for k in ("program", "dispatch", "check")
            )
            t0 = time.perf_counter()
            compiled(*args)
            second = time.perf_counter() - t0
            t0 = time.perf_counter()
            d.wait_rebuilds()
            wait = time.perf_counter() - t0
            want = layer(*args)
            (entry,) = [d._shapes[k] for k in set(d._shapes) - known]
            row: dict[str, Any] = {
                "size": t,
                "load_1min": load,
                "first_call_s": first,
                "ready_s": entry.ready_s,
                "parts_s": dict(entry.timings),
                "steps_s": split,
                "second_call_s": second,
                "rebuild_wait_s": wait,
                "rel_err": max(
                    float((g - w).abs().max() / w.abs().max())
                    for g, w in zip(*((got, want) if decode else ((got,), (want,))), strict=True)
                ),
                "notes": list(entry.notes),
            }
            if entry.runner is not None:
                row.update(overhead_us(entry, calls))
            print(json.dumps(row), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", nargs="*", type=int, default=[8, 12, 20, 33, 34, 57, 100])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--dynamo-dynamic", action="store_true")
    ap.add_argument(
        "--decode", action="store_true", help="the KV-cache decode step at cache lengths --lengths"
    )
    ap.add_argument(
        "--against", type=Path, default=None, help="another checkout: this tree against its gensorage"
    )
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    ap.add_argument("--tree", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker == "tiered", args.calls, args.dynamo_dynamic, args.decode, args.tree)
        return 0
    load_before = os.getloadavg()
    sides = TREES if args.against else SIDES
    procs = {}
    for side in sides:
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.dispatch_paired",
            "--worker",
            "untiered" if side == "untiered" else "tiered",
            "--calls",
            str(args.calls),
        ]
        cmd += ["--tree", str(args.against)] if side == "other" else []
        cmd += ["--dynamo-dynamic"] if args.dynamo_dynamic else []
        cmd += ["--decode"] if args.decode else []
        procs[side] = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    for p in procs.values():  # both imported and compiled before the first length
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    rows: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for i, t in enumerate(args.lengths):
        for side in sides if i % 2 == 0 else sides[::-1]:
            p = procs[side]
            assert p.stdin is not None and p.stdout is not None
            p.stdin.write(f"{t}\n")
            p.stdin.flush()
            row = json.loads(p.stdout.readline())
            row["order"] = 0 if (side == sides[0]) == (i % 2 == 0) else 1
            rows[side].append(row)
            progress(f"{side} @ {t}: first call {row['first_call_s']:.2f} s (ready {row['ready_s']:.2f} s)")
    for p in procs.values():
        assert p.stdin is not None
        p.stdin.close()
        p.wait()
    data = {
        "benchmark": NAME,
        "machine": machine_info(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "tvm_num_threads": os.environ.get("TVM_NUM_THREADS"),
        "dynamo_dynamic": args.dynamo_dynamic,
        "program": "decode_step (torch, small, KV cache)" if args.decode else "decoder_layer (torch, small)",
        "lengths": args.lengths,
        "sides": list(sides),
        "other_tree": None
        if args.against is None
        else {"path": str(args.against), "git_commit": git_commit(args.against)},
        "results": rows,
    }
    out = args.out or result_path(NAME)
    write_json(out, data)
    progress(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

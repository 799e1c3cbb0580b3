"""A compiled model served at many sequence lengths: what grows with the number of lengths (issue 24, items 4-5).

The small decoder layer of the front end's tests (``tests/test_torch_frontend.py: DecoderLayer``) through
``gensorage.torch.compile`` on CPU tensors, called at lengths 1..N in a shuffled order, ``--rounds`` times (the
later rounds only meet lengths seen before). Every ``--every`` calls it records the process's resident memory
(VmRSS, after ``malloc_trim``) and glibc's heap in use, the shapes in the dispatcher's cache, the threads alive, the background builds
queued and done, and the wall time of that call. Before and after, the time of a repeated call at one length
(200 calls, after the background builds are done): dynamo checks its guards over one cache entry per length.
Records ``os.getloadavg()`` at each sample: the dev machine is shared.

Usage: ``python benchmarks/serving_growth.py --lengths 300 --rounds 2 --out serving_growth.json``
"""

from __future__ import annotations

import argparse
import ctypes
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import torch  # noqa: E402
from test_torch_frontend import DecoderLayer, layer_inputs  # noqa: E402

import gensorage.torch as gtorch  # noqa: E402
from benchmarks.common import machine_info, progress, result_path, write_json  # noqa: E402
from gensorage.codegen import library  # noqa: E402
from gensorage.torch import subgraph  # noqa: E402


def rss_mb() -> float:
    """Resident memory after handing freed heap pages back (glibc's ``malloc_trim``)."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/status") as fh:
        kb = next(int(ln.split()[1]) for ln in fh if ln.startswith("VmRSS"))
    return kb / 1024


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_size_t)
        for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()
    ]


def heap_used_mb() -> float:
    """glibc's heap in use (``mallinfo2``: every arena's allocated bytes, without the free chunks that a
    fragmented heap cannot hand back): native memory that live objects hold."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    return (info.uordblks + info.hblkhd) / 2**20


def state() -> dict[str, Any]:
    dispatchers = list(subgraph._DISPATCHERS.values())
    variants = [v for d in dispatchers for v in d._variants.values()]
    return {
        "rss_mb": round(rss_mb(), 1),
        "heap_used_mb": round(heap_used_mb(), 1),
        "shapes": sum(len(d) for d in dispatchers),
        "threads": threading.active_count(),
        "queued": sum(v._worker.queued for v in variants),
        "rebuilds": sum(v.rebuilds for v in variants),
        "rebuild_errors": sum(len(v.rebuild_errors) for v in variants),
        "load": os.getloadavg(),
    }


def repeated_us(compiled: Any, t: int, calls: int = 200) -> float:
    args = layer_inputs(t, torch.float32, seed=t)
    with torch.no_grad():
        for _ in range(20):
            compiled(*args)
        start = time.perf_counter()
        for _ in range(calls):
            compiled(*args)
    return (time.perf_counter() - start) / calls * 1e6


def wait_builds(timeout: float) -> float:
    start = time.perf_counter()
    for d in list(subgraph._DISPATCHERS.values()):
        d.wait_rebuilds(timeout)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--every", type=int, default=30)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--jit", action="store_true", help="each length's own kernels from LLVM's JIT (codegen.library)"
    )
    a = ap.parse_args()
    library.AS_LIBRARY = not a.jit
    torch.manual_seed(0)
    layer = DecoderLayer().eval()
    compiled = gtorch.compile(layer)
    out: dict[str, Any] = {"machine": machine_info(), "lengths": a.lengths, "rounds": a.rounds, "samples": []}
    out["as_library"] = library.AS_LIBRARY
    repeated_us(compiled, 7)
    wait_builds(600)
    out["repeated_us_one_length"] = repeated_us(compiled, 7)
    out["start"] = state()
    lengths = list(range(1, a.lengths + 1))
    rng = random.Random(0)
    t0 = time.perf_counter()
    with torch.no_grad():
        for r in range(a.rounds):
            rng.shuffle(lengths)
            for i, t in enumerate(lengths):
                args = layer_inputs(t, torch.float32, seed=t)
                start = time.perf_counter()
                compiled(*args)
                call_s = time.perf_counter() - start
                if (i + 1) % a.every == 0:
                    sample = {"round": r, "calls": i + 1, "length": t, "call_s": round(call_s, 4), **state()}
                    sample["elapsed_s"] = round(time.perf_counter() - t0, 1)
                    out["samples"].append(sample)
                    progress(str(sample))
    out["repeated_us_builds_running"] = repeated_us(compiled, 7)
    out["wait_builds_s"] = wait_builds(1800)
    out["repeated_us_all_lengths"] = repeated_us(compiled, 7)
    out["end"] = state()
    progress(str({k: v for k, v in out.items() if k not in ("machine", "samples")}))
    write_json(a.out or result_path("serving_growth"), out)


if __name__ == "__main__":
    main()

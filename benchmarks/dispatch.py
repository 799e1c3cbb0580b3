"""The per-shape dispatch cache (:mod:`gensorage.superopt.dispatch`): what a repeated shape and a new one cost.

For each program, at a first shape and then at new sequence lengths (or batch sizes) of the same structure:

* **new shape**: wall time from the request to built kernels (:attr:`ShapeKernels.ready_s`; a new structure
  runs :func:`~gensorage.superopt.superoptimize` fast mode, a new shape of a known one does not), with its
  parts (``lower``: the µGraph to TIR, each matmul's schedule constructed, at a new shape walked from the one
  built at the nearest shape seen; ``build``: TVM's compile and LLVM's code generation;
  ``reinstantiate``/``verify`` for a searched structure);
* **repeated shape**: the overhead of a call on top of the kernels: the prepared runner on torch CPU tensors
  (DLPack in, fresh torch outputs) minus the same compiled kernels launched directly on TVM tensors bound once,
  paired call by call, median of ``--calls`` pairs (CPU llvm kernels).

The kernels run on one thread (``TVM_NUM_THREADS=1``, set before TVM loads unless the caller set it): on a
shared machine a multi-threaded kernel's time varies by milliseconds, which would drown the overhead.

Whole layer: the small decoder layer of the front end's tests (``tests/test_torch_frontend.py``) through
``gensorage.torch.compile`` at ``--layer-lengths`` (the first call at each length end to end, with the
dispatcher's parts and the error against eager).

KV-cache decode: the same layer's decode step (``tests/test_torch_decode.py``) at ``--decode-pasts`` cache
lengths in order, a new key length each step, as decoding meets them.

``--no-tiered`` builds a new shape's kernels at the full LLVM level before serving it (the dispatcher's
``tiered=False``) instead of unoptimised first and again in the background; either way the steady state is timed
after the background rebuilds are in (``rebuild_wait_s``: how long the first call's end waited for them).

``--dynamo-dynamic`` compiles both with ``torch.compile(model, backend="gensorage")`` and dynamo's own
``dynamic`` setting instead (its recompile limits raised as ``gensorage.torch.compile`` raises them): from the
second new shape on, one graph with symbolic sizes, specialised at each call's shapes by the backend
(:mod:`gensorage.torch.per_shape`) instead of a capture per shape.

Programs: decoder-layer-like pieces built as Programs (RMSNorm + projection, SwiGLU MLP, causal-free GQA
attention at a few sequence lengths) and bundled programs at small shapes. Writes
``benchmarks/results/dispatch-<date>.json`` (or ``--out``). Usage:
``python -m benchmarks.dispatch [--calls 2000] [--out FILE]``
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TVM_NUM_THREADS", "1")  # before TVM loads (see the module docstring)

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine_info, progress, result_path, write_json  # noqa: E402
from gensorage.program import Program, load_config  # noqa: E402
from gensorage.superopt.dispatch import Dispatcher, ShapeKernels  # noqa: E402

NAME = "dispatch"
PAIRS_BUDGET_S = 15.0  # per shape: slow kernels are paired fewer times (at least 50)
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN = 256, 8, 2, 32, 512


@dataclasses.dataclass(frozen=True)
class Dims:
    """A decoder layer's widths (``TINY``: kernels of tens of µs, where the overhead is not lost in their noise)."""

    hidden: int = 256
    heads: int = 8
    kv_heads: int = 2
    head_dim: int = 32
    ffn: int = 512


LAYER, TINY = Dims(), Dims(hidden=32, heads=4, kv_heads=2, head_dim=8, ffn=64)


def rms_projection(t: int, dims: Dims = LAYER) -> Program:
    """The attention block's entry: RMSNorm (with its weight) and the q projection, LLaMA-style."""
    p = Program(name="rms_projection")
    x = p.input("X", (t, dims.hidden), "float32")
    g = p.input("G", (dims.hidden,), "float32")
    w = p.input("Wq", (dims.hidden, dims.heads * dims.head_dim), "float32")
    p.output(p.matmul(p.mul(p.rms_norm(x), g), w))
    return p


def swiglu(t: int, dims: Dims = LAYER) -> Program:
    p = Program(name="swiglu")
    x = p.input("X", (t, dims.hidden), "float32")
    w1 = p.input("Wgate", (dims.hidden, dims.ffn), "float32")
    w2 = p.input("Wup", (dims.hidden, dims.ffn), "float32")
    w3 = p.input("Wdown", (dims.ffn, dims.hidden), "float32")
    p.output(p.matmul(p.mul(p.silu(p.matmul(x, w1)), p.matmul(x, w2)), w3))
    return p


def gqa_attention(t: int, dims: Dims = LAYER) -> Program:
    """Softmax attention of ``t`` queries over ``t`` keys, key/value heads repeated to the query heads."""
    p = Program(name="gqa_attention")
    q = p.input("Q", (dims.heads, t, dims.head_dim), "float32")
    k = p.input("K", (dims.kv_heads, dims.head_dim, t), "float32")
    v = p.input("V", (dims.kv_heads, t, dims.head_dim), "float32")
    g = dims.heads // dims.kv_heads
    s = p.scale(p.matmul(q, p.repeat(k, 0, g)), dims.head_dim**-0.5)
    p.output(p.matmul(p.softmax(s, 2), p.repeat(v, 0, g)))
    return p


def tiny(make: Callable[[int, Dims], Program]) -> Callable[[int], Program]:
    return lambda t: make(t, TINY)


def bundled(name: str, key: str, **fixed: int) -> Callable[[int], Program]:
    def make(v: int) -> Program:
        return load_config(name, {**fixed, key: v})

    make.__name__ = name
    return make


CASES: list[tuple[str, Callable[[int], Program], tuple[int, ...]]] = [
    ("rms_projection (tiny)", tiny(rms_projection), (4, 6, 10)),
    ("swiglu (tiny)", tiny(swiglu), (4, 6, 10)),
    ("gqa_attention (tiny)", tiny(gqa_attention), (4, 6, 10)),
    ("rms_projection", rms_projection, (16, 24, 40)),
    ("swiglu", swiglu, (16, 24, 40)),
    ("gqa_attention", gqa_attention, (16, 24, 40)),
    ("mlp (bundled)", bundled("mlp", "t", k=64, f=128), (8, 16, 24)),
    ("rmsnorm (bundled)", bundled("rmsnorm", "b", h=64, d=128), (8, 16, 24)),
    ("gated_mlp (bundled)", bundled("gated_mlp", "t", k=64, f=128), (8, 16, 24)),
    ("mha_prefill (bundled)", bundled("mha_prefill", "s", h=4, n=32, d=16), (8, 16, 24)),
]


def _torch_inputs(p: Program, seed: int) -> list[Any]:
    import torch

    out = []
    for x in p.random_inputs(seed):
        t = torch.from_numpy(x.astype("float32")).to(getattr(torch, p.inputs[0].dtype))
        out.append(t.clone())  # torch-allocated: aligned as TVM requires (a numpy buffer may not be)
    return out


def overhead_us(entry: ShapeKernels, calls: int) -> dict[str, float]:
    """Median of paired (runner call, direct launch) times over ``calls`` pairs, in µs."""
    import torch
    import tvm

    runner = entry.runner
    assert runner is not None
    args = _torch_inputs(entry.program, 0)
    alloc: Callable[[tuple[int, ...], str], Any] = lambda s, d: torch.empty(s, dtype=getattr(torch, d))  # noqa: E731
    # The direct launch: the same compiled functions on TVM tensors bound once (what the runner calls).
    ins = [tvm.runtime.from_dlpack(a) for a in args]
    outs = [tvm.runtime.from_dlpack(alloc(s, d)) for s, d in runner.output_specs]
    bound = [(fn, [_resolve_fixed(a, ins, outs) for a in params]) for fn, params in runner._calls]

    def direct() -> None:
        for fn, a in bound:
            fn(*a)

    for _ in range(20):  # warm caches and the allocator
        runner(args, alloc)
        direct()
    t0 = time.perf_counter()
    direct()
    calls = max(50, min(calls, int(PAIRS_BUDGET_S / (2 * (time.perf_counter() - t0)))))
    gens, dirs, diffs = [], [], []
    for i in range(calls):  # the order alternates, so neither side always finds the other's data in cache
        first, second = (runner, direct) if i % 2 == 0 else (direct, runner)
        t0 = time.perf_counter_ns()
        first(args, alloc) if first is runner else first()  # type: ignore[call-arg]
        t1 = time.perf_counter_ns()
        second(args, alloc) if second is runner else second()  # type: ignore[call-arg]
        t2 = time.perf_counter_ns()
        g, k = ((t1 - t0), (t2 - t1)) if first is runner else ((t2 - t1), (t1 - t0))
        gens.append(g / 1e3)
        dirs.append(k / 1e3)
        diffs.append(gens[-1] - dirs[-1])
    return {
        "gensorage_call_us": statistics.median(gens),
        "kernels_direct_us": statistics.median(dirs),
        "overhead_us": statistics.median(diffs),  # median of the paired differences
        "overhead_min_us": min(gens) - min(dirs),  # least disturbed by other processes
        "calls": calls,
    }


def _wait_rebuilds(d: Dispatcher) -> float:
    """Wait for the dispatcher's background rebuilds (the steady state is timed on the full tier); the wait."""
    t0 = time.perf_counter()
    d.wait_rebuilds()
    return time.perf_counter() - t0


def _resolve_fixed(a: Any, ins: list[Any], outs: list[Any]) -> Any:
    from gensorage.codegen import runner as r

    return r._resolve(a, (ins, outs))


def run_case(
    label: str, make: Callable[[int], Program], sizes: tuple[int, ...], calls: int, tiered: bool = True
) -> dict[str, Any]:
    d = Dispatcher(use_store=False, tiered=tiered)
    shapes = []
    for v in sizes:
        p = make(v)
        t0 = time.perf_counter()
        entry = d.kernels(p)
        wall = time.perf_counter() - t0
        row: dict[str, Any] = {
            "size": v,
            "inputs": {t.name: list(t.shape) for t in p.inputs},
            "new_structure": not entry.reused,
            "ready_s": wall,
            "parts_s": dict(entry.timings),
            "origin": entry.origin,
            "kernels": entry.num_kernels,
            "verification": entry.equivalence.method,
        }
        t0 = time.perf_counter()
        assert d.kernels(make(v)) is entry
        row["repeat_lookup_s"] = time.perf_counter() - t0  # Program built and hashed, then a dict hit
        row["rebuild_wait_s"] = _wait_rebuilds(d)
        if entry.runner is not None:
            row.update(overhead_us(entry, calls))
        progress(
            f"{label} @ {v}: {row['ready_s']:.2f} s, overhead {row.get('overhead_us', float('nan')):.1f} µs"
        )
        shapes.append(row)
    new = [r["ready_s"] for r in shapes if not r["new_structure"]]
    return {
        "program": label,
        "shapes": shapes,
        "stats": dataclasses.asdict(d.stats),
        "new_shape_ready_s_median": statistics.median(new) if new else None,
        "overhead_us_median": statistics.median(r["overhead_us"] for r in shapes if "overhead_us" in r),
    }


LAYER_LABEL = "decoder_layer (torch, small)"


def _compile(model: Any, dynamo_dynamic: bool) -> Any:
    """``gensorage.torch.compile(model)`` (static shapes), or ``torch.compile(model, backend="gensorage")``."""
    import torch

    import gensorage.torch as gtorch

    if not dynamo_dynamic:
        return gtorch.compile(model)
    torch._dynamo.config.recompile_limit = gtorch.RECOMPILE_LIMIT
    torch._dynamo.config.accumulated_recompile_limit = gtorch.RECOMPILE_LIMIT
    return torch.compile(model, backend="gensorage")


def run_layer(
    lengths: tuple[int, ...], calls: int, dynamo_dynamic: bool = False, tiered: bool = True
) -> dict[str, Any]:
    """The small LLaMA-style decoder layer of the front end's tests through ``gensorage.torch.compile`` on CPU
    tensors, float32: the first call at each sequence length end to end (dynamo's capture at that shape, the
    lowering to a Program, the dispatcher's build, the check against torch), its dispatcher entry's parts, the
    error against eager, and the repeated shape's overhead on the entry's runner."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from test_torch_frontend import DecoderLayer, layer_inputs

    from gensorage.torch import subgraph

    torch.manual_seed(0)
    layer = DecoderLayer().eval()
    compiled = _compile(layer, dynamo_dynamic)
    d = subgraph.dispatcher(subgraph.Options())
    d.tiered = tiered  # before its first build: the variants are made with it
    shapes = []
    with torch.no_grad():
        for t in lengths:
            args = layer_inputs(t, torch.float32, seed=t)
            known = set(d._shapes)
            t0, c0 = time.perf_counter(), time.process_time()
            got = compiled(*args)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            want = layer(*args)
            (entry,) = [d._shapes[k] for k in set(d._shapes) - known]
            row: dict[str, Any] = {
                "size": t,
                "new_structure": not entry.reused,
                "first_call_s": wall,  # what the user waits: capture, lowering, build, check
                "first_call_cpu_s": cpu,  # this process's CPU time for it: what other processes' load leaves alone
                "ready_s": entry.ready_s,  # the dispatcher's part
                "parts_s": dict(entry.timings),
                "kernels": entry.num_kernels,
                "verification": entry.equivalence.method,
                "rel_err": float((got - want).abs().max() / want.abs().max()),
                "notes": list(entry.notes),
            }
            t0 = time.perf_counter()
            again = compiled(*args)  # the second call: still the first tier's kernels, unless rebuilt already
            row["second_call_s"] = time.perf_counter() - t0
            row["second_rel_err"] = float((again - want).abs().max() / want.abs().max())
            row["rebuild_wait_s"] = _wait_rebuilds(d)
            if entry.runner is not None:
                row.update(overhead_us(entry, calls))
            progress(f"{LAYER_LABEL} @ {t}: first call {wall:.2f} s (ready {entry.ready_s:.2f} s)")
            shapes.append(row)
    new = [r for r in shapes if not r["new_structure"]]
    return {
        "program": LAYER_LABEL,
        "shapes": shapes,
        "stats": dataclasses.asdict(d.stats),
        "new_shape_first_call_s_median": statistics.median(r["first_call_s"] for r in new) if new else None,
        "new_shape_first_call_cpu_s_median": statistics.median(r["first_call_cpu_s"] for r in new)
        if new
        else None,
        "new_shape_ready_s_median": statistics.median(r["ready_s"] for r in new) if new else None,
        "overhead_us_median": statistics.median(r["overhead_us"] for r in shapes if "overhead_us" in r),
    }


DECODE_LABEL = "decode_step (torch, small, KV cache)"


def run_decode(
    pasts: tuple[int, ...], calls: int, dynamo_dynamic: bool = False, tiered: bool = True
) -> dict[str, Any]:
    """The small layer's KV-cache decode step (``tests/test_torch_decode.py``) through ``gensorage.torch.compile``
    at cache lengths ``pasts`` in order, as decoding meets them (a new key length each step): the first call at
    each length end to end, the dispatcher's part and builds, and the error against eager."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from test_torch_decode import DecodeStep, decode_inputs

    from gensorage.torch import subgraph

    torch.manual_seed(10)
    step = DecodeStep().eval()
    compiled = _compile(step, dynamo_dynamic)
    d = subgraph.dispatcher(subgraph.Options())
    d.tiered = tiered  # before its first build: the variants are made with it
    shapes = []
    with torch.no_grad():
        for past in pasts:
            args = decode_inputs(past, torch.float32, seed=past)
            known, builds = set(d._shapes), getattr(d.stats, "builds", None)
            t0, c0 = time.perf_counter(), time.process_time()
            got = compiled(*args)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            want = step(*args)
            (entry,) = [d._shapes[k] for k in set(d._shapes) - known]
            row: dict[str, Any] = {
                "size": past,
                "new_structure": not entry.reused,
                "first_call_s": wall,
                "first_call_cpu_s": cpu,
                "ready_s": entry.ready_s,
                "parts_s": dict(entry.timings),
                "builds": None if builds is None else d.stats.builds - builds,
                "rel_err": max(
                    float((g - w).abs().max() / w.abs().max()) for g, w in zip(got, want, strict=True)
                ),
            }
            row["rebuild_wait_s"] = _wait_rebuilds(d)
            if entry.runner is not None and calls:
                row.update(overhead_us(entry, calls))
            progress(f"{DECODE_LABEL} @ {past}: first call {wall:.2f} s (ready {entry.ready_s:.2f} s)")
            shapes.append(row)
    new = [r for r in shapes if not r["new_structure"]]
    return {
        "program": DECODE_LABEL,
        "shapes": shapes,
        "stats": dataclasses.asdict(d.stats),
        "new_shape_first_call_s_median": statistics.median(r["first_call_s"] for r in new) if new else None,
        "new_shape_first_call_cpu_s_median": statistics.median(r["first_call_cpu_s"] for r in new)
        if new
        else None,
        "new_shape_ready_s_median": statistics.median(r["ready_s"] for r in new) if new else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000, help="paired calls per shape for the overhead")
    ap.add_argument("--only", nargs="*", help="labels to run (default: all)")
    ap.add_argument(
        "--layer-lengths",
        nargs="*",
        type=int,
        default=[8, 12, 20, 33, 34],
        help=f"sequence lengths of the {LAYER_LABEL!r} row, the first one new (needs torch; none: no row)",
    )
    ap.add_argument(
        "--decode-pasts",
        nargs="*",
        type=int,
        default=list(range(8, 24)),
        help=f"cache lengths of the {DECODE_LABEL!r} row in order (needs torch; none: no row)",
    )
    ap.add_argument(
        "--dynamo-dynamic",
        action="store_true",
        help='the layer and decode rows through torch.compile(backend="gensorage") with dynamo\'s dynamic shapes',
    )
    ap.add_argument(
        "--no-tiered",
        action="store_true",
        help="build new shapes' kernels at the full LLVM level before serving them (Dispatcher(tiered=False))",
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    load_before = os.getloadavg()
    results = [
        run_case(lbl, mk, sz, args.calls, not args.no_tiered)
        for lbl, mk, sz in CASES
        if not args.only or lbl in args.only
    ]
    if args.layer_lengths and (not args.only or LAYER_LABEL in args.only):
        results.append(
            run_layer(tuple(args.layer_lengths), args.calls, args.dynamo_dynamic, not args.no_tiered)
        )
    if args.decode_pasts and (not args.only or DECODE_LABEL in args.only):
        results.append(
            run_decode(
                tuple(args.decode_pasts), min(args.calls, 200), args.dynamo_dynamic, not args.no_tiered
            )
        )
    data = {
        "benchmark": NAME,
        "machine": machine_info(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "wall_s": time.perf_counter() - t0,
        "tvm_num_threads": os.environ.get("TVM_NUM_THREADS"),
        "goals": {"overhead_us": 50, "new_shape_ready_s": 1.0},
        "dynamo_dynamic": args.dynamo_dynamic,
        "tiered": not args.no_tiered,
        "results": results,
    }
    out = args.out or result_path(NAME)
    write_json(out, data)
    progress(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

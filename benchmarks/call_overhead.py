"""A repeated shape's overhead per call through the PyTorch front end, on top of the kernels, layer by layer.

Overhead is ``(the gensorage call's time) - (its kernels' own time)``, both measured the same way: the kernels'
time is the same compiled functions launched directly, in the same order, on TVM tensors bound once to the
call's own arrays (no checks, no allocation, no DLPack). Each call is timed with ``time.perf_counter_ns`` (and
the thread's CPU time, which other processes do not inflate), ``--calls`` times per level after a warm-up, in
blocks of 50 repeated calls (a repeated shape: the same call again and again), the levels' blocks taking turns
in rotating order so that the machine's drift reaches them alike. Reported: each level's median and 10th/90th
percentiles over its calls; each difference as the difference of the medians and, round by round, of the
blocks' medians (10th/90th percentiles over the rounds). A shorter run interleaves the levels call by call
(each call after another level's, on caches the other filled), which is what a call costs amid other work.
The levels, outermost first:

* ``call``: the compiled model (``gensorage.torch.compile``, static shapes; or ``torch.compile(model,
  backend="gensorage")`` with dynamo's dynamic shapes, ``--modes dynamic``): dynamo's guards, AOTAutograd's
  wrapper, the partitioned graph, each gensorage subgraph;
* ``graph``: the partitioned graph's ``forward`` (the FX code that calls the subgraphs and any torch ops left
  around them) on the arguments it was called with: ``call - graph`` is torch's own share (dynamo's frame
  evaluation and guards, AOTAutograd's runtime wrapper; a per-shape graph's lookup) and ``Compiled``'s frame;
* ``subgraph``: the gensorage subgraph modules on the arguments they were called with (``nn.Module.__call__``,
  the shape guard, :func:`gensorage.torch.subgraph.run_kernels`);
* ``run_kernels``: dtype casts, alignment, the runner, output strides;
* ``runner``: :class:`gensorage.codegen.runner.KernelRunner`'s call (checks, output allocation, DLPack, the
  launch loop);
* ``kernels``: the direct launches; ``kernels_unbound``: the same with compiled variants' scalar arguments
  passed explicitly instead of through ``functools.partial`` (what the variants' scalars cost).

The reference is torch eager on the same module and arguments (``eager``, torch on one thread as the kernels):
its own per-call overhead is its call's median less its kernels' own time, the self time of the aten ops that
call no other op as torch's profiler records them over ``--calls`` / 10 calls (a replay of those ops from Python
would not do: each op called from Python costs more dispatch than eager's C++ composites pay). ``dynamo_eager``
is the same module through ``torch.compile(backend="eager")`` (dynamo's capture run by torch, static or dynamic
as the row): ``dynamo_eager - eager`` is what dynamo's own machinery (guards, frame evaluation, the captured
graph's call) costs a call whatever the backend.

The garbage collector is disabled while timing: its pauses are triggered by the allocations of every level
together and land on whichever call crosses its threshold. Each row records what a collection found after
the timed calls (the calls make no reference cycles when it is 0, so disabling it hides no cost of theirs)
and the call's median with the collector enabled over a shorter run.

The kernels run on one thread (``TVM_NUM_THREADS=1``, set before TVM loads): a multi-threaded kernel's time on a
shared machine varies by milliseconds. Writes ``benchmarks/results/call_overhead-<date>.json`` (or ``--out``).
Usage: ``python -m benchmarks.call_overhead [--calls 2000] [--modes static dynamic] [--lengths-seen 1 10 50 200]
[--out FILE]``
"""

from __future__ import annotations

import argparse
import functools
import gc
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

NAME = "call_overhead"
LEVELS = (
    "call",
    "graph",
    "subgraph",
    "run_kernels",
    "runner",
    "kernels",
    "kernels_unbound",
    "eager",
    "dynamo_eager",
)
#: Paired differences reported: (name, outer level, inner level).
DIFFERENCES = (
    ("overhead", "call", "kernels"),  # the goal's overhead
    ("dynamo_and_graph", "call", "subgraph"),
    ("dynamo_and_aot", "call", "graph"),  # torch's own share, and Compiled's frame
    ("graph_code", "graph", "subgraph"),  # the partitioned graph's FX code and the torch ops left in it
    ("subgraph_module", "subgraph", "run_kernels"),
    ("run_kernels_glue", "run_kernels", "runner"),
    ("runner", "runner", "kernels"),
    ("variant_scalars", "kernels", "kernels_unbound"),
    ("dynamo_over_eager", "dynamo_eager", "eager"),  # dynamo's own per-call cost, whatever the backend
)


def _percentiles(xs: list[float]) -> dict[str, float]:
    q = statistics.quantiles(xs, n=10)
    return {"p10": q[0], "median": statistics.median(xs), "p90": q[-1]}


def _capture(
    compiled: Any, args: tuple[Any, ...]
) -> tuple[list[tuple[Any, tuple[Any, ...]]], list[Any], bool, list[tuple[Any, list[Any]]]]:
    """One call of ``compiled`` with its gensorage subgraphs' calls recorded: (module, its arguments), the
    (lowered, kernels, arguments) each passed to ``run_kernels``, whether a per-shape graph served it, and the
    partitioned graphs that called the subgraphs (their ``forward``, its arguments as the call began)."""
    from gensorage.torch import per_shape, subgraph

    modules: list[tuple[Any, tuple[Any, ...]]] = []
    runs: list[Any] = []
    specialised = [False]
    entered: dict[int, tuple[Any, list[Any]]] = {}  # each FX forward's frame: its arguments at entry
    graphs: list[tuple[Any, list[Any]]] = []

    def on_call(frame: Any, event: str, _: Any) -> None:
        code = frame.f_code
        if event == "call" and code.co_filename.startswith("<eval_with_key>") and code.co_name == "forward":
            names = code.co_varnames[1 : code.co_argcount]  # after self
            entered[id(frame)] = (frame.f_locals["self"].forward, [frame.f_locals[n] for n in names])

    call, run_kernels, per_shape_call = (
        subgraph.GensorageSubgraph.__call__,
        subgraph.run_kernels,
        per_shape.PerShape.__call__,
    )

    def recording_call(self: Any, *a: Any) -> Any:
        modules.append((self, a))
        graph = entered.get(id(sys._getframe(1)))
        if graph is not None and all(graph[0] != g for g, _ in graphs):
            graphs.append(graph)
        return call(self, *a)

    def recording_run(lowered: Any, res: Any, a: list[Any], *rest: Any) -> Any:
        runs.append((lowered, res, list(a), rest))
        return run_kernels(lowered, res, a, *rest)

    def recording_per_shape(self: Any, *a: Any) -> Any:
        specialised[0] = True
        return per_shape_call(self, *a)

    subgraph.GensorageSubgraph.__call__ = recording_call  # type: ignore[method-assign]
    subgraph.run_kernels = recording_run
    per_shape.PerShape.__call__ = recording_per_shape  # type: ignore[method-assign]
    sys.setprofile(on_call)
    try:
        compiled(*args)
    finally:
        sys.setprofile(None)
        subgraph.GensorageSubgraph.__call__ = call  # type: ignore[method-assign]
        subgraph.run_kernels = run_kernels
        per_shape.PerShape.__call__ = per_shape_call  # type: ignore[method-assign]
    return modules, runs, specialised[0], graphs


def _runner_inputs(lowered: Any, args: list[Any], rest: tuple[Any, ...]) -> list[Any]:
    """What ``run_kernels`` hands the runner for ``args``: cast, aligned, and (where the call path keeps
    imported inputs: ``rest`` holds its ``KeptInputs``) the kept inputs as their TVM tensors."""
    import torch

    from gensorage.torch.device import aligned

    cast = [a.to(getattr(torch, t.dtype)) for a, t in zip(args, lowered.program.inputs, strict=True)]
    kept = rest[0] if rest else None
    return [aligned(a) for a in cast] if kept is None else kept.arguments(cast)


def _levels(
    compiled: Any, model: Any, reference: Any, args: tuple[Any, ...]
) -> tuple[dict[str, Callable[[], Any]], dict[str, Any]]:
    """The callables timed for one shape, and what their kernels are (counts of kernels and variant scalars)."""
    import tvm

    from gensorage.codegen.runner import _resolve
    from gensorage.torch.device import _empty
    from gensorage.torch.subgraph import run_kernels

    modules, runs, specialised, graphs = _capture(compiled, args)
    if not graphs:
        raise SystemExit("no partitioned graph called the gensorage subgraphs")
    if any(res.runner is None for _, res, _, _ in runs):
        raise SystemExit("a subgraph has no prepared runner: its kernels cannot be launched directly")
    prepared = [_runner_inputs(lowered, a, rest) for lowered, _, a, rest in runs]
    direct, unbound, scalars = [], [], 0
    for (_, res, _, _), arrays in zip(runs, prepared, strict=True):
        ins = [a if isinstance(a, tvm.runtime.Tensor) else tvm.runtime.from_dlpack(a) for a in arrays]
        outs = [tvm.runtime.from_dlpack(_empty(s, d)) for s, d in res.runner.output_specs]
        for fn, params in res.runner._calls:
            bound = [_resolve(p, (ins, outs)) for p in params]
            direct.append((fn, bound))
            if isinstance(fn, functools.partial):
                scalars += len(fn.args)
                unbound.append((fn.func, [*fn.args, *bound]))
            else:
                unbound.append((fn, bound))

    def launch(calls: list[tuple[Any, list[Any]]]) -> Callable[[], None]:
        def run() -> None:
            for fn, a in calls:
                fn(*a)

        return run

    def partitioned() -> None:
        for forward, a in graphs:
            forward(*a)

    def subgraphs() -> None:
        for m, a in modules:
            m(*a)

    def glue() -> None:
        for lowered, res, a, rest in runs:
            run_kernels(lowered, res, a, *rest)

    def runners() -> None:
        for (_, res, _, _), arrays in zip(runs, prepared, strict=True):
            res.runner(arrays, _empty)

    levels: dict[str, Callable[[], Any]] = {
        "call": lambda: compiled(*args),
        "graph": partitioned,
        "subgraph": subgraphs,
        "run_kernels": glue,
        "runner": runners,
        "kernels": launch(direct),
        "kernels_unbound": launch(unbound),
        "eager": lambda: model(*args),
        "dynamo_eager": lambda: reference(*args),
    }
    info = {
        "subgraphs": len(modules),
        "partitioned_graphs": len(graphs),
        "per_shape_graph": specialised,
        "kernels": len(direct),
        "variant_kernels": sum(isinstance(fn, functools.partial) for fn, _ in direct),
        "variant_scalars": scalars,
    }
    return levels, info


def _differences(times: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """The differences of :data:`DIFFERENCES`, pair by pair (call by call, or block median by block median)."""
    return {
        name: _percentiles([a - b for a, b in zip(times[outer], times[inner], strict=True)])
        for name, outer, inner in DIFFERENCES
    }


def _timed(fn: Callable[[], Any]) -> tuple[float, float]:
    """Wall and thread CPU time of one call of ``fn``, in µs."""
    c0 = time.thread_time_ns()
    t0 = time.perf_counter_ns()
    fn()
    t1 = time.perf_counter_ns()
    c1 = time.thread_time_ns()
    return (t1 - t0) / 1e3, (c1 - c0) / 1e3


def time_levels(
    levels: dict[str, Callable[[], Any]], calls: int, block: int = 50, warmup: int = 100
) -> dict[str, Any]:
    """Each level ``calls`` times in blocks of ``block`` repeated calls, the blocks of the levels taking turns
    in rotating order (a round), the collector disabled (module docstring); then ``calls // 4`` calls
    interleaved one by one, the other levels' data passing through the caches between two calls of one."""
    names = list(levels)
    for _ in range(warmup):
        for n in names:
            levels[n]()
    wall: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    rounds: dict[str, list[float]] = {n: [] for n in names}  # each block's median wall time
    mixed: dict[str, list[float]] = {n: [] for n in names}
    gc.collect()
    gc.disable()
    try:
        for r in range(max(calls // block, 1)):
            for j in range(len(names)):
                n = names[(r + j) % len(names)]
                fn = levels[n]
                fn()  # the block starts on warm caches
                got = [_timed(fn) for _ in range(block)]
                wall[n].extend(w for w, _ in got)
                cpu[n].extend(c for _, c in got)
                rounds[n].append(statistics.median(w for w, _ in got))
        for i in range(max(calls // 4, 1)):
            for j in range(len(names)):
                n = names[(i + j) % len(names)]
                mixed[n].append(_timed(levels[n])[0])
    finally:
        gc.enable()
    found = gc.collect()
    with_gc = [_timed(levels["call"])[0] for _ in range(min(calls, 500))]
    return {
        "levels_us": {n: _percentiles(wall[n]) for n in names},
        "differences_us": {
            name: {
                "of_medians": statistics.median(wall[outer]) - statistics.median(wall[inner]),
                "by_round": _percentiles([a - b for a, b in zip(rounds[outer], rounds[inner], strict=True)]),
            }
            for name, outer, inner in DIFFERENCES
        },
        "thread_cpu_levels_us": {n: _percentiles(cpu[n]) for n in names},
        "interleaved_levels_us": {n: _percentiles(mixed[n]) for n in names},
        "interleaved_differences_us": _differences(mixed),
        "rounds": len(rounds["call"]),
        "gc_found_after_timed_calls": found,
        "call_median_us_gc_enabled": statistics.median(with_gc),
    }


def eager_kernels_us(model: Any, args: tuple[Any, ...], calls: int) -> tuple[float, float]:
    """Eager's kernels' own time per call (self time of the aten ops without child ops, torch's profiler) and
    how many such ops a call runs."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            model(*args)
    leaves = [e for e in prof.events() if not e.cpu_children and e.name.startswith("aten::")]
    return sum(e.self_cpu_time_total for e in leaves) / calls, len(leaves) / calls


def _compile(model: Any, dynamo_dynamic: bool) -> Any:
    import torch

    import gensorage.torch as gtorch

    if not dynamo_dynamic:
        return gtorch.compile(model)
    for name in ("recompile_limit", "accumulated_recompile_limit"):
        setattr(torch._dynamo.config, name, gtorch.RECOMPILE_LIMIT)
    return torch.compile(model, backend="gensorage")


def cache_entries(model: Any, compiled: Any) -> dict[str, int]:
    """Dynamo's cache entries for ``model``'s ``forward`` (one per captured graph and guard set) and the
    static graphs of ``compiled``'s per-shape graphs (symbolic captures only)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    from gensorage.torch import per_shape

    code = type(model).forward.__code__
    specialised = sum(len(g.graphs) for g in gc.get_objects() if type(g) is per_shape.PerShape)
    return {"dynamo_cache_entries": len(_debug_get_cache_entry_list(code)), "per_shape_graphs": specialised}


def _grow(
    compiled: Any, reference: Any, make: Any, measured: int, seen: int, done: list[int]
) -> float | None:
    """Call ``compiled`` (and the dynamo reference) at new lengths until ``seen`` distinct lengths, the measured
    one among them, were called: lengths 1, 2, ... skipping ``measured``. The last new length's first call's
    time in seconds (None when no length was added)."""
    import torch

    first = None
    while len(done) < seen:
        t = len(done) + 1 + (len(done) + 1 >= measured)  # 1, 2, ... with the measured length left out
        args = make(t, torch.float32, seed=t)
        t0 = time.perf_counter()
        compiled(*args)
        first = time.perf_counter() - t0
        reference(*args)
        done.append(t)
    return first


def run_model(
    kind: str,
    sizes: tuple[int, ...],
    calls: int,
    dynamo_dynamic: bool,
    seen: tuple[int, ...] = (),
    save: Callable[[list[dict[str, Any]]], None] | None = None,
) -> dict[str, Any]:
    """The small decoder layer of the front end's tests at prefill lengths (``kind="prefill"``) or its KV-cache
    decode step at cache lengths (``"decode"``), every size in order in one compiled model. With ``seen``
    (``--lengths-seen``), the first size alone, measured again after each count of distinct lengths called;
    ``save`` gets the rows so far after each (a long run's rows survive its timeout)."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from test_torch_decode import DecodeStep, decode_inputs
    from test_torch_frontend import DecoderLayer, layer_inputs

    torch.manual_seed(0)
    if seen:  # dynamo's caches are per code object: the entries of the mode before would count here
        torch._dynamo.reset()
    model = (DecoderLayer() if kind == "prefill" else DecodeStep()).eval()
    make = layer_inputs if kind == "prefill" else decode_inputs
    compiled = _compile(model, dynamo_dynamic)
    reference = torch.compile(model, backend="eager", dynamic=None if dynamo_dynamic else False)
    rows = []
    done: list[int] = []  # the lengths called before, other than the measured one
    checkpoints = seen or (0,) * len(sizes)
    with torch.no_grad():
        for v, n in zip(sizes * len(checkpoints) if seen else sizes, checkpoints, strict=False):
            new_first = _grow(compiled, reference, make, v, n - 1, done)
            args = make(v, torch.float32, seed=v)
            t0 = time.perf_counter()
            got = compiled(*args)
            first = time.perf_counter() - t0
            want = model(*args)
            got, want = (
                (got,) if isinstance(got, torch.Tensor) else got,
                (want,) if isinstance(want, torch.Tensor) else want,
            )
            err = max(float((g - w).abs().max() / w.abs().max()) for g, w in zip(got, want, strict=True))
            reference(*args)  # captured at this shape
            _wait_rebuilds()
            levels, info = _levels(compiled, model, reference, args)
            row = {"size": v, "first_call_s": first, "rel_err": err, **info}
            if seen:
                row |= {"lengths_seen": len(done) + 1, "new_length_first_call_s": new_first}
                row |= cache_entries(model, compiled)
            row |= time_levels(levels, calls)
            kernels_us, ops = eager_kernels_us(model, args, max(calls // 10, 20))
            eager = row["levels_us"]["eager"]
            row["eager_reference"] = {
                "kernels_us": kernels_us,  # profiler: self time of the leaf aten ops
                "aten_ops": ops,
                "overhead_us": {k: eager[k] - kernels_us for k in ("p10", "median", "p90")},
            }
            d = row["differences_us"]["overhead"]
            progress(
                f"{kind} @ {v} after {len(done) + 1} lengths: overhead {d['of_medians']:.1f} µs "
                f"(by round p10 {d['by_round']['p10']:.1f}, p90 {d['by_round']['p90']:.1f}), "
                f"eager's {row['eager_reference']['overhead_us']['median']:.1f} µs, kernels {row['levels_us']['kernels']['median']:.0f} µs"
            )
            row["load_average"] = os.getloadavg()
            rows.append(row)
            if save is not None:
                save(rows)
    return {"model": kind, "dynamo_dynamic": dynamo_dynamic, "shapes": rows}


def _wait_rebuilds() -> None:
    """Wait for the background rebuilds of first-tier kernels (tiered builds): the repeated shape is timed on the
    kernels it runs in its steady state, and no swap lands among the timed calls."""
    from gensorage.torch import subgraph

    for d in list(getattr(subgraph, "_DISPATCHERS", {}).values()):
        if hasattr(d, "wait_rebuilds"):  # a tree before tiered builds has none
            d.wait_rebuilds()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--calls", type=int, default=2000, help="timed calls per level and shape, after a warm-up"
    )
    ap.add_argument("--prefill", nargs="*", type=int, default=[8, 12, 20, 27, 33, 34], help="prefill lengths")
    ap.add_argument("--decode", nargs="*", type=int, default=[8, 12, 20, 27, 33, 34], help="KV-cache lengths")
    ap.add_argument(
        "--modes",
        nargs="*",
        choices=("static", "dynamic"),
        default=["static", "dynamic"],
        help='static: gensorage.torch.compile; dynamic: torch.compile(model, backend="gensorage")',
    )
    ap.add_argument(
        "--lengths-seen",
        nargs="*",
        type=int,
        default=[],
        help="measure the first prefill length after this many distinct lengths were called (e.g. 1 10 50 200)",
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if (
        args.lengths_seen
        and sorted(args.lengths_seen) != args.lengths_seen
        or min(args.lengths_seen, default=1) < 1
    ):
        ap.error("--lengths-seen takes increasing counts of at least 1")
    t0 = time.perf_counter()
    load_before = os.getloadavg()
    import torch

    torch.set_num_threads(1)  # eager's kernels on one thread, as the gensorage kernels run
    out = args.out or result_path(NAME)

    def save(rows: list[dict[str, Any]]) -> None:
        write_json(out, {"benchmark": NAME, "machine": machine_info(), "partial": True, "rows": rows})

    results = [
        run_model(kind, tuple(sizes), args.calls, mode == "dynamic")
        for mode in args.modes
        for kind, sizes in (("prefill", args.prefill), ("decode", args.decode))
        if sizes and not args.lengths_seen
    ] + [
        run_model(
            "prefill", tuple(args.prefill[:1]), args.calls, mode == "dynamic", tuple(args.lengths_seen), save
        )
        for mode in args.modes
        if args.lengths_seen
    ]
    data = {
        "benchmark": NAME,
        "machine": machine_info(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "wall_s": time.perf_counter() - t0,
        "tvm_num_threads": os.environ.get("TVM_NUM_THREADS"),
        "torch_num_threads": torch.get_num_threads(),
        "calls": args.calls,
        "gc_disabled_while_timing": True,
        "goal_overhead_us": 50,
        "results": results,
    }
    write_json(out, data)
    progress(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The equivalence check of a re-instantiated µGraph at new prefill lengths, timed alone, against a baseline tree.

At a new prefill length the dispatcher (:mod:`gensorage.superopt.dispatch`) re-instantiates the stored µGraph of
the small LLaMA-style decoder layer (``tests/test_torch_frontend.py``) at the new shapes and checks it against
the length's program with :func:`gensorage.verify.equivalent` before building kernels. This benchmark captures
those (program, µGraph, δ, seed, trial cap) calls, made through ``gensorage.torch.compile`` at ``--first`` (the
search) and then ``--lengths``, and times the same calls again in two worker processes: one importing this tree's
``gensorage``, one a ``--baseline`` tree's (a read-only checkout of an older commit). At each length and repeat
one worker runs its check, then the other, the order alternating, so both sides of a pair run within a second of
each other under the same load; each row records the 1-minute load average and the verdict's trial count, tier
and achieved δ (which must agree between the trees). ``--examples`` adds the paper examples' µGraphs against their programs
(looped block graphs and online softmax, as a search checks its candidates).

Usage: ``python -m benchmarks.equivalence_lengths --baseline /work/base10 [--lengths 12 34 57 100 200]
[--repeats 5] [--examples] [--tag NAME] [--out FILE]``; writes ``benchmarks/results/equivalence-<tag>-<date>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TVM_NUM_THREADS", "1")  # before TVM loads, as benchmarks.dispatch

REPO = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):
    sys.path.insert(0, str(REPO))

from benchmarks.common import git_commit, machine_info, progress, result_path, write_json  # noqa: E402

NAME = "equivalence"
SIDES = ("after", "before")


def capture(first: int, lengths: list[int]) -> list[dict[str, Any]]:
    """The dispatcher's equivalence checks of the layer at ``lengths`` (after a first call at ``first``)."""
    import torch

    sys.path.insert(0, str(REPO / "tests"))
    from test_torch_frontend import DecoderLayer, layer_inputs

    import gensorage.torch as gtorch
    from gensorage.verify import equivalent as _  # noqa: F401  (the module, for the patch below)

    module = sys.modules["gensorage.verify.equivalent"]
    calls: list[dict[str, Any]] = []
    real = module.equivalent

    def spy(a: Any, b: Any, delta: float = 1e-9, **kw: Any) -> Any:
        calls.append({"program": a, "graph": b, "delta": delta, "seed": kw.get("seed"), **kw})
        return real(a, b, delta, **kw)

    setattr(module, "equivalent", spy)  # noqa: B010  (the dispatcher imports it from the module at each check)
    torch.manual_seed(0)
    compiled = gtorch.compile(DecoderLayer().eval())
    pairs = []
    try:
        with torch.no_grad():
            for t in [first, *lengths]:
                before = len(calls)
                compiled(*layer_inputs(t, torch.float32, seed=t))
                if t != first:
                    checks = calls[before:]
                    if len(checks) != 1:
                        raise RuntimeError(f"{len(checks)} equivalence checks at {t} tokens, expected 1")
                    c = checks[0]
                    pairs.append(
                        {
                            "label": f"layer@{t}",
                            "length": t,
                            "program": c["program"],
                            "graph": c["graph"],
                            "delta": c["delta"],
                            "seed": c["seed"],
                            "max_trials": c.get("max_trials"),
                        }
                    )
    finally:
        setattr(module, "equivalent", real)  # noqa: B010
    return pairs


#: Larger instances of the examples (their factory's arguments): a search at real shapes checks such candidates.
LARGE_EXAMPLES: dict[str, tuple[str, tuple[int, ...], dict[str, int]]] = {
    "rmsnorm_matmul@64x1024x1024": ("rmsnorm_matmul", (64, 1024, 1024), {"blocks": 8, "forloop": 16}),
    "gated_mlp@64x1024x1024": ("gated_mlp", (64, 1024, 1024), {"blocks": 8, "forloop": 16}),
    "flash_attention@8x256x512x64": ("flash_attention", (8, 256, 512, 64), {"q_blocks": 4, "forloop": 8}),
}


def examples(seed: int = 0) -> list[dict[str, Any]]:
    """The paper examples' µGraphs against their programs (:mod:`gensorage.ugraph.examples`: looped block
    graphs, online softmax) at their default shapes and a few larger (:data:`LARGE_EXAMPLES`), as a search
    checks a candidate: δ = 1e-9, no trial cap."""
    from gensorage.ugraph import examples as ex

    made = [(name, make()) for name, make in sorted(ex.EXAMPLES.items())]
    made += [(name, getattr(ex, f)(*a, **kw)) for name, (f, a, kw) in LARGE_EXAMPLES.items()]
    out = []
    for name, (program, graph) in made:
        out.append(
            {
                "label": f"example:{name}",
                "length": None,
                "program": program,
                "graph": graph,
                "delta": 1e-9,
                "seed": seed,
                "max_trials": None,
            }
        )
    return out


def worker(pairs_file: str, tree: str) -> None:
    """Time the checks in ``pairs_file`` with ``tree``'s gensorage: one JSON row per length read from stdin."""
    sys.path.insert(0, tree)
    import gensorage

    if not Path(gensorage.__file__).resolve().is_relative_to(Path(tree).resolve()):
        raise RuntimeError(f"imported {gensorage.__file__}, not from {tree}")
    from gensorage.verify import equivalent  # noqa: F401

    check = sys.modules["gensorage.verify.equivalent"].equivalent
    with open(pairs_file, "rb") as fh:
        pairs = {p["label"]: p for p in pickle.load(fh)}

    def run(label: str) -> dict[str, Any]:
        p = pairs[label]
        load = os.getloadavg()[0]
        t0, c0 = time.perf_counter(), time.process_time()
        r = check(p["program"], p["graph"], p["delta"], seed=p["seed"], max_trials=p["max_trials"])
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        return {
            "label": label,
            "length": p["length"],
            "seconds": seconds,
            "cpu_s": cpu,  # this process's CPU time (all its threads): what other processes' load leaves alone
            "load_1min": load,
            "equivalent": bool(r),
            "trials": r.trials,
            "required_trials": r.required_trials,
            "tier": r.tier,
            "achieved_delta": r.achieved_delta,
        }

    for label in pairs:  # imports, caches, the first allocation of each size
        run(label)
    print("ready", flush=True)
    for line in sys.stdin:
        print(json.dumps(run(line.strip())), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", help="a checkout of the tree to compare with (read only); required")
    ap.add_argument("--first", type=int, default=8, help="the first length (the structure's search)")
    ap.add_argument("--lengths", nargs="*", type=int, default=[12, 34, 57, 100, 200])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--examples", action="store_true", help="also the paper examples' checks (search candidates)"
    )
    ap.add_argument("--tag", default="", help="results file name: equivalence-<tag>-<date>.json")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--worker", nargs=2, metavar=("PAIRS", "TREE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(*args.worker)
        return 0
    if not args.baseline:
        ap.error("--baseline is required")
    load_before = os.getloadavg()
    pairs = capture(args.first, args.lengths) if args.lengths else []
    progress(f"captured {len(pairs)} checks at {[p['length'] for p in pairs]} tokens")
    pairs += examples() if args.examples else []
    labels = [p["label"] for p in pairs]
    trees = {"after": str(REPO), "before": str(Path(args.baseline).resolve())}
    with tempfile.TemporaryDirectory() as tmp:
        pairs_file = os.path.join(tmp, "pairs.pkl")
        with open(pairs_file, "wb") as fh:
            pickle.dump(pairs, fh)
        procs = {
            side: subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--worker", pairs_file, tree],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env={**os.environ, "PYTHONPATH": tree},
            )
            for side, tree in trees.items()
        }
        for p in procs.values():
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        rows: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
        turn = 0
        for r in range(args.repeats):
            for label in labels:
                for side in SIDES if turn % 2 == 0 else SIDES[::-1]:
                    p = procs[side]
                    assert p.stdin is not None and p.stdout is not None
                    p.stdin.write(f"{label}\n")
                    p.stdin.flush()
                    row = json.loads(p.stdout.readline())
                    row["repeat"], row["order"] = r, 0 if (side == SIDES[0]) == (turn % 2 == 0) else 1
                    rows[side].append(row)
                turn += 1
                a, b = rows["after"][-1], rows["before"][-1]
                progress(f"{label}: after {a['seconds']:.3f} s, before {b['seconds']:.3f} s")
        for p in procs.values():
            assert p.stdin is not None
            p.stdin.close()
            p.wait()
    summary = {}
    keys = ("equivalent", "trials", "required_trials", "tier", "achieved_delta")
    for label in labels:
        after = [x for x in rows["after"] if x["label"] == label]
        before = [x for x in rows["before"] if x["label"] == label]
        summary[label] = {
            "after_median_s": statistics.median(x["seconds"] for x in after),
            "before_median_s": statistics.median(x["seconds"] for x in before),
            "after_cpu_median_s": statistics.median(x["cpu_s"] for x in after),
            "before_cpu_median_s": statistics.median(x["cpu_s"] for x in before),
            "paired_ratio_median": statistics.median(
                x["seconds"] / y["seconds"] for x, y in zip(after, before, strict=True)
            ),
            "same_verdict_and_trials": all(
                {k: x[k] for k in keys} == {k: y[k] for k in keys} for x, y in zip(after, before, strict=True)
            ),
        }
    data = {
        "benchmark": NAME,
        "machine": machine_info(),
        "baseline": {"path": trees["before"], "git_commit": git_commit(Path(trees["before"]))},
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "program": "decoder_layer (torch, small)",
        "first": args.first,
        "lengths": args.lengths,
        "examples": args.examples,
        "repeats": args.repeats,
        "summary": summary,
        "results": rows,
    }
    out = args.out or result_path(f"{NAME}-{args.tag}" if args.tag else NAME)
    write_json(out, data)
    progress(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

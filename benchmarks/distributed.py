"""Full mode on a Dask cluster: the GQA search with 1 and 2 workers, the scaling efficiency, and a simulation of
larger clusters from the recorded per-task times.

The search is the one of ``benchmarks/search_ablation.py``'s 7-block-node row ("7-node kv=2 GQA"): the bundled
``gqa_incdec_papers`` program (Mirage's form of GQA) at ``b=1 kv=2 g=2 s=1 n=16 d=8``, Mirage's attention dim
lists, at most 7 block nodes
(``--nodes`` picks another limit). Each worker count runs from a fresh checkpoint on ``cluster="local:W"``
(W worker processes on this machine over loopback TCP; the driver runs no task itself: ``inline_s=0``).

Recorded per run: the wall time, the tasks split among idle workers, and a hash of the ranked candidates
(every run must give the same). Scaling efficiency is ``T1 / (W * TW)``.

The simulation replays the 1-worker run's per-task times (the checkpoint's ``elapsed_s`` of each task) on W =
8, 64 and 512 workers with the runner's policy: tasks handed out in index order to the first free worker; once
none is left and workers idle, a task running longer than ``split_after_s`` is split and its remaining time
shared by it and the idle workers (equal parts, each part splittable again), each part paying
``--piece-overhead-s`` (replaying its path, the scheduler's round trip). Equal parts are the model's assumption:
real pieces are subtrees of uneven size, so the simulated times are a lower bound for that policy. The
1-worker times include the subtree memo one process shares between its tasks; W processes share less, so real
runs do somewhat more work.

Usage::

    python benchmarks/distributed.py                      # 7 nodes, 1 and 2 workers, simulate 8/64/512
    python benchmarks/distributed.py --nodes 6 --pool        # also the local process pool, for comparison
    python benchmarks/distributed.py --resimulate benchmarks/results/distributed-2026-11-26.json
    python benchmarks/distributed.py --nodes 8 --workers 2 --cap 600 --checkpoints DIR   # again: resumes
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import os
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Run as a script, this file's folder comes first on sys.path, where this module's name would hide the
# ``distributed`` package itself: import from the repository root instead.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from benchmarks.common import machine_info, progress, result_path, write_json  # noqa: E402

NAME = "distributed"
PARAMS = {"b": 1, "kv": 2, "g": 2, "s": 1, "n": 16, "d": 8}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=7, help="block-node limit (default 7)")
    ap.add_argument("--workers", default="1,2", help="worker counts to run (default 1,2)")
    ap.add_argument("--simulate", default="8,64,512", help="worker counts to simulate (default 8,64,512)")
    ap.add_argument("--split-after-s", type=float, default=10.0, help="the runner's split threshold")
    ap.add_argument(
        "--simulate-split-after-s",
        default="10,1",
        help="split thresholds the simulation tries (default 10,1: the runner's default and a smaller one)",
    )
    ap.add_argument(
        "--pool", action="store_true", help="also run each worker count on the local process pool (no Dask)"
    )
    ap.add_argument(
        "--resimulate",
        type=Path,
        metavar="JSON",
        help="recompute only the simulation of an earlier results file from its task_times, in place",
    )
    ap.add_argument("--piece-overhead-s", type=float, default=0.01, help="simulated cost of one more piece")
    ap.add_argument("--cap", type=float, default=3600.0, help="time budget of each run in seconds")
    ap.add_argument(
        "--out", type=Path, help="result JSON (default benchmarks/results/distributed-<date>.json)"
    )
    ap.add_argument("--progress", action="store_true", help="live search progress on stderr")
    ap.add_argument(
        "--checkpoints",
        type=Path,
        metavar="DIR",
        help="keep the runs' checkpoints in DIR (a rerun with the same DIR resumes them; default: a temporary "
        "folder, removed)",
    )
    return ap.parse_args(argv)


def spec_for(nodes: int) -> Any:
    from gensorage.cli.program import load_source
    from gensorage.exhaustive.dim_strategy import load_dim_strategy
    from gensorage.exhaustive.spec import SearchSpec

    return SearchSpec(
        program=load_source("gqa_incdec_papers", PARAMS),
        hw="h100",
        max_block_ops=nodes,
        max_block_nodes=nodes,
        dims=load_dim_strategy("attention"),
    )


def candidates_hash(result: Any) -> str:
    rows = [(c.ugraph.to_json(), c.predicted_time_s, c.found_in_task) for c in result.candidates]
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16]


def task_times(path: Path) -> list[float]:
    """Seconds each done task took, in index order (the checkpoint's ``tasks.elapsed_s``)."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT elapsed_s FROM tasks WHERE status = 'done' ORDER BY idx").fetchall()
    return [float(r[0]) for r in rows]


def run(spec: Any, workers: int, args: argparse.Namespace, keep: Path, engine: str) -> dict[str, Any]:
    from gensorage.exhaustive.run import run_search

    ckpt = keep / f"{engine}-w{workers}.sqlite"
    where: dict[str, Any] = (
        {"cluster": f"local:{workers}", "split_after_s": args.split_after_s}
        if engine == "dask"
        else {"workers": workers}
    )
    before = len(task_times(ckpt)) if ckpt.exists() else 0  # a kept checkpoint: the run resumes it
    load = list(os.getloadavg())
    t0 = time.perf_counter()
    r = run_search(spec, checkpoint=ckpt, time_budget_s=args.cap, inline_s=0, progress=args.progress, **where)
    wall = time.perf_counter() - t0
    work = r.run_stats
    return {
        "engine": engine,
        "workers": workers,
        "complete": r.complete,
        "wall_s": round(wall, 2),
        "tasks_done_before": before,
        "tasks_done": r.tasks_done,
        "tasks_total": r.tasks_total,
        "tasks_split": r.tasks_split,
        "candidates": len(r.candidates),
        "candidates_hash": candidates_hash(r),
        "best_predicted_time_s": r.best.predicted_time_s if r.best is not None else None,
        # The work done: W processes share less subtree memo and solver cache than one.
        "work": {k: work.get(k) for k in ("states", "states_reused", "solver_queries", "cache_hits")},
        "load_average_before": load,
        "load_average_after": list(os.getloadavg()),
    }


def simulations(times: list[float], args: argparse.Namespace) -> list[dict[str, Any]]:
    return [
        simulate(times, int(w), float(t), args.piece_overhead_s)
        for t in args.simulate_split_after_s.split(",")
        if t.strip()
        for w in args.simulate.split(",")
        if w.strip()
    ]


def simulate(times: list[float], workers: int, split_after_s: float, overhead_s: float) -> dict[str, Any]:
    """Makespan of ``times`` on ``workers`` under the runner's policy (see the module docstring)."""
    queue = list(times)[::-1]  # pop() takes the next task in index order
    running: list[tuple[float, float, int]] = []  # (end, start, id): a heap by end time
    now, splits, ids = 0.0, 0, 0
    while queue or running:
        while queue and len(running) < workers:
            heapq.heappush(running, (now + queue.pop(), now, ids))
            ids += 1
        idle = workers - len(running)
        if not queue and idle > 0:
            # Split the longest-running task that ran past the threshold: its rest shared with the idle.
            ripe = [r for r in running if now - r[1] >= split_after_s and r[0] - now > overhead_s]
            if ripe:
                end, start, rid = min(ripe, key=lambda r: r[1])
                running.remove((end, start, rid))
                heapq.heapify(running)
                share = (end - now) / (idle + 1)
                for _ in range(idle + 1):
                    heapq.heappush(running, (now + share + overhead_s, now, ids))
                    ids += 1
                splits += 1
                continue
            # Wake when a task ends or the longest-running one reaches the threshold.
            nxt = min(r[0] for r in running)
            later = [r[1] + split_after_s for r in running if r[1] + split_after_s > now]
            now = min([nxt, *later])
        else:
            now = running[0][0]
        while running and running[0][0] <= now:
            heapq.heappop(running)
    total = sum(times)
    return {
        "workers": workers,
        "split_after_s": split_after_s,
        "makespan_s": round(now, 2),
        "efficiency": round(total / (workers * now), 3) if now > 0 else None,
        "splits": splits,
        "no_split_makespan_s": round(_list_schedule(times, workers), 2),
    }


def _list_schedule(times: list[float], workers: int) -> float:
    free = [0.0] * workers
    for t in times:
        heapq.heappush(free, heapq.heappop(free) + t)
    return max(free)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.resimulate is not None:
        doc = json.loads(args.resimulate.read_text())
        doc["simulation"] = simulations(doc["task_times"]["seconds"], args)
        doc["settings"]["piece_overhead_s"] = args.piece_overhead_s
        write_json(args.resimulate, doc)
        return 0
    spec = spec_for(args.nodes)
    path = args.out or result_path(NAME)
    doc: dict[str, Any] = {
        "benchmark": NAME,
        "machine": machine_info(),
        "settings": {
            "program": "gqa_incdec_papers",
            "params": PARAMS,
            "block_nodes": args.nodes,
            "dims": "attention",
            "spec_key": spec.key(),
            "engine": "dask distributed, cluster=local:W (worker processes, one thread each)",
            "split_after_s": args.split_after_s,
            "piece_overhead_s": args.piece_overhead_s,
            "cap_s": args.cap,
        },
        "runs": [],
    }
    keep = args.checkpoints or Path(tempfile.mkdtemp(prefix="gensorage-distributed-"))
    keep.mkdir(parents=True, exist_ok=True)
    try:
        engines = ["dask", "pool"] if args.pool else ["dask"]
        for w in [int(x) for x in args.workers.split(",") if x.strip()]:
            for engine in engines:
                progress(f"{NAME}: {args.nodes} block nodes on {w} worker(s), {engine}")
                doc["runs"].append(run(spec, w, args, keep, engine))
                write_json(path, doc)
        runs = doc["runs"]
        for engine in engines:
            one = next(
                (r for r in runs if r["engine"] == engine and r["workers"] == 1 and r["complete"]), None
            )
            for r in runs:
                if one is not None and r["engine"] == engine and r["complete"]:
                    r["efficiency"] = round(one["wall_s"] / (r["workers"] * r["wall_s"]), 3)
        if (keep / "dask-w1.sqlite").exists():
            times = task_times(keep / "dask-w1.sqlite")
            doc["task_times"] = {
                "tasks": len(times),
                "total_s": round(sum(times), 2),
                "longest_s": round(max(times), 2),
                "seconds": [round(t, 4) for t in times],
            }
            doc["simulation"] = simulations(times, args)
        doc["same_candidates"] = len({r["candidates_hash"] for r in runs if r["complete"]}) <= 1
        write_json(path, doc)
    finally:
        if args.checkpoints is None:
            shutil.rmtree(keep, ignore_errors=True)
    progress(f"{NAME}: wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

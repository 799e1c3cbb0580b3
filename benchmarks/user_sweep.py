"""Full mode without a budget on small user programs (issue 24 item 3): does each finish within a cap?

Runs ``gensorage superopt PROGRAM --no-store --json`` (no preset, no time budget: limits and search shapes
derived from the program) on each ``.gsp`` of ``tests/data/user_programs`` (programs not in ``configs/programs``),
under ``nice`` and a wall-clock cap (``--cap``, a run past it is killed and counted as not finished), and records
per program: finished, wall time, tasks done of all, candidates, the chosen µGraph's predicted time beside the
direct µGraph's, whether it is verified, the last progress line (tasks, ETA) and the load average before and after.

With ``--baseline REPO`` the same runs are made with another checkout's package as well (``PYTHONPATH=REPO``),
interleaved program by program (the order alternating), so both sides see the same load.

Usage::

    python -m benchmarks.user_sweep                                  # this checkout, every program
    python -m benchmarks.user_sweep --baseline /work/main --only clip_softmax_max softmax_matmul
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import REPO_ROOT, machine_info, progress, result_path, write_json  # noqa: E402

NAME = "user_sweep"
PROGRAMS = REPO_ROOT / "tests" / "data" / "user_programs"


def run_one(program: Path, package_root: Path, cap_s: float) -> dict[str, Any]:
    """One full-mode run of ``program`` with the package at ``package_root``, killed after ``cap_s``."""
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "PYTHONPATH": str(package_root), "GENSORAGE_HOME": d}
        cmd = ["nice", "-n", "10", sys.executable, "-m", "gensorage", "superopt", str(program)]
        cmd += ["--no-store", "--json", "--checkpoint", str(Path(d) / "ckpt.sqlite")]
        load0 = os.getloadavg()
        t0 = time.monotonic()
        try:
            # In the package's root: ``python -m`` puts the working directory first on the import path.
            proc = subprocess.run(
                cmd, env=env, cwd=package_root, capture_output=True, text=True, timeout=cap_s, check=False
            )
            out, err, rc = proc.stdout, proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            rc = None
        wall = time.monotonic() - t0
    lines = [ln for ln in err.replace("\r", "\n").splitlines() if ln.startswith("search: tasks")]
    row: dict[str, Any] = {
        "program": program.stem,
        "finished": rc is not None,
        "returncode": rc,
        "wall_s": round(wall, 1),
        "last_progress": lines[-1].strip() if lines else None,
        "load_average": [round(load0[0], 2), round(os.getloadavg()[0], 2)],
    }
    if rc is not None and out.strip():
        res = json.loads(out)
        stats = res.get("search_stats") or {}
        row.update(
            complete=res.get("complete"),
            tasks_done=stats.get("tasks_done"),
            tasks_total=stats.get("tasks_total"),
            candidates=stats.get("candidates"),
            states=(stats.get("stats") or {}).get("states"),
            search_elapsed_s=stats.get("search_elapsed_s"),
            predicted_time_s=res.get("predicted_time_s"),
            naive_predicted_time_s=res.get("naive_predicted_time_s"),
            num_kernels=res.get("num_kernels"),
            direct=res.get("direct"),
            verified=res.get("verified"),
            notes=[n for n in res.get("notes", []) if "derived" in n],
        )
    elif rc is not None:
        row["stderr_tail"] = err[-500:]
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cap", type=float, default=360.0, help="wall-clock cap per run (s)")
    ap.add_argument("--only", nargs="*", default=None, help="program names (default: all)")
    ap.add_argument("--baseline", type=Path, default=None, help="another checkout to run beside this one")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    machine = machine_info()  # at the start: the code that runs
    programs = sorted(PROGRAMS.glob("*.gsp"))
    if args.only:
        programs = [p for p in programs if p.stem in set(args.only)]
    sides = {"this": REPO_ROOT} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in sides}
    for i, program in enumerate(programs):
        order = list(sides) if i % 2 == 0 else list(reversed(sides))
        for side in order:
            row = run_one(program, sides[side], args.cap)
            runs[side].append(row)
            progress(f"{side} {program.stem}: {row}")
    path = args.out or result_path(NAME)
    write_json(
        path,
        {
            "benchmark": NAME,
            "machine": machine,
            "cap_s": args.cap,
            "sides": {k: str(v) for k, v in sides.items()},
            "runs": runs,
        },
    )
    progress(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

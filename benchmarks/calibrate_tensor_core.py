"""Calibrate the tensor-core cost model on measured kernels, and report how well it predicts them.

Reads GPU-suite results (``benchmarks/results/gpu_suite-*.json``): every tensor-core GEMM case records its tiles
(``meta.tiles``), its shape and its measured median. A grid search over the profile's ``[calibration]``
constants (:class:`gensorage.hw.profile.Calibration`) minimises the median |log(predicted / measured)|; the
report gives that error and the Spearman rank correlation for the profile as it is and as calibrated, so the
values written into ``configs/hw/<name>.toml`` come with their evidence::

    python benchmarks/calibrate_tensor_core.py benchmarks/results/gpu_suite-h200-*.json --hw h200
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gensorage.codegen.tensor_core import TensorCoreTiles  # noqa: E402
from gensorage.codegen.wgmma import WgmmaTiles  # noqa: E402
from gensorage.construction.tensor_core import Tiles, predict_tiles_time  # noqa: E402
from gensorage.hw import load_profile  # noqa: E402
from gensorage.hw.profile import Calibration, HwProfile  # noqa: E402

GRID = {
    "mma_sync_fraction": [0.3, 0.35, 0.4, 0.45, 0.5],
    "l2_fraction": [0.3, 0.4, 0.5, 0.6, 0.8],
    "dram_fraction": [0.5, 0.6, 0.8, 1.0],
    "warp_flight_bytes": [1024.0, 2048.0, 4096.0, 8192.0],
    "mma_in_flight": [2.0, 4.0, 8.0],
    "step_cycles": [100.0, 200.0, 400.0],
    "launch_overhead_s": [1e-6, 2e-6, 4e-6],
}
#: wgmma's rate, fitted after the rest (the wgmma kernels share every other term with mma.sync's).
WGMMA_GRID = [0.3, 0.4, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.9]
#: The TMA wgmma kernels' MMA and L2 rates, fitted last where TMA kernels were measured.
TMA_GRID = {
    "tma_wgmma_fraction": [0.5, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9],
    "tma_l2_fraction": [0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0],
}


Measured = list[tuple[tuple[int, int, int, int], Tiles, float]]


def measured_kernels(paths: list[Path]) -> Measured:
    """(dims, tiles, measured seconds) of every tensor-core GEMM case that passed its check, deduplicated;
    ``mma.sync`` and ``wgmma`` kernels (told apart by their tiles' fields)."""
    seen: dict[tuple[Any, ...], tuple[tuple[int, int, int, int], Tiles, float]] = {}
    for path in paths:
        for case in json.loads(path.read_text())["cases"]:
            tiles = (case.get("meta") or {}).get("tiles")
            ours = (case.get("methods") or {}).get("ours", {})
            if case.get("kind") != "gemm" or not tiles or "median_s" not in ours:
                continue
            g = case["gemm"]
            dims = (g.get("batch") or 1, g["M"], g["N"], g["K"])
            t: Tiles = WgmmaTiles(**tiles) if "warpgroups" in tiles else TensorCoreTiles(**tiles)
            seen[(dims, t)] = (dims, t, float(ours["median_s"]))
    return list(seen.values())


def _ranks(xs: list[float]) -> list[float]:
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for q in range(i, j + 1):
            ranks[order[q]] = (i + j) / 2
        i = j + 1
    return ranks


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    va = math.sqrt(sum((x - ma) ** 2 for x in ra))
    vb = math.sqrt(sum((y - mb) ** 2 for y in rb))
    return cov / (va * vb) if va and vb else 0.0


def score(hw: HwProfile, data: Measured) -> dict[str, float]:
    pred, meas = [], []
    for dims, t, m in data:
        c = predict_tiles_time(dims, t, hw)
        if c is not None:
            pred.append(c.total_s)
            meas.append(m)
    errs = [abs(math.log(p / m)) for p, m in zip(pred, meas, strict=True)]
    return {
        "kernels": len(pred),
        "mean_abs_log_error": statistics.fmean(errs),
        "median_abs_log_error": statistics.median(errs),
        "median_error_factor": math.exp(statistics.median(errs)),
        "spearman": spearman(pred, meas),
    }


def calibrate(hw: HwProfile, data: Measured) -> tuple[Calibration, dict[str, float]]:
    best: tuple[tuple[float, float], Calibration, dict[str, float]] | None = None
    wgmma = hw.calibration.wgmma_fraction
    tma = {k: getattr(hw.calibration, k) for k in TMA_GRID}
    for values in itertools.product(*GRID.values()):
        cal = Calibration(**dict(zip(GRID, values, strict=True)), wgmma_fraction=wgmma, **tma)
        s = score(dataclasses.replace(hw, calibration=cal), data)
        # The mean, not the median: the few small-M and skinny-K kernels must count, not only the many large ones.
        key = (s["mean_abs_log_error"], -s["spearman"])
        if best is None or key < best[0]:
            best = (key, cal, s)
    assert best is not None
    if wgmma > 0 and any(isinstance(t, WgmmaTiles) for _, t, _ in data):
        for fraction in WGMMA_GRID:
            cal = dataclasses.replace(best[1], wgmma_fraction=fraction)
            s = score(dataclasses.replace(hw, calibration=cal), data)
            key = (s["mean_abs_log_error"], -s["spearman"])
            if key < best[0]:
                best = (key, cal, s)
    if any(isinstance(t, WgmmaTiles) and t.tma for _, t, _ in data):
        base = best[1]
        for values in itertools.product(*TMA_GRID.values()):
            cal = dataclasses.replace(base, **dict(zip(TMA_GRID, values, strict=True)))
            s = score(dataclasses.replace(hw, calibration=cal), data)
            key = (s["mean_abs_log_error"], -s["spearman"])
            if key < best[0]:
                best = (key, cal, s)
    return best[1], best[2]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", type=Path)
    ap.add_argument("--hw", default="h200")
    args = ap.parse_args(argv)
    hw = load_profile(args.hw)
    data = measured_kernels(args.results)
    before = score(hw, data)
    cal, after = calibrate(hw, data)
    print(
        json.dumps({"profile": before, "calibrated": after, "calibration": dataclasses.asdict(cal)}, indent=1)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

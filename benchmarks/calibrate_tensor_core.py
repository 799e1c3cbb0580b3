"""Calibrate the tensor-core cost model on measured kernels, and report how well it predicts them.

Reads GPU-suite results (``benchmarks/results/gpu_suite-*.json``): every tensor-core GEMM case records its tiles
(``meta.tiles``), its shape and its measured median. A grid search over the profile's ``[calibration]``
constants (:class:`gensorage.hw.profile.Calibration`) minimises the mean |log(predicted / measured)|; the
report gives that error and the Spearman rank correlation for the profile as it is and as calibrated, so the
values written into ``configs/hw/<name>.toml`` come with their evidence::

    python benchmarks/calibrate_tensor_core.py benchmarks/results/gpu_suite-h200-*.json --hw h200

The table (:func:`calibration_table`) holds every tensor-core kernel measured: ``mma.sync``, wgmma and TMA
wgmma GEMMs, and convolutions (their implicit GEMM, reported apart: the model does not price their gathers).
``--warp-tile`` fits only the warp-tile term (``ldmatrix_cycles`` with the ``mma.sync`` rate) and reports it
left one GEMM out, with the order the model gives the warp-tile groups (the same GEMM and block measured at
several warp tiles)::

    python benchmarks/calibrate_tensor_core.py benchmarks/results/gpu_suite-h200-*.json --hw h200 \\
        --warp-tile --out benchmarks/results/calibrate_tensor_core-warptile-2026-11-27.json
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine_info  # noqa: E402
from gensorage.codegen.tensor_core import TensorCoreTiles  # noqa: E402
from gensorage.codegen.wgmma import WgmmaTiles  # noqa: E402
from gensorage.construction.tensor_core import Tiles, predict_tiles_time, preferred  # noqa: E402
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
#: The warp-tile term (``ldmatrix_cycles``) and the mma.sync rate it shares the compute term with, fitted on
#: the mma.sync GEMMs alone (:func:`fit_warp_tile`).
WARP_GRID = {
    "mma_sync_fraction": [0.3 + 0.025 * i for i in range(13)],
    "ldmatrix_cycles": [4.0 + 0.5 * i for i in range(25)],
}
#: The TMA wgmma kernels' MMA and L2 rates, fitted last where TMA kernels were measured.
TMA_GRID = {
    "tma_wgmma_fraction": [0.5, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9],
    "tma_l2_fraction": [0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0],
}


Measured = list[tuple[tuple[int, int, int, int], Tiles, float]]


@dataclass(frozen=True, slots=True)
class Kernel:
    """One measured tensor-core kernel of the calibration table: its GEMM (a convolution's implicit GEMM),
    its tiles and the median of its measured medians over every run that timed it."""

    kind: str  # "gemm" or "conv"
    dtype: str
    name: str  # the case's shape name (M1, C2, decode_...) or its dims
    dims: tuple[int, int, int, int]
    tiles: Tiles
    seconds: float
    runs: int

    @property
    def gather(self) -> bool:
        """A convolution's implicit GEMM gathers its operands element by element."""
        return self.kind == "conv"

    @property
    def group(self) -> tuple[object, ...] | None:
        """The warp-tile group: the same GEMM and block, only the ``mma.sync`` warp tile differs (None for
        wgmma, whose warp layout is fixed by the instruction)."""
        t = self.tiles
        if not isinstance(t, TensorCoreTiles):
            return None
        return (self.kind, self.dtype, self.name, self.dims, dataclasses.replace(t, warp_m=0, warp_n=0))


_IMPLICIT = re.compile(r"implicit GEMM \[(\d+), (\d+), (\d+), (\d+)\]")


def _case_dims(case: dict[str, Any]) -> tuple[int, int, int, int] | None:
    if case.get("kind") == "gemm":
        g = case["gemm"]
        return (g.get("batch") or 1, g["M"], g["N"], g["K"])
    found = _IMPLICIT.search((case.get("meta") or {}).get("rule", ""))  # conv: the rule names its GEMM
    if case.get("kind") == "conv" and found:
        b, m, n, k = (int(x) for x in found.groups())
        return (b, m, n, k)
    return None


def calibration_table(paths: list[Path]) -> list[Kernel]:
    """Every tensor-core kernel (``mma.sync``, wgmma, TMA wgmma; GEMMs and convolutions) that passed its check
    in these GPU-suite results, one row per (dims, tiles): a kernel timed in several runs gets the median of
    its medians (the runs disagree by up to 15 % on the H200, and the last run is no better than the first)."""
    times: dict[tuple[str, str, str, tuple[int, int, int, int], Tiles], list[float]] = {}
    for path in paths:
        for case in json.loads(path.read_text())["cases"]:
            meta = case.get("meta") or {}
            tiles = meta.get("tiles")
            ours = (case.get("methods") or {}).get("ours", {})
            dims = _case_dims(case)
            if not tiles or dims is None or "median_s" not in ours or ours.get("ok") is False:
                continue
            t: Tiles = WgmmaTiles(**tiles) if "warpgroups" in tiles else TensorCoreTiles(**tiles)
            name = str(meta.get("shape") or dims)
            times.setdefault((case["kind"], case.get("dtype", "float16"), name, dims, t), []).append(
                float(ours["median_s"])
            )
    return [
        Kernel(kind, dtype, name, dims, t, statistics.median(ts), len(ts))
        for (kind, dtype, name, dims, t), ts in times.items()
    ]


def measured_kernels(paths: list[Path]) -> Measured:
    """(dims, tiles, measured seconds) of every row of :func:`calibration_table`."""
    return [(k.dims, k.tiles, k.seconds) for k in calibration_table(paths)]


def warp_tile_groups(table: list[Kernel]) -> list[list[Kernel]]:
    """The groups of ``mma.sync`` kernels measured at two or more warp tiles of the same GEMM and block."""
    groups: dict[tuple[object, ...], list[Kernel]] = {}
    for k in table:
        if k.group is not None:
            groups.setdefault(k.group, []).append(k)
    return [g for g in groups.values() if len(g) > 1]


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
    """The errors and Spearman of the GEMMs ``data`` (no gathered operands)."""
    return score_kernels(hw, [Kernel("gemm", "float16", str(d), d, t, s, 1) for d, t, s in data])


def score_kernels(hw: HwProfile, rows: list[Kernel]) -> dict[str, float]:
    """The median and mean |log(predicted / measured)| and the Spearman rank correlation over ``rows`` (the
    ones the profile can run)."""
    pred, meas = [], []
    for k in rows:
        c = predict_tiles_time(k.dims, k.tiles, hw, k.dtype, k.gather)
        if c is not None:
            pred.append(c.total_s)
            meas.append(k.seconds)
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
    for values in itertools.product(*GRID.values()):
        cal = dataclasses.replace(hw.calibration, **dict(zip(GRID, values, strict=True)))
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


def kernel_class(k: Kernel) -> str:
    """The report's classes: the instruction, and convolutions apart (their gathers are not priced)."""
    if k.kind == "conv":
        return "conv mma.sync"
    if isinstance(k.tiles, WgmmaTiles):
        return "wgmma tma" if k.tiles.tma else "wgmma cp.async"
    return "mma.sync"


def table_score(hw: HwProfile, table: list[Kernel]) -> dict[str, Any]:
    """:func:`score` over the whole table and over each :func:`kernel_class`."""
    out: dict[str, Any] = {"all": score_kernels(hw, table)}
    for cls in sorted({kernel_class(k) for k in table}):
        out[cls] = score_kernels(hw, [k for k in table if kernel_class(k) == cls])
    return out


def measured_kernels_of(table: list[Kernel]) -> Measured:
    return [(k.dims, k.tiles, k.seconds) for k in table]


def group_order(hw: HwProfile, group: list[Kernel]) -> dict[str, Any]:
    """How the model orders one warp-tile group against the measurement: its pairs ordered as measured
    (a pair the model prices within ``ORDER_TIE`` counts as not ordered) and whether the measured fastest
    is the model's fastest."""
    pred = [_predicted(hw, k) for k in group]
    meas = [k.seconds for k in group]
    pairs = agree = 0
    for i, j in itertools.combinations(range(len(group)), 2):
        pairs += 1
        model_gap = math.log(pred[i] / pred[j])
        agree += abs(model_gap) > ORDER_TIE and (model_gap > 0) == (meas[i] > meas[j])
    fastest = min(range(len(group)), key=lambda i: meas[i])
    others = [p for i, p in enumerate(pred) if i != fastest]
    pick = preferred([k.tiles for k in group], group[0].dims, hw, group[0].dtype, group[0].gather)
    picked = next(k for k in group if k.tiles == pick)
    return {
        "group": f"{group[0].kind} {group[0].name} {group[0].dims} {_block(group[0].tiles)}",
        "warp_tiles": [f"{k.tiles.warp_m}x{k.tiles.warp_n}" for k in group],  # type: ignore[union-attr]
        "measured_s": meas,
        "predicted_s": pred,
        "pairs": pairs,
        "pairs_ordered": agree,
        "fastest_predicted_fastest": all(pred[fastest] * math.exp(ORDER_TIE) < p for p in others),
        # What the construction would run, ties broken as it breaks them: how much slower than the fastest.
        "pick_over_fastest": picked.seconds / meas[fastest],
        "spearman": spearman(pred, meas),
    }


#: Predicted times closer than this (in log) leave a pair of warp tiles unordered.
ORDER_TIE = 0.005


def _predicted(hw: HwProfile, k: Kernel) -> float:
    c = predict_tiles_time(k.dims, k.tiles, hw, k.dtype, k.gather)
    assert c is not None, f"{k.name} {k.tiles} does not fit {hw.name}"
    return c.total_s


def _block(t: Tiles) -> str:
    assert isinstance(t, TensorCoreTiles)
    return (
        f"block {t.block_m}x{t.block_n}x{t.block_k} {t.stages}st"
        + (f" split{t.split_k}" if t.split_k > 1 else "")
        + (f" {t.layout}" if t.layout != "nn" else "")
    )


def groups_score(hw: HwProfile, groups: list[list[Kernel]]) -> dict[str, Any]:
    rows = [group_order(hw, g) for g in groups]
    return {
        "groups": len(rows),
        "pairs": sum(r["pairs"] for r in rows),
        "pairs_ordered": sum(r["pairs_ordered"] for r in rows),
        "fastest_predicted_fastest": sum(r["fastest_predicted_fastest"] for r in rows),
        "median_spearman": statistics.median(r["spearman"] for r in rows),
        "picks_fastest": sum(r["pick_over_fastest"] == 1.0 for r in rows),
        "pick_over_fastest_geomean": math.exp(
            statistics.fmean(math.log(r["pick_over_fastest"]) for r in rows)
        ),
        "pick_over_fastest_max": max(r["pick_over_fastest"] for r in rows),
        "rows": rows,
    }


def fit_warp_tile(hw: HwProfile, table: list[Kernel]) -> tuple[Calibration, dict[str, float]]:
    """``WARP_GRID``'s values that minimise the mean |log(predicted / measured)| over the table's mma.sync
    GEMMs (then the highest Spearman), the profile's other constants held."""
    data = [k for k in table if kernel_class(k) == "mma.sync"]
    best: tuple[tuple[float, float], Calibration, dict[str, float]] | None = None
    for values in itertools.product(*WARP_GRID.values()):
        cal = dataclasses.replace(hw.calibration, **dict(zip(WARP_GRID, values, strict=True)))
        s = score_kernels(dataclasses.replace(hw, calibration=cal), data)
        key = (round(s["mean_abs_log_error"], 6), -s["spearman"])
        if best is None or key < best[0]:
            best = (key, cal, s)
    assert best is not None
    return best[1], best[2]


#: The bytes a warp keeps in flight when it gathers its operands (a convolution's implicit GEMM).
GATHER_GRID = [16.0 * i for i in range(1, 17)]


def fit_gather(hw: HwProfile, table: list[Kernel]) -> tuple[Calibration, dict[str, float]]:
    """``gather_flight_bytes`` that minimises the mean |log(predicted / measured)| over the convolutions."""
    convs = [k for k in table if k.gather]
    best: tuple[float, Calibration, dict[str, float]] | None = None
    for flight in GATHER_GRID:
        cal = dataclasses.replace(hw.calibration, gather_flight_bytes=flight)
        s = score_kernels(dataclasses.replace(hw, calibration=cal), convs)
        if best is None or s["mean_abs_log_error"] < best[0]:
            best = (s["mean_abs_log_error"], cal, s)
    assert best is not None
    return best[1], best[2]


def held_out(hw: HwProfile, table: list[Kernel]) -> dict[str, Any]:
    """Leave one GEMM out: each GEMM's mma.sync kernels (every dtype, layout and tiling of those dims)
    predicted with the warp-tile constants fitted on the other GEMMs; the error and the warp-tile groups'
    order of those out-of-sample predictions. Likewise each convolution with the gathers fitted on the others."""
    mma = [k for k in table if kernel_class(k) == "mma.sync"]
    errs: list[float] = []
    pred: list[float] = []
    meas: list[float] = []
    rows = []
    fitted = {}
    for dims in sorted({k.dims for k in mma}):
        cal, _ = fit_warp_tile(hw, [k for k in mma if k.dims != dims])
        fitted[str(dims)] = {name: getattr(cal, name) for name in WARP_GRID}
        out = dataclasses.replace(hw, calibration=cal)
        for k in (k for k in mma if k.dims == dims):
            p = _predicted(out, k)
            errs.append(abs(math.log(p / k.seconds)))
            pred.append(p)
            meas.append(k.seconds)
        rows += [group_order(out, g) for g in warp_tile_groups([k for k in mma if k.dims == dims])]
    conv_errs = []
    for dims in sorted({k.dims for k in table if k.gather}):
        cal, _ = fit_gather(hw, [k for k in table if k.dims != dims])
        fitted[f"conv {dims}"] = {"gather_flight_bytes": cal.gather_flight_bytes}
        out = dataclasses.replace(hw, calibration=cal)
        conv_errs += [
            abs(math.log(_predicted(out, k) / k.seconds)) for k in table if k.gather and k.dims == dims
        ]
    return {
        "conv_kernels": len(conv_errs),
        "conv_median_abs_log_error": statistics.median(conv_errs) if conv_errs else None,
        "kernels": len(errs),
        "mean_abs_log_error": statistics.fmean(errs),
        "median_abs_log_error": statistics.median(errs),
        "median_error_factor": math.exp(statistics.median(errs)),
        "spearman": spearman(pred, meas),
        "groups": len(rows),
        "pairs": sum(r["pairs"] for r in rows),
        "pairs_ordered": sum(r["pairs_ordered"] for r in rows),
        "fastest_predicted_fastest": sum(r["fastest_predicted_fastest"] for r in rows),
        "fitted_without": fitted,
    }


def report(hw: HwProfile, table: list[Kernel]) -> dict[str, Any]:
    """The profile's errors over every measured kernel and its warp-tile groups' order (GEMMs; convolutions
    apart)."""
    groups = warp_tile_groups(table)
    return {
        "score": table_score(hw, table),
        "gemm_groups": groups_score(hw, [g for g in groups if g[0].kind == "gemm"]),
        "conv_groups": groups_score(hw, [g for g in groups if g[0].kind == "conv"]),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", type=Path)
    ap.add_argument("--hw", default="h200")
    ap.add_argument(
        "--warp-tile",
        action="store_true",
        help="fit only the warp-tile term (held out too) and the convolutions' gathers",
    )
    ap.add_argument("--out", type=Path, help="write the report to this JSON file")
    ap.add_argument("--before", type=Path, help="embed this earlier report (the code before a change)")
    args = ap.parse_args(argv)
    hw = load_profile(args.hw)
    table = calibration_table(args.results)
    if args.warp_tile:
        cal, _ = fit_warp_tile(hw, table)
        cal, _ = fit_gather(dataclasses.replace(hw, calibration=cal), table)
        fit = {name: getattr(cal, name) for name in (*WARP_GRID, "gather_flight_bytes")}
        got: dict[str, Any] = {
            "profile": report(hw, table),
            "warp_tile_fit": fit,
            "fitted": report(dataclasses.replace(hw, calibration=cal), table),
            "held_out": held_out(hw, table),
        }
    else:
        cal, after = calibrate(hw, measured_kernels_of([k for k in table if not k.gather]))
        got = {"profile": report(hw, table), "calibrated": after, "calibration": dataclasses.asdict(cal)}
    if args.before:
        got["before"] = json.loads(args.before.read_text())
    got["results"] = sorted(str(p) for p in args.results)
    got["machine"] = machine_info()
    text = json.dumps(got, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

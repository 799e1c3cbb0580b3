"""The tensor-core construction's picks on the GPU suite's GEMM set and convolutions (model only, no GPU).

For Gensor Table IV's GEMMs, the LLaMA-3-8B projections at M = 16 and 4096 (``benchmarks/gpu_shapes.py``'s
GEMMS) and Table IV's convolutions, in float16: the ``mma.sync`` tiles :func:`construct_tensor_core` picks
(what the suite's ``constructed`` cases run), the tiles :func:`construct_matmul_tiles` picks with wgmma and TMA
in the space (``--wgmma-picks``), and their predicted times. ``--before FILE`` embeds a report written the same
way by the code before a change and marks the picks that changed; every pick is annotated with its measured
time where the committed H200 results timed those tiles (``calibrate_tensor_core.calibration_table``). Usage::

    python benchmarks/construction_picks.py --hw h200 [--before FILE] [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine_info  # noqa: E402
from benchmarks.gpu_shapes import CONVS, GEMMS  # noqa: E402
from gensorage.construction.tensor_core import construct_matmul_tiles, construct_tensor_core  # noqa: E402
from gensorage.hw import load_profile  # noqa: E402
from gensorage.hw.profile import HwProfile  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def _row(tiles: Any, predicted_s: float) -> dict[str, Any]:
    return {
        "instruction": type(tiles).__name__,
        "tiles": dataclasses.asdict(tiles),
        "predicted_s": predicted_s,
    }


def picks(hw: HwProfile, dtype: str = "float16") -> dict[str, dict[str, Any]]:
    """Per shape name: the mma.sync pick (``constructed``) and, for GEMMs, the pick with wgmma/TMA (``both``)."""
    out: dict[str, dict[str, Any]] = {}
    for name, (m, n, k) in GEMMS.items():
        dims = (1, m, n, k)
        t, c = construct_tensor_core(dims, hw, dtype)
        both, cost = construct_matmul_tiles(dims, hw, dtype, tma=True)
        out[name] = {"dims": list(dims), "constructed": _row(t, c.total_s), "both": _row(both, cost.total_s)}
    for name, conv in CONVS.items():
        t, c = construct_tensor_core(conv.gemm, hw, dtype, split=False, gather=True)
        out[name] = {"dims": list(conv.gemm), "constructed": _row(t, c.total_s)}
    return out


def _measured(dtype: str) -> dict[tuple[Any, ...], tuple[float, int]]:
    """(dims, tiles as a sorted tuple of their fields) -> (median of the H200's medians, runs)."""
    from benchmarks.calibrate_tensor_core import calibration_table

    table = calibration_table(sorted(RESULTS.glob("gpu_suite-h200-*.json")))
    return {
        (k.dims, _key(dataclasses.asdict(k.tiles))): (k.seconds, k.runs) for k in table if k.dtype == dtype
    }


def _key(tiles: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(sorted(tiles.items()))


def annotate(report: dict[str, dict[str, Any]], measured: dict[tuple[Any, ...], tuple[float, int]]) -> None:
    """Add the H200's measured time (and runs) to every pick the committed results timed."""
    for shape in report.values():
        for pick in (v for v in shape.values() if isinstance(v, dict)):
            got = measured.get((tuple(shape["dims"]), _key(pick["tiles"])))
            if got is not None:
                pick["measured_s"], pick["measured_runs"] = got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hw", default="h200")
    ap.add_argument("--before", type=Path, help="a report of the code before a change (its 'picks')")
    ap.add_argument("--label", default="", help="what this code is (kept in the report)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    got: dict[str, Any] = {"benchmark": "construction_picks", "hw": args.hw, "label": args.label}
    got["picks"] = picks(load_profile(args.hw))
    measured = _measured("float16")
    annotate(got["picks"], measured)
    if args.before:
        before = json.loads(args.before.read_text())
        annotate(before["picks"], measured)
        got["before"] = before
        got["changed"] = sorted(
            f"{name} {which}"
            for name, shape in got["picks"].items()
            for which in ("constructed", "both")
            if which in shape and shape[which]["tiles"] != before["picks"][name][which]["tiles"]
        )
    got["machine"] = machine_info()
    text = json.dumps(got, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

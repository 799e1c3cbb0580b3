"""Calibration sweeps of the GPU suite: many ``mma.sync`` tilings of a few GEMMs (what the tensor-core cost
model is fitted on) and split-k over small-M tilings, bundled like the suite's other GEMMs
(:mod:`benchmarks.gpu_prepare`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from benchmarks.gpu_prepare import _gemm_case, _variant_name
from gensorage.codegen.predefined_matmul import matmul_prim_func
from gensorage.codegen.tensor_core import RULE, TensorCoreTiles, build_config, schedule_tensor_core
from gensorage.construction.tensor_core import fits, predict_tensor_core_time
from gensorage.hw.profile import HwProfile


def sweep_cases(hw: HwProfile, out: Path, shapes: dict[str, tuple[int, int, int]]) -> list[dict[str, Any]]:
    """Many tilings of a few large GEMMs: what the cost model is calibrated on."""
    cases = []
    for name, (m, n, k) in shapes.items():
        for bm, bn in ((128, 128), (128, 256), (256, 128), (64, 128)):
            for bk in (32, 64):
                for stages in (2, 3, 4):
                    for frag in (True, False):
                        t = TensorCoreTiles(bm, bn, bk, 64, 64, stages, frag)
                        c = predict_tensor_core_time((1, m, n, k), t, hw)
                        if c is None:
                            continue
                        func = matmul_prim_func((m, k), (k, n), (m, n), "float16", "float16")
                        mod = schedule_tensor_core(func, t).mod
                        meta = {
                            "tiles": dataclasses.asdict(t),
                            "rule": f"{RULE}: {t.describe()}",
                            "tensor_cores": True,
                        }
                        cases.append(
                            _gemm_case(
                                name,
                                (m, n, k),
                                _variant_name(t),
                                mod,
                                build_config([RULE]),
                                hw,
                                out,
                                c.total_s,
                                meta,
                            )
                        )
    return cases


def split_sweep_cases(
    hw: HwProfile, out: Path, shapes: dict[str, tuple[int, int, int]]
) -> list[dict[str, Any]]:
    """Split-k 1-8 over a few small-M tilings of the named GEMMs: what split-k is calibrated on."""
    cases = []
    for name, (m, n, k) in shapes.items():
        for bn in (32, 64, 128):
            for split in (1, 2, 4, 8):
                t = TensorCoreTiles(16, bn, 64, 16, 16, 4, split_k=split)
                c = predict_tensor_core_time((1, m, n, k), t, hw)
                if c is None or not fits(t, (1, m, n, k)):
                    continue
                func = matmul_prim_func((m, k), (k, n), (m, n), "float16", "float16", split, t.block_m)
                mod = schedule_tensor_core(func, t).mod
                meta = {
                    "tiles": dataclasses.asdict(t),
                    "rule": f"{RULE}: {t.describe()}",
                    "tensor_cores": True,
                }
                config = build_config([RULE])
                cases.append(
                    _gemm_case(name, (m, n, k), _variant_name(t), mod, config, hw, out, c.total_s, meta)
                )
    return cases

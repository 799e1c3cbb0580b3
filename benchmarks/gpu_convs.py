"""The GPU suite's convolution cases: Gensor Table IV's convolutions as implicit GEMMs on tensor cores."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from benchmarks.gpu_prepare import _cubin, _kernel_entry, _variant_name
from gensorage.codegen.cuda_build import cuda_target
from gensorage.codegen.implicit_gemm import Conv2d, conv2d_tensor_core
from gensorage.codegen.launch import launch_specs
from gensorage.codegen.tensor_core import RULE, TensorCoreTiles, build_config
from gensorage.construction.tensor_core import construct_tensor_core, predict_tensor_core_time
from gensorage.hw.profile import HwProfile

#: The convolutions' fastest tilings measured on the H200 before their gathers were priced (C1; C2 and C3),
#: bundled beside the constructed ones so one run compares them.
CONV_VARIANTS: tuple[TensorCoreTiles, ...] = (
    TensorCoreTiles(128, 128, 64, 64, 16, 2),
    TensorCoreTiles(256, 128, 64, 64, 32, 2),
)


def conv_cases(
    hw: HwProfile, out: Path, convs: dict[str, Conv2d], dtype: str = "float16"
) -> list[dict[str, Any]]:
    """Each convolution's implicit GEMM on tensor cores, with the tiles the construction picks for it and
    the ``CONV_VARIANTS`` whose block fits its GEMM."""
    cases = []
    for shape_name, conv in convs.items():
        tiles, cost = construct_tensor_core(conv.gemm, hw, dtype, split=False, gather=True)
        chosen = [("constructed", tiles, cost.total_s)]
        _, m, n, _ = conv.gemm
        for v in CONV_VARIANTS:
            c = predict_tensor_core_time(conv.gemm, v, hw, dtype, gather=True)
            if v != tiles and c is not None and v.block_m <= m and v.block_n <= n:
                chosen.append((_variant_name(v), v, c.total_s))
        cases += [_conv_case(shape_name, conv, variant, t, s, hw, out, dtype) for variant, t, s in chosen]
    return cases


def _conv_case(
    shape_name: str,
    conv: Conv2d,
    variant: str,
    tiles: TensorCoreTiles,
    predicted_s: float,
    hw: HwProfile,
    out: Path,
    dtype: str,
) -> dict[str, Any]:
    # float16 keeps the bare name; another dtype is in the name, so its files do not overwrite these.
    name = shape_name if dtype == "float16" else f"{shape_name}_{dtype}"
    mod = conv2d_tensor_core(conv, tiles, dtype)
    config = build_config([RULE])
    cubin = _cubin(mod, hw, config, out, f"conv_{name}_{variant}")
    oh, ow = conv.out_hw
    names = ("X", "W", "Y")
    shapes = (
        (conv.n, conv.c, conv.h, conv.w),
        (conv.f, conv.c, conv.kh, conv.kw),
        (conv.n, conv.f, oh, ow),
    )
    _, m, n, k = conv.gemm
    return (
        {
            "name": f"conv_{name}_{variant}",
            "kind": "conv",
            "dtype": dtype,
            "tensors": [
                {"name": t, "shape": list(sh), "dtype": dtype, "role": r, "view_of": None}
                for t, sh, r in zip(names, shapes, ("input", "input", "output"), strict=True)
            ],
            "inputs_order": ["X", "W"],
            "outputs_order": ["Y"],
            "kernels": [_kernel_entry(la, cubin, names, shapes) for la in launch_specs(mod, cuda_target(hw), config)],
            "conv": {**{k2: getattr(conv, k2) for k2 in ("n", "c", "h", "w", "f", "kh", "kw")},
                     "stride": list(conv.stride), "padding": list(conv.padding)},
            "predicted_s": predicted_s,
            "flops": 2 * m * n * k,
            "min_bytes": 2 * (math.prod(shapes[0]) + math.prod(shapes[1]) + math.prod(shapes[2])),
            "meta": {"shape": shape_name, "variant": variant, "tiles": dataclasses.asdict(tiles),
                     "rule": f"{RULE} implicit GEMM {list(conv.gemm)}: {tiles.describe()}", "tensor_cores": True},
        }
    )  # fmt: skip

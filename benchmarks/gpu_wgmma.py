"""The GPU suite's wgmma GEMMs: Hopper ``wgmma.mma_async`` kernels (:mod:`gensorage.codegen.wgmma`) per GEMM.

Per shape that the kernel covers: the tiling the construction picks when the instruction is a level of its
state (``wgmma_constructed``, when it picks wgmma), and the fixed tilings of ``WGMMA_VARIANTS`` (so the device run tells which is best). Besides, ``smoke`` GEMMs:
one warpgroup, one stage, small shapes, one per N tile (64 uses one swizzle atom of B per wgmma, 128 and 256
also the descriptor's leading offset), and one with ragged M, N and K: when fast variants fail the float64
check, these say whether the basic fragment, descriptor and swizzle layout is right.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from benchmarks.gpu_prepare import _gemm_case
from gensorage.codegen.wgmma import RULE, WG_M, WgmmaTiles, target_profile, unsupported, wgmma_matmul
from gensorage.codegen.wgmma_tma import tensor_map_args
from gensorage.construction.tensor_core import construct_matmul_tiles, predict_tiles_time
from gensorage.hw.profile import HwProfile

#: wgmma tilings timed per GEMM (where the shape has the rows for them). The first H200 run
#: (gpu_suite-h200-wgmma-2026-11-26.json) measured 128x256 with three stages fastest on every large GEMM, and
#: 64x64 / 64x128 with four on the decode-sized ones; these are its neighbours: deeper rings, two wgmma groups in
#: flight, four warpgroups, two blocks per SM, the result staged through shared memory.
WGMMA_VARIANTS: tuple[WgmmaTiles, ...] = (
    WgmmaTiles(2, 256, 3),
    WgmmaTiles(2, 256, 3, staged=True),
    WgmmaTiles(2, 256, 4),
    WgmmaTiles(2, 256, 4, pending=2),
    WgmmaTiles(4, 128, 4),
    WgmmaTiles(2, 128, 3),
    WgmmaTiles(1, 128, 4),
    WgmmaTiles(1, 64, 4),
)

#: The fastest cp.async tiling of the large GEMMs on the H200 (gpu_suite-h200-wgmma-v2-2026-11-26.json and the
#: cp.async cases of gpu_suite-h200-tma25.json: 0.61-0.80x of cuBLAS), timed beside the TMA ones.
WGMMA_BEST: tuple[WgmmaTiles, ...] = (WgmmaTiles(2, 256, 4, pending=2),)

#: Warp-specialised TMA tilings (:mod:`gensorage.codegen.wgmma_tma`): 128x256 blocks with four slots (the most
#: that fit), one or two wgmma groups in flight, and 128x128 with six.
TMA_VARIANTS: tuple[WgmmaTiles, ...] = (
    WgmmaTiles(2, 256, 4, tma=True),
    WgmmaTiles(2, 256, 4, pending=2, tma=True),
    WgmmaTiles(2, 128, 6, tma=True),
)

#: TMA tilings also run on a persistent grid, one block per SM (``persistent`` set to the profile's SM count
#: by the suite): each block's ring runs on from tile to tile, so a tile's first copies overlap the previous
#: tile's last MMAs and write-back.
TMA_PERSISTENT: tuple[WgmmaTiles, ...] = TMA_VARIANTS

#: Small GEMMs that check the layouts one feature at a time: one warpgroup and one stage at each N tile (64:
#: one B atom per wgmma; 128 and 256 also the descriptor's leading offset), ragged shapes, two and four
#: warpgroups, two wgmma groups in flight, the result staged in shared memory.
SMOKE: dict[str, tuple[tuple[int, int, int], WgmmaTiles]] = {
    "smoke_n64": ((256, 256, 256), WgmmaTiles(1, 64, 1)),
    "smoke_n128": ((256, 256, 256), WgmmaTiles(1, 128, 1)),
    "smoke_n256": ((256, 256, 256), WgmmaTiles(1, 256, 1)),
    "smoke_ragged": ((200, 136, 200), WgmmaTiles(1, 64, 2)),
    "smoke_wg2_s3": ((512, 512, 512), WgmmaTiles(2, 128, 3)),
    "smoke_wg4_p2": ((300, 264, 520), WgmmaTiles(4, 64, 4, pending=2)),
    "smoke_staged": ((200, 136, 200), WgmmaTiles(2, 64, 2, staged=True)),
    # TMA loads: one consumer warpgroup (no setmaxnreg) over ragged shapes, then two (setmaxnreg) with the
    # ring wrapping several times, then four.
    "smoke_tma_ragged": ((200, 136, 200), WgmmaTiles(1, 64, 2, tma=True)),
    "smoke_tma_wg2": ((300, 520, 1000), WgmmaTiles(2, 128, 3, tma=True)),
    "smoke_tma_wg4_p2": ((300, 264, 520), WgmmaTiles(4, 64, 4, pending=2, tma=True)),
    # A persistent grid of 3 blocks over 5 x 5 ragged tiles of 3 steps (up to 9 tiles a block): the ring wraps
    # within and across tiles.
    "smoke_tma_persistent": ((300, 520, 136 + 8), WgmmaTiles(1, 128, 2, tma=True, persistent=3)),
}

#: The smoke GEMMs of a run after the layouts are known right: the ragged one and the newest features.
SMOKE_SHORT = ("smoke_ragged", "smoke_wg4_p2", "smoke_staged")
#: The smoke GEMMs of a TMA run: the cp.async ragged one (the runner's baseline) and the TMA ones.
SMOKE_TMA = ("smoke_ragged", "smoke_tma_ragged", "smoke_tma_wg2", "smoke_tma_wg4_p2", "smoke_tma_persistent")


def variant_name(t: WgmmaTiles) -> str:
    name = f"wgmma{t.block_m}x{t.block_n}s{t.stages}" + ("" if t.in_flight == 1 else f"p{t.in_flight}")
    return (
        name
        + ("st" if t.staged else "")
        + ("tma" if t.tma else "")
        + (f"x{t.persistent}" if t.persistent else "")
    )


def wgmma_case(
    name: str,
    dims: tuple[int, int, int],
    tiles: WgmmaTiles,
    hw: HwProfile,
    out: Path,
    dtype: str,
    variant: str,
    predicted: float | None = None,
    layout: str = "nn",
) -> dict[str, Any]:
    """One bundled wgmma GEMM (compiled for sm_90a); ``layout`` "nt": B stored [N, K], read K-major."""
    import tvm

    m, n, k = dims
    nt = layout == "nt"
    func = wgmma_matmul(
        (m, k), (n, k) if nt else (k, n), (m, n), dtype, dtype, tiles, maps_as_params=True, k_major_b=nt
    )
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    meta = {"tiles": dataclasses.asdict(tiles), "rule": f"{RULE}: {tiles.describe()}", "tensor_cores": True}
    # A TMA kernel's parameters 3 and 4 (A_map, B_map) are the tensor maps of A and B.
    maps = (
        {3 + i: (i, spec.as_json()) for i, spec in enumerate(tensor_map_args(m, n, k, dtype, tiles))}
        if tiles.tma
        else None
    )
    hw = target_profile(hw, [RULE])
    return _gemm_case(name, dims, variant, mod, {}, hw, out, predicted, meta, dtype, maps, layout)


def wgmma_cases(
    hw: HwProfile,
    out: Path,
    shapes: dict[str, tuple[int, int, int]],
    dtype: str = "float16",
    variants: tuple[WgmmaTiles, ...] = WGMMA_VARIANTS,
    tma: bool = False,
    layout: str = "nn",
) -> list[dict[str, Any]]:
    """Per shape the wgmma tilings of ``variants`` that fit it and the device's shared memory, and the one the
    construction picks (``tma``: with the TMA kernels in its space; ``layout`` "nt": B stored [N, K])."""
    cases = []
    for name, (m, n, k) in shapes.items():
        if unsupported(m, n, k):
            continue
        dims4 = (1, m, n, k)
        picked, cost = construct_matmul_tiles(dims4, hw, dtype, tma=tma, layout=layout)
        chosen = [("wgmma_constructed", picked, cost.total_s)] if isinstance(picked, WgmmaTiles) else []
        for t in variants:
            if t == picked or t.block_m > max(64, m) or predict_tiles_time(dims4, t, hw, dtype) is None:
                continue
            if t.warpgroups == 1 and m > WG_M:  # measured slower than two warpgroups on every large GEMM
                continue
            c = predict_tiles_time(dims4, t, hw, dtype)
            chosen.append((variant_name(t), t, None if c is None else c.total_s))
        for variant, t, predicted in chosen:
            cases.append(wgmma_case(name, (m, n, k), t, hw, out, dtype, variant, predicted, layout))
    return cases


def smoke_cases(
    hw: HwProfile,
    out: Path,
    dtype: str = "float16",
    names: tuple[str, ...] = tuple(SMOKE),
    layout: str = "nn",
) -> list[dict[str, Any]]:
    return [
        wgmma_case(name, *SMOKE[name], hw, out, dtype, variant_name(SMOKE[name][1]), None, layout)
        for name in names
    ]

"""The GPU suite's GEMM and convolution shapes (bundled by ``benchmarks/gpu_prepare.py``)."""

from __future__ import annotations

from gensorage.codegen.implicit_gemm import Conv2d

#: Gensor Table IV (M, N, K) and the LLaMA-3-8B projections (q/o, k/v, gate/up, down) at M = 16 and 4096.
GEMMS: dict[str, tuple[int, int, int]] = {
    "M1": (8192, 8192, 8192),
    "M2": (65536, 1024, 4),
    "M3": (65536, 4096, 1024),
    **{
        f"llama_{proj}_m{m}": (m, n, k)
        for m in (16, 4096)
        for proj, (n, k) in {
            "qo": (4096, 4096),
            "kv": (1024, 4096),
            "gateup": (14336, 4096),
            "down": (4096, 14336),
        }.items()
    },
}

#: The LLaMA-3-8B projections at a prefill of 128 tokens (bundled when named, beside GEMMS' M = 16 and 4096).
PREFILL_GEMMS: dict[str, tuple[int, int, int]] = {
    f"llama_{proj}_m128": (128, n, k)
    for proj, (n, k) in {
        "qo": (4096, 4096),
        "kv": (1024, 4096),
        "gateup": (14336, 4096),
        "down": (4096, 14336),
    }.items()
}

#: Gensor Table IV's convolutions (configs/ops/1_gensor_table4.toml: NCHW, padding 0), as implicit GEMMs.
CONVS: dict[str, Conv2d] = {
    "C1": Conv2d(128, 256, 30, 30, 256, 3, 3, (2, 2)),
    "C2": Conv2d(128, 128, 28, 28, 128, 3, 3),
    "C3": Conv2d(128, 128, 58, 58, 128, 3, 3, (2, 2)),
}

#: Decode-sized GEMMs of the bundled programs (gated_mlp, mlp: 8 tokens; lora: 16) swept for split-k.
EXTRA_GEMMS: dict[str, tuple[int, int, int]] = {
    "decode_t8": (8, 4096, 4096),
    "decode_t8_wide": (8, 14336, 4096),
}

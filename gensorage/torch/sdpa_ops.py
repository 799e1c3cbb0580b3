"""The aten attention operators ``scaled_dot_product_attention`` decomposes to, and the order of their arguments.

Which one a captured graph holds depends on the device and torch's build: the CPU flash kernel on CPU tensors, the
flash, memory-efficient, cuDNN or backend-overridable one on a GPU. Output 0 is the attention; the others (the
log-sum-exp, RNG state, a debug mask) are for training.
"""

from __future__ import annotations

from collections.abc import Sequence

SDPA_ARGS: dict[str, Sequence[str]] = {
    "aten._scaled_dot_product_flash_attention_for_cpu.default": (
        "query",
        "key",
        "value",
        "dropout_p",
        "is_causal",
    ),
    "aten._scaled_dot_product_flash_attention.default": (
        "query",
        "key",
        "value",
        "dropout_p",
        "is_causal",
        "return_debug_mask",
    ),
    "aten._scaled_dot_product_efficient_attention.default": (
        "query",
        "key",
        "value",
        "attn_bias",
        "compute_log_sumexp",
        "dropout_p",
        "is_causal",
    ),
    # cuDNN's attention and the backend-overridable one: what SDPA decomposes to on some GPUs (an H200 with
    # torch 2.11 gave the cuDNN one), output 0 the attention, the others log-sum-exp and RNG state.
    "aten._scaled_dot_product_cudnn_attention.default": (
        "query",
        "key",
        "value",
        "attn_bias",
        "compute_log_sumexp",
        "dropout_p",
        "is_causal",
        "return_debug_mask",
    ),
    "aten._scaled_dot_product_fused_attention_overrideable.default": (
        "query",
        "key",
        "value",
        "attn_bias",
        "dropout_p",
        "is_causal",
        "return_debug_mask",
    ),
    "aten.scaled_dot_product_attention.default": (
        "query",
        "key",
        "value",
        "attn_mask",
        "dropout_p",
        "is_causal",
    ),
}

__all__ = ["SDPA_ARGS"]

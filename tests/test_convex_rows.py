"""Attention's output ``(E·V) / Σ E`` (``E ≥ 0``) is stored in ``V``'s dtype (gensorage.ugraph.convex_rows), and
a row-fused softmax's probabilities in the program's dtype (range proofs through a block's thread graphs).

Each row is a convex combination of ``V``'s rows, so ``V``'s dtype holds it, and the o-projection that reads it
multiplies 16-bit operands: in float16 that keeps the weight's 11 significant bits where a float32 operand made the
matmul multiply in bfloat16 (8). Checked on the stored dtypes, then end to end on the CPU (llvm build) against
float64 with values up to 3·10⁴ (a convex combination cannot overflow float16) and attention-sink logits.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gensorage.codegen.module import CompiledUGraph, compile_ugraph
from gensorage.hw import load_profile
from gensorage.opset import Op
from gensorage.program import Program
from gensorage.ugraph import from_program
from gensorage.ugraph.examples import flash_attention2
from gensorage.ugraph.ir import GraphDefinedOp, KernelGraph, KernelOp, Ref
from gensorage.ugraph.optimize.fuse_rows import fuse_rows
from gensorage.ugraph.shapes import infer

HW = load_profile("h100")


def attention_then_projection(
    dtype: str, weights=lambda p, s: p.exp(p.sub(s, p.max(s, dim=2, keepdim=True))), dim: int = 2
) -> Program:  # type: ignore[no-untyped-def]
    """softmax(Q K / √d) V as ``(E·V) / Σ E``, then an o-projection ``W``."""
    p = Program("attn_o")
    q = p.input("Q", (2, 8, 16), dtype)
    k = p.input("K", (2, 16, 16), dtype)
    v = p.input("V", (2, 16, 16), dtype)
    w = p.input("W", (16, 24), dtype)
    e = weights(p, p.scale(p.matmul(q, k), 0.25))
    p.output(p.matmul(p.div(p.matmul(e, v), p.sum(e, dim=dim, keepdim=True)), w))
    return p


def stored(p: Program) -> list[str]:
    g = from_program(p)
    info = infer(g)
    return [info.nodes[len(g.inputs) + k][0].dtype for k in range(len(g.ops))]


def test_the_division_is_stored_in_the_values_dtype() -> None:
    for dtype in ("float16", "bfloat16"):
        # matmul, scale, max, sub (into exp: float32), exp (in (0, 1]), E·V and Σ E (sums: float32), the
        # division (V's dtype), W
        assert stored(attention_then_projection(dtype))[-4:] == ["float32", "float32", dtype, dtype]
    # Unstabilised weights: exp is float32 and so is E·V, but the division is still a convex combination of V.
    assert stored(attention_then_projection("float16", lambda p, s: p.exp(s)))[-2] == "float16"
    # Weights that may be negative prove nothing (a square's sum would, but the rule asks for an exp).
    assert stored(attention_then_projection("float16", lambda p, s: p.scale(s, -1.0)))[-2] == "float32"
    # A sum over another dim than the matmul's reduction proves nothing either.
    square = attention_then_projection("float16", dim=1)
    assert stored(square)[-2] == "float32"


def test_flash_attention_saves_its_output_in_the_values_dtype() -> None:
    # FlashAttention-2's o / l after the loop (%4), read by a matmul in the next kernel (by Kᵀ, %3: any float16
    # operand will do). Before the rule the saver stored float32 (a division), the matmul's operand.
    _, g = flash_attention2(dtype="float16")
    graph = KernelGraph(g.inputs, (*g.ops, KernelOp(Op.MATMUL, (Ref(4), Ref(3)))), (Ref(5),))
    info = infer(graph)
    (flash,) = [b for b in info.blocks if b is not None]
    assert [o.dtype for o in flash.outputs] == ["float16"]


def sink_inputs(rng: np.random.Generator, logit: float, v_scale: float) -> list[np.ndarray]:
    q = rng.standard_normal((2, 8, 16))
    k = rng.standard_normal((2, 16, 16)) / 4
    q[..., 0], k[:, 0, :] = 1.0, 0.0
    k[:, 0, 0] = 4 * logit  # every query's score of key 0 is about ``logit`` after the 1/4 scale
    v = v_scale * np.clip(rng.standard_normal((2, 16, 16)), -2, 2) / 2
    return [q, k, v, rng.standard_normal((16, 24)) / (4 * math.sqrt(max(v_scale, 1.0)))]


@functools.cache
def llvm_build() -> CompiledUGraph:
    """The float16 program's direct µGraph, built once for llvm (the examples differ in data only)."""
    return compile_ugraph(from_program(attention_then_projection("float16")), HW, "llvm")


@settings(max_examples=12, deadline=None)
@given(
    logit=st.sampled_from([0.0, 10.0, 40.0]),
    v_scale=st.sampled_from([1.0, 300.0, 3e4]),
    seed=st.integers(0, 2**16),
)
def test_float16_attention_then_projection_against_float64(logit: float, v_scale: float, seed: int) -> None:
    # Before the rule the float16 o-projection multiplied in bfloat16: 2.2e-3 to 2.7e-3 relative on N(0, 1)
    # data (dev, 2026-11-28); with float16 operands 5.6e-4 to 7.0e-4, eager's level. And E·V was stored in
    # float16: 16 keys of weight ~1 by values up to 3e4 overflowed to inf.
    p = attention_then_projection("float16")
    xs = sink_inputs(np.random.default_rng(seed), logit, v_scale)
    want = p.run(*xs)[0]
    got = llvm_build().run(*xs, target="cpu")[0].astype(np.float64)
    assert np.isfinite(got).all()
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1.2e-3


def test_a_row_fused_softmax_stores_its_probabilities_in_the_program_dtype() -> None:
    # Row fusion puts exp(S − max S) in one thread graph, its block sum between, the division in the next: the
    # range proof runs through the block's operators, so P (in [0, 1]) stays float16 and P·V, then the
    # projection, multiply float16 operands (P was float32: each matmul multiplied in bfloat16).
    p = Program("softmax_pv_proj")
    s = p.input("S", (2, 8, 16), "float16")
    v = p.input("V", (2, 16, 16), "float16")
    w = p.input("W", (16, 24), "float16")
    p.output(p.matmul(p.matmul(p.softmax(s, dim=2), v), w))
    g = fuse_rows(from_program(p), HW)
    info = infer(g)
    (fused,) = [k for k, op in enumerate(g.ops) if isinstance(op, GraphDefinedOp)]
    assert [o.dtype for o in info.blocks[fused].outputs] == ["float16"]  # type: ignore[union-attr]
    assert [info.nodes[len(g.inputs) + k][0].dtype for k in range(fused + 1, len(g.ops))] == ["float16"] * 2

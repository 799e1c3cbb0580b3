# The IR constructors normalise bare node indices, (node, out) pairs and attribute dicts; the field annotations
# give the normalised types, so mypy flags the shorthand used throughout this file.
# mypy: disable-error-code="arg-type"
"""Hand-built µGraphs of the papers' figures, each with the program it computes.

Every builder takes the shape parameters (and the schedule: grid and for-loop sizes, which must divide the
dims they split) and returns ``(program, ugraph)``. Defaults are small so tests evaluate them quickly;
:data:`EXAMPLES` lists them by name. Attention's softmax is the Lax form ``exp(S) / Σ exp(S)`` (no max
subtraction), as in Mirage.

Layouts: attention keys are stored transposed, ``K[h, d, S]``, since the op set has no transpose.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from gensorage.opset import Op
from gensorage.program import Program
from gensorage.ugraph.ir import (
    Accumulator,
    BlockGraph,
    BlockNode,
    BlockOp,
    GraphDefinedOp,
    InputIterator,
    KernelGraph,
    KernelOp,
    OutputSaver,
    Ref,
    TensorSpec,
    ThreadGraph,
    ThreadOp,
)
from gensorage.ugraph.rewrite import drop_loop

Example = tuple[Program, KernelGraph]


def _block(grid: tuple[int, ...], forloop: int, nodes: tuple[BlockNode, ...]) -> BlockGraph:
    """The block graph; written with a loop, it is made loop-free (and valid) when ``forloop`` is 1."""
    block = BlockGraph(grid, forloop, nodes)
    return drop_loop(block) if forloop == 1 else block


def _specs(p: Program) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(t.name, t.shape, t.dtype) for t in p.inputs)


def _sum(x: int, dim: int) -> BlockOp:
    return BlockOp(Op.SUM, (x,), {"dim": dim, "keepdim": True})


def _exp_scaled(x: int, factor: float) -> ThreadGraph:
    """Thread graph ``exp(factor * x)`` (the scaled softmax numerator, fused in registers)."""
    return ThreadGraph((x,), (ThreadOp(Op.SCALE, (0,), {"factor": factor}), ThreadOp(Op.EXP, (1,))), (2,))


def _attention_program(p: Program, q: object, k: object, v: object, head_dim: int) -> object:
    s = p.scale(p.matmul(q, k), 1.0 / math.sqrt(head_dim))  # type: ignore[arg-type]
    e = p.exp(s)
    return p.matmul(p.div(e, p.sum(e, dim=2)), v)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------- RMSNorm + MatMul


def rmsnorm_matmul(
    batch: int = 4,
    hidden: int = 16,
    out: int = 12,
    *,
    blocks: int = 3,
    forloop: int = 4,
    dtype: str = "float16",
) -> Example:
    """RMSNorm followed by MatMul (later paper, Fig. 3): ``Z = (X ⊙ G / sqrt(mean(X²))) W``.

    One graph-defined kernel; blocks split W's columns, the for-loop walks the hidden dim accumulating
    ``Σ X²`` and ``(X ⊙ G) W`` side by side; after the loop a thread graph computes ``B / sqrt(A / hidden)``.
    """
    p = Program("rmsnorm_matmul")
    x = p.input("X", (batch, hidden), dtype)
    g = p.input("G", (hidden,), dtype)
    w = p.input("W", (hidden, out), dtype)
    rms = p.sqrt(p.scale(p.sum(p.mul(x, x), dim=1), 1.0 / hidden))
    p.output(p.matmul(p.div(p.mul(x, g), rms), w))
    nodes: tuple[BlockNode, ...] = (
        InputIterator(0, (None,), 1),  # #0 X tile [batch, hidden/forloop]
        InputIterator(1, (None,), 0),  # #1 G tile [hidden/forloop]
        InputIterator(2, (1,), 0),  # #2 W tile [hidden/forloop, out/blocks]
        BlockOp(Op.MUL, (0, 0)),  # #3 X²
        _sum(3, 1),  # #4 Σ_j X²  [batch, 1]
        BlockOp(Op.MUL, (0, 1)),  # #5 X ⊙ G
        BlockOp(Op.MATMUL, (5, 2)),  # #6 (X ⊙ G) W
        Accumulator(4),  # #7 A
        Accumulator(6),  # #8 B
        ThreadGraph(  # #9 B / sqrt(A / hidden)
            (7, 8),
            (
                ThreadOp(Op.SCALE, (0,), {"factor": 1.0 / hidden}),
                ThreadOp(Op.SQRT, (2,)),
                ThreadOp(Op.DIV, (1, 3)),
            ),
            (4,),
        ),
        OutputSaver(9, (1,)),
    )
    kernel = GraphDefinedOp(_block((blocks,), forloop, nodes), (0, 1, 2))
    return p, KernelGraph(_specs(p), (kernel,), (3,))


# ---------------------------------------------------------------------------------------------------- GQA


def gqa(
    kv_heads: int = 2,
    group: int = 4,
    q_len: int = 1,
    kv_len: int = 24,
    head_dim: int = 8,
    *,
    kv_splits: int = 3,
    forloop: int = 2,
    out_splits: int = 2,
    dtype: str = "float16",
) -> Example:
    """Group-query attention as Mirage found it (first paper, Fig. 4c): two graph-defined kernels, no repeat.

    Kernel 1 (grid ``kv_heads x kv_splits``) gives one block a KV head, its ``group`` query heads and a slice
    of the KV sequence; a block-level reshape stacks the query heads into rows (``[g, s, d] -> [1, g*s, d]``) so
    both matmuls are matrix-matrix. The loop walks the block's KV slice accumulating ``exp(QK)V`` and
    ``Σ exp(QK)``; the partials are saved with the split along a new dim. Kernel 2 (grid
    ``kv_heads x out_splits``) sums the partials over the splits, divides and reshapes back to heads.
    """
    heads = kv_heads * group
    p = Program("gqa")
    q = p.input("Q", (heads, q_len, head_dim), dtype)
    k = p.input("K", (kv_heads, head_dim, kv_len), dtype)
    v = p.input("V", (kv_heads, kv_len, head_dim), dtype)
    p.output(_attention_program(p, q, p.repeat(k, 0, group), p.repeat(v, 0, group), head_dim))  # type: ignore[arg-type]
    rows = group * q_len
    k1: tuple[BlockNode, ...] = (
        InputIterator(0, (0, None)),  # #0 Q tile [group, q_len, d]
        InputIterator(1, (0, 2), 2),  # #1 K tile [1, d, kv_len/kv_splits/forloop]
        InputIterator(2, (0, 1), 1),  # #2 V tile [1, S_tile, d]
        BlockOp(Op.RESHAPE, (0,), {"shape": (1, rows, head_dim)}),  # #3
        BlockOp(Op.MATMUL, (3, 1)),  # #4 [1, rows, S_tile]
        _exp_scaled(4, 1.0 / math.sqrt(head_dim)),  # #5
        _sum(5, 2),  # #6 [1, rows, 1]
        BlockOp(Op.MATMUL, (5, 2)),  # #7 [1, rows, d]
        Accumulator(7),  # #8
        Accumulator(6),  # #9
        BlockOp(Op.RESHAPE, (8,), {"shape": (1, rows, 1, head_dim)}),  # #10
        BlockOp(Op.RESHAPE, (9,), {"shape": (1, rows, 1, 1)}),  # #11
        OutputSaver(10, (0, 2)),  # A [kv_heads, rows, kv_splits, d]
        OutputSaver(11, (0, 2)),  # B [kv_heads, rows, kv_splits, 1]
    )
    k2: tuple[BlockNode, ...] = (
        InputIterator(0, (0, 3)),  # #0 A tile [1, rows, kv_splits, d/out_splits]
        InputIterator(1, (0, None)),  # #1 B tile [1, rows, kv_splits, 1]
        _sum(0, 2),  # #2
        _sum(1, 2),  # #3
        BlockOp(Op.DIV, (2, 3)),  # #4 [1, rows, 1, d/out_splits]
        BlockOp(Op.RESHAPE, (4,), {"shape": (group, q_len, head_dim // out_splits)}),  # #5
        OutputSaver(5, (0, 2)),  # O [heads, q_len, d]
    )
    ops = (
        GraphDefinedOp(_block((kv_heads, kv_splits), forloop, k1), (0, 1, 2)),  # %3
        GraphDefinedOp(_block((kv_heads, out_splits), 1, k2), (Ref(3, 0), Ref(3, 1))),  # %4
    )
    return p, KernelGraph(_specs(p), ops, (4,))


# --------------------------------------------------------------------------------------------------- LoRA


def lora(
    m: int = 4,
    k: int = 8,
    n: int = 12,
    rank: int = 2,
    *,
    n_blocks: int = 3,
    m_blocks: int = 2,
    dtype: str = "float16",
) -> Example:
    """LoRA (later paper, Fig. 9): ``X W + (X A) B = (X ‖ X A)(W ‖ B)`` in one kernel.

    Blocks split the output's columns (x) and rows (y); each computes ``X A`` for its rows, then one matmul of
    the two concatenations in shared memory.
    """
    p = Program("lora")
    x = p.input("X", (m, k), dtype)
    w = p.input("W", (k, n), dtype)
    a = p.input("A", (k, rank), dtype)
    b = p.input("B", (rank, n), dtype)
    p.output(p.add(p.matmul(x, w), p.matmul(p.matmul(x, a), b)))
    nodes: tuple[BlockNode, ...] = (
        InputIterator(0, (None, 0)),  # #0 X tile [m/m_blocks, k]
        InputIterator(1, (1, None)),  # #1 W tile [k, n/n_blocks]
        InputIterator(2, (None, None)),  # #2 A [k, rank]
        InputIterator(3, (1, None)),  # #3 B tile [rank, n/n_blocks]
        BlockOp(Op.MATMUL, (0, 2)),  # #4 X A
        BlockOp(Op.CONCAT, (0, 4), {"dim": 1}),  # #5 X ‖ X A
        BlockOp(Op.CONCAT, (1, 3), {"dim": 0}),  # #6 W ‖ B
        BlockOp(Op.MATMUL, (5, 6)),  # #7
        OutputSaver(7, (1, 0)),
    )
    kernel = GraphDefinedOp(_block((n_blocks, m_blocks), 1, nodes), (0, 1, 2, 3))
    return p, KernelGraph(_specs(p), (kernel,), (4,))


# --------------------------------------------------------------------------------------------- Gated MLP


def gated_mlp(
    m: int = 4,
    k: int = 16,
    n: int = 12,
    *,
    blocks: int = 3,
    forloop: int = 4,
    dtype: str = "float16",
) -> Example:
    """Gated MLP (later paper, Fig. 10): ``silu(X W1) ⊙ (X W2)``.

    Both matmuls run in one block graph looped over ``k``; after the loop a thread graph applies SiLU and the
    product.
    """
    p = Program("gated_mlp")
    x = p.input("X", (m, k), dtype)
    w1 = p.input("W1", (k, n), dtype)
    w2 = p.input("W2", (k, n), dtype)
    p.output(p.mul(p.silu(p.matmul(x, w1)), p.matmul(x, w2)))
    nodes: tuple[BlockNode, ...] = (
        InputIterator(0, (None,), 1),  # #0 X tile [m, k/forloop]
        InputIterator(1, (1,), 0),  # #1 W1 tile [k/forloop, n/blocks]
        InputIterator(2, (1,), 0),  # #2 W2 tile
        BlockOp(Op.MATMUL, (0, 1)),  # #3
        BlockOp(Op.MATMUL, (0, 2)),  # #4
        Accumulator(3),  # #5
        Accumulator(4),  # #6
        ThreadGraph((5, 6), (ThreadOp(Op.SILU, (0,)), ThreadOp(Op.MUL, (2, 1))), (3,)),  # #7
        OutputSaver(7, (1,)),
    )
    kernel = GraphDefinedOp(_block((blocks,), forloop, nodes), (0, 1, 2))
    return p, KernelGraph(_specs(p), (kernel,), (3,))


# ------------------------------------------------------------------------------------------ FlashAttention


def flash_attention(
    heads: int = 2,
    q_len: int = 8,
    kv_len: int = 12,
    head_dim: int = 4,
    *,
    q_blocks: int = 2,
    forloop: int = 3,
    dtype: str = "float16",
) -> Example:
    """FlashAttention for multi-head attention (prefill): one kernel, grid ``heads x q_blocks``.

    The loop walks KV tiles accumulating ``exp(QK/√d) V`` and ``Σ exp(QK/√d)``; one division after the loop.
    """
    p = Program("flash_attention")
    q = p.input("Q", (heads, q_len, head_dim), dtype)
    k = p.input("K", (heads, head_dim, kv_len), dtype)
    v = p.input("V", (heads, kv_len, head_dim), dtype)
    p.output(_attention_program(p, q, k, v, head_dim))  # type: ignore[arg-type]
    nodes: tuple[BlockNode, ...] = (
        InputIterator(0, (0, 1)),  # #0 Q tile [1, q_len/q_blocks, d]
        InputIterator(1, (0, None), 2),  # #1 K tile [1, d, kv_len/forloop]
        InputIterator(2, (0, None), 1),  # #2 V tile [1, kv_len/forloop, d]
        BlockOp(Op.MATMUL, (0, 1)),  # #3 S
        _exp_scaled(3, 1.0 / math.sqrt(head_dim)),  # #4 E
        _sum(4, 2),  # #5 Σ E
        BlockOp(Op.MATMUL, (4, 2)),  # #6 E V
        Accumulator(6),  # #7
        Accumulator(5),  # #8
        BlockOp(Op.DIV, (7, 8)),  # #9
        OutputSaver(9, (0, 1)),
    )
    kernel = GraphDefinedOp(_block((heads, q_blocks), forloop, nodes), (0, 1, 2))
    return p, KernelGraph(_specs(p), (kernel,), (3,))


# ----------------------------------------------------------------------------------------- FlashDecoding


def flash_decoding(
    heads: int = 4,
    kv_len: int = 24,
    head_dim: int = 4,
    *,
    group: int = 1,
    splits: int = 3,
    forloop: int = 2,
    dtype: str = "float16",
) -> Example:
    """FlashDecoding (first paper, Fig. 4b): split-KV across blocks, then a reduction kernel.

    Decode has one query token. Kernel 1 (grid ``heads x splits``) loops over its KV slice accumulating the
    partial ``exp(QK/√d) V`` and ``Σ exp(QK/√d)``, saved with the splits along dim 1; kernel 2 (grid
    ``heads``) sums the partials and divides. With ``group > 1`` this is GQA the FlashDecoding way: K and V
    have ``heads / group`` heads and pre-defined Repeat kernels replicate them first.
    """
    kv_heads, rem = divmod(heads, group)
    if rem:
        raise ValueError(f"group {group} must divide heads {heads}")
    p = Program("flash_decoding")
    q = p.input("Q", (heads, 1, head_dim), dtype)
    k = p.input("K", (kv_heads, head_dim, kv_len), dtype)
    v = p.input("V", (kv_heads, kv_len, head_dim), dtype)
    kk, vv = (p.repeat(k, 0, group), p.repeat(v, 0, group)) if group > 1 else (k, v)
    p.output(_attention_program(p, q, kk, vv, head_dim))
    k1: tuple[BlockNode, ...] = (
        InputIterator(0, (0, None)),  # #0 Q tile [1, 1, d]
        InputIterator(1, (0, 2), 2),  # #1 K tile [1, d, kv_len/splits/forloop]
        InputIterator(2, (0, 1), 1),  # #2 V tile
        BlockOp(Op.MATMUL, (0, 1)),  # #3
        _exp_scaled(3, 1.0 / math.sqrt(head_dim)),  # #4
        _sum(4, 2),  # #5 [1, 1, 1]
        BlockOp(Op.MATMUL, (4, 2)),  # #6 [1, 1, d]
        Accumulator(6),  # #7
        Accumulator(5),  # #8
        OutputSaver(7, (0, 1)),  # A [heads, splits, d]
        OutputSaver(8, (0, 1)),  # B [heads, splits, 1]
    )
    k2: tuple[BlockNode, ...] = (
        InputIterator(0, (0,)),  # #0 A tile [1, splits, d]
        InputIterator(1, (0,)),  # #1 B tile [1, splits, 1]
        _sum(0, 1),  # #2
        _sum(1, 1),  # #3
        BlockOp(Op.DIV, (2, 3)),  # #4 [1, 1, d]
        OutputSaver(4, (0,)),
    )
    ops: list[KernelOp | GraphDefinedOp] = []
    kv = (Ref(1), Ref(2))
    if group > 1:
        ops = [
            KernelOp(Op.REPEAT, (1,), {"dim": 0, "times": group}),
            KernelOp(Op.REPEAT, (2,), {"dim": 0, "times": group}),
        ]
        kv = (Ref(3), Ref(4))
    first = 3 + len(ops)
    ops.append(GraphDefinedOp(_block((heads, splits), forloop, k1), (Ref(0),) + kv))
    ops.append(GraphDefinedOp(_block((heads,), 1, k2), (Ref(first, 0), Ref(first, 1))))
    return p, KernelGraph(_specs(p), tuple(ops), (first + 1,))


# -------------------------------------------------------------------- stable attention (online softmax)


def stable_attention_program(p: Program, q: object, k: object, v: object, head_dim: int) -> object:
    """``softmax(Q Kᵀ/√d) V`` with the max-subtracting softmax and K as models keep it, ``[heads, keys, dim]``."""
    s = p.scale(p.matmul(q, p.transpose(k, 1, 2)), 1.0 / math.sqrt(head_dim))  # type: ignore[arg-type]
    return p.matmul(p.softmax(s, dim=2), v)  # type: ignore[arg-type]


def _stable_inputs(name: str, heads: int, q_len: int, kv_len: int, head_dim: int, dtype: str) -> Program:
    p = Program(name)
    q = p.input("Q", (heads, q_len, head_dim), dtype)
    k = p.input("K", (heads, kv_len, head_dim), dtype)
    v = p.input("V", (heads, kv_len, head_dim), dtype)
    p.output(stable_attention_program(p, q, k, v, head_dim))  # type: ignore[arg-type]
    return p


_TRANSPOSE_K = KernelOp(Op.TRANSPOSE, (1,), {"dim0": 1, "dim1": 2})  # %3: Kᵀ [heads, dim, keys]


def flash_attention2(
    heads: int = 2,
    q_len: int = 8,
    kv_len: int = 12,
    head_dim: int = 4,
    *,
    q_blocks: int = 2,
    forloop: int = 3,
    dtype: str = "float16",
) -> Example:
    """FlashAttention-2 for the stable program: K transposed, then one kernel whose loop over the keys keeps the
    online-softmax accumulators (running max, rescaled ``Σ exp(S − m)`` and ``exp(S − m) V``); one division after
    the loop."""
    p = _stable_inputs("flash_attention2", heads, q_len, kv_len, head_dim, dtype)
    nodes: tuple[BlockNode, ...] = (
        InputIterator(0, (0, 1)),  # #0 Q tile [1, q_len/q_blocks, d]
        InputIterator(1, (0, None), 2),  # #1 Kᵀ tile [1, d, kv_len/forloop]
        InputIterator(2, (0, None), 1),  # #2 V tile [1, kv_len/forloop, d]
        BlockOp(Op.MATMUL, (0, 1)),  # #3
        BlockOp(Op.SCALE, (3,), {"factor": 1.0 / math.sqrt(head_dim)}),  # #4 S
        Accumulator(4, "softmax_matmul", values=Ref(2)),  # #5 o
        Accumulator(4, "softmax_sum"),  # #6 l
        BlockOp(Op.DIV, (5, 6)),  # #7
        OutputSaver(7, (0, 1)),
    )
    kernel = GraphDefinedOp(_block((heads, q_blocks), forloop, nodes), (0, 3, 2))
    return p, KernelGraph(_specs(p), (_TRANSPOSE_K, kernel), (4,))


def flash_decoding_stable(
    heads: int = 4,
    kv_len: int = 24,
    head_dim: int = 4,
    *,
    splits: int = 3,
    forloop: int = 2,
    dtype: str = "float16",
    combine: str = "sum",
) -> Example:
    """FlashDecoding for the stable program: split-KV kernel saving each split's ``o``, ``l`` and running max
    ``m``; the combine kernel rescales each split by ``exp(m_i − M)`` (``M`` the max over splits) and divides.

    ``combine="sum"`` multiplies and sums (``Σ o_i w_i / Σ l_i w_i``, ``m`` saved as ``[heads, splits, 1]``);
    ``"matmul"`` saves ``m`` as ``[heads, 1, splits]`` so the weights form a row and both weighted sums are
    matmuls (``w o / w l``): six block operators, the form the search finds (tests/test_rediscovery.py)."""
    if combine not in ("sum", "matmul"):
        raise ValueError(f"flash_decoding_stable: combine must be 'sum' or 'matmul', got {combine!r}")
    p = _stable_inputs("flash_decoding_stable", heads, 1, kv_len, head_dim, dtype)
    by_matmul = combine == "matmul"
    k1: tuple[BlockNode, ...] = (
        InputIterator(0, (0, None)),  # #0 Q tile [1, 1, d]
        InputIterator(1, (0, 2), 2),  # #1 Kᵀ tile [1, d, kv_len/splits/forloop]
        InputIterator(2, (0, 1), 1),  # #2 V tile
        BlockOp(Op.MATMUL, (0, 1)),  # #3
        BlockOp(Op.SCALE, (3,), {"factor": 1.0 / math.sqrt(head_dim)}),  # #4 S
        BlockOp(Op.MAX, (4,), {"dim": 2, "keepdim": True}),  # #5 the tile's row max
        Accumulator(4, "softmax_matmul", values=Ref(2)),  # #6 o [1, 1, d]
        Accumulator(4, "softmax_sum"),  # #7 l [1, 1, 1]
        Accumulator(5, "max"),  # #8 m [1, 1, 1], the running max the two others ended at
        OutputSaver(6, (0, 1)),  # [heads, splits, d]
        OutputSaver(7, (0, 1)),  # [heads, splits, 1]
        OutputSaver(8, (0, 2) if by_matmul else (0, 1)),  # [heads, 1, splits] or [heads, splits, 1]
    )
    k2: tuple[BlockNode, ...]
    if by_matmul:
        k2 = (
            InputIterator(0, (0,)),  # #0 o tile [1, splits, d]
            InputIterator(1, (0,)),  # #1 l tile [1, splits, 1]
            InputIterator(2, (0,)),  # #2 m tile [1, 1, splits]
            BlockOp(Op.MAX, (2,), {"dim": 2, "keepdim": True}),  # #3 M [1, 1, 1]
            BlockOp(Op.SUB, (2, 3)),  # #4
            BlockOp(Op.EXP, (4,)),  # #5 w = exp(m − M) [1, 1, splits]
            BlockOp(Op.MATMUL, (5, 0)),  # #6 Σ w o [1, 1, d]
            BlockOp(Op.MATMUL, (5, 1)),  # #7 Σ w l [1, 1, 1]
            BlockOp(Op.DIV, (6, 7)),  # #8
            OutputSaver(8, (0,)),
        )
    else:
        k2 = (
            InputIterator(0, (0,)),  # #0 o tile [1, splits, d]
            InputIterator(1, (0,)),  # #1 l tile [1, splits, 1]
            InputIterator(2, (0,)),  # #2 m tile [1, splits, 1]
            BlockOp(Op.MAX, (2,), {"dim": 1, "keepdim": True}),  # #3 M [1, 1, 1]
            ThreadGraph((2, 3), (ThreadOp(Op.SUB, (0, 1)), ThreadOp(Op.EXP, (2,))), (3,)),  # #4 exp(m − M)
            BlockOp(Op.MUL, (0, 4)),  # #5
            _sum(5, 1),  # #6 [1, 1, d]
            BlockOp(Op.MUL, (1, 4)),  # #7
            _sum(7, 1),  # #8 [1, 1, 1]
            BlockOp(Op.DIV, (6, 8)),  # #9
            OutputSaver(9, (0,)),
        )
    first = GraphDefinedOp(_block((heads, splits), forloop, k1), (0, 3, 2))
    combine_op = GraphDefinedOp(_block((heads,), 1, k2), (Ref(4, 0), Ref(4, 1), Ref(4, 2)))
    return p, KernelGraph(_specs(p), (_TRANSPOSE_K, first, combine_op), (5,))


# ------------------------------------------------------------------------------------------------ QKNorm


def _rms_normalize(x: int, sq_sum: int, dim_size: int) -> ThreadGraph:
    """Thread graph ``x / sqrt(Σx² / n)`` over block values ``x`` and ``sq_sum``."""
    return ThreadGraph(
        (sq_sum, x),
        (
            ThreadOp(Op.SCALE, (0,), {"factor": 1.0 / dim_size}),
            ThreadOp(Op.SQRT, (2,)),
            ThreadOp(Op.DIV, (1, 3)),
        ),
        (4,),
    )


def qknorm_attention(
    heads: int = 2,
    q_len: int = 4,
    kv_len: int = 12,
    head_dim: int = 4,
    *,
    q_blocks: int = 2,
    forloop: int = 3,
    dtype: str = "float16",
) -> Example:
    """QKNorm fused with attention (later paper, Fig. 8): RMS-normalise Q and K over the head dim, then attend.

    One FlashAttention-style kernel; each iteration normalises its K tile (and the block's Q tile) in thread
    graphs before the scores.
    """
    p = Program("qknorm_attention")
    q = p.input("Q", (heads, q_len, head_dim), dtype)
    k = p.input("K", (heads, head_dim, kv_len), dtype)
    v = p.input("V", (heads, kv_len, head_dim), dtype)

    def norm(t: object, dim: int) -> object:
        ms = p.scale(p.sum(p.mul(t, t), dim=dim), 1.0 / head_dim)  # type: ignore[arg-type]
        return p.div(t, p.sqrt(ms))  # type: ignore[arg-type]

    p.output(_attention_program(p, norm(q, 2), norm(k, 1), v, head_dim))
    nodes: tuple[BlockNode, ...] = (
        InputIterator(0, (0, 1)),  # #0 Q tile [1, q_len/q_blocks, d]
        InputIterator(1, (0, None), 2),  # #1 K tile [1, d, kv_len/forloop]
        InputIterator(2, (0, None), 1),  # #2 V tile
        BlockOp(Op.MUL, (0, 0)),  # #3
        _sum(3, 2),  # #4
        _rms_normalize(0, 4, head_dim),  # #5 Q normalised
        BlockOp(Op.MUL, (1, 1)),  # #6
        _sum(6, 1),  # #7
        _rms_normalize(1, 7, head_dim),  # #8 K normalised
        BlockOp(Op.MATMUL, (5, 8)),  # #9
        _exp_scaled(9, 1.0 / math.sqrt(head_dim)),  # #10
        _sum(10, 2),  # #11
        BlockOp(Op.MATMUL, (10, 2)),  # #12
        Accumulator(12),  # #13
        Accumulator(11),  # #14
        BlockOp(Op.DIV, (13, 14)),  # #15
        OutputSaver(15, (0, 1)),
    )
    kernel = GraphDefinedOp(_block((heads, q_blocks), forloop, nodes), (0, 1, 2))
    return p, KernelGraph(_specs(p), (kernel,), (3,))


#: The stable attention µGraphs with online-softmax accumulators, apart: code generation does not emit those
#: accumulators yet, and their verification needs the second tier (the rescale uses exp's law).
ONLINE_EXAMPLES: dict[str, Callable[..., Example]] = {
    "flash_attention2": flash_attention2,
    "flash_decoding_stable": flash_decoding_stable,
}

EXAMPLES: dict[str, Callable[..., Example]] = {
    "rmsnorm_matmul": rmsnorm_matmul,
    "gqa": gqa,
    "lora": lora,
    "gated_mlp": gated_mlp,
    "flash_attention": flash_attention,
    "flash_decoding": flash_decoding,
    "qknorm_attention": qknorm_attention,
}

__all__ = [
    "EXAMPLES",
    "ONLINE_EXAMPLES",
    "Example",
    "flash_attention",
    "flash_attention2",
    "flash_decoding",
    "flash_decoding_stable",
    "gated_mlp",
    "gqa",
    "lora",
    "qknorm_attention",
    "rmsnorm_matmul",
    "stable_attention_program",
]

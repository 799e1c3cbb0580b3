"""Which kernel tensors of a µGraph flow only into matmuls: under the ``"float32"`` policy, a bfloat16 program's
float32 intermediate that only a matmul reads is stored in bfloat16.

A tensor-core matmul of a float32 operand rounds it to bfloat16 in its copies (round to nearest even; the
converting ``mma.sync`` and wgmma kernels of :mod:`gensorage.codegen`): storing that operand in bfloat16 instead,
rounded the same way by its producer, gives the matmul the same bits while it reads half the bytes and needs no
conversion (a plain bfloat16 kernel, TMA loads included). It is what torch autocast does too: matmul is on its
lower-precision list, so it casts a float32 input to bfloat16. bfloat16 has float32's exponent range, so nothing
overflows; float16 programs keep the float32 operand (float16's range is the reason the policy exists).

A tensor counts when it has readers, is not a program output, and every reader is a kernel-level matmul or a
layout operator (reshape, transpose, repeat) whose own result counts. Readers inside a graph-defined kernel
(a fused block graph) do not count: their block matmuls are planned with the operand's stored dtype.
"""

from __future__ import annotations

from gensorage.opset import Op
from gensorage.ugraph.ir import GraphDefinedOp, KernelGraph, KernelOp, OutputSaver, Ref

#: Layout operators a matmul operand may pass through (each stores what it reads, or is a view of it).
LAYOUT_OPS = frozenset({Op.RESHAPE, Op.TRANSPOSE, Op.REPEAT})


def matmul_operands(g: KernelGraph) -> frozenset[Ref]:
    """The kernel tensors of ``g`` that flow only into kernel-level matmuls (see the module doc)."""
    readers: dict[Ref, list[tuple[int, KernelOp | None]]] = {}
    for k, op in enumerate(g.ops):
        for r in op.inputs:
            readers.setdefault(r, []).append((k, op if isinstance(op, KernelOp) else None))
    outputs = set(g.outputs)
    found: set[Ref] = set()
    base = len(g.inputs)
    # backwards: every reader of a tensor comes after it, so its layout readers are decided first
    for k in reversed(range(len(g.ops))):
        op = g.ops[k]
        count = (
            sum(isinstance(n, OutputSaver) for n in op.block.nodes) if isinstance(op, GraphDefinedOp) else 1
        )
        for i in range(count):
            ref = Ref(base + k, i)
            uses = readers.get(ref, [])
            if ref in outputs or not uses:
                continue
            if all(_counts(reader, j, base, found) for j, reader in uses):
                found.add(ref)
    return frozenset(found)


def _counts(reader: KernelOp | None, j: int, base: int, found: set[Ref]) -> bool:
    if reader is None:
        return False
    if reader.op is Op.MATMUL:
        return True
    return reader.op in LAYOUT_OPS and Ref(base + j) in found


__all__ = ["LAYOUT_OPS", "matmul_operands"]

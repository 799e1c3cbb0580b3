"""Which values of a µGraph flow only into ``exp``: the precision policy's "operands of exp are float32".

``exp`` turns an absolute rounding error of its argument into a relative error of its result: a score of 100
rounded to bfloat16 (8 significant bits) is off by up to 0.25, so ``exp`` of it by up to 28 %. A softmax
subtracts the row's maximum, but a tile's scores are rounded before the subtraction. So under the ``"float32"``
policy (:mod:`gensorage.precision`) a value is stored in float32 when every path from it leads into an ``exp``
through operators that keep its magnitude's error absolute (:data:`EXP_PATH_OPS`: linear ones, the maximum a
softmax subtracts, layout), and into nothing else: the score ``S = Q Kᵀ``, its scaled form, ``S − max S``, a
tile's maximum and the running maximum a split saves. Values that also feed anything else keep the ordinary
rule. An online-softmax accumulator applies ``exp`` to its scores, so they count as an ``exp`` operand; its
values do not.

The analysis runs backwards over the kernels, and inside each block graph and thread graph backwards over its
nodes; a kernel tensor's status is known before the block graphs that write it are analysed, since every reader
comes later. Program outputs are never operands.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gensorage.opset import Op
from gensorage.ugraph.ir import (
    ONLINE_SOFTMAX_KINDS,
    Accumulator,
    BlockGraph,
    BlockOp,
    GraphDefinedOp,
    InputIterator,
    KernelGraph,
    KernelOp,
    OutputSaver,
    Ref,
    ThreadGraph,
)

#: Operators through which a value still reaches an ``exp`` with its absolute error (see the module doc).
EXP_PATH_OPS = frozenset(
    {Op.SCALE, Op.SUB, Op.ADD, Op.ADD_SCALAR, Op.MAX, Op.RESHAPE, Op.TRANSPOSE, Op.REPEAT, Op.SLICE}
)


@dataclass
class _Uses:
    """For each value, the verdicts of its consumers (True: the use leads into exp only)."""

    verdicts: dict[object, list[bool]] = field(default_factory=dict)

    def add(self, key: object, verdict: bool) -> None:
        self.verdicts.setdefault(key, []).append(verdict)

    def status(self, key: object) -> bool:
        got = self.verdicts.get(key, [])
        return bool(got) and all(got)


def _via(op: Op, result: bool) -> bool:
    """The verdict of a use by operator ``op`` whose result's status is ``result``."""
    return op is Op.EXP or (op in EXP_PATH_OPS and result)


@dataclass(frozen=True)
class ExpOperands:
    """The result: kernel tensors (``Ref``), block values (kernel op, node, output) and thread values (kernel op,
    node, local index) that flow only into ``exp``."""

    kernel: frozenset[Ref]
    block: frozenset[tuple[int, int, int]]
    thread: frozenset[tuple[int, int, int]]

    def thread_locals(self, k: int, j: int) -> frozenset[int]:
        """The local values of thread graph ``j`` in kernel op ``k`` that flow only into exp."""
        return frozenset(i for kk, jj, i in self.thread if (kk, jj) == (k, j))


def exp_operands(g: KernelGraph) -> ExpOperands:
    """Which values of ``g`` flow only into ``exp`` (see the module doc); references are not validated here."""
    uses = _Uses()
    for r in g.outputs:
        uses.add(r, False)
    kernel: set[Ref] = set()
    block: set[tuple[int, int, int]] = set()
    thread: set[tuple[int, int, int]] = set()
    n_in = len(g.inputs)
    for k in reversed(range(len(g.ops))):
        node = g.ops[k]
        me = n_in + k
        if isinstance(node, KernelOp):
            out = uses.status(Ref(me))
            if out:
                kernel.add(Ref(me))
            for r in node.inputs:
                uses.add(r, _via(node.op, out))
        elif isinstance(node, GraphDefinedOp):
            saved = [uses.status(Ref(me, i)) for i in range(_savers(node.block))]
            kernel.update(Ref(me, i) for i, s in enumerate(saved) if s)
            for i, verdict in _block(k, node.block, saved, block, thread).items():
                if 0 <= i < len(node.inputs):  # a bad index is infer's to report, in its words
                    uses.add(node.inputs[i], verdict)
    return ExpOperands(frozenset(kernel), frozenset(block), frozenset(thread))


def _savers(b: BlockGraph) -> int:
    return sum(1 for n in b.nodes if isinstance(n, OutputSaver))


def _block(
    k: int,
    b: BlockGraph,
    saved: list[bool],
    block: set[tuple[int, int, int]],
    thread: set[tuple[int, int, int]],
) -> dict[int, bool]:
    """Analyse block graph ``b`` of kernel op ``k`` (``saved``: its outputs' statuses); the verdict for each of
    the kernel op's inputs (several iterators of one input must all agree)."""
    uses = _Uses()
    saver_index = [j for j, n in enumerate(b.nodes) if isinstance(n, OutputSaver)]
    inputs: dict[int, list[bool]] = {}
    for j in reversed(range(len(b.nodes))):
        n = b.nodes[j]
        match n:
            case OutputSaver():
                uses.add(n.input, saved[saver_index.index(j)])
            case BlockOp():
                out = uses.status(Ref(j))
                for r in n.inputs:
                    uses.add(r, _via(n.op, out))
            case Accumulator() if n.kind in ONLINE_SOFTMAX_KINDS:
                uses.add(n.input, True)
                if n.values is not None:
                    uses.add(n.values, False)
            case Accumulator():
                out = uses.status(Ref(j))
                uses.add(n.input, n.kind == "max" and out)
            case ThreadGraph():
                outs = [uses.status(Ref(j, i)) for i in range(len(n.outputs))]
                local = _thread(n, outs)
                thread.update((k, j, i) for i in local)
                for p, r in enumerate(n.inputs):
                    uses.add(r, p in local)
            case InputIterator():
                inputs.setdefault(n.input, []).append(uses.status(Ref(j)))
        if not isinstance(n, (OutputSaver, ThreadGraph)):
            if uses.status(Ref(j)):
                block.add((k, j, 0))
        elif isinstance(n, ThreadGraph):
            block.update((k, j, i) for i in range(len(n.outputs)) if uses.status(Ref(j, i)))
    return {i: all(v) for i, v in inputs.items()}


def _thread(tg: ThreadGraph, outs: list[bool]) -> frozenset[int]:
    """The local values (inputs, then ops) of ``tg`` that flow only into exp, given its outputs' statuses."""
    uses = _Uses()
    for r, s in zip(tg.outputs, outs, strict=True):
        uses.add(r.node, s)
    n_in = len(tg.inputs)
    for i in reversed(range(len(tg.ops))):
        top = tg.ops[i]
        out = uses.status(n_in + i)
        for r in top.inputs:
            uses.add(r.node, _via(top.op, out))
    return frozenset(i for i in range(n_in + len(tg.ops)) if uses.status(i))


__all__ = ["EXP_PATH_OPS", "ExpOperands", "exp_operands"]

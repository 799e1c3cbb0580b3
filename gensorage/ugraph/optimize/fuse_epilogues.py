"""Epilogue fusion: chains of pre-defined element-wise ops after a matmul become the matmul kernel's epilogue.

The direct µGraph stores a matmul's product (an ``M x N`` tensor) and runs each element-wise op after it as a
kernel of its own, one round trip through device memory each: ``silu(x W1) * (x W3)`` writes both products,
reads them back, writes the gate. A GEMM kernel holds its product in float32 registers before the write-back;
this pass moves the element-wise chain there, as the ``epilogue`` of the ``matmul`` kernel op (see
:mod:`gensorage.opset`): the steps run on the accumulators, and only the chain's last value is stored.

A chain grows from a matmul through its single reader while that reader is a pre-defined element-wise op whose
result has the product's shape and the value it reads is neither a program output nor read elsewhere (its raw
value would have to be stored too, which a kernel op with one output cannot do: such a matmul keeps its chain
unfused). The reader's other operands become the epilogue's extra operands: a tensor of the output's shape
(a residual, SwiGLU's other product) or one that broadcasts to it (an ``[n]`` bias, an ``[m, 1]`` row scale).
The fused op takes the place of the chain's last op, which every extra operand precedes.

Order with row fusion (:mod:`.fuse_rows`): epilogue fusion runs first. Row fusion groups element-wise ops into
graph-defined kernels, which this pass cannot reach afterwards (SwiGLU's ``silu`` and ``mul`` would become one
row kernel that still reads both products from memory); folding them into the GEMM instead removes the
products' round trips, needs no row to fit in shared memory, and what it leaves (reductions, element-wise ops
around them) still row-fuses.

Every GEMM kernel family runs the epilogue on its float32 accumulators before the cast (mma.sync, wgmma with
cp.async or TMA, the CUDA-core construction, the matrix-vector and one-element kernels; see
:mod:`gensorage.codegen.epilogue_expr`). :func:`split_epilogues` is the inverse rewrite: the finite-field twin
uses it where a scheduled GEMM kernel, which computes one residue, cannot run a step (an activation or exp mixes
both residues), so there that matmul keeps its separate kernels.

The rewrite is checked where it is used as every option is: the fused direct µGraph
(:mod:`gensorage.superopt.row_fusion`) by the identity test and the float check, like a search candidate.
"""

from __future__ import annotations

from collections.abc import Callable

from gensorage.errors import UGraphError
from gensorage.hw.profile import HwProfile
from gensorage.opset import ELEMENTWISE, EpilogueStep, Op, attr, epilogue, freeze_attrs
from gensorage.ugraph.ir import GraphDefinedOp, KernelGraph, KernelNode, KernelOp, Ref
from gensorage.ugraph.shapes import GraphInfo, infer
from gensorage.ugraph.validate import validate

#: The most extra operands one epilogue reads (each is one more load per output element).
MAX_EXTRA = 4


def _readers(g: KernelGraph) -> dict[int, list[int]]:
    """Node -> the op indices reading it (once per read)."""
    out: dict[int, list[int]] = {}
    for k, op in enumerate(g.ops):
        for r in op.inputs:
            out.setdefault(r.node, []).append(k)
    return out


def _chain(g: KernelGraph, info: GraphInfo, k: int, readers: dict[int, list[int]]) -> list[int]:
    """The element-wise ops (op indices, in order) that fold into matmul op ``k``'s epilogue."""
    nin = len(g.inputs)
    outputs = {r.node for r in g.outputs}
    shape = info.nodes[nin + k][0].shape
    chain: list[int] = []
    extra: set[Ref] = set()
    node = nin + k
    while node not in outputs:
        rs = set(readers.get(node, []))
        if len(rs) != 1:
            break
        (r,) = rs
        op = g.ops[r]
        if not isinstance(op, KernelOp) or op.op not in ELEMENTWISE or info.nodes[nin + r][0].shape != shape:
            break
        others = {x for x in op.inputs if x.node != node}
        if len(extra | others) > MAX_EXTRA:
            break
        extra |= others
        chain.append(r)
        node = nin + r
    return chain


def fused_matmul(g: KernelGraph, k: int, chain: list[int]) -> KernelOp:
    """Matmul op ``k`` (without an epilogue) with the ops ``chain`` (from :func:`_chain`) as its epilogue."""
    nin = len(g.inputs)
    mm = g.ops[k]
    assert isinstance(mm, KernelOp) and not epilogue(mm.attrs)
    members = {nin + c for c in chain}
    extra: list[Ref] = []
    for c in chain:
        extra += [
            r for r in g.ops[c].inputs if r.node != nin + k and r.node not in members and r not in extra
        ]
    where = {Ref(nin + k): 0, **{r: 1 + i for i, r in enumerate(extra)}}
    steps: list[EpilogueStep] = []
    for c in chain:
        op = g.ops[c]
        assert isinstance(op, KernelOp)
        steps.append((op.op.value, tuple(where[r] for r in op.inputs), op.attrs))
        where[Ref(nin + c)] = len(extra) + len(steps)
    rest = {name: value for name, value in mm.attrs if name != "epilogue"}
    return KernelOp(Op.MATMUL, (*mm.inputs, *extra), freeze_attrs({**rest, "epilogue": tuple(steps)}))


def _rebuilt(g: KernelGraph, replace: dict[int, KernelOp], drop: set[int]) -> tuple[KernelGraph, list[int]]:
    """``g`` with op ``k`` of ``replace`` placed at op ``replace``'s key, the ``drop`` ops removed (their values
    were folded into the op that now stands at the chain's last op) and refs renumbered; also where each old op
    went (-1: dropped)."""
    nin = len(g.inputs)
    new_ref: dict[int, int] = {i: i for i in range(nin)}
    ops: list[KernelNode] = []
    moved: list[int] = []
    for k, op in enumerate(g.ops):
        if k in drop:
            moved.append(-1)
            continue
        node = op if k not in replace else replace[k]
        ins = tuple(Ref(new_ref[r.node], r.out) for r in node.inputs)
        if isinstance(node, KernelOp):
            ops.append(KernelOp(node.op, ins, node.attrs))
        else:
            ops.append(GraphDefinedOp(node.block, ins))
        new_ref[nin + k] = nin + len(ops) - 1
        moved.append(len(ops) - 1)
    outs = tuple(Ref(new_ref[r.node], r.out) for r in g.outputs)
    return KernelGraph(g.inputs, tuple(ops), outs, g.precision), moved


def fuse_epilogues(g: KernelGraph, hw: HwProfile | None = None) -> KernelGraph:
    """``g`` with each matmul's element-wise chain (see the module docstring) folded into its epilogue.

    The rewritten graph must validate (against ``hw``'s limits when given); otherwise ``g`` is returned, as it
    is when nothing folds.
    """
    info = infer(g)
    readers = _readers(g)
    replace: dict[int, KernelOp] = {}
    drop: set[int] = set()
    for k, op in enumerate(g.ops):
        if not isinstance(op, KernelOp) or op.op is not Op.MATMUL or k in drop:
            continue
        if epilogue(op.attrs):
            continue
        chain = _chain(g, info, k, readers)
        # An op another matmul's epilogue took (SwiGLU's mul, with this product its extra operand) ends the chain.
        chain = chain[: next((i for i, c in enumerate(chain) if c in drop or c in replace), len(chain))]
        if not chain:
            continue
        replace[chain[-1]] = fused_matmul(g, k, chain)
        drop |= {k, *chain[:-1]}
    if not replace:
        return g
    out, _ = _rebuilt(g, replace, drop)
    try:
        validate(out, hw)
    except UGraphError:
        return g
    return out


def split_epilogues(g: KernelGraph, keep: Callable[[int], bool]) -> tuple[KernelGraph, list[int]]:
    """``g`` with every matmul epilogue that ``keep(k)`` (op index ``k``) refuses run as separate element-wise
    ops again, and where each old op index went (to the op computing its result)."""
    nin = len(g.inputs)
    ops: list[KernelNode] = []
    new_ref: dict[int, Ref] = {i: Ref(i) for i in range(nin)}
    moved: list[int] = []

    def remap(r: Ref) -> Ref:
        got = new_ref[r.node]
        return Ref(
            got.node, r.out if got.node >= nin and isinstance(ops[got.node - nin], GraphDefinedOp) else 0
        )

    for k, op in enumerate(g.ops):
        steps = epilogue(op.attrs) if isinstance(op, KernelOp) and op.op is Op.MATMUL else ()
        if isinstance(op, GraphDefinedOp):
            ops.append(GraphDefinedOp(op.block, tuple(remap(r) for r in op.inputs)))
        elif not steps or keep(k):
            ops.append(KernelOp(op.op, tuple(remap(r) for r in op.inputs), op.attrs))
        else:
            rest = {n: v for n, v in op.attrs if n != "epilogue"}
            ops.append(KernelOp(Op.MATMUL, tuple(remap(r) for r in op.inputs[:2]), freeze_attrs(rest)))
            values = [Ref(nin + len(ops) - 1), *(remap(r) for r in op.inputs[2:])]
            for name, args, a in steps:
                ops.append(KernelOp(Op(name), tuple(values[i] for i in args), a))
                values.append(Ref(nin + len(ops) - 1))
        new_ref[nin + k] = Ref(nin + len(ops) - 1)
        moved.append(len(ops) - 1)
    outs = tuple(Ref(new_ref[r.node].node, r.out) for r in g.outputs)
    return KernelGraph(g.inputs, tuple(ops), outs, g.precision), moved


def has_epilogue(op: KernelNode) -> bool:
    """Whether ``op`` is a matmul with an epilogue."""
    return isinstance(op, KernelOp) and op.op is Op.MATMUL and bool(attr(op.attrs, "epilogue"))


__all__ = ["MAX_EXTRA", "fuse_epilogues", "fused_matmul", "has_epilogue", "split_epilogues"]

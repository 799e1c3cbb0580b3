"""A readable text form of a µGraph, laid out like the papers' figures.

Kernel tensors are ``%n`` (inputs first), block tensors ``#j``, thread-graph values ``tn``; a node with several
outputs adds ``.out``. Maps are written as in the papers: ``imap {x<->1, y<->φ}``, ``fmap {i<->0}``,
``omap {x<->1}``. Shapes are shown when the graph's shapes can be inferred; an invalid graph still prints, with
its first error on the header line.
"""

from __future__ import annotations

from collections.abc import Sequence

from gensorage.errors import UGraphError
from gensorage.opset import Attrs
from gensorage.precision import DEFAULT_PRECISION
from gensorage.ugraph.ir import (
    GRID_AXES,
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
    num_outputs,
)
from gensorage.ugraph.shapes import BlockInfo, GraphInfo, TensorInfo, infer
from gensorage.ugraph.validate import loop_phases

PHI = "φ"


def shape_text(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def map_text(name: str, dims: Sequence[int | None], axes: Sequence[str] = GRID_AXES) -> str:
    pairs = ", ".join(f"{axes[g]}<->{PHI if d is None else d}" for g, d in enumerate(dims))
    return f"{name} {{{pairs}}}"


def attrs_text(attrs: Attrs) -> str:
    return "".join(f", {k}={list(v) if isinstance(v, tuple) else v}" for k, v in attrs)


def _ref(prefix: str, r: Ref, multi: bool) -> str:
    return f"{prefix}{r.node}.{r.out}" if multi else f"{prefix}{r.node}"


def _ti(t: TensorInfo | None) -> str:
    return "" if t is None else f": {shape_text(t.shape)}"


class _Writer:
    def __init__(self, g: KernelGraph, info: GraphInfo | None) -> None:
        self.g = g
        self.info = info
        self.lines: list[str] = []

    def kref(self, r: Ref) -> str:
        k = r.node - len(self.g.inputs)
        multi = 0 <= k < len(self.g.ops) and num_outputs(self.g.ops[k]) > 1
        return _ref("%", r, multi or r.out != 0)

    def kernel(self) -> None:
        g = self.g
        for i, spec in enumerate(g.inputs):
            self.lines.append(f"  %{i} = input {spec.name}: {shape_text(spec.shape)} {spec.dtype}")
        for k, node in enumerate(g.ops):
            n = len(g.inputs) + k
            args = ", ".join(self.kref(r) for r in node.inputs)
            outs = self.info.nodes[n] if self.info else ()
            shapes = ", ".join(f"{shape_text(t.shape)} {t.dtype}" for t in outs)
            if isinstance(node, KernelOp):
                self.lines.append(
                    f"  %{n} = {node.op.value}({args}{attrs_text(node.attrs)})"
                    + (f": {shapes}" if shapes else "")
                )
            else:
                self.lines.append(f"  %{n} = graph-defined({args})" + (f" -> {shapes}" if shapes else ""))
                self.block(node, self.info.blocks[k] if self.info else None)
        self.lines.append("  output " + ", ".join(self.kref(r) for r in g.outputs))
        if g.precision != DEFAULT_PRECISION:
            self.lines.append(f"  precision {g.precision}")

    def block(self, node: GraphDefinedOp, binfo: BlockInfo | None) -> None:
        b = node.block
        grid = ", ".join(f"{GRID_AXES[i]}={n}" for i, n in enumerate(b.grid))
        self.lines.append(f"      block graph: grid ({grid}), forloop {b.forloop}")
        phases = loop_phases(b) if _refs_ok(b) else None
        for j, bn in enumerate(b.nodes):
            tile = binfo.nodes[j][0] if binfo and binfo.nodes[j] else None
            tag = ""
            if b.forloop > 1 and phases is not None and phases[j] == "body":
                tag = "  [loop]"
            self.lines.append(f"      #{j} = {self.block_node(node, bn, j, binfo, tile)}{tag}")
            if isinstance(bn, ThreadGraph):
                self.thread(bn, binfo.threads[j] if binfo else None)

    def bref(self, b: BlockGraph, r: Ref) -> str:
        multi = 0 <= r.node < len(b.nodes) and num_outputs(b.nodes[r.node]) > 1
        return _ref("#", r, multi or r.out != 0)

    def block_node(
        self, node: GraphDefinedOp, bn: object, j: int, binfo: BlockInfo | None, tile: TensorInfo | None
    ) -> str:
        b = node.block
        match bn:
            case InputIterator():
                src = self.kref(node.inputs[bn.input]) if 0 <= bn.input < len(node.inputs) else "?"
                fm = f" {map_text('fmap', [bn.fmap], ('i',))}" if b.forloop > 1 else ""
                return f"iterator(in{bn.input} {src}) {map_text('imap', bn.imap)}{fm}{_ti(tile)}"
            case BlockOp():
                args = ", ".join(self.bref(b, r) for r in bn.inputs)
                return f"{bn.op.value}({args}{attrs_text(bn.attrs)}){_ti(tile)}"
            case ThreadGraph():
                args = ", ".join(self.bref(b, r) for r in bn.inputs)
                shapes = ", ".join(shape_text(t.shape) for t in binfo.nodes[j]) if binfo else ""
                return f"thread graph({args})" + (f" -> {shapes}" if shapes else "")
            case Accumulator():
                fm = map_text("fmap", [bn.fmap], ("i",))
                args = ", ".join(self.bref(b, r) for r in bn.reads)
                return f"accumulator({args}, {bn.kind}) {fm}{_ti(tile)}"
            case OutputSaver():
                out = ""
                if binfo is not None:
                    k = sum(1 for x in b.nodes[:j] if isinstance(x, OutputSaver))
                    out = f" -> {shape_text(binfo.outputs[k].shape)}"
                return f"saver({self.bref(b, bn.input)}) {map_text('omap', bn.omap)}{out}"
            case _:
                return type(bn).__name__

    def thread(self, tg: ThreadGraph, local: Sequence[TensorInfo] | None) -> None:
        for i, top in enumerate(tg.ops):
            n = len(tg.inputs) + i
            args = ", ".join(f"t{r.node}" for r in top.inputs)
            t = local[n] if local else None
            self.lines.append(f"          t{n} = {top.op.value}({args}{attrs_text(top.attrs)}){_ti(t)}")
        ins = ", ".join(f"t{i}<-{self.bref_plain(r)}" for i, r in enumerate(tg.inputs))
        self.lines.append(f"          in {ins}; out " + ", ".join(f"t{r.node}" for r in tg.outputs))

    @staticmethod
    def bref_plain(r: Ref) -> str:
        return f"#{r.node}" if r.out == 0 else f"#{r.node}.{r.out}"


def _refs_ok(b: BlockGraph) -> bool:
    try:
        loop_phases(b)
    except (IndexError, AttributeError):
        return False
    return True


def to_text(g: KernelGraph) -> str:
    """The µGraph as indented text: kernel ops with shapes, block graphs with grid, forloop and maps."""
    try:
        info: GraphInfo | None = infer(g)
        header = ""
    except UGraphError as e:
        info, header = None, f" (invalid: {e})"
    n_ops = len(g.ops)
    w = _Writer(g, info)
    w.lines.append(f"µGraph: {len(g.inputs)} inputs, {n_ops} kernel op{'s' if n_ops != 1 else ''}{header}")
    w.kernel()
    return "\n".join(w.lines)


__all__ = ["map_text", "shape_text", "to_text"]

"""Graphviz DOT text of a µGraph: kernel tensors as nodes, one cluster per block graph (and per thread graph)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from gensorage.errors import GensorageError, UGraphError
from gensorage.ugraph.ir import (
    Accumulator,
    BlockOp,
    GraphDefinedOp,
    InputIterator,
    KernelGraph,
    KernelOp,
    OutputSaver,
    ThreadGraph,
    node_inputs,
)
from gensorage.ugraph.shapes import GraphInfo, infer, node_kind
from gensorage.ugraph.text import attrs_text, map_text, shape_text


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _block_label(bn: object, forloop: int) -> str:
    match bn:
        case InputIterator():
            fm = "\n" + map_text("fmap", [bn.fmap], ("i",)) if forloop > 1 else ""
            return f"InIter in{bn.input}\n{map_text('imap', bn.imap)}{fm}"
        case BlockOp():
            return bn.op.value + attrs_text(bn.attrs)
        case Accumulator():
            return f"Accum {bn.kind}\n{map_text('fmap', [bn.fmap], ('i',))}"
        case OutputSaver():
            return f"OutSaver\n{map_text('omap', bn.omap)}"
        case _:
            return node_kind(bn)


def to_dot(g: KernelGraph) -> str:
    """DOT text of ``g``: kernel ops as boxes, each graph-defined op's block graph as a cluster of its nodes."""
    try:
        info: GraphInfo | None = infer(g)
    except UGraphError:
        info = None
    lines = ["digraph ugraph {", "  rankdir=TB;", "  node [shape=box, fontsize=10];"]
    n_in = len(g.inputs)
    for i, spec in enumerate(g.inputs):
        lines.append(f"  k{i} [shape=ellipse, label={_q(f'{spec.name} {shape_text(spec.shape)}')}];")
    for k, node in enumerate(g.ops):
        n = n_in + k
        shapes = " ".join(shape_text(t.shape) for t in info.nodes[n]) if info else ""
        if isinstance(node, KernelOp):
            lines.append(f"  k{n} [label={_q(f'%{n} {node.op.value}{attrs_text(node.attrs)} {shapes}')}];")
            lines.extend(f"  k{r.node} -> k{n};" for r in node.inputs)
            continue
        lines.append(f"  k{n} [shape=box3d, label={_q(f'%{n} graph-defined {shapes}')}];")
        lines.extend(_block_cluster(node, n))
    for j, r in enumerate(g.outputs):
        lines.append(f"  out{j} [shape=ellipse, style=dashed, label={_q(f'output {j}')}];")
        lines.append(f"  k{r.node} -> out{j};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _block_cluster(node: GraphDefinedOp, n: int) -> list[str]:
    b = node.block
    grid = "x".join(str(d) for d in b.grid)
    lines = [
        f"  subgraph cluster_k{n} {{",
        f"    label={_q(f'%{n} block graph: grid {grid}, forloop {b.forloop}')};",
        "    style=rounded; color=blue;",
    ]
    for j, bn in enumerate(b.nodes):
        bid = f"k{n}_b{j}"
        if isinstance(bn, ThreadGraph):
            lines.append(f"    subgraph cluster_{bid} {{ label={_q(f'#{j} thread graph')}; color=darkgreen;")
            for t, top in enumerate(bn.ops):
                lines.append(f"      {bid}_t{t} [label={_q(top.op.value + attrs_text(top.attrs))}];")
            lines.append("    }")
        else:
            lines.append(f"    {bid} [label={_q(f'#{j} ' + _block_label(bn, b.forloop))}];")
    lines.append("  }")
    saver_index = 0
    for j, bn in enumerate(b.nodes):
        bid = f"k{n}_b{j}"
        if isinstance(bn, InputIterator) and 0 <= bn.input < len(node.inputs):
            lines.append(f"  k{node.inputs[bn.input].node} -> {bid};")
        elif isinstance(bn, ThreadGraph):
            lines.extend(_thread_edges(b.nodes, bn, n, j))
        else:
            lines.extend(f"  {_src(b.nodes, n, r.node, r.out)} -> {bid};" for r in node_inputs(bn))
        if isinstance(bn, OutputSaver):
            lines.append(f"  {bid} -> k{n} [style=dashed, label={_q(f'out {saver_index}')}];")
            saver_index += 1
    return lines


def _src(nodes: tuple[object, ...], n: int, j: int, out: int) -> str:
    """The DOT node producing block value ``(j, out)`` (a thread graph's output is its producing thread op)."""
    if 0 <= j < len(nodes):
        tg = nodes[j]
        if isinstance(tg, ThreadGraph) and 0 <= out < len(tg.outputs):
            return f"k{n}_b{j}_t{tg.outputs[out].node - len(tg.inputs)}"
    return f"k{n}_b{j}"


def _thread_edges(nodes: tuple[object, ...], tg: ThreadGraph, n: int, j: int) -> list[str]:
    lines: list[str] = []
    for t, top in enumerate(tg.ops):
        for r in top.inputs:
            if r.node < len(tg.inputs):
                src = tg.inputs[r.node]
                lines.append(f"  {_src(nodes, n, src.node, src.out)} -> k{n}_b{j}_t{t};")
            else:
                lines.append(f"  k{n}_b{j}_t{r.node - len(tg.inputs)} -> k{n}_b{j}_t{t};")
    return lines


def render(dot_text: str, path: str | Path, fmt: str = "svg") -> Path | None:
    """Render DOT text with the ``dot`` binary to ``path``; None when graphviz is not installed."""
    exe = shutil.which("dot")
    if exe is None:
        return None
    out = Path(path)
    try:
        subprocess.run(
            [exe, f"-T{fmt}", "-o", str(out)], input=dot_text.encode(), check=True, capture_output=True
        )
    except subprocess.CalledProcessError as e:
        raise GensorageError(f"dot failed: {e.stderr.decode(errors='replace').strip()}") from None
    return out


__all__ = ["render", "to_dot"]

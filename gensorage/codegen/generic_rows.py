"""A CUDA row kernel emitted once with its rows a variable: one kernel for every length.

A graph-defined kernel whose blocks hold whole rows (row fusion's normalisations, softmaxes, rotary products,
:mod:`gensorage.ugraph.optimize.fuse_rows`) is re-instantiated at each new sequence length with the grid that
divides the length best, so its rows per block, its thread plan and so its code change with the length
(4 rows a block at 128 tokens, 5 at 200, 1 at 97), and each new length compiled it anew. Within
:func:`~gensorage.codegen.generic_matmul.generic_matmuls` (the dispatcher's CUDA builds), such a kernel is
instead emitted once per key, at the key's first length, and made generic (:func:`generic_text`): every data
dim a grid dim splits becomes a TIR variable (bound from the tensors' shapes at the call), the grid is
computed from it (``(n + R - 1) // R`` blocks of the first length's ``R`` rows), and every statement that
reads or writes a row of a tensor is guarded by that row's bound. The key is everything the emitted code
depends on but those sizes and the grid: the block graph, the tiles, the other dims, the dtypes, the thread
plan. At every later length of the same key the same PrimFunc is used: no emission, no compiler call.

Exactness: the kernel applies only where its rows are independent (:func:`_rows_independent`: no loop, no
accumulator, element-wise block ops and reductions over a dim no grid dim splits), so an output row depends
on the same row of the inputs alone. At ``n`` rows the generic kernel is, statement for statement, the
emitter's kernel for the same block graph with ``R`` rows a block over ``n`` rounded up to a multiple of ``R``
(the tests check this structurally at lengths ``R`` divides), except that a row at ``n`` or beyond is neither
read nor written: such rows of the last block compute from whatever shared memory holds and are dropped, and
no reduction mixes them into a row below ``n``. So every row below ``n`` gets what the emitter's kernel
computes for it. A guarded statement may not hold a barrier or a warp shuffle (they need every thread): a
kernel with one is emitted per length, as before.

The length's own build (in the background, :mod:`~gensorage.codegen.symbolic_kernels`) takes the emitter's
kernel at that length (``Kernel.own``), so the steady state is the untiered one.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from gensorage.codegen.kernel_text import graph_kernel_params
from gensorage.codegen.ugraph_tir import emit_graph_defined
from gensorage.opset import ELEMENTWISE, REDUCTIONS, attr
from gensorage.ugraph.ir import Accumulator, BlockOp, GraphDefinedOp, InputIterator, OutputSaver, ThreadGraph

if TYPE_CHECKING:
    from gensorage.codegen.kernel_text import KernelText, Target
    from gensorage.codegen.module import Kernel
    from gensorage.codegen.scalar import Scalar
    from gensorage.construction.block_threads import ThreadChoice
    from gensorage.hw.profile import HwProfile
    from gensorage.ugraph.ir import KernelGraph
    from gensorage.ugraph.shapes import GraphInfo

#: Generic texts by key (None: the key's kernel is emitted per length).
_TEXTS: dict[Hashable, tuple[str, str, int] | None] = {}
_MAX_KEYS = 1024
_NAME = "generic_rows_kernel"
_ACCESS = re.compile(r"\b((?:in|out)\d+)(\.ptr_to\(\[|\[)")
_COLLECTIVE = re.compile(r"shuffle|storage_sync|T\.ptx\[\"cp\.async\.(?:commit|wait)")
_BINDING_GRID = re.compile(r'T\.thread_binding\((\d+), thread="blockIdx\.([xyz])"\)')
_SIGNATURE = re.compile(r"\b((?:in|out)\d+): T\.Buffer\(\(([^)]*)\)")


def generic_kernel(
    op: GraphDefinedOp, k: int, info: GraphInfo, key_extra: Hashable, emit: Callable[[], KernelText]
) -> tuple[str, str, int] | None:
    """The generic text of graph-defined op ``k`` (its PrimFunc named ``generic_rows_kernel``, :func:`renamed`
    names it), its rule and threads a block, or None where the kernel is emitted per length. ``key_extra``:
    what else the emitted code depends on (the arithmetic, the profile, the seed: with the tiles, the thread
    plan); ``emit()`` emits it at
    these shapes (called at a key's first length only)."""
    binfo = info.blocks[k]
    if binfo is None or not _rows_independent(op, info, k):
        return None
    split = _split_dims(op, info, k)
    if split is None:
        return None
    rows, dims = split
    ins = tuple(
        (*_masked(info.of(r).shape, dims[f"in{i}"]), info.of(r).dtype) for i, r in enumerate(op.inputs)
    )
    outs = tuple((*_masked(t.shape, dims[f"out{s}"]), t.dtype) for s, t in enumerate(binfo.outputs))
    key = (op.block.nodes, len(op.block.grid), ins, outs, key_extra)  # not the rows a block: the first's
    if key not in _TEXTS:
        kt = emit()
        text = generic_text(kt.text, kt.name, op.block.grid, rows, dims)
        if len(_TEXTS) >= _MAX_KEYS:
            _TEXTS.clear()
        _TEXTS[key] = None if text is None else (text, f"{kt.rule}; generic in the rows", kt.threads)
    return _TEXTS[key]


def _rows_independent(op: GraphDefinedOp, info: GraphInfo, k: int) -> bool:
    """Whether every output row of the kernel depends on the same row of its inputs alone: no loop, no
    accumulator, block ops element-wise or reductions over a dim no grid dim splits (rows right-aligned)."""
    block = op.block
    if block.forloop != 1:
        return False
    split: set[int] = set()  # the dims the grid splits, counted from the last (tiles broadcast right-aligned)
    for n in block.nodes:
        if isinstance(n, InputIterator):
            if n.fmap is not None:
                return False
            rank = len(info.of(op.inputs[n.input]).shape)
            split |= {d - rank for d in n.imap if d is not None}  # at some length the grid may split it
        elif isinstance(n, Accumulator):
            return False
    binfo = info.blocks[k]
    assert binfo is not None
    for n in block.nodes:
        if isinstance(n, BlockOp):
            if n.op in REDUCTIONS:
                rank = len(binfo.nodes[n.inputs[0].node][n.inputs[0].out].shape)
                if int(attr(n.attrs, "dim")) % rank - rank in split:
                    return False
            elif n.op not in ELEMENTWISE:
                return False
        elif not isinstance(n, InputIterator | ThreadGraph | OutputSaver):
            return False
    return True


def _split_dims(
    op: GraphDefinedOp, info: GraphInfo, k: int
) -> tuple[tuple[int, ...], dict[str, dict[int, int]]] | None:
    """Rows a block along each grid dim (0: a dim that stays a constant) and, per parameter, its data dims
    each split grid dim splits (dim -> grid dim); None where a split dim is a tensor's last (its 16-byte
    copies could cross the bound) or the grid dim's data sizes disagree."""
    binfo = info.blocks[k]
    assert binfo is not None
    grid = op.block.grid
    sizes: dict[int, int] = {}
    dims: dict[str, dict[int, int]] = {}
    savers = [n for n in op.block.nodes if isinstance(n, OutputSaver)]
    iters = [n for n in op.block.nodes if isinstance(n, InputIterator)]
    tensors = [(f"in{n.input}", info.of(op.inputs[n.input]).shape, n.imap) for n in iters]
    tensors += [
        (f"out{s}", t.shape, n.omap) for s, (n, t) in enumerate(zip(savers, binfo.outputs, strict=True))
    ]
    for name, shape, imap in tensors:
        mine = dims.setdefault(name, {})
        for g, d in enumerate(imap):
            if d is None:
                continue
            if d == len(shape) - 1 or sizes.setdefault(g, shape[d]) != shape[d] or shape[d] % grid[g]:
                return None
            mine[d] = g
    for i in range(len(op.inputs)):
        dims.setdefault(f"in{i}", {})
    rows = tuple(sizes[g] // grid[g] if g in sizes else 0 for g in range(len(grid)))
    return rows, dims


def _masked(shape: tuple[int, ...], dims: dict[int, int]) -> tuple[Any, ...]:
    return tuple(None if d in dims else n for d, n in enumerate(shape))


def generic_text(
    text: str, name: str, grid: tuple[int, ...], rows: tuple[int, ...], dims: dict[str, dict[int, int]]
) -> str | None:
    """The emitted kernel ``text`` made generic (module docstring): split dims ``n<g>`` in the signature, the
    grid from them, every statement that touches a tensor's row guarded by its bound; None where a guarded
    statement is not a plain one (a barrier, a warp shuffle, a binding, a compound statement's head)."""
    lines = re.sub(rf"\b{re.escape(name)}\b", _NAME, text).splitlines()
    declared: set[int] = set()

    def signature(m: re.Match[str]) -> str:
        param, shape = m.group(1), [s.strip() for s in m.group(2).split(",") if s.strip()]
        for d, g in dims.get(param, {}).items():
            shape[d] = f"n{g}" if g in declared else f'"n{g}"'
            declared.add(g)
        return f"{param}: T.Buffer(({', '.join(shape)}{',' if len(shape) == 1 else ''})"

    out: list[str] = []
    bound: set[int] = set()  # the grid dims bound to blockIdx
    for line in lines:
        if line.startswith("def "):
            out.append(_SIGNATURE.sub(signature, line))
            out.extend(f"    n{g} = T.int32()" for g in sorted(declared))
            continue
        grid_line = _BINDING_GRID.search(line)
        if grid_line is not None:
            g = "xyz".index(grid_line.group(2))
            if int(grid_line.group(1)) != grid[g]:
                return None
            bound.add(g)
            if rows[g]:
                extent = f"n{g}" if rows[g] == 1 else f"(n{g} + {rows[g] - 1}) // {rows[g]}"
                line = line.replace(
                    grid_line.group(0), f'T.thread_binding({extent}, thread="blockIdx.{grid_line.group(2)}")'
                )
            out.append(line)
            continue
        bounds = _bounds(line, dims)
        if bounds is None:
            return None
        if bounds:
            stripped = line.lstrip()
            if _COLLECTIVE.search(line) or re.match(r"(for|if|with|while)\b|\w+ = ", stripped):
                return None
            indent = line[: len(line) - len(stripped)]
            out += [f"{indent}if {' and '.join(bounds)}:", f"{indent}    {stripped}"]
            continue
        out.append(line)
    if not declared or bound != {g for g, r in enumerate(rows) if r}:  # a grid dim of 1 block has no loop
        return None
    return "\n".join(out)


def _bounds(line: str, dims: dict[str, dict[int, int]]) -> list[str] | None:
    """The conditions ``index < n<g>`` of every split dim a tensor access on ``line`` indexes (None: an
    index that could not be read)."""
    conds: list[str] = []
    for m in _ACCESS.finditer(line):
        split = dims.get(m.group(1), {})
        if not split:
            continue
        index = _index_list(line, m.end())
        if index is None:
            return None
        for d, g in split.items():
            if d >= len(index):
                return None
            cond = f"{index[d]} < n{g}"
            if cond not in conds:
                conds.append(cond)
    return conds


def _index_list(line: str, start: int) -> list[str] | None:
    """The comma-separated top-level expressions from ``start`` up to the closing bracket."""
    depth = 0
    items: list[str] = []
    cur: list[str] = []
    for ch in line[start:]:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            if depth == 0:
                items.append("".join(cur).strip())
                return [f"({s})" if not re.fullmatch(r"\w+", s) else s for s in items]
            depth -= 1
        elif ch == "," and depth == 0:
            items.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    return None


def emitter(
    g: KernelGraph, k: int, info: GraphInfo, plan: ThreadChoice, target: Target, scalar: Scalar, name: str
) -> Callable[[], KernelText]:
    """``emit()``: graph-defined op ``k``'s kernel at these shapes, as :func:`emit_graph_defined` writes it."""
    return functools.partial(emit_graph_defined, g, k, info, plan, target=target, scalar=scalar, name=name)


def row_kernel(emit: Callable[[], KernelText], hw: HwProfile, seed: int) -> Kernel | None:
    """The CUDA kernel of :func:`emitter`'s op generic in its rows (:func:`generic_kernel`) within
    :func:`~gensorage.codegen.generic_matmul.generic_matmuls`, under ``emit``'s name, with its parameters at
    these shapes and its own kernel here (``Kernel.own``) emitted on demand; None where it is emitted per
    length (by ``emit()``), on llvm and in field mode."""
    from gensorage.codegen import generic_matmul
    from gensorage.codegen.module import Kernel

    g, k, info, _ = emit.args  # type: ignore[attr-defined]
    target, scalar, name = (emit.keywords[n] for n in ("target", "scalar", "name"))  # type: ignore[attr-defined]
    op = g.ops[k]
    if target != "cuda" or scalar.field or not generic_matmul.active() or not isinstance(op, GraphDefinedOp):
        return None
    # the thread plan follows from the key's tiles, the profile and the seed (a plan pinned by a caller of
    # compile_ugraph is not a dispatcher's: it builds without generic kernels)
    got = generic_kernel(op, k, info, (scalar.acc_dtype, hw, seed), emit)
    if got is None:
        return None
    text, rule, threads = got
    script = re.sub(rf"\b{_NAME}\b", name, text)
    params = tuple(graph_kernel_params(g, k, info, scalar))
    own = functools.partial(_own, emit)
    return Kernel(name, k, _parsed(script, name), script, params, None, threads, rule, own=own)


@functools.lru_cache(maxsize=256)
def _parsed(script: str, name: str) -> Any:
    from gensorage.codegen.module import _parse

    return _parse(script, name)


def _own(emit: Callable[[], KernelText]) -> tuple[Any, str]:
    """The emitter's own kernel at these shapes (its PrimFunc and rule)."""
    from gensorage.codegen.module import _parse

    kt = emit()
    return _parse(kt.text, kt.name), kt.rule


__all__ = ["emitter", "generic_kernel", "generic_text", "row_kernel"]

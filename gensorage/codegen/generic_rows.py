"""A row kernel emitted once with its rows a variable: one kernel for every length (CUDA, and llvm's first tier).

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

Where the rows' own length is the length too (attention's softmax over the keys, :func:`_row_length`), a block's
tile is a whole row, so the kernel is emitted for rows of a *capacity* of elements instead (:func:`_at_capacity`:
one row a block, element loads; :data:`CAPACITIES`, 4,096 and 16,384 keys, each where its tiles fit a block's
shared memory; a row takes the smallest that holds it) and is generic in the row's length ``nr`` as well: every
load and store of an element at ``nr`` or beyond, and every step of a reduction's accumulation from the row's
tile, is skipped (:func:`_accumulation_bounds`; a reduction seeded from an element is emitted per length). Such
elements then take part in element-wise steps only, never reduced or stored, so each row is reduced over its own
``nr`` elements. And the loops over a row's elements stop after the last step that holds one below ``nr``
(:func:`_row_loops`): a step past it would have touched only such elements, so the work follows the keys (at 128
keys one step of 512 threads, not the capacity's 8). A structure's first length lowers its softmax at every
capacity (:func:`wider`), so a later length of up to 16,384 keys finds its kernel compiled; a longer row is
emitted per length. A row reduced whole that no split dim is as long as (:func:`_reduced_row`: a decode step's
keys, or a norm's hidden dim; one length cannot tell them apart) keeps its first length's row form, its
capacity forms lowered beside it, and a later length whose row differs from the first's takes a capacity form.

The length's own build (in the background, :mod:`~gensorage.codegen.symbolic_kernels`) takes the emitter's
kernel at that length (``Kernel.own``), so the steady state is the untiered one.

On llvm (the dispatcher's tiered builds) the same rewriting applies to the llvm emitter's text, whose blocks are
loops (``for by in T.serial(40)``, the first grid dim ``T.parallel``) and whose threads a serial loop per step:
the loops over the blocks take the grid's extents, the rest is as on CUDA (no barrier or shuffle there).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import re
from collections.abc import Callable, Hashable, Iterator
from typing import TYPE_CHECKING, Any

from gensorage.codegen.kernel_text import graph_kernel_params
from gensorage.codegen.ugraph_tir import emit_graph_defined, plan_threads
from gensorage.errors import GensorageError
from gensorage.folds import same_folds
from gensorage.opset import ELEMENTWISE, REDUCTIONS, attr
from gensorage.ugraph.ir import Accumulator, BlockOp, GraphDefinedOp, InputIterator, OutputSaver, ThreadGraph
from gensorage.ugraph.shapes import GraphInfo, TensorInfo, block_shapes

if TYPE_CHECKING:
    from gensorage.codegen.kernel_text import KernelText, Target
    from gensorage.codegen.module import Kernel
    from gensorage.codegen.scalar import Scalar
    from gensorage.construction.block_threads import ThreadChoice
    from gensorage.hw.profile import HwProfile
    from gensorage.ugraph.ir import KernelGraph

#: Elements of a row whose own length is the sequence length (a softmax's keys) its first generic kernel holds:
#: one row a block, 512 threads.
CAPACITY = 4096
#: The rows' lengths such kernels are compiled for (each where its tiles fit a block's shared memory); a row is
#: served by the smallest that holds it, and a longer row is emitted per length.
CAPACITIES = (CAPACITY, 4 * CAPACITY)
#: Threads of an llvm capacity form (one warp): on llvm the threads are a serial loop at every step, and each
#: reduction a tree over all of them, so a row of 200 keys at 512 threads took 3 times its own kernel's time, at
#: 32 as long or less (the steps over a row's elements, :func:`_row_loops`, follow the keys).
LLVM_ROW_THREADS = 32
#: The dim mark of a row's own length (``nr`` in the generic text; a grid dim ``g`` is ``n<g>``).
ROW = -1
#: The first length's row of a kernel reducing whole rows no split dim is as long as (by key, the row left out).
_FIRST_ROWS: dict[Hashable, int] = {}
#: Generic texts by key (None: the key's kernel is emitted per length).
_TEXTS: dict[Hashable, tuple[str, str, int] | None] = {}
_MAX_KEYS = 1024
_NAME = "generic_rows_kernel"
_ACCESS = re.compile(r"\b((?:in|out)\d+)(\.ptr_to\(\[|\[)")
_COLLECTIVE = re.compile(r"shuffle|storage_sync|T\.ptx\[\"cp\.async\.(?:commit|wait)")
#: A grid dim's binding: CUDA's blockIdx, llvm's loop over the blocks (``for by in T.serial(40)``).
_BINDING_GRID = re.compile(
    r'T\.thread_binding\((\d+), thread="blockIdx\.([xyz])"\)|\bfor b([xyz]) in (T\.(?:parallel|serial))\((\d+)\)'
)
_SIGNATURE = re.compile(r"\b((?:in|out)\d+): T\.Buffer\(\(([^)]*)\)")
_TILE = re.compile(r"(\w+) = T\.(?:decl_buffer|alloc_buffer)\(\(([^)]*)\)")
_TILE_READ = re.compile(r"\b(s\d+)\[")
_LOOP = re.compile(r"(\s*)for (\w+) in range\((\d+)\):$")
_THREADS = re.compile(r'T\.thread_binding\((\d+), thread="threadIdx\.x"\)|\bfor tx in T\.serial\((\d+)\)')
_ASSIGN = re.compile(r"\s*(\w+)(?:\[.*?\])? = ")
#: The row kernels of other capacities lowered beside the ones a length uses (see :func:`wider`).
_WIDER: contextvars.ContextVar[list[Kernel] | None] = contextvars.ContextVar(
    "generic_rows_wider", default=None
)


def generic_kernel(
    op: GraphDefinedOp,
    k: int,
    info: GraphInfo,
    emit: Callable[[], KernelText],
    hw: HwProfile,
    seed: int,
    capacity: int | None = None,
) -> tuple[str, str, int] | None:
    """The generic text of graph-defined op ``k`` (its PrimFunc named ``generic_rows_kernel``), its rule and
    threads a block, or None where the kernel is emitted per length. ``emit()`` emits it at these shapes (called
    at a key's first length only); the key holds what else the code depends on: the arithmetic, the profile and
    the seed (with the tiles, they fix the thread plan; a plan pinned by a caller of compile_ugraph is not a
    dispatcher's, which builds without generic kernels). A kernel whose rows' own length is the length (a
    softmax over the keys, :func:`_row_length`) is emitted for rows of ``capacity`` elements (default: the
    smallest of :data:`CAPACITIES` that holds the row, :func:`_at_capacity`); None where they do not fit."""
    binfo = info.blocks[k]
    if binfo is None or not _rows_independent(op, info, k):
        return None
    split = _split_dims(op, info, k)
    if split is None:
        return None
    rows, dims = split
    row = _row_length(op, info, k, dims)
    last = _reduced_row(op, info, k) if row is None else None
    if last is not None:
        # A whole row reduced, as long as no split dim (a decode step's keys, or a norm's hidden dim): the form
        # of its first length's row, until a length whose row differs takes the capacity's (module docstring).
        rank = len(info.of(op.inputs[0]).shape)
        tensors = [(info.of(r), dims[f"in{i}"]) for i, r in enumerate(op.inputs)]
        tensors += [(t, dims[f"out{s}"]) for s, t in enumerate(binfo.outputs)]
        masked = tuple((*_masked(t.shape, {**mine, rank - 1: ROW}), t.dtype) for t, mine in tensors)
        target = emit.keywords["target"]  # type: ignore[attr-defined]
        first = _FIRST_ROWS.setdefault((op.block.nodes, len(op.block.grid), masked, hw, seed, target), last)
        if len(_FIRST_ROWS) >= _MAX_KEYS:
            _FIRST_ROWS.clear()
        if capacity is not None or first != last:
            row = last
    cap = None
    if row is not None:
        cap = capacity or next((c for c in CAPACITIES if c >= row), None)
        if cap is None or cap < row:
            return None
        for mine in dims.values():
            mine[len(info.of(op.inputs[0]).shape) - 1] = ROW
    ins = tuple(
        (*_masked(info.of(r).shape, dims[f"in{i}"]), info.of(r).dtype) for i, r in enumerate(op.inputs)
    )
    outs = tuple((*_masked(t.shape, dims[f"out{s}"]), t.dtype) for s, t in enumerate(binfo.outputs))
    scalar, target = (emit.keywords[n] for n in ("scalar", "target"))  # type: ignore[attr-defined]
    # not the rows a block; the capacity (None: a row of fixed length); the target (CUDA's and llvm's texts differ)
    key = (op.block.nodes, len(op.block.grid), ins, outs, scalar.acc_dtype, hw, seed, cap, target)
    if key not in _TEXTS:
        got = _at_capacity(emit, rows, hw, seed, cap) if cap is not None else (emit(), op.block.grid, rows)
        if got is not None and cap is not None and got[0].shared_bytes > hw.shared_mem_per_block:
            got = None  # a whole row's tiles do not fit a block's shared memory at this capacity
        text = None if got is None else generic_text(got[0].text, got[0].name, got[1], got[2], dims, cap)
        if len(_TEXTS) >= _MAX_KEYS:
            _TEXTS.clear()
        _TEXTS[key] = None
        if got is not None and text is not None:
            rule = f"{got[0].rule}; generic in the rows" + (f", rows of up to {cap}" if cap else "")
            _TEXTS[key] = (text, rule, got[0].threads)
    return _TEXTS[key]


def _row_length(op: GraphDefinedOp, info: GraphInfo, k: int, dims: dict[str, dict[int, int]]) -> int | None:
    """The rows' own length where it is the sequence length: a whole row reduced (:func:`_reduced_row`) as long
    as a dim the grid splits (at this length; a row that only happens to be as long is made generic too:
    slower, as exact). Else None."""
    last = _reduced_row(op, info, k)
    if last is None:
        return None
    split = {info.of(r).shape[d] for i, r in enumerate(op.inputs) for d in dims[f"in{i}"]}
    return last if last in split else None


def _reduced_row(op: GraphDefinedOp, info: GraphInfo, k: int) -> int | None:
    """The rows' length where a block reduces whole rows: every tensor of the kernel has one rank, every
    reduction reduces the last dim, keeping it, and the last dims are one size. Else None."""
    binfo = info.blocks[k]
    assert binfo is not None
    shapes = [info.of(r).shape for r in op.inputs] + [t.shape for t in binfo.outputs]
    rank = len(shapes[0])
    reductions = [n for n in op.block.nodes if isinstance(n, BlockOp) and n.op in REDUCTIONS]
    if not reductions or any(len(x) != rank for x in shapes) or len({x[-1] for x in shapes}) != 1:
        return None
    for n in reductions:
        if int(attr(n.attrs, "dim")) % rank != rank - 1 or not attr(n.attrs, "keepdim", False):
            return None
    return shapes[0][-1]


def _at_capacity(
    emit: Callable[[], KernelText], rows: tuple[int, ...], hw: HwProfile, seed: int, capacity: int = CAPACITY
) -> tuple[KernelText, tuple[int, ...], tuple[int, ...]] | None:
    """``emit``'s kernel for rows of ``capacity`` elements, one row a block, loading element by element (no
    16-byte copy crosses a row's end), with its grid and rows a block; None where it does not emit."""
    g, k, info, plan = emit.args  # type: ignore[attr-defined]
    op = g.ops[k]
    grid = tuple(n * r if r else n for n, r in zip(op.block.grid, rows, strict=True))  # one row a block
    block = dataclasses.replace(op.block, grid=grid)
    args = [info.of(r) for r in op.inputs]
    wide = tuple(TensorInfo((*a.shape[:-1], capacity), a.dtype, a.program) for a in args)
    try:
        binfo = block_shapes(g, k, block, wide)
        old = info.nodes[len(g.inputs) + k]
        outs = tuple(TensorInfo(t.shape, o.dtype, o.program) for t, o in zip(binfo.outputs, old, strict=True))
        nodes = list(info.nodes)
        for r, a in zip(op.inputs, wide, strict=True):
            nodes[r.node] = tuple(a if j == r.out else x for j, x in enumerate(nodes[r.node]))
        nodes[len(g.inputs) + k] = outs
        blocks = list(info.blocks)
        blocks[k] = dataclasses.replace(binfo, outputs=outs)
        ops = list(g.ops)
        ops[k] = dataclasses.replace(op, block=block)
        g2, info2 = dataclasses.replace(g, ops=tuple(ops)), GraphInfo(tuple(nodes), tuple(blocks))
        kw = emit.keywords  # type: ignore[attr-defined]
        choice = dataclasses.replace(plan_threads(g2, k, info2, hw, seed), runs=False)
        if kw["target"] == "llvm":
            choice = dataclasses.replace(choice, threads=min(choice.threads, LLVM_ROW_THREADS))
        kt = emit_graph_defined(
            g2, k, info2, choice, target=kw["target"], scalar=kw["scalar"], name=kw["name"]
        )
    except GensorageError:
        return None
    return kt, grid, tuple(1 if r else 0 for r in rows)


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


def _var(g: int) -> str:
    return "nr" if g == ROW else f"n{g}"


def generic_text(
    text: str,
    name: str,
    grid: tuple[int, ...],
    rows: tuple[int, ...],
    dims: dict[str, dict[int, int]],
    row: int | None = None,
) -> str | None:
    """The emitted kernel ``text`` made generic (module docstring): split dims ``n<g>`` in the signature, the
    grid from them, every statement that touches a tensor's row guarded by its bound; None where a guarded
    statement is not a plain one (a barrier, a warp shuffle, a binding, a compound statement's head). With
    ``row`` (the text emitted for rows of ``row`` elements, dims marked :data:`ROW`), the rows' own length is
    ``nr`` too: every access to an element at ``nr`` or beyond is skipped, every reduction's accumulation from a
    row's tile (``acc[0] = op(acc[0], tile[..])``) skips those elements, and a loop over a row's elements stops
    after its last step holding one below ``nr`` (:func:`_row_loops`)."""
    lines = re.sub(rf"\b{re.escape(name)}\b", _NAME, text).splitlines()
    declared: dict[int, None] = {}
    wide = set()  # on-chip tiles of whole rows (their last dim the capacity)
    if row is not None:
        wide = {m.group(1) for m in _TILE.finditer(text) if m.group(2).split(",")[-1].strip() == str(row)}

    def signature(m: re.Match[str]) -> str:
        param, shape = m.group(1), [s.strip() for s in m.group(2).split(",") if s.strip()]
        for d, g in dims.get(param, {}).items():
            shape[d] = _var(g) if g in declared else f'"{_var(g)}"'
            declared[g] = None
        return f"{param}: T.Buffer(({', '.join(shape)}{',' if len(shape) == 1 else ''})"

    out: list[str] = []
    bound: set[int] = set()  # the grid dims bound to blockIdx
    for line in lines:
        if line.startswith("def "):
            out.append(_SIGNATURE.sub(signature, line))
            out.extend(f"    {_var(g)} = T.int32()" for g in declared)
            continue
        grid_line = _BINDING_GRID.search(line)
        if grid_line is not None:
            cuda = grid_line.group(1) is not None
            axis, blocks = grid_line.group(2, 1) if cuda else grid_line.group(3, 5)
            g = "xyz".index(axis)
            if int(blocks) != grid[g]:
                return None
            bound.add(g)
            if rows[g]:
                extent = f"n{g}" if rows[g] == 1 else f"(n{g} + {rows[g] - 1}) // {rows[g]}"
                binding = (
                    f'T.thread_binding({extent}, thread="blockIdx.{axis}")'
                    if cuda
                    else f"for b{axis} in {grid_line.group(4)}({extent})"
                )
                line = line.replace(grid_line.group(0), binding)
            out.append(line)
            continue
        bounds = _bounds(line, dims)
        if bounds is None:
            return None
        if wide and not bounds:
            bounds = _accumulation_bounds(line, wide)
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
    split = {g for g, r in enumerate(rows) if r}
    if not declared or bound != split or set(declared) - {ROW} != split:  # a grid dim of 1 block has no loop
        return None
    if wide and row is not None:
        threads = _THREADS.search(text)
        if threads is None:
            return None
        out = _row_loops(out, wide, int(threads.group(1) or threads.group(2)), row)
    return "\n".join(out)


def _row_loops(lines: list[str], wide: set[str], threads: int, row: int) -> list[str]:
    """``lines`` with each loop over a whole row's elements bounded by ``nr``: a loop ``for v in range(K)`` with
    ``K·threads = row`` whose body indexes elements as ``v * threads + tx`` alone and assigns only whole rows'
    tiles, registers it allocates, or under a guard (``if ... < nr``, :func:`generic_text`) runs
    ``min(K, ceil(nr / threads))`` steps. A step it no longer runs holds only elements at ``nr`` or beyond:
    its guarded statements did nothing, and what it wrote (those elements of a tile, its own registers) is read
    only by such statements of other loops, so what reaches an output is unchanged."""
    out = list(lines)
    for i, line in enumerate(lines):
        m = _LOOP.match(line)
        if m is None or int(m.group(3)) * threads != row:
            continue
        indent, var = len(m.group(1)), m.group(2)
        body = []
        for ln in lines[i + 1 :]:
            if ln.strip() and len(ln) - len(ln.lstrip()) <= indent:
                break
            body.append(ln)
        element = rf"{var} \* {threads} \+ tx"
        text = "\n".join(body)
        uses = len(re.findall(rf"\b{var}\b", text))
        if not uses or uses != len(
            re.findall(rf"(?<=[\[(,=] ){element}(?=[\]),\n]|$)|(?<=[\[(]){element}", text)
        ):
            continue  # the loop variable used otherwise than as an element's index
        local = {a.group(1) for ln in body if (a := _ASSIGN.match(ln)) and "alloc_buffer(" in ln}
        guarded, plain = False, True
        for ln in body:
            a = _ASSIGN.match(ln)
            index = re.fullmatch(rf"\s*\w+ = {element}", ln) is not None  # the element's index, named
            if a is not None and not (guarded or index or a.group(1) in wide | local):
                plain = False
            guarded = re.match(r"\s*if .*< nr\b.*:$", ln) is not None
        if plain:
            steps = f"T.min({m.group(3)}, (nr + {threads - 1}) // {threads})"
            out[i] = f"{m.group(1)}for {var} in range({steps}):"
    return out


def _accumulation_bounds(line: str, wide: set[str]) -> list[str] | None:
    """For a statement reading a whole row's tile: the bound of its element where it accumulates into a register
    (``acc[0] = op(acc[0], tile[.., i])``: ``i < nr``), none where it does not accumulate (an element-wise
    step: its value at ``nr`` or beyond is never reduced or stored); None where it reads such a tile to set a
    register otherwise (a reduction seeded from an element)."""
    reads = [m for m in _TILE_READ.finditer(line) if m.group(1) in wide]
    if not reads:
        return []
    target = re.match(r"\s*(\w+)\[0\] = (.*)$", line)
    if target is None or not target.group(1).startswith("acc"):
        return []
    if f"{target.group(1)}[0]" not in target.group(2):
        return None
    conds = []
    for m in reads:
        index = _index_list(line, m.end())
        if index is None:
            return None
        conds.append(f"{index[-1]} < nr")
    return conds


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
            cond = f"{index[d]} < {_var(g)}"
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


def row_kernel(
    emit: Callable[[], KernelText], hw: HwProfile, seed: int, capacity: int | None = None
) -> Kernel | None:
    """The kernel of :func:`emitter`'s op generic in its rows (:func:`generic_kernel`, rows of ``capacity``
    elements where their own length is the length) within :func:`~gensorage.codegen.generic_matmul.generic_matmuls`,
    under ``emit``'s name, with its parameters at these shapes and its own kernel here (``Kernel.own``) emitted on
    demand; None where it is emitted per length (by ``emit()``) and in field mode. Within :func:`wider`,
    such a kernel's forms at the other :data:`CAPACITIES` are lowered too (named ``<name>_rows<capacity>``)."""
    from gensorage.codegen import generic_matmul

    g, k, info, _ = emit.args  # type: ignore[attr-defined]
    scalar, name = (emit.keywords[n] for n in ("scalar", "name"))  # type: ignore[attr-defined]
    op = g.ops[k]
    if scalar.field or not generic_matmul.active() or not isinstance(op, GraphDefinedOp):
        return None
    got = generic_kernel(op, k, info, emit, hw, seed, capacity)
    if got is None:
        return None
    wider_ones, mine = _WIDER.get(), re.search(r"rows of up to (\d+)$", got[1])
    if wider_ones is not None and capacity is None:
        for cap in CAPACITIES:
            if mine is not None and cap == int(mine.group(1)):
                continue
            other = generic_kernel(op, k, info, emit, hw, seed, cap)
            if other is not None and other[1].endswith(f"rows of up to {cap}"):  # a row it may take later
                wide = _kernel(emit, other, f"{name}_rows{cap}")
                if wide is not None:
                    wider_ones.append(wide)
    return _kernel(emit, got, name)


def as_first(emit: Callable[[], KernelText]) -> KernelText:
    """``emit()`` (a graph-defined kernel emitted per length); within the CUDA first tier with the index folds of
    its first length (:mod:`gensorage.folds`: a grid dim of extent 1 at one token keeps its terms, so the text
    has the first length's code), its own kernel here (``Kernel.own``) the emitter's."""
    from gensorage.codegen import generic_matmul

    g, k, _, _ = emit.args  # type: ignore[attr-defined]
    target, scalar, name = (emit.keywords[n] for n in ("target", "scalar", "name"))  # type: ignore[attr-defined]
    op = g.ops[k]
    if target != "cuda" or scalar.field or not generic_matmul.active() or not isinstance(op, GraphDefinedOp):
        return emit()
    kt = same_folds(("graph", name, op.block.nodes, len(op.block.grid)), emit)
    return dataclasses.replace(kt, own=functools.partial(_own, emit))


def _kernel(emit: Callable[[], KernelText], got: tuple[str, str, int], name: str) -> Kernel | None:
    """The Kernel of generic text ``got`` (text, rule, threads) named ``name``; None where it does not parse."""
    from gensorage.codegen.module import Kernel

    g, k, info, _ = emit.args  # type: ignore[attr-defined]
    text, rule, threads = got
    script = re.sub(rf"\b{_NAME}\b", name, text)
    params = tuple(graph_kernel_params(g, k, info, emit.keywords["scalar"]))  # type: ignore[attr-defined]
    try:
        func = _parsed(script, name)
    except GensorageError:  # a generic text the parser or the barrier check refuses: emitted per length
        return None
    own = functools.partial(_own, emit)
    return Kernel(name, k, func, script, params, None, threads, rule, own=own)


@contextlib.contextmanager
def wider() -> Iterator[list[Kernel]]:
    """Within it, :func:`row_kernel` lowers a kernel whose rows' own length is the length at each of
    :data:`CAPACITIES` (the list yielded gets those the lengths at hand do not use), so that a later length
    served by another capacity finds its kernel compiled (:func:`gensorage.superopt.dispatch`'s first shape)."""
    found: list[Kernel] = []
    token = _WIDER.set(found)
    try:
        yield found
    finally:
        _WIDER.reset(token)


@functools.lru_cache(maxsize=256)
def _parsed(script: str, name: str) -> Any:
    from gensorage.codegen.module import _parse
    from gensorage.codegen.script_templates import deferred_templates

    # one text at every length: a template of its literals would never be used (it cost a first llvm length
    # of the small layer about 0.5 s of its lowering)
    with deferred_templates():
        return _parse(script, name)


def _own(emit: Callable[[], KernelText]) -> tuple[Any, str]:
    """The emitter's own kernel at these shapes (its PrimFunc and rule)."""
    from gensorage.codegen.module import _parse

    kt = emit()
    return _parse(kt.text, kt.name), kt.rule


__all__ = ["as_first", "emitter", "generic_kernel", "generic_text", "row_kernel", "wider"]

"""Row fusion: groups of pre-defined element-wise ops and reductions become one graph-defined kernel each.

The direct µGraph runs one kernel per op, so a normalisation (square, sum, sqrt, div) is four trips through
global memory and four launches. This pass finds maximal groups of pre-defined kernel ops that work on the same
*rows*: tensors of one rank that agree on every dim but the *row dim*, where each is the row's length or 1. The
row dim is the one the group's reductions reduce (the last dim for a normalisation over the hidden size, the
middle one for keys stored transposed), or the last when there is none. A group holds element-wise ops (with
numpy broadcasting: ``[rows, 1]`` against ``[rows, d]``, a ``[d]`` gain against ``[rows, d]``) and
``sum``/``max`` over the row dim, keepdim or not, and becomes one :class:`GraphDefinedOp`:

- the grid splits the other dims; a block holds whole rows (several when rows are short), so every
  reduction is a block reduction and nothing loops;
- the element-wise ops between reductions run as one :class:`ThreadGraph` per *level* (how many reductions lie
  before them), so a chain stays in registers and each block tensor another node reads is written once;
- an :class:`OutputSaver` writes every group value read outside the group or returned by the program.

A group grows through its ops' inputs: an op joins the groups of the ops it reads, and of the ops that read the
same tensor (siblings: one kernel reads the tensor once).

Matmuls, layout ops and graph-defined kernels are never grouped (matmuls keep their tensor-core kernels; the
element-wise ops around them fuse with their other neighbours). A group is left alone when it does not apply:
reductions over two dims, a reduced value without its row dim read inside the group, more than three split
dims, a group that would not be convex (a path leaving it and coming back), or a kernel whose tiles do not fit
the GPU's shared memory (rows that long would need a looped kernel, which this pass does not build).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gensorage.errors import UGraphError
from gensorage.folds import decide
from gensorage.hw.profile import HwProfile
from gensorage.opset import ELEMENTWISE, REDUCTIONS, Shape, attr
from gensorage.ugraph.ir import (
    BlockGraph,
    BlockNode,
    BlockOp,
    GraphDefinedOp,
    InputIterator,
    KernelGraph,
    KernelNode,
    KernelOp,
    OutputSaver,
    Ref,
    ThreadGraph,
    ThreadOp,
)
from gensorage.ugraph.shapes import GraphInfo, infer
from gensorage.ugraph.validate import validate

#: Elements of one block's row tile the grid aims at when rows are short (several rows share a block).
BLOCK_ELEMENTS = 2048
#: Blocks the grid keeps at least, where the rows allow (fewer leave most SMs idle).
MIN_BLOCKS = 128


@dataclass(frozen=True, slots=True)
class _Member:
    """A fusable kernel op: its node id, the shape it works on (a reduction's input), the dim it reduces (None
    for an element-wise op) and its result's rank."""

    node: int
    shape: Shape
    rdim: int | None
    out_rank: int


@dataclass(frozen=True, slots=True)
class Group:
    """Node ids (ascending) of kernel ops fused into one kernel, the rows' domain (every dim's size, the row dim
    at its full length) and the row dim (the one its reductions reduce; the last when there are none)."""

    members: tuple[int, ...]
    sizes: Shape
    row_dim: int


def _member(g: KernelGraph, info: GraphInfo, k: int) -> _Member | None:
    """Kernel op ``k`` as a group member, or None when it cannot join a group."""
    op = g.ops[k]
    if not isinstance(op, KernelOp):
        return None
    node = len(g.inputs) + k
    out = info.nodes[node][0].shape
    if op.op in ELEMENTWISE and out:
        return _Member(node, out, None, len(out))
    if op.op not in REDUCTIONS:
        return None
    src = info.of(op.inputs[0]).shape
    dim = attr(op.attrs, "dim")
    group = attr(op.attrs, "group")
    if not src or not isinstance(dim, int) or (group is not None and group != src[dim % len(src)]):
        return None
    return _Member(node, src, dim % len(src), len(out))


def _domain(members: Sequence[_Member]) -> tuple[Shape, int] | None:
    """The rows' sizes and row dim of ``members`` together, or None when they do not share rows: one rank, at
    most one reduced dim, every other dim equal, the row dim one length (or 1)."""
    ranks = {len(m.shape) for m in members}
    rdims = {m.rdim for m in members if m.rdim is not None}
    if len(ranks) != 1 or len(rdims) > 1:
        return None
    (rank,) = ranks
    row = next(iter(rdims), rank - 1)
    sizes = []
    for d in range(rank):
        here = {m.shape[d] for m in members}
        if d == row:
            here.discard(1)
        if len(here) > 1:
            return None
        sizes.append(next(iter(here), 1))
    return tuple(sizes), row


def _ancestors(g: KernelGraph) -> list[frozenset[int]]:
    """Every node's ancestors (node ids), inputs included."""
    anc: list[frozenset[int]] = [frozenset() for _ in g.inputs]
    for op in g.ops:
        mine: set[int] = set()
        for r in op.inputs:
            mine.add(r.node)
            mine |= anc[r.node]
        anc.append(frozenset(mine))
    return anc


def _convex(members: set[int], anc: list[frozenset[int]]) -> bool:
    """Whether no path leaves ``members`` and comes back (the group can run as one kernel)."""
    between = set().union(*(anc[m] for m in members)) - members
    return not any(anc[x] & members for x in between)


def find_groups(g: KernelGraph, info: GraphInfo | None = None) -> list[Group]:
    """The maximal groups of two or more fusable kernel ops of ``g`` (see the module docstring), in node order."""
    info = info or infer(g)
    anc = _ancestors(g)
    members: dict[int, _Member] = {}
    group_of: dict[int, int] = {}
    groups: dict[int, set[int]] = {}
    readers: dict[int, list[int]] = {}  # tensor -> the members that read it
    for k, op in enumerate(g.ops):
        m = _member(g, info, k)
        if m is None:
            continue
        members[m.node] = m
        mine = {m.node}
        # Producers' groups, and siblings' (groups that read one of its inputs too: the input is read once).
        near = [r.node for r in op.inputs if r.node in members]
        near += [n for r in op.inputs for n in readers.get(r.node, [])]
        for gid in dict.fromkeys(group_of[n] for n in near):
            if gid not in groups or gid in mine:
                continue
            merged = mine | groups[gid]
            if _domain([members[n] for n in merged]) is None:
                continue
            if _convex(merged, anc) and _full_rank_edges(g, members, merged):
                mine = merged
                del groups[gid]
        for n in mine:
            group_of[n] = m.node
        groups[m.node] = mine
        for r in op.inputs:
            readers.setdefault(r.node, []).append(m.node)
    out = []
    for mine in groups.values():
        domain = _domain([members[n] for n in mine])
        if len(mine) >= 2 and domain is not None:
            out.append(Group(tuple(sorted(mine)), *domain))
    return sorted(out, key=lambda grp: grp.members)


def _full_rank_edges(g: KernelGraph, members: dict[int, _Member], mine: set[int]) -> bool:
    """Whether every value read inside the group has the rows' rank (a reduction that drops the row dim may only
    leave the group: broadcasting it against a row would align its leading dims with the row)."""
    nin = len(g.inputs)
    return all(
        members[r.node].out_rank == len(members[n].shape)
        for n in mine
        for r in g.ops[n - nin].inputs
        if r.node in mine
    )


# ------------------------------------------------------------------------------------------- the kernel


def _largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, max(1, min(n, at_most)) + 1) if n % d == 0)


def _blocks(sizes: Shape, row_dim: int, split_row: bool) -> list[int]:
    """Blocks along each dim of the rows' domain: whole rows, several per block when short (packed from the
    innermost other dim out, so a block's tile stays contiguous where it can)."""
    blocks = [n if d != row_dim else 1 for d, n in enumerate(sizes)]
    tile_row = sizes[row_dim]
    if split_row and tile_row > BLOCK_ELEMENTS:
        tile_row = _largest_divisor(sizes[row_dim], BLOCK_ELEMENTS)
        blocks[row_dim] = sizes[row_dim] // tile_row
    rows = math.prod(sizes) // sizes[row_dim]
    per = max(1, min(BLOCK_ELEMENTS // tile_row, rows // MIN_BLOCKS))
    for d in reversed(range(len(sizes))):
        if d == row_dim:
            continue
        r = _largest_divisor(sizes[d], per)
        blocks[d] = sizes[d] // r
        per //= r
        if r < sizes[d]:
            break
    return blocks


def _imap(shape: Shape, rank: int, grid_dims: Sequence[int], sizes: Sequence[int]) -> tuple[int | None, ...]:
    """The data dim of a tensor of ``shape`` (right-aligned to the rows' rank) along each split domain dim."""
    out: list[int | None] = []
    for dd in grid_dims:
        xd = dd - (rank - len(shape))
        along = xd >= 0 and shape[xd] == sizes[dd]
        # a dim of 1 in both reads its one row either way (folds: another length's choice where replayed)
        exact = ("map",) if along and sizes[dd] > 1 else ("none", "map") if along else ("none",)
        out.append(xd if decide(exact) == "map" else None)
    return tuple(out)


def fused_kernel(g: KernelGraph, info: GraphInfo, group: Group) -> GraphDefinedOp | None:
    """The graph-defined kernel computing ``group``'s ops (see the module docstring); None when it does not
    apply (the caller leaves the group alone)."""
    mset = set(group.members)
    ops = {n: _kernel_op(g, n) for n in group.members}
    sizes, row_dim = group.sizes, group.row_dim
    rank = len(sizes)
    reduction = [n for n in group.members if ops[n].op in REDUCTIONS]
    readers = _outside_readers(g, mset)
    saved = [n for n in group.members if n in readers]
    if not saved:
        return None
    lasts = {info.nodes[n][0].shape[-1] for n in saved}
    blocks = _blocks(sizes, row_dim, split_row=not reduction and lasts == {sizes[-1]})
    # a dim of one block may be a grid dim of extent 1 (folds: another length's choice where replayed)
    grid_dims = [
        d for d, b in enumerate(blocks) if decide(("grid",) if b > 1 else ("whole", "grid")) == "grid"
    ]
    if len(grid_dims) > 3:
        return None
    ext: list[Ref] = []
    for n in group.members:
        for r in ops[n].inputs:
            if r.node not in mset and r not in ext:
                ext.append(r)
    nodes: list[BlockNode] = [
        InputIterator(i, _imap(info.of(r).shape, rank, grid_dims, sizes) or (None,))
        for i, r in enumerate(ext)
    ]
    where: dict[int, Ref] = {}
    for level in _levels(ops, mset):
        chain = [n for n in level if ops[n].op in ELEMENTWISE]
        if chain:
            _thread_graph(nodes, chain, ops, ext, where, mset, readers)
        for n in level:
            if ops[n].op in REDUCTIONS:
                nodes.append(
                    BlockOp(ops[n].op, tuple(_block_ref(r, ext, where) for r in ops[n].inputs), ops[n].attrs)
                )
                where[n] = Ref(len(nodes) - 1)
    for n in saved:
        # a reduction without keepdim has no row dim: the dims after it move up one
        dropped = len(info.nodes[n][0].shape) < rank
        omap = tuple(d - (dropped and d > row_dim) for d in grid_dims) or (0,)
        nodes.append(OutputSaver(where[n], omap))
    grid = tuple(blocks[d] for d in grid_dims) or (1,)
    return GraphDefinedOp(BlockGraph(grid, 1, tuple(nodes)), tuple(ext))


def _kernel_op(g: KernelGraph, node: int) -> KernelOp:
    op = g.ops[node - len(g.inputs)]
    assert isinstance(op, KernelOp)  # find_groups groups pre-defined ops only
    return op


def _outside_readers(g: KernelGraph, mset: set[int]) -> set[int]:
    """Members read by an op outside the group or returned by the program."""
    out = {r.node for r in g.outputs if r.node in mset}
    for k, op in enumerate(g.ops):
        if len(g.inputs) + k not in mset:
            out |= {r.node for r in op.inputs if r.node in mset}
    return out


def _levels(ops: dict[int, KernelOp], mset: set[int]) -> list[list[int]]:
    """Members by level: how many reductions lie on the longest path into each (element-wise ops after a
    reduction run in the next level's thread graph)."""
    level: dict[int, int] = {}
    for n in sorted(mset):
        level[n] = max(
            (level[r.node] + (ops[r.node].op in REDUCTIONS) for r in ops[n].inputs if r.node in mset),
            default=0,
        )
    top = max(level.values(), default=0)
    return [[n for n in sorted(mset) if level[n] == lv] for lv in range(top + 1)]


def _block_ref(r: Ref, ext: list[Ref], where: dict[int, Ref]) -> Ref:
    return where[r.node] if r.node in where else Ref(ext.index(r))


def _thread_graph(
    nodes: list[BlockNode],
    chain: list[int],
    ops: dict[int, KernelOp],
    ext: list[Ref],
    where: dict[int, Ref],
    mset: set[int],
    readers: set[int],
) -> None:
    """Append one thread graph computing ``chain`` (element-wise members, in node order); ``where`` learns the
    block ref of each of its values another node reads."""
    in_chain = set(chain)
    inputs: list[Ref] = []
    for n in chain:
        for r in ops[n].inputs:
            if r.node not in in_chain and _block_ref(r, ext, where) not in inputs:
                inputs.append(_block_ref(r, ext, where))
    local = {n: len(inputs) + i for i, n in enumerate(chain)}  # member -> thread-local index

    def thread_ref(r: Ref) -> Ref:
        return Ref(local[r.node]) if r.node in in_chain else Ref(inputs.index(_block_ref(r, ext, where)))

    thread_ops = [
        ThreadOp(ops[n].op, tuple(thread_ref(r) for r in ops[n].inputs), ops[n].attrs) for n in chain
    ]
    later = {r.node for n in mset - in_chain for r in ops[n].inputs} | readers
    outs = [n for n in chain if n in later]
    nodes.append(ThreadGraph(tuple(inputs), tuple(thread_ops), tuple(Ref(local[n]) for n in outs)))
    for o, n in enumerate(outs):
        where[n] = Ref(len(nodes) - 1, o)


# ------------------------------------------------------------------------------------------- the rewrite


def replace_groups(g: KernelGraph, kernels: Sequence[tuple[Group, GraphDefinedOp]]) -> KernelGraph:
    """``g`` with each group's ops replaced by its kernel (ops re-ordered topologically, original order kept
    where it can be)."""
    nin = len(g.inputs)
    owner = {n: i for i, (grp, _) in enumerate(kernels) for n in grp.members}
    units: list[tuple[str, int]] = []  # ("op", k) or ("group", i), placed at the group's first member
    for k in range(len(g.ops)):
        n = nin + k
        if n not in owner:
            units.append(("op", k))
        elif n == kernels[owner[n]][0].members[0]:
            units.append(("group", owner[n]))
    new_ref: dict[Ref, Ref] = {Ref(i): Ref(i) for i in range(nin)}
    ops: list[KernelNode] = []
    pending = list(units)
    while pending:
        ready = next((u for u in pending if all(r in new_ref for r in _needs(g, kernels, u))), None)
        if ready is None:
            raise UGraphError("row fusion: the groups are not convex (internal error)")
        pending.remove(ready)
        kind, i = ready
        node = nin + len(ops)
        if kind == "op":
            op = g.ops[i]
            ops.append(_remapped(op, new_ref))
            for o in range(len(op.block.savers) if isinstance(op, GraphDefinedOp) else 1):
                new_ref[Ref(nin + i, o)] = Ref(node, o)
        else:
            grp, kern = kernels[i]
            ops.append(GraphDefinedOp(kern.block, tuple(new_ref[r] for r in kern.inputs)))
            for o, n in enumerate(_saved_members(grp, g)):
                new_ref[Ref(n)] = Ref(node, o)
    return KernelGraph(g.inputs, tuple(ops), tuple(new_ref[r] for r in g.outputs), g.precision)


def _needs(
    g: KernelGraph, kernels: Sequence[tuple[Group, GraphDefinedOp]], unit: tuple[str, int]
) -> tuple[Ref, ...]:
    kind, i = unit
    return g.ops[i].inputs if kind == "op" else kernels[i][1].inputs


def _saved_members(grp: Group, g: KernelGraph) -> list[int]:
    """The members the kernel's savers write, in saver order (as :func:`fused_kernel` placed them)."""
    return [n for n in grp.members if n in _outside_readers(g, set(grp.members))]


def _remapped(op: KernelNode, new_ref: dict[Ref, Ref]) -> KernelNode:
    if isinstance(op, KernelOp):
        return KernelOp(op.op, tuple(new_ref[r] for r in op.inputs), op.attrs)
    return GraphDefinedOp(op.block, tuple(new_ref[r] for r in op.inputs))


def _fits(g: KernelGraph, info: GraphInfo, kern: GraphDefinedOp, hw: HwProfile) -> bool:
    """Whether the kernel's tiles and its reductions' scratch arrays (one float32 slot per thread of the
    largest block, :mod:`gensorage.codegen.block_reduce`) fit the GPU's shared memory per block."""
    from gensorage.ugraph.optimize.memory_plan import shared_footprint

    k = next(i for i, op in enumerate(g.ops) if isinstance(op, GraphDefinedOp) and op.block == kern.block)
    binfo = info.blocks[k]
    assert binfo is not None
    reductions = sum(isinstance(n, BlockOp) and n.op in REDUCTIONS for n in kern.block.nodes)
    scratch = reductions * hw.max_threads_per_block * 4
    return shared_footprint(kern.block, binfo) + scratch <= hw.shared_mem_per_block


def fuse_rows(g: KernelGraph, hw: HwProfile | None = None) -> KernelGraph:
    """``g`` with every row group (:func:`find_groups`) that applies as one graph-defined kernel.

    A group's kernel is kept only when the graph with it validates (against ``hw``'s limits when given);
    otherwise its ops stay as they were. ``g`` itself is returned when nothing fuses.
    """
    info = infer(g)
    kept: list[tuple[Group, GraphDefinedOp]] = []
    for grp in find_groups(g, info):
        kern = fused_kernel(g, info, grp)
        if kern is None:
            continue
        try:
            fused = replace_groups(g, [(grp, kern)])
            fused_info = validate(fused, hw)
        except UGraphError:
            continue
        if hw is not None and not _fits(fused, fused_info, kern, hw):
            continue
        kept.append((grp, kern))
    return replace_groups(g, kept) if kept else g


__all__ = [
    "BLOCK_ELEMENTS",
    "MIN_BLOCKS",
    "Group",
    "find_groups",
    "fuse_rows",
    "fused_kernel",
    "replace_groups",
]

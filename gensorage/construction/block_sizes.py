"""The sizes construction gives a verified block graph: grid dims and for-loop trip count.

The block graph is turned into a loop nest (:func:`loop_nest`: one spatial axis per grid dim, one reduction axis
for the for-loop, every tensor indexed by the axes that split it, the dims no axis splits packed into its
element) and Gensor's construction (:func:`~gensorage.construction.construct_schedule`) picks its
shared-memory (level-1) tiles; a grid dim gets ``extent / T1`` blocks and the loop ``extent / T1`` iterations
(:func:`constructed_sizes`), rounded to the nearest legal divisors (:func:`size_options`). The search sizes every
verified structure this way (``SearchSpec(schedule="markov")``), and re-instantiation proposes these sizes at new
shapes (:mod:`.kernel_sizes`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from gensorage.construction.schedule import construct_schedule
from gensorage.dtypes import dtype_bytes
from gensorage.errors import GensorageError
from gensorage.hw.profile import HwProfile
from gensorage.opset import Shape, flops
from gensorage.ugraph.ir import BlockGraph, BlockOp, InputIterator, ThreadGraph
from gensorage.ugraph.shapes import BlockInfo
from gensorage.ugraph.validate import loop_phases
from gensorage.workloads.workload import Access, Axis, Workload

MAX_RESIZE_OPTIONS = 16  # sized variants tried per graph-defined operator before keeping the probe sizes


def _divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(2, n + 1) if n % d == 0)


def _iterators(block: BlockGraph) -> list[InputIterator]:
    return [n for n in block.nodes if isinstance(n, InputIterator)]


def grid_extents(block: BlockGraph, args: Sequence[Shape]) -> tuple[int, ...]:
    """Per grid dim, the gcd of the input dims it splits (the most blocks it can have)."""
    out = []
    for g in range(len(block.grid)):
        dims = [args[it.input][it.imap[g]] for it in _iterators(block) if it.imap[g] is not None]  # type: ignore[index]
        out.append(math.gcd(*dims) if dims else 1)
    return tuple(out)


def loop_extent(block: BlockGraph, args: Sequence[Shape], grid: Sequence[int]) -> int:
    """The gcd of the per-block extents of the dims the for-loop walks (1 without a loop)."""
    tiles = []
    for it in _iterators(block):
        if it.fmap is None:
            continue
        size = args[it.input][it.fmap]
        for g, d in enumerate(it.imap):
            if d == it.fmap:
                size //= grid[g]
        tiles.append(size)
    return math.gcd(*tiles) if tiles else 1


def block_flops(block: BlockGraph, info: BlockInfo) -> int:
    """Floating-point operations of the whole graph-defined operator (all blocks, all iterations)."""
    phases = loop_phases(block)
    per_block = 0
    for j, node in enumerate(block.nodes):
        if isinstance(node, BlockOp):
            work = flops(
                node.op, [info.nodes[r.node][r.out].shape for r in node.inputs], info.nodes[j][0].shape
            )
        elif isinstance(node, ThreadGraph):
            work = sum(
                flops(
                    t.op,
                    [info.threads[j][r.node].shape for r in t.inputs],
                    info.threads[j][len(node.inputs) + k].shape,
                )
                for k, t in enumerate(node.ops)
            )
        else:
            continue
        per_block += work * (block.forloop if phases[j] == "body" else 1)
    return per_block * math.prod(block.grid)


def _packed_bytes(elems: float, dtype: str) -> int:
    """Bytes of ``elems`` elements of ``dtype``: the block-invariant part of a tensor travels as one element of
    the loop nest (:attr:`~gensorage.workloads.workload.Access.elem_bytes`)."""
    return max(1, math.ceil(elems * dtype_bytes(dtype)))


def loop_nest(block: BlockGraph, args: Sequence[Shape], info: BlockInfo, dtype: str) -> Workload:
    """The loop nest of a block graph for the Markov constructor.

    Axes: ``g0 .. g{r-1}`` (spatial, extent :func:`grid_extents`) and ``r`` (reduction, :func:`loop_extent`)
    when the block graph loops. Each input is indexed by the axes that split it (a dim split by a grid dim and the
    loop by both); the dims no axis splits are packed into its element. The output is indexed by the grid axes
    and carries every saver's data. ``flops`` is the work of the whole operator at its current sizes.
    """
    extents = grid_extents(block, args)
    axes = [Axis(f"g{g}", e, "spatial") for g, e in enumerate(extents)]
    looped = block.forloop > 1
    r_extent = loop_extent(block, args, block.grid) if looped else 1
    if looped:
        axes.append(Axis("r", r_extent, "reduce"))
    accesses = []
    for it in _iterators(block):
        shape = args[it.input]
        index: list[tuple[tuple[str, int], ...]] = []
        dims: list[int] = []
        units_total = 1
        for d, size in enumerate(shape):
            terms: list[tuple[str, int]] = []
            units = 1
            for g, gd in enumerate(it.imap):
                if gd == d:
                    terms.append((f"g{g}", r_extent if it.fmap == d else 1))
                    units *= extents[g]
            if it.fmap == d:
                terms.append(("r", 1))
                units *= r_extent
            if terms:
                index.append(tuple(terms))
                dims.append(min(size, units))
                units_total *= min(size, units)
        packed = math.prod(shape) / units_total
        if not dims:  # no axis splits it: one constant-indexed element holding the whole tensor
            index, dims = [()], [1]
        accesses.append(
            Access(
                f"in{it.input}",
                tuple(dims),
                dtype,
                tuple(index),
                tuple(0 for _ in dims),
                elem_bytes=_packed_bytes(packed, dtype),
            )
        )
    out_elems = sum(math.prod(t.shape) for t in info.outputs)
    cells = math.prod(extents)
    accesses.append(
        Access(
            "out",
            extents,
            dtype,
            tuple(((f"g{g}", 1),) for g in range(len(extents))),
            tuple(0 for _ in extents),
            is_output=True,
            elem_bytes=_packed_bytes(out_elems / cells, dtype),
        )
    )
    params = tuple((a.name, a.extent) for a in axes)
    return Workload(
        name="block_graph",
        params=params,
        axes=tuple(axes),
        accesses=tuple(accesses),
        flops=int(block_flops(block, info)),
        dtype=dtype,
        build=_no_build,
        reference=_no_reference,
    )


def _no_build() -> Any:
    raise GensorageError("a block graph's loop nest is a cost-model view only; it is lowered as a µGraph")


def _no_reference(*arrays: Any) -> Any:
    raise GensorageError("a block graph's loop nest is a cost-model view only; evaluate the µGraph instead")


def constructed_sizes(
    block: BlockGraph,
    args: Sequence[Shape],
    info: BlockInfo,
    dtype: str,
    hw: HwProfile,
    seed: int,
    cache: dict[str, tuple[float, ...] | None],
) -> tuple[float, ...] | None:
    """Target (grid sizes..., trip count) from the Markov construction, unrounded; None if it found nothing."""
    wl = loop_nest(block, args, info, dtype)
    key = (
        wl.key()
        + f"|flops={wl.flops}|"
        + ";".join(f"{a.tensor}:{a.shape}:{a.elem_bytes}:{a.index}" for a in wl.accesses)
    )
    if key in cache:
        return cache[key]
    try:
        sched = construct_schedule(wl, hw, seed)
    except GensorageError:
        cache[key] = None
        return None
    t1 = sched.tiles[1]
    target = tuple(a.extent / t for a, t in zip(wl.axes, t1, strict=True))
    if block.forloop == 1:
        target = target + (1.0,)
    cache[key] = target
    return target


def size_options(
    block: BlockGraph, args: Sequence[Shape], target: Sequence[float]
) -> list[tuple[tuple[int, ...], int]]:
    """Legal (grid, trip count) pairs, nearest to ``target`` first (log distance; ties: smaller sizes first)."""
    extents = grid_extents(block, args)
    per_dim = [_divisors(e) for e in extents]
    if any(not c for c in per_dim):
        return []
    looped = block.forloop > 1
    options: list[tuple[float, tuple[int, ...], int]] = []
    for grid in _product(per_dim):
        loops = _divisors(loop_extent(block, args, grid)) if looped else (1,)
        for f in loops:
            dist = sum(abs(math.log2(v) - math.log2(max(t, 1.0))) for v, t in zip(grid, target, strict=False))
            dist += abs(math.log2(f) - math.log2(max(target[-1], 1.0))) if looped else 0.0
            options.append((dist, grid, f))
    options.sort(key=lambda o: (round(o[0], 9), o[1], o[2]))
    return [(g, f) for _, g, f in options[:MAX_RESIZE_OPTIONS]]


def _product(choices: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = [()]
    for c in choices:
        out = [o + (x,) for o in out for x in c]
    return out


__all__ = [
    "MAX_RESIZE_OPTIONS",
    "block_flops",
    "constructed_sizes",
    "grid_extents",
    "loop_extent",
    "loop_nest",
    "size_options",
]

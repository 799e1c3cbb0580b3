"""The bindings of a block graph's input iterators: an imap, an fmap, and the grid sizes and trip count they
choose, all made when an operator first reads the iterator (see :mod:`.block_level`).

A binding is valid when every dim it splits divides evenly. With ``canonical``, grid dims are numbered in the
order bindings first split them (:func:`new_dims_canonical`); with a dim strategy, only the imaps and fmaps it
lists are made, and an iterator's imap must share a placement of the grid dims with the other iterators'
(:func:`admitted`). Options depend only on the input's shape and the sizes chosen so far, so they are cached
(:func:`binding_options`), and grouped by the tile they give (:func:`binding_groups`): an operator's shape rules
and the memory check depend only on tiles.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from gensorage.dtypes import dtype_bytes
from gensorage.exhaustive.dim_strategy import DimStrategy, fits, imap_placements
from gensorage.exhaustive.expr.expr_arith import EXPR, ExprValue
from gensorage.exhaustive.expr.ties import Ties, tile_ties
from gensorage.exhaustive.walk.probe_sizes import loop_candidates, size_candidates
from gensorage.exhaustive.walk.provenance import Provenance, of_iterator
from gensorage.exhaustive.walk.search_context import SearchContext, remember
from gensorage.exhaustive.walk.search_state import BlockBuild, numel
from gensorage.opset import Shape

if TYPE_CHECKING:
    from gensorage.exhaustive.walk.walk import Walk


@dataclass(frozen=True, slots=True)
class Binding:
    """One way to partition an input: its maps, its tile, and the sizes it chooses (grid dims, trip count)."""

    imap: tuple[int | None, ...]
    fmap: int | None
    tile: Shape
    new_grid: tuple[tuple[int, int], ...]  # (grid dim, size) chosen by this binding
    new_forloop: int | None


Groups = tuple[tuple[Shape, tuple[Binding, ...]], ...]  # bindings grouped by the tile they give


@lru_cache(maxsize=64)
def imap_choices(ndim: int, r: int) -> tuple[tuple[int | None, ...], ...]:
    """Every imap of an ``ndim``-d input on an ``r``-d grid (replica first; one data dim per grid dim at most)."""
    opts: tuple[int | None, ...] = (None, *range(ndim))
    out = []
    for imap in itertools.product(opts, repeat=r):
        dims = [d for d in imap if d is not None]
        if len(dims) == len(set(dims)):
            out.append(imap)
    return tuple(out)


def iterator_bindings(s: Walk, b: BlockBuild, i: int) -> tuple[Binding, ...]:
    """Every way to bind iterator ``i`` given the sizes chosen so far (see :func:`binding_options`)."""
    key = (i, False, tuple(b.grid), b.forloop)
    got = b.bindings_memo.get(key)
    if got is None:
        got = b.bindings_memo[key] = binding_options(*_binding_args(s, b, i))
    return got  # type: ignore[return-value]


def iterator_binding_groups(s: Walk, b: BlockBuild, i: int) -> Groups:
    """:func:`iterator_bindings` grouped by the tile they give, in first-seen order."""
    key = (i, True, tuple(b.grid), b.forloop)
    got = b.bindings_memo.get(key)
    if got is None:
        got = b.bindings_memo[key] = binding_groups(*_binding_args(s, b, i))
    return got  # type: ignore[return-value]


def _binding_args(s: Walk, b: BlockBuild, i: int) -> tuple:  # type: ignore[type-arg]
    shape = s.state.shape[b.inputs[i]]
    hints = tuple(sorted({d for k, t in enumerate(b.inputs) if k != i for d in s.state.shape[t]}))
    splits = s.context.output_splits if b.last_kernel_op else None
    return (
        shape,
        b.r,
        tuple(b.grid),
        b.looped,
        b.forloop,
        s.spec.schedule,
        hints,
        splits,
        s.spec.canonical,
        s.spec.dims,
    )


@lru_cache(maxsize=1 << 16)
def binding_options(
    shape: Shape,
    r: int,
    grid: tuple[int | None, ...],
    looped: bool,
    forloop: int | None,
    mode: str,
    hints: tuple[int, ...],
    splits: frozenset[int] | None,
    canonical: bool = False,
    dims: DimStrategy | None = None,
) -> tuple[Binding, ...]:
    """Every binding of an input of ``shape`` on an ``r``-d grid whose sizes so far are ``grid`` (None: not
    chosen), a pure function of its arguments and therefore cached: the search asks the same question for
    every operator that reads the iterator first. ``splits``: for the last kernel operator, the block counts
    that divide a program output dim (its blocks tile the outputs). ``canonical``: grid dims are numbered in
    the order they are first split (see :func:`new_dims_canonical`). ``dims``: only the imaps and fmaps the
    strategy lists (each imap on its own; :func:`admitted` checks the iterators' imaps together)."""
    out: list[Binding] = []
    chosen_count = sum(1 for g in grid if g is not None)
    fmaps = dims.allowed_fmaps() if dims is not None else None
    for imap in imap_choices(len(shape), r):
        if dims is not None and not fits(dims, r, (imap,)):
            continue
        unknown = [g for g in range(r) if imap[g] is not None and grid[g] is None]
        if canonical and not new_dims_canonical(imap, unknown, chosen_count):
            continue
        if any(
            imap[g] is not None and grid[g] is not None and shape[imap[g]] % grid[g]  # type: ignore[index,operator]
            for g in range(r)
        ):
            continue
        choices = [size_candidates(shape[imap[g]], mode, hints) for g in unknown]  # type: ignore[index]
        if splits is not None:
            choices = [tuple(c for c in cs if c in splits) for cs in choices]
        for sizes in itertools.product(*choices):
            chosen = dict(zip(unknown, sizes, strict=True))
            tile = list(shape)
            for g, d in enumerate(imap):
                if d is not None:
                    tile[d] //= chosen.get(g) or grid[g]  # type: ignore[operator]
            new_grid = tuple(chosen.items())
            if fmaps is None or None in fmaps:
                out.append(Binding(imap, None, tuple(tile), new_grid, None))
            if not looped:
                continue
            for d in range(len(tile)):
                if tile[d] < 2 or (fmaps is not None and d not in fmaps):
                    continue
                if forloop is not None:
                    if tile[d] % forloop == 0:
                        out.append(Binding(imap, d, _split(tile, d, forloop), new_grid, None))
                    continue
                for f in loop_candidates(tile[d], mode):
                    out.append(Binding(imap, d, _split(tile, d, f), new_grid, f))
    return tuple(out)


def new_dims_canonical(imap: tuple[int | None, ...], new: list[int], chosen_count: int) -> bool:
    """Grid dims permute blocks, not results, so one numbering per µGraph is kept: grid dims are numbered in
    the order bindings first split them (bindings happen in a fixed order: operators are added in canonical
    rank, and each binds its unbound operands in operand order), and the dims one binding introduces in the
    order of the data dims they split. So the dims chosen so far are always ``0 .. chosen_count - 1`` and the
    new ones must be the next ones, mapped to increasing data dims."""
    if new != list(range(chosen_count, chosen_count + len(new))):
        return False
    dims = [imap[g] for g in new]
    return all(a < b for a, b in itertools.pairwise(dims))  # type: ignore[operator]


@lru_cache(maxsize=1 << 16)
def binding_groups(*args: object) -> Groups:
    """:func:`binding_options` grouped by tile, in first-seen order."""
    groups: dict[Shape, list[Binding]] = {}
    for bd in binding_options(*args):  # type: ignore[arg-type]
        groups.setdefault(bd.tile, []).append(bd)
    return tuple((tile, tuple(bds)) for tile, bds in groups.items())


def _split(tile: list[int], d: int, parts: int) -> Shape:
    out = list(tile)
    out[d] //= parts
    return tuple(out)


def apply_binding(s: Walk, b: BlockBuild, i: int, bd: Binding) -> None:
    """Bind iterator ``i`` as ``bd`` says (its maps, its tile, the sizes it chooses)."""
    for g, size in bd.new_grid:
        b.grid[g] = size
    if bd.new_forloop is not None:
        b.forloop = bd.new_forloop
    b.imap[i] = bd.imap
    b.fmap[i] = bd.fmap
    b.shape[i] = bd.tile
    # The grid sizes of the dims bd splits and the trip count (when it has an fmap) follow from bd and forloop.
    key = (i, bd, b.forloop if bd.fmap is not None else None)
    got = b.bound_tiles.get(key)
    if got is None:
        got = b.bound_tiles[key] = _tile_of(s, b, i, bd)
    b.val[i], b.ties[i], b.prov[i] = got
    b.fdep[i] = bd.fmap is not None
    b.smem += numel(bd.tile) * dtype_bytes(b.dtype[i])


def _tile_of(s: Walk, b: BlockBuild, i: int, bd: Binding) -> tuple[ExprValue, Ties | None, Provenance]:
    """Iterator ``i``'s tile under binding ``bd`` (already applied to the grid and loop): its expression, index
    ties and provenance."""
    value = s.state.val[b.inputs[i]]
    for g, d in enumerate(bd.imap):
        if d is not None:
            value = EXPR.slice(value, d, 0, value.shape[d] // b.grid[g])  # type: ignore[operator]
    if bd.fmap is not None:
        value = EXPR.slice(value, bd.fmap, 0, bd.tile[bd.fmap])
    kernel_ties = s.state.ties[b.inputs[i]]
    ties = None
    if kernel_ties is not None:
        ties = tile_ties(kernel_ties, bd.imap, bd.fmap, bd.tile, b.grid, b.forloop)  # type: ignore[arg-type]
    return value, ties, of_iterator(i, len(bd.tile))


def undo_binding(b: BlockBuild, i: int, bd: Binding) -> None:
    """Undo :func:`apply_binding`."""
    b.smem -= numel(bd.tile) * dtype_bytes(b.dtype[i])
    for g, _ in bd.new_grid:
        b.grid[g] = None
    if bd.new_forloop is not None:
        b.forloop = None
    b.imap[i] = None
    b.fmap[i] = None
    b.shape[i] = None
    b.val[i] = None
    b.ties[i] = None
    b.fdep[i] = False
    b.prov[i] = None


def split_origins(ctx: SearchContext, b: BlockBuild) -> frozenset[tuple[int, int]]:
    """The (iterator, input dim) pairs a grid dim splits, memoised per process on the imaps."""
    key = tuple(b.imap)
    got = ctx.split_memo.get(key)
    if got is None:
        got = ctx.split_memo[key] = frozenset(
            (i, d) for i, imap in enumerate(b.imap) if imap is not None for d in imap if d is not None
        )
    return got


def admitted_groups(s: Walk, b: BlockBuild, i: int, groups: Groups) -> tuple[tuple[Binding, ...], ...]:
    """Per group, the bindings of iterator ``i`` that the dim strategy admits with the other iterators' imaps
    (see :func:`admitted`), memoised per process."""
    if s.spec.dims is None:
        return tuple(bds for _, bds in groups)
    dims = s.spec.dims
    others = _other_placements(dims, b, i)
    key = (id(groups), others)
    got = s.context.admit_memo.get(key)
    if got is not None and got[0] is groups:
        return got[1]  # type: ignore[return-value]
    out = tuple(
        tuple(bd for bd, ok in zip(bds, _admits(dims, b.r, others, bds), strict=True) if ok)
        for _, bds in groups
    )
    remember(s.context.admit_memo, key, (groups, out))
    return out


def admitted(s: Walk, b: BlockBuild, i: int, bindings: tuple[Binding, ...]) -> tuple[bool, ...]:
    """For each binding of iterator ``i``: whether some placement of the grid dims makes its imap and the other
    bound iterators' imaps listed ones (always, without a dim strategy)."""
    dims = s.spec.dims
    if dims is None:
        return (True,) * len(bindings)
    return _admits(dims, b.r, _other_placements(dims, b, i), bindings)


def _admits(dims: DimStrategy, r: int, others: int, bindings: tuple[Binding, ...]) -> tuple[bool, ...]:
    """Whether each binding's imap shares a placement with ``others`` (see :func:`_other_placements`)."""
    return tuple(bool(imap_placements(dims, r, bd.imap) & others) for bd in bindings)


def _other_placements(dims: DimStrategy, b: BlockBuild, i: int) -> int:
    """The placements under which every bound iterator but ``i`` has a listed imap (bits; see
    :func:`gensorage.exhaustive.dim_strategy.imap_placements`)."""
    out = -1
    for k, m in enumerate(b.imap):
        if k != i and m is not None:
            out &= imap_placements(dims, b.r, m)
    return out


__all__ = [
    "Binding",
    "Groups",
    "admitted",
    "admitted_groups",
    "apply_binding",
    "binding_groups",
    "binding_options",
    "imap_choices",
    "iterator_binding_groups",
    "iterator_bindings",
    "new_dims_canonical",
    "split_origins",
    "undo_binding",
]

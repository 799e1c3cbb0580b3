"""Index ties: which input axes each index of a tensor runs over, and which axes each reduction sums together.

Abstract expressions forget dimensions: ``sum(k, x)`` says how many terms a reduction adds, not over which index.
So ``mul(Q, sum(8, K))`` (K summed over its head dim alone, then multiplied by Q) is the class of
``sum(8, mul(Q, K))`` (the dot products of Q and K), and a two-kernel attention search spent about half its time
completing first kernels like it, or ``sum(16, V)``, that no correct µGraph contains.

The tie-aware abstraction labels every index. An *atom* is one axis of one input tensor (axes of size 1 have
none); an atom read inside a non-linear function (``exp``, ``sqrt``, an activation) is a different atom from the
same axis read outside one, since no law moves a sum across such a function. A dim is a sequence of *factors*,
major to minor, each an index of some size running over a set of atoms: an input's axis is one factor carrying
itself; an elementwise operator ties the factors of the dims it lines up (after splitting them to a common
refinement; a broadcast dim ties nothing); a matmul ties its batch dims and its two contracted dims; a reshape
regroups the factors (splitting one where a new dim ends inside it); ``repeat`` appends a copy factor with no
atoms. A block graph's grid dim and for-loop are indices too: an ``imap`` or ``fmap`` takes the major factors of
the dim it partitions (a tile keeps the rest), a sum accumulator reduces the loop index, and an ``omap`` puts the
grid index in front of the dim it lays blocks along. Every reduction records the *class* of the index it sums:
the atoms of all its factors.

Pieces and links. A factor carries each atom with a *stride*: the size of the part of the axis below that
piece (an input's axis is one piece at stride 1; splitting a piece of ``n`` into ``a`` major and ``n/a`` minor
puts the major at ``n/a`` times its stride). Neighbouring factors are one index only when they are consecutive
pieces (the major's strides are the minor's times the minor's size). The program's own ties between pieces are
its *links* (:class:`Links`): a µGraph operator that ties two pieces the program never ties (at that ratio of
strides) is marked not ``aligned`` and pruned, since the terms it makes carry an index constraint no term of the
program does, and the laws below keep every such constraint. A *class* is the set of the atom sets of the summed
index's factors, strides dropped (a sum of ``x_i·y_j`` over both indices is not a sum of ``x_i·y_i``), plus
COPIES for a copy factor: ``m`` identical terms sum to ``m`` times one, and no law of ``A_eq`` takes the ``m``
out again.

Why classes are an invariant. The laws of real arithmetic behind ``A_eq`` keep a term's set of classes: sums
commute; a reduction split into partial reductions (over a split dim, tiles, a loop, blocks) sums the same atoms
in each part; and ``mul(x, sum_i(y)) = sum_i(mul(x, y))`` holds only when ``x`` does not carry ``i``, so the
class of ``i`` is the same on both sides. Two laws change classes, and the abstraction leaves them out: a sum of
an ``add`` equals the ``add`` of two sums (and ``concat`` likewise), so the rule is off when the operators
include ``add``, ``sub`` or ``concat``; and one reduction over a dim merged from two indices equals two
reductions, so a µGraph that merges two of the program's reductions into one operator (or splits one the program
makes over a merged dim) is not equal to the program in this abstraction (docs/search.md states the coverage).
A tensor whose factors cannot be lined up (dims of sizes ``2·3`` against ``3·2``) is *unknown*: never pruned,
and neither is anything computed from it; a program with an unknown output turns the rule off.

The pruning rule built on classes is :mod:`gensorage.exhaustive.rules.ties`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from gensorage.arith import AccumKind, Activation
from gensorage.errors import ProgramError
from gensorage.opset import broadcast_shapes, transposed

Atoms = frozenset[int]  # atom parts: ``input * AXES + axis`` (plus INSIDE) + ``stride * STRIDE``; see below
AXES = 64
INSIDE = 1 << 20
STRIDE = 1 << 22
NONE: Atoms = frozenset()
Class = frozenset[
    Atoms
]  # a reduction's class: the atoms of each factor of the index it sums (strides dropped)
#: The mark of a reduction over copies (a sum of identical terms: ``m`` copies sum to ``m`` times one).
COPIES: Atoms = frozenset({-1})
Factor = tuple[int, Atoms]  # (size > 1, the atoms its index runs over)
Dim = tuple[Factor, ...]  # major to minor; a dim of size 1 has none


@dataclass(frozen=True, slots=True)
class Ties:
    """A tensor's index ties (see the module docstring); ``known`` False: unknown, never pruned."""

    shape: tuple[int, ...]
    dims: tuple[Dim, ...]
    bound: frozenset[Class] = frozenset()
    loop: Dim = ()  # the for-loop index, in a block graph (() if the tensor does not vary with it)
    grid: tuple[Dim, ...] = ()  # per grid dim, its block index (() where the tensor does not vary with it)
    known: bool = True
    aligned: bool = True  # False: some operator tied pieces of atoms the program never ties (see Links)


def input_ties(index: int, shape: tuple[int, ...]) -> Ties:
    """The ties of program input ``index``."""
    return Ties(
        shape,
        tuple(((n, frozenset({index * AXES + a + STRIDE})),) if n > 1 else () for a, n in enumerate(shape)),
    )


def base(part: int) -> int:
    """The atom of an atom part (its stride dropped)."""
    return part % STRIDE


def _scaled(atoms: Atoms, k: int) -> Atoms:
    """The parts of the major piece of a factor whose minor piece has ``k`` elements: strides times ``k`` (a
    part without a stride, as tests write atoms, keeps none)."""
    if k == 1:
        return atoms
    return frozenset(x + (x // STRIDE) * (k - 1) * STRIDE for x in atoms)


def _unknown(shape: tuple[int, ...]) -> Ties:
    return Ties(shape, tuple(() for _ in shape), known=False)


def _joins(major: Factor, minor: Factor) -> bool:
    """Whether ``major`` and ``minor`` are the major and minor pieces of one index (copies: of one copy)."""
    return major[1] == _scaled(minor[1], minor[0])


def norm(d: Dim) -> Dim:
    """``d`` with neighbouring factors that are the major and minor pieces of one index made one: one form per
    index, so equal tensors have equal ties (the subtree memo's key compares them)."""
    for i in range(1, len(d)):
        if _joins(d[i - 1], d[i]):
            out = [d[0]]
            for f in d[1:]:
                if _joins(out[-1], f):
                    out[-1] = (out[-1][0] * f[0], f[1])
                else:
                    out.append(f)
            return tuple(out)
    return d


def tie(a: Dim, b: Dim) -> Dim | None:
    """Two indices of one size made one: the common refinement of their factors, each part carrying the atoms
    of both; None when the factors do not line up. An empty dim (size 1, or a tensor that does not vary with a
    grid or loop index) ties nothing."""
    if not a:
        return b
    if not b or a == b:
        return a
    out: list[Factor] = []
    i = j = 0
    x, xa = a[0]
    y, ya = b[0]
    while True:
        if x == y:
            out.append((x, xa | ya))
            i, j = i + 1, j + 1
            if i == len(a) or j == len(b):
                return norm(tuple(out)) if i == len(a) and j == len(b) else None
            x, xa = a[i]
            y, ya = b[j]
        elif x > y:
            if x % y:
                return None
            x //= y
            out.append((y, _scaled(xa, x) | ya))
            j += 1
            if j == len(b):
                return None
            y, ya = b[j]
        else:
            if y % x:
                return None
            y //= x
            out.append((x, xa | _scaled(ya, y)))
            i += 1
            if i == len(a):
                return None
            x, xa = a[i]


def take_major(d: Dim, size: int) -> tuple[Dim, Dim] | None:
    """``d`` split into its major part of ``size`` and the rest; None where a factor would split unevenly."""
    major: list[Factor] = []
    rest = list(d)
    while size > 1:
        if not rest:
            return None
        n, atoms = rest[0]
        if n <= size:
            if size % n:
                return None
            major.append((n, atoms))
            size //= n
            rest.pop(0)
        else:
            if n % size:
                return None
            major.append((size, _scaled(atoms, n // size)))
            rest[0] = (n // size, atoms)
            size = 1
    return norm(tuple(major)), tuple(rest)


def _bind(bound: frozenset[Class], d: Dim, copies: bool = True) -> frozenset[Class]:
    """``bound`` plus the class of a reduction over index ``d``: the atoms of each of its factors, and COPIES
    for a copy factor when the reduction is a sum (a maximum over copies is any one of them: no class; an index
    of size 1 has none)."""
    cls = frozenset(
        frozenset(base(x) for x in atoms) if atoms else COPIES for _, atoms in d if atoms or copies
    )
    return bound | {cls} if cls and cls not in bound else bound


def _marked(d: Dim) -> Dim:
    return tuple((n, frozenset(x | INSIDE for x in atoms)) for n, atoms in d)


def _inside(a: Ties) -> Ties:
    """The result of a non-linear function: its atoms are now inside one."""
    if not a.known:
        return a
    return Ties(
        a.shape,
        tuple(_marked(d) for d in a.dims),
        a.bound,
        _marked(a.loop),
        tuple(_marked(g) for g in a.grid),
        aligned=a.aligned,
    )


def _join_grid(a: tuple[Dim, ...], b: tuple[Dim, ...]) -> tuple[Dim, ...] | None:
    if not a:
        return b
    if not b:
        return a
    out = []
    for x, y in zip(a, b, strict=True):
        t = tie(x, y)
        if t is None:
            return None
        out.append(t)
    return tuple(out)


class TieArith:
    """The arithmetic of :class:`Ties` (an :class:`gensorage.arith.Arith`, so programs evaluate with it).

    ``links``: the program's ties; a result that ties pieces of atoms they do not is marked not ``aligned``.
    ``record``: a list every tie an operator makes is appended to (how :class:`Links` learns a program's)."""

    name = "ties"

    def __init__(self, links: Links | None = None, record: list[Atoms] | None = None) -> None:
        self.links = links
        self.record = record

    def _aligned(self, *dims: Dim) -> bool:
        links, record = self.links, self.record
        if links is None and record is None:
            return True
        for d in dims:
            for _, atoms in d:
                if len(atoms) > 1:
                    if record is not None:
                        record.append(atoms)
                    if links is not None and not links.admits(atoms):
                        return False
        return True

    def shape(self, a: Ties) -> tuple[int, ...]:
        return a.shape

    # ------------------------------------------------------------------ elementwise
    def add(self, a: Ties, b: Ties) -> Ties:
        return self._binary(a, b)

    def sub(self, a: Ties, b: Ties) -> Ties:
        return self._binary(a, b)

    def mul(self, a: Ties, b: Ties) -> Ties:
        return self._binary(a, b)

    def div(self, a: Ties, b: Ties) -> Ties:
        return self._binary(a, b)

    def exp(self, a: Ties) -> Ties:
        return _inside(a)

    def sqrt(self, a: Ties) -> Ties:
        return _inside(a)

    def scale(self, a: Ties, factor: float) -> Ties:
        return a

    def add_scalar(self, a: Ties, value: float) -> Ties:
        return a

    def activation(self, kind: Activation, a: Ties) -> Ties:
        return _inside(a)

    def clamp(self, a: Ties, lo: float | None, hi: float | None) -> Ties:
        return _inside(a)

    def _binary(self, a: Ties, b: Ties) -> Ties:
        out = broadcast_shapes(a.shape, b.shape)
        if out is None:
            raise ProgramError(f"shapes {list(a.shape)} and {list(b.shape)} do not broadcast")
        if not (a.known and b.known):
            return _unknown(out)
        dims = _lined_up(out, a, b)
        grid = _join_grid(a.grid, b.grid)
        loop = tie(a.loop, b.loop)
        if dims is None or grid is None or loop is None:
            return _unknown(out)
        aligned = a.aligned and b.aligned and self._aligned(*dims, loop, *grid)
        return Ties(out, dims, a.bound | b.bound, loop, grid, aligned=aligned)

    # ------------------------------------------------------------------ reductions
    def matmul(self, a: Ties, b: Ties) -> Ties:
        batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
        if batch is None or a.shape[-1] != b.shape[-2]:
            raise ProgramError(f"matmul: shapes {list(a.shape)} and {list(b.shape)} do not multiply")
        out = batch + (a.shape[-2], b.shape[-1])
        if not (a.known and b.known):
            return _unknown(out)
        lined = _lined_up(batch, Ties(a.shape[:-2], a.dims[:-2]), Ties(b.shape[:-2], b.dims[:-2]))
        inner = tie(a.dims[-1], b.dims[-2])
        grid = _join_grid(a.grid, b.grid)
        loop = tie(a.loop, b.loop)
        if lined is None or inner is None or grid is None or loop is None:
            return _unknown(out)
        aligned = a.aligned and b.aligned and self._aligned(*lined, inner, loop, *grid)
        return Ties(
            out,
            (*lined, a.dims[-2], b.dims[-1]),
            _bind(a.bound | b.bound, inner),
            loop,
            grid,
            aligned=aligned,
        )

    def reduce_sum(self, a: Ties, axis: int, keepdims: bool) -> Ties:
        return self._reduce(a, axis, keepdims)

    def reduce_max(self, a: Ties, axis: int, keepdims: bool) -> Ties:
        return self._reduce(a, axis, keepdims, copies=False)

    def _reduce(self, a: Ties, axis: int, keepdims: bool, copies: bool = True) -> Ties:
        axis %= len(a.shape)
        if keepdims:
            shape, dims = _with(a.shape, axis, 1), _with(a.dims, axis, ())
        else:
            shape, dims = a.shape[:axis] + a.shape[axis + 1 :], a.dims[:axis] + a.dims[axis + 1 :]
        if not a.known:
            return _unknown(shape)
        return Ties(shape, dims, _bind(a.bound, a.dims[axis], copies), a.loop, a.grid, aligned=a.aligned)

    def accumulate(self, acc: Ties | None, x: Ties, kind: AccumKind) -> Ties:
        # The generic block evaluator slices tiles without saying by which index: unknown there; the search
        # uses :func:`loop_sum` / :func:`loop_concat`, which know the loop index.
        return _unknown(x.shape)

    # ------------------------------------------------------------------ data movement
    def reshape(self, a: Ties, shape: tuple[int, ...]) -> Ties:
        shape = tuple(shape)
        if not a.known:
            return _unknown(shape)
        rest: Dim = tuple(f for d in a.dims for f in d)
        dims = []
        for n in shape:
            got = take_major(rest, n)
            if got is None:
                return _unknown(shape)
            dim, rest = got
            dims.append(dim)
        return Ties(shape, tuple(dims), a.bound, a.loop, a.grid, aligned=a.aligned)

    def repeat(self, a: Ties, axis: int, times: int) -> Ties:
        axis %= len(a.shape)
        shape = _with(a.shape, axis, a.shape[axis] * times)
        if not a.known:
            return _unknown(shape)
        copies: Dim = ((times, NONE),) if times > 1 else ()
        return Ties(
            shape,
            _with(a.dims, axis, norm(a.dims[axis] + copies)),
            a.bound,
            a.loop,
            a.grid,
            aligned=a.aligned,
        )

    def transpose(self, a: Ties, axis0: int, axis1: int) -> Ties:
        nd = len(a.shape)
        axis0, axis1 = axis0 % nd, axis1 % nd
        shape = transposed(a.shape, axis0, axis1)
        if not a.known:
            return _unknown(shape)
        return Ties(shape, transposed(a.dims, axis0, axis1), a.bound, a.loop, a.grid, aligned=a.aligned)

    def concat(self, parts: Sequence[Ties], axis: int) -> Ties:
        axis %= len(parts[0].shape)
        return _unknown(_with(parts[0].shape, axis, sum(p.shape[axis] for p in parts)))

    def slice(self, a: Ties, axis: int, start: int, stop: int) -> Ties:
        axis %= len(a.shape)
        return _unknown(
            _with(a.shape, axis, stop - start)
        )  # which index a slice keeps is the caller's to say


def _with(t: tuple, axis: int, x: object) -> tuple:  # type: ignore[type-arg]
    return t[:axis] + (x,) + t[axis + 1 :]


def _lined_up(out: tuple[int, ...], a: Ties, b: Ties) -> tuple[Dim, ...] | None:
    """The dims of a broadcast of ``a`` and ``b`` to ``out``: each ties the operands' dims that are not
    broadcast (a dim of size 1 against a larger one ties nothing); None where factors do not line up."""
    n = len(out)
    dims = []
    for j in range(n):
        got: Dim | None = ()
        for v in (a, b):
            k = j - (n - len(v.shape))
            if k >= 0 and v.shape[k] == out[j] and got is not None:
                got = tie(got, v.dims[k])
        if got is None:
            return None
        dims.append(got)
    return tuple(dims)


# ------------------------------------------------------------------ block graphs


def tile_ties(
    t: Ties,
    imap: Sequence[int | None],
    fmap: int | None,
    tile: tuple[int, ...],
    grid: Sequence[int],
    forloop: int,
) -> Ties:
    """An input iterator's tile of kernel tensor ``t``: grid dim ``g`` (of ``grid[g]`` blocks) takes the major
    part of dim ``imap[g]``, then the for-loop (``forloop`` iterations) the major part of what is left of dim
    ``fmap``; the tile keeps the rest. Two grid dims on one dim: unknown."""
    if not t.known:
        return _unknown(tile)
    parted = [d for d in imap if d is not None]
    if len(set(parted)) < len(parted):
        return _unknown(tile)
    dims = list(t.dims)
    grid_dims: list[Dim] = []
    for g, d in enumerate(imap):
        if d is None:
            grid_dims.append(())
            continue
        got = take_major(dims[d], grid[g])
        if got is None:
            return _unknown(tile)
        grid_dims.append(got[0])
        dims[d] = got[1]
    loop: Dim = ()
    if fmap is not None:
        got = take_major(dims[fmap], forloop)
        if got is None:
            return _unknown(tile)
        loop, dims[fmap] = got
    return Ties(tile, tuple(dims), t.bound, loop, tuple(grid_dims), aligned=t.aligned)


def loop_sum(x: Ties) -> Ties:
    """A for-loop sum accumulator of ``x``: it reduces the loop index."""
    if not x.known:
        return x
    return Ties(x.shape, x.dims, _bind(x.bound, x.loop), (), x.grid, aligned=x.aligned)


def loop_concat(x: Ties, iterations: int, axis: int) -> Ties:
    """A for-loop accumulator that lays the iterations' tiles along ``axis`` (the loop index in front)."""
    shape = _with(x.shape, axis, x.shape[axis] * iterations)
    if not x.known:
        return _unknown(shape)
    front: Dim = x.loop if x.loop else ((iterations, NONE),) if iterations > 1 else ()
    return Ties(
        shape, _with(x.dims, axis, norm(front + x.dims[axis])), x.bound, (), x.grid, aligned=x.aligned
    )


def saved_ties(x: Ties, omap: Sequence[int], grid: Sequence[int], live: Sequence[int] | None = None) -> Ties:
    """The kernel tensor an output saver writes: grid dim ``g`` lays the blocks' tiles along dim ``omap[g]``
    (the block index in front). Two grid dims on one dim: unknown. ``live``: the block graph's grid dims as
    numbered while it was built (``x.grid``'s numbering), when some there did not come to exist."""
    shape, dims = list(x.shape), list(x.dims)
    for g, d in enumerate(omap):
        shape[d] *= grid[g]
    if not x.known or len(set(omap)) < len(omap):
        return _unknown(tuple(shape))
    for g, d in enumerate(omap):
        built = g if live is None else live[g]
        index = x.grid[built] if x.grid and x.grid[built] else ((grid[g], NONE),) if grid[g] > 1 else ()
        dims[d] = norm(index + dims[d])
    return Ties(tuple(shape), tuple(dims), x.bound, aligned=x.aligned)


def holds_copies(t: Ties) -> bool:
    """Whether a known tensor has a copy factor (copies no operator has lined up with an input axis)."""
    return t.known and any(not atoms for d in t.dims for _, atoms in d)


# ------------------------------------------------------------------ the program's links


class Links:
    """Which pieces of atoms a program ties: atoms ``a`` and ``b`` are linked with ratio ``r`` when some tie of
    the program puts the piece of ``a`` at stride ``s`` and the piece of ``b`` at stride ``r·s`` on one index
    (closed under composition: a union-find whose weights are stride ratios). A component where the program
    itself ties two atoms at two ratios (a reshape can) is *free*: nothing in it is checked."""

    def __init__(self, ties: Iterable[Atoms] = ()) -> None:
        self.parent: dict[int, int] = {}
        self.weight: dict[
            int, Fraction
        ] = {}  # stride of an atom's piece / stride of its parent's, on one tie
        self.free: set[int] = set()
        self._memo: dict[Atoms, bool] = {}
        for atoms in ties:
            self.add(atoms)

    def _find(self, a: int) -> tuple[int, Fraction]:
        w = Fraction(1)
        while a in self.parent:
            w *= self.weight[a]
            a = self.parent[a]
        return a, w

    def add(self, atoms: Atoms) -> None:
        """Record one tie of the program (an index's atom parts)."""
        parts = [(base(x), x // STRIDE) for x in atoms if x >= STRIDE]
        for b, t in parts[1:]:
            a, s = parts[0]
            ra, wa = self._find(a)
            rb, wb = self._find(b)
            if ra == rb:
                if wb * s != wa * t:
                    self.free.add(ra)
                continue
            self.parent[rb] = ra
            self.weight[rb] = Fraction(t) * wa / (s * wb)
            if rb in self.free:
                self.free.add(ra)
        self._memo.clear()

    def admits(self, atoms: Atoms) -> bool:
        """Whether one index may carry ``atoms``: every two of its parts are linked at their strides' ratio."""
        got = self._memo.get(atoms)
        if got is None:
            got = self._memo[atoms] = self._admits(atoms)
        return got

    def _admits(self, atoms: Atoms) -> bool:
        parts = [(base(x), x // STRIDE) for x in atoms if x >= STRIDE]
        if len(parts) < 2:
            return True
        a, s = parts[0]
        ra, wa = self._find(a)
        for b, t in parts[1:]:
            rb, wb = self._find(b)
            if rb != ra:
                return False
            if ra not in self.free and wb * s != wa * t:
                return False
        return True


TIES = TieArith()

__all__ = [
    "AXES",
    "COPIES",
    "INSIDE",
    "STRIDE",
    "TIES",
    "Atoms",
    "Class",
    "Dim",
    "Links",
    "TieArith",
    "Ties",
    "base",
    "holds_copies",
    "input_ties",
    "loop_concat",
    "loop_sum",
    "norm",
    "saved_ties",
    "take_major",
    "tie",
    "tile_ties",
]

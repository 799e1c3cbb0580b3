"""Automatic search shapes: a small instantiation of any program, derived from its own shapes.

The exhaustive search evaluates µGraphs literally, so it runs at small *search shapes* and what it finds is
re-instantiated at the requested ones (:mod:`.reshape_structure`). Bundled programs name theirs in a preset
(``configs/presets/<name>.toml``); for any other program — captured from torch or built by hand — they are
derived here, the way those presets were chosen by hand:

* every size is mapped *by value*, so dims that are equal stay equal;
* a size ``2^e · m`` (``m`` odd) keeps its odd part ``m`` and gets a smaller power of two ``2^g(e)``; ``g`` is
  strictly increasing over the exponents the program uses, so distinct sizes stay distinct (re-instantiation
  maps sizes by value and refuses an ambiguous one) and a size that divides another still divides it;
* ``g(e)`` is ``ceil(e / 3)``, at least 1 for ``e >= 1`` (a reduction keeps at least 2 elements) and raised
  where needed to stay above the previous exponent's: sizes 8 and 4096 become 2 and 16
  (``configs/presets/mlp.toml``), sizes 16, 1024 and 4096 become 4, 16 and 32 (``rmsnorm.toml``);
* an odd size (a prime such as 71 heads, or 1) has no shrink that keeps what divides it: it keeps its real size;
* a dim a ``slice`` cuts keeps its real size, since slice bounds are part of the program's structure; when the
  rule's sizes then no longer fit the program (a reshape's ``heads · head_dim`` with head_dim kept), the
  exponents are solved for instead (:mod:`.exponent_map`): LLaMA-3-8B's 4096, 1024, 14336 and 32 heads become
  1024, 512, 3584 and 8 around its pinned head_dim 128.

The small program is rebuilt node by node (attributes mapped as re-instantiation maps them; scale factors are
kept, so the search's factors are the real ones) and must have the program's structure key; when it does not
(a reshape merging dims whose shrunk sizes no longer multiply up, say) the program's own shapes are searched,
and the reason is stated.
"""

from __future__ import annotations

from dataclasses import dataclass

from gensorage.errors import GensorageError
from gensorage.opset import Op
from gensorage.program import Program, Tensor
from gensorage.superopt.exponent_map import product_relations, solve_exponents, two_adic
from gensorage.superopt.size_map import SizeMap, map_attrs

#: Divisor of a size's power-of-two exponent (4096 = 2^12 → 2^4 = 16).
EXPONENT_DIVISOR = 3


@dataclass(frozen=True, slots=True)
class SearchShapes:
    """The program to search (small, or the program itself) and how its sizes were chosen."""

    program: Program
    sizes: dict[int, int]  # real size -> search size, for every size of the program
    kept: tuple[int, ...]  # real sizes (> 1) that keep their size, and why is in ``note``
    note: str

    @property
    def shrunk(self) -> bool:
        return any(a != b for a, b in self.sizes.items())


def derive_search_shapes(p: Program) -> SearchShapes:
    """A small instantiation of ``p`` with its structure (see the module docstring), or ``p`` itself."""
    values = program_sizes(p)
    pinned = sliced_sizes(p)
    found = _instantiated(p, size_choice(values, pinned))
    if isinstance(found, str) and pinned:
        # the rule's sizes do not fit around the pinned ones: solve for exponents that keep the reshapes'
        # products (.exponent_map)
        solved = solve_exponents(values, pinned, product_relations(p), lambda s: _keeps_order(s, pinned))
        if solved is not None and not isinstance(again := _instantiated(p, solved), str):
            found = again
    if isinstance(found, str):
        kept = tuple(sorted(v for v in values if v > 1))
        note = (
            _kept_note(kept, pinned, found) if found == _NO_SHRINK else f"searched at its own shapes: {found}"
        )
        return SearchShapes(p, _identity(values), kept, note)
    small, sizes = found
    kept = tuple(sorted(v for v in values if v > 1 and sizes[v] == v))
    shown = ", ".join(f"{a}→{b}" for a, b in sorted(sizes.items()) if a != b)
    return SearchShapes(
        small, sizes, kept, f"search shapes derived from its own ({shown})" + _kept(kept, pinned)
    )


_NO_SHRINK = "no dim can shrink"


def _instantiated(p: Program, sizes: dict[int, int]) -> tuple[Program, dict[int, int]] | str:
    """``p`` at ``sizes`` with its structure key, or why not."""
    if all(a == b for a, b in sizes.items()):
        return _NO_SHRINK
    try:
        small = instantiate(p, sizes)
    except GensorageError as exc:
        return str(exc)
    if small.structure_key() != p.structure_key():
        return "the shrunk program has another structure"
    return small, sizes


def program_sizes(p: Program) -> set[int]:
    """Every dim size and size-valued attribute (sum group, repeat count, reshape target) of ``p``."""
    out: set[int] = set()
    for n in p.nodes:
        out.update(n.shape)
        for key, v in n.attrs:
            if key in ("group", "times"):
                out.add(int(v))
            elif key == "shape":
                out.update(int(d) for d in v)
    return out


def sliced_sizes(p: Program) -> set[int]:
    """Sizes of the dims a slice cuts (and the bounds it cuts at): they keep their real size."""
    out: set[int] = set()
    for n in p.nodes:
        if n.op is Op.SLICE:
            attrs = dict(n.attrs)
            out.add(p.nodes[n.inputs[0]].shape[int(attrs["dim"])])
            out.update(int(attrs[k]) for k in ("start", "stop") if int(attrs[k]) > 0)
    return out


def size_choice(values: set[int], pinned: set[int] | frozenset[int] = frozenset()) -> dict[int, int]:
    """The search size of each real size (see the module docstring); ``pinned`` sizes keep theirs."""
    exponents = sorted({two_adic(v) for v in values if v not in pinned})
    small: dict[int, int] = {0: 0}
    last = 0
    for e in exponents:
        if e == 0:
            continue
        g = max(last + 1, -(-e // EXPONENT_DIVISOR))
        small[e] = min(g, e)
        last = small[e]
    out: dict[int, int] = {}
    for v in values:
        e = two_adic(v)
        out[v] = v if v in pinned else (v >> e) << small[e]
    if not _keeps_order(out, pinned):
        return _identity(values)
    return out


def instantiate(p: Program, sizes: dict[int, int]) -> Program:
    """``p`` rebuilt with every size ``v`` replaced by ``sizes[v]`` (attributes mapped alike, factors kept).

    Raises
    ------
    GensorageError
        The sizes do not fit the program's ops (a :class:`~gensorage.errors.ProgramError` from the builder or a
        :class:`~gensorage.superopt.size_map.ReshapeFailed`).
    """
    smap = SizeMap()
    for a, b in sizes.items():
        smap.add_size(a, b)
        smap.add("group", a, b)
        smap.add("times", a, b)
    q = Program(name=p.name)
    new: dict[int, int] = {}
    tensors: dict[int, Tensor] = {}
    for i in p.canonical_order():
        n = p.nodes[i]
        if n.op is None:
            t = q.input(n.name, tuple(sizes[d] for d in n.shape), n.dtype)
        else:
            old_in = [p.nodes[j].shape for j in n.inputs]
            args = [tensors[new[j]] for j in n.inputs]
            attrs = map_attrs(n.op, n.attrs, old_in, [a.shape for a in args], smap, f"{p.name}: {n.name}")
            t = q.apply(n.op, args, dict(attrs), name=n.name)
        new[i] = t.id
        tensors[t.id] = t
    for out in p.outputs:
        q.output(tensors[new[out.id]])
    return q


def _keeps_order(sizes: dict[int, int], pinned: set[int] | frozenset[int]) -> bool:
    """Distinct sizes stay distinct and a size dividing another still divides it (pinned sizes may break
    either, since the others shrink around them)."""
    vals = sorted(sizes)
    if len(set(sizes.values())) != len(vals):
        return False
    return all(sizes[b] % sizes[a] == 0 for a in vals for b in vals if b % a == 0)


def _identity(values: set[int]) -> dict[int, int]:
    return {v: v for v in values}


def _kept(kept: tuple[int, ...], pinned: set[int]) -> str:
    if not kept:
        return ""
    return "; kept " + ", ".join(f"{v} ({_why_kept(v, pinned)})" for v in kept)


def _why_kept(v: int, pinned: set[int]) -> str:
    if v in pinned:
        return "a slice cuts it"
    if v % 2:
        return "odd: no shrink keeps what divides it"
    return "already as small as its place among the sizes allows"


def _kept_note(kept: tuple[int, ...], pinned: set[int], head: str) -> str:
    return f"searched at its own shapes: {head}" + _kept(kept, pinned)


__all__ = ["SearchShapes", "derive_search_shapes", "instantiate", "program_sizes", "size_choice"]

"""What each size and attribute of one instantiation of a program becomes in another (re-instantiation,
:mod:`.reshape_structure`): the two programs' nodes pair up by their canonical order, and every dim, size-valued
attribute and scale factor is mapped through that pairing; what maps ambiguously is not mapped."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gensorage import opset
from gensorage.errors import GensorageError
from gensorage.opset import Attrs, Op, Shape

if TYPE_CHECKING:
    from gensorage.program import Program


class ReshapeFailed(GensorageError):
    """The structure cannot be re-instantiated at the new shapes (the message says why)."""


# ============================================================================================ size mapping


@dataclass(slots=True)
class SizeMap:
    """What each size and scale factor of the old program becomes in the new one.

    ``sizes`` pairs every dim of every tensor and every size-valued attribute; ``by_attr`` pairs the values
    of one attribute kind only (``"times"``, ``"group"``, ``"factor"``), which stays unambiguous where the
    general table is not (a repeat count equal to some unrelated dim at the old shapes). A value seen mapping
    to two different new values is *ambiguous* and not mapped.
    """

    sizes: dict[int, int] = field(default_factory=dict)
    by_attr: dict[str, dict[object, object]] = field(default_factory=dict)
    ambiguous: dict[str, set[object]] = field(default_factory=dict)

    def add(self, kind: str, old: object, new: object) -> None:
        _add(self.by_attr.setdefault(kind, {}), self.ambiguous.setdefault(kind, set()), old, new)

    def add_size(self, old: int, new: int) -> None:
        _add(self.sizes, self.ambiguous.setdefault("size", set()), int(old), int(new))  # type: ignore[arg-type]

    def size(self, old: int, kind: str | None = None) -> int | None:
        """The new value of size ``old``, from the ``kind`` attribute's table first, then from all sizes."""
        if kind is not None and old in self.by_attr.get(kind, {}):
            return int(self.by_attr[kind][old])  # type: ignore[call-overload]
        return self.sizes.get(old)

    def factor(self, old: float) -> float | None:
        new = self.by_attr.get("factor", {}).get(old)
        return None if new is None else float(new)  # type: ignore[arg-type]

    @property
    def factors(self) -> dict[object, object]:
        return self.by_attr.get("factor", {})


def _add(table: dict[object, object], ambiguous: set[object], old: object, new: object) -> None:
    if old in ambiguous:
        return
    if old in table and table[old] != new:
        del table[old]
        ambiguous.add(old)
        return
    table[old] = new


def size_map(old: Program, new: Program) -> SizeMap:
    """Pair the nodes of two instantiations of one program and record how every size and factor changes.

    Raises
    ------
    ReshapeFailed
        The programs do not share a structure key.
    """
    if old.structure_key() != new.structure_key():
        raise ReshapeFailed(
            f"program '{new.name}' does not have the structure of the stored program '{old.name}'"
        )
    smap = SizeMap()
    for i, j in zip(old.canonical_order(), new.canonical_order(), strict=True):
        a, b = old.nodes[i], new.nodes[j]
        for x, y in zip(a.shape, b.shape, strict=True):
            smap.add_size(x, y)
        if a.op is None:
            continue
        # Equal structure keys: b.op is a.op, with attributes of the same names.
        for (key, va), (_, vb) in zip(
            _padded(a.op, a.attrs, old, a.inputs), _padded(a.op, b.attrs, new, b.inputs), strict=True
        ):
            if key == "factor":
                smap.add("factor", float(va), float(vb))
            elif key == "shape":
                for x, y in zip(va, vb, strict=True):
                    smap.add_size(x, y)
            elif key in ("group", "times"):
                smap.add(key, va, vb)
                smap.add_size(va, vb)
    return smap


def _padded(op: Op, attrs: Attrs, p: Program, inputs: Sequence[int]) -> list[tuple[str, Any]]:
    """Attributes with a sum's implicit group made explicit, so two instantiations pair attribute by attribute.

    (A program drops ``group`` when it equals the reduced dim's size, so one instantiation may have it and the
    other not.)
    """
    items = dict(attrs)
    if op is Op.SUM and "group" not in items:
        items["group"] = p.nodes[inputs[0]].shape[int(items["dim"])]
    return sorted(items.items())


# ============================================================================================ attributes


def map_attrs(
    op: Op, attrs: Attrs, old_in: Sequence[Shape], new_in: Sequence[Shape], smap: SizeMap, where: str
) -> Attrs:
    """``attrs`` of ``op`` at the new shapes, given the op's input shapes before and after."""
    items = dict(attrs)
    if op is Op.SCALE:
        items["factor"] = _map_factor(float(items["factor"]), smap, where)
    elif op is Op.SUM and "group" in items:
        group = _map_group(
            int(items["group"]), old_in[0][int(items["dim"])], new_in[0][int(items["dim"])], smap, where
        )
        if group is None:
            del items["group"]
        else:
            items["group"] = group
    elif op is Op.REPEAT:
        items["times"] = _map_size(int(items["times"]), smap, where, "repeat count", "times")
    elif op is Op.RESHAPE:
        items["shape"] = reshape_target(old_in[0], tuple(items["shape"]), new_in[0], smap, where)
    return opset.freeze_attrs(items)


def _map_factor(old: float, smap: SizeMap, where: str) -> float:
    new = smap.factor(old)
    if new is not None:
        return new
    if old in smap.ambiguous.get("factor", set()):
        raise ReshapeFailed(f"{where}: scale factor {old:g} becomes different factors in the new program")
    if all(a == b for a, b in smap.factors.items()):
        return old  # no factor of the program changed, so a factor the search introduced cannot have either
    raise ReshapeFailed(f"{where}: scale factor {old:g} has no counterpart in the program")


def _map_size(old: int, smap: SizeMap, where: str, what: str, kind: str | None = None) -> int:
    new = smap.size(old, kind)
    if new is None:
        raise ReshapeFailed(f"{where}: cannot tell what {what} {old} becomes at the new shapes")
    return new


def _map_group(group: int, old_size: int, new_size: int, smap: SizeMap, where: str) -> int | None:
    """The new group of a grouped sum (None: a full reduction, stored without a group)."""
    if group == old_size:
        return None
    tries = []
    g = smap.size(group, "group")
    if g is not None:
        tries.append(g)
    groups_out = smap.size(old_size // group)
    if groups_out is not None and groups_out > 0 and new_size % groups_out == 0:
        tries.append(new_size // groups_out)
    tries.append(group)
    for g in tries:
        if 0 < g <= new_size and new_size % g == 0:
            return None if g == new_size else g
    raise ReshapeFailed(f"{where}: no sum group for a dim of size {new_size} corresponds to group {group}")


def reshape_target(old_in: Shape, old_out: Shape, new_in: Shape, smap: SizeMap, where: str) -> Shape:
    """The target of a reshape whose input went from ``old_in`` to ``new_in`` (same rank).

    The old reshape is split into minimal groups of input dims and output dims with equal products (unit dims
    left out). A group whose output is one dim gets the product of the new input dims; a group that splits
    into several output dims maps all but one of them through ``smap`` and gives the last what remains. Old
    unit output dims stay 1.
    """
    if len(old_in) != len(new_in):
        raise ReshapeFailed(f"{where}: reshape input changed rank ({len(old_in)} -> {len(new_in)})")
    groups = opset.reshape_groups(old_in, old_out)
    if groups is None:
        raise ReshapeFailed(f"{where}: cannot align reshape {list(old_in)} -> {list(old_out)}")
    grouped_in = {i for ins, _ in groups for i in ins}
    stray = [i for i, d in enumerate(new_in) if i not in grouped_in and d != 1]
    if stray:
        raise ReshapeFailed(
            f"{where}: input dim {stray[0]} was 1 and is now {new_in[stray[0]]}: the reshape "
            f"{list(old_in)} -> {list(old_out)} does not say where it goes"
        )
    out = [1] * len(old_out)
    for ins, outs in groups:
        total = math.prod(new_in[i] for i in ins)
        for j, v in zip(outs, _split(total, [old_out[j] for j in outs], smap), strict=True):
            out[j] = v
    if math.prod(out) != math.prod(new_in):
        raise ReshapeFailed(f"{where}: derived reshape {list(new_in)} -> {out} changes the element count")
    return tuple(out)


def _split(total: int, old_parts: list[int], smap: SizeMap) -> list[int]:
    """Split ``total`` into ``len(old_parts)`` factors, mapping all but one part through ``smap``."""
    if len(old_parts) == 1:
        return [total]
    mapped = [smap.size(v) for v in old_parts]
    for free in reversed(range(len(old_parts))):
        others = [m for k, m in enumerate(mapped) if k != free]
        if any(m is None or m < 1 for m in others):
            continue
        rest = math.prod(others)  # type: ignore[arg-type]
        if total % rest == 0:
            return [total // rest if k == free else m for k, m in enumerate(mapped)]  # type: ignore[misc]
    raise ReshapeFailed(f"cannot split a dim of size {total} the way {old_parts} was split")


__all__ = ["ReshapeFailed", "SizeMap", "map_attrs", "reshape_target", "size_map"]

"""Building blocks for emitting TVMScript text: affine index expressions and an indenting writer.

Kernels are emitted as TVMScript source and parsed with ``tvm.script.from_source``. Index arithmetic is kept
as :class:`Ix` — an integer combination of *atoms* (loop/let variables or parenthesised ``//``/``%``
sub-expressions) plus a constant — so that trivial terms (``* 1``, ``+ 0``, ``* 0``) never reach the text and
the generated code stays readable. ``Ix`` only folds what is exact for non-negative integers.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from gensorage.folds import TERM, decide
from gensorage.opset import reshape_groups


@dataclass(frozen=True, slots=True)
class Ix:
    """``sum(coeff * atom) + const`` over non-negative integer atoms (TVMScript text of each atom)."""

    terms: tuple[tuple[str, int], ...] = ()
    const: int = 0

    @staticmethod
    def var(name: str) -> Ix:
        return Ix(((name, 1),))

    @staticmethod
    def of(value: Ix | int) -> Ix:
        return value if isinstance(value, Ix) else Ix((), int(value))

    @property
    def is_const(self) -> bool:
        return not self.terms

    def __add__(self, other: Ix | int) -> Ix:
        o = Ix.of(other)
        coeffs: dict[str, int] = {}
        for atom, c in (*self.terms, *o.terms):
            coeffs[atom] = coeffs.get(atom, 0) + c
        return Ix(tuple((a, c) for a, c in coeffs.items() if c), self.const + o.const)

    __radd__ = __add__

    def __mul__(self, k: int) -> Ix:
        k = int(k)
        if k == 0:
            return Ix()
        return Ix(tuple((a, c * k) for a, c in self.terms), self.const * k)

    __rmul__ = __mul__

    def floordiv(self, k: int, bound: int | None = None) -> Ix:
        """``self // k``; ``bound`` (exclusive upper bound of ``self``) lets ``x // k`` fold to 0."""
        if self.is_const:
            return Ix((), self.const // k)
        below = bound is not None and bound <= k
        how = decide((*(("same",) if k == 1 else ()), *(("zero",) if below else ()), TERM))
        if how == "same":
            return self
        if how == "zero":
            return Ix()
        return Ix(((f"{self._paren()} // {k}", 1),))

    def mod(self, k: int, bound: int | None = None) -> Ix:
        """``self % k``; ``bound`` (exclusive upper bound of ``self``) lets ``x % k`` fold to ``x``."""
        if self.is_const:
            return Ix((), self.const % k)
        below = bound is not None and bound <= k
        how = decide((*(("zero",) if k == 1 else ()), *(("same",) if below else ()), TERM))
        if how == "zero":
            return Ix()
        if how == "same":
            return self
        return Ix(((f"{self._paren()} % {k}", 1),))

    def _paren(self) -> str:
        text = str(self)
        return (
            text
            if len(self.terms) == 1 and self.terms[0][1] == 1 and not self.const and _simple(text)
            else (f"({text})")
        )

    def __str__(self) -> str:
        parts = [a if c == 1 else f"{_wrap(a)} * {c}" for a, c in self.terms]
        text = " + ".join(parts)
        if not parts:
            return str(self.const)
        if self.const > 0:
            return f"{text} + {self.const}"
        if self.const < 0:
            return f"{text} - {-self.const}"
        return text


def _simple(text: str) -> bool:
    return text.isidentifier()


def _wrap(atom: str) -> str:
    return atom if _simple(atom) else f"({atom})"


def ravel(idx: Sequence[Ix], shape: Sequence[int]) -> Ix:
    """Row-major flat index of ``idx`` in ``shape``."""
    flat = Ix()
    stride = 1
    for i, n in zip(reversed(idx), reversed(shape), strict=True):
        flat = flat + i * stride
        stride *= n
    return flat


def unravel(flat: Ix, shape: Sequence[int]) -> list[Ix]:
    """Row-major multi-index of ``flat`` in ``shape`` (``flat < prod(shape)``)."""
    out: list[Ix] = []
    total = math.prod(shape)
    stride = total
    for n in shape:
        stride //= n
        # flat < total, so flat // stride < n: the outermost dim needs no modulo.
        out.append(flat.floordiv(stride, total).mod(n, total // stride))
    return out


def reshape_index(idx: Sequence[Ix], src: Sequence[int], dst: Sequence[int]) -> list[Ix]:
    """Index into ``src`` of element ``idx`` of its row-major reshape to ``dst``.

    Dims are matched in groups of equal product (as numpy's reshape does) so that only the dims that really
    regroup get ``//`` and ``%``; size-1 dims read index 0.
    """
    groups = reshape_groups(tuple(src), tuple(dst))
    if groups is None:
        raise ValueError(f"no row-major reshape of {list(src)} to {list(dst)}")
    out: list[Ix] = [Ix() for _ in src]
    for gs, gd in groups:
        flat = ravel([idx[d] for d in gd], [dst[d] for d in gd])
        for d, v in zip(gs, unravel(flat, [src[d] for d in gs]), strict=True):
            out[d] = v
    return out


def broadcast_index(idx: Sequence[Ix], src: Sequence[int], out: Sequence[int] | None = None) -> list[Ix]:
    """Index into ``src`` (numpy-broadcast, right-aligned, to the shape ``idx`` indexes, ``out`` where given) of
    element ``idx``."""
    lead = len(idx) - len(src)

    def at(d: int, n: int) -> Ix:
        if n != 1:
            how = decide(("index",))
        else:  # a dim of 1 in both: index 0 either way
            how = decide(("broadcast", "index") if out is not None and out[lead + d] == 1 else ("broadcast",))
        return Ix() if how == "broadcast" else idx[lead + d]

    return [at(d, n) for d, n in enumerate(src)]


def summed_index(idx: Sequence[Ix], dim: int, at: Ix, count: int, full: bool, keep: bool) -> list[Ix]:
    """Index of term ``at`` (of ``count``) that a sum over ``dim`` reads for output element ``idx``: the whole dim
    (kept as size 1, or dropped), or group ``idx[dim]`` of a grouped sum."""
    if full and keep:
        return [*idx[:dim], at, *idx[dim + 1 :]]
    if full:
        return [*idx[:dim], at, *idx[dim:]]
    return [*idx[:dim], idx[dim] * count + at, *idx[dim + 1 :]]


def index_text(idx: Sequence[Ix | str]) -> str:
    return ", ".join(str(i) for i in idx) if idx else "0"


class Writer:
    """Lines of TVMScript with indentation managed by :meth:`block`."""

    def __init__(self, indent: int = 0) -> None:
        self.lines: list[str] = []
        self.depth = indent
        self._names: dict[str, int] = {}

    def line(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)

    @contextmanager
    def block(self, header: str) -> Iterator[None]:
        self.line(header)
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    @contextmanager
    def loop(self, var: str, extent: int, kind: str = "range") -> Iterator[Ix]:
        """A ``for`` over ``range(extent)`` (``kind`` picks the TVMScript loop form); extent 1 emits no loop."""
        if extent == 1:
            yield Ix()
            return
        header = f"for {var} in range({extent}):" if kind == "range" else f"for {var} in {kind}:"
        with self.block(header):
            yield Ix.var(var)

    def fresh(self, prefix: str) -> str:
        """A name not handed out before in this writer (``prefix`` then a counter)."""
        n = self._names.get(prefix, 0)
        self._names[prefix] = n + 1
        return f"{prefix}{n}"

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def tvm_float(value: float, dtype: str) -> str:
    """A floating-point literal of ``dtype`` (repr keeps the float64 value exact)."""
    if math.isinf(value):
        return f'T.{"min" if value < 0 else "max"}_value("{dtype}")'
    return f"T.{dtype}({float(value)!r})"


@contextmanager
def nest(w: Writer, headers: list[str]) -> Iterator[None]:
    """Blocks opened by ``headers`` one inside the other (none: nothing)."""
    if not headers:
        yield
        return
    with w.block(headers[0]), nest(w, headers[1:]):
        yield


def unroll(n: int) -> str:
    """The loop kind of an ``n``-trip loop to unroll (``range`` for one trip)."""
    return f"T.unroll({n})" if n > 1 else "range"


def shape_text(shape: tuple[int, ...]) -> str:
    """A shape as a Python tuple literal."""
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def is_atomic(e: str) -> bool:
    """Whether expression text ``e`` needs no parentheses (a name, a number or one subscript)."""
    return e.replace("_", "").isalnum() or (e.endswith("]") and e.count("[") == 1 and "(" not in e)


def broadcast_all(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    """The shape all of ``shapes`` broadcast to."""
    nd = max(len(s) for s in shapes)
    out = [1] * nd
    for s in shapes:
        for i, n in enumerate(s):
            d = nd - len(s) + i
            out[d] = max(out[d], n)
    return tuple(out)


def broadcast_guard(idx: list[Ix], shape: tuple[int, ...], space: tuple[int, ...]) -> list[str]:
    """Conditions under which element ``idx`` of ``space`` is the one that stores its broadcast source element."""
    lead = len(space) - len(shape)
    conds = []
    for d, n in enumerate(space):
        own = shape[d - lead] if d >= lead else 1
        if own == 1 and n > 1:
            conds.append(f"{idx[d]} == 0")
    return conds


__all__ = ["Ix", "Writer", "broadcast_index", "index_text", "ravel", "reshape_index", "tvm_float", "unravel"]

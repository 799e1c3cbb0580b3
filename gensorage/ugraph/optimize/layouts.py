"""Shared-memory layouts chosen against bank conflicts (the later Mirage paper's layout optimisation).

Bank-conflict model: shared memory has 32 banks of 4-byte words; word ``w`` is in bank ``w % 32``. One warp's
access (32 lanes, one address each) takes as many wavefronts as the most distinct words any one bank must
serve; lanes reading one word share it (a broadcast), and an element wider than a word covers several. So 32
lanes reading consecutive float32s take 1, reading one column of a row-major [32, 32] float32 tile take 32.
(The hardware serves a 64-bit access in half-warp passes; the model does not split it, so its float64 counts
are approximate.)

Layouts: a tile is row-major with its last dim either padded by ``pad`` elements (the allocation is
``[..., n + pad]`` and every index stays as it is) or XOR-swizzled: element ``(..., r, c)`` lives at column
``c ^ ((r % swizzle) * step)``, ``step`` elements being one bank word, so consecutive rows start in different
banks with no byte added (the block of ``swizzle * step`` columns the XOR permutes must divide the row). The
choice per tile is an exact search over :data:`LAYOUTS`: the one whose accesses (every read and write site the
kernel emits, one warp's lane addresses each) take the fewest wavefronts in all; on a tie row-major, then the
smaller pad, then a swizzle, so the chosen layout never takes more wavefronts than row-major. A pad costs a few
bytes per row; a swizzle costs index arithmetic on every access, which nvcc answers with registers and spills
(measured with ``benchmarks/kernel_resources.py``; figures in CHANGELOG.md), so a swizzle is chosen only where
it takes fewer wavefronts than every pad.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

BANKS = 32
BANK_BYTES = 4
WARP = 32


@dataclass(frozen=True, slots=True)
class Layout:
    """Row-major, with the last dim padded by ``pad`` elements or XOR-swizzled with period ``swizzle`` rows."""

    pad: int = 0
    swizzle: int = 0

    def step(self, elem_bytes: int) -> int:
        """Elements per bank word: the XOR moves a row by whole words."""
        return max(1, BANK_BYTES // elem_bytes)

    def fits(self, shape: Sequence[int], elem_bytes: int) -> bool:
        """Whether the layout applies to a tile of ``shape`` (a swizzle's XOR must stay within the row)."""
        if not self.swizzle:
            return True
        return len(shape) >= 2 and shape[-1] % (self.swizzle * self.step(elem_bytes)) == 0


#: The layouts tried: row-major, padded rows, swizzled rows.
LAYOUTS = (Layout(), *(Layout(swizzle=s) for s in (4, 8, 16, 32)), *(Layout(pad=p) for p in (1, 2, 4, 8)))


def wavefronts(byte_addresses: Sequence[int], elem_bytes: int) -> int:
    """Wavefronts one warp access takes (see the module docstring): lane ``i`` touches ``elem_bytes`` bytes
    from ``byte_addresses[i]``."""
    words: dict[int, set[int]] = {}
    for a in byte_addresses:
        for w in range(a // BANK_BYTES, (a + elem_bytes - 1) // BANK_BYTES + 1):
            words.setdefault(w % BANKS, set()).add(w)
    return max((len(ws) for ws in words.values()), default=0)


@dataclass(frozen=True, slots=True)
class Access:
    """One access site of a tile: the element index (one per dim) each lane of the first warp touches."""

    lanes: tuple[tuple[int, ...], ...]


def address(idx: Sequence[int], shape: Sequence[int], layout: Layout, elem_bytes: int) -> int:
    """Byte address of element ``idx`` of a tile of ``shape`` laid out with ``layout``."""
    idx = list(idx)
    if layout.swizzle:
        idx[-1] ^= (idx[-2] % layout.swizzle) * layout.step(elem_bytes)
    dims = [*shape[:-1], shape[-1] + layout.pad]
    flat = 0
    for i, n in zip(idx, dims, strict=True):
        flat = flat * n + i
    return flat * elem_bytes


def cost(shape: Sequence[int], elem_bytes: int, accesses: Sequence[Access], layout: Layout) -> int:
    """Wavefronts of every access of a tile laid out with ``layout``."""
    return sum(
        wavefronts([address(i, shape, layout, elem_bytes) for i in a.lanes], elem_bytes) for a in accesses
    )


def choose_layout(
    shape: Sequence[int], elem_bytes: int, accesses: Sequence[Access], row_align: int = 0
) -> Layout:
    """The layout of :data:`LAYOUTS` with the fewest wavefronts over ``accesses`` (ties: row-major, then the
    smaller pad, then a swizzle); row-major for a tile of one row (nothing to shift) or with no access.
    ``row_align`` (bytes): only layouts that keep every aligned run of that many bytes of a row contiguous and
    aligned (no swizzle, pads of whole runs), for a tile that ``ldmatrix`` reads a 16-byte row at a time."""
    if len(shape) < 2 or math.prod(shape[:-1]) == 1 or not accesses:
        return Layout()
    fitting = [
        lay
        for lay in LAYOUTS
        if lay.fits(shape, elem_bytes)
        and (not row_align or (not lay.swizzle and lay.pad * elem_bytes % row_align == 0))
    ]
    return min(
        fitting,
        key=lambda lay: (cost(shape, elem_bytes, accesses, lay), lay.swizzle > 0, lay.pad, lay.swizzle),
    )


__all__ = [
    "BANKS",
    "BANK_BYTES",
    "LAYOUTS",
    "WARP",
    "Access",
    "Layout",
    "address",
    "choose_layout",
    "cost",
    "wavefronts",
]

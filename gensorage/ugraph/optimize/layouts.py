"""Shared-memory layouts chosen against bank conflicts (the later Mirage paper's layout optimisation).

Bank-conflict model: shared memory has 32 banks of 4-byte words; word ``w`` is in bank ``w % 32``. One warp's
access (32 lanes, one address each) takes as many wavefronts as the most distinct words any one bank must
serve; lanes reading one word share it (a broadcast), and an element wider than a word covers several. So 32
lanes reading consecutive float32s take 1, reading one column of a row-major [32, 32] float32 tile take 32.
(The model counts a 64-bit access as one warp-wide request; the hardware splits it in two half-warps, which
changes no ranking of layouts of one tile.)

Layouts: a tile is row-major with its last dim padded by ``pad`` elements (the allocation is ``[..., n + pad]``
and every index stays as it is, so a padded layout changes only the declaration). The choice per tile is an
exact search over the pads in :data:`PADS`: the one whose accesses (every read and write site the kernel
emits, one warp's lane addresses each) take the fewest wavefronts in all, the smaller pad on a tie, so the
chosen layout never takes more wavefronts than row-major. (XOR swizzles are left out: they would rewrite
every index of the tile.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

BANKS = 32
BANK_BYTES = 4
WARP = 32
#: Paddings of a tile's last dim tried, in elements (0: plain row-major).
PADS = (0, 1, 2, 4, 8)


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


def address(idx: Sequence[int], shape: Sequence[int], pad: int, elem_bytes: int) -> int:
    """Byte address of element ``idx`` of a row-major tile of ``shape`` whose last dim is padded by ``pad``."""
    dims = [*shape[:-1], shape[-1] + pad]
    flat = 0
    for i, n in zip(idx, dims, strict=True):
        flat = flat * n + i
    return flat * elem_bytes


def cost(shape: Sequence[int], elem_bytes: int, accesses: Sequence[Access], pad: int) -> int:
    """Wavefronts of every access of a tile laid out with ``pad``."""
    return sum(
        wavefronts([address(i, shape, pad, elem_bytes) for i in a.lanes], elem_bytes) for a in accesses
    )


def choose_pad(shape: Sequence[int], elem_bytes: int, accesses: Sequence[Access]) -> int:
    """The pad of :data:`PADS` with the fewest wavefronts over ``accesses`` (the smaller on a tie); 0 for a
    tile of one row (nothing to shift) or with no access recorded."""
    if len(shape) < 2 or math.prod(shape[:-1]) == 1 or not accesses:
        return 0
    return min(PADS, key=lambda p: (cost(shape, elem_bytes, accesses, p), p))


__all__ = ["BANKS", "BANK_BYTES", "PADS", "WARP", "Access", "address", "choose_pad", "cost", "wavefronts"]

"""Tensor maps on the GPU machine: ``CUtensorMap`` arguments for TMA kernels, and their launches.

A TMA kernel (``gensorage.codegen.wgmma_tma``) takes each TMA operand as a ``const __grid_constant__
CUtensorMap`` parameter: 128 bytes, passed by value. The manifest names such a parameter as an ``args`` entry
with a ``tensor_map`` object (``dtype``, ``dims`` and ``box`` innermost first, the outer dims' byte
``strides``, ``swizzle`` in bytes); the runner encodes it for the tensor's device pointer with libcuda's
``cuTensorMapEncodeTiled`` (ctypes, no TVM, no CUDA headers) and launches through ``cuLaunchKernel`` on
torch's current stream (CUDA-graph capture included), since CuPy's launcher passes only pointers and scalars.

:func:`encode_arguments` is the pure part (what ``cuTensorMapEncodeTiled`` gets), tested without a GPU.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from typing import Any

from gensorage.codegen.wgmma_tma import (
    DATA_TYPES,
    INTERLEAVE_NONE,
    L2_PROMOTION_256B,
    OOB_FILL_NONE,
    SWIZZLE_ENUM,
)

MAP_BYTES = 128  # sizeof(CUtensorMap)
MAP_ALIGN = 128  # alignas(128) in CUDA 13's cuda.h (64 before); the encoder writes to an aligned copy
SWIZZLES = SWIZZLE_ENUM
ELEMENT_BYTES = {"float16": 2, "bfloat16": 2}


class TensorMapError(ValueError):
    """A tensor map the copy engine cannot take: the message names the field."""


def check_tensor_map(spec: Mapping[str, Any]) -> str | None:
    """Why ``spec`` (a manifest ``tensor_map``) is not a valid tiled map (None when it is): the limits of
    ``cuTensorMapEncodeTiled`` that a bundle can break."""
    dtype, dims, strides, box = spec.get("dtype"), spec.get("dims"), spec.get("strides"), spec.get("box")
    if dtype not in DATA_TYPES:
        return f"dtype {dtype!r} not in {tuple(DATA_TYPES)}"
    if spec.get("swizzle") not in SWIZZLES:
        return f"swizzle {spec.get('swizzle')!r} not in {tuple(SWIZZLES)}"
    lists = (dims, strides, box)
    if not all(isinstance(v, list) and all(isinstance(x, int) and x > 0 for x in v) for v in lists):
        return "dims, strides and box must be lists of positive ints"
    assert isinstance(dims, list) and isinstance(strides, list) and isinstance(box, list)
    if not 1 <= len(dims) <= 5 or len(box) != len(dims) or len(strides) != len(dims) - 1:
        return f"rank {len(dims)}: needs as many box dims and one stride fewer"
    width = ELEMENT_BYTES[dtype]
    if any(s % 16 for s in strides):
        return f"strides {strides} must be multiples of 16 bytes"
    if any(b > 256 for b in box) or box[0] * width % 16:
        return f"box {box}: at most 256 per dim, the inner one a multiple of 16 bytes"
    if spec["swizzle"] and box[0] * width > spec["swizzle"]:
        return f"box inner dim {box[0] * width} bytes exceeds the {spec['swizzle']}-byte swizzle"
    return None


def encode_arguments(spec: Mapping[str, Any], address: int) -> tuple[Any, ...]:
    """The arguments of ``cuTensorMapEncodeTiled`` after the output map, for the tensor at device ``address``:
    (data type, rank, address, dims, strides, box, element strides, interleave, swizzle, L2 promotion, OOB
    fill), as Python ints and tuples.

    Raises
    ------
    TensorMapError
        ``spec`` is not a valid map (:func:`check_tensor_map`), or the address is not 16-byte aligned.
    """
    why = check_tensor_map(spec)
    if why is None and address % 16:
        why = f"address {address:#x} is not 16-byte aligned"
    if why is not None:
        raise TensorMapError(f"tensor map: {why}")
    rank = len(spec["dims"])
    return (
        DATA_TYPES[spec["dtype"]],
        rank,
        address,
        tuple(spec["dims"]),
        tuple(spec["strides"]),
        tuple(spec["box"]),
        (1,) * rank,
        INTERLEAVE_NONE,
        SWIZZLES[spec["swizzle"]],
        L2_PROMOTION_256B,
        OOB_FILL_NONE,
    )


def _libcuda() -> Any:
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuTensorMapEncodeTiled.restype = ctypes.c_int
    lib.cuLaunchKernel.restype = ctypes.c_int
    return lib


_LIB: list[Any] = []


def libcuda() -> Any:
    if not _LIB:
        _LIB.append(_libcuda())
    return _LIB[0]


class AlignedBytes:
    """``size`` bytes at an ``align``-byte boundary, kept alive with their owner."""

    def __init__(self, size: int, align: int) -> None:
        self.raw = ctypes.create_string_buffer(size + align)
        base = ctypes.addressof(self.raw)
        self.address = base + (-base) % align

    @property
    def pointer(self) -> ctypes.c_void_p:
        return ctypes.c_void_p(self.address)


def encode(spec: Mapping[str, Any], address: int) -> AlignedBytes:
    """The 128-byte ``CUtensorMap`` of ``spec`` for the tensor at ``address`` (libcuda on this machine)."""
    dtype, rank, addr, dims, strides, box, elems, interleave, swizzle, l2, oob = encode_arguments(
        spec, address
    )
    out = AlignedBytes(MAP_BYTES, MAP_ALIGN)
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    err = libcuda().cuTensorMapEncodeTiled(
        out.pointer,
        ctypes.c_int(dtype),
        u32(rank),
        ctypes.c_void_p(addr),
        (u64 * rank)(*dims),
        (u64 * max(1, rank - 1))(*strides),
        (u32 * rank)(*box),
        (u32 * rank)(*elems),
        ctypes.c_int(interleave),
        ctypes.c_int(swizzle),
        ctypes.c_int(l2),
        ctypes.c_int(oob),
    )
    if err != 0:
        raise TensorMapError(f"cuTensorMapEncodeTiled failed (CUresult {err}) for {dict(spec)}")
    return out


def function_handle(func: Any) -> int:
    """The ``CUfunction`` of a CuPy kernel: ``RawModule.get_function`` gives a ``RawKernel``, whose ``kernel``
    (loaded on the current device) is a ``cupy.cuda.function.Function`` with the handle in ``ptr``."""
    return int(func.kernel.ptr if hasattr(func, "kernel") else func.ptr)


class RawLaunch:
    """A kernel whose parameters are device pointers and tensor maps, launched with ``cuLaunchKernel``."""

    def __init__(
        self,
        function: int,
        pointers: Sequence[int],
        maps: Sequence[Mapping[str, Any] | None],
        launch: tuple[tuple[int, int, int], tuple[int, int, int], int],
    ) -> None:
        self.function = function
        self.grid, self.block, self.smem = launch
        # Each parameter's bytes (a pointer's 8, a map's 128), alive as long as the launch.
        self.values: list[Any] = [
            ctypes.c_uint64(p) if spec is None else encode(spec, p)
            for p, spec in zip(pointers, maps, strict=True)
        ]
        self.params = (ctypes.c_void_p * len(self.values))(
            *[v.address if isinstance(v, AlignedBytes) else ctypes.addressof(v) for v in self.values]
        )

    def __call__(self, stream: int) -> None:
        err = libcuda().cuLaunchKernel(
            ctypes.c_void_p(self.function),
            *(ctypes.c_uint(x) for x in (*self.grid, *self.block, self.smem)),
            ctypes.c_void_p(stream),
            self.params,
            None,
        )
        if err != 0:
            raise RuntimeError(f"cuLaunchKernel failed (CUresult {err})")

"""The runner's tensor-map launches (``benchmarks/gpu_tensor_map.py``) against a recording stand-in for libcuda:
what reaches ``cuTensorMapEncodeTiled`` and ``cuLaunchKernel`` through ctypes, byte for byte."""

from __future__ import annotations

import ctypes
from typing import Any

import pytest

from benchmarks import gpu_tensor_map
from benchmarks.gpu_tensor_map import MAP_ALIGN, MAP_BYTES, RawLaunch
from gensorage.codegen.wgmma import WgmmaTiles
from gensorage.codegen.wgmma_tma import tensor_map_args


class FakeLibcuda:
    """Records the calls; "encodes" a map as 128 bytes of its rank, so the launch's bytes can be traced."""

    def __init__(self) -> None:
        self.encoded: list[dict[str, Any]] = []
        self.launches: list[tuple[Any, ...]] = []

    def cuTensorMapEncodeTiled(self, out: Any, dtype: Any, rank: Any, address: Any, *rest: Any) -> int:  # noqa: N802
        dims, strides, box, elems, interleave, swizzle, l2, oob = rest
        r = rank.value
        self.encoded.append(
            {
                "out": out.value,
                "dtype": dtype.value,
                "address": address.value,
                "dims": list(dims)[:r],
                "strides": list(strides)[: r - 1],
                "box": list(box)[:r],
                "elems": list(elems)[:r],
                "enums": (interleave.value, swizzle.value, l2.value, oob.value),
            }
        )
        ctypes.memset(out.value, len(self.encoded), MAP_BYTES)
        return 0

    def cuLaunchKernel(self, *args: Any) -> int:  # noqa: N802
        self.launches.append(args)
        return 0


def test_a_tma_launch_passes_encoded_maps_and_pointers_in_parameter_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeLibcuda()
    monkeypatch.setattr(gpu_tensor_map, "libcuda", lambda: fake)
    tiles = WgmmaTiles(2, 256, 4, tma=True)
    a, b = (s.as_json() for s in tensor_map_args(4096, 4096, 1024, "float16", tiles))
    ptr_a, ptr_b, ptr_c = 0x7F0000000000, 0x7F0000800000, 0x7F0001000000
    launch = RawLaunch(0x1234, [ptr_a, ptr_b, ptr_c], [a, b, None], ((512, 1, 1), (384, 1, 1), 197632))
    assert [e["address"] for e in fake.encoded] == [ptr_a, ptr_b]
    first = fake.encoded[0]
    assert first["dims"] == [1024, 4096] and first["strides"] == [2048] and first["box"] == [64, 128]
    assert first["dtype"] == 6 and first["elems"] == [1, 1] and first["enums"] == (0, 3, 3, 0)
    assert fake.encoded[1]["dims"] == [4096, 1024] and fake.encoded[1]["box"] == [64, 64]
    assert all(e["out"] % MAP_ALIGN == 0 for e in fake.encoded)
    launch(stream=0xABC)
    (args,) = fake.launches
    function, *dims, stream, params, extra = args
    assert function.value == 0x1234 and [d.value for d in dims] == [512, 1, 1, 384, 1, 1, 197632]
    assert stream.value == 0xABC and extra is None
    # Parameter 0 and 1: the 128 bytes of A's and B's map; parameter 2: C's pointer as 8 bytes.
    assert ctypes.string_at(params[0], MAP_BYTES) == bytes([1]) * MAP_BYTES
    assert ctypes.string_at(params[1], MAP_BYTES) == bytes([2]) * MAP_BYTES
    assert ctypes.c_uint64.from_address(params[2]).value == ptr_c


def test_a_failed_encode_is_one_line_naming_the_map(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeLibcuda()
    fake.cuTensorMapEncodeTiled = lambda *args: 1  # type: ignore[method-assign]  # CUDA_ERROR_INVALID_VALUE
    monkeypatch.setattr(gpu_tensor_map, "libcuda", lambda: fake)
    a, _ = (s.as_json() for s in tensor_map_args(64, 64, 64, "float16", WgmmaTiles(1, 64, 2, tma=True)))
    with pytest.raises(gpu_tensor_map.TensorMapError, match="CUresult 1"):
        RawLaunch(1, [0x1000], [a], ((1, 1, 1), (256, 1, 1), 0))


def test_the_function_handle_of_cupys_kernels() -> None:
    from types import SimpleNamespace

    from benchmarks.gpu_tensor_map import function_handle

    # CuPy 14: RawModule.get_function returns a RawKernel (no ptr) whose kernel is a Function (ptr).
    raw_kernel = SimpleNamespace(kernel=SimpleNamespace(ptr=0xBEEF))
    assert function_handle(raw_kernel) == 0xBEEF
    assert function_handle(SimpleNamespace(ptr=0xCAFE)) == 0xCAFE  # a Function itself


def test_a_bound_launch_of_a_tma_kernel_goes_through_libcuda(monkeypatch: pytest.MonkeyPatch) -> None:
    # The runner's BoundLaunch with CuPy 14's objects: a RawKernel (no ptr) from RawModule.get_function.
    from types import SimpleNamespace

    from benchmarks.gpu_bundle import KernelSpec
    from benchmarks.gpu_device import BoundLaunch

    fake = FakeLibcuda()
    monkeypatch.setattr(gpu_tensor_map, "libcuda", lambda: fake)

    class RawKernel:  # no ptr attribute, as in CuPy 14
        kernel = SimpleNamespace(ptr=0x77)

        def __call__(self, *args: Any, **kwargs: Any) -> None:
            raise AssertionError("a TMA kernel must not go through CuPy's launcher")

    a, b = (s.as_json() for s in tensor_map_args(256, 256, 256, "float16", WgmmaTiles(1, 64, 2, tma=True)))
    spec = KernelSpec("k.cubin", "main_kernel", (16, 1, 1), (256, 1, 1), 33792, ("A", "B", "C"), (a, b, None))
    stream = SimpleNamespace(cuda_stream=0x5)
    torch = SimpleNamespace(cuda=SimpleNamespace(current_stream=lambda: stream))
    env = SimpleNamespace(torch=torch, cupy=None, np=__import__("numpy"))
    launch = BoundLaunch(env, RawKernel(), spec, [0x1000, 0x2000, 0x3000])  # type: ignore[arg-type]
    launch()
    (args,) = fake.launches
    assert args[0].value == 0x77 and args[8].value == 0x5 and len(fake.encoded) == 2

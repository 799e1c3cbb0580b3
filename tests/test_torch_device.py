"""Runs where the tensors are: CPU tensors reach the llvm kernels and come back by DLPack without copies; CUDA
tensors pick a CUDA build for their GPU's arch.

Without a GPU the CUDA path is checked as far as a CPU allows: the build choice, the per-arch CUDA build (TVM's
CUDA C and, where nvcc is installed, a cubin) and its cache. The launch on CUDA tensors runs only on a GPU
(``test_decoder_layer_on_cuda_tensors``, skipped elsewhere).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import gensorage.torch as gtorch  # noqa: E402
from gensorage.codegen.cuda_build import cubin_unavailable_reason, cuda_device_available  # noqa: E402
from gensorage.codegen.runner import KernelRunner  # noqa: E402
from gensorage.errors import DeviceError, UnsupportedOpError  # noqa: E402
from gensorage.hw import load_profile  # noqa: E402
from gensorage.program import Program  # noqa: E402
from gensorage.superopt import superoptimize  # noqa: E402
from gensorage.torch import device  # noqa: E402


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENSORAGE_HOME", str(tmp_path / "home"))


def _softmax_of_product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.softmax((x @ w) * 4.0, dim=-1)


def test_kept_weights_follow_in_place_updates_and_new_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """A module's weights are imported for the kernels once (device.KeptInputs): an in-place update is seen (the
    same memory), a ``weight.data = ...`` is imported again, and a weight the kernels can only take as a copy (a
    transposed one) is copied at each call, never kept."""
    import tvm

    passed: list[bool] = []
    real = KernelRunner.__call__

    def spy(self: KernelRunner, arrays: list[Any], alloc: Any, *rest: Any) -> list[Any]:
        passed.append(any(isinstance(a, tvm.runtime.Tensor) for a in arrays))
        return real(self, arrays, alloc, *rest)

    monkeypatch.setattr(KernelRunner, "__call__", spy)
    torch.manual_seed(3)
    lin = torch.nn.Linear(32, 16, bias=False)

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(lin(x) * 2.0, dim=-1)

    compiled = gtorch.compile(f)
    x = 3.0 * torch.randn(8, 32)
    with torch.no_grad():
        for step in range(5):
            if step == 2:
                lin.weight.mul_(-0.5)
            elif step == 3:
                lin.weight.data = torch.randn(16, 32)
            elif step == 4:
                lin.weight.data = torch.randn(32, 16).t()
            got, want = compiled(x), f(x)
            torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3 * float(want.max()))
    assert "stays in torch" not in compiled.explain(), compiled.explain()
    assert passed[1:4] == [True, True, True], (
        passed
    )  # steps 1-3 ran with the weight kept (0: the checked call)


def test_cpu_tensors_pass_by_pointer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernels see the caller's tensors' memory, and the caller gets the kernels' output memory."""
    seen: list[tuple[list[int], list[int]]] = []
    real = KernelRunner.__call__

    def spy(self: KernelRunner, arrays: list[Any], alloc: Any, *rest: Any) -> list[Any]:
        outs = real(self, arrays, alloc, *rest)
        seen.append(([t.data_ptr() for t in arrays], [t.data_ptr() for t in outs]))
        return outs

    monkeypatch.setattr(KernelRunner, "__call__", spy)
    g = torch.Generator().manual_seed(2)
    x, w = 3.0 * torch.randn(8, 32, generator=g), torch.randn(32, 16, generator=g)
    compiled = gtorch.compile(_softmax_of_product)
    with torch.no_grad():
        got = compiled(x, w)
        x2 = 3.0 * torch.randn(8, 32, generator=g)  # fresh values after the first (checked) call
        got2 = compiled(x2, w)
    torch.testing.assert_close(got, _softmax_of_product(x, w), rtol=1e-3, atol=1e-3 * float(got.max()))
    torch.testing.assert_close(got2, _softmax_of_product(x2, w), rtol=1e-3, atol=1e-3 * float(got2.max()))
    assert len(seen) >= 2, compiled.explain()  # the check on the first call, then a run per call
    inputs, outputs = seen[-1]
    assert inputs == [x2.data_ptr(), w.data_ptr()]
    assert outputs == [got2.data_ptr()]


def test_unaligned_or_strided_inputs_are_copied_by_torch() -> None:
    base = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    assert device.kernel_input(base).data_ptr() == base.data_ptr()
    for view in (base[1:], base.t()):  # 32 bytes past an aligned start; a transpose
        t = device.kernel_input(view)
        assert t.data_ptr() != view.data_ptr() and t.data_ptr() % device.ALIGNMENT == 0
        assert torch.equal(torch.from_dlpack(t), view)


def test_build_follows_the_device() -> None:
    assert device.build_for(torch.device("cpu")) == "llvm"
    assert device.build_for(torch.device("cuda", 1)) == "cuda"
    with pytest.raises(UnsupportedOpError, match="tensors on meta: gensorage kernels run on cpu and cuda"):
        device.build_for(torch.device("meta"))


def test_profile_takes_the_gpus_arch() -> None:
    h100 = load_profile("h100")
    assert device.cuda_arch((8, 9)) == "sm_89"
    assert device.profile_for(h100, (9, 0)) is h100
    a100_like = device.profile_for(h100, (8, 0))
    assert a100_like.arch == "sm_80" and a100_like.shared_mem_per_block == h100.shared_mem_per_block


def _small_program() -> Program:
    p = Program("softmax_product")
    x, w = p.input("x", (8, 32), "float16"), p.input("w", (32, 16), "float16")
    p.output(p.softmax(p.matmul(x, w), dim=1))
    return p


def test_cuda_build_per_arch_without_a_gpu() -> None:
    """The CUDA module for a GPU of another arch than the profile's is built (here, without a GPU) and kept."""
    res = superoptimize(_small_program(), hw="h100", mode="fast", progress=False)
    sm80 = device.cuda_kernels(res.compiled(), (8, 0))
    assert sm80.hw.arch == "sm_80" and device.cuda_kernels(res.compiled(), (8, 0)) is sm80
    assert device.cuda_kernels(res.compiled(), (9, 0)) is res.compiled()  # the profile's own arch: its build
    assert "__global__" in sm80.cuda_source()
    if cubin_unavailable_reason() is None:
        assert sm80.cubin()


@pytest.mark.skipif(cuda_device_available() is None, reason="a GPU is visible to TVM")
def test_cuda_tensors_without_a_cuda_runtime_are_a_reason() -> None:
    """Where TVM cannot reach a GPU, CUDA tensors get a one-line DeviceError (a fallback reason), not a crash."""
    res = superoptimize(_small_program(), hw="h100", mode="fast", progress=False)
    with pytest.raises(DeviceError, match="^cannot run gensorage kernels for tensors on cuda:0 on CUDA: "):
        device.kernels_for(res.compiled(), torch.device("cuda", 0))


@pytest.mark.skipif(
    not torch.cuda.is_available() or cuda_device_available() is not None,
    reason="needs a CUDA GPU for torch and TVM",
)
def test_decoder_layer_on_cuda_tensors() -> None:
    """On a GPU: CUDA tensors in, CUDA tensors out, within 2e-2 of float64 in bfloat16, on fresh inputs too."""
    from test_torch_frontend import DecoderLayer, assert_close, gensorage_subgraphs, layer_inputs

    torch.manual_seed(4)
    layer = DecoderLayer().eval()
    exact = copy.deepcopy(layer).double()
    compiled = gtorch.compile(layer.to(torch.bfloat16).cuda())
    with torch.no_grad():
        for seed in (5, 6):
            args = layer_inputs(8, torch.bfloat16, seed=seed)
            got = compiled(*(a.cuda() for a in args))
            assert got.device.type == "cuda"
            want = exact(*(a.double() for a in args))
            assert_close(got.cpu(), want, 2e-2)
    assert len(gensorage_subgraphs(compiled.explain())) == 1, compiled.explain()

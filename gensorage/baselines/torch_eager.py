"""The program run op by op in PyTorch (eager): the GPU benchmark's baseline.

The program's own interpreter (:meth:`gensorage.program.Program.evaluate`) walks the ops with
:class:`TorchArith`, so the baseline computes exactly the function the float64 reference computes, one torch
call (one or more kernels) per op, with torch's library kernels (cuBLAS for matmul). torch is imported only by
the caller, which passes the module in: gensorage does not depend on it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gensorage.arith import AccumKind, Activation

if TYPE_CHECKING:
    from gensorage.program import Program


class TorchArith:
    """The :class:`~gensorage.arith.Arith` of torch tensors (any device, any float dtype)."""

    name = "torch"

    def __init__(self, torch: Any) -> None:
        self.torch = torch

    def shape(self, a: Any) -> tuple[int, ...]:
        return tuple(int(s) for s in a.shape)

    def add(self, a: Any, b: Any) -> Any:
        return self.torch.add(a, b)

    def sub(self, a: Any, b: Any) -> Any:
        return self.torch.sub(a, b)

    def mul(self, a: Any, b: Any) -> Any:
        return self.torch.mul(a, b)

    def div(self, a: Any, b: Any) -> Any:
        return self.torch.div(a, b)

    def exp(self, a: Any) -> Any:
        return self.torch.exp(a)

    def sqrt(self, a: Any) -> Any:
        return self.torch.sqrt(a)

    def scale(self, a: Any, factor: float) -> Any:
        return a * float(factor)

    def add_scalar(self, a: Any, value: float) -> Any:
        return a + float(value)

    def activation(self, kind: Activation, a: Any) -> Any:
        f = self.torch.nn.functional
        if kind == "relu":
            return f.relu(a)
        if kind == "silu":
            return f.silu(a)
        if kind == "gelu":  # exact (erf) GELU, as the reference
            return f.gelu(a)
        if kind == "tanh":
            return self.torch.tanh(a)
        if kind == "log":
            return self.torch.log(a)
        raise ValueError(kind)

    def clamp(self, a: Any, lo: float | None, hi: float | None) -> Any:
        return self.torch.clamp(a, lo, hi)

    def matmul(self, a: Any, b: Any) -> Any:
        return self.torch.matmul(a, b)

    def reduce_sum(self, a: Any, axis: int, keepdims: bool) -> Any:
        return self.torch.sum(a, dim=axis, keepdim=keepdims)

    def reduce_max(self, a: Any, axis: int, keepdims: bool) -> Any:
        return self.torch.amax(a, dim=axis, keepdim=keepdims)

    def accumulate(self, acc: Any | None, x: Any, kind: AccumKind) -> Any:
        if acc is None:
            return x.clone()
        return acc + x if kind == "sum" else self.torch.maximum(acc, x)

    def reshape(self, a: Any, shape: tuple[int, ...]) -> Any:
        return a.reshape(shape)

    def repeat(self, a: Any, axis: int, times: int) -> Any:
        return self.torch.repeat_interleave(a, times, dim=axis)

    def transpose(self, a: Any, axis0: int, axis1: int) -> Any:
        return a.transpose(axis0, axis1)

    def concat(self, parts: Sequence[Any], axis: int) -> Any:
        return self.torch.cat(list(parts), dim=axis)

    def slice(self, a: Any, axis: int, start: int, stop: int) -> Any:
        return a.narrow(axis, start, stop - start)


def torch_program(program: Program, torch: Any, inputs: Sequence[Any]) -> Callable[[], list[Any]]:
    """A function running ``program`` op by op in torch on ``inputs`` (torch tensors, one per program input)."""
    arith = TorchArith(torch)
    values = list(inputs)

    def run() -> list[Any]:
        return program.evaluate(arith, values)

    return run


__all__ = ["TorchArith", "torch_program"]

"""A graph dynamo captured with symbolic shapes, partitioned again at each concrete shape it is called with.

``torch.compile(model, backend="gensorage")`` leaves ``dynamic`` to dynamo, which recompiles a graph whose input
shapes change with its sizes as symbols (``s0``): every size a kernel would need is then unknown, and no op could
lower. Instead of handing such a graph to torch, the backend keeps it and, at each call, specialises it to the
call's shapes with torch's own tracer (``make_fx`` over fake tensors of those shapes: the same aten graph with the
symbols replaced by their values), partitions that static graph as usual and caches it by the inputs' shapes,
dtypes, strides and devices. Kernels are shared across the specialisations as across recompilations: a new length
of a program seen before reuses its µGraph (:mod:`gensorage.superopt.dispatch`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from gensorage.torch.report import Report, first_line


def has_symbolic_shapes(example_inputs: Sequence[Any]) -> bool:
    """Whether dynamo captured with symbolic sizes (a SymInt input, or a tensor with a symbolic dim)."""
    return any(
        isinstance(x, torch.SymInt)
        or (isinstance(x, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in x.shape))
        for x in example_inputs
    )


def shape_key(args: Sequence[Any]) -> tuple[Any, ...]:
    """What a static graph depends on: each tensor's shape, stride, dtype and device; other inputs' values."""
    return tuple(
        (a.shape, a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor) else a for a in args
    )  # a torch.Size hashes and compares as the tuple of its sizes


class PerShape:
    """Calls ``gm`` (a symbolic-shape forward graph) through a static partition per concrete input shape."""

    def __init__(
        self,
        gm: fx.GraphModule,
        partition: Callable[[fx.GraphModule], Callable[..., Any]],
        report: Report,
    ) -> None:
        self.gm = gm
        self.partition = partition
        self.report = report
        self.graphs: dict[tuple[Any, ...], Callable[..., Any]] = {}

    def __call__(self, *args: Any) -> Any:
        key = shape_key(args)
        fn = self.graphs.get(key)
        if fn is None:
            fn = self.graphs[key] = self._specialise(args)
        return fn(*args)

    def _specialise(self, args: Sequence[Any]) -> Callable[..., Any]:
        shapes = [list(a.shape) for a in args if isinstance(a, torch.Tensor)]
        try:
            static = make_fx(self.gm, tracing_mode="fake")(*args)
        except Exception as exc:  # torch could not specialise it: the symbolic graph runs in torch, right
            self.report.add(f"graph with symbolic shapes runs in torch at {shapes}: {first_line(exc)}")
            return self.gm
        # The trace records every output of a multi-output op (SDPA's logsumexp, say) even where nothing reads
        # it, which the partition would take for a use; dynamo's own graphs have those removed.
        static.graph.eliminate_dead_code()
        static.recompile()
        self.report.add(f"graph with symbolic shapes specialised to its inputs' shapes {shapes}")
        return self.partition(static)


__all__ = ["PerShape", "has_symbolic_shapes", "shape_key"]

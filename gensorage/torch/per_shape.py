"""A graph dynamo captured with symbolic shapes, partitioned again at each concrete shape it is called with.

``torch.compile(model, backend="gensorage")`` leaves ``dynamic`` to dynamo, which recompiles a graph whose input
shapes change with its sizes as symbols (``s0``): every size a kernel would need is then unknown, and no op could
lower. Instead of handing such a graph to torch, the backend keeps it and, at each call, specialises it to the
call's shapes with torch's own tracer (``make_fx`` over fake tensors of those shapes: the same aten graph with the
symbols replaced by their values), partitions that static graph as usual and caches it by the values of the
graph's symbols. Kernels are shared across the specialisations as across recompilations: a new length of a program
seen before reuses its µGraph (:mod:`gensorage.superopt.dispatch`).

What a specialisation depends on is the inputs' sizes, strides, dtypes and devices, and dynamo's guards fix all of
them but the symbols' values: each tensor input's dtype, device, dispatch keys and every size and stride that is
a number at capture are checked as they are (its ``TENSOR_MATCH`` guard), and every symbolic size, stride or
offset equals its expression in the symbols (the shape environment's guards: ``L['k'].stride()[1] ==
16*L['k'].size()[2]``, say). So the cache key is only what carries the symbols (:func:`key_positions`): the
graph's integer and other non-tensor inputs by value (dynamo passes each size symbol it needs as one) and, for a
tensor with a symbol no such input carries, its sizes and strides; checking the rest again would cost ~5 µs a
call for a model's 16 arguments. A graph called outside dynamo's guards (the tests, a caller of ours) keys on
everything (:func:`shape_key`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch._dynamo.convert_frame import compile_lock
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


def _symbols(t: torch.Tensor) -> set[Any]:
    """The symbols of fake tensor ``t``'s symbolic sizes, strides and storage offset."""
    dims = (*t.shape, *t.stride(), t.storage_offset())
    return {s for d in dims if isinstance(d, torch.SymInt) for s in d.node.expr.free_symbols}


def key_positions(example_inputs: Sequence[Any]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Where a call of a symbolic graph of ``example_inputs`` (fake tensors, SymInts) under dynamo's guards
    finds its symbols' values: the positions of its non-tensor inputs (keyed by value), and of the tensors with
    a symbol none of those inputs is (keyed by sizes and strides). See the module docstring."""
    values = tuple(i for i, x in enumerate(example_inputs) if not isinstance(x, torch.Tensor))
    carried = {x.node.expr for x in example_inputs if isinstance(x, torch.SymInt) and x.node.expr.is_Symbol}
    tensors = tuple(
        i for i, x in enumerate(example_inputs) if isinstance(x, torch.Tensor) and not _symbols(x) <= carried
    )
    return values, tensors


def _key_function(values: tuple[int, ...], tensors: tuple[int, ...]) -> Callable[[Sequence[Any]], Any]:
    """The key :class:`PerShape` looks a call's graph up by (``itemgetter``: one C call where the symbols come
    as integers, as dynamo passes them)."""
    if not tensors:
        return operator.itemgetter(*values) if values else (lambda args: ())
    return lambda args: (
        tuple([args[i] for i in values]),
        tuple([(args[i].shape, args[i].stride()) for i in tensors]),
    )


class PerShape:
    """Calls ``gm`` (a symbolic-shape forward graph) through a static partition per concrete input shape.

    ``example_inputs`` (``gm``'s, as its compiler got them) say where its calls under dynamo's guards carry the
    symbols (:func:`key_positions`); without them every input is keyed (:func:`shape_key`). ``marks`` are
    AOTAutograd's marks of the outputs' dynamic dims (``(output, dims)``), made here where its runtime wrapper,
    which would make them, is skipped (:func:`gensorage.torch.backend.runtime_wrapper_marks`).
    """

    def __init__(
        self,
        gm: fx.GraphModule,
        partition: Callable[[fx.GraphModule], Callable[..., Any]],
        report: Report,
        example_inputs: Sequence[Any] | None = None,
        marks: Sequence[tuple[int, set[int]]] = (),
    ) -> None:
        self.gm = gm
        self.partition = partition
        self.report = report
        self.graphs: dict[Any, Callable[..., Any]] = {}
        self._key = shape_key if example_inputs is None else _key_function(*key_positions(example_inputs))
        self.marks = tuple(marks)
        if self.marks:
            from torch._functorch._aot_autograd.runtime_wrappers import (
                mark_dynamo_propagated_dynamic_indices,
            )

            self._mark = mark_dynamo_propagated_dynamic_indices

    def __call__(self, *args: Any) -> Any:
        key = self._key(args)
        fn = self.graphs.get(key)
        if fn is None:
            fn = self.graphs[key] = self._specialise(args)
        out = fn(*args)
        for i, dims in self.marks:
            self._mark(out[i], dims)
        return out

    def _specialise(self, args: Sequence[Any]) -> Callable[..., Any]:
        shapes = [list(a.shape) for a in args if isinstance(a, torch.Tensor)]
        try:
            # FX's tracer marks a trace in a module global (``is_fx_symbolic_tracing``), restored after it: two
            # traces of two threads overlapping could leave it set for good. Dynamo's own traces hold its
            # compile lock; this one does too.
            with compile_lock:
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


__all__ = ["PerShape", "has_symbolic_shapes", "key_positions", "shape_key"]

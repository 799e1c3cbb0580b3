"""The dynamo backend: torch captures, gensorage takes the subgraphs it can express, torch runs the rest.

Dynamo hands the backend an FX graph of the model's torch calls; AOTAutograd turns it into a functional aten
graph (``view``, ``mm``, ``_softmax``, ``_scaled_dot_product_flash_attention_for_cpu``, ...) with static shapes.
Each aten node is tried alone against the lowering rules (:mod:`.lowering`); torch's capability-based partitioner
groups the supported nodes into the largest acyclic subgraphs, and each becomes a :class:`.GensorageSubgraph`.
Subgraphs of layout ops only (views, transposes) stay in torch: they compute nothing a kernel could speed up.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch.fx._lazy_graph_module import _LazyGraphModule
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase
from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

from gensorage.errors import UnsupportedOpError
from gensorage.program import Program, Tensor
from gensorage.torch.lowering import LAYOUT_RULES, Lowering, _target_name
from gensorage.torch.per_shape import PerShape, has_symbolic_shapes
from gensorage.torch.report import Report, first_line
from gensorage.torch.subgraph import GensorageSubgraph, Options

PREFIX = "gensorage_"


def why_unsupported(node: fx.Node) -> str | None:
    """None when ``node`` lowers on its own (its tensor arguments as inputs), else the one-line reason."""
    try:
        Lowering(Program(name="probe")).lower(node)
    except UnsupportedOpError as exc:
        return str(exc).removeprefix(f"{node.name}: ")
    return None


class _Supported(OperatorSupportBase):
    def __init__(self, reasons: Mapping[fx.Node, str | None]) -> None:
        self.reasons = reasons

    def is_node_supported(self, submodules: Mapping[str, torch.nn.Module], node: fx.Node) -> bool:
        return node.op == "call_function" and self.reasons.get(node) is None


def unchanged_outputs(nodes: Sequence[fx.Node]) -> list[fx.Node]:
    """The nodes of a partition (in graph order) whose value leaves it as one of its inputs unchanged
    (``x.clone()`` returned, or saved for backward as a ``detach``): a Program cannot output its own input, and
    the whole subgraph stayed in torch for it. None found where the partition does not lower as a whole (its
    subgraph then says why)."""
    inside = set(nodes)
    if not any(_target_name(n) in LAYOUT_RULES and any(u not in inside for u in n.users) for n in nodes):
        return []  # only a layout rule passes a value on unchanged: none leaves, nothing to lower (~1-5 ms)
    lw = Lowering(Program(name="probe"))
    lw.boundary = list(dict.fromkeys(a for n in nodes for a in n.all_input_nodes if a not in inside))
    found = []
    try:
        for a in lw.boundary:
            lw.value(a)
        for n in nodes:
            value = lw.lower(n)
            if (
                isinstance(value, Tensor)
                and lw.p.nodes[value.id].is_input
                and any(u not in inside for u in n.users)
            ):
                found.append(n)
    except UnsupportedOpError:
        return []
    return found


def _view_base(node: fx.Node) -> fx.Node | None:
    """The value ``node``'s result is a view of in eager torch (its schema's returns alias an argument, a part of
    a ``split`` through ``getitem``), None when it is a new tensor."""
    if node.op != "call_function":
        return None
    if node.target is operator.getitem:
        source = node.args[0]
        return _view_base(source) and source if isinstance(source, fx.Node) else None
    schema = getattr(node.target, "_schema", None)
    alias = schema.returns[0].alias_info if schema is not None and schema.returns else None
    base = node.args[0] if node.args else None
    return base if alias is not None and not alias.is_write and isinstance(base, fx.Node) else None


def aliased_outputs(gm: fx.GraphModule) -> list[fx.Node]:
    """The views by which ``gm``'s outputs alias one another (``y`` and ``y.t()`` returned, or two slices of one
    value): in eager torch a write to one shows in the other, where a kernel's output would be a new tensor.
    With grad mode off AOTAutograd leaves such aliases to the compiled graph, so these views stay in torch,
    taken from their base. Views of the graph's inputs are left out: AOTAutograd makes those from the inputs."""
    (results,) = next(iter(gm.graph.find_nodes(op="output"))).args
    outputs: dict[fx.Node, list[fx.Node]] = {}  # each base: the outputs that are it or a view of it
    views: dict[fx.Node, list[fx.Node]] = {}  # and the views between them
    for out in dict.fromkeys(r for r in results if isinstance(r, fx.Node)):
        node, chain = out, []
        while (base := _view_base(node)) is not None:
            chain.append(node)
            node = base
        outputs.setdefault(node, []).append(out)
        views.setdefault(node, []).extend(chain)
    shared = [b for b, outs in outputs.items() if len(outs) > 1 and b.op != "placeholder"]
    return list(dict.fromkeys(v for b in shared for v in views[b]))


def partition(gm: fx.GraphModule, options: Options, report: Report) -> fx.GraphModule:
    """``gm`` with its supported subgraphs replaced by :class:`GensorageSubgraph` modules."""
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    reasons = {n: why_unsupported(n) for n in calls}
    for n in aliased_outputs(gm):
        reasons[n] = "an output that is a view of another output (they share memory, as in eager torch)"
    proposed = CapabilityBasedPartitioner(gm, _Supported(reasons), allows_single_node_partition=True)
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    parts = []
    for part in proposed.propose_partitions():
        nodes = sorted(part.nodes, key=order.__getitem__)
        if all(_target_name(n) in LAYOUT_RULES for n in nodes):
            continue
        # each reads only the partition's inputs, so it runs in torch before it; one it read inside may now leave
        while unchanged := unchanged_outputs(nodes):
            for n in unchanged:
                reasons[n] = "an input passed on unchanged (torch's copy of it)"
                nodes.remove(n)
        if any(_target_name(n) not in LAYOUT_RULES for n in nodes):
            parts.append(dict.fromkeys(nodes))
    taken = {n for part in parts for n in part}
    torch_reasons = {n.name: reasons[n] or "layout only, no computation" for n in calls if n not in taken}
    report.graph(len(calls), len(taken), torch_reasons)  # type: ignore[arg-type]
    fused = fuse_by_partitions(gm, parts, prefix=PREFIX, always_return_tuple=True)
    first = report.graphs
    for name, sub in list(fused.named_children()):
        if name.startswith(PREFIX) and isinstance(sub, fx.GraphModule):
            label = f"graph {first} {name.removeprefix(PREFIX).join(('subgraph ', ''))}"
            setattr(fused, name, GensorageSubgraph(sub, label, options, report))
    fused.recompile()
    return fused


def _in_torch(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
    return gm


def make_backend(options: Options, report: Report) -> Callable[..., Any]:
    """A dynamo backend (``fn(gm, example_inputs)``) for ``options``, reporting into ``report``.

    The forward (inference) graph is partitioned (one captured with symbolic shapes at each call's shapes:
    :class:`.PerShape`); a backward graph, if autograd asks for one, runs in torch.
    """

    def partitioned(gm: fx.GraphModule) -> Callable[..., Any]:
        try:
            fused = partition(gm, options, report)
            # its forward, called straight: GraphModule.__call__ adds nn.Module's hook checks and an error
            # wrapper (~2 µs a call) to a module nobody else holds or hooks. A lazily recompiled module's
            # forward would call the module: its code is generated now.
            if isinstance(fused, _LazyGraphModule):
                fused.real_recompile()
            return fused.forward
        except Exception as exc:  # a lowering or partitioning bug of ours: the graph runs in torch, right
            report.add(f"graph {report.graphs + 1} runs in torch, partitioning failed: {first_line(exc)}")
            return gm

    def forward_compiler(
        gm: fx.GraphModule, example_inputs: Sequence[Any], marks: Sequence[tuple[int, set[int]]] = ()
    ) -> Callable[..., Any]:
        if has_symbolic_shapes(example_inputs):  # no size is known: partition at each call's shapes
            return PerShape(gm, partitioned, report, example_inputs, marks)
        return partitioned(gm)

    def backend(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        # dynamo guards the grad mode and autocast state it captured under: they hold at every call
        ambient = torch.is_grad_enabled() or torch._C._is_any_autocast_enabled()
        bare: list[Callable[..., Any]] = []

        def inference_compiler(fw: fx.GraphModule, inputs: Sequence[Any]) -> Callable[..., Any]:
            marks = None if ambient else runtime_wrapper_marks(fw, example_inputs)
            if marks and not has_symbolic_shapes(inputs):  # only a PerShape graph makes the marks itself
                marks = None
            compiled = forward_compiler(fw, inputs, marks or ())
            if marks is not None:
                bare.append(compiled)
            return make_boxed_func(compiled)

        # AOTAutograd calls its compilers' results with one list of arguments (boxed), and wraps (with a
        # UserWarning) any that does not say it takes one
        wrapped = aot_autograd(
            fw_compiler=lambda fw, inputs: make_boxed_func(forward_compiler(fw, inputs)),
            bw_compiler=lambda bw, inputs: make_boxed_func(_in_torch(bw, inputs)),
            inference_compiler=inference_compiler,
        )(gm, example_inputs)
        # AOTAutograd's runtime wrapper costs ~3 µs a call; where it would only call the graph, dynamo calls
        # the graph itself (never traced, as dynamo's own backends leave a compiled graph)
        return torch._dynamo.disable(bare[0], reason="a compiled graph") if bare else wrapped

    return backend


def runtime_wrapper_marks(
    fw: fx.GraphModule, example_inputs: Sequence[Any]
) -> tuple[tuple[int, set[int]], ...] | None:
    """What AOTAutograd's runtime wrapper would do, for the inference graph ``fw`` it is compiling (grad mode
    and autocast off) from a dynamo graph of ``example_inputs``, besides calling ``fw`` on those arguments and
    returning its outputs: None when it would do more than mark outputs' dynamic dims, else those marks
    (``(output, dims)``, none for a graph of static shapes).

    The wrapper does no more where ``fw`` takes the arguments as they are (plain tensors and the integers of
    symbolic sizes, no duplicate merged, no parameter or effect token added), mutates no input (``copy_`` back,
    ``set_``), returns no alias of an input or of another output (views regenerated), and changes no grad mode
    or RNG state on the way out. An output's dynamic dims (a graph with symbolic shapes) are marked for dynamo
    (``_dynamo_propagated_dynamic_indices``: a later graph that takes the output treats them as dynamic), with
    no guard on them."""
    try:
        return _plain_inference(fw, example_inputs)
    except (
        ImportError,
        AttributeError,
    ):  # AOTAutograd's private metadata moved (another torch): keep the wrapper
        return None


def _plain_inference(
    fw: fx.GraphModule, example_inputs: Sequence[Any]
) -> tuple[tuple[int, set[int]], ...] | None:
    from torch._functorch._aot_autograd.runtime_wrappers import (  # noqa: F401  (PerShape's marks)
        mark_dynamo_propagated_dynamic_indices,
    )
    from torch._functorch._aot_autograd.schemas import OutputType, PlainTensorMeta
    from torch._guards import TracingContext

    context = TracingContext.try_get()
    meta = context.fw_metadata if context is not None else None
    if meta is None or len(fw.graph.find_nodes(op="placeholder")) != len(example_inputs):
        return None
    plain = (
        all(type(x) in (torch.Tensor, torch.nn.Parameter, torch.SymInt) for x in example_inputs)
        and all(
            isinstance(m, PlainTensorMeta) and m.unwrapped_idx == i
            for i, m in enumerate(meta.subclass_inp_meta)
        )
        and not any(
            i.mutates_data or i.mutates_metadata or i.mutates_storage_metadata for i in meta.input_info
        )
        and all(o.output_type == OutputType.non_alias for o in meta.output_info)
        and meta.num_intermediate_bases == 0
        and not meta.tokens
        and not meta.is_rng_op_functionalized
        and meta.grad_enabled_mutation is None
    )
    if not plain:
        return None
    if not meta.dynamic_outputs:
        return ()
    # as the wrapper's epilogue marks them: every output with dims recorded, an empty set included
    return tuple(
        (i, set(o.dynamic_dims)) for i, o in enumerate(meta.output_info) if o.dynamic_dims is not None
    )


_REGISTERED_REPORT = Report()


def gensorage_backend(
    gm: fx.GraphModule, example_inputs: Sequence[Any], options: Mapping[str, Any] | None = None
) -> Callable[..., Any]:
    """``torch.compile(model, backend="gensorage", options={"hw": ..., "mode": ...})``."""
    opts = Options(**dict(options or {}))  # unknown options: TypeError naming them, before any fallback
    report = _REGISTERED_REPORT if not opts.explain else Report(echo=True)
    from torch._dynamo.exc import RestartAnalysis

    try:
        return make_backend(opts, report)(gm, example_inputs)  # type: ignore[no-any-return]
    except RestartAnalysis:  # dynamo's signal to trace the frame again (a scalar made a tensor)
        raise
    except Exception as exc:  # capture (AOTAutograd) failed on this graph: torch runs it as captured
        report.add(f"graph runs in torch, gensorage's backend failed: {first_line(exc)}")
        return gm


__all__ = [
    "PREFIX",
    "aliased_outputs",
    "gensorage_backend",
    "make_backend",
    "partition",
    "runtime_wrapper_marks",
    "unchanged_outputs",
    "why_unsupported",
]

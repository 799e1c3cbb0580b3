"""Tensor programs: the user's computation as a DAG of :mod:`gensorage.opset` operators.

A :class:`Program` is built op by op; every op's shapes and dtypes are checked as it is added (shape inference
comes from :func:`gensorage.opset.infer_shape`, semantics from :func:`gensorage.opset.apply`), so a program that
exists is well formed. Tensor ids are node indices: ``p.nodes[t.id]`` is the node that produced ``t``.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from gensorage import opset
from gensorage.arith import Arith, Float64Arith
from gensorage.errors import ProgramError
from gensorage.opset import Attrs, Op, Shape
from gensorage.program.checks import (
    attr_text,
    check_dim,
    check_shape,
    finite_number,
    is_number,
    one_input,
    only_attrs,
    shape_str,
)

V = TypeVar("V")

DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32", "float64")
DEFAULT_DTYPE = "float16"

_owner_ids = itertools.count(1)


@dataclass(frozen=True, slots=True)
class Tensor:
    """A handle to one value of a program (an input or an op result).

    ``owner`` identifies the program that made it, so a handle cannot be used in another program by mistake.
    """

    id: int
    name: str
    shape: Shape
    dtype: str
    owner: int = field(default=0, repr=False)

    @property
    def ndim(self) -> int:
        return len(self.shape)


@dataclass(frozen=True, slots=True)
class Node:
    """One program node; ``op`` is None for an input (then ``inputs`` and ``attrs`` are empty)."""

    id: int
    op: Op | None
    inputs: tuple[int, ...]
    attrs: Attrs
    shape: Shape
    dtype: str
    name: str

    @property
    def is_input(self) -> bool:
        return self.op is None


class Program:
    """A tensor program under construction (and, once it has outputs, ready to run or optimise).

    Parameters
    ----------
    name : str
        A label for messages and files; not part of :meth:`key`.

    Examples
    --------
    >>> p = Program(name="rmsnorm")
    >>> x = p.input("X", (16, 64))
    >>> s = p.sum(p.mul(x, x), dim=1)
    >>> p.output(p.div(x, p.sqrt(p.scale(s, 1 / 64))))
    """

    def __init__(self, name: str = "program") -> None:
        self.name = name
        #: Integer parameters the program was instantiated with (set by the text-format loader).
        self.params: dict[str, int] = {}
        self._owner = next(_owner_ids)
        self._nodes: list[Node] = []
        self._names: set[str] = set()
        self._reserved: set[str] = set()  # names generated ones must avoid (claimed later by a parser)
        self._inputs: list[int] = []
        self._outputs: list[int] = []

    # ------------------------------------------------------------------ introspection

    @property
    def nodes(self) -> tuple[Node, ...]:
        """Every node in creation order, inputs included; ``nodes[i].id == i``."""
        return tuple(self._nodes)

    @property
    def inputs(self) -> list[Tensor]:
        """The input tensors in declaration order."""
        return [self._tensor(i) for i in self._inputs]

    @property
    def outputs(self) -> list[Tensor]:
        """The output tensors in the order :meth:`output` was called."""
        return [self._tensor(i) for i in self._outputs]

    def tensor(self, ref: int | str) -> Tensor:
        """The tensor with node id ``ref`` or name ``ref``; an unknown one is a :class:`ProgramError`."""
        if isinstance(ref, str):
            for n in self._nodes:
                if n.name == ref:
                    return self._tensor(n.id)
            raise ProgramError(f"program '{self.name}': no tensor named '{ref}'")
        if not 0 <= ref < len(self._nodes):
            raise ProgramError(f"program '{self.name}': no tensor with id {ref}")
        return self._tensor(ref)

    def live_ids(self) -> list[int]:
        """Ids of the nodes the outputs depend on (inputs always included), in creation order."""
        return sorted(self.canonical_order())

    def _tensor(self, i: int) -> Tensor:
        n = self._nodes[i]
        return Tensor(n.id, n.name, n.shape, n.dtype, self._owner)

    def __repr__(self) -> str:
        return (
            f"Program({self.name!r}, inputs={len(self._inputs)}, nodes={len(self._nodes)}, "
            f"outputs={len(self._outputs)})"
        )

    def describe(self) -> str:
        """A human-readable listing: one line per node, then the outputs."""
        lines = [f"program {self.name}"]
        for n in self._nodes:
            if n.op is None:
                lines.append(f"  input  {n.name}: {shape_str(n.shape)} {n.dtype}")
                continue
            args = ", ".join(self._nodes[i].name for i in n.inputs)
            attrs = "".join(f", {k}={attr_text(v)}" for k, v in n.attrs)
            lines.append(f"  {n.name} = {n.op.value}({args}{attrs}): {shape_str(n.shape)} {n.dtype}")
        lines.append("  output " + ", ".join(self._nodes[i].name for i in self._outputs))
        return "\n".join(lines)

    # ------------------------------------------------------------------ building

    def input(self, name: str, shape: Sequence[int] | int, dtype: str = DEFAULT_DTYPE) -> Tensor:
        """Declare an input tensor; names must be unique within the program."""
        shape_t = check_shape(f"input '{name}'", shape)
        if dtype not in DTYPES:
            raise ProgramError(
                f"input '{name}': unsupported dtype {dtype!r} (supported: {', '.join(DTYPES)})"
            )
        t = self._add(None, (), (), shape_t, dtype, name, what=f"input '{name}'")
        self._inputs.append(t.id)
        return t

    def output(self, t: Tensor) -> Tensor:
        """Mark ``t`` as a program output (outputs are returned in the order they are marked)."""
        self._own(t, "output")
        if t.id in self._outputs:
            raise ProgramError(f"output: tensor '{t.name}' is already an output")
        self._outputs.append(t.id)
        return t

    def matmul(self, a: Tensor, b: Tensor, name: str | None = None) -> Tensor:
        """``a @ b``: last two dims multiply, leading (batch) dims broadcast."""
        return self._op(Op.MATMUL, [a, b], {}, name)

    def add(self, a: Tensor | float, b: Tensor | float, name: str | None = None) -> Tensor:
        """Elementwise sum; with one Python number operand it is :meth:`add_scalar`."""
        if is_number(b) and isinstance(a, Tensor):
            return self.add_scalar(a, b, name=name)  # type: ignore[arg-type]
        if is_number(a) and isinstance(b, Tensor):
            return self.add_scalar(b, a, name=name)  # type: ignore[arg-type]
        return self._op(Op.ADD, [a, b], {}, name)  # type: ignore[list-item]

    def sub(self, a: Tensor | float, b: Tensor | float, name: str | None = None) -> Tensor:
        """Elementwise difference; ``x - c`` is ``add_scalar(x, -c)``, ``c - x`` is ``add_scalar(-x, c)``."""
        if is_number(b) and isinstance(a, Tensor):
            return self.add_scalar(a, -finite_number("sub", b), name=name)
        if is_number(a) and isinstance(b, Tensor):
            return self.add_scalar(self.scale(b, -1.0), a, name=name)  # type: ignore[arg-type]
        return self._op(Op.SUB, [a, b], {}, name)  # type: ignore[list-item]

    def add_scalar(self, x: Tensor, value: float, name: str | None = None) -> Tensor:
        """``x + value`` for a finite scalar constant ``value`` (stored as a float, -0.0 as 0.0)."""
        self._own(x, "add_scalar")
        return self._op(Op.ADD_SCALAR, [x], {"value": finite_number("add_scalar", value) + 0.0}, name)

    def mul(self, a: Tensor | float, b: Tensor | float, name: str | None = None) -> Tensor:
        """Elementwise product; with one Python number operand it is :meth:`scale`."""
        if is_number(b) and isinstance(a, Tensor):
            return self.scale(a, b, name=name)  # type: ignore[arg-type]
        if is_number(a) and isinstance(b, Tensor):
            return self.scale(b, a, name=name)  # type: ignore[arg-type]
        return self._op(Op.MUL, [a, b], {}, name)  # type: ignore[list-item]

    def div(self, a: Tensor, b: Tensor, name: str | None = None) -> Tensor:
        return self._op(Op.DIV, [a, b], {}, name)

    def exp(self, x: Tensor, name: str | None = None) -> Tensor:
        return self._op(Op.EXP, [x], {}, name)

    def sqrt(self, x: Tensor, name: str | None = None) -> Tensor:
        return self._op(Op.SQRT, [x], {}, name)

    def relu(self, x: Tensor, name: str | None = None) -> Tensor:
        return self._op(Op.RELU, [x], {}, name)

    def silu(self, x: Tensor, name: str | None = None) -> Tensor:
        return self._op(Op.SILU, [x], {}, name)

    def gelu(self, x: Tensor, name: str | None = None) -> Tensor:
        return self._op(Op.GELU, [x], {}, name)

    def tanh(self, x: Tensor, name: str | None = None) -> Tensor:
        return self._op(Op.TANH, [x], {}, name)

    def log(self, x: Tensor, name: str | None = None) -> Tensor:
        """Natural log: NaN below 0, ``-inf`` at 0 (as torch)."""
        return self._op(Op.LOG, [x], {}, name)

    def clamp(
        self, x: Tensor, min: float | None = None, max: float | None = None, name: str | None = None
    ) -> Tensor:
        """``x`` limited to ``[min, max]`` (finite scalars, either absent, ``min <= max``); NaN stays NaN."""
        bounds = {k: v for k, v in (("min", min), ("max", max)) if v is not None}
        for k, v in bounds.items():
            if not is_number(v):
                raise ProgramError(f"clamp: '{k}' must be a finite number or absent, got {v!r}")
        return self._op(Op.CLAMP, [x], {k: float(v) + 0.0 for k, v in bounds.items()}, name)

    def scale(self, x: Tensor, factor: float, name: str | None = None) -> Tensor:
        """``x * factor`` for a scalar constant ``factor`` (stored as a float)."""
        if not is_number(factor) or not math.isfinite(float(factor)):
            raise ProgramError(f"scale: factor must be a finite number, got {factor!r}")
        # -0.0 is stored as 0.0: they scale alike (up to the sign of zeros) and the text format reads "-0.0" as
        # the negation of the exact number 0, so only one of them can round-trip.
        return self._op(Op.SCALE, [x], {"factor": float(factor) + 0.0}, name)

    def sum(
        self, x: Tensor, dim: int, keepdim: bool = True, group: int | None = None, name: str | None = None
    ) -> Tensor:
        """Sum along ``dim``; with ``group=g`` every ``g`` consecutive elements are summed instead."""
        self._own(x, "sum")
        dim_n = check_dim(Op.SUM, dim, x.ndim, [x.shape])
        if not isinstance(keepdim, bool):
            raise ProgramError(f"sum: keepdim must be true or false, got {keepdim!r}")
        attrs: dict[str, Any] = {"dim": dim_n, "keepdim": keepdim}
        if isinstance(group, np.integer):
            group = int(group)  # keep attributes plain Python values so keys and dumps are canonical
        if group is not None and group != x.shape[dim_n]:
            attrs["group"] = group  # a group equal to the dim size is a full reduction: store it as one
        return self._op(Op.SUM, [x], attrs, name)

    def max(self, x: Tensor, dim: int, keepdim: bool = False, name: str | None = None) -> Tensor:
        """Maximum along ``dim`` (``keepdim=False`` drops the dim, like ``torch.amax``)."""
        self._own(x, "max")
        dim_n = check_dim(Op.MAX, dim, x.ndim, [x.shape])
        if not isinstance(keepdim, bool):
            raise ProgramError(f"max: keepdim must be true or false, got {keepdim!r}")
        return self._op(Op.MAX, [x], {"dim": dim_n, "keepdim": keepdim}, name)

    def transpose(self, x: Tensor, dim0: int, dim1: int, name: str | None = None) -> Tensor:
        """Swap dims ``dim0`` and ``dim1`` (negative dims count from the end; stored normalised)."""
        self._own(x, "transpose")
        d0 = check_dim(Op.TRANSPOSE, dim0, x.ndim, [x.shape])
        d1 = check_dim(Op.TRANSPOSE, dim1, x.ndim, [x.shape])
        return self._op(Op.TRANSPOSE, [x], {"dim0": d0, "dim1": d1}, name)

    def slice(self, x: Tensor, dim: int, start: int, stop: int, name: str | None = None) -> Tensor:
        """``x[..., start:stop]`` along ``dim`` (step 1; bounds normalised as Python's; empty is an error)."""
        self._own(x, "slice")
        d = check_dim(Op.SLICE, dim, x.ndim, [x.shape])
        lo, hi = opset.slice_bounds(Op.SLICE, [x.shape], x.shape[d], start, stop)
        return self._op(Op.SLICE, [x], {"dim": d, "start": lo, "stop": hi}, name)

    def softmax(self, x: Tensor, dim: int, name: str | None = None) -> Tensor:
        """``exp(x - m) / Σ exp(x - m)`` along ``dim`` with ``m`` the row maximum (the stable form; no new op)."""
        self._own(x, "softmax")
        dim_n = check_dim("softmax", dim, x.ndim, [x.shape])
        e = self.exp(self.sub(x, self.max(x, dim_n, keepdim=True)))
        return self.div(e, self.sum(e, dim_n, keepdim=True), name=name)

    def rms_norm(self, x: Tensor, eps: float = 1e-6, dim: int = -1, name: str | None = None) -> Tensor:
        """``x / sqrt(mean(x·x, dim) + eps)`` (no weight; multiply by one after if the model has it)."""
        self._own(x, "rms_norm")
        dim_n = check_dim("rms_norm", dim, x.ndim, [x.shape])
        if not is_number(eps) or not math.isfinite(float(eps)) or eps < 0:
            raise ProgramError(f"rms_norm: eps must be a finite number >= 0, got {eps!r}")
        mean = self.scale(self.sum(self.mul(x, x), dim_n, keepdim=True), 1.0 / x.shape[dim_n])
        return self.div(x, self.sqrt(self.add_scalar(mean, float(eps))), name=name)

    def reshape(self, x: Tensor, shape: Sequence[int], name: str | None = None) -> Tensor:
        """Row-major reshape to ``shape`` (same element count)."""
        self._own(x, "reshape")
        return self._op(Op.RESHAPE, [x], {"shape": check_shape("reshape", shape)}, name)

    def repeat(self, x: Tensor, dim: int, times: int, name: str | None = None) -> Tensor:
        """Repeat each slice along ``dim`` ``times`` times consecutively (``numpy.repeat``)."""
        self._own(x, "repeat")
        dim_n = check_dim(Op.REPEAT, dim, x.ndim, [x.shape])
        if not isinstance(times, int | np.integer) or isinstance(times, bool):
            raise ProgramError(
                f"repeat: 'times' must be a positive integer, got {times!r} (input shape "
                f"{shape_str(x.shape)})"
            )
        return self._op(Op.REPEAT, [x], {"dim": dim_n, "times": int(times)}, name)

    def concat(self, parts: Sequence[Tensor], dim: int, name: str | None = None) -> Tensor:
        """Concatenate two or more tensors along ``dim``."""
        parts = list(parts)
        for t in parts:
            self._own(t, "concat")
        if len(parts) < 2:
            raise ProgramError(f"concat: needs at least 2 inputs, got {len(parts)}")
        dim_n = check_dim(Op.CONCAT, dim, parts[0].ndim, [t.shape for t in parts])
        return self._op(Op.CONCAT, parts, {"dim": dim_n}, name)

    def apply(
        self,
        op: Op | str,
        inputs: Sequence[Tensor],
        attrs: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> Tensor:
        """Add any op by name with keyword attributes (what the text parser uses)."""
        op = opset.parse_op(op) if isinstance(op, str) else op
        attrs = dict(attrs or {})
        match op:
            case Op.SUM:
                only_attrs(op, attrs, {"dim", "keepdim", "group"}, {"dim"})
                return self.sum(one_input(op, inputs), name=name, **attrs)
            case Op.RESHAPE | Op.REPEAT | Op.TRANSPOSE | Op.SLICE:  # every attribute required, passed by name
                need = set(opset.REQUIRED_ATTRS[op])
                only_attrs(op, attrs, need, need)
                return getattr(self, op.value)(one_input(op, inputs), name=name, **attrs)  # type: ignore[no-any-return]
            case Op.CONCAT:
                only_attrs(op, attrs, {"dim"}, {"dim"})
                return self.concat(inputs, attrs["dim"], name=name)
            case Op.SCALE:
                only_attrs(op, attrs, {"factor"}, {"factor"})
                return self.scale(one_input(op, inputs), attrs["factor"], name=name)
            case Op.ADD_SCALAR:
                only_attrs(op, attrs, {"value"}, {"value"})
                return self.add_scalar(one_input(op, inputs), attrs["value"], name=name)
            case Op.MAX:
                only_attrs(op, attrs, {"dim", "keepdim"}, {"dim"})
                return self.max(one_input(op, inputs), name=name, **attrs)
            case Op.CLAMP:
                only_attrs(op, attrs, {"min", "max"}, set())
                return self.clamp(one_input(op, inputs), name=name, **attrs)
            case _:
                only_attrs(op, attrs, set(), set())
                return self._op(op, list(inputs), {}, name)

    def _own(self, t: Any, what: str) -> None:
        if not isinstance(t, Tensor):
            raise ProgramError(f"{what}: expected a Tensor of program '{self.name}', got {type(t).__name__}")
        if t.owner != self._owner:
            raise ProgramError(f"{what}: tensor '{t.name}' {shape_str(t.shape)} belongs to another program")
        if not 0 <= t.id < len(self._nodes) or self._nodes[t.id].name != t.name:
            raise ProgramError(f"{what}: unknown tensor '{t.name}' (id {t.id})")

    def _op(self, op: Op, args: Sequence[Tensor], attrs: Mapping[str, Any], name: str | None) -> Tensor:
        for t in args:
            self._own(t, op.value)
        shapes = [t.shape for t in args]
        dtypes = sorted({t.dtype for t in args})
        if len(dtypes) > 1:
            shown = ", ".join(f"{shape_str(t.shape)} {t.dtype}" for t in args)
            raise ProgramError(f"{op.value}: inputs mix dtypes {', '.join(dtypes)} (inputs {shown})")
        frozen = opset.freeze_attrs(attrs)
        shape = opset.infer_shape(op, shapes, frozen)
        return self._add(op, tuple(t.id for t in args), frozen, shape, args[0].dtype, name, what=op.value)

    def _add(
        self,
        op: Op | None,
        inputs: tuple[int, ...],
        attrs: Attrs,
        shape: Shape,
        dtype: str,
        name: str | None,
        what: str,
    ) -> Tensor:
        node_id = len(self._nodes)
        if name is None:
            name = self._fresh_name(node_id)
        elif not isinstance(name, str) or not name:
            raise ProgramError(f"{what}: tensor name must be a non-empty string, got {name!r}")
        elif name in self._names:
            raise ProgramError(f"{what}: duplicate tensor name '{name}'")
        self._names.add(name)
        self._nodes.append(Node(node_id, op, inputs, attrs, shape, dtype, name))
        return self._tensor(node_id)

    def _reserve(self, names: Iterable[str]) -> None:
        """Keep generated tensor names clear of ``names`` (which the caller will give tensors later)."""
        self._reserved.update(names)

    def _fresh_name(self, node_id: int) -> str:
        name = f"t{node_id}"
        k = 1
        while name in self._names or name in self._reserved:
            name = f"t{node_id}_{k}"
            k += 1
        return name

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, arith: Arith[V], input_values: Sequence[V] | Mapping[str, V]) -> list[V]:
        """Values of the outputs computed in ``arith``, given one value per input.

        ``input_values`` is a sequence in :attr:`inputs` order or a mapping from input name. Only the nodes the
        outputs depend on are computed.
        """
        self._require_outputs("evaluate")
        values: dict[int, V] = dict(zip(self._inputs, self._input_list(input_values), strict=True))
        for i in values:
            got = arith.shape(values[i])
            if tuple(got) != self._nodes[i].shape:
                n = self._nodes[i]
                raise ProgramError(
                    f"program '{self.name}': input '{n.name}' has shape {shape_str(got)}, "
                    f"expected {shape_str(n.shape)}"
                )
        for i in self.live_ids():
            n = self._nodes[i]
            if n.op is not None:
                values[i] = opset.apply(n.op, arith, [values[j] for j in n.inputs], n.attrs)
        return [values[i] for i in self._outputs]

    def _input_list(self, input_values: Sequence[V] | Mapping[str, V]) -> list[V]:
        names = [self._nodes[i].name for i in self._inputs]
        if isinstance(input_values, Mapping):
            missing = [n for n in names if n not in input_values]
            extra = [k for k in input_values if k not in names]
            if missing or extra:
                raise ProgramError(
                    f"program '{self.name}': input values missing {missing or 'none'}, unknown {extra or 'none'}"
                )
            return [input_values[n] for n in names]
        values = list(input_values)
        if len(values) != len(names):
            raise ProgramError(
                f"program '{self.name}' takes {len(names)} input(s) ({', '.join(names)}), got {len(values)}"
            )
        return values

    def run(self, *arrays: Any) -> list[np.ndarray]:
        """Run in float64 numpy: one array per input in :attr:`inputs` order; returns the outputs."""
        self._require_outputs("run")
        names = [self._nodes[i].name for i in self._inputs]
        if len(arrays) != len(names):
            raise ProgramError(
                f"program '{self.name}' takes {len(names)} input(s) ({', '.join(names)}), got {len(arrays)}"
            )
        converted: list[np.ndarray] = []
        for i, a in zip(self._inputs, arrays, strict=True):
            n = self._nodes[i]
            try:
                arr = np.asarray(a, dtype=np.float64)
            except (TypeError, ValueError) as exc:
                raise ProgramError(f"program '{self.name}': input '{n.name}' is not numeric: {exc}") from None
            if arr.shape != n.shape:
                raise ProgramError(
                    f"program '{self.name}': input '{n.name}' has shape {shape_str(arr.shape)}, "
                    f"expected {shape_str(n.shape)}"
                )
            converted.append(arr)
        return self.evaluate(Float64Arith(), converted)

    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Standard-normal float64 arrays, one per input (for smoke runs and tests)."""
        rng = np.random.default_rng(seed)
        return [rng.standard_normal(t.shape) for t in self.inputs]

    def _require_outputs(self, what: str) -> None:
        if not self._outputs:
            raise ProgramError(
                f"program '{self.name}' has no outputs: cannot {what} it (mark one with output)"
            )

    # ------------------------------------------------------------------ identity

    def key(self) -> str:
        """A stable structural hash: ops, attributes, shapes, dtypes and topology, not names or node order.

        Only the inputs and the nodes the outputs depend on count, numbered canonically (inputs in declaration
        order, then a depth-first walk from the outputs in order), so two programs computing the same DAG hash
        alike however they were built.
        """
        return self._hash(concrete=True)

    def structure_key(self) -> str:
        """:meth:`key` without concrete sizes: ranks, ops, dims and dtypes only.

        Shape-valued attributes (reshape target, sum group, repeat count) and scale factors (which usually
        derive from a size, like 1/sqrt(d)) are reduced to what the structure needs, so the same program
        instantiated at different sizes shares one structure key.
        """
        return self._hash(concrete=False)

    def canonical_order(self) -> list[int]:
        """The ids of the inputs and of every node the outputs depend on, in the order :meth:`key` numbers them:
        inputs in declaration order, then a depth-first post-order walk from the outputs in order. Two programs
        with equal (structure) keys list corresponding nodes at equal positions."""
        order: list[int] = list(self._inputs)
        seen = set(order)
        for out in self._outputs:
            stack: list[tuple[int, bool]] = [(out, False)]
            while stack:
                i, expanded = stack.pop()
                if i in seen:
                    continue
                if expanded:
                    seen.add(i)
                    order.append(i)
                    continue
                stack.append((i, True))
                stack.extend((j, False) for j in reversed(self._nodes[i].inputs))
        return order

    def _hash(self, concrete: bool) -> str:
        order = self.canonical_order()
        index = {node_id: k for k, node_id in enumerate(order)}
        parts: list[str] = []
        for i in order:
            n = self._nodes[i]
            shape = repr(n.shape) if concrete else f"rank{len(n.shape)}"
            if n.op is None:
                parts.append(f"in:{shape}:{n.dtype}")
            else:
                attrs = n.attrs if concrete else _abstract_attrs(n.op, n.attrs)
                args = ",".join(str(index[j]) for j in n.inputs)
                parts.append(f"{n.op.value}({args}){attrs!r}:{shape}:{n.dtype}")
        parts.append("out:" + ",".join(str(index[i]) for i in self._outputs))
        return hashlib.sha256(";".join(parts).encode()).hexdigest()[:32]


def _abstract_attrs(op: Op, attrs: Attrs) -> Attrs:
    out: list[tuple[str, Any]] = []
    for k, v in attrs:
        if op is Op.RESHAPE and k == "shape":
            out.append((k, len(v)))
        elif (op is Op.SUM and k == "group") or (op is Op.REPEAT and k == "times") or (op is Op.SCALE):
            out.append((k, "*"))
        else:
            out.append((k, v))
    return tuple(out)

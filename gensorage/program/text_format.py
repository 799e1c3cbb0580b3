"""The ``.gsp`` ("gensorage program") text form of a :class:`~gensorage.program.Program`.

A file is parsed as data by the tokenizer and recursive-descent parser of :mod:`.gsp_syntax` (nothing is ever evaluated as
Python). Grammar, one statement per line (a line break inside brackets continues the statement)::

    # comment
    program NAME                          # optional; defaults to the file's stem
    param NAME = EXPR                     # integer parameter; later params and dims may use it
    input NAME [DIM, DIM, ...] [DTYPE]    # DTYPE: float16 (default), bfloat16, float32, float64
    NAME = EXPR                           # a tensor computation
    output NAME [, NAME ...]

An expression is a number, a parameter, a tensor name, a call ``op(arg, ..., key=value)``, a list
``[e, ...]``, or ``+ - * /`` and unary minus on those. Numbers are exact rationals until a ``sqrt`` or a float
needs them as floats, so a dim such as ``d/8`` must divide exactly. Between tensors ``+ - * /`` are the
elementwise ops; a tensor times (or divided by) a number is ``scale``, a tensor plus (or minus) a number is
``add_scalar`` (``x + 1e-6``, ``add(x, 1e-6)``). Op arguments are the tensors first, then attributes by position
(``sum(x, 2)``, ``max(x, 1, true)``, ``transpose(x, 0, 1)``, ``repeat(k, 0, 8)``, ``scale(s, 1/d)``,
``reshape(x, [a, b])``) or by keyword (``dim=``, ``keepdim=``, ``group=``, ``times=``, ``factor=``, ``value=``,
``dim0=``, ``dim1=``, ``shape=``, ``min=``, ``max=``: ``clamp(x, 0, 6)``, ``clamp(x, max=1)``); ``concat`` takes its tensors positionally or as a list. ``sqrt`` of a number is
a number. Two composites expand to several ops: ``softmax(x, dim=..)`` (the stable form, with the row maximum
subtracted) and ``rms_norm(x, eps=.., dim=-1)``; a written program lists the ops they expand to.

Errors are :class:`~gensorage.errors.ConfigError` (syntax, names, parameters) or the builder's
:class:`~gensorage.errors.ProgramError` / :class:`~gensorage.errors.UnsupportedOpError` (shapes, ops), each
with a one-line ``file:line:`` message.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any

from gensorage import opset
from gensorage.errors import ConfigError, GensorageError
from gensorage.opset import Op
from gensorage.program.checks import attr_text
from gensorage.program.gsp_syntax import (
    IDENT,
    KEYWORDS,
    BinOp,
    Call,
    Expr,
    ListExpr,
    Name,
    Neg,
    Num,
    Number,
    Parser,
    Statement,
    tokenize,
)
from gensorage.program.program import DEFAULT_DTYPE, DTYPES, Program, Tensor

# Attributes an op takes by position, after its tensor arguments.
POSITIONAL_ATTRS: Mapping[Op, tuple[str, ...]] = {
    Op.SUM: ("dim", "keepdim", "group"),
    Op.MAX: ("dim", "keepdim"),
    Op.TRANSPOSE: ("dim0", "dim1"),
    Op.SLICE: ("dim", "start", "stop"),
    Op.ADD_SCALAR: ("value",),
    Op.REPEAT: ("dim", "times"),
    Op.CONCAT: ("dim",),
    Op.SCALE: ("factor",),
    Op.RESHAPE: ("shape",),
    Op.CLAMP: ("min", "max"),
}

#: Calls that expand to several ops (Program methods), with their attributes by position after the tensor.
COMPOSITES: Mapping[str, tuple[str, ...]] = {"softmax": ("dim",), "rms_norm": ("eps", "dim")}
#: Attributes that are real numbers (every other numeric attribute is an integer).
REAL_ATTRS = frozenset({"factor", "value", "eps", "min", "max"})

Value = Tensor | Number | bool | list[Any]

# ---------------------------------------------------------------------------------------------- evaluation


class _Builder:
    """Executes parsed statements against a :class:`Program`."""

    def __init__(self, source: str, name: str, overrides: Mapping[str, int]) -> None:
        self.source = source
        self.program = Program(name=name)
        self.overrides = dict(overrides)
        self.params: dict[str, int] = {}
        self.tensors: dict[str, Tensor] = {}
        self.line = 0

    def error(self, msg: str, line: int | None = None) -> ConfigError:
        return ConfigError(f"{self.source}:{self.line if line is None else line}: {msg}")

    def run(self, stmts: list[Statement]) -> Program:
        # Names assigned anywhere in the file are off limits for generated (nested-call) names.
        self.program._reserve(s.name for s in stmts if s.kind in ("assign", "input"))
        for i, stmt in enumerate(stmts):
            self.line = stmt.line
            if stmt.kind == "program" and i != 0:
                raise self.error("'program' must be the first statement")
            try:
                self.execute(stmt)
            except ConfigError:
                raise
            except GensorageError as exc:  # builder errors: same class, with the location in front
                raise type(exc)(f"{self.source}:{stmt.line}: {exc}") from None
        unknown = sorted(set(self.overrides) - set(self.params))
        if unknown:
            known = ", ".join(self.params) or "none"
            raise ConfigError(f"{self.source}: unknown parameter(s) {', '.join(unknown)} (known: {known})")
        if not self.program.outputs:
            raise ConfigError(f"{self.source}:{self.line}: program has no 'output' statement")
        self.program.params = dict(self.params)
        return self.program

    def execute(self, stmt: Statement) -> None:
        match stmt.kind:
            case "program":
                self.program.name = stmt.name
            case "param":
                self.define_param(stmt)
            case "input":
                self.define_input(stmt)
            case "assign":
                self.define_tensor(stmt)
            case "output":
                for name in stmt.names:
                    if name not in self.tensors:
                        raise self.error(f"output: undefined tensor '{name}'")
                    self.program.output(self.tensors[name])

    def check_new_name(self, name: str) -> None:
        if name in self.params or name in self.tensors:
            raise self.error(f"duplicate name '{name}' (already defined)")

    def define_param(self, stmt: Statement) -> None:
        self.check_new_name(stmt.name)
        assert stmt.expr is not None
        if stmt.name in self.overrides:
            value = self.overrides[stmt.name]
            if not isinstance(value, int) or isinstance(value, bool):
                raise self.error(f"parameter '{stmt.name}' override must be an integer, got {value!r}")
        else:
            value = self.integer(self.number(stmt.expr), f"parameter '{stmt.name}'")
        self.params[stmt.name] = value

    def define_input(self, stmt: Statement) -> None:
        self.check_new_name(stmt.name)
        dims = []
        for d in stmt.dims:
            v = self.integer(self.number(d), f"dimension {_expr_text(d)} of input '{stmt.name}'")
            if v <= 0:
                raise self.error(
                    f"dimension {_expr_text(d)} of input '{stmt.name}' is {v}; dims must be positive"
                )
            dims.append(v)
        dtype = stmt.dtype or DEFAULT_DTYPE
        if dtype not in DTYPES:
            raise self.error(f"input '{stmt.name}': unknown dtype '{dtype}' (supported: {', '.join(DTYPES)})")
        self.tensors[stmt.name] = self.program.input(stmt.name, tuple(dims), dtype)

    def define_tensor(self, stmt: Statement) -> None:
        self.check_new_name(stmt.name)
        assert stmt.expr is not None
        value = self.eval(stmt.expr, stmt.name)
        if not isinstance(value, Tensor):
            raise self.error(
                f"'{stmt.name}' must be a tensor computation, got the number {_num_text(value)} "
                "(use 'param' for numbers)"
            )
        if value.name != stmt.name:
            raise self.error(
                f"'{stmt.name} = {_expr_text(stmt.expr)}' only renames a tensor; aliases are not supported"
            )
        self.tensors[stmt.name] = value

    # values

    def number(self, e: Expr) -> Number:
        v = self.eval(e, None)
        if isinstance(v, bool) or not isinstance(v, Fraction | float):
            raise self.error(f"expected a number, got {_kind(v)} in '{_expr_text(e)}'", e.line)
        return v

    def integer(self, v: Any, what: str) -> int:
        if isinstance(v, Fraction) and v.denominator == 1:
            return int(v)
        if isinstance(v, float) and v.is_integer():
            return int(v)
        raise self.error(f"{what} must be an integer, got {_num_text(v)}")

    def eval(self, e: Expr, name: str | None) -> Value:
        match e:
            case Num(value=value):
                return value
            case Name(id=ident):
                return self.lookup(ident, e.line)
            case ListExpr(items=items):
                return [self.eval(x, None) for x in items]
            case Neg(operand=operand):
                v = self.eval(operand, None)
                if isinstance(v, Tensor):
                    return self.program.scale(v, -1.0, name=name)
                return -self.arith_operand(v, "-", e.line)
            case BinOp():
                return self.binop(e, name)
            case Call():
                return self.call(e, name)
        raise AssertionError(e)

    def lookup(self, ident: str, line: int) -> Value:
        if ident in ("true", "false"):
            return ident == "true"
        if ident in self.params:
            return Fraction(self.params[ident])
        if ident in self.tensors:
            return self.tensors[ident]
        raise self.error(f"undefined name '{ident}'", line)

    def real(self, v: Value, op: str, line: int) -> float:
        """``v`` as a float; a number beyond float's range is an error naming it."""
        x = self.arith_operand(v, op, line)
        try:
            return float(x)
        except OverflowError:
            raise self.error(
                f"{op}: a number beyond the range of floats (it would be infinite)", line
            ) from None

    def arith_operand(self, v: Value, op: str, line: int) -> Number:
        if isinstance(v, bool) or not isinstance(v, Fraction | float):
            raise self.error(f"'{op}' cannot take {_kind(v)}", line)
        return v

    def binop(self, e: BinOp, name: str | None) -> Value:
        a = self.eval(e.left, None)
        b = self.eval(e.right, None)
        p = self.program
        if isinstance(a, Tensor) and isinstance(b, Tensor):
            method = {"+": p.add, "-": p.sub, "*": p.mul, "/": p.div}[e.op]
            return method(a, b, name=name)
        if isinstance(a, Tensor) or isinstance(b, Tensor):
            return self.tensor_number(e, a, b, name)
        x = self.arith_operand(a, e.op, e.line)
        y = self.arith_operand(b, e.op, e.line)
        if e.op == "/" and y == 0:
            raise self.error(f"division by zero in '{_expr_text(e)}'", e.line)
        if e.op == "+":
            return x + y
        if e.op == "-":
            return x - y
        return x * y if e.op == "*" else x / y

    def tensor_number(self, e: BinOp, a: Value, b: Value, name: str | None) -> Tensor:
        if e.op in ("+", "-"):
            c = self.real(b if isinstance(a, Tensor) else a, e.op, e.line)
            method = self.program.add if e.op == "+" else self.program.sub
            return method(a, c, name=name) if isinstance(a, Tensor) else method(c, b, name=name)  # type: ignore[arg-type]
        if e.op == "*":
            t, f = (a, b) if isinstance(a, Tensor) else (b, a)
            return self.program.scale(t, self.real(f, "*", e.line), name=name)  # type: ignore[arg-type]
        if e.op == "/" and isinstance(a, Tensor):
            k = self.arith_operand(b, "/", e.line)
            if k == 0:
                raise self.error(f"division by zero in '{_expr_text(e)}'", e.line)
            return self.program.scale(a, float(1 / k), name=name)
        raise self.error(
            f"'{_expr_text(e)}': a number cannot be divided by a tensor (there is no reciprocal op)",
            e.line,
        )

    def call(self, e: Call, name: str | None) -> Value:
        if e.func == "sqrt" and len(e.args) == 1 and not e.kwargs:
            v = self.eval(e.args[0], None)
            if not isinstance(v, Tensor):
                x = self.arith_operand(v, "sqrt", e.line)
                if x < 0:
                    raise self.error(f"sqrt of a negative number in '{_expr_text(e)}'", e.line)
                return math.sqrt(x)
            return self.program.sqrt(v, name=name)
        if e.func in COMPOSITES:
            return self.composite(e, name)
        op = opset.parse_op(e.func)
        args = [self.eval(a, None) for a in e.args]
        kwargs = {k: self.eval(v, None) for k, v in e.kwargs}
        symbol = _SYMBOLS.get(op)
        if symbol is not None and len(args) == 2 and not kwargs and _one_tensor(args):
            return self.tensor_number(BinOp(symbol, e.args[0], e.args[1], e.line), args[0], args[1], name)
        if op is Op.CONCAT and args and isinstance(args[0], list):
            args = list(args[0]) + args[1:]
        tensors: list[Tensor] = []
        while args and isinstance(first := args[0], Tensor):
            tensors.append(first)
            args.pop(0)
        if any(isinstance(a, Tensor) for a in args):
            raise self.error(f"{op.value}: tensor arguments must come before attributes", e.line)
        attrs = self.attrs(op, None, args, kwargs, e.line)
        return self.program.apply(op, tensors, attrs, name=name)

    def composite(self, e: Call, name: str | None) -> Tensor:
        """``softmax(x, dim)`` / ``rms_norm(x, eps, dim)``: one tensor, then attributes."""
        args = [self.eval(a, None) for a in e.args]
        kwargs = {k: self.eval(v, None) for k, v in e.kwargs}
        if not args or not isinstance(args[0], Tensor) or any(isinstance(a, Tensor) for a in args[1:]):
            raise self.error(f"{e.func}: takes one tensor, then its attributes", e.line)
        attrs = self.attrs(e.func, COMPOSITES[e.func], args[1:], kwargs, e.line)
        unknown = sorted(set(attrs) - set(COMPOSITES[e.func]))
        if unknown:
            raise self.error(
                f"{e.func}: unknown argument(s) {', '.join(unknown)} (allowed: {', '.join(COMPOSITES[e.func])})",
                e.line,
            )
        if e.func == "softmax":
            if "dim" not in attrs:
                raise self.error("softmax: missing argument dim", e.line)
            return self.program.softmax(args[0], attrs["dim"], name=name)
        return self.program.rms_norm(args[0], name=name, **attrs)

    def attrs(
        self,
        op: Op | str,
        names: tuple[str, ...] | None,
        args: list[Value],
        kwargs: dict[str, Value],
        line: int,
    ) -> dict[str, Any]:
        what = op if isinstance(op, str) else op.value
        if names is None:
            names = POSITIONAL_ATTRS.get(op, ()) if isinstance(op, Op) else ()
        if len(args) > len(names):
            raise self.error(
                f"{what}: too many arguments (after its tensors it takes {', '.join(names) or 'nothing'})",
                line,
            )
        raw = dict(zip(names, args, strict=False))
        for k, v in kwargs.items():
            if k in raw:
                raise self.error(f"{what}: argument '{k}' given twice", line)
            raw[k] = v
        return {k: self.attr_value(what, k, v, line) for k, v in raw.items()}

    def attr_value(self, op: str, key: str, v: Value, line: int) -> Any:
        what = f"{op}: '{key}'"
        if key == "keepdim":
            if not isinstance(v, bool):
                raise self.error(f"{what} must be true or false, got {_kind(v)}", line)
            return v
        if key in REAL_ATTRS:
            return self.real(v, op, line)
        if key == "shape":
            if not isinstance(v, list):
                raise self.error(f"{what} must be a list like [a, b], got {_kind(v)}", line)
            return tuple(self.integer(x, f"{what} entry") for x in v)
        if isinstance(v, bool | list | Tensor):
            raise self.error(f"{what} must be an integer, got {_kind(v)}", line)
        return self.integer(v, what)


# Binary ops whose call with one tensor and one number is the tensor-number expression of that symbol.
_SYMBOLS: Mapping[Op, str] = {Op.ADD: "+", Op.SUB: "-", Op.MUL: "*", Op.DIV: "/"}


def _one_tensor(args: list[Value]) -> bool:
    return sum(isinstance(a, Tensor) for a in args) == 1


def _kind(v: Any) -> str:
    if isinstance(v, Tensor):
        return f"tensor '{v.name}'"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, list):
        return "a list"
    return f"the number {_num_text(v)}"


def _num_text(v: Any) -> str:
    if isinstance(v, Fraction):
        return str(v.numerator) if v.denominator == 1 else f"{v.numerator}/{v.denominator}"
    return repr(v)


def _expr_text(e: Expr) -> str:
    match e:
        case Num(value=v):
            return _num_text(v)
        case Name(id=ident):
            return ident
        case ListExpr(items=items):
            return "[" + ", ".join(_expr_text(x) for x in items) + "]"
        case Neg(operand=operand):
            return "-" + _expr_text(operand)
        case BinOp(op=op, left=left, right=right):
            return f"{_expr_text(left)}{op}{_expr_text(right)}"
        case Call(func=func, args=args, kwargs=kwargs):
            parts = [_expr_text(a) for a in args] + [f"{k}={_expr_text(v)}" for k, v in kwargs]
            return f"{func}({', '.join(parts)})"
    return "?"


# ---------------------------------------------------------------------------------------------- public API


def parse_program(
    text: str,
    params: Mapping[str, int] | None = None,
    source: str = "<string>",
    default_name: str = "program",
) -> Program:
    """Parse ``.gsp`` text into a :class:`Program`.

    Parameters
    ----------
    text : str
        The program text.
    params : mapping of str to int, optional
        Overrides for the file's ``param`` defaults; a name the file does not declare is an error.
    source : str
        Shown in front of error messages (``source:line: ...``).
    default_name : str
        Program name when the text has no ``program`` statement.

    Raises
    ------
    ConfigError
        Syntax errors, undefined or duplicate names, bad parameters, a program without outputs.
    ProgramError, UnsupportedOpError
        Shape/dtype errors and unknown ops, with the location in front.
    """
    try:
        stmts = Parser(tokenize(text, source), source).statements()
        return _Builder(source, default_name, params or {}).run(stmts)
    except RecursionError:
        raise ConfigError(f"{source}: expressions nested too deeply") from None


def load_program(path: str | Path, params: Mapping[str, int] | None = None) -> Program:
    """Read and parse a ``.gsp`` file (see :func:`parse_program`); the program is named after the file's stem
    unless it has a ``program`` statement."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read program file: {exc}") from None
    return parse_program(text, params=params, source=str(path), default_name=path.stem)


def dump_program(p: Program) -> str:
    """The ``.gsp`` text of ``p``: every node in creation order with concrete shapes.

    ``parse_program(dump_program(p)).key() == p.key()``. Tensor names that are not identifiers (or are keywords)
    are replaced by fresh ones.
    """
    names = _dump_names(p)
    lines = [f"program {p.name if IDENT.match(p.name) and p.name not in KEYWORDS else 'program_'}"]
    if p.params:
        lines.append("# instantiated with " + ", ".join(f"{k}={v}" for k, v in p.params.items()))
    for n in p.nodes:
        if n.op is None:
            dims = ", ".join(str(d) for d in n.shape)
            lines.append(f"input {names[n.id]} [{dims}] {n.dtype}")
            continue
        args = [names[i] for i in n.inputs]
        args += [f"{k}={attr_text(v)}" for k, v in n.attrs]
        lines.append(f"{names[n.id]} = {n.op.value}({', '.join(args)})")
    if p.outputs:
        lines.append("output " + ", ".join(names[t.id] for t in p.outputs))
    return "\n".join(lines) + "\n"


def _dump_names(p: Program) -> dict[int, str]:
    ok = {n.id: n.name for n in p.nodes if IDENT.match(n.name) and n.name not in KEYWORDS}
    taken = set(ok.values())
    names: dict[int, str] = {}
    for n in p.nodes:
        if n.id in ok:
            names[n.id] = ok[n.id]
            continue
        k = 0
        candidate = f"t{n.id}"
        while candidate in taken:
            k += 1
            candidate = f"t{n.id}_{k}"
        taken.add(candidate)
        names[n.id] = candidate
    return names


__all__ = ["dump_program", "load_program", "parse_program", "tokenize"]

"""Per-element arithmetic of emitted kernels, in two modes that share every index expression.

A kernel emitter asks a :class:`Scalar` for the text of loads, stores and each op on one element; it never
writes arithmetic itself. :class:`FloatScalar` computes in float32 (float64 for float64 graphs).
:class:`FieldScalar` computes Mirage's Table 3 arithmetic over ``Z_p x Z_q`` exactly as
:class:`gensorage.verify.field.FieldArith` does, on int64 values with a leading component dim (``[0, ...]`` is
the ``Z_p`` residue, ``[1, ...]`` the ``Z_q`` residue), so a kernel emitted in both modes computes the same
function of the same indices and the field run can be compared bit for bit with the µGraph's field evaluation:

- add / sub / mul: ``truncmod`` of the exact int64 result (residues < 2^31, so products < 2^62);
- div: multiply by ``y^(m-2) mod m`` (Fermat; 0 maps to 0 as in FieldArith);
- exp: ``(ω^(x_q) mod p, 0)`` by square-and-multiply over the bits of ``x_q``; ω is read from the kernel's
  field-parameter buffer ``F[0]`` (one ω per trial);
- sqrt: ``x^((m+1)/4) mod m`` per component;
- scale(f): multiply by :func:`gensorage.verify.field.field_constant` of ``f``; add_scalar(c): add that of ``c``;
- max (a reduction or accumulator): no field semantics, :class:`~gensorage.errors.NotLaxError` (as FieldArith);
- relu / silu / gelu: FieldArith's keyed splitmix64 hash of ``x_p`` (keys in ``F[1..3]``). TVM's LLVM backend
  marks unsigned multiplies ``nuw`` (overflow is poison), so the wrapping 64-bit multiply of splitmix64 is
  built from 32-bit halves whose partial products cannot overflow (:func:`mix64_steps`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Protocol

from gensorage.codegen.tir_text import Writer, tvm_float
from gensorage.errors import NotLaxError, UnsupportedOpError
from gensorage.opset import Attrs, Op, attr, clamp_bounds
from gensorage.verify.field import ACTIVATION_KINDS, field_constant

# splitmix64 finaliser constants (gensorage.verify.maxset.mix64) and the second-hash salt of FieldArith.
MIX_C1 = 0xBF58476D1CE4E5B9
MIX_C2 = 0x94D049BB133111EB
MIX_SALT = 0x9E3779B97F4A7C15
_M32 = 0xFFFFFFFF
#: Field-parameter buffer layout: ``F[0]`` = ω, ``F[1 + i]`` = key of ``ACTIVATION_KINDS[i]``.
FIELD_PARAMS = 1 + len(ACTIVATION_KINDS)
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
#: tanh below :data:`TANH_SMALL` in magnitude: its Taylor series ``x · Σ c_k x^(2k)`` to ``x^13`` (the next term is
#: below 2^-60 of the sum there); above it ``(1 - e) / (1 + e)`` with ``e = exp(-2|x|)``, whose cancellation costs
#: at most ~16 float64 ulps at the switch. Both in float64, so a float32 result is correctly rounded or nearly so.
TANH_SMALL = 0.0625
TANH_SERIES = (1.0, -1 / 3, 2 / 15, -17 / 315, 62 / 2835, -1382 / 155925, 21844 / 6081075)


@dataclass(frozen=True, slots=True)
class Val:
    """One element: an expression per component, and the dtype the expressions have."""

    comps: tuple[str, ...]
    dtype: str


class Scalar(Protocol):
    """What a kernel emitter needs from an arithmetic mode (see the module docstring)."""

    comps: int
    field: bool

    def buf_dtype(self, dtype: str) -> str: ...
    def buf_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]: ...
    def at(self, buf: str, comp: int, idx: str) -> str: ...
    def load(self, buf: str, idx: str, dtype: str) -> Val: ...
    def store(self, v: Val, dtype: str) -> tuple[str, ...]: ...
    def op(self, w: Writer, op: Op, attrs: Attrs, args: list[Val]) -> Val: ...
    def zero(self) -> Val: ...
    def initial(self, kind: str) -> Val: ...
    def product(self, a: Val, b: Val) -> Val: ...
    def plus(self, a: Val, b: Val) -> Val: ...
    def reduced(self, v: Val) -> Val: ...
    def combine(self, kind: str, acc: Val, x: Val) -> Val: ...

    @property
    def acc_dtype(self) -> str: ...


_ATOM = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*(\[[^\[\]]*\])?$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")


def _is_call(e: str) -> bool:
    i = e.find("(")
    if i <= 0 or not e.endswith(")") or not _NAME.match(e[:i]):
        return False
    depth = 0
    for ch in e[i:-1]:
        depth += (ch == "(") - (ch == ")")
        if depth == 0:
            return False  # the first call closes before the end: e is a call followed by more
    return True


def _paren(e: str) -> str:
    """``e`` as an operand: wrapped in parentheses unless it is a name, a buffer access or a single call."""
    return e if _ATOM.match(e) or _is_call(e) else f"({e})"


class FloatScalar:
    """Float arithmetic in ``compute`` (float32, or float64 for float64 graphs)."""

    comps = 1
    field = False

    def __init__(self, compute: str = "float32") -> None:
        self.compute = compute

    @property
    def acc_dtype(self) -> str:
        return self.compute

    def buf_dtype(self, dtype: str) -> str:
        return dtype

    def buf_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return shape

    def at(self, buf: str, comp: int, idx: str) -> str:
        return f"{buf}[{idx}]"

    def load(self, buf: str, idx: str, dtype: str) -> Val:
        return Val((f"{buf}[{idx}]",), dtype)

    def _c(self, v: Val) -> str:
        return v.comps[0] if v.dtype == self.compute else f'T.Cast("{self.compute}", {v.comps[0]})'

    def store(self, v: Val, dtype: str) -> tuple[str, ...]:
        return (v.comps[0] if v.dtype == dtype else f'T.Cast("{dtype}", {v.comps[0]})',)

    def _const(self, x: float) -> str:
        return tvm_float(x, self.compute)

    def _v(self, e: str) -> Val:
        return Val((e,), self.compute)

    def op(self, w: Writer, op: Op, attrs: Attrs, args: list[Val]) -> Val:
        x = [self._c(a) for a in args]
        match op:
            case Op.ADD:
                return self._v(f"{x[0]} + {x[1]}")
            case Op.SUB:
                return self._v(f"{x[0]} - {_paren(x[1])}")
            case Op.MUL:
                return self._v(f"{_paren(x[0])} * {_paren(x[1])}")
            case Op.DIV:
                return self._v(f"{_paren(x[0])} / {_paren(x[1])}")
            case Op.EXP:
                return self._v(f"T.exp({x[0]})")
            case Op.SQRT:
                return self._v(f"T.sqrt({x[0]})")
            case Op.SCALE:
                return self._v(f"{_paren(x[0])} * {self._const(float(attr(attrs, 'factor')))}")
            case Op.ADD_SCALAR:
                return self._v(f"{x[0]} + {self._const(float(attr(attrs, 'value')))}")
            case Op.RELU:  # a select, not T.max: max(NaN, 0) is 0 on both targets, torch's relu(NaN) is NaN
                zero = self._const(0.0)
                return self._v(f"T.if_then_else({_paren(x[0])} < {zero}, {zero}, {x[0]})")
            case Op.SILU:
                return self._v(
                    f"{_paren(x[0])} / ({self._const(1.0)} + T.exp({self._const(0.0)} - {_paren(x[0])}))"
                )
            case Op.GELU:
                half, one, rs2 = self._const(0.5), self._const(1.0), self._const(1.0 / math.sqrt(2.0))
                return self._v(f"{half} * {_paren(x[0])} * ({one} + T.erf({_paren(x[0])} * {rs2}))")
            case Op.TANH:
                return self._tanh(w, x[0])
            case Op.LOG:  # log(x < 0) is NaN and log(±0) is -inf on both targets, as torch's
                return self._v(f"T.log({x[0]})")
            case Op.CLAMP:
                return self._clamp(w, x[0], attrs)
            case _:
                raise UnsupportedOpError(f"op '{op.value}' is not an elementwise op")

    def _tanh(self, w: Writer, x: str) -> Val:
        """tanh in float64 (see :data:`TANH_SERIES`): TIR's own tanh is ``(1 - e^-2x) / (1 + e^-2x)`` on llvm,
        which cancels near 0 (relative error 1e-2 at 1e-5 in float32) and gives tanh(-0) = +0."""
        r = w.fresh("th")
        w.line(f'{r} = T.alloc_buffer((3,), "float64", scope="local")')
        wide = x if self.compute == "float64" else f'T.Cast("float64", {x})'
        w.line(f"{r}[0] = {wide}")
        w.line(f"{r}[1] = {r}[0] * {r}[0]")
        w.line(f"{r}[2] = T.exp(T.float64(-2.0) * T.fabs({r}[0]))")
        poly = tvm_float(TANH_SERIES[-1], "float64")
        for c in reversed(TANH_SERIES[:-1]):
            poly = f"{tvm_float(c, 'float64')} + {r}[1] * ({poly})"
        one = tvm_float(1.0, "float64")
        big = f"({one} - {r}[2]) / ({one} + {r}[2])"
        small = f"T.fabs({r}[0]) < {tvm_float(TANH_SMALL, 'float64')}"
        e = (
            f"T.if_then_else({small}, {r}[0] * ({poly}), "
            f"T.if_then_else({r}[0] < {tvm_float(0.0, 'float64')}, {tvm_float(0.0, 'float64')} - {big}, {big}))"
        )
        return self._v(e if self.compute == "float64" else f'T.Cast("{self.compute}", {e})')

    def _clamp(self, w: Writer, x: str, attrs: Attrs) -> Val:
        """Selects, not T.max / T.min (which turn NaN into a bound): NaN compares false and stays NaN."""
        lo, hi = clamp_bounds(attrs)
        for bound, cmp in ((lo, "<"), (hi, ">")):
            if bound is not None:
                x, c = self._local(w, x), self._const(float(bound))
                x = f"T.if_then_else({x} {cmp} {c}, {c}, {x})"
        return self._v(x)

    def _local(self, w: Writer, x: str) -> str:
        """``x`` (read twice by a select) in a local register unless it is a name or a buffer access."""
        if _ATOM.match(x):
            return x
        r = w.fresh("cl")
        w.line(f'{r} = T.alloc_buffer((1,), "{self.compute}", scope="local")')
        w.line(f"{r}[0] = {x}")
        return f"{r}[0]"

    def zero(self) -> Val:
        return self._v(self._const(0.0))

    def initial(self, kind: str) -> Val:
        """The identity of a reduction: 0 for a sum, the lowest value of the compute dtype for a max."""
        return self._v(self._const(-math.inf)) if kind == "max" else self.zero()

    def product(self, a: Val, b: Val) -> Val:
        return self._v(f"{_paren(self._c(a))} * {_paren(self._c(b))}")

    def plus(self, a: Val, b: Val) -> Val:
        return self._v(f"{self._c(a)} + {self._c(b)}")

    def reduced(self, v: Val) -> Val:
        return v

    def combine(self, kind: str, acc: Val, x: Val) -> Val:
        if kind == "max":
            return self._v(f"T.max({self._c(acc)}, {self._c(x)})")
        return self.plus(acc, x)


class FieldScalar:
    """``Z_p x Z_q`` arithmetic on int64 (component 0 mod ``p``, component 1 mod ``q``); see the module docstring.

    Kernels in this mode take an extra int64 parameter buffer ``F`` of :data:`FIELD_PARAMS` entries.
    """

    comps = 2
    field = True
    acc_dtype = "int64"

    def __init__(self, p: int, q: int) -> None:
        self.p, self.q = p, q
        self.mods = (p, q)

    def buf_dtype(self, dtype: str) -> str:
        return "int64"

    def buf_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return (2, *shape)

    def at(self, buf: str, comp: int, idx: str) -> str:
        return f"{buf}[{comp}, {idx}]"

    def load(self, buf: str, idx: str, dtype: str) -> Val:
        return Val(tuple(self.at(buf, c, idx) for c in range(2)), "int64")

    def store(self, v: Val, dtype: str) -> tuple[str, ...]:
        return v.comps

    @staticmethod
    def _i(x: int) -> str:
        return f"T.int64({x})"

    def _mod(self, e: str, c: int) -> str:
        return f"T.truncmod({e}, {self._i(self.mods[c])})"

    def _pair(self, f: object) -> Val:
        return Val(tuple(f(c) for c in range(2)), "int64")  # type: ignore[operator]

    def op(self, w: Writer, op: Op, attrs: Attrs, args: list[Val]) -> Val:
        a = args[0]
        b = args[1] if len(args) > 1 else None
        match op:
            case Op.ADD:
                assert b is not None
                return self._pair(lambda c: self._mod(f"{a.comps[c]} + {b.comps[c]}", c))
            case Op.SUB:
                assert b is not None
                return self._pair(
                    lambda c: self._mod(f"{a.comps[c]} - {b.comps[c]} + {self._i(self.mods[c])}", c)
                )
            case Op.MUL:
                assert b is not None
                return self.mul(a, b)
            case Op.DIV:
                assert b is not None
                inv = tuple(self._pow_const(w, b.comps[c], self.mods[c] - 2, c) for c in range(2))
                return self.mul(a, Val(inv, "int64"))
            case Op.EXP:
                return Val((self._pow(w, "F[0]", a.comps[1], self.q.bit_length(), 0), "T.int64(0)"), "int64")
            case Op.SQRT:
                return Val(
                    tuple(self._pow_const(w, a.comps[c], (self.mods[c] + 1) // 4, c) for c in range(2)),
                    "int64",
                )
            case Op.SCALE:
                f = float(attr(attrs, "factor"))
                return self._pair(
                    lambda c: self._mod(f"{a.comps[c]} * {self._i(field_constant(f, self.mods[c]))}", c)
                )
            case Op.ADD_SCALAR:
                v = float(attr(attrs, "value"))
                return self._pair(
                    lambda c: self._mod(f"{a.comps[c]} + {self._i(field_constant(v, self.mods[c]))}", c)
                )
            case Op.RELU | Op.SILU | Op.GELU | Op.TANH | Op.LOG:
                return self._activation(w, op.value, a)
            case Op.CLAMP:  # one function per pair of bounds: its key is not among the kernel's parameters
                raise NotLaxError(
                    "clamp has no finite-field kernel (its symbol's key is derived per bound pair)"
                )
            case _:
                raise UnsupportedOpError(f"op '{op.value}' is not an elementwise op")

    def mul(self, a: Val, b: Val) -> Val:
        return self._pair(lambda c: self._mod(f"{a.comps[c]} * {b.comps[c]}", c))

    def _pow_const(self, w: Writer, base: str, e: int, comp: int) -> str:
        return self._pow(w, base, self._i(e), max(1, e.bit_length()), comp)

    def _pow(self, w: Writer, base: str, exponent: str, bits: int, comp: int) -> str:
        """Square-and-multiply ``base ** exponent mod m_comp`` over ``bits`` bits; returns the result's text."""
        r = w.fresh("pw")
        m = self._i(self.mods[comp])
        w.line(f'{r} = T.alloc_buffer((3,), "int64", scope="local")')
        w.line(f"{r}[0] = T.int64(1)")
        w.line(f"{r}[1] = {base}")
        w.line(f"{r}[2] = {exponent}")
        bit = w.fresh("bit")
        with w.block(f"for {bit} in range({bits}):"):
            with w.block(f"if T.bitwise_and({r}[2], T.int64(1)) == T.int64(1):"):
                w.line(f"{r}[0] = T.truncmod({r}[0] * {r}[1], {m})")
            w.line(f"{r}[1] = T.truncmod({r}[1] * {r}[1], {m})")
            w.line(f"{r}[2] = T.shift_right({r}[2], T.int64(1))")
        return f"{r}[0]"

    def _activation(self, w: Writer, kind: str, a: Val) -> Val:
        if kind not in ACTIVATION_KINDS:
            raise NotLaxError(f"activation '{kind}' has no finite-field substitute")
        key = 1 + ACTIVATION_KINDS.index(kind)
        h, r = w.fresh("hs"), w.fresh("ha")
        w.line(f'{h} = T.alloc_buffer((2,), "uint64", scope="local")')
        w.line(f'{r} = T.alloc_buffer((2,), "int64", scope="local")')
        w.line(f'{h}[0] = T.Cast("uint64", {a.comps[0]}) + T.Cast("uint64", F[{key}])')
        mix64_steps(w, f"{h}[0]", f"{h}[1]")
        w.line(f'{r}[0] = T.Cast("int64", T.truncmod({h}[0], {_u64(self.p)}))')
        w.line(f"{h}[0] = T.bitwise_xor({h}[0], {_u64(MIX_SALT)})")
        mix64_steps(w, f"{h}[0]", f"{h}[1]")
        w.line(f'{r}[1] = T.Cast("int64", T.truncmod({h}[0], {_u64(self.q)}))')
        return Val((f"{r}[0]", f"{r}[1]"), "int64")

    def zero(self) -> Val:
        return Val(("T.int64(0)", "T.int64(0)"), "int64")

    def initial(self, kind: str) -> Val:
        if kind != "sum":
            raise NotLaxError(f"accumulate({kind}) has no finite-field semantics (outside the Lax fragment)")
        return self.zero()

    def product(self, a: Val, b: Val) -> Val:
        return self.mul(a, b)

    def plus(self, a: Val, b: Val) -> Val:
        # Unreduced: callers sum fewer than 2^32 residues (< 2^31 each) before :meth:`reduced`.
        return self._pair(lambda c: f"{a.comps[c]} + {b.comps[c]}")

    def reduced(self, v: Val) -> Val:
        return self._pair(lambda c: self._mod(v.comps[c], c))

    def combine(self, kind: str, acc: Val, x: Val) -> Val:
        if kind != "sum":
            raise NotLaxError(f"accumulate({kind}) has no finite-field semantics (outside the Lax fragment)")
        return self.reduced(self.plus(acc, x))


def reduction_kind(op: Op) -> str:
    """How a reduction op (``sum``, ``max``) combines elements: the ``kind`` of :meth:`Scalar.combine`."""
    return "max" if op is Op.MAX else "sum"


def combined(sc: Scalar, kind: str, acc: Val, x: Val) -> Val:
    """``acc`` combined with ``x``; a sum stays unreduced (field sums are reduced once, at the end)."""
    return sc.plus(acc, x) if kind == "sum" else sc.combine(kind, acc, x)


def _u64(x: int) -> str:
    """A uint64 literal; values of 2^63 and above are assembled from halves (TVMScript takes int64 only)."""
    if x < 1 << 63:
        return f"T.uint64({x})"
    return f"T.bitwise_or(T.shift_left(T.uint64({x >> 32}), T.uint64(32)), T.uint64({x & _M32}))"


def _mulwrap_lines(w: Writer, x: str, tmp: str, c: int) -> None:
    """``x = x * c mod 2^64`` with no overflowing operation (32-bit halves; ``tmp`` is a scratch uint64)."""
    lo, hi = c & _M32, c >> 32
    m = f"T.uint64({_M32})"
    s32 = "T.uint64(32)"
    xl, xh = f"T.bitwise_and({x}, {m})", f"T.shift_right({x}, {s32})"
    w.line(f"{tmp} = {xl} * T.uint64({lo})")
    cross = (
        f"T.bitwise_and({xh} * T.uint64({lo}), {m}) + T.bitwise_and({xl} * T.uint64({hi}), {m})"
        f" + T.shift_right({tmp}, {s32})"
    )
    w.line(f"{x} = T.bitwise_or(T.shift_left(T.bitwise_and({cross}, {m}), {s32}), T.bitwise_and({tmp}, {m}))")


def mix64_steps(w: Writer, x: str, tmp: str) -> None:
    """Emit the splitmix64 finaliser on the uint64 location ``x`` (``tmp``: a scratch uint64 location)."""
    for shift, c in ((30, MIX_C1), (27, MIX_C2)):
        w.line(f"{x} = T.bitwise_xor({x}, T.shift_right({x}, T.uint64({shift})))")
        _mulwrap_lines(w, x, tmp, c)
    w.line(f"{x} = T.bitwise_xor({x}, T.shift_right({x}, T.uint64(31)))")


def mix64(x: int) -> int:
    """splitmix64 finaliser on a Python int (the function :func:`mix64_steps` emits), for tests."""
    m = (1 << 64) - 1
    x &= m
    x = ((x ^ (x >> 30)) * MIX_C1) & m
    x = ((x ^ (x >> 27)) * MIX_C2) & m
    return x ^ (x >> 31)


def keyed_hash(x_p: int, key: int, p: int, q: int) -> tuple[int, int]:
    """FieldArith's activation substitute on one element: ``(h mod p, mix(h ^ salt) mod q)``, ``h = mix(x_p + key)``."""
    h = mix64(x_p + key)
    return h % p, mix64(h ^ MIX_SALT) % q


__all__ = [
    "FIELD_PARAMS",
    "FLOAT_DTYPES",
    "MIX_C1",
    "MIX_C2",
    "MIX_SALT",
    "FieldScalar",
    "FloatScalar",
    "Scalar",
    "Val",
    "combined",
    "keyed_hash",
    "mix64",
    "mix64_steps",
    "reduction_kind",
]

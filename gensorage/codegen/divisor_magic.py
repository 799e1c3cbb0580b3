"""Division by a length-dependent divisor as a multiply and a shift, with the constants passed at the call.

A kernel that walks its output by one flat index ``f`` splits it into coordinates with ``f // d`` and ``f % d``,
where ``d`` is a product of trailing extents (the sequence length among them). Compiled with ``d`` a constant,
LLVM turns each division into a multiply by a "magic" number and a shift; compiled with ``d`` a parameter, each
is a hardware division per element (variants with divisors as parameters ran 2 to 3.7 times slower). So a
compiled variant (:mod:`gensorage.codegen.symbolic_kernels`) whose divisor changes with the length takes the
divisor's magic number and shift as two more ``T.int64`` parameters, computed here on the host for each length
(:func:`magic`), and its text divides by them (:func:`with_magic_divisions`): one variant serves every length.

Exactness (every int32 numerator ``n``, every divisor ``1 <= d < 2**31``). Let ``s = 31 + ceil(log2 d)`` and
``m = ceil(2**s / d)``, so ``m * d = 2**s + e`` with ``0 <= e < d``. For ``0 <= x < 2**31``::

    x * m / 2**s = x / d + x * e / (d * 2**s),  and  0 <= x * e / (d * 2**s) < 2**31 * d / (d * 2**31 * d) = 1 / d

(as ``2**s >= 2**31 * d``). With ``x = q * d + r``, ``0 <= r <= d - 1``, the sum lies in ``[q, q + 1)``, so
``floor(x * m / 2**s) = q = x // d``. Range: ``m < 2**s / d + 1 <= 2**32 + 1`` (``2**ceil(log2 d) < 2 d``), so
``m <= 2**32`` and ``x * m < 2**63``: the product is exact in int64. A negative numerator goes through
``x = n ^ (n >> 31)`` (``n`` itself when ``n >= 0``, else ``-n - 1``, both in ``[0, 2**31)``) and back through the
same xor: for ``n < 0``, ``floor(n / d) = -(floor((-n - 1) / d) + 1) = ~(x // d)``. The remainder is
``n - (n // d) * d`` computed in int64 (no int32 overflow at ``n`` near ``-2**31``), which lies in ``[0, d)`` as
TVM's ``floormod`` by a positive divisor does. The identity is tested over the whole int32 range with
hypothesis (``tests/test_divisor_magic.py``), and on compiled kernels at many lengths.

A text whose integers are not all int32 (it names ``int64``: a buffer over 2**31 elements, int64 indices) keeps
its divisors constant: the identity above is for int32 numerators only.
"""

from __future__ import annotations

import io
import re
import tokenize

#: Tokens of the same precedence as ``//`` and ``%`` (left-associative): ``a * b // d`` is ``(a * b) // d``.
_TERM_OPS = frozenset({"*", "/", "//", "%", "@"})
_OPEN = {")": "(", "]": "[", "}": "{"}


def magic(d: int) -> tuple[int, int]:
    """The multiplier ``m`` and shift ``s`` with ``(x * m) >> s == x // d`` for every ``0 <= x < 2**31``.

    Raises
    ------
    ValueError
        ``d`` is not in ``[1, 2**31)``.
    """
    if not 1 <= d < 2**31:
        raise ValueError(f"divisor {d} outside [1, 2**31)")
    s = 31 + (d - 1).bit_length()
    return -(-(1 << s) // d), s


def floordiv(n: int, m: int, s: int) -> int:
    """``n // d`` for an int32 ``n`` from ``d``'s :func:`magic` pair, as the rewritten kernels compute it."""
    sign = n >> 31  # 0 or -1 for an int32 n
    return ((n ^ sign) * m >> s) ^ sign


def divisor_positions(body: str) -> set[int]:
    """The skeleton literals ``c<i>_`` that divide (``// c<i>_`` or ``% c<i>_``) in ``body``."""
    return {int(i) for i in re.findall(r"(?://|%)\s*c(\d+)_\b", body)}


def magic_params(positions: list[int]) -> str:
    """The parameters a rewritten skeleton declares after its literals: ``m<i>_`` and ``s<i>_`` per divisor."""
    return "".join(f", m{i}_: T.int64, s{i}_: T.int64" for i in positions)


def with_magic_divisions(body: str, positions: list[int]) -> str | None:
    """Skeleton ``body`` with every ``n // c<i>_`` and ``n % c<i>_`` (``i`` in ``positions``) computed from the
    parameters ``m<i>_, s<i>_`` (declared after the literals' parameters); None where the text is not all int32
    or a numerator cannot be delimited.

    The numerator is written out where the identity uses it (three times for a quotient, four for a
    remainder; a ``T.Let`` would bind it once, but TVM's unrolling copies the binding, which its analyser
    rejects), so nested divisions grow the text geometrically: kernels nest two or three.
    """
    if "int64" in body or not positions:
        return None
    wanted = set(positions)
    rewrites = 0
    while (rewritten := _rewrite_first(body, wanted)) is not None:
        body, rewrites = rewritten, rewrites + 1
    if rewrites == 0 or divisor_positions(body) & wanted:
        return None
    last = max(int(i) for i in re.findall(r"\bc(\d+)_: T\.int32", body))
    decl = f"c{last}_: T.int32"
    return body.replace(decl, decl + magic_params(positions), 1)


def _rewrite_first(body: str, wanted: set[int]) -> str | None:
    """``body`` with its first division by a wanted divisor rewritten; None when there is none left, or its
    numerator cannot be delimited."""
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(body).readline))
    except (tokenize.TokenError, IndentationError):
        return None
    offsets = _line_offsets(body)
    for k, tok in enumerate(toks):
        if tok.type != tokenize.OP or tok.string not in ("//", "%") or k + 1 >= len(toks):
            continue
        m = re.fullmatch(r"c(\d+)_", toks[k + 1].string)
        if m is None or int(m.group(1)) not in wanted:
            continue
        start = _operand_start(toks, k)
        if start is None:
            return None
        a = offsets[toks[start].start[0] - 1] + toks[start].start[1]
        b = offsets[tok.start[0] - 1] + tok.start[1]
        end = offsets[toks[k + 1].end[0] - 1] + toks[k + 1].end[1]
        numerator, i = f"({body[a:b].strip()})", int(m.group(1))
        value = _floordiv_text(numerator, i) if tok.string == "//" else _floormod_text(numerator, i)
        return f"{body[:a]}{value}{body[end:]}"
    return None


def _floordiv_text(n: str, i: int) -> str:
    """``n // c<i>_`` for the int32 expression ``n`` (the module docstring's identity)."""
    sign = f"T.shift_right({n}, 31)"
    x = f'T.Cast("int64", T.bitwise_xor({n}, {sign}))'
    return f'T.bitwise_xor(T.Cast("int32", T.shift_right({x} * m{i}_, s{i}_)), {sign})'


def _floormod_text(n: str, i: int) -> str:
    """``n % c<i>_`` for the int32 expression ``n``: ``n - (n // d) * d`` in int64."""
    q = _floordiv_text(n, i)
    return f'T.Cast("int32", T.Cast("int64", {n}) - T.Cast("int64", {q}) * T.Cast("int64", c{i}_))'


def _line_offsets(text: str) -> list[int]:
    offsets, total = [], 0
    for line in text.splitlines(keepends=True):
        offsets.append(total)
        total += len(line)
    return offsets + [total]


def _operand_start(toks: list[tokenize.TokenInfo], op: int) -> int | None:
    """Index of the first token of the left operand of the operator at ``op`` (the whole chain of ``*``, ``//``,
    ``%`` terms before it, with unary signs); None where it cannot be read (a form it does not read)."""
    end = op - 1
    while True:
        j = _atom_start(toks, end)
        if j is None:
            return None
        while j > 0 and toks[j - 1].string in ("-", "+", "~") and _is_unary(toks, j - 1):
            j -= 1
        if j > 0 and toks[j - 1].string == "**":
            return None  # binds tighter than the operand read so far: not worth reading
        if j > 0 and toks[j - 1].type == tokenize.OP and toks[j - 1].string in _TERM_OPS:
            end = j - 2
            continue
        return j


def _is_unary(toks: list[tokenize.TokenInfo], k: int) -> bool:
    before = toks[k - 1] if k > 0 else None
    return before is None or (before.type == tokenize.OP and before.string not in (")", "]", "}"))


def _atom_start(toks: list[tokenize.TokenInfo], j: int) -> int | None:
    """Index of the first token of the primary ending at ``j``: a name or number, a bracketed group, with the
    calls, subscripts and attributes chained before it (``T.max(a, b)``, ``A[i, j]``)."""
    while j >= 0:
        tok = toks[j]
        if tok.string in _OPEN:
            depth, k = 0, j
            while k >= 0:
                depth += toks[k].string in _OPEN
                depth -= toks[k].string in _OPEN.values()
                if depth == 0:
                    break
                k -= 1
            if k < 0:
                return None
            j = k
        elif tok.type not in (tokenize.NAME, tokenize.NUMBER, tokenize.STRING):
            return None
        # a call, subscript or attribute continues to the left
        if j > 0 and (toks[j - 1].string == "." or (toks[j].string in "([" and _continues(toks[j - 1]))):
            j -= 2 if toks[j - 1].string == "." else 1
            continue
        return j
    return None


def _continues(tok: tokenize.TokenInfo) -> bool:
    """Whether ``tok`` before a ``(`` or ``[`` makes it a call or subscript (a name or a closing bracket)."""
    return (tok.type == tokenize.NAME and tok.string not in _KEYWORDS) or tok.string in (")", "]")


_KEYWORDS = frozenset({"and", "or", "not", "in", "if", "else", "return", "for", "while", "is", "lambda"})


__all__ = ["divisor_positions", "floordiv", "magic", "magic_params", "with_magic_divisions"]

"""TVMScript kernels parsed once per *skeleton*: the text with its kernel name and integer literals taken out.

The emitters write each kernel as TVMScript text with its shapes, extents and offsets as integer literals, and
TVM's parser (Python, tens of ms a kernel) is most of a µGraph's lowering time. A kernel at a new sequence
length, a slice at another offset, a second head group: their texts differ in those literals only. So a text is
split into its skeleton (every integer literal below 2³¹ replaced by a parameter ``c<i>_: T.int32`` of the
PrimFunc, the kernel's name by a placeholder) and the literals' values; the skeleton is parsed once, and each
text of that skeleton is the parsed template with its parameters bound to the values (``PrimFunc.specialize``,
a substitution in C++: well under a millisecond).

Exactness: the first text of each skeleton is also parsed directly, and the template is kept only when its
specialisation is structurally equal to that parse (:func:`tvm_ffi.structural_equal`); otherwise every text of
that skeleton is parsed directly. Under :func:`deferred_templates` (a new length of a program seen before) the
template is parsed when the skeleton is met a second time, and checked then against the first text's parse. The
parser types a literal by its context (an ``int64`` or float operand, a literal over 2³¹), never by its value
below 2³¹, so a skeleton that is equal at one set of values is equal at every other; the tests check it on whole
µGraphs at several shapes.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import io
import re
import threading
import tokenize
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

#: The placeholder of the kernel's name in a skeleton.
SKELETON_NAME = "kernel_skeleton_"
#: Skeletons kept (least recently used dropped first): a decoder layer has about a dozen.
MAX_TEMPLATES = 4096
_INT32_MAX = 2**31 - 1

# skeleton -> template PrimFunc with len(values) leading int32 parameters; None: parse directly; or a _Pending
_TEMPLATES: OrderedDict[str, Any] = OrderedDict()
_LOCK = threading.Lock()  # dispatchers of several threads share the templates; parsing runs outside it
_DEFERRED: contextvars.ContextVar[bool] = contextvars.ContextVar("deferred_templates", default=False)
_UNKNOWN = object()  # a skeleton not met yet


class _Pending:
    """A skeleton first met under :func:`deferred_templates`: its first text's PrimFunc and literals, which
    check the template when the skeleton is met again."""

    __slots__ = ("direct", "name", "values")

    def __init__(self, direct: Any, values: list[int], name: str) -> None:
        self.direct, self.values, self.name = direct, values, name


@contextlib.contextmanager
def deferred_templates() -> Iterator[None]:
    """Within it, the template of a skeleton met for the first time is parsed when the skeleton is met again,
    not now (its first text is parsed directly and kept to check the template then): one parse instead of
    two for a skeleton met once. For a new length of a known program, whose new skeletons (a bounds guard, a
    fused row kernel's new shape of its loops) may never recur; a program's first shape makes its templates
    at once, since its next length needs them."""
    token = _DEFERRED.set(True)
    try:
        yield
    finally:
        _DEFERRED.reset(token)


def skeleton(text: str, name: str) -> tuple[str, list[int]]:
    """``text`` with kernel ``name`` and each integer literal below 2³¹ replaced, and those literals in order.

    The replaced literals become leading ``T.int32`` parameters of the skeleton's function. A literal that is the
    value of a string key (an annotation: ``{"buffer_data_alignment": 64}``) stays: the parser keeps annotation
    values as they are written, so a parameter there would never be bound.
    """
    body, values = _skeleton(text, name)
    return body, list(values)


# A kernel's text is split twice at a new length (its parse, then the compiled variants' look-up): tokenizing it
# takes milliseconds for a long one.
@functools.lru_cache(maxsize=512)
def _skeleton(text: str, name: str) -> tuple[str, tuple[int, ...]]:
    body = re.sub(rf"\b{re.escape(name)}\b", SKELETON_NAME, text)
    lines = body.splitlines(keepends=True)
    values: list[int] = []
    spans: list[tuple[int, int, int]] = []
    last: list[int] = [tokenize.OP, tokenize.OP]  # the two previous tokens' types
    colon_after_string = False
    for tok in tokenize.generate_tokens(io.StringIO(body).readline):
        annotation = colon_after_string
        colon_after_string = tok.string == ":" and last[-1] == tokenize.STRING
        last = [last[-1], tok.type]
        if annotation or tok.type != tokenize.NUMBER:
            continue
        if tok.string.isdigit() and int(tok.string) <= _INT32_MAX:
            spans.append((tok.start[0] - 1, tok.start[1], tok.end[1]))
            values.append(int(tok.string))
    for (row, start, end), i in zip(reversed(spans), range(len(spans) - 1, -1, -1), strict=True):
        lines[row] = f"{lines[row][:start]}c{i}_{lines[row][end:]}"
    body = "".join(lines)
    if values:
        params = ", ".join(f"c{i}_: T.int32" for i in range(len(values)))
        body = body.replace(f"def {SKELETON_NAME}(", f"def {SKELETON_NAME}({params}, ", 1)
    return body, tuple(values)


def parse_text(text: str, name: str) -> Any:
    """The PrimFunc of kernel ``name``'s TVMScript ``text`` (from its skeleton's template where there is one).

    Raises whatever TVM's parser raises for a text that does not parse.
    """
    import tvm

    try:
        body, values = skeleton(text, name)
    except (tokenize.TokenError, IndentationError):
        return tvm.script.from_source(text)
    with _LOCK:
        entry = _TEMPLATES.get(body, _UNKNOWN)
        if entry is not _UNKNOWN:
            _TEMPLATES.move_to_end(body)
    if isinstance(entry, _Pending):  # met before under deferred_templates: the template, checked now
        entry = _store(body, _template(body, entry.values, entry.name, entry.direct))
    if entry is _UNKNOWN:  # the first text of a skeleton: parsed directly, and it checks the template
        direct = tvm.script.from_source(text)
        if _DEFERRED.get():
            _store(body, _Pending(direct, values, name), first=True)
        else:
            _store(body, _template(body, values, name, direct), first=True)
        return direct
    if entry is None:
        return tvm.script.from_source(text)
    return _bind(entry, values, name)


def template_of(body: str, values: list[int], name: str, direct: Any) -> Any:
    """The checked template of skeleton ``body`` (kept from :func:`parse_text`, else parsed and checked here
    against ``direct``, the PrimFunc of the skeleton's text at ``values``), or None where there is none.

    For :mod:`gensorage.codegen.symbolic_kernels`, which also takes the printed scripts of scheduled kernels
    (never parsed from text) through their skeletons.
    """
    with _LOCK:
        entry = _TEMPLATES.get(body, _UNKNOWN)
        if entry is not _UNKNOWN:
            _TEMPLATES.move_to_end(body)
    if entry is _UNKNOWN or isinstance(entry, _Pending):
        entry = _store(body, _template(body, values, name, direct))
    return entry


def _store(body: str, entry: Any, first: bool = False) -> Any:
    """Record ``entry`` for skeleton ``body`` (with ``first``, only where no other thread recorded one meanwhile);
    returns what is recorded."""
    with _LOCK:
        if first and body in _TEMPLATES:
            return _TEMPLATES[body]
        _TEMPLATES[body] = entry
        _TEMPLATES.move_to_end(body)
        if len(_TEMPLATES) > MAX_TEMPLATES:
            _TEMPLATES.popitem(last=False)
    return entry


def _template(body: str, values: list[int], name: str, direct: Any) -> Any:
    """The skeleton's parsed template when its specialisation at ``values`` is ``direct``, else None."""
    import tvm
    import tvm_ffi

    try:
        template = tvm.script.from_source(body)
        exact = tvm_ffi.structural_equal(_bind(template, values, name), direct)
    except Exception:  # a literal the parser needs as a Python int (an unrolled count, say): parse directly
        return None
    return template if exact else None


def _bind(template: Any, values: list[int], name: str) -> Any:
    bound = template.specialize(dict(zip(list(template.params)[: len(values)], values, strict=True)))
    return bound.with_attr("global_symbol", name)


__all__ = ["MAX_TEMPLATES", "SKELETON_NAME", "deferred_templates", "parse_text", "skeleton", "template_of"]

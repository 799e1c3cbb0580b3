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
that skeleton is parsed directly. The parser types a literal by its context (an ``int64`` or float operand, a
literal over 2³¹), never by its value below 2³¹, so a skeleton that is equal at one set of values is equal at
every other; the tests check it on whole µGraphs at several shapes.
"""

from __future__ import annotations

import functools
import io
import re
import threading
import tokenize
from collections import OrderedDict
from typing import Any

#: The placeholder of the kernel's name in a skeleton.
_NAME = "kernel_skeleton_"
#: Skeletons kept (least recently used dropped first): a decoder layer has about a dozen.
MAX_TEMPLATES = 4096
_INT32_MAX = 2**31 - 1

# skeleton -> (template PrimFunc with len(values) leading int32 parameters, or None: parse directly)
_TEMPLATES: OrderedDict[str, Any] = OrderedDict()
_LOCK = threading.Lock()  # dispatchers of several threads share the templates; parsing runs outside it


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
    body = re.sub(rf"\b{re.escape(name)}\b", _NAME, text)
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
        body = body.replace(f"def {_NAME}(", f"def {_NAME}({params}, ", 1)
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
        known = body in _TEMPLATES
        template = _TEMPLATES.get(body)
        if known:
            _TEMPLATES.move_to_end(body)
    if template is not None:
        return _bind(template, values, name)
    direct = tvm.script.from_source(text)
    if not known:  # the first text of a skeleton: parsed directly, and it checks the template
        checked = _template(body, values, name, direct)
        with _LOCK:
            _TEMPLATES[body] = checked
            if len(_TEMPLATES) > MAX_TEMPLATES:
                _TEMPLATES.popitem(last=False)
    return direct


def template_of(body: str, values: list[int], name: str, direct: Any) -> Any:
    """The checked template of skeleton ``body`` (kept from :func:`parse_text`, else parsed and checked here
    against ``direct``, the PrimFunc of the skeleton's text at ``values``), or None where there is none.

    For :mod:`gensorage.codegen.symbolic_kernels`, which also takes the printed scripts of scheduled kernels
    (never parsed from text) through their skeletons.
    """
    with _LOCK:
        if body in _TEMPLATES:
            _TEMPLATES.move_to_end(body)
            return _TEMPLATES[body]
    checked = _template(body, values, name, direct)
    with _LOCK:
        _TEMPLATES[body] = checked
        if len(_TEMPLATES) > MAX_TEMPLATES:
            _TEMPLATES.popitem(last=False)
    return checked


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


__all__ = ["MAX_TEMPLATES", "parse_text", "skeleton", "template_of"]

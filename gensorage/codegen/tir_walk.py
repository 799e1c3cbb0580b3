"""Read-only traversal of TIR statements (TVM 0.27 exposes no Python statement visitor)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

# Child statements of the node kinds a scheduled or lowered PrimFunc contains (For, AttrStmt, LetStmt,
# Allocate/DeclBuffer, IfThenElse, SeqStmt, SBlockRealize/SBlock).
_CHILD_ATTRS = ("else_case", "then_case", "init", "body", "block")


def child_statements(node: Any) -> list[Any]:
    """The statements directly under ``node``, in order."""
    seq = getattr(node, "seq", None)
    children = list(seq) if seq is not None else []
    for attr in reversed(_CHILD_ATTRS):
        child = getattr(node, attr, None)
        if child is not None and not isinstance(child, int | float | str):
            children.append(child)
    return children


def walk(stmt: Any) -> Iterator[Any]:
    """Every statement under ``stmt`` (included), pre-order."""
    stack = [stmt]
    while stack:
        node = stack.pop()
        if node is None:
            continue
        yield node
        stack.extend(reversed(child_statements(node)))


def allocated_shapes(func: Any) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every buffer allocated by a block of ``func`` (non-constant dims as -1)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for node in walk(func.body):
        for buf in getattr(node, "alloc_buffers", None) or ():
            shapes[str(buf.name)] = tuple(_int_or(d) for d in buf.shape)
    return shapes


def _int_or(expr: Any, default: int = -1) -> int:
    try:
        return int(expr)
    except (TypeError, ValueError):
        return default

"""Choices made by value at one length, recorded at a kernel's first length and replayed at later ones (the CUDA
first tier at one token).

Where a dim is 1, several choices are exact and the code makes one by value: :class:`~gensorage.codegen.tir_text.
Ix` folds index arithmetic (``x // 1`` is ``x``, ``x % 1`` is 0, ``x // k`` is 0 and ``x % k`` is ``x`` where
``x < k``), :func:`~gensorage.codegen.tir_text.broadcast_index` reads index 0 along a dim of 1, a graph-defined
kernel's emitter gives a grid dim of one block no block index, row fusion (:mod:`gensorage.ugraph.optimize.
fuse_rows`) makes no grid dim of a dim of one block and maps no tensor dim of 1 onto a grid dim, and a batched
matmul's epilogue takes an extra operand's dims of 1 for broadcast ones (:mod:`gensorage.codegen.
generic_matmul`). At one token a length dim is 1, so every such choice differs from a longer length's, the code
differs in structure (``(f // 16) % n`` becomes ``0``, a norm's grid over the tokens disappears) and no compiled
variant of the first length matches. Each choice is a :func:`decide` point. Within :func:`scope` (the
dispatcher's CUDA lowerings, with a store per dispatcher), :func:`same_folds` records the decisions of an
emission at its key's first sight and replays them at later ones, so the code keeps its first length's
structure and differs in literals or shapes only (the generic variant's parameters and variables).

Exact: a replayed decision is taken only where it is among the exact ones at these values (each point lists
them). Not folding always is (``x // 1`` is ``x``, ``x % 1`` is 0, ``x // k`` is 0 and ``x % k`` is ``x`` for
``0 <= x < k``); a recorded fold only where its condition holds here; an index ``i`` instead of 0 along a dim
of 1 only where the indexed output's dim is 1 too (so ``i`` is 0); a grid dim of one block always (its index is
0). Anything else (another decision, another sequence of decisions) stops the replay and the code is made as
without it (:class:`Mismatch`).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Hashable, Iterator
from typing import TypeVar

_T = TypeVar("_T")

#: The decision that writes a term unfolded (exact wherever a fold is).
TERM = "term"
#: Records kept per store; beyond, a store is cleared (a copy then records afresh: never wrong).
_MAX_KEYS = 4096


class Mismatch(Exception):
    """A recorded decision that is not exact here, or another sequence of decisions: replay stops."""


class _Folds:
    def __init__(self, replay: tuple[str, ...] | None) -> None:
        self.taken: list[str] = []
        self._replay = replay
        self.replayed = False  # a replayed decision that is not the value rule's

    def decide(self, exact: tuple[str, ...]) -> str:
        """The decision to take among the ``exact`` ones here (the first: the value rule's): recorded, or the
        recorded one."""
        if self._replay is None:
            self.taken.append(exact[0])
            return exact[0]
        at = len(self.taken)
        if at >= len(self._replay):
            raise Mismatch("more decisions than recorded")
        want = self._replay[at]
        if want not in exact:
            raise Mismatch(f"decision {at}: recorded {want}, exact here {exact}")
        self.replayed |= want != exact[0]
        self.taken.append(want)
        return want

    def finish(self) -> None:
        if self._replay is not None and len(self.taken) != len(self._replay):
            raise Mismatch("fewer decisions than recorded")


_ACTIVE: contextvars.ContextVar[_Folds | None] = contextvars.ContextVar("gensorage_folds", default=None)
_STORE: contextvars.ContextVar[dict[Hashable, tuple[str, ...]] | None] = contextvars.ContextVar(
    "gensorage_fold_store", default=None
)


def decide(exact: tuple[str, ...]) -> str:
    """The decision at a fold point among the ``exact`` ones there (the first where no emission is recorded or
    replayed: the value rule's)."""
    folds = _ACTIVE.get()
    return exact[0] if folds is None else folds.decide(exact)


@contextlib.contextmanager
def scope(store: dict[Hashable, tuple[str, ...]]) -> Iterator[None]:
    """:func:`same_folds` records into and replays from ``store`` (one per dispatcher and target)."""
    token = _STORE.set(store)
    try:
        yield
    finally:
        _STORE.reset(token)


def same_folds(key: Hashable, emit: Callable[[], _T], replayed: list[bool] | None = None) -> _T:
    """``emit()`` with the decisions recorded under ``key`` at its first sight in the :func:`scope`'s store and
    replayed at later ones (made as without a record where the replay is not exact here); outside a scope,
    ``emit()``. ``replayed`` gets whether a replayed decision differs from the value rule's (else ``emit()``
    made what it makes without a record)."""
    store = _STORE.get()
    if replayed is not None:
        replayed.append(False)
    if store is None:
        return emit()
    recorded = store.get(key)
    folds = _Folds(recorded)
    token = _ACTIVE.set(folds)
    try:
        try:
            out = emit()
            folds.finish()
        finally:
            _ACTIVE.reset(token)
    except Mismatch:
        return emit()
    if replayed is not None:
        replayed[-1] = folds.replayed
    if recorded is None:
        if len(store) >= _MAX_KEYS:
            store.clear()
        store[key] = tuple(folds.taken)
    return out


__all__ = ["TERM", "Mismatch", "decide", "same_folds", "scope"]

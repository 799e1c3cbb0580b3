"""Kernel-level subtrees walked once: what a subtree holds depends only on a few facts of its root.

The children of a kernel-level node (and everything below them) are a function of the kernel tensors' shapes,
dtypes, abstract expressions, use counts, scale flags, constant factors and index ties, the number of kernel operators so far, the last
operator's rank key and the constant budgets left (and, under ``sub_stabilises_only`` or ``exp_stabilised_only``,
which tensors a pre-defined ``sub`` made). They do *not* depend on how earlier operators computed those
tensors. In a two-kernel search many first kernels (a split-K matmul with or without a loop, one grid size or
another) produce tensors that agree on all of these, and each would otherwise be followed by the same, often
large, walk of every second kernel. So the first walk below such a node is recorded: the logical counters it
added (states, pruned operators) and its *leaves*, the complete kernel graphs that passed the expression filter,
each as the operators appended below the node plus its output references. Another node with the same key
replays the leaves (the caller verifies each again with its own first kernels) and adds the counters, instead of
walking.

Why the key is exact:

* Tensor indices, operator numbering and ``Ref`` objects below the node depend only on the counts of tensors
  and operators, which the key fixes; so the recorded operators are valid at every node with that key.
* The rank key of the last operator matters only through comparisons with later operators' keys. Those are
  decided by its first three components unless a later operator has the same inputs and type code. When the
  next operator is the last the limits allow, it must read the last operator's outputs (still unconsumed), so
  no tie is possible and only the first three components enter the key; otherwise the whole rank key does.
* Everything else the walk consults (the oracle, shape rules, memory limits, the needed-operator bound, the
  dim strategy) is a pure function of the spec and of the keyed facts.

Counters are *logical*: a replay adds the recorded ``states`` and pruning counts, so a search reports the same
counts with or without reuse (``states_reused`` says how many were replayed instead of walked). A replay is
atomic: the stop flag is polled between walked states only.

A memo may serve one task (``run_task``'s default) or every task one process runs for one spec
(:func:`process_memo`; the runner and ``search_serial`` use it). A task's candidates and logical counters are
the same either way; only ``states_reused`` and the oracle's counters depend on which tasks ran before it in
the same process.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from gensorage.exhaustive.walk.search_state import SearchState
from gensorage.exhaustive.walk.stable_subs import kernel_sub_result
from gensorage.ugraph.ir import GraphDefinedOp, KernelNode, Ref

MAX_ENTRIES = 200_000  # memory bound per task: past it, new subtrees are walked but not recorded

Leaf = tuple[tuple[KernelNode, ...], tuple[Ref, ...]]  # operators below the node, output references


@dataclass(frozen=True, slots=True)
class Entry:
    """A recorded subtree: its logical counters and leaves, in walk order."""

    states: int
    pruned_expr: int
    pruned_shape: int
    pruned_memory: int
    leaves: tuple[Leaf, ...]


@dataclass(slots=True)
class Recording:
    """A subtree being walked for the first time: the operator count at its root and the leaves so far."""

    key: Hashable
    base: int
    start: tuple[int, int, int, int]
    leaves: list[Leaf] = field(default_factory=list)
    tests: int = 0  # the last-reads rule's numeric tests so far when it began (see Walk._store)


class Memo:
    """Recorded subtrees of one spec, by :func:`subtree_key`."""

    __slots__ = ("entries", "spec_key")

    def __init__(self, spec_key: str = "") -> None:
        self.spec_key = spec_key
        self.entries: dict[Hashable, Entry] = {}

    def get(self, key: Hashable) -> Entry | None:
        return self.entries.get(key)

    def full(self) -> bool:
        return len(self.entries) >= MAX_ENTRIES

    def put(self, key: Hashable, entry: Entry) -> None:
        self.entries[key] = entry


_process_memo = Memo()


def process_memo(spec_key: str) -> Memo:
    """This process's memo for the spec with key ``spec_key`` (a new spec replaces the previous one's)."""
    global _process_memo
    if _process_memo.spec_key != spec_key:
        _process_memo = Memo(spec_key)
    return _process_memo


def subtree_key(
    st: SearchState,
    max_kernel_ops: int,
    budget: tuple[int, ...],
    count_graphs: bool = False,
    stable_subs: bool = False,
) -> Hashable | None:
    """The key of the kernel-level node ``st`` is at, or None where reuse does not apply (inside a block graph,
    at the root, or where no operator may follow). With ``count_graphs`` (a ``max_block_graphs`` limit or
    ``graph_defined_last``) the graph-defined operators already placed decide which operators may follow, so
    their number is part of the key; with ``stable_subs`` (``sub_stabilises_only`` or ``exp_stabilised_only``)
    so do the tensors a pre-defined ``sub`` made (only an ``exp`` may read them, and only they an ``exp``)."""
    k = len(st.ops)
    if st.block is not None or k == 0 or k >= max_kernel_ops:
        return None
    last = st.last_key
    assert last is not None
    rank = last[:3] if k + 1 == max_kernel_ops else last
    return (
        k,
        tuple(st.shape),
        tuple(st.dtype),
        tuple(st.val),
        tuple(st.uses),
        tuple(st.scaled),
        tuple(st.const),
        tuple(st.ties),
        rank,
        budget,
        sum(isinstance(op, GraphDefinedOp) for op in st.ops) if count_graphs else None,
        tuple(kernel_sub_result(st, t) for t in range(len(st.shape))) if stable_subs else None,
    )


__all__ = ["MAX_ENTRIES", "Entry", "Leaf", "Memo", "Recording", "process_memo", "subtree_key"]

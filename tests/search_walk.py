"""A whole search walked task by task without subtree reuse: what the pruning-law tests compare; and a task's
node replayed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from gensorage.exhaustive import SearchSpec, enumerate_tasks, run_task
from gensorage.exhaustive.results import ugraph_key
from gensorage.exhaustive.walk import Walk


def candidates_and_states(spec: SearchSpec) -> tuple[list[str], int]:
    """The sorted structural keys of the candidates of ``spec`` (each once: how the search splits into tasks
    depends on what pruning leaves, and a µGraph two tasks find is one candidate) and the states walked."""
    keys: set[str] = set()
    states = 0
    for task in enumerate_tasks(spec):
        res = run_task(spec, task, reuse_subtrees=False)
        keys |= {ugraph_key(c.ugraph) for c in res.candidates}
        states += res.stats.states
    return sorted(keys), states


def assert_rule_prunes_only(spec: SearchSpec, switch_off: Callable[[], object]) -> None:
    """The law of a pruning rule: after ``switch_off()`` the same (non-empty) candidates, in more states."""
    with_rule, states_with = candidates_and_states(spec)
    switch_off()
    without_rule, states_without = candidates_and_states(spec)
    assert with_rule == without_rule and with_rule
    assert states_with < states_without


@contextmanager
def replayed(spec: SearchSpec, path: tuple[int, ...]) -> Iterator[Walk]:
    """The walk of ``spec`` standing at the node ``path`` names (a task's), its suspended generators closed on
    exit: read ``.state`` (or walk its children) inside the block."""
    w = Walk(spec)
    suspended = []
    try:
        for i in path:
            children = w.children()
            suspended.append(children)
            for j, _ in enumerate(children):
                if j == i:
                    break
        yield w
    finally:
        for c in reversed(suspended):
            c.close()

"""torch's work in the check of a small subgraph (its reference run, the comparison) takes one intra-op thread
(:func:`subgraph.check_threads`), and the process's setting is restored after it, also when the model raises."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gensorage.torch import subgraph  # noqa: E402


@pytest.fixture
def two_threads() -> object:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.usefixtures("two_threads")
def test_a_small_cpu_subgraph_runs_on_one_thread_and_the_setting_comes_back() -> None:
    args = (torch.ones(8, 64), torch.ones(64, 64))
    with subgraph.check_threads(args):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with pytest.raises(ZeroDivisionError), subgraph.check_threads(args):
        raise ZeroDivisionError
    assert torch.get_num_threads() == 2


@pytest.mark.usefixtures("two_threads")
def test_a_large_subgraph_keeps_the_threads() -> None:
    args = (torch.ones(subgraph.SMALL_REFERENCE_ELEMENTS + 1),)
    with subgraph.check_threads(args):
        assert torch.get_num_threads() == 2
    small = (torch.ones(subgraph.SMALL_REFERENCE_ELEMENTS),)
    with subgraph.check_threads(small):
        assert torch.get_num_threads() == 1


@pytest.mark.usefixtures("two_threads")
def test_overlapping_checks_of_two_threads_restore_the_setting() -> None:
    """Two threads' checks that overlap (the first ends while the second runs): the process keeps its setting.
    Each restoring the count it found left it at one thread (the second found the first's 1)."""
    args = (torch.ones(8, 64),)
    first, second = subgraph.check_threads(args), subgraph.check_threads(args)
    first.__enter__()
    second.__enter__()
    assert torch.get_num_threads() == 1
    first.__exit__(None, None, None)
    assert torch.get_num_threads() == 1  # the second check still runs
    second.__exit__(None, None, None)
    assert torch.get_num_threads() == 2

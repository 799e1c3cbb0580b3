"""Ctrl-C as stop requests (gensorage.interrupts): count, abort, grace, critical blocks, nesting."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from gensorage.interrupts import StopRequests, stop_requests


def press() -> None:
    os.kill(os.getpid(), signal.SIGINT)  # in the main thread the handler runs before kill returns


def test_the_first_press_is_a_request_the_second_an_abort_and_the_handler_is_restored() -> None:
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), stop_requests() as stops:
        press()
        assert stops.count == 1
        press()
    assert stops.count == 2
    assert signal.getsignal(signal.SIGINT) is before


def test_grace_makes_the_next_press_a_request_again() -> None:
    with stop_requests() as stops:
        press()
        assert stops.grace() == 1
        press()  # a request, not an abort
        assert stops.count == 2
        with pytest.raises(KeyboardInterrupt):
            press()


def test_an_abort_inside_a_critical_block_waits_for_its_end() -> None:
    done = []
    with stop_requests() as stops, pytest.raises(KeyboardInterrupt):
        press()
        with stops.critical():
            press()  # would abort: held back
            done.append("commit")
    assert done == ["commit"]


def test_nested_scopes_share_the_outermost_object() -> None:
    with stop_requests() as outer:
        press()
        with stop_requests() as inner:
            assert inner is outer and inner.count == 1
        assert signal.getsignal(signal.SIGINT) == outer.handle


def test_outside_the_main_thread_nothing_is_installed() -> None:
    seen: list[StopRequests] = []

    def run() -> None:
        with stop_requests() as stops:
            seen.append(stops)

    before = signal.getsignal(signal.SIGINT)
    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert seen and seen[0].count == 0 and signal.getsignal(signal.SIGINT) is before

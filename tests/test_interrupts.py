"""Ctrl-C during a teardown: the teardown finishes first (a lab, a job or a lease half torn down is what a game
day interrupted at the wrong moment left behind: a netns lab with its sshds), then the run stops. Real signals,
sent to this process."""

from __future__ import annotations

import os
import signal
import time

import pytest

from chaoskit.runner import FORCE_AFTER, interrupts_deferred


def _signal(signum: int) -> None:
    os.kill(os.getpid(), signum)
    time.sleep(0.05)  # the handler runs in the main thread at the next bytecode boundary


def test_ctrl_c_and_sigterm_wait_for_the_block_and_are_counted():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    said: list[str] = []
    done = []
    with interrupts_deferred(said.append) as came:
        _signal(signal.SIGINT)
        _signal(signal.SIGTERM)
        done.append("the rest of the teardown")
    assert done == ["the rest of the teardown"]
    assert came == [signal.SIGINT, signal.SIGTERM]
    assert said[-1] == f"interrupted: finishing the teardown first ({FORCE_AFTER - 2} more to abandon it)"
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C is Ctrl-C again after the block
        _signal(signal.SIGINT)


def test_the_third_ctrl_c_abandons_a_teardown_that_hangs():
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts_deferred() as came:
            for _ in range(FORCE_AFTER):
                _signal(signal.SIGINT)
            reached.append("after the third")
    assert not reached and len(came) == FORCE_AFTER
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

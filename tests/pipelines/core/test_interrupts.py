"""Ctrl-C in a run (pgmflow.core.interrupts): never dropped in a finalizer, never half-way through a store write."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from pgmflow.core import interrupts


@pytest.fixture
def handler():
    before = signal.getsignal(signal.SIGINT)
    assert interrupts.install()
    yield
    signal.signal(signal.SIGINT, before)
    interrupts._state.update(installed=False, pending=None, shield=0)


class Finalized:
    def __del__(self):
        signal.raise_signal(signal.SIGINT)  # Ctrl-C while a finalizer runs


def test_an_interrupt_in_a_finalizer_is_not_lost(handler):
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        obj = Finalized()
        del obj  # the handler runs inside __del__: deferred, sent again to the main thread
        time.sleep(5)  # interrupted by the second delivery
    assert time.monotonic() - t0 < 2


def test_python_alone_drops_it(tmp_path):
    """What the handler is for: with Python's own handler the same Ctrl-C is printed as ignored and lost."""
    code = (
        "import signal, time\n"
        "class F:\n"
        "    def __del__(self): signal.raise_signal(signal.SIGINT)\n"
        "o = F(); del o\n"
        "time.sleep(0.2); print('still running')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "still running" in r.stdout and "Exception ignored" in r.stderr


def test_a_shielded_block_finishes_before_the_interrupt(handler):
    done = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts.shielded():
            signal.raise_signal(signal.SIGINT)
            done.append("the write")  # still runs
    assert done == ["the write"]
    with interrupts.shielded():  # the interrupt was taken: a later block runs undisturbed
        done.append("later")
    assert done == ["the write", "later"]


def test_a_second_interrupt_in_a_shielded_block_raises_at_once(handler):
    done = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts.shielded():
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
            done.append("not reached")
    assert done == []


def test_elsewhere_it_raises_at_once(handler):
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)


def test_without_install_shielded_changes_nothing():
    assert not interrupts._state["installed"]
    with interrupts.shielded():
        pass

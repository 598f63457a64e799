"""The progress bar's ETA, driven by a fake clock: it counts only the work after the first completed
unit (which pays for compiling the kernels), and says "compiling kernels" until that unit completes."""

from __future__ import annotations

import io

from pgmflow.core.progress import Progress


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_the_eta_leaves_out_the_first_unit():
    clock = Clock()
    bar = Progress(101, "demo", "steps", stream=io.StringIO(), clock=clock)
    assert bar.eta() is None and "compiling kernels" in bar._line() and "ETA" not in bar._line()
    clock.now += 3600.0  # the first unit compiles for an hour
    bar.update(1)
    assert bar.eta() == float("inf") and "ETA --:--" in bar._line()  # no rate yet: one unit done
    clock.now += 10.0  # then 1 s per unit
    bar.update(10)
    assert bar.eta() == 90.0  # 90 units left at 1 s each, the hour of compiling left out
    assert "ETA 01:30" in bar._line() and "elapsed 1:00:10" in bar._line()
    clock.now += 5.0
    bar.update(90)
    assert bar.eta() == 0.0 and "ETA 00:00" in bar._line()


def test_a_terminal_bar_says_compiling_kernels_at_once():
    out = Tty()
    bar = Progress(10, "demo", "steps", stream=out, clock=Clock())
    assert "compiling kernels" in out.getvalue() and "0/10" in out.getvalue()
    bar.update(10)
    bar.close()
    assert out.getvalue().rstrip().endswith("ETA 00:00")


def test_a_log_stream_prints_nothing_before_the_first_unit():
    out = io.StringIO()
    bar = Progress(10, "demo", "steps", stream=out, clock=Clock())
    assert out.getvalue() == ""
    bar.update(1)
    assert out.getvalue().count("\n") == 1 and "ETA --:--" in out.getvalue()
    bar.close()

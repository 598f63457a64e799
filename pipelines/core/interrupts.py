"""Ctrl-C (SIGINT) that always stops a run, and never half-way through a write to the tracking store.

Python turns SIGINT into ``KeyboardInterrupt`` at whatever bytecode the main thread runs next. Two places are
wrong for it:

* **a finalizer** (``__del__``, a weak reference's callback such as ``WeakValueDictionary``'s ``remove``): Python
  prints "Exception ignored in ..." and drops the exception, so the run goes on as if no key had been pressed
  (seen: an interrupted tempering run still running 30 s later, ``tests/pipelines/core/test_warm.py``);
* **inside an MLflow call**: SQLAlchemy's session is left mid-transaction, and the run's own last write (its
  KILLED status) can then find the SQLite store locked.

:func:`install` (the CLI calls it) sets a handler that raises at once anywhere else, defers the interrupt out of
a finalizer (it is sent again to the main thread 50 ms later) and, inside :func:`shielded` (each MLflow call of
:class:`pgmflow.core.tracking.RetryingClient`), raises when the block ends. A second Ctrl-C inside a shielded
block raises at once: someone who presses twice means it.
"""

from __future__ import annotations

import contextlib
import signal
import threading

REDELIVER_S = 0.05
# (file name ends with, function name) of the standard library's weak-reference callbacks
_FINALIZERS = (
    ("weakref.py", "remove"),
    ("weakref.py", "_remove_dead_weakref"),
    ("weakref.py", "__call__"),
    ("_weakrefset.py", "_remove"),
)
_state = {"installed": False, "pending": None, "shield": 0}


def in_finalizer(frame) -> bool:
    """Whether ``frame`` or a frame below it is a finalizer, where an exception would be dropped."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__del__" or any(code.co_filename.endswith(f) and code.co_name == n for f, n in _FINALIZERS):
            return True
        frame = frame.f_back
    return False


def _redeliver() -> None:
    def send():
        with contextlib.suppress(Exception):  # the process may be exiting
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    t = threading.Timer(REDELIVER_S, send)
    t.daemon = True
    t.start()


def _handler(signum, frame):
    if _state["shield"] > 0:
        if _state["pending"] == "shield":  # a second Ctrl-C in the block
            _state["pending"] = None
            raise KeyboardInterrupt
        _state["pending"] = "shield"  # raised when the block ends
        return
    if in_finalizer(frame):
        _state["pending"] = "finalizer"  # sent again in REDELIVER_S
        _redeliver()
        return
    _state["pending"] = None
    raise KeyboardInterrupt


def install() -> bool:
    """Handle SIGINT as above in this process (from the main thread only; where SIGINT is ignored, it stays
    ignored). Returns whether the handler is installed."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        return False
    signal.signal(signal.SIGINT, _handler)
    _state["installed"] = True
    return True


@contextlib.contextmanager
def shielded():
    """Let the block finish before a Ctrl-C that arrives in it raises (at the block's end). In other threads, or
    without :func:`install`, a no-op."""
    if not _state["installed"] or threading.current_thread() is not threading.main_thread():
        yield
        return
    _state["shield"] += 1
    try:
        yield
    finally:
        _state["shield"] -= 1
        if _state["shield"] == 0 and _state["pending"] == "shield" and signal.getsignal(signal.SIGINT) is _handler:
            _state["pending"] = None
            raise KeyboardInterrupt

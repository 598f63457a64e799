"""One BLAS thread for every numerical task and for the driver's own numerics.

A multi-threaded BLAS splits a reduction (a ``ddot`` of more than 10,000 terms, a ``dgemv``, the
``k`` loop of some ``dgemm`` shapes) between its threads and adds the partial sums at the end, so
the bits of the result depend on how many threads it had. Measured here: a sparse-GP fit on the
synchronous scheduler (the tasks run in the driver, OpenBLAS at 2 threads on a 2-core machine)
differed in every fitted number from the same fit on one-thread workers. pgmflow therefore runs
every BLAS call with exactly :data:`BLAS_THREADS` thread(s) wherever it runs:

* in the driver, for the whole run (:func:`pinned_blas`, entered by the runner): the driver's
  numerics and the tasks of the synchronous scheduler, which run in the driver's thread;
* on every worker (``pgmflow.core.graph.PinBlasThreads``, a worker plugin the runner registers, so
  it also reaches workers pgmflow did not start: an address profile, SLURM jobs, late joiners).

Parallelism comes from the tasks (one per chunk, node, replica group), never from inside a BLAS call.
numba's ``prange`` kernels in ``tasks/`` write one output per iteration and reduce serially, so
their bits do not depend on ``NUMBA_NUM_THREADS`` either (checked by
``tests/pipelines/core/test_bit_reproducibility.py``).

``PGMFLOW_BLAS_THREADS=N`` in the driver's environment pins N threads instead (the same N
everywhere, so runs with the same N agree); ``PGMFLOW_BLAS_THREADS=0`` leaves BLAS alone: faster
synchronous runs of big problems, and bits that then depend on the machine's thread count.

``blas_summary()`` names the BLAS libraries in use (what ``pgmflow reproduce`` compares).
"""

from __future__ import annotations

import contextlib
import functools
import os

BLAS_THREADS = 1
BLAS_THREADS_ENV = "PGMFLOW_BLAS_THREADS"


def configured_threads() -> int | None:
    """The BLAS thread count pgmflow pins (``PGMFLOW_BLAS_THREADS``, default 1); None: left alone."""
    raw = os.environ.get(BLAS_THREADS_ENV, "").strip()
    if not raw:
        return BLAS_THREADS
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(
            f"{BLAS_THREADS_ENV}={raw!r} is not a whole number; fix: set it to 1 (the default, "
            "reproducible), another thread count, or 0 to leave BLAS alone"
        ) from None
    return n if n > 0 else None


@functools.lru_cache(maxsize=None)
def _controller():
    """A threadpoolctl controller over the BLAS libraries numpy and scipy load. scipy ships its own
    OpenBLAS, loaded by its first ``scipy.linalg`` import: import it first, or it would escape."""
    import numpy  # noqa: F401
    import scipy.linalg  # noqa: F401
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def blas_libraries() -> list[dict]:
    """``[{internal_api, version, architecture, threading_layer, num_threads, prefix}]`` per BLAS loaded."""
    keys = ("internal_api", "version", "architecture", "threading_layer", "num_threads", "prefix")
    return [{k: info.get(k) for k in keys} for info in _controller().info() if info.get("user_api") == "blas"]


def blas_summary() -> str:
    """One line naming each BLAS in use, e.g. ``openblas 0.3.30 Haswell pthreads (libscipy_openblas)``."""
    parts = [
        f"{b['internal_api']} {b['version']} {b['architecture'] or ''} {b['threading_layer'] or ''} "
        f"({b['prefix']})".replace("  ", " ")
        for b in blas_libraries()
    ]
    return "; ".join(sorted(parts)) or "none found"


def set_blas_threads(n: int = BLAS_THREADS) -> None:
    """Limit every BLAS library of this process to ``n`` threads, for good (a worker's setting)."""
    _controller().limit(limits=n, user_api="blas")


@contextlib.contextmanager
def pinned_blas(n: int | None = None):
    """Every BLAS library of this process limited to ``n`` threads (default :func:`configured_threads`)
    inside the block, restored after; nothing is changed when that is None."""
    n = configured_threads() if n is None else n
    if n is None:
        yield
        return
    with _controller().limit(limits=n, user_api="blas"):
        yield


def worker_blas_threads() -> list[int]:
    """The thread count of each BLAS library of this process (what a test asks a worker)."""
    return [int(b["num_threads"]) for b in blas_libraries()]

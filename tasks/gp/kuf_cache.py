"""A per-process store of ``Kuf`` between the two passes of one evaluation of a sparse-GP bound.

Both passes of an evaluation need the same cross-covariance ``Kuf = K(Z, X_c)`` [m, n_c] of each
chunk: the statistics pass (``psi1y = Kuf y``, ``psi2 = Kuf Kfu``) and the gradient pass
(``P Kuf``, the kernel's adjoint). Computing it is one thin GEMM and ``m n_c`` exponentials, about
a third of the statistics pass; the statistics task leaves it here and the gradient task of the
same chunk, which Dask places on the worker that holds the chunk, takes it.

The tasks stay pure: an entry is keyed by a digest of everything ``Kuf`` is computed from (the
kernel, the lengthscales and scale, ``Z`` and the chunk's rows, their bytes), is read-only, and is
exactly the array :func:`pgmflow.tasks.gp.stats.cross_covariance` returns for them; a miss (another
worker, a retried task, a full store, a new process) computes the same bits again.

Memory: at most ``PGMFLOW_GP_KUF_CACHE_MB`` MiB per process (default 512; 0 turns the store off).
An entry is taken out by the gradient task that uses it; when a new entry would not fit, the
oldest ones go first (the statistics pass visits the chunks in the order the gradient pass will,
so a store smaller than a worker's share of ``Kuf`` still serves the chunks stored last).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict

import numpy as np

__all__ = ["KUF_CACHE_ENV", "budget_bytes", "clear", "counts", "key", "nbytes", "put", "take"]

KUF_CACHE_ENV = "PGMFLOW_GP_KUF_CACHE_MB"
DEFAULT_MB = 512

_lock = threading.Lock()
_store: OrderedDict[bytes, np.ndarray] = OrderedDict()
_counts = {"hits": 0, "misses": 0}


def budget_bytes() -> int:
    """The store's limit in bytes, from ``PGMFLOW_GP_KUF_CACHE_MB`` (MiB; default 512, 0: off)."""
    raw = os.environ.get(KUF_CACHE_ENV, "").strip()
    if not raw:
        return DEFAULT_MB << 20
    try:
        mb = float(raw)
    except ValueError:
        raise ValueError(f"{KUF_CACHE_ENV}={raw!r} is not a number; fix: set it to the MiB a worker may keep "
                         f"for Kuf between the passes (default {DEFAULT_MB}), or 0 to turn that off") from None
    return max(int(mb * (1 << 20)), 0)


def key(kernel: str, params, Z, X) -> bytes:
    """A digest of what ``Kuf = K(Z, X)`` depends on: the kernel, ``log_lengthscale``,
    ``log_variance``, ``Z`` [m, d] and ``X`` [n, d] (as float64, C order). Not the noise."""
    h = hashlib.sha256()  # SHA extensions: ~1.5 GB/s, three times blake2b here
    h.update(kernel.encode())
    h.update(np.ascontiguousarray(params.log_lengthscale, dtype=np.float64).tobytes())
    h.update(np.float64(params.log_variance).tobytes())
    for A in (Z, X):
        A = np.ascontiguousarray(A, dtype=np.float64)
        h.update(np.asarray(A.shape, dtype=np.int64).tobytes())
        h.update(A.tobytes())
    return h.digest()


def put(k: bytes, Kuf: np.ndarray) -> bool:
    """Keep ``Kuf`` (made read-only) under ``k``, dropping the oldest entries to make room. Returns
    whether it was kept (not when it alone is larger than the budget)."""
    limit = budget_bytes()
    if Kuf.nbytes > limit:
        return False
    Kuf.flags.writeable = False
    with _lock:
        _store.pop(k, None)
        used = sum(v.nbytes for v in _store.values())
        while _store and used + Kuf.nbytes > limit:
            used -= _store.popitem(last=False)[1].nbytes
        _store[k] = Kuf
    return True


def take(k: bytes) -> np.ndarray | None:
    """The ``Kuf`` kept under ``k``, removed from the store; None when there is none."""
    with _lock:
        Kuf = _store.pop(k, None)
        _counts["misses" if Kuf is None else "hits"] += 1
        return Kuf


def nbytes() -> int:
    """Bytes held now."""
    with _lock:
        return sum(v.nbytes for v in _store.values())


def counts() -> dict:
    """``{"hits": ..., "misses": ...}`` of :func:`take` in this process so far."""
    with _lock:
        return dict(_counts)


def clear() -> None:
    """Drop every entry (the counts stay)."""
    with _lock:
        _store.clear()

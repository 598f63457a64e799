"""A per-process store of ``Kuf`` between the two passes of one evaluation of a sparse-GP bound.

Both passes of an evaluation need the same cross-covariance ``Kuf = K(Z, X_c)`` [m, n_c] of each
chunk: the statistics pass (``A = L^-1 Kuf``, ``A y``, ``A A'``) and the gradient pass
(``P Kuf``, the kernel's adjoint). Computing it is one thin GEMM and ``m n_c`` exponentials, about
a third of the statistics pass before its triangular solve was added (issue 37); the statistics task
leaves it here and the gradient task of the same chunk, which Dask places on the worker that holds
the chunk, takes it.

The tasks stay pure: an entry is keyed by a digest of everything ``Kuf`` is computed from (the
kernel, the lengthscales and scale, ``Z`` and the chunk's rows, their bytes), is read-only, and is
exactly the array :func:`pgmflow.tasks.gp.stats.cross_covariance` returns for them; a miss (another
worker, a retried task, a full store, a new process) computes the same bits again.

The SGPR statistics pass in its whitened form (``pgmflow.tasks.gp.fused.plain_inverse``: a badly conditioned
``Kuu``) also leaves the chunk's ``A = L^-1 Kuf`` here (:func:`key_a`: keyed by ``Kuf``'s key and ``L``), so
that the gradient pass needs no triangular solve; it goes and comes back like ``Kuf``.

Memory: at most ``PGMFLOW_GP_KUF_CACHE_MB`` MiB per process (default 512; 0 turns the store off).
An entry is taken out by the gradient task that uses it; when a new entry would not fit, the
oldest ones go first (the statistics pass visits the chunks in the order the gradient pass will,
so a store smaller than a worker's share of ``Kuf`` still serves the chunks stored last).

Buffers: a gradient task hands the ``Kuf`` it took back with :func:`recycle`, and the next
statistics task of the same size writes its ``Kuf`` into it (:func:`buffer`). Without that each
statistics task would ask the kernel for 20 MB of fresh pages (Dask's nanny sets
``MALLOC_TRIM_THRESHOLD_``, so glibc returns every large free at once) and pay a page fault for
each 4 KiB of them. Free buffers count against the same budget and are the first to go.
"""

from __future__ import annotations

import hashlib
import os
import threading
import weakref
from collections import OrderedDict

import numpy as np

__all__ = [
    "KUF_CACHE_ENV",
    "budget_bytes",
    "buffer",
    "clear",
    "counts",
    "free_bytes",
    "key",
    "key_a",
    "nbytes",
    "put",
    "recycle",
    "take",
]

KUF_CACHE_ENV = "PGMFLOW_GP_KUF_CACHE_MB"
DEFAULT_MB = 512

_lock = threading.Lock()
_store: OrderedDict[bytes, np.ndarray] = OrderedDict()
_free: list[np.ndarray] = []  # float64 arrays handed back by recycle(), newest last
_counts = {"hits": 0, "misses": 0}


def budget_bytes() -> int:
    """The store's limit in bytes, from ``PGMFLOW_GP_KUF_CACHE_MB`` (MiB; default 512, 0: off)."""
    raw = os.environ.get(KUF_CACHE_ENV, "").strip()
    if not raw:
        return DEFAULT_MB << 20
    try:
        mb = float(raw)
    except ValueError:
        raise ValueError(
            f"{KUF_CACHE_ENV}={raw!r} is not a number; fix: set it to the MiB a worker may keep "
            f"for Kuf between the passes (default {DEFAULT_MB}), or 0 to turn that off"
        ) from None
    return max(int(mb * (1 << 20)), 0)


def key(kernel: str, params, Z, X) -> bytes:
    """A digest of what ``Kuf = K(Z, X)`` depends on: the kernel, ``log_lengthscale``,
    ``log_variance``, ``Z`` [m, d] and ``X`` [n, d] (as float64, C order). Not the noise."""
    h = hashlib.sha256()  # SHA extensions: ~1.5 GB/s, three times blake2b here
    h.update(kernel.encode())
    h.update(np.ascontiguousarray(params.log_lengthscale, dtype=np.float64).tobytes())
    h.update(np.float64(params.log_variance).tobytes())
    h.update(_digest(Z))
    h.update(_x_digest(X))
    return h.digest()


def _digest(A) -> bytes:
    A = np.ascontiguousarray(A, dtype=np.float64)
    h = hashlib.sha256(np.asarray(A.shape, dtype=np.int64).tobytes())
    h.update(memoryview(A).cast("B"))
    return h.digest()


_x_digests: dict[int, tuple] = {}  # id(X) -> (weak reference to X, digest of X)


def _x_digest(X) -> bytes:
    """:func:`_digest` of a chunk's rows, computed once per array object in this process (0.5 ms for
    10,000 x 10 rows, at every task otherwise): a chunk held by a worker is the same object in every
    task, and tasks never modify their inputs (Dask's rule, and pgmflow's: tasks are pure). A weak
    reference checks that the object is still the one hashed, and the entry goes with the array."""
    if not isinstance(X, np.ndarray):
        return _digest(X)
    i = id(X)
    with _lock:
        hit = _x_digests.get(i)
    if hit is not None and hit[0]() is X:
        return hit[1]
    d = _digest(X)
    try:
        ref = weakref.ref(X, lambda _r, i=i: _x_digests.pop(i, None))
    except TypeError:
        return d
    with _lock:
        _x_digests[i] = (ref, d)
    return d


def put(k: bytes, Kuf: np.ndarray) -> bool:
    """Keep ``Kuf`` (made read-only) under ``k``, dropping the oldest entries to make room. Returns
    whether it was kept (not when it alone is larger than the budget)."""
    limit = budget_bytes()
    if Kuf.nbytes > limit:
        return False
    Kuf.flags.writeable = False
    with _lock:
        _store.pop(k, None)
        used = _used()
        while _free and used + Kuf.nbytes > limit:
            used -= _free.pop(0).nbytes
        while _store and used + Kuf.nbytes > limit:
            used -= _store.popitem(last=False)[1].nbytes
        _store[k] = Kuf
    return True


def _used() -> int:
    return sum(v.nbytes for v in _store.values()) + sum(b.nbytes for b in _free)


def buffer(shape, order: str = "F") -> np.ndarray | None:
    """A writeable float64 array of this shape and memory order (``"C"`` or ``"F"``) handed back by
    :func:`recycle`, taken out of the free list; None when there is none."""
    shape = tuple(int(v) for v in shape)
    flag = "f_contiguous" if order == "F" else "c_contiguous"
    with _lock:
        for i in range(len(_free) - 1, -1, -1):
            if _free[i].shape == shape and getattr(_free[i].flags, flag):
                return _free.pop(i)
    return None


def recycle(Kuf: np.ndarray) -> None:
    """Hand back a ``Kuf`` that :func:`take` returned and that nothing uses any more: a later
    :func:`buffer` of the same shape may write over it. Kept while within the budget."""
    if not isinstance(Kuf, np.ndarray) or Kuf.dtype != np.float64 or Kuf.base is not None:
        return  # only whole arrays this process allocated
    if not (Kuf.flags.c_contiguous or Kuf.flags.f_contiguous):
        return
    with _lock:
        if any(Kuf is v for v in _store.values()) or any(Kuf is b for b in _free):
            return
        if _used() + Kuf.nbytes > budget_bytes():
            return
        Kuf.flags.writeable = True
        _free.append(Kuf)


def take(k: bytes, count: bool = True) -> np.ndarray | None:
    """The ``Kuf`` (or ``A``) kept under ``k``, removed from the store; None when there is none. ``count``:
    whether the hit or miss goes into :func:`counts` (which counts ``Kuf`` alone)."""
    with _lock:
        Kuf = _store.pop(k, None)
        if count:
            _counts["misses" if Kuf is None else "hits"] += 1
        return Kuf


def key_a(k: bytes, L) -> bytes:
    """The key of a chunk's whitened ``A = L^-1 Kuf`` (SGPR's statistics pass keeps it for the gradient
    pass, ``pgmflow.tasks.gp.fused.rbf_stats``): its ``Kuf``'s key ``k`` and the bytes of the Cholesky
    factor ``L`` [m, m] it was solved with."""
    h = hashlib.sha256(b"A:" + k)
    h.update(_digest(L))
    return h.digest()


def nbytes() -> int:
    """Bytes held now."""
    with _lock:
        return sum(v.nbytes for v in _store.values())


def free_bytes() -> int:
    """Bytes of the buffers handed back and not yet reused."""
    with _lock:
        return sum(b.nbytes for b in _free)


def counts() -> dict:
    """``{"hits": ..., "misses": ...}`` of :func:`take` in this process so far."""
    with _lock:
        return dict(_counts)


def clear() -> None:
    """Drop every entry and every free buffer (the counts stay)."""
    with _lock:
        _store.clear()
        _free.clear()

"""Philox4x32-10, the counter-based generator of Salmon et al. (2011), "Parallel random numbers:
as easy as 1, 2, 3" (the Random123 library).

A counter-based generator is a pure function ``(counter, key) -> 128 random bits``: any number
can be recomputed from its identity (sweep, site, replica, chain) alone, so CPU and GPU kernels
and any placement of work on workers draw the same bits. Two implementations live here:

* :func:`philox4x32_numpy` -- a vectorised NumPy reference over arrays of counters and keys;
* :func:`numba_philox4x32` -- the module-level kernel ``_philox4x32``, compiled on first use, that
  other numba kernels call per counter (it inlines, and vectorises when called in a plain loop).

The CUDA C version used by the GPU kernels lives next to its kernel (it needs ``__umulhi``);
all three are tested against the Random123 known-answer vectors (``kat_vectors``) and against
each other.

Algorithm (10 rounds; ``mulhilo(a, b)`` is the 64-bit product of two 32-bit words split into
its high and low word)::

    for round in range(10):
        if round > 0: k0 += W0; k1 += W1            # key schedule (Weyl sequence), mod 2**32
        hi0, lo0 = mulhilo(M0, c0)
        hi1, lo1 = mulhilo(M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
"""

from __future__ import annotations

import functools
import sys

import numpy as np

from pgmflow.tasks import backend

__all__ = [
    "PHILOX_M0",
    "PHILOX_M1",
    "PHILOX_W0",
    "PHILOX_W1",
    "PHILOX_ROUNDS",
    "philox4x32_numpy",
    "numba_philox4x32",
]

PHILOX_M0 = 0xD2511F53  # multiplier applied to counter word 0
PHILOX_M1 = 0xCD9E8D57  # multiplier applied to counter word 2
PHILOX_W0 = 0x9E3779B9  # key-schedule increment of key word 0 (golden ratio)
PHILOX_W1 = 0xBB67AE85  # key-schedule increment of key word 1 (sqrt(3) - 1)
PHILOX_ROUNDS = 10

_MASK32 = np.uint64(0xFFFFFFFF)
_SHIFT32 = np.uint64(32)


def philox4x32_numpy(counter, key) -> np.ndarray:
    """Philox4x32-10 of each counter under each key, vectorised with NumPy.

    Parameters
    ----------
    counter : array_like of uint32, shape [..., 4]
        Counter words ``(c0, c1, c2, c3)``; integer values must lie in [0, 2**32).
    key : array_like of uint32, shape [..., 2]
        Key words ``(k0, k1)``; broadcast against ``counter``'s leading dimensions.

    Returns
    -------
    numpy.ndarray of uint32, shape [broadcast(...), 4]
        The four output words.

    The arithmetic is done in uint64 (a product of two 32-bit words fits exactly), so the result
    is bit-identical to Random123's ``philox4x32(ctr, key)`` with the default 10 rounds.
    """
    ctr = np.asarray(counter)
    k = np.asarray(key)
    if ctr.shape[-1:] != (4,):
        raise ValueError(f"counter must have shape [..., 4], got {ctr.shape}")
    if k.shape[-1:] != (2,):
        raise ValueError(f"key must have shape [..., 2], got {k.shape}")
    for name, a in (("counter", ctr), ("key", k)):
        if a.dtype.kind not in "iu":
            raise TypeError(f"{name} must be an integer array, got dtype {a.dtype}")
        if a.size and (int(a.min()) < 0 or int(a.max()) > 0xFFFFFFFF):
            raise ValueError(f"{name} words must lie in [0, 2**32)")
    lead = np.broadcast_shapes(ctr.shape[:-1], k.shape[:-1])
    ctr = np.broadcast_to(ctr, lead + (4,)).astype(np.uint64)
    k = np.broadcast_to(k, lead + (2,)).astype(np.uint64)
    c0, c1, c2, c3 = (ctr[..., w].copy() for w in range(4))
    k0, k1 = k[..., 0].copy(), k[..., 1].copy()
    m0, m1 = np.uint64(PHILOX_M0), np.uint64(PHILOX_M1)
    w0, w1 = np.uint64(PHILOX_W0), np.uint64(PHILOX_W1)
    for rnd in range(PHILOX_ROUNDS):
        if rnd > 0:
            k0 = (k0 + w0) & _MASK32
            k1 = (k1 + w1) & _MASK32
        p0 = m0 * c0  # [...] uint64, exact: both factors < 2**32
        p1 = m1 * c2
        hi0, lo0 = p0 >> _SHIFT32, p0 & _MASK32
        hi1, lo1 = p1 >> _SHIFT32, p1 & _MASK32
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return np.stack([c0, c1, c2, c3], axis=-1).astype(np.uint32)


# numba kernel: a plain module-level function marked for numba and compiled on first use by
# numba_philox4x32() (pgmflow.tasks.backend.compile_kernels). Its constants are module globals, which numba
# freezes into the compiled code.
_M0 = np.uint64(PHILOX_M0)
_M1 = np.uint64(PHILOX_M1)
_W0 = np.uint64(PHILOX_W0)
_W1 = np.uint64(PHILOX_W1)


@backend.kernel(inline="always", cache=True, fastmath=False, nogil=True)
def _philox4x32(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 of one counter ``(c0, c1, c2, c3)`` and key ``(k0, k1)``; see :func:`numba_philox4x32`."""
    x0 = np.uint64(c0) & _MASK32
    x1 = np.uint64(c1) & _MASK32
    x2 = np.uint64(c2) & _MASK32
    x3 = np.uint64(c3) & _MASK32
    y0 = np.uint64(k0) & _MASK32
    y1 = np.uint64(k1) & _MASK32
    for rnd in range(10):
        if rnd > 0:
            y0 = (y0 + _W0) & _MASK32
            y1 = (y1 + _W1) & _MASK32
        p0 = _M0 * x0
        p1 = _M1 * x2
        n0 = (p1 >> _SHIFT32) ^ x1 ^ y0
        n2 = (p0 >> _SHIFT32) ^ x3 ^ y1
        x1 = p1 & _MASK32
        x3 = p0 & _MASK32
        x0 = n0
        x2 = n2
    return x0, x1, x2, x3


@functools.lru_cache(maxsize=None)
def numba_philox4x32():
    """Compile (once per process; numba's on-disk cache serves later processes) and return the numba device
    function ``philox(c0, c1, c2, c3, k0, k1)``.

    The returned function is ``njit(inline='always', cache=True)``; call it from other numba
    kernels (or from Python, for tests). Every argument is an integer holding a 32-bit word
    (any numba integer type; it is reduced mod 2**32). It returns a tuple of four ``uint64``
    scalars, each holding one uint32 output word in [0, 2**32) -- kept in uint64 so callers can
    compare them with 64-bit thresholds without a cast and without numba's mixed-sign integer
    promotion to float64.
    """
    return backend.compile_kernels(sys.modules[__name__])["_philox4x32"]

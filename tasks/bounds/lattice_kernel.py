"""The CPU kernel for TRW / loopy BP messages on lattices: the same damped synchronous iterates as
``messages.lattice_messages_xp``, with no transcendental function per message.

A message is kept as ``w = exp(2u)`` (``u`` its log-ratio). For binary spins the update
``u_{t->s} = atanh(tanh(K) tanh(a))`` with cavity field ``a = h_t + sum_v rho_v u_{v->t} - u_{s->t}``
becomes rational in ``A = exp(2a) = exp(2h_t) (prod_v w_{v->t})^rho / w_{s->t}``:

    w_{t->s} = (A p + q) / (A q + p),   p = 1 + tanh K = 2 / (1 + e^{-2K}),  q = 1 - tanh K = 2 / (1 + e^{2K}),

and damping in log space, ``u <- (1-d) u + d u_new``, is the weighted geometric mean
``w <- w^(1-d) w_new^d`` (a square root at the default d = 1/2). With one rho for every bond
(loopy BP: 1; TRW on a periodic lattice: (n-1)/E) the power ``(prod w)^rho`` costs one exp and one
log per *site*; per message there are only products, two divisions and a square root, which the
CPU does several times faster than exp and log1p, and the row loops are contiguous and
branch-free so the compiler vectorises them. Convergence, ``max |du| < tol``, is tested exactly as
``exp(-2 tol) < w_new / w_old < exp(2 tol)`` (by multiplications, no division).

Overflow: ``|u| <= |K|`` for every message, so ``|2a| <= 2 |h| + 10 max|K|``; models where this
exceeds 600 (far beyond any Ising temperature of interest) are left to the log-domain path, as
are bonds with different rho and damping other than 1/2 or 1 (:func:`applicable`).
"""

from __future__ import annotations

import functools
import math
import sys

import numpy as np

from pgmflow.tasks import backend
from pgmflow.tasks.bounds.messages import LatticeMessages, _lattice_prepare, check_run_args

OVERFLOW_LIMIT = 600.0

# Plain module-level functions marked for numba; _kernels() compiles them (pgmflow.tasks.backend.compile_kernels)
# and rebinds their names to the dispatchers, prange to numba.prange (as plain Python, range).
prange = range


@backend.kernel(cache=True, nogil=True, fastmath=False)
def _send(b, w_back, p, q, old, out, lo, hi, sqrt_damp):
    """One direction along a row: ``out[k] = damp(old[k], (A p + q) / (A q + p))``, ``A = b / w_back``.
    Returns how many messages moved by more than the tolerance (or are NaN). Contiguous and
    branch-free, so the compiler vectorises it (divisions and square roots, no exp or log)."""
    moved = 0
    for k in range(out.shape[0]):
        A = b[k] / w_back[k]
        v = (A * p[k] + q[k]) / (A * q[k] + p[k])
        if sqrt_damp:
            v = math.sqrt(old[k] * v)
        moved += not (old[k] * lo < v < old[k] * hi)
        out[k] = v
    return moved


@backend.kernel(cache=True, nogil=True, fastmath=False, parallel=True)
def _iterate(e2h, pr, qr, pd, qd, periodic, rho, sqrt_damp, wL, wR, wU, wD, max_iter, tol):
    L, W = e2h.shape
    B = np.empty((L, W))
    nL = wL.copy()
    nR = wR.copy()
    nU = wU.copy()
    nD = wD.copy()
    moved = np.zeros(L, np.int64)
    lo = math.exp(-2.0 * tol)
    hi = math.exp(2.0 * tol)
    it = 0
    converged = False
    while it < max_iter:
        it += 1
        for r in prange(L):
            for c in range(W):
                P = wL[r, c] * wR[r, c] * wU[r, c] * wD[r, c]
                B[r, c] = e2h[r, c] * (P if rho == 1.0 else math.exp(rho * math.log(P)))
        for r in prange(L):
            m = 0
            # to the right neighbour (r, c+1), into its left slot; bond (r, c)
            m += _send(
                B[r, : W - 1], wR[r, : W - 1], pr[r, : W - 1], qr[r, : W - 1], wL[r, 1:], nL[r, 1:], lo, hi, sqrt_damp
            )
            # to the left neighbour (r, c-1), into its right slot; bond (r, c-1)
            m += _send(
                B[r, 1:], wL[r, 1:], pr[r, : W - 1], qr[r, : W - 1], wR[r, : W - 1], nR[r, : W - 1], lo, hi, sqrt_damp
            )
            if periodic:  # the wrapping bond (r, W-1) - (r, 0)
                m += _send(
                    B[r, W - 1 :],
                    wR[r, W - 1 :],
                    pr[r, W - 1 :],
                    qr[r, W - 1 :],
                    wL[r, :1],
                    nL[r, :1],
                    lo,
                    hi,
                    sqrt_damp,
                )
                m += _send(
                    B[r, :1],
                    wL[r, :1],
                    pr[r, W - 1 :],
                    qr[r, W - 1 :],
                    wR[r, W - 1 :],
                    nR[r, W - 1 :],
                    lo,
                    hi,
                    sqrt_damp,
                )
            if r < L - 1 or periodic:  # down to (r+1, c), into its upper slot; bond (r, c)
                rd = (r + 1) % L
                m += _send(B[r], wD[r], pd[r], qd[r], wU[rd], nU[rd], lo, hi, sqrt_damp)
            if r > 0 or periodic:  # up to (r-1, c), into its lower slot; bond (r-1, c)
                ru = (r - 1) % L
                m += _send(B[r], wU[r], pd[ru], qd[ru], wD[ru], nD[ru], lo, hi, sqrt_damp)
            moved[r] = m
        total = 0
        for r in range(L):
            total += moved[r]
        for r in prange(L):
            for c in range(W):
                wL[r, c] = nL[r, c]
                wR[r, c] = nR[r, c]
                wU[r, c] = nU[r, c]
                wD[r, c] = nD[r, c]
        if total == 0:
            converged = True
            break
    return it, converged


@functools.lru_cache(maxsize=None)
def _kernels():
    """Compile the kernels above (once per process; numba's on-disk cache serves later processes). Returns the
    lattice iteration dispatcher."""
    return backend.compile_kernels(sys.modules[__name__], bind={"prange": backend.numba().prange})["_iterate"]


def applicable(h, Jr, Jd, rho_r, rho_d, damping) -> bool:
    """Whether the fast kernel applies: NumPy arrays, one rho for every bond, damping 1/2 or 1, and
    no risk of overflow in ``exp(2a)``."""
    if backend.array_module(h) is not np or damping not in (0.5, 1.0):
        return False
    r = np.concatenate([np.ravel(rho_r), np.ravel(rho_d)])
    if not np.all(r == r[0]):
        return False
    kmax = max(float(np.abs(Jr).max(initial=0.0)), float(np.abs(Jd).max(initial=0.0))) / float(r[0])
    return 2.0 * float(np.abs(h).max(initial=0.0)) + 10.0 * kmax <= OVERFLOW_LIMIT


def lattice_messages_numba(
    h,
    Jr,
    Jd,
    rho_r,
    rho_d,
    periodic: bool = True,
    damping: float = 0.5,
    max_iter: int = 10000,
    tol: float = 1e-10,
    u0: float = 0.0,
) -> LatticeMessages:
    """Same signature and iterates as ``messages.lattice_messages_xp`` (NumPy arrays), by the numba
    kernel above; returns the log-ratio messages. Raises ValueError where :func:`applicable` is false."""
    d, max_iter, tol = check_run_args(damping, max_iter, tol)
    xp, h, Jr, Jd, rho_r, rho_d, mask_r, mask_d = _lattice_prepare(h, Jr, Jd, rho_r, rho_d, periodic)
    if not applicable(h, Jr, Jd, rho_r, rho_d, d):
        raise ValueError(
            "the w-domain lattice kernel needs NumPy arrays, one rho for all bonds, damping 0.5 or 1 "
            "and moderate couplings; use messages.lattice_messages_xp"
        )
    rho = float(np.ravel(rho_r)[0])
    Kr, Kd = Jr / rho, Jd / rho
    pr, qr = 2.0 / (1.0 + np.exp(-2.0 * Kr)), 2.0 / (1.0 + np.exp(2.0 * Kr))
    pd, qd = 2.0 / (1.0 + np.exp(-2.0 * Kd)), 2.0 / (1.0 + np.exp(2.0 * Kd))
    L, W = h.shape
    mask_l = np.roll(mask_r, 1, axis=1)
    mask_u = np.roll(mask_d, 1, axis=0)
    w = [np.where(m, math.exp(2.0 * float(u0)), 1.0) for m in (mask_l, mask_r, mask_u, mask_d)]
    run = _kernels()
    it, conv = run(
        np.exp(2.0 * h), pr, qr, pd, qd, bool(periodic), rho, d == 0.5, w[0], w[1], w[2], w[3], max_iter, tol
    )
    uL, uR, uU, uD = (0.5 * np.log(x) for x in w)
    return LatticeMessages(uL, uR, uU, uD, int(it), bool(conv))

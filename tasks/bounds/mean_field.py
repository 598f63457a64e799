"""Naive mean field for pairwise binary MRFs: a lower bound on ``log Z`` (Wainwright and
Jordan 2008, "Graphical models, exponential families, and variational inference", section 5.3).

Model (``pgmflow.tasks.bounds.mrf``): ``P(x) ∝ exp(sum_i h_i x_i + sum_e J_e x_i x_j)``, x in {-1,+1}^n.
With a fully factorised ``q(x) = prod_i q_i(x_i)`` and ``m_i = E_q[x_i]`` the Gibbs variational
principle ``log Z = max_q E_q[log-potential] + H(q)`` restricted to product distributions gives

    F(m) = sum_i h_i m_i + sum_e J_e m_i m_j + sum_i H_b((1 + m_i) / 2)  <=  log Z

for every m in [-1, 1]^n (H_b the binary entropy in nats). ``F`` is concave in each ``m_i``
alone (a linear term plus the strictly concave ``H_b``), maximised over ``m_i`` at
``m_i = tanh(h_i + sum_j J_ij m_j)`` -- the mean-field update, "the mean field of the neighbours
as a message". Updating one node at a time (Gauss-Seidel sweeps) is coordinate
ascent: no update decreases ``F``, so the bound is monotone over sweeps and converges to a fixed
point (a local maximum or, from a symmetric start, a saddle).

Damping: ``m_i <- damping * m_i + (1 - damping) * tanh(h_i + sum_j J_ij m_j)``, ``0 <= damping < 1``
(``damping = 0``: plain coordinate ascent). The damped update is still an ascent step: on the
segment from the current ``m_i`` to the coordinate maximiser ``m_i*`` the concave function
``g(t) = F(m_i + t (m_i* - m_i))`` satisfies ``g(t) >= (1 - t) g(0) + t g(1) >= g(0)`` for
``t = 1 - damping`` in (0, 1]. So the bound stays monotone with damping too.

MF has several fixed points in general (a ferromagnet below T_c: m = 0 is a saddle and the two
magnetised states are the maxima), so :func:`mean_field` runs from several starts and keeps the
best bound; every start gives a valid lower bound.

The sweeps run in a numba kernel over the CSR adjacency (``mrf.adjacency``).
"""

from __future__ import annotations

import functools
import math
import sys
from typing import NamedTuple

import numpy as np

from pgmflow.tasks import backend
from pgmflow.tasks import rng as _rng
from pgmflow.tasks.bounds import mrf as _mrf
from pgmflow.tasks.bounds.mrf import PairwiseMRF

__all__ = ["STAGE_MEAN_FIELD", "MFResult", "mean_field", "mf_bound", "mf_residual"]

# Spawn-key stage of the random restarts (identity: restart index). Not yet listed in tasks/rng.py.
STAGE_MEAN_FIELD = _rng.STAGE_MEAN_FIELD  # 15, registered in tasks/rng.py

_LOG2 = math.log(2.0)


class MFResult(NamedTuple):
    """The best naive mean-field solution over all starts."""

    log_z_lower: float  # F(mean) <= log Z: the Gibbs/ELBO lower bound at the returned means
    mean: np.ndarray  # float64 [n]: m_i = E_q[x_i] of the factorised q
    n_iter: int  # sweeps run by the winning start (each sweep updates every node once)
    converged: bool  # winning start reached max_i |tanh(h_i + sum_j J_ij m_j) - m_i| < tol in a sweep
    history: np.ndarray  # float64 [n_iter + 1]: F at the start and after every sweep (non-decreasing)
    start: int  # which start won: 0.. the deterministic starts (see mean_field), then the random ones
    residual: float  # max_i |m_i - tanh(h_i + sum_j J_ij m_j)| at the returned means


def _entropy(m: np.ndarray) -> np.ndarray:
    """Binary entropy H_b((1 + m) / 2) in nats, elementwise; exact 0 at m = +-1, no NaN."""
    a = np.abs(np.asarray(m, dtype=np.float64))
    b = np.where(a < 1.0, a, 0.0)  # (1 - a) log1p(-a) -> 0 as a -> 1; b keeps log1p finite
    t = (1.0 + a) * np.log1p(a) + np.where(a < 1.0, (1.0 - b) * np.log1p(-b), 0.0)
    return _LOG2 - 0.5 * t


def _check_m(mrf: PairwiseMRF, m, name="m") -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    if m.shape != (mrf.n,):
        raise ValueError(f"{name} must have shape ({mrf.n},); got {m.shape}")
    if not np.all(np.isfinite(m)) or np.any(np.abs(m) > 1.0):
        raise ValueError(f"{name} must lie in [-1, 1]^n (means of +-1 spins)")
    return m


def mf_bound(mrf: PairwiseMRF, m) -> float:
    """``F(m) = h.m + sum_e J_e m_i m_j + sum_i H_b((1 + m_i)/2)``, a lower bound on ``log Z`` for
    every ``m`` in [-1, 1]^n (ValueError outside). The entropy uses log1p and is exactly 0 at
    ``m_i = +-1``."""
    m = _check_m(mrf, m)
    return float(mrf.h @ m + (m[mrf.edges[:, 0]] * m[mrf.edges[:, 1]]) @ mrf.J + _entropy(m).sum())


def mf_residual(mrf: PairwiseMRF, m) -> float:
    """``max_i |m_i - tanh(h_i + sum_j J_ij m_j)|``: zero exactly at a mean-field fixed point."""
    m = _check_m(mrf, m)
    f = mrf.h.copy()
    np.add.at(f, mrf.edges[:, 0], mrf.J * m[mrf.edges[:, 1]])
    np.add.at(f, mrf.edges[:, 1], mrf.J * m[mrf.edges[:, 0]])
    return float(np.max(np.abs(m - np.tanh(f)))) if m.size else 0.0


def mean_field(
    mrf: PairwiseMRF,
    *,
    damping: float = 0.0,
    max_iter: int = 1000,
    tol: float = 1e-10,
    init=None,
    n_restarts: int = 0,
    seed: int = 0,
) -> MFResult:
    """Naive mean field by coordinate ascent (sequential sweeps over nodes 0..n-1).

    Starts: ``init`` ([n] in [-1, 1]) if given, else three deterministic ones -- ``tanh(h)``
    (the means without couplings), all ``+0.5`` and all ``-0.5`` (a ferromagnet below T_c has
    the saddle m = 0, which ``tanh(h)`` hits at zero field) -- then ``n_restarts`` random starts
    uniform in (-1, 1)^n from ``pgmflow.tasks.rng.generator(seed, STAGE_MEAN_FIELD, r)``, r = 0, 1, ....
    Each start runs until a sweep changes no node's mean by ``tol`` or more (the residual
    ``|tanh(field) - m_i|`` before the update) or ``max_iter`` sweeps; the start with the
    highest bound wins (the first on ties), so restarts never lower the bound.

    Args:
        mrf: the model.
        damping: in [0, 1); ``m_i <- damping m_i + (1 - damping) tanh(...)`` (see the module
            docstring: still monotone).
        max_iter: sweeps per start (>= 0).
        tol: convergence threshold on the per-sweep max residual.
        init: optional [n] start replacing the deterministic ones.
        n_restarts: extra random starts (>= 0).
        seed: master seed of the random starts.

    Returns:
        :class:`MFResult`; ``log_z_lower`` is :func:`mf_bound` at the returned means.
    """
    if not 0.0 <= float(damping) < 1.0:
        raise ValueError(f"damping must be in [0, 1) (0 = no damping); got {damping}")
    if int(max_iter) < 0 or int(n_restarts) < 0:
        raise ValueError(f"max_iter and n_restarts must be >= 0; got {max_iter}, {n_restarts}")
    if not tol > 0:
        raise ValueError(f"tol must be > 0; got {tol}")
    n = mrf.n
    if init is not None:
        starts = [_check_m(mrf, init, "init").copy()]
    else:
        starts = [np.tanh(mrf.h), np.full(n, 0.5), np.full(n, -0.5)]
    for r in range(int(n_restarts)):
        starts.append(_rng.generator(seed, STAGE_MEAN_FIELD, r).uniform(-1.0, 1.0, n))
    adj = _mrf.adjacency(mrf)
    Jn = np.ascontiguousarray(mrf.J[adj.eid], dtype=np.float64)
    ea = np.ascontiguousarray(mrf.edges[:, 0])
    eb = np.ascontiguousarray(mrf.edges[:, 1])
    h = np.ascontiguousarray(mrf.h, dtype=np.float64)
    k = _kernels()
    best = None
    for si, m0 in enumerate(starts):
        m = np.array(m0, dtype=np.float64)
        hist = np.empty(int(max_iter) + 1)
        it, conv = k["_mf_sweeps"](
            h, adj.indptr, adj.nbr, Jn, ea, eb, mrf.J, m, float(damping), int(max_iter), float(tol), hist
        )
        F = mf_bound(mrf, m)
        if best is None or F > best[0]:
            best = (F, m, int(it), bool(conv), hist[: it + 1].copy(), si)
    F, m, it, conv, hist, si = best
    return MFResult(float(F), m, it, conv, hist, si, mf_residual(mrf, m))


# --- numba kernels ----------------------------------------------------------------------------------

# Plain module-level functions marked for numba; _kernels() compiles them (pgmflow.tasks.backend.compile_kernels)
# and rebinds their names to the dispatchers.


@backend.kernel(cache=True, nogil=True, fastmath=False)
def _mf_entropy(m):
    a = abs(m)
    if a >= 1.0:
        return 0.0
    return 0.6931471805599453 - 0.5 * ((1.0 + a) * math.log1p(a) + (1.0 - a) * math.log1p(-a))


@backend.kernel(cache=True, nogil=True, fastmath=False)
def _mf_value(h, ea, eb, J, m):
    F = 0.0
    for i in range(h.size):
        F += h[i] * m[i] + _mf_entropy(m[i])
    for e in range(J.size):
        F += J[e] * m[ea[e]] * m[eb[e]]
    return F


@backend.kernel(cache=True, nogil=True, fastmath=False)
def _mf_sweeps(h, indptr, nbr, Jn, ea, eb, J, m, damping, max_iter, tol, history):
    """Sweeps of coordinate ascent on m (in place); history[s] = F after s sweeps.
    Returns (sweeps run, converged)."""
    n = h.size
    history[0] = _mf_value(h, ea, eb, J, m)
    it = 0
    converged = False
    while it < max_iter:
        res = 0.0
        for i in range(n):
            f = h[i]
            for k in range(indptr[i], indptr[i + 1]):
                f += Jn[k] * m[nbr[k]]
            t = math.tanh(f)
            d = abs(t - m[i])
            res = max(res, d)
            if damping > 0.0:
                m[i] = damping * m[i] + (1.0 - damping) * t
            else:
                m[i] = t
        it += 1
        history[it] = _mf_value(h, ea, eb, J, m)
        if res < tol:
            converged = True
            break
    return it, converged


@functools.lru_cache(maxsize=None)
def _kernels():
    """Compile the kernels above (once per process; numba's on-disk cache serves later processes)."""
    return backend.compile_kernels(sys.modules[__name__])

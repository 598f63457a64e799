"""Loopy belief propagation and the Bethe approximation of ``log Z`` for binary pairwise MRFs.

Sum-product BP is tree-reweighted message passing with every edge appearance probability
``rho_e = 1`` (``pgmflow.tasks.bounds.messages``; Yedidia, Freeman and Weiss 2005, "Constructing free-energy
approximations and generalized belief propagation algorithms"): damped
synchronous log-ratio messages, beliefs ``tau_s``, ``tau_st`` and the Bethe value

    log Z_Bethe = <theta, tau> + sum_s H(tau_s) - sum_st I_st(tau_st)      (= -F_Bethe(tau))

at the fixed point. Exact on trees (and forests); on loopy graphs neither a lower nor an upper
bound in general, and BP need not converge (the result then says so and holds the last beliefs).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pgmflow.tasks.bounds import messages
from pgmflow.tasks.bounds.mrf import PairwiseMRF, adjacency

__all__ = ["BPResult", "loopy_bp", "loopy_bp_lattice"]


class BPResult(NamedTuple):
    """Loopy BP at its last iterate."""

    log_z_bethe: float  # minus the Bethe free energy at the beliefs (exact log Z on a tree)
    mean: np.ndarray  # float64 [n] E_tau[x_i]
    pair_mean: np.ndarray  # float64 [E] E_tau[x_i x_j], edge order of mrf.edges
    n_iter: int  # synchronous updates performed
    converged: bool  # max message change < tol at the last update


START_MESSAGES = (0.0, 0.5, -0.5)  # message starts tried by loopy_bp (see its docstring)


def loopy_bp(
    mrf: PairwiseMRF, *, damping: float = 0.5, max_iter: int = 10000, tol: float = 1e-10, starts=START_MESSAGES
) -> BPResult:
    """Damped synchronous loopy BP (numba kernel, any graph). ``damping`` d in (0, 1]: messages
    move to ``(1 - d) u + d update(u)`` in log space. Never raises on non-convergence.

    BP's fixed points are stationary points of the Bethe free energy; from all-zero messages a
    symmetric model (no fields) never leaves the symmetric point, which below the critical
    temperature is a saddle. So BP starts from every message equal to each value in ``starts``
    and keeps the converged run with the largest Bethe value (the most stable fixed point among
    those found); with none converged, the largest value overall."""
    rho = np.ones(mrf.E)
    adj = adjacency(mrf)
    best = None
    for u0 in starts:
        u, n_iter, conv = messages.run_messages(mrf, rho, damping, max_iter, tol, adj=adj, u0=u0)
        b = messages.beliefs(mrf, rho, u, adj=adj)
        cand = BPResult(b.objective, b.mean, b.pair_mean, n_iter, conv)
        if best is None or (cand.converged, cand.log_z_bethe) > (best.converged, best.log_z_bethe):
            best = cand
    return best


def loopy_bp_lattice(
    h, Jr, Jd, *, periodic: bool = True, damping: float = 0.5, max_iter: int = 10000, tol: float = 1e-10
) -> messages.LatticeResult:
    """Loopy BP on an L x W lattice with the array path (NumPy or CuPy arrays [L, W]; see
    ``messages.lattice_messages_xp`` for the layout). Same iterates as :func:`loopy_bp` on the
    corresponding ``ising_lattice`` model; the result's arrays stay on the input's device."""
    from pgmflow.tasks import backend

    xp = backend.array_module(h)
    ones = xp.ones(xp.asarray(h).shape)
    return messages.lattice_run_xp(h, Jr, Jd, ones, ones, periodic, damping, max_iter, tol)

"""Pairwise binary MRFs from a learned time-varying network: node-wise logistic regressions made into one
symmetric model per time point.

Node i's conditional under ``P(x) ∝ exp(sum_i h_i x_i + sum_{i<j} J_ij x_i x_j)``, x in {-1, +1}^p, is
``P(x_i | x_-i) = sigmoid(2 x_i (h_i + sum_j J_ij x_j))``: exactly the form TESLA fits per node (Ahmed and
Xing 2009, eq. 11, with ``theta_ii`` the node's field). Node i's regression estimates row i, node j's row j;
the two estimates of ``J_ij`` are averaged (the "AND"-free symmetrisation of Meinshausen and Buhlmann 2006
applied to the values), and ``h_i = theta_ii``.
"""

from __future__ import annotations

import numpy as np


def mrf_at(theta: np.ndarray, t: int) -> tuple[np.ndarray, np.ndarray]:
    """(J [p, p] symmetric with a zero diagonal, h [p]) at time ``t`` from ``theta`` [p, T, p] (node, time,
    coefficient: the layout of TESLA's ``estimates.npz``)."""
    M = np.asarray(theta[:, t, :], dtype=np.float64)  # [p, p]: row i = node i's coefficients
    h = np.diag(M).copy()
    J = 0.5 * (M + M.T)
    np.fill_diagonal(J, 0.0)
    return J, h


def mrf_from_truth(J_t: np.ndarray, h_t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(J, h) of a known network at one time point (a synthetic ground truth), checked symmetric."""
    J = np.asarray(J_t, dtype=np.float64).copy()
    np.fill_diagonal(J, 0.0)
    if not np.allclose(J, J.T):
        raise ValueError("the network's couplings are not symmetric")
    return J, np.asarray(h_t, dtype=np.float64).copy()


def time_points(T: int, times, every: int) -> list[int]:
    """The time indices to export: ``times`` if given, else 0, every, 2 every, ... below T."""
    if times:
        return [int(t) for t in times]
    return list(range(0, int(T), int(every)))

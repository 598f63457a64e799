"""Edge sets from node-wise estimates, their recovery scores, and the degrees of freedom of a path.

Node ``i``'s path ``theta_i^t`` (``[T, p]``, column i its field) names the neighbours of i at time
t: ``j`` with ``theta_i^t[j] != 0``. Two estimates meet at each pair: the **AND** rule keeps an
edge when both ``i -> j`` and ``j -> i`` are non-zero, the **OR** rule when either is
(Meinshausen and Buhlmann 2006, Ann. Statist. 34; their OR rule and AND rule).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

RULES = ("and", "or")


def neighbourhoods(thetas) -> np.ndarray:
    """bool [T, p, p]: ``[t, i, j]`` is True when node i's estimate at t uses node j (j != i).

    ``thetas``: float [p, T, p], node i's path in ``thetas[i]``.
    """
    thetas = np.asarray(thetas)
    p, T, p2 = thetas.shape
    if p != p2:
        raise ValueError(f"thetas must be [p, T, p], got {thetas.shape}")
    nz = np.transpose(thetas != 0.0, (1, 0, 2)).copy()  # [T, i, j]
    idx = np.arange(p)
    nz[:, idx, idx] = False
    return nz


def edge_sets(thetas, rule: str = "and") -> np.ndarray:
    """bool [T, p, p] symmetric adjacency per time point by the AND or the OR rule."""
    nz = neighbourhoods(thetas)
    nzt = np.transpose(nz, (0, 2, 1))
    if rule == "and":
        return nz & nzt
    if rule == "or":
        return nz | nzt
    raise ValueError(f"rule must be one of {RULES}, got {rule!r}")


class Recovery(NamedTuple):
    """Edge recovery against a known truth, per time point and averaged over time."""

    precision: np.ndarray  # float64 [T]
    recall: np.ndarray  # float64 [T]
    f1: np.ndarray  # float64 [T]
    n_true: np.ndarray  # int64 [T] true edges
    n_est: np.ndarray  # int64 [T] estimated edges
    n_hit: np.ndarray  # int64 [T] estimated edges that are true

    @property
    def mean_f1(self) -> float:
        return float(self.f1.mean())

    @property
    def mean_precision(self) -> float:
        return float(self.precision.mean())

    @property
    def mean_recall(self) -> float:
        return float(self.recall.mean())


def edge_counts(adj) -> np.ndarray:
    """int64 [T]: undirected edges per time point of a symmetric adjacency [T, p, p]."""
    adj = np.asarray(adj, bool)
    iu = np.triu_indices(adj.shape[1], k=1)
    return adj[:, iu[0], iu[1]].sum(axis=1).astype(np.int64)


def recovery(est, truth) -> Recovery:
    """Precision, recall and F1 of the undirected edges per time point.

    With no estimated edges precision is 1 (no false positives); with no true edges recall is 1;
    F1 is 0 whenever precision + recall is 0.
    """
    est = np.asarray(est, bool)
    truth = np.asarray(truth, bool)
    if est.shape != truth.shape:
        raise ValueError(f"estimate {est.shape} and truth {truth.shape} differ in shape")
    iu = np.triu_indices(est.shape[1], k=1)
    e = est[:, iu[0], iu[1]]
    g = truth[:, iu[0], iu[1]]
    n_est = e.sum(axis=1).astype(np.int64)
    n_true = g.sum(axis=1).astype(np.int64)
    n_hit = (e & g).sum(axis=1).astype(np.int64)
    precision = np.where(n_est > 0, n_hit / np.maximum(n_est, 1), 1.0)
    recall = np.where(n_true > 0, n_hit / np.maximum(n_true, 1), 1.0)
    s = precision + recall
    f1 = np.where(s > 0, 2 * precision * recall / np.where(s > 0, s, 1.0), 0.0)
    return Recovery(precision, recall, f1, n_true, n_est, n_hit)


def path_df(theta, node: int) -> int:
    """Degrees of freedom of one node's path: its distinct non-zero pieces.

    A coefficient path that is piecewise constant (TESLA with q=1 fuses neighbouring time points)
    counts one parameter per maximal run of equal non-zero values; the field counts one per run.
    Paths that never fuse (q=2, KELLER, static) count every non-zero entry.
    """
    theta = np.asarray(theta)
    T, p = theta.shape
    new = np.ones((T, p), bool)
    if T > 1:
        new[1:] = theta[1:] != theta[:-1]
    nonzero = theta != 0.0
    nonzero[:, node] = True  # the field is a parameter even when it is zero
    return int((new & nonzero).sum())


def bic(loglik: float, df: int, n: int) -> float:
    """Bayesian information criterion ``-2 loglik + log(n) df`` (smaller is better)."""
    return float(-2.0 * loglik + np.log(max(n, 1)) * df)


def ebic(loglik: float, df: int, n: int, n_candidates: int, gamma: float = 0.5) -> float:
    """Extended BIC (Chen and Chen 2008), as used for neighbourhood selection (Foygel and Drton 2010):
    ``-2 loglik + df log(n) + 2 gamma df log(n_candidates)`` (smaller is better). ``gamma = 0`` is BIC;
    the extra term charges each parameter for the number of candidates it was chosen from."""
    return float(-2.0 * loglik + df * (np.log(max(n, 1)) + 2.0 * gamma * np.log(max(n_candidates, 1))))

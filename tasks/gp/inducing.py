"""Initial inducing inputs: k-means++ seeding plus a few Lloyd iterations, on a subsample.

k-means++ (Arthur and Vassilvitskii 2007): the first centre is a uniformly chosen row, each next
one a row drawn with probability proportional to its squared distance to the nearest centre so
far (``D^2`` sampling), so a row equal to a chosen centre is never chosen again and the seeds are
distinct. Lloyd iterations then move each centre to the mean of the rows nearest to it (a centre
with no rows stays put); distances are ``||x||^2 + ||z||^2 - 2 x z'`` GEMMs over blocks of rows.
If Lloyd's centres ever coincide, the distinct seeds are returned instead.

Random numbers: the caller's ``numpy.random.Generator`` (the pipeline builds it with
``pgmflow.tasks.rng.generator(seed, STAGE_GP, GP_STREAM_INDUCING)``); the subsample, then the seeding,
draw from it in that order.
"""

from __future__ import annotations

import numpy as np

__all__ = ["GP_STREAM_INDUCING", "kmeans_pp"]

GP_STREAM_INDUCING = 1  # first identity element under rng.STAGE_GP: inducing-input initialisation

_BLOCK = 8192  # rows per distance block in the Lloyd iterations


def _n_distinct(X) -> int:
    return int(np.unique(X, axis=0).shape[0])


def _sq_to(X, C, Csq):
    """Squared distances [n, k] from rows of X to centres C (clipped at 0)."""
    D = X @ C.T  # [n, k]
    D *= -2.0
    D += np.sum(X * X, axis=1)[:, None]
    D += Csq[None, :]
    np.maximum(D, 0.0, out=D)
    return D


def _seed(rng: np.random.Generator, X, m: int) -> np.ndarray:
    n = X.shape[0]
    idx = [int(rng.integers(n))]
    d2 = np.sum((X - X[idx[0]]) ** 2, axis=1)  # [n]
    for _ in range(1, m):
        total = float(d2.sum())
        if not total > 0:
            raise ValueError("k-means++ ran out of distinct points")
        cdf = np.cumsum(d2)
        j = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
        j = min(j, n - 1)
        while d2[j] <= 0.0:  # guard against rounding at the edges of the CDF
            j = (j + 1) % n
        idx.append(j)
        np.minimum(d2, np.sum((X - X[j]) ** 2, axis=1), out=d2)
    return X[np.array(idx)].copy()


def kmeans_pp(rng: np.random.Generator, X, m: int, n_iter: int = 10, max_points: int = 20_000) -> np.ndarray:
    """``Z`` float64 [m, d]: ``m`` distinct initial inducing inputs from the rows of ``X`` [n, d].

    Runs on a subsample of at most ``max_points`` rows drawn without replacement (all rows when
    ``n <= max_points``, or when the subsample has fewer than ``m`` distinct rows). Raises
    ValueError when ``X`` has fewer than ``m`` distinct rows.
    """
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"X must be a matrix [n, d]; got shape {X.shape}")
    m = int(m)
    if m < 1:
        raise ValueError(f"m must be >= 1; got {m}")
    if not np.all(np.isfinite(X)):
        raise ValueError("X contains NaN or infinite values")
    n = X.shape[0]
    pool = X
    if n > max_points:
        pool = X[np.sort(rng.choice(n, size=int(max_points), replace=False))]
        if _n_distinct(pool) < m:
            pool = X
    n_distinct = _n_distinct(pool)
    if n_distinct < m:
        raise ValueError(
            f"cannot choose m={m} distinct inducing inputs from data with {n_distinct} distinct rows; "
            f"use m <= {n_distinct}"
        )
    seeds = _seed(rng, pool, m)
    C = seeds.copy()
    for _ in range(int(n_iter)):
        Csq = np.sum(C * C, axis=1)
        sums = np.zeros_like(C)
        counts = np.zeros(m)
        for a in range(0, pool.shape[0], _BLOCK):
            Xb = pool[a : a + _BLOCK]
            lab = np.argmin(_sq_to(Xb, C, Csq), axis=1)  # [b]
            for j in range(C.shape[1]):  # one bincount per input dimension (vectorised over rows)
                sums[:, j] += np.bincount(lab, weights=Xb[:, j], minlength=m)
            counts += np.bincount(lab, minlength=m)
        moved = counts > 0
        newC = C.copy()
        newC[moved] = sums[moved] / counts[moved, None]
        if np.array_equal(newC, C):
            break
        C = newC
    if _n_distinct(C) < m:
        return seeds
    return C

"""Exact Gaussian-process regression for small n (Rasmussen and Williams 2006, ch. 2 and 5).

With ``Ky = K(X, X) + sigma^2 I = L L'`` and ``alpha = Ky^-1 y``::

    log p(y | X) = -y' alpha / 2 - sum log diag L - n log(2 pi) / 2
    dlog p / dKy = (alpha alpha' - Ky^-1) / 2

pushed through the kernel (:func:`pgmflow.tasks.gp.kernels.K_sym_vjp`) for the log lengthscales and the
log scale, and ``sigma^2 tr(dlog p / dKy)`` for the log noise. Predictions of the latent ``f``::

    mean = K*f alpha,   cov = K** - K*f Ky^-1 Kf*

:func:`fit` maximises the log marginal likelihood with L-BFGS-B in log space, within the bounds
``[1e-5, 1e5]`` on every hyperparameter (those of scikit-learn's kernels), optionally from
several random starts.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import scipy.linalg
import scipy.optimize

from pgmflow.tasks.gp import kernels as kern
from pgmflow.tasks.gp.kernels import CholeskyError, GPParams

__all__ = ["ExactFit", "fit", "log_marginal_likelihood", "predict", "value_and_grad"]

_LOG2PI = math.log(2.0 * math.pi)
DEFAULT_BOUNDS = (math.log(1e-5), math.log(1e5))


def _factor(kernel, params, X, jitter):
    X = np.asarray(X, dtype=np.float64)
    Ky = kern.K(kernel, params, X)  # [n, n]
    Ky[np.diag_indices_from(Ky)] += math.exp(float(params.log_noise)) + jitter
    try:
        return scipy.linalg.cholesky(Ky, lower=True, check_finite=False)
    except np.linalg.LinAlgError as exc:
        raise CholeskyError(f"K + sigma^2 I ({Ky.shape[0]}x{Ky.shape[0]}) is not positive definite") from exc


def log_marginal_likelihood(kernel: str, params: GPParams, X, y, jitter: float = 0.0) -> float:
    """``log N(y | 0, K(X, X) + (sigma^2 + jitter) I)`` for X [n, d], y [n]."""
    return value_and_grad(kernel, params, X, y, jitter, need_grad=False)[0]


def value_and_grad(
    kernel: str, params: GPParams, X, y, jitter: float = 0.0, need_grad: bool = True
) -> tuple[float, GPParams | None]:
    """``(log marginal likelihood, gradient as GPParams)``; the gradient is None without ``need_grad``."""
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    n = X.shape[0]
    L = _factor(kernel, params, X, jitter)
    alpha = scipy.linalg.cho_solve((L, True), y, check_finite=False)  # [n]
    value = -0.5 * float(y @ alpha) - float(np.sum(np.log(np.diagonal(L)))) - 0.5 * n * _LOG2PI
    if not need_grad:
        return value, None
    Kinv = scipy.linalg.cho_solve((L, True), np.eye(n), check_finite=False)  # [n, n]
    W = 0.5 * (np.outer(alpha, alpha) - Kinv)  # [n, n]  dlog p / dKy
    W = 0.5 * (W + W.T)
    kg = kern.K_sym_vjp(kernel, params, X, W, wrt_X=False)
    dlog_noise = math.exp(float(params.log_noise)) * float(np.trace(W))
    return value, GPParams(kg.log_lengthscale, kg.log_variance, dlog_noise)


def predict(
    kernel: str, params: GPParams, X, y, Xstar, full_cov: bool = False, jitter: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """Predictive mean [n*] and variance [n*] (covariance [n*, n*] with ``full_cov``) of the latent
    ``f`` at ``Xstar`` [n*, d]; add ``sigma^2`` for a new ``y``."""
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    Xstar = np.asarray(Xstar, dtype=np.float64)
    L = _factor(kernel, params, X, jitter)
    alpha = scipy.linalg.cho_solve((L, True), y, check_finite=False)  # [n]
    Kfs = kern.K(kernel, params, X, Xstar)  # [n, n*]
    mean = Kfs.T @ alpha  # [n*]
    V = scipy.linalg.solve_triangular(L, Kfs, lower=True, check_finite=False)  # [n, n*]
    if full_cov:
        cov = kern.K(kernel, params, Xstar) - V.T @ V  # [n*, n*]
        return mean, 0.5 * (cov + cov.T)
    return mean, np.maximum(kern.K_diag(kernel, params, Xstar) - np.sum(V * V, axis=0), 0.0)


class ExactFit(NamedTuple):
    """Result of :func:`fit`.

    params: GPParams, the best hyperparameters found.
    lml: float, the log marginal likelihood there.
    n_iter: int, L-BFGS-B iterations of the best start.
    success: bool, the optimiser's convergence flag for the best start.
    lmls: float64 [n_restarts + 1], the final value of every start (the first is ``params0``).
    """

    params: GPParams
    lml: float
    n_iter: int
    success: bool
    lmls: np.ndarray


def fit(
    kernel: str,
    X,
    y,
    params0: GPParams,
    n_restarts: int = 0,
    rng: np.random.Generator | None = None,
    bounds=DEFAULT_BOUNDS,
    maxiter: int = 1000,
    gtol: float = 1e-9,
    jitter: float = 0.0,
    ftol: float = 1e-15,
) -> ExactFit:
    """Maximise the log marginal likelihood over ``log_lengthscale, log_variance, log_noise`` with
    L-BFGS-B from ``params0`` and ``n_restarts`` more starts drawn uniformly within ``bounds``
    (log space) from ``rng``; returns the best. ``bounds``: one ``(lo, hi)`` pair for every entry, or (a kernel
    object, whose hyperparameters are ``params0.log_lengthscale``) a list of one pair per entry of
    ``pack(params0)``; ``lo == hi`` holds an entry fixed."""
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    d = int(np.size(params0.log_lengthscale)) if kern.is_object(kernel) else X.shape[1]

    def fun(theta):
        p, _ = kern.unpack(theta, d)
        try:
            v, g = value_and_grad(kernel, p, X, y, jitter)
        except CholeskyError:
            return np.inf, np.zeros_like(theta)
        return -v, -kern.pack(g)

    starts = [kern.pack(params0)]
    if n_restarts:
        if rng is None:
            raise ValueError("n_restarts > 0 needs an rng")
        if np.ndim(bounds) == 1:
            starts += [rng.uniform(bounds[0], bounds[1], size=d + 2) for _ in range(int(n_restarts))]
        else:
            lo, hi = np.array(_box(bounds, d)).T
            starts += [rng.uniform(lo, hi) for _ in range(int(n_restarts))]
    box = _box(bounds, d)
    lo, hi = np.array(box).T
    best, lmls = None, []
    for th0 in starts:
        res = scipy.optimize.minimize(
            fun,
            np.clip(th0, lo, hi),
            jac=True,
            method="L-BFGS-B",
            bounds=box,
            options={"maxiter": int(maxiter), "gtol": gtol, "ftol": ftol},
        )
        lmls.append(-float(res.fun))
        if best is None or res.fun < best.fun:
            best = res
    p, _ = kern.unpack(best.x, d)
    return ExactFit(p, -float(best.fun), int(best.nit), bool(best.success), np.array(lmls))


def _box(bounds, d: int) -> list:
    """One ``(lo, hi)`` pair per entry of the packed vector (``d + 2`` entries)."""
    if np.ndim(bounds) == 1:
        return [tuple(bounds)] * (d + 2)
    if len(bounds) != d + 2:
        raise ValueError(f"{len(bounds)} bounds for {d + 2} hyperparameters")
    return [tuple(b) for b in bounds]

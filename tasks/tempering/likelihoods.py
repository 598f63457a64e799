"""Log-likelihoods shipped for ``model=bayes`` (the user's own follow the same signature).

Signature: ``f(theta [n, d], data: dict of arrays, **options) -> [n]``, and the optional gradient
``g(theta, data, **options) -> [n, d]`` with respect to theta (the constrained parameters). A
function may carry ``dim(data) -> int`` (the parameter count the data imply; checked against the
prior before the run) and ``exact_log_evidence(blocks, data, **options) -> float | None`` (a closed
form, used as the exact value of log Z).

Rows are evaluated one at a time (matrix-vector products with the same shapes), so a row's bits do
not depend on how many rows are evaluated together.
"""

from __future__ import annotations

import math

import numpy as np


def _eta(theta, X):
    return np.stack([X @ t for t in theta])  # [n, N]


def gaussian_linear(theta, data, noise_std=1.0):
    """y ~ N(X w, noise_std^2 I), theta = w [n, p]: sum of Gaussian log densities of the rows of y."""
    X, y = data["X"], data["y"]
    r = y[None, :] - _eta(theta, X)
    N = y.shape[0]
    return -0.5 * np.sum(r * r, axis=1) / noise_std**2 - N * (math.log(noise_std) + 0.5 * math.log(2 * math.pi))


def gaussian_linear_grad(theta, data, noise_std=1.0):
    X, y = data["X"], data["y"]
    r = y[None, :] - _eta(theta, X)
    return np.stack([X.T @ ri for ri in r]) / noise_std**2


def _gaussian_linear_evidence(blocks, data, noise_std=1.0):
    """log N(y; X m0, X S0 X^T + noise^2 I) when every prior block is normal (conjugate)."""
    if any(b.name != "normal" for b in blocks):
        return None
    X, y = np.asarray(data["X"], dtype=np.float64), np.asarray(data["y"], dtype=np.float64)
    m0 = np.concatenate([np.full(b.size, b.loc) for b in blocks])
    s0 = np.concatenate([np.full(b.size, b.scale**2) for b in blocks])
    C = (X * s0[None, :]) @ X.T + noise_std**2 * np.eye(X.shape[0])  # [N, N]
    L = np.linalg.cholesky(C)
    w = np.linalg.solve(L, y - X @ m0)
    return float(-0.5 * w @ w - np.sum(np.log(np.diag(L))) - 0.5 * X.shape[0] * math.log(2 * math.pi))


gaussian_linear.dim = lambda data: int(data["X"].shape[1])
gaussian_linear.exact_log_evidence = _gaussian_linear_evidence


def logistic(theta, data):
    """y in {0, 1} ~ Bernoulli(sigmoid(X w)), theta = w [n, p]."""
    eta = _eta(theta, data["X"])
    return np.sum(data["y"][None, :] * eta - np.logaddexp(0.0, eta), axis=1)


def logistic_grad(theta, data):
    from scipy.special import expit

    eta = _eta(theta, data["X"])
    r = data["y"][None, :] - expit(eta)
    return np.stack([data["X"].T @ ri for ri in r])


logistic.dim = lambda data: int(data["X"].shape[1])


def returns_nan(theta, data, **options):
    """A broken log-likelihood (for tests of the preflight check)."""
    return np.full(theta.shape[0], np.nan)

"""Stochastic variational GP regression (Hensman, Fusi and Lawrence 2013, "Gaussian processes for
big data"): natural-gradient steps on q(u) from minibatches, Adam on the hyperparameters.

Parameterisation
----------------
``q(u) = N(mu_u, S_u)`` is held *whitened*: ``u = L v`` with ``L = chol(Kuu)``, ``q(v) = N(m_v,
S_v)``, stored by its natural parameters ``theta1 = S_v^-1 m_v`` [m] and ``theta2 = -S_v^-1 / 2``
[m, m] (:class:`SVGPState`). Whitening is an affine map, so natural parameters map linearly and a
natural-gradient step in ``v`` is the same step in ``u``; but the matrices involved are
``>= I``-like (``S_v^-1 = I + ...``) instead of ``Kuu^-1 + ...``, which keeps float64 well
conditioned when ``Kuu`` is not. :func:`svgp_q_u` and :func:`svgp_state_from_q_u` convert to and from
``(mu_u, S_u)`` at given hyperparameters (the whitened state keeps ``q(v)`` fixed when the
hyperparameters move).

ELBO on a minibatch of ``b`` of the ``n`` rows (an unbiased estimate of the full ELBO)::

    ELBO = (n/b) sum_batch E_q[log N(y_i | f_i, sigma^2)] - KL(q(v) || N(0, I))
    E_q[log N(y | f, s2)] = -log(2 pi s2)/2 - ((y - mu_i)^2 + var_i) / (2 s2)
    mu_i  = k_i' alpha,             alpha = L^-T m_v
    var_i = k_ii - k_i' C k_i,      C = L^-T (I - S_v) L^-1

(``KL(q(v)||N(0,I))`` equals ``KL(q(u)||p(u))``). Its gradient w.r.t. the hyperparameters and
``Z`` (with ``q(v)`` fixed) goes through ``Kbu`` (one GEMM), ``diag Kff``, the noise, and ``L``
(through ``alpha`` and ``C``; the Cholesky adjoint of :func:`pgmflow.tasks.gp.kernels.cholesky_backward`).

Natural-gradient step with the Gaussian likelihood, step size ``rho``, ``A = L^-1 Kub``::

    theta1 <- (1 - rho) theta1 + rho (n/b) sigma^-2 A y_b
    theta2 <- (1 - rho) theta2 + rho (-1/2) (I + (n/b) sigma^-2 A A')

(prior natural parameters ``(0, -I/2)`` in whitened coordinates). With ``rho = 1`` and the full
batch this is the optimal ``q(u)`` of SGPR: ``mu_u = sigma^-2 Kuu Sigma Kuf y``,
``S_u = Kuu Sigma Kuu``, ``Sigma = (Kuu + sigma^-2 Kuf Kfu)^-1``.

Other likelihoods (Bernoulli, Poisson, Student-t: ``pgmflow.tasks.gp.likelihoods``, whose docstring derives
the natural-gradient step for any likelihood from ``dE/dmu_i`` and ``dE/dvar_i``): pass ``likelihood=`` to
:func:`natgrad_step`, :func:`svgp_elbo_and_grad` and :func:`svgp_elbo`; the Gaussian (``likelihood=None``
or ``Likelihood("gaussian")``) keeps the closed forms above, bit for bit. :func:`svgp_predict` gives the
latent ``f``; the likelihood maps it to what is observed.

:func:`adam_init` / :func:`adam_update` are a small pure Adam over flat arrays;
:func:`minibatch_indices` draws minibatch ``step`` from ``pgmflow.tasks.rng.generator(seed, STAGE_GP,
GP_STREAM_MINIBATCH, step)``, independent of where it runs.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import scipy.linalg

from pgmflow.tasks import rng as trng
from pgmflow.tasks.gp import kernels as kern
from pgmflow.tasks.gp import likelihoods as glik
from pgmflow.tasks.gp.kernels import DEFAULT_JITTER, CholeskyError, GPParams

__all__ = [
    "GP_STREAM_MINIBATCH",
    "AdamState",
    "SVGPState",
    "adam_init",
    "adam_update",
    "minibatch_indices",
    "natgrad_step",
    "svgp_elbo",
    "svgp_elbo_and_grad",
    "svgp_init",
    "svgp_predict",
    "svgp_q_u",
    "svgp_state_from_q_u",
]

GP_STREAM_MINIBATCH = 2  # first identity element under rng.STAGE_GP: SVGP minibatches (then: step)

_LOG2PI = math.log(2.0 * math.pi)


class SVGPState(NamedTuple):
    """Whitened ``q(v) = N(m_v, S_v)``, ``u = chol(Kuu) v``, by its natural parameters.

    theta1: float64 [m], ``S_v^-1 m_v``.
    theta2: float64 [m, m], ``-S_v^-1 / 2`` (symmetric, negative definite).
    count: int, natural-gradient steps taken so far (for a step-size schedule).
    """

    theta1: np.ndarray
    theta2: np.ndarray
    count: int = 0


def svgp_init(m: int, mean=None, cov=None) -> SVGPState:
    """A state with whitened ``q(v) = N(mean, cov)``; the default ``N(0, I)`` is the prior."""
    m = int(m)
    mean = np.zeros(m) if mean is None else np.asarray(mean, dtype=np.float64)
    cov = np.eye(m) if cov is None else np.asarray(cov, dtype=np.float64)
    if mean.shape != (m,) or cov.shape != (m, m):
        raise ValueError(f"mean must be [{m}] and cov [{m}, {m}]; got {mean.shape}, {cov.shape}")
    Lc = _chol(cov, "the covariance of q(v)")
    prec = scipy.linalg.cho_solve((Lc, True), np.eye(m), check_finite=False)
    prec = 0.5 * (prec + prec.T)
    return SVGPState(prec @ mean, -0.5 * prec, 0)


def _chol(A, what):
    try:
        return scipy.linalg.cholesky(A, lower=True, check_finite=False)
    except np.linalg.LinAlgError as exc:
        raise CholeskyError(f"Cholesky of {what} ({A.shape[0]}x{A.shape[0]}) failed") from exc


def _q_v(state: SVGPState):
    """``(m_v [m], S_v [m, m], L_prec [m, m])`` of the state (``L_prec = chol(S_v^-1)``)."""
    prec = -2.0 * np.asarray(state.theta2, dtype=np.float64)
    prec = 0.5 * (prec + prec.T)
    Lp = _chol(prec, "the precision of q(v)")
    m_v = scipy.linalg.cho_solve((Lp, True), state.theta1, check_finite=False)
    S_v = scipy.linalg.cho_solve((Lp, True), np.eye(prec.shape[0]), check_finite=False)
    return m_v, 0.5 * (S_v + S_v.T), Lp


def _solve_lower(L, B, trans=False):
    return scipy.linalg.solve_triangular(L, B, lower=True, trans="T" if trans else "N", check_finite=False)


def svgp_q_u(kernel: str, params: GPParams, Z, state: SVGPState, jitter: float = DEFAULT_JITTER):
    """``(mu_u [m], S_u [m, m])`` of ``q(u)`` at these hyperparameters: ``L m_v``, ``L S_v L'``."""
    L, _ = kern.inducing_cholesky(kernel, params, Z, jitter)
    m_v, S_v, _ = _q_v(state)
    S_u = L @ S_v @ L.T  # [m, m]
    return L @ m_v, 0.5 * (S_u + S_u.T)


def svgp_state_from_q_u(
    kernel: str, params: GPParams, Z, mean_u, cov_u, count: int = 0, jitter: float = DEFAULT_JITTER
) -> SVGPState:
    """The state whose ``q(u)`` at these hyperparameters is ``N(mean_u, cov_u)``."""
    L, _ = kern.inducing_cholesky(kernel, params, Z, jitter)
    m_v = _solve_lower(L, np.asarray(mean_u, dtype=np.float64))
    S_v = _solve_lower(L, _solve_lower(L, np.asarray(cov_u, dtype=np.float64)).T)  # L^-1 S_u L^-T
    st = svgp_init(L.shape[0], m_v, 0.5 * (S_v + S_v.T))
    return st._replace(count=int(count))


def natgrad_step(
    kernel: str,
    params: GPParams,
    Z,
    state: SVGPState,
    X_batch,
    y_batch,
    n: int,
    rho: float,
    jitter: float = DEFAULT_JITTER,
    likelihood: glik.Likelihood | None = None,
) -> SVGPState:
    """One natural-gradient step of ``q`` from a minibatch ``X_batch`` [b, d], ``y_batch`` [b] of
    ``n`` rows in all, step size ``rho`` in (0, 1]; ``count`` goes up by one. A non-Gaussian
    ``likelihood`` (``pgmflow.tasks.gp.likelihoods``) takes the step of that module's docstring."""
    X_batch = np.asarray(X_batch, dtype=np.float64)
    y_batch = np.asarray(y_batch, dtype=np.float64)
    b = X_batch.shape[0]
    L, _ = kern.inducing_cholesky(kernel, params, Z, jitter)
    m = L.shape[0]
    A = _solve_lower(L, kern.K(kernel, params, Z, X_batch))  # [m, b]  L^-1 Kub
    if likelihood is not None and not likelihood.conjugate:
        return _natgrad_step_nonconjugate(kernel, params, state, X_batch, y_batch, n, rho, A, likelihood)
    w = (n / b) / math.exp(float(params.log_noise))
    t1 = w * (A @ y_batch)  # [m]
    prec = np.eye(m) + w * (A @ A.T)  # [m, m]
    prec = 0.5 * (prec + prec.T)
    theta1 = (1.0 - rho) * np.asarray(state.theta1) + rho * t1
    theta2 = (1.0 - rho) * np.asarray(state.theta2) + rho * (-0.5 * prec)
    return SVGPState(theta1, 0.5 * (theta2 + theta2.T), int(state.count) + 1)


def _natgrad_step_nonconjugate(kernel, params, state, X_batch, y_batch, n, rho, A, lik) -> SVGPState:
    """The natural-gradient step for a non-conjugate likelihood (``pgmflow.tasks.gp.likelihoods``):
    ``theta1 <- (1 - rho) theta1 + rho c A (g - 2 h mu)``, ``theta2 <- (1 - rho) theta2 + rho (-I/2 + c A
    diag(h) A')`` with ``g, h`` the derivatives of the variational expectations at the current ``q``. When
    the new precision would not be positive definite (``h > 0``: the Student-t), ``rho`` is halved for
    this step (at most 30 times) until it is."""
    b = X_batch.shape[0]
    m = A.shape[0]
    c = n / b
    m_v, S_v, _ = _q_v(state)
    mu = A.T @ m_v  # [b]
    var = kern.K_diag(kernel, params, X_batch) - np.sum(A * A, axis=0) + np.sum(A * (S_v @ A), axis=0)  # [b]
    _, g, h, _ = glik.variational_expectations(lik, y_batch, mu, np.maximum(var, 0.0), float(params.log_noise))
    t1 = c * (A @ (g - 2.0 * h * mu))  # [m]
    t2 = -0.5 * np.eye(m) + c * ((A * h) @ A.T)  # [m, m]
    t2 = 0.5 * (t2 + t2.T)
    th1, th2 = np.asarray(state.theta1), np.asarray(state.theta2)
    r = float(rho)
    for _ in range(31):
        theta2 = (1.0 - r) * th2 + r * t2
        theta2 = 0.5 * (theta2 + theta2.T)
        try:
            scipy.linalg.cholesky(-2.0 * theta2, lower=True, check_finite=False)
        except np.linalg.LinAlgError:
            r *= 0.5
            continue
        return SVGPState((1.0 - r) * th1 + r * t1, theta2, int(state.count) + 1)
    raise CholeskyError("the natural-gradient step of q(u) found no step size keeping its precision positive definite")


class _Pieces(NamedTuple):
    L: np.ndarray  # [m, m]  chol(Kuu)
    jitter: float
    Linv: np.ndarray  # [m, m]
    m_v: np.ndarray  # [m]
    S_v: np.ndarray  # [m, m]
    Lp: np.ndarray  # [m, m]  chol(S_v^-1)
    alpha: np.ndarray  # [m]  L^-T m_v
    C: np.ndarray  # [m, m]  L^-T (I - S_v) L^-1


def _pieces(kernel, params, Z, state, jitter) -> _Pieces:
    L, jit = kern.inducing_cholesky(kernel, params, Z, jitter)
    m = L.shape[0]
    if np.shape(state.theta1) != (m,):
        raise ValueError(f"the state is for {np.shape(state.theta1)[0]} inducing inputs, Z has {m}")
    Linv = _solve_lower(L, np.eye(m))  # [m, m]
    m_v, S_v, Lp = _q_v(state)
    alpha = Linv.T @ m_v  # [m]
    C = Linv.T @ (np.eye(m) - S_v) @ Linv  # [m, m]
    return _Pieces(L, jit, Linv, m_v, S_v, Lp, alpha, 0.5 * (C + C.T))


def _kl(pc: _Pieces) -> float:
    m = pc.m_v.shape[0]
    return 0.5 * (
        float(np.trace(pc.S_v)) + float(pc.m_v @ pc.m_v) - m + 2.0 * float(np.sum(np.log(np.diagonal(pc.Lp))))
    )


def svgp_elbo_and_grad(
    kernel: str,
    params: GPParams,
    Z,
    state: SVGPState,
    X_batch,
    y_batch,
    n: int,
    jitter: float = DEFAULT_JITTER,
    need_grad: bool = True,
    likelihood: glik.Likelihood | None = None,
):
    """``(elbo, dparams, dZ)``: the minibatch ELBO estimate and its gradient w.r.t. the
    hyperparameters (a :class:`GPParams`) and ``Z`` [m, d], ``q(v)`` held fixed (both None without
    ``need_grad``). ``likelihood``: None or Gaussian (the closed form above), or any of
    ``pgmflow.tasks.gp.likelihoods`` (the variational expectations and their derivatives ``g``, ``h``
    per row; ``log_noise`` is the likelihood's parameter, its gradient 0 where it has none)."""
    kern.check_kernel(kernel)
    Z = np.asarray(Z, dtype=np.float64)
    X_batch = np.asarray(X_batch, dtype=np.float64)
    y_batch = np.asarray(y_batch, dtype=np.float64)
    b = X_batch.shape[0]
    if y_batch.shape != (b,):
        raise ValueError(f"y_batch must have shape ({b},); got {y_batch.shape}")
    pc = _pieces(kernel, params, Z, state, jitter)
    noise = math.exp(float(params.log_noise))
    c = n / b
    Kub = kern.K(kernel, params, Z, X_batch)  # [m, b]
    A = _solve_lower(pc.L, Kub)  # [m, b]  L^-1 Kub
    mu = A.T @ pc.m_v  # [b]
    SA = pc.S_v @ A  # [m, b]
    var = kern.K_diag(kernel, params, X_batch) - np.sum(A * A, axis=0) + np.sum(A * SA, axis=0)  # [b]
    conj = likelihood is None or likelihood.conjugate
    if conj:
        r = y_batch - mu
        ell = c * float(np.sum(-0.5 * (_LOG2PI + float(params.log_noise)) - (r * r + var) / (2.0 * noise)))
    else:
        e, g, h, dln = glik.variational_expectations(
            likelihood, y_batch, mu, np.maximum(var, 0.0), float(params.log_noise)
        )
        ell = c * float(np.sum(e))
    value = ell - _kl(pc)
    if not need_grad:
        return value, None, None
    KC = _solve_lower(pc.L, A - SA, trans=True)  # [m, b]  C Kub = L^-T (I - S_v) A
    if conj:
        dmu = (c / noise) * r  # [b]
        dvar = -c / (2.0 * noise)  # same for every row
        Bm = np.outer(pc.alpha, dmu) + (c / noise) * KC  # [m, b]  dF/dKub
    else:
        dmu = c * g  # [b]
        dvar = c * h  # [b]
        Bm = np.outer(pc.alpha, dmu) - 2.0 * (KC * dvar)  # [m, b]  dF/dKub
    kg = kern.K_vjp(kernel, params, Z, X_batch, Bm, wrt_X1=True, wrt_X2=False)
    # through L: alpha = L^-T m_v and C = L^-T (I - S_v) L^-1
    alpha_bar = Kub @ dmu  # [m]
    C_bar = (-dvar) * (Kub @ Kub.T) if conj else -((Kub * dvar) @ Kub.T)  # [m, m]
    w = pc.Linv @ alpha_bar  # [m]
    L_bar = -np.outer(pc.alpha, w) - 2.0 * (pc.C @ C_bar @ pc.Linv.T)  # [m, m]
    dKuu = kern.cholesky_backward(pc.L, L_bar)  # [m, m]
    kuu = kern.K_sym_vjp(kernel, params, Z, dKuu, wrt_X=True)
    s = math.exp(float(params.log_variance))
    dvar_sum = dvar * b if conj else float(np.sum(dvar))  # d/dlog_s of diag Kff = s (stationary kernels)
    dlog_s = kg.log_variance + kuu.log_variance + dvar_sum * s + pc.jitter * float(np.trace(dKuu))
    if conj:
        dlog_noise = c * float(np.sum(-0.5 + (r * r + var) / (2.0 * noise)))
    else:
        dlog_noise = c * float(np.sum(dln))
    dth = kg.log_lengthscale + kuu.log_lengthscale
    if kern.is_object(kernel):  # a kernel object's diag Kff is not s and moves with theta: its own adjoint
        kd = kern.K_diag_vjp(kernel, params, X_batch, np.broadcast_to(np.asarray(dvar, dtype=np.float64), (b,)))
        dth = dth + kd.log_lengthscale
        dlog_s = kg.log_variance + kuu.log_variance + kd.log_variance + pc.jitter * float(np.trace(dKuu))
    dparams = GPParams(dth, float(dlog_s), dlog_noise)
    return value, dparams, kg.X1 + kuu.X1


def svgp_elbo(
    kernel: str,
    params: GPParams,
    Z,
    state: SVGPState,
    X_batch,
    y_batch,
    n: int,
    jitter: float = DEFAULT_JITTER,
    likelihood: glik.Likelihood | None = None,
) -> float:
    """The minibatch ELBO estimate (see :func:`svgp_elbo_and_grad`)."""
    return svgp_elbo_and_grad(
        kernel, params, Z, state, X_batch, y_batch, n, jitter, need_grad=False, likelihood=likelihood
    )[0]


def svgp_predict(
    kernel: str, params: GPParams, Z, state: SVGPState, Xstar, full_cov: bool = False, jitter: float = DEFAULT_JITTER
) -> tuple[np.ndarray, np.ndarray]:
    """Predictive mean [n*] and variance [n*] (covariance with ``full_cov``) of the latent ``f`` at
    ``Xstar`` [n*, d]: ``mean = K*u alpha``, ``var = k** - k*' C k*`` (computed as
    ``k** - |A|^2 + A' S_v A`` with ``A = L^-1 Ku*``)."""
    pc = _pieces(kernel, params, Z, state, jitter)
    Xstar = np.asarray(Xstar, dtype=np.float64)
    Kus = kern.K(kernel, params, np.asarray(Z, dtype=np.float64), Xstar)  # [m, n*]
    A = _solve_lower(pc.L, Kus)  # [m, n*]  L^-1 Ku*
    mean = A.T @ pc.m_v  # [n*]
    B = _solve_lower(pc.Lp, A)  # [m, n*]  chol(S_v^-1)^-1 A, so B'B = A' S_v A
    if full_cov:
        cov = kern.K(kernel, params, Xstar) - A.T @ A + B.T @ B  # [n*, n*]
        return mean, 0.5 * (cov + cov.T)
    var = kern.K_diag(kernel, params, Xstar) - np.sum(A * A, axis=0) + np.sum(B * B, axis=0)  # [n*]
    return mean, np.maximum(var, 0.0)


def minibatch_indices(seed: int, step: int, n: int, batch_size: int) -> np.ndarray:
    """int64 [batch_size], sorted: the rows of minibatch ``step``, drawn without replacement from
    ``pgmflow.tasks.rng.generator(seed, STAGE_GP, GP_STREAM_MINIBATCH, step)`` (identity, not placement)."""
    n, batch_size = int(n), int(batch_size)
    if not 1 <= batch_size <= n:
        raise ValueError(f"batch_size must be in [1, n={n}]; got {batch_size}")
    g = trng.generator(seed, trng.STAGE_GP, GP_STREAM_MINIBATCH, int(step))
    return np.sort(g.choice(n, size=batch_size, replace=False)).astype(np.int64)


# ------------------------------------------------------------------------------------------------
# Adam
# ------------------------------------------------------------------------------------------------


class AdamState(NamedTuple):
    """Adam (Kingma and Ba 2015) moments of a flat parameter vector.

    count: int, updates taken.
    mu: float64 [p], first-moment estimate.
    nu: float64 [p], second-moment estimate.
    """

    count: int
    mu: np.ndarray
    nu: np.ndarray


def adam_init(x) -> AdamState:
    """Zero moments shaped like ``x``."""
    x = np.asarray(x, dtype=np.float64)
    return AdamState(0, np.zeros_like(x), np.zeros_like(x))


def adam_update(
    state: AdamState, grad, lr: float = 1e-2, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8
) -> tuple[AdamState, np.ndarray]:
    """``(state, step)``: the step to *add* to the parameters to *decrease* the function whose
    gradient is ``grad`` (pass ``-grad`` of an ELBO to increase it)."""
    g = np.asarray(grad, dtype=np.float64)
    t = int(state.count) + 1
    mu = b1 * state.mu + (1.0 - b1) * g
    nu = b2 * state.nu + (1.0 - b2) * g * g
    mhat = mu / (1.0 - b1**t)
    vhat = nu / (1.0 - b2**t)
    return AdamState(t, mu, nu), -lr * mhat / (np.sqrt(vhat) + eps)

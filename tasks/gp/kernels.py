"""Stationary ARD kernels, their reverse-mode (adjoint) helpers, hyperparameters and Cholesky.

Hyperparameters
---------------
:class:`GPParams` holds the unconstrained (log) hyperparameters of a kernel and of the Gaussian
likelihood: ``log_lengthscale`` [d] (one lengthscale per input dimension, ARD),
``log_variance`` (the kernel scale ``s``) and ``log_noise`` (the noise variance ``sigma^2``).
:func:`pack` / :func:`unpack` turn them, optionally with the inducing inputs ``Z`` [m, d], into
one flat float64 vector for L-BFGS, in the order ``log_lengthscale, log_variance, log_noise,
Z.ravel()`` (C order).

Kernels
-------
With lengthscale-scaled inputs ``x~ = x / ell`` and ``u = ||x~ - z~||^2 = r^2``::

    rbf       k = s exp(-u / 2)
    matern32  k = s (1 + sqrt(3) r) exp(-sqrt(3) r)
    matern52  k = s (1 + sqrt(5) r + 5 r^2 / 3) exp(-sqrt(5) r)

``u`` is computed with the ``||x~||^2 + ||z~||^2 - 2 x~ z~^T`` identity (one GEMM) and clipped
at 0; for RBF cross matrices the norms and ``log s`` ride in two extra columns of that GEMM, so
``K = exp(min(log s - u/2, log s))`` costs one GEMM and one pass of ``min`` and ``exp`` (on the
CPU :func:`pgmflow.tasks.fastexp.capped_exp` with fused multiply-adds, a vectorised exp within 1 ulp
of NumPy's). All three kernels are written as functions of ``u``; their derivatives ``dk/du``::

    rbf       -k / 2
    matern32  -(3/2) s exp(-sqrt(3) r)
    matern52  -(5/6) s (1 + sqrt(5) r) exp(-sqrt(5) r)

are finite at ``r = 0``, so the Matern adjoints need no special case there (no 0/0).

:func:`K` and :func:`K_diag` take NumPy or CuPy arrays (the array module is
``backend.array_module(X)``) and return arrays of the same kind.

Adjoints
--------
Given ``dK = dL/dK`` for ``K(X1, X2)`` [N1, N2], :func:`K_vjp` returns the gradient of ``L``
w.r.t. ``log_lengthscale``, ``log_variance`` and optionally ``X1`` and ``X2``;
:func:`K_sym_vjp` does the same for ``K(X, X)`` (the gradient w.r.t. ``X`` counts both
arguments: the inducing inputs through ``Kuu``); :func:`K_diag_vjp` for the diagonal. With
``G = dK * dk/du`` (elementwise), ``g1 = G 1`` and ``g2 = G^T 1``, everything is matrix products::

    dL/dlog s      = sum(dK * K)
    dL/dlog ell_d  = -2 [ g1 . x~1_d^2 + g2 . x~2_d^2 - 2 sum_n x~1_nd (G x~2)_nd ]
    dL/dX1         = (2 / ell) [ g1 * x~1 - G x~2 ]
    dL/dX2         = (2 / ell) [ g2 * x~2 - G^T x~1 ]

Cholesky
--------
:func:`stable_cholesky` retries with a jitter growing tenfold and returns the jitter it used;
after the last try it raises :class:`CholeskyError`. :func:`inducing_cholesky` factors
``Kuu = K(Z, Z) + jitter * s * I``; the jitter is relative to the kernel scale ``s`` so that the
gradients can treat it exactly (``d jitter_abs / d log s = jitter_abs``).
"""

from __future__ import annotations

import functools
import math
import sys
from typing import NamedTuple

import numpy as np
import scipy.linalg

from pgmflow.tasks import backend, fastexp

__all__ = [
    "DEFAULT_JITTER",
    "KERNELS",
    "CholeskyError",
    "GPParams",
    "K",
    "K_diag",
    "K_diag_vjp",
    "K_sym_vjp",
    "K_vjp",
    "KernelGrad",
    "check_kernel",
    "cholesky_backward",
    "inducing_cholesky",
    "is_object",
    "make_params",
    "n_packed",
    "pack",
    "stable_cholesky",
    "unpack",
]

KERNELS = ("rbf", "matern32", "matern52")
DEFAULT_JITTER = 1e-6  # relative to the kernel scale s: Kuu = K(Z, Z) + 1e-6 * s * I

_SQRT3 = math.sqrt(3.0)
_SQRT5 = math.sqrt(5.0)


# ------------------------------------------------------------------------------------------------
# Hyperparameters
# ------------------------------------------------------------------------------------------------


class GPParams(NamedTuple):
    """Unconstrained hyperparameters of a stationary ARD kernel with Gaussian noise.

    log_lengthscale: float64 [d], log of the lengthscale of each input dimension.
    log_variance: float, log of the kernel scale ``s`` (``k(x, x) = s``).
    log_noise: float, log of the Gaussian noise variance ``sigma^2``.

    The same structure holds gradients w.r.t. these fields.
    """

    log_lengthscale: np.ndarray
    log_variance: float
    log_noise: float

    @property
    def lengthscale(self) -> np.ndarray:
        """float64 [d], ``exp(log_lengthscale)``."""
        return np.exp(np.asarray(self.log_lengthscale, dtype=np.float64))

    @property
    def variance(self) -> float:
        """The kernel scale ``s``."""
        return float(np.exp(self.log_variance))

    @property
    def noise(self) -> float:
        """The noise variance ``sigma^2``."""
        return float(np.exp(self.log_noise))

    @property
    def d(self) -> int:
        """Input dimension."""
        return int(np.size(self.log_lengthscale))


def make_params(lengthscale, variance: float = 1.0, noise: float = 0.1, d: int | None = None) -> GPParams:
    """:class:`GPParams` from positive values; a scalar ``lengthscale`` is repeated ``d`` times."""
    ls = np.atleast_1d(np.asarray(lengthscale, dtype=np.float64))
    if d is not None and ls.size == 1:
        ls = np.full(int(d), float(ls[0]))
    if d is not None and ls.size != d:
        raise ValueError(f"lengthscale has {ls.size} entries but d = {d}")
    if np.any(ls <= 0) or variance <= 0 or noise <= 0:
        raise ValueError(f"lengthscale, variance and noise must be > 0; got {ls}, {variance}, {noise}")
    return GPParams(np.log(ls), float(np.log(variance)), float(np.log(noise)))


def n_packed(d: int, m: int = 0, p: int | None = None) -> int:
    """Length of the vector :func:`pack` makes: ``p + 2 + m * d`` (``p``: the kernel's hyperparameters
    before the scale and the noise, ``d`` lengthscales unless given)."""
    return (int(d) if p is None else int(p)) + 2 + int(m) * int(d)


def pack(params: GPParams, Z=None) -> np.ndarray:
    """float64 [d + 2 (+ m d)]: ``log_lengthscale, log_variance, log_noise`` then ``Z.ravel()``."""
    parts = [
        np.asarray(params.log_lengthscale, dtype=np.float64).ravel(),
        np.array([float(params.log_variance), float(params.log_noise)]),
    ]
    if Z is not None:
        parts.append(np.asarray(Z, dtype=np.float64).ravel())
    return np.concatenate(parts)


def unpack(theta, d: int, m: int = 0, p: int | None = None) -> tuple[GPParams, np.ndarray | None]:
    """Inverse of :func:`pack`: ``(GPParams, Z [m, d])``, ``Z`` None when ``m == 0``; ``p`` entries before
    the scale and the noise (a kernel object's ``n_params``; default ``d``, the lengthscales)."""
    theta = np.asarray(theta, dtype=np.float64)
    q = int(d) if p is None else int(p)
    if theta.shape != (n_packed(d, m, q),):
        raise ValueError(f"packed vector must have shape ({n_packed(d, m, q)},) for d={d}, m={m}; got {theta.shape}")
    params = GPParams(theta[:q].copy(), float(theta[q]), float(theta[q + 1]))
    Z = theta[q + 2 :].reshape(m, d).copy() if m else None
    return params, Z


# ------------------------------------------------------------------------------------------------
# Kernel matrices
# ------------------------------------------------------------------------------------------------


def is_object(kernel) -> bool:
    """Whether ``kernel`` is a kernel object (:mod:`pgmflow.tasks.gp.kernel_algebra`), not one of the named
    stationary ARD kernels of :data:`KERNELS`. With an object, ``GPParams.log_lengthscale`` holds its
    hyperparameter vector ``theta`` and ``GPParams.log_variance`` a scale multiplying the whole kernel."""
    return not isinstance(kernel, str)


def check_kernel(kernel):
    """Return ``kernel`` if it is known (a name of :data:`KERNELS` or a kernel object); ValueError otherwise."""
    if is_object(kernel):
        if not hasattr(kernel, "vjp"):
            raise ValueError(f"not a kernel: {kernel!r}")
        return kernel
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; expected one of {', '.join(KERNELS)}")
    return kernel


def _scaled(xp, X, params):
    """``X / lengthscale`` as float64 [N, d] in the array module ``xp``."""
    X = xp.asarray(X, dtype=xp.float64)
    if X.ndim != 2:
        raise ValueError(f"inputs must be a matrix [N, d]; got shape {X.shape}")
    ls = xp.exp(xp.asarray(params.log_lengthscale, dtype=xp.float64))
    if ls.shape != (X.shape[1],):
        raise ValueError(f"{ls.shape[0]} lengthscales for inputs of dimension {X.shape[1]}")
    return X / ls


def _sqdist(xp, X1s, X2s, symmetric: bool):
    """Squared distances ``u`` [N1, N2] of scaled inputs, clipped at 0 (exactly symmetric with a
    zero diagonal when ``symmetric``)."""
    U = X1s @ X2s.T  # [N1, N2]
    U *= -2.0
    U += xp.sum(X1s * X1s, axis=1)[:, None]
    U += xp.sum(X2s * X2s, axis=1)[None, :]
    xp.maximum(U, 0.0, out=U)
    if symmetric:
        U = 0.5 * (U + U.T)
        idx = xp.arange(U.shape[0])
        U[idx, idx] = 0.0
    return U


def _sq_norms(xp, X):
    """``|x|^2`` of each row of ``X`` [N, d] as one GEMV, ``(X * X) 1`` (a row-wise ``sum(axis=1)`` over d ~ 10
    columns takes 5x longer: 0.22 against 0.045 ms for 10,000 x 10 on the benchmarks' Zen 4)."""
    return (X * X) @ xp.ones(X.shape[1], dtype=xp.float64)


def rbf_augmented(xp, X1s, X2s, log_s: float):
    """``A1`` [N1, d + 2] and ``A2`` [N2, d + 2] of scaled inputs with ``A1 A2' = log s - u / 2`` (``u`` the
    squared distance): ``A1 = [x~1, log s - |x~1|^2 / 2, 1]``, ``A2 = [x~2, 1, -|x~2|^2 / 2]``. Every RBF
    cross-covariance is made from these (here and in :mod:`pgmflow.tasks.gp.fused`), so all are the same bits."""
    n1, n2 = X1s.shape[0], X2s.shape[0]
    A1 = xp.empty((n1, X1s.shape[1] + 2), dtype=xp.float64)  # [N1, d + 2]
    A1[:, :-2] = X1s
    A1[:, -2] = log_s - 0.5 * _sq_norms(xp, X1s)
    A1[:, -1] = 1.0
    A2 = xp.empty((n2, X2s.shape[1] + 2), dtype=xp.float64)  # [N2, d + 2]
    A2[:, :-2] = X2s
    A2[:, -2] = 1.0
    A2[:, -1] = -0.5 * _sq_norms(xp, X2s)
    return A1, A2


def _rbf_log_kernel(xp, X1s, X2s, log_s: float):
    """The RBF kernel matrix [N1, N2] via one augmented GEMM: ``exp(min(x~1.x~2 - |x~1|^2/2 -
    |x~2|^2/2 + log s, log s))`` (the min is the clip ``u >= 0``)."""
    A1, A2 = rbf_augmented(xp, X1s, X2s, log_s)
    E = A1 @ A2.T  # [N1, N2]  log s - u / 2
    if xp is np and log_s <= fastexp.MAX_CAP:
        return fastexp.capped_exp(E, log_s, fma=True)  # the min and the exp in one vectorised pass
    xp.minimum(E, log_s, out=E)
    xp.exp(E, out=E)
    return E


def _profile(xp, kernel: str, U, s: float, with_grad: bool):
    """``K = s g(u)`` and (when ``with_grad``) ``dK/du``, both [N1, N2], from squared distances."""
    if kernel == "rbf":
        Kmat = xp.exp(-0.5 * U)
        Kmat *= s
        return Kmat, (-0.5 * Kmat if with_grad else None)
    if kernel == "matern32":
        r = xp.sqrt(3.0 * U)
        e = xp.exp(-r)
        Kmat = (1.0 + r) * e
        Kmat *= s
        return Kmat, ((-1.5 * s) * e if with_grad else None)
    if kernel == "matern52":
        r = xp.sqrt(5.0 * U)
        e = xp.exp(-r)
        Kmat = (1.0 + r + (r * r) / 3.0) * e
        Kmat *= s
        if not with_grad:
            return Kmat, None
        e *= 1.0 + r
        e *= -5.0 / 6.0 * s
        return Kmat, e
    raise ValueError(f"unknown kernel {kernel!r}; expected one of {', '.join(KERNELS)}")


def K(kernel: str, params: GPParams, X, X2=None):
    """Kernel matrix ``K(X, X2)`` float64 [N, M]; ``X2=None`` means ``K(X, X)`` (exactly symmetric).

    X: [N, d], X2: [M, d], NumPy or CuPy (the result lives in the same module as ``X``).
    """
    check_kernel(kernel)
    xp = backend.array_module(X)
    if is_object(kernel):
        Kmat = kernel.K(params.log_lengthscale, X, X2)
        Kmat *= math.exp(float(params.log_variance))
        return Kmat
    Xs = _scaled(xp, X, params)
    X2s = Xs if X2 is None else _scaled(xp, X2, params)
    s = math.exp(float(params.log_variance))
    if kernel == "rbf" and X2 is not None:
        return _rbf_log_kernel(xp, Xs, X2s, float(params.log_variance))
    U = _sqdist(xp, Xs, X2s, symmetric=X2 is None)
    return _profile(xp, kernel, U, s, with_grad=False)[0]


def K_diag(kernel: str, params: GPParams, X):
    """The diagonal of ``K(X, X)``: float64 [N], all equal to the scale ``s`` (stationary kernels)."""
    check_kernel(kernel)
    xp = backend.array_module(X)
    if is_object(kernel):
        return kernel.K_diag(params.log_lengthscale, X) * math.exp(float(params.log_variance))
    n = int(X.shape[0])
    return xp.full(n, math.exp(float(params.log_variance)), dtype=xp.float64)


# ------------------------------------------------------------------------------------------------
# Adjoints
# ------------------------------------------------------------------------------------------------


class KernelGrad(NamedTuple):
    """Gradient of a scalar ``L`` through a kernel matrix, given ``dL/dK``.

    log_lengthscale: float64 [d], ``dL/dlog ell``.
    log_variance: float, ``dL/dlog s``.
    X1: float64 [N1, d] or None, ``dL/dX1`` (for :func:`K_sym_vjp`: ``dL/dX`` through both
        arguments); None when not requested.
    X2: float64 [N2, d] or None, ``dL/dX2``; None when not requested (always None for
        :func:`K_sym_vjp` and :func:`K_diag_vjp`).
    """

    log_lengthscale: np.ndarray
    log_variance: float
    X1: np.ndarray | None = None
    X2: np.ndarray | None = None


def _augment(xp, Xs):
    """``[Xs, Xs^2, 1]`` [N, 2d + 1]: one GEMM with it gives ``G Xs``, ``G Xs^2`` and ``G 1``."""
    n, d = Xs.shape
    A = xp.empty((n, 2 * d + 1), dtype=xp.float64)
    A[:, :d] = Xs
    A[:, d : 2 * d] = Xs * Xs
    A[:, 2 * d] = 1.0
    return A


def _vjp_core(xp, ls, X1s, X2s, G, want_X1: bool, want_X2: bool):
    """Lengthscale gradient and input gradients from ``G = dL/dK * dK/du`` [N1, N2].

    One GEMM of ``G`` (or ``G^T``) with ``[x~, x~^2, 1]`` of the other argument gives every sum
    the lengthscale gradient needs (``sum_m g2_m x~2_m^2 = 1' G x~2^2``) and the gradient w.r.t.
    one argument; a second GEMM only when both input gradients are wanted.
    """
    d = X1s.shape[1]
    if want_X2 and not want_X1:
        T = G.T @ _augment(xp, X1s)  # [N2, 2d + 1]
        GtX1, g2 = T[:, :d], T[:, 2 * d]
        sq = xp.sum(T[:, d : 2 * d], axis=0) + g2 @ (X2s * X2s)  # [d]  g1.x~1^2 + g2.x~2^2
        cross = xp.sum(X2s * GtX1, axis=0)  # [d]  sum_nm G_nm x~1_nd x~2_md
        dlog_ls = -2.0 * (sq - 2.0 * cross)
        return dlog_ls, None, (2.0 / ls) * (g2[:, None] * X2s - GtX1)
    dlog_ls, dX1 = _vjp_rows(xp, ls, X1s, G @ _augment(xp, X2s), want_X1)
    dX2 = None
    if want_X2:
        g2 = G.sum(axis=0)  # [N2]
        dX2 = (2.0 / ls) * (g2[:, None] * X2s - G.T @ X1s)  # [N2, d]
    return dlog_ls, dX1, dX2


def _vjp_rows(xp, ls, X1s, T, want_X1: bool):
    """``(dL/dlog ell [d], dL/dX1 [N1, d] or None)`` from ``T = G [x~2, x~2^2, 1]`` [N1, 2d + 1]."""
    d = X1s.shape[1]
    return _vjp_sums(xp, ls, X1s, T[:, :d], T[:, 2 * d], xp.sum(T[:, d : 2 * d], axis=0), want_X1)


def _vjp_sums(xp, ls, X1s, GX2, g1, sq2, want_X1: bool):
    """:func:`_vjp_rows` from ``GX2 = G x~2`` [N1, d], ``g1 = G 1`` [N1] and ``sq2 = 1' G x~2^2`` [d]."""
    sq = g1 @ (X1s * X1s) + sq2  # [d]
    cross = xp.sum(X1s * GX2, axis=0)  # [d]
    dlog_ls = -2.0 * (sq - 2.0 * cross)  # [d]
    dX1 = (2.0 / ls) * (g1[:, None] * X1s - GX2) if want_X1 else None  # [N1, d]
    return dlog_ls, dX1


def K_vjp(kernel: str, params: GPParams, X1, X2, dK, wrt_X1: bool = False, wrt_X2: bool = True) -> KernelGrad:
    """Gradient of ``L`` given ``dK = dL/dK(X1, X2)`` [N1, N2] (entries treated as independent).

    Returns a :class:`KernelGrad` with ``dL/dlog ell`` [d], ``dL/dlog s`` and, when requested,
    ``dL/dX1`` [N1, d] and ``dL/dX2`` [N2, d]. NumPy or CuPy inputs (results in the same module).
    """
    check_kernel(kernel)
    xp = backend.array_module(X1)
    if is_object(kernel):
        return _object_vjp(kernel, params, X1, X2, dK, wrt_X1, wrt_X2)
    X1s = _scaled(xp, X1, params)
    X2s = _scaled(xp, X2, params)
    dK = xp.asarray(dK, dtype=xp.float64)
    s = math.exp(float(params.log_variance))
    U = _sqdist(xp, X1s, X2s, symmetric=False)
    Kmat, dKdu = _profile(xp, kernel, U, s, with_grad=True)
    dlog_s = xp.sum(dK * Kmat)
    G = dK * dKdu  # [N1, N2]
    ls = xp.exp(xp.asarray(params.log_lengthscale, dtype=xp.float64))
    dlog_ls, dX1, dX2 = _vjp_core(xp, ls, X1s, X2s, G, wrt_X1, wrt_X2)
    return KernelGrad(dlog_ls, float(dlog_s), dX1, dX2)


def K_sym_vjp(kernel: str, params: GPParams, X, dK, wrt_X: bool = True) -> KernelGrad:
    """Gradient of ``L`` given ``dK = dL/dK(X, X)`` [N, N] (entries treated as independent; pass a
    symmetric adjoint for a function of a symmetric matrix). ``KernelGrad.X1`` is ``dL/dX``
    through both arguments when ``wrt_X``."""
    check_kernel(kernel)
    xp = backend.array_module(X)
    if is_object(kernel):
        return _object_vjp(kernel, params, X, None, dK, wrt_X, False)
    Xs = _scaled(xp, X, params)
    dK = xp.asarray(dK, dtype=xp.float64)
    s = math.exp(float(params.log_variance))
    U = _sqdist(xp, Xs, Xs, symmetric=True)
    Kmat, dKdu = _profile(xp, kernel, U, s, with_grad=True)
    dlog_s = xp.sum(dK * Kmat)
    G = dK * dKdu  # [N, N]
    ls = xp.exp(xp.asarray(params.log_lengthscale, dtype=xp.float64))
    if not wrt_X:
        dlog_ls, _, _ = _vjp_core(xp, ls, Xs, Xs, G, False, False)
        return KernelGrad(dlog_ls, float(dlog_s), None, None)
    Gs = G + G.T  # [N, N]  both arguments at once
    dlog_ls, dX, _ = _vjp_core(xp, ls, Xs, Xs, G, True, False)
    dX = (2.0 / ls) * (Gs.sum(axis=1)[:, None] * Xs - Gs @ Xs)  # [N, d]
    return KernelGrad(dlog_ls, float(dlog_s), dX, None)


def K_diag_vjp(kernel: str, params: GPParams, X, ddiag) -> KernelGrad:
    """Gradient of ``L`` given ``ddiag = dL/dK_diag(X)`` [N] (or a scalar, the same for every
    point). Stationary kernels: only ``log_variance`` moves (``X1`` is None: the gradient w.r.t.
    the inputs is zero)."""
    check_kernel(kernel)
    xp = backend.array_module(X)
    if is_object(kernel):  # the diagonal of a kernel object may vary (linear), and with theta
        s = math.exp(float(params.log_variance))
        dd = xp.asarray(ddiag, dtype=xp.float64) * s
        total = float(xp.sum(xp.asarray(ddiag, dtype=xp.float64) * K_diag(kernel, params, X)))
        return KernelGrad(kernel.diag_vjp(params.log_lengthscale, X, dd), total, None, None)
    n = int(X.shape[0])
    s = math.exp(float(params.log_variance))
    total = float(xp.sum(xp.asarray(ddiag, dtype=xp.float64))) if np.ndim(ddiag) else float(ddiag) * n
    d = int(np.size(params.log_lengthscale))
    return KernelGrad(xp.zeros(d), total * s, None, None)


def _object_vjp(kernel, params: GPParams, X1, X2, dK, wrt_X1: bool, wrt_X2: bool) -> KernelGrad:
    """:func:`K_vjp` (``X2`` given) or :func:`K_sym_vjp` (``X2=None``) of a kernel object scaled by ``s``:
    ``dL/dlog s = sum(dK * K)`` and the object's own adjoint of ``s dK``."""
    xp = backend.array_module(X1)
    s = math.exp(float(params.log_variance))
    dK = xp.asarray(dK, dtype=xp.float64)
    dth, dX1, dX2 = kernel.vjp(params.log_lengthscale, X1, X2, s * dK, wrt_X1, wrt_X2)
    return KernelGrad(dth, kernel.scale_grad(dth), dX1, dX2)  # dL/dlog s = sum(dK * s K): no second K


# ------------------------------------------------------------------------------------------------
# Cholesky with jitter
# ------------------------------------------------------------------------------------------------


class CholeskyError(ValueError):
    """A matrix could not be factored even after adding the largest jitter tried."""


@backend.kernel(cache=True, nogil=True)
def _symmetrised(C, out):
    """``out = C + C'`` off the diagonal and ``diag C`` on it, in 32 x 32 tiles (both reads stay in cache)."""
    n = C.shape[0]
    for ib in range(0, n, 32):
        for jb in range(0, n, 32):
            for i in range(ib, min(ib + 32, n)):
                for j in range(jb, min(jb + 32, n)):
                    out[i, j] = C[i, j] + C[j, i]
    for i in range(n):
        out[i, i] = C[i, i]


@functools.cache
def _kernels():
    return backend.compile_kernels(sys.modules[__name__])


def symmetric_from_triangle(C) -> np.ndarray:
    """The symmetric matrix whose one triangle (diagonal included) is that of ``C`` [N, N] and whose
    other triangle ``C`` holds as zeros (what LAPACK's lauum and BLAS's syrk leave): ``C + C' - diag C``,
    one pass and exactly symmetric, with the triangle's own bits, in C order (a tiled numba loop: 0.09 against
    0.17 ms for NumPy's ``C + C.T`` at N = 256; seven per SGPR evaluation on each worker)."""
    C = np.asarray(C, dtype=np.float64)
    out = np.empty(C.shape)
    _kernels()["_symmetrised"](C, out)
    return out


def stable_cholesky(Kmat, jitter0: float | None = None, max_tries: int = 6) -> tuple[np.ndarray, float]:
    """Lower Cholesky factor of ``Kmat + jitter * I`` (NumPy), retrying with a larger jitter.

    Try ``k = 0 .. max_tries - 1`` uses ``jitter = jitter0 * 10**k``; the default ``jitter0`` is
    ``1e-8 * mean(diag(Kmat))``; ``jitter0 = 0`` tries the matrix as it is once, then
    ``1e-8 * mean diag * 10**(k-1)``. Returns ``(L [N, N], jitter)`` with the jitter that
    succeeded. Raises :class:`CholeskyError` (naming the size and the largest jitter tried) when
    every try fails or the matrix is not finite.
    """
    Kmat = np.asarray(Kmat, dtype=np.float64)
    if Kmat.ndim != 2 or Kmat.shape[0] != Kmat.shape[1]:
        raise ValueError(f"stable_cholesky needs a square matrix; got shape {Kmat.shape}")
    if not np.all(np.isfinite(Kmat)):
        raise CholeskyError(f"cannot factor a {Kmat.shape[0]}x{Kmat.shape[0]} matrix with NaN or infinite entries")
    n = Kmat.shape[0]
    scale = float(np.mean(np.diagonal(Kmat))) if n else 1.0
    if not scale > 0:
        scale = 1.0
    base = 1e-8 * scale
    jitters = []
    for k in range(int(max_tries)):
        if jitter0 is None:
            jitters.append(base * 10.0**k)
        elif jitter0 == 0:
            jitters.append(0.0 if k == 0 else base * 10.0 ** (k - 1))
        else:
            jitters.append(float(jitter0) * 10.0**k)
    idx = np.arange(n)
    for jit in jitters:
        A = Kmat.copy()
        A[idx, idx] += jit
        try:
            return scipy.linalg.cholesky(A, lower=True, check_finite=False), float(jit)
        except np.linalg.LinAlgError:
            continue
    raise CholeskyError(
        f"Cholesky of a {n}x{n} matrix failed after {len(jitters)} tries, the largest jitter "
        f"{jitters[-1]:.3g} (mean diagonal {scale:.3g}); the matrix is not positive definite -- "
        "check for duplicate inducing inputs or extreme lengthscales"
    )


def inducing_cholesky(
    kernel: str, params: GPParams, Z, jitter: float = DEFAULT_JITTER, max_tries: int = 6
) -> tuple[np.ndarray, float]:
    """``(L [m, m], jitter_abs)`` with ``L L^T = K(Z, Z) + jitter_abs I`` and ``jitter_abs =
    jitter * s * 10**k`` for the first ``k`` that factors (see :func:`stable_cholesky`)."""
    Kuu = backend.to_numpy(K(kernel, params, backend.to_numpy(Z)))  # [m, m]
    s = math.exp(float(params.log_variance))
    return stable_cholesky(Kuu, jitter0=jitter * s, max_tries=max_tries)


def cholesky_backward(L, L_bar) -> np.ndarray:
    """Adjoint of ``A = L L^T`` from the adjoint ``L_bar`` of its lower Cholesky factor.

    Returns the symmetric ``A_bar`` [n, n] with ``dF = sum(A_bar * dA)`` for symmetric ``dA``:
    ``A_bar = sym(L^-T Phi(L^T L_bar) L^-1)``, ``Phi`` = lower triangle with the diagonal halved
    (Murray 2016, "Differentiation of the Cholesky decomposition"). Only the lower triangle of
    ``L_bar`` is used.
    """
    L = np.asarray(L, dtype=np.float64)
    P = L.T @ np.tril(L_bar)  # [n, n]
    P = np.tril(P)
    P[np.diag_indices_from(P)] *= 0.5
    X = scipy.linalg.solve_triangular(L, P.T, lower=True, trans="T", check_finite=False)  # L^-T P^T  [n, n]
    A = scipy.linalg.solve_triangular(L, X.T, lower=True, trans="T", check_finite=False)  # L^-T P L^-1
    return 0.5 * (A + A.T)

"""SGPR, DTC and FITC objectives from summed statistics, their adjoints, and predictions.

Objectives (``n`` rows, ``Qff = Kfu Kuu^-1 Kuf``, ``sigma^2`` the noise variance)::

    DTC / SoR  log N(y | 0, Qff + sigma^2 I)                      (Quinonero-Candela & Rasmussen 2005)
    SGPR       DTC - (psi0 - tr(Kuu^-1 psi2)) / (2 sigma^2)        (Titsias 2009, collapsed bound)
    FITC       log N(y | 0, Qff + Lambda),  Lambda = diag(Kff - Qff) + sigma^2 I
                                                                   (Snelson & Ghahramani 2006)

All three share one m x m core. The chunks' statistics are whitened by ``L = chol(Kuu)`` (the driver's
factor, shipped to them): ``A = L^-1 Kuf``, ``AAT = sum A A'``, ``Ay = sum A y`` (FITC: Lambda-weighted;
:mod:`pgmflow.tasks.gp.stats`). With ``Phi = AAT / sigma^2``, ``b = Ay / sigma^2`` (FITC: ``Phi = AAT``,
``b = Ay``), ``B = I + Phi`` (GPflow's ``B = I + A A'`` with ``A = L^-1 Kuf / sigma``), ``LB = chol(B)`` and
``c = LB^-1 b``::

    log|Qff + sigma^2 I| = n log sigma^2 + 2 sum log diag LB
    y'(Qff + sigma^2 I)^-1 y = (yy - sigma^2 c'c) / sigma^2   (i.e. yy / sigma^2 - c'c)

so nothing larger than m x m is factored, and ``B >= I`` is well conditioned whatever ``Kuu``'s conditioning:
``Phi`` never passes through ``L^-1 (Kuf Kfu) L^-T``, which squares ``Kuu``'s condition number (issue 37).

Adjoints. In the whitened space, with ``v = B^-1 b``, ``W = dF/dPhi = -(B^-1 + v v') / 2`` (SGPR ``+ I / 2``)
and ``dF/db = v``, all from ``LB``. A chunk's gradient pass (given ``L``) forms
``dF/dKuf = L^-T (2 W A + v y') / sigma^2`` with ``A = L^-1 Kuf``: triangular solves (or ``L^-T W`` formed once
and the statistics pass's ``A`` kept) and a GEMM. (The same matrix as ``2 (L^-T W L^-1) Kuf + ...``, but
formed that way, with ``L^-T W L^-1`` explicit, its rounding error grows with ``Kuu``'s condition number
squared: on the CO2 record with Z = X the gradient was off by hundreds where it is a fraction; the chunks use
that form only where ``L`` is well conditioned, ``pgmflow.tasks.gp.fused.plain_inverse``.) The path through ``L``
(``A = L^-1 Kuf`` moves with ``Kuu``) depends on the summed statistics only; through the Cholesky adjoint
(Murray 2016) it is the symmetric ``dF/dKuu = L^-T (W' + I / 2 [- Phi / 2 for SGPR]) L^-1`` with
``W' = -(B^-1 + v v') / 2``, computed on the driver. :func:`objective` returns an :class:`Adjoints` holding
``dF/dAAT``, ``L^-T dF/dAy``, ``dF/dpsi0`` and ``L`` (what each chunk's gradient pass needs) and the driver-side
``dF/dKuu`` and ``dF/dlog sigma^2``. ``finish_grad`` pushes the total ``Kuu`` adjoint through ``K(Z, Z)``
and adds everything up.

Predictions (latent ``f``; add ``sigma^2`` for ``y``)::

    mean = K*u M^-1 b,   var = k** - Q** + K*u M^-1 Ku*

which is ``sigma^-2 K*u Sigma psi1y`` and ``k** - Q** + K*u Sigma Ku*`` with
``Sigma = (Kuu + sigma^-2 psi2)^-1`` for SGPR/DTC, and the Lambda-weighted analogue for FITC.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import scipy.linalg
import scipy.linalg.blas
import scipy.linalg.lapack
import scipy.optimize

from pgmflow.tasks.gp import kernels as kern
from pgmflow.tasks.gp import stats as gstats
from pgmflow.tasks.gp.kernels import DEFAULT_JITTER, CholeskyError, GPParams

__all__ = [
    "Adjoints",
    "SparseFit",
    "finish_grad",
    "fit",
    "kuu_path",
    "objective",
    "predict",
    "value_and_grad",
]

_LOG2PI = math.log(2.0 * math.pi)


class Adjoints(NamedTuple):
    """What :func:`objective` hands to the gradient pass (all small).

    method: str, ``"sgpr"``, ``"dtc"`` or ``"fitc"``.
    jitter: float, the absolute jitter on ``Kuu``'s diagonal (``jitter_rel * s * 10**k``, so it scales with the
        kernel scale).
    dAAT: float64 [m, m], ``dF/dAAT`` w.r.t. the whitened statistic ``AAT = sum A A'`` (FITC: ``A Lambda^-1 A'``),
        symmetric; a chunk's ``dF/dKuf`` is ``L^-T (2 dAAT A + v y')``.
    dpsi1y: float64 [m], ``L^-T dF/dAy``: the adjoint of ``Kuf y`` (FITC: ``Kuf Lambda^-1 y``) at fixed ``L``.
    dpsi0: float, ``dF/dpsi0`` (SGPR: ``-1 / (2 sigma^2)``; 0 otherwise).
    dKuu: float64 [m, m], the driver-side ``dF/dKuu`` (symmetric; FITC chunks add their own).
    dlog_noise: float, the driver-side ``dF/dlog sigma^2`` (0 for FITC: it meets the noise in
        the chunks, through Lambda).
    L: float64 [m, m], the lower Cholesky factor of ``Kuu`` the statistics were made with (the chunks' gradient
        pass solves with it).
    """

    method: str
    jitter: float
    dAAT: np.ndarray
    dpsi1y: np.ndarray
    dpsi0: float
    dKuu: np.ndarray
    dlog_noise: float
    L: np.ndarray | None = None


def _solve_lower(L, B, trans=False):
    return scipy.linalg.solve_triangular(L, B, lower=True, trans="T" if trans else "N", check_finite=False)


def _tri_inverse(L):
    """``L^-1`` [m, m] (Fortran order) of a lower-triangular ``L`` whose upper triangle is zero, as
    ``scipy.linalg.cholesky`` returns it (LAPACK trtri: ``m^3 / 3`` flops, a third of a solve against I;
    it writes the lower triangle only, so the zeros above stay)."""
    Linv, info = scipy.linalg.lapack.dtrtri(L, lower=1)
    if info != 0:
        raise CholeskyError(f"a triangular factor is singular (trtri info {info})")
    return Linv


def _sandwich_lower(Linv, S, outer: bool = False):
    """``Linv' S Linv`` [m, m] (``outer``: ``Linv S Linv'``) for lower-triangular ``Linv`` and symmetric
    ``S``, exactly symmetric: two triangular products (BLAS trmm, ``m^3`` flops each, against ``4 m^3``
    for two GEMMs). ``S`` is read in Fortran order (its transpose, the same matrix) without a copy."""
    trmm = scipy.linalg.blas.dtrmm
    X = trmm(1.0, Linv, S.T if S.flags.c_contiguous else S, side=0, lower=1, trans_a=0 if outer else 1)
    X = trmm(1.0, Linv, X, side=1, lower=1, trans_a=1 if outer else 0, overwrite_b=1)
    return 0.5 * (X + X.T)


def _chol(B, what: str):
    try:
        return scipy.linalg.cholesky(B, lower=True, check_finite=False)
    except np.linalg.LinAlgError as exc:
        raise CholeskyError(f"Cholesky of {what} ({B.shape[0]}x{B.shape[0]}) failed") from exc


def _check_stats(method, stats, m):
    want = gstats.FITCStats if method == "fitc" else gstats.Stats
    if not isinstance(stats, want):
        raise TypeError(f"method {method!r} needs {want.__name__}; got {type(stats).__name__}")
    if np.shape(stats.AAT) != (m, m) or np.shape(stats.Ay) != (m,):
        raise ValueError(f"statistics are for {np.shape(stats.Ay)[0]} inducing inputs, Z has {m}")


class _Core(NamedTuple):
    L: np.ndarray  # [m, m]  chol(Kuu)
    jitter: float
    Phi: np.ndarray  # [m, m]  AAT / sigma^2 (FITC: AAT)
    b: np.ndarray  # [m]  Ay / sigma^2 (FITC: Ay)
    LB: np.ndarray  # [m, m]  chol(I + Phi)
    c: np.ndarray  # [m]  LB^-1 b


def _core(method, kernel, params, Z, stats, jitter, max_tries, chol=None) -> _Core:
    gstats.check_method(method)
    kern.check_kernel(kernel)
    Z = np.asarray(Z, dtype=np.float64)
    m = Z.shape[0]
    _check_stats(method, stats, m)
    if chol is None:
        L, jit = kern.inducing_cholesky(kernel, params, Z, jitter, max_tries)
    else:
        L, jit = np.asarray(chol[0], dtype=np.float64), float(chol[1])
        if L.shape != (m, m):
            raise ValueError(f"chol's L must be [{m}, {m}]; got shape {L.shape}")
    if method == "fitc":
        Phi, b = np.asarray(stats.AAT), np.asarray(stats.Ay)
    else:
        noise = math.exp(float(params.log_noise))
        Phi, b = np.asarray(stats.AAT) / noise, np.asarray(stats.Ay) / noise
    LB = _chol(Phi + np.eye(m), "B = I + A A'")
    c = _solve_lower(LB, b)  # [m]
    return _Core(L, jit, Phi, b, LB, c)


def objective(
    method: str,
    kernel: str,
    params: GPParams,
    Z,
    stats,
    jitter: float = DEFAULT_JITTER,
    max_tries: int = 6,
    with_dkuu: bool = True,
    chol=None,
) -> tuple[float, Adjoints]:
    """``(value, adjoints)``: the log marginal likelihood (DTC, FITC) or Titsias's lower bound
    (SGPR) from statistics summed over all rows, and the :class:`Adjoints` for the gradient pass.

    Z: [m, d]; stats: :class:`~pgmflow.tasks.gp.stats.Stats` (SGPR, DTC) or
    :class:`~pgmflow.tasks.gp.stats.FITCStats` (FITC), made with the Cholesky factor ``L`` of ``Kuu``.
    chol: ``(L, jitter_abs)`` as ``kernels.inducing_cholesky`` returned it to whoever made the statistics;
    None: made here by ``inducing_cholesky(kernel, params, Z, jitter, max_tries)`` (``Kuu`` gets ``jitter * s``
    on its diagonal, raised tenfold up to ``max_tries`` times if it will not factor), which is the same factor
    when the statistics were made with the same ``jitter`` and ``max_tries``. The jitter used is
    ``adjoints.jitter``. ``with_dkuu=False``: ``adjoints.dKuu`` is None (what only the path through ``Kuu``,
    :func:`kuu_path`, needs; it skips one triangular sandwich); every other output is the same bits.
    """
    co = _core(method, kernel, params, Z, stats, jitter, max_tries, chol)
    n, m = int(stats.n), co.L.shape[0]
    noise = math.exp(float(params.log_noise))
    logdet_B = 2.0 * float(np.sum(np.log(np.diagonal(co.LB))))
    cc = float(co.c @ co.c)
    tr_Phi = float(np.trace(co.Phi))
    if method == "fitc":
        value = -0.5 * n * _LOG2PI - 0.5 * float(stats.log_lambda) - 0.5 * logdet_B - 0.5 * float(stats.yy) + 0.5 * cc
    else:
        value = (
            -0.5 * n * (_LOG2PI + float(params.log_noise)) - 0.5 * logdet_B - 0.5 * float(stats.yy) / noise + 0.5 * cc
        )
        if method == "sgpr":
            value += -0.5 * float(stats.psi0) / noise + 0.5 * tr_Phi

    # adjoints, whitened (every m x m matrix below is exactly symmetric by construction: no symmetrising at the end)
    trsm = scipy.linalg.blas.dtrsm  # (two solves rather than trtri and lauum: the same bits on any BLAS thread count)
    RB = trsm(1.0, co.LB, np.eye(m), lower=1)  # [m, m]  LB^-1
    v = RB.T @ co.c  # [m]  B^-1 b
    W = trsm(1.0, co.LB, RB, lower=1, trans_a=1)  # [m, m]  B^-1 = LB^-T LB^-1
    W = 0.5 * (W + W.T)
    W += np.outer(v, v)
    W *= -0.5  # [m, m]  dF/dPhi of the log-determinant and the quadratic form
    half_I = 0.5 * np.eye(m)
    dKuu = None
    if with_dkuu:  # the path through L at fixed Kuf: L^-T (W + I/2 [- Phi/2]) L^-1
        Linv = _tri_inverse(co.L)  # [m, m]  L^-1 (lower)
        S = W + half_I
        if method == "sgpr":
            S -= 0.5 * co.Phi
        dKuu = _sandwich_lower(Linv, S)  # [m, m]
    dpsi1y = _solve_lower(co.L, v, trans=True)  # [m]  L^-T dF/db
    if method == "fitc":
        dAAT, dpsi0, dlog_noise = W, 0.0, 0.0
    else:
        dlog_noise = -0.5 * n + 0.5 * float(stats.yy) / noise - float(np.sum(W * co.Phi)) - float(v @ co.b)
        dpsi1y /= noise
        dpsi0 = 0.0
        if method == "sgpr":
            W = W + half_I  # the trace term's 1/2 tr(Phi)
            dpsi0 = -0.5 / noise
            dlog_noise += 0.5 * (float(stats.psi0) / noise - tr_Phi)
        dAAT = W / noise
    adj = Adjoints(method, co.jitter, dAAT, dpsi1y, float(dpsi0), dKuu, float(dlog_noise), co.L)
    return float(value), adj


def kuu_path(kernel: str, params: GPParams, Z, dKuu) -> tuple[kern.KernelGrad, float]:
    """``(K_sym_vjp(dKuu), trace dKuu)``: what the total adjoint ``dKuu`` [m, m] w.r.t. ``Kuu = K(Z, Z) +
    jitter s I`` adds to the gradient -- the part of :func:`finish_grad` that needs the m x m matrix, so that
    a worker holding ``dKuu`` can send this instead (``(m + 1) d + 2`` numbers, not ``m^2``)."""
    dKuu = np.asarray(dKuu, dtype=np.float64)
    return kern.K_sym_vjp(kernel, params, np.asarray(Z, dtype=np.float64), dKuu, wrt_X=True), float(np.trace(dKuu))


def finish_grad(
    method: str, kernel: str, params: GPParams, Z, adjoints: Adjoints, grad: gstats.Grad, kuu: tuple | None = None
) -> tuple[GPParams, np.ndarray]:
    """``(dparams, dZ)``: the full gradient from the chunk-summed :class:`~pgmflow.tasks.gp.stats.Grad` and
    the driver's :class:`Adjoints`, adding the paths through ``Kuu = K(Z, Z) + jitter s I`` and the
    noise. ``dparams`` is a :class:`GPParams` of gradients; ``dZ`` float64 [m, d]. ``kuu``: the
    :func:`kuu_path` of ``adjoints.dKuu + grad.Kuu`` when it was computed elsewhere (``adjoints.dKuu``
    is then not read)."""
    gstats.check_method(method)
    if adjoints.method != method:
        raise ValueError(f"adjoints were made for method {adjoints.method!r}, not {method!r}")
    Z = np.asarray(Z, dtype=np.float64)
    kg, tr = kuu if kuu is not None else kuu_path(kernel, params, Z, adjoints.dKuu + grad.Kuu)
    dlog_s = float(grad.log_variance) + kg.log_variance + adjoints.jitter * tr
    dparams = GPParams(
        np.asarray(grad.log_lengthscale) + kg.log_lengthscale, dlog_s, float(grad.log_noise) + adjoints.dlog_noise
    )
    return dparams, np.asarray(grad.Z) + kg.X1


def value_and_grad(
    method: str, kernel: str, params: GPParams, Z, X, y, chunk_size: int = 10_000, jitter: float = DEFAULT_JITTER
) -> tuple[float, GPParams, np.ndarray]:
    """``(value, dparams, dZ)`` over all of ``X`` [n, d], ``y`` [n], chunked in-process exactly as
    the pipeline does it with Dask: ``Kuu`` factored once, chunk statistics summed in chunk order, :func:`objective`,
    chunk gradients summed in chunk order, :func:`finish_grad`."""
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    bounds = gstats.chunk_bounds(X.shape[0], chunk_size)
    chol = kern.inducing_cholesky(kernel, params, np.asarray(Z, dtype=np.float64), jitter)  # the driver's factor
    st = gstats.sum_in_order(
        gstats.chunk_stats(method, kernel, params, Z, X[a:b], y[a:b], L=chol[0]) for a, b in bounds
    )
    value, adj = objective(method, kernel, params, Z, st, jitter, chol=chol)
    g = gstats.sum_in_order(gstats.chunk_grad(method, kernel, params, Z, X[a:b], y[a:b], adj) for a, b in bounds)
    dparams, dZ = finish_grad(method, kernel, params, Z, adj, g)
    return value, dparams, dZ


def predict(
    method: str,
    kernel: str,
    params: GPParams,
    Z,
    stats,
    Xstar,
    full_cov: bool = False,
    jitter: float = DEFAULT_JITTER,
    max_tries: int = 6,
) -> tuple[np.ndarray, np.ndarray]:
    """Predictive mean [n*] and variance [n*] (or covariance [n*, n*] with ``full_cov``) of the
    latent ``f`` at ``Xstar`` [n*, d], from statistics summed over all rows. Add ``sigma^2`` for
    the variance of a new ``y``."""
    co = _core(method, kernel, params, Z, stats, jitter, max_tries)
    Z = np.asarray(Z, dtype=np.float64)
    Xstar = np.asarray(Xstar, dtype=np.float64)
    Kus = kern.K(kernel, params, Z, Xstar)  # [m, n*]
    T1 = _solve_lower(co.L, Kus)  # [m, n*]  L^-1 Ku*
    T2 = _solve_lower(co.LB, T1)  # [m, n*]  LB^-1 L^-1 Ku*
    mean = T2.T @ co.c  # [n*]
    if full_cov:
        cov = kern.K(kernel, params, Xstar) - T1.T @ T1 + T2.T @ T2  # [n*, n*]
        return mean, 0.5 * (cov + cov.T)
    var = kern.K_diag(kernel, params, Xstar) - np.sum(T1 * T1, axis=0) + np.sum(T2 * T2, axis=0)  # [n*]
    return mean, np.maximum(var, 0.0)


class SparseFit(NamedTuple):
    """Result of :func:`fit`.

    params: GPParams at the optimum.
    Z: float64 [m, d], inducing inputs at the optimum (the input ``Z`` when not optimised).
    value: float, the objective there.
    n_iter: int, L-BFGS-B iterations.
    success: bool, the optimiser's convergence flag.
    message: str, the optimiser's message.
    """

    params: GPParams
    Z: np.ndarray
    value: float
    n_iter: int
    success: bool
    message: str


def fit(
    method: str,
    kernel: str,
    params: GPParams,
    Z,
    X,
    y,
    chunk_size: int = 10_000,
    optimize_inducing: bool = True,
    maxiter: int = 500,
    jitter: float = DEFAULT_JITTER,
    bounds=None,
) -> SparseFit:
    """Maximise the objective over the hyperparameters (and ``Z``) with L-BFGS-B, in-process (a
    notebook helper; the pipeline runs the same loop with Dask). ``bounds``: None, or L-BFGS-B's
    ``(lo, hi)`` per entry of ``pack(params, Z)`` (a kernel object's hyperparameters are ``params.log_lengthscale``)."""
    Z = np.asarray(Z, dtype=np.float64)
    m, d = Z.shape
    q = int(np.size(params.log_lengthscale)) if kern.is_object(kernel) else None

    def fun(theta):
        p, Zt = kern.unpack(theta, d, m if optimize_inducing else 0, q)
        Zt = Z if Zt is None else Zt
        try:
            val, dp, dZ = value_and_grad(method, kernel, p, Zt, X, y, chunk_size, jitter)
        except CholeskyError:
            return np.inf, np.zeros_like(theta)
        g = kern.pack(dp, dZ if optimize_inducing else None)
        return -val, -g

    theta0 = kern.pack(params, Z if optimize_inducing else None)
    res = scipy.optimize.minimize(
        fun, theta0, jac=True, method="L-BFGS-B", bounds=bounds, options={"maxiter": int(maxiter)}
    )
    p, Zt = kern.unpack(res.x, d, m if optimize_inducing else 0, q)
    return SparseFit(p, Z if Zt is None else Zt, float(-res.fun), int(res.nit), bool(res.success), str(res.message))

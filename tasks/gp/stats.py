"""Per-chunk sufficient statistics of inducing-point GPs, and the per-chunk gradient pass.

The data ``X`` [n, d], ``y`` [n] are cut into chunks by ``chunk_size`` alone
(:func:`chunk_bounds`). One evaluation of a bound and its gradient is three steps
(Gal, van der Wilk and Rasmussen 2014, "Distributed variational inference in sparse Gaussian
process regression"):

1. map :func:`chunk_stats` over the chunks and add the results in chunk order
   (:func:`sum_in_order`): a :class:`Stats` (SGPR, DTC) or :class:`FITCStats` (FITC);
2. on the driver, ``pgmflow.tasks.gp.bounds.objective`` turns the summed statistics into the value and
   small adjoints (m x m, m, scalars);
3. map :func:`chunk_grad` over the chunks with those adjoints, add the :class:`Grad` results in
   chunk order, and finish on the driver with ``pgmflow.tasks.gp.bounds.finish_grad`` (the terms through
   ``Kuu``).

Notation (Titsias 2009; Quinonero-Candela and Rasmussen 2005): ``Kuf = K(Z, X)`` [m, n] (code
name ``Kuf``, laid out ``[m, n]``), ``Kuu = K(Z, Z) + jitter = L L'`` (the driver factors it once per
evaluation, ``kernels.inducing_cholesky``, and ships ``L`` with the chunk tasks), ``A = L^-1 Kuf`` [m, n]
(GPflow's ``A`` without its ``1 / sigma``), ``Qff = Kfu Kuu^-1 Kuf = A'A``, ``sigma^2`` the noise variance.

SGPR / DTC statistics of a chunk: ``n``, ``yy = y'y``, ``psi0 = sum diag Kff``,
``Ay = A y`` [m], ``AAT = A A'`` [m, m] (exactly symmetric).

FITC statistics of a chunk, with ``Lambda = diag(Kff - Qff) + sigma^2``: ``n``, ``yy = y' Lambda^-1 y``,
``log_lambda = sum log Lambda``, ``Ay = A Lambda^-1 y`` [m], ``AAT = A Lambda^-1 A'`` [m, m].

Why ``A A'`` and not ``psi2 = Kuf Kfu`` (as before issue 37): the driver's bound needs
``B = I + L^-1 psi2 L^-T / sigma^2``; formed from ``psi2`` that matrix carries the square of ``Kuu``'s
condition number and is indefinite in rounding when the inducing inputs are dense (the CO2 record with
``Z = X`` below a relative jitter of 1e-4, ``benchmarks/gp_sgpr_conditioning.py``), while ``I + A A' / sigma^2``
built from ``A`` (one triangular solve per chunk) is ``>= I`` in any rounding. The statistics therefore
depend on ``L``, i.e. on the jitter the driver's factorisation used. Where ``L`` is well conditioned
(:func:`pgmflow.tasks.gp.fused.plain_inverse`, decided from ``L``'s bits alone) SGPR and DTC compute the same
``A A'`` and ``A y`` in the *plain form*, ``L^-1 (Kuf Kfu) L^-T`` and ``L^-1 (Kuf y)`` with an explicit ``L^-1``
per chunk, which saves the triangular solve against every column (their rounding then differs by ~1e-14).

Gradient pass of a chunk, given ``W = dF/dAAT``, ``a = L^-T dF/dAy`` and ``L`` from the driver (formed from
the well-conditioned ``B``, ``pgmflow.tasks.gp.bounds``): the adjoint of ``Kuf`` is
``L^-T (2 W A) + a y'`` with ``A = L^-1 Kuf`` (triangular solves and a GEMM; ``L^-T W L^-1`` formed
explicitly, the plain form's one GEMM, is used only where ``L`` is well conditioned: elsewhere it loses the
gradient to rounding; FITC adds the terms through ``Lambda``), pushed through the kernel with the
matrix-product identities of :mod:`pgmflow.tasks.gp.kernels`; the path through ``L`` (``A`` depends on
``Kuu``) is a function of the summed statistics alone and is added on the driver. A :class:`Grad` holds the
chunk's gradient w.r.t. ``log_lengthscale``, ``log_variance``, ``log_noise``, ``Z``, and (FITC only; zeros
otherwise) the adjoint it contributes to ``Kuu``.

Functions take NumPy arrays, or CuPy arrays for ``X_chunk`` (SGPR and DTC; FITC also works,
with its m x m factors computed on the host); statistics and gradients come back as NumPy.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np
import scipy.linalg
from scipy.linalg.blas import dger, dsyrk

from pgmflow.tasks import backend, fastexp
from pgmflow.tasks.gp import fused
from pgmflow.tasks.gp import kernels as kern
from pgmflow.tasks.gp.kernels import DEFAULT_JITTER, GPParams

__all__ = [
    "METHODS",
    "FITCStats",
    "Grad",
    "Stats",
    "check_method",
    "chunk_bounds",
    "chunk_grad",
    "chunk_stats",
    "chunk_stats_and_kuf",
    "chunk_stats_kuf_and_a",
    "cross_covariance",
    "sum_in_order",
]

METHODS = ("sgpr", "dtc", "fitc")


def check_method(method: str) -> str:
    """Return ``method`` if it is known; ValueError naming the allowed ones otherwise."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {', '.join(METHODS)}")
    return method


def _add(a, b):
    if type(a) is not type(b):
        return NotImplemented
    return type(a)(*(x + y for x, y in zip(a, b)))


def _radd(a, b):  # lets sum() start from 0
    if isinstance(b, int) and b == 0:
        return a
    return NotImplemented


class Stats(NamedTuple):
    """Sufficient statistics of SGPR and DTC over some rows (``+`` adds them elementwise).

    n: int, number of rows.
    yy: float, ``y'y``.
    psi0: float, ``sum_i k(x_i, x_i)`` (the trace of ``Kff``).
    Ay: float64 [m], ``A y`` with ``A = L^-1 Kuf`` (``L``: the Cholesky factor of ``Kuu`` they were made with).
    AAT: float64 [m, m], ``A A'`` (exactly symmetric, positive semi-definite in any rounding).
    """

    n: int
    yy: float
    psi0: float
    Ay: np.ndarray
    AAT: np.ndarray

    __add__ = _add
    __radd__ = _radd


class FITCStats(NamedTuple):
    """Sufficient statistics of FITC over some rows (``+`` adds them elementwise).

    With ``Lambda = diag(Kff - Qff) + sigma^2`` [n]:

    n: int, number of rows.
    yy: float, ``y' Lambda^-1 y``.
    log_lambda: float, ``sum_i log Lambda_i``.
    Ay: float64 [m], ``A Lambda^-1 y`` with ``A = L^-1 Kuf``.
    AAT: float64 [m, m], ``A Lambda^-1 A'`` (exactly symmetric).
    """

    n: int
    yy: float
    log_lambda: float
    Ay: np.ndarray
    AAT: np.ndarray

    __add__ = _add
    __radd__ = _radd


class Grad(NamedTuple):
    """One chunk's contribution to the gradient of the objective (``+`` adds elementwise).

    log_lengthscale: float64 [d].
    log_variance: float.
    log_noise: float (non-zero for FITC only: SGPR and DTC meet the noise on the driver).
    Z: float64 [m, d], through ``Kuf``.
    Kuu: float64 [m, m], the adjoint w.r.t. ``Kuu`` collected in the chunk (FITC, through
        ``Lambda``); the scalar 0.0 for SGPR and DTC (adding it changes no bit of the driver's
        ``dKuu``); ``finish_grad`` pushes it through the kernel once.
    """

    log_lengthscale: np.ndarray
    log_variance: float
    log_noise: float
    Z: np.ndarray
    Kuu: np.ndarray

    __add__ = _add
    __radd__ = _radd


def sum_in_order(parts: Iterable):
    """The sum of statistics or gradients, added left to right in the order given (chunk order)."""
    parts = list(parts)
    if not parts:
        raise ValueError("sum_in_order needs at least one part")
    return functools.reduce(operator.add, parts)


def chunk_bounds(n: int, chunk_size: int) -> list[tuple[int, int]]:
    """The ``(start, stop)`` row ranges of the chunks of ``n`` rows: ``chunk_size`` rows each, the
    last one shorter. Depends on ``n`` and ``chunk_size`` only."""
    n, chunk_size = int(n), int(chunk_size)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1; got {chunk_size}")
    return [(i, min(i + chunk_size, n)) for i in range(0, n, chunk_size)]


# ------------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------------


def _inputs(xp, params: GPParams, Z, X_chunk, y_chunk):
    X = xp.asarray(X_chunk, dtype=xp.float64)
    y = xp.asarray(y_chunk, dtype=xp.float64)
    Z = xp.asarray(Z, dtype=xp.float64)
    if X.ndim != 2 or Z.ndim != 2 or X.shape[1] != Z.shape[1]:
        raise ValueError(f"X_chunk [n, d] and Z [m, d] must be matrices of equal width; got {X.shape}, {Z.shape}")
    if y.shape != (X.shape[0],):
        raise ValueError(f"y_chunk must have shape ({X.shape[0]},); got {y.shape}")
    Zs = kern._scaled(xp, Z, params)
    Xs = kern._scaled(xp, X, params)
    return Zs, Xs, y


def _kuf(xp, kernel: str, params: GPParams, Zs, Xs, with_grad: bool, Kuf=None):
    """``(Kuf [m, n], dKuf/du [m, n] or None)``; for RBF ``dK/du = -K/2`` is left to the caller.
    A given ``Kuf`` (RBF only: the other kernels need ``u`` for ``dK/du``) is used as it is."""
    if Kuf is not None:
        _check_kuf(kernel, Kuf, Zs, Xs)
        return (np.ascontiguousarray(Kuf) if xp is np else Kuf), None
    if _cpu_rbf(xp, kernel, params):  # the blocked path's bits, in C order
        return fused.rbf_kuf(Zs, Xs, float(params.log_variance), order="C"), None
    if kernel == "rbf":
        return kern._rbf_log_kernel(xp, Zs, Xs, float(params.log_variance)), None
    U = kern._sqdist(xp, Zs, Xs, symmetric=False)
    return kern._profile(xp, kernel, U, math.exp(float(params.log_variance)), with_grad)


def _check_kuf(kernel, Kuf, Zs, Xs):
    if kernel != "rbf":
        raise ValueError(f"a precomputed Kuf serves the rbf kernel only, not {kernel!r}")
    if tuple(Kuf.shape) != (Zs.shape[0], Xs.shape[0]):
        raise ValueError(f"Kuf must have shape {(Zs.shape[0], Xs.shape[0])}; got {tuple(Kuf.shape)}")


def _cpu_rbf(xp, kernel: str, params: GPParams) -> bool:
    """Whether ``Kuf`` is made by :mod:`pgmflow.tasks.gp.fused`: the RBF kernel on NumPy arrays, with a
    kernel scale below ``e^700``."""
    return xp is np and kernel == "rbf" and float(params.log_variance) <= fastexp.MAX_CAP


def _blocked(xp, method: str, kernel: str, params: GPParams) -> bool:
    """Whether this chunk takes the cache-blocked passes of :mod:`pgmflow.tasks.gp.fused` (``Kuf`` kept in
    Fortran order): SGPR and DTC where :func:`_cpu_rbf` holds. FITC's whole-chunk passes take the same
    ``Kuf`` in C order."""
    return method in ("sgpr", "dtc") and _cpu_rbf(xp, kernel, params)


def cross_covariance(kernel: str, params: GPParams, Z, X_chunk):
    """``Kuf = K(Z, X_chunk)`` [m, n], bit for bit the matrix :func:`chunk_stats` and
    :func:`chunk_grad` compute themselves; either takes it back as ``Kuf=`` (RBF) to skip that work
    (the GEMM and ``m n`` exponentials) in the other pass of the same evaluation. RBF on the CPU:
    in Fortran order (:mod:`pgmflow.tasks.gp.fused`), the layout the SGPR and DTC passes use."""
    kern.check_kernel(kernel)
    xp = backend.array_module(X_chunk)
    Z = xp.asarray(Z, dtype=xp.float64)
    X = xp.asarray(X_chunk, dtype=xp.float64)
    if X.ndim != 2 or Z.ndim != 2 or X.shape[1] != Z.shape[1]:
        raise ValueError(f"X_chunk [n, d] and Z [m, d] must be matrices of equal width; got {X.shape}, {Z.shape}")
    if kern.is_object(kernel):
        return kern.K(kernel, params, Z, X)
    Zs, Xs = kern._scaled(xp, Z, params), kern._scaled(xp, X, params)
    if _cpu_rbf(xp, kernel, params):
        return fused.rbf_kuf(Zs, Xs, float(params.log_variance))  # Fortran order, as the SGPR/DTC passes keep it
    return _kuf(xp, kernel, params, Zs, Xs, with_grad=False)[0]


def _gram(xp, A):
    """``A A^T`` [m, m] for ``A`` [m, n], exactly symmetric (a SYRK on the CPU)."""
    if xp is np:
        C = dsyrk(1.0, A.T, trans=1)  # A.T is [n, m] Fortran-ordered: C = A A^T, upper triangle
        out = np.triu(C)
        out += np.triu(C, 1).T
        return out
    C = A @ A.T
    return 0.5 * (C + C.T)


def _tri_solve(xp, L, B, trans: bool = False):
    """``L^-1 B`` (or ``L^-T B``) for a host lower-triangular ``L`` and ``B`` in module ``xp`` (CuPy: a triangular
    solve on the device, ``cupyx.scipy.linalg.solve_triangular``; an explicit inverse only where that is missing)."""
    if xp is np:
        return scipy.linalg.solve_triangular(L, B, lower=True, trans="T" if trans else "N", check_finite=False)
    linalg = getattr(backend.cupyx().scipy, "linalg", None)
    if linalg is None:  # pragma: no cover - an old CuPy
        Linv = scipy.linalg.solve_triangular(L, np.eye(L.shape[0]), lower=True, check_finite=False)
        return xp.asarray(Linv.T if trans else Linv) @ B
    return linalg.solve_triangular(xp.asarray(L), B, trans=1 if trans else 0, lower=True)


def _whitened_adjoint(xp, L, W, Kuf, V=None):
    """``(L^-T W V, W V)`` [m, n] with ``V = L^-1 Kuf`` (given, or solved here): half the ``W`` part of
    ``dF/dKuf = L^-T (2 W A + v y')``, by triangular solves (``L^-T W L^-1`` formed explicitly loses it to
    rounding when ``Kuu`` is badly conditioned)."""
    if V is None:
        V = _tri_solve(xp, L, Kuf)  # [m, n]
    WV = xp.asarray(W, dtype=xp.float64) @ V  # [m, n]
    return _tri_solve(xp, L, WV, trans=True), WV


def _plain_or_whitened_stats(xp, L, Kuf, y):
    """SGPR / DTC's ``(A y, A A')`` of a chunk with ``A = L^-1 Kuf``: in the plain form (``Kuf y`` and
    ``Kuf Kfu``, whitened once with ``L^-1``) where :func:`pgmflow.tasks.gp.fused.plain_inverse` finds ``L`` well
    conditioned, else by a triangular solve against the whole chunk."""
    Linv = fused.plain_inverse(L)
    if Linv is None:
        return _whitened(xp, _tri_solve(xp, L, Kuf), y)
    return Linv @ _h(Kuf @ y), fused.sandwich(Linv, _h(_gram(xp, Kuf)), outer=True)


def _plain_or_whitened_adjoint(xp, L, W, Kuf):
    """``L^-T W L^-1 Kuf`` [m, n]: one GEMM with the explicit ``L^-T W L^-1`` where ``L`` is well conditioned
    (:func:`pgmflow.tasks.gp.fused.plain_inverse`), else by triangular solves (:func:`_whitened_adjoint`)."""
    Linv = fused.plain_inverse(L)
    if Linv is None:
        return _whitened_adjoint(xp, L, W, Kuf)[0]
    return xp.asarray(fused.sandwich(Linv, np.asarray(W, dtype=np.float64))) @ Kuf


def _fitc_lambda(xp, params, L, Kuf, diag=None):
    """``V = L^-1 Kuf`` [m, n] and FITC's ``Lambda = diag(Kff - Qff) + sigma^2`` [n]
    (``diag Kff = s`` for the stationary kernels, ``diag`` [n] when given; ``diag(Kff - Qff)`` is clipped at 0)."""
    V = _tri_solve(xp, L, Kuf)  # [m, n]
    q = xp.sum(V * V, axis=0)  # [n]  diag Qff
    s = math.exp(float(params.log_variance)) if diag is None else diag
    lam = xp.maximum(s - q, 0.0) + math.exp(float(params.log_noise))  # [n]
    return V, lam


def _h(x):
    return backend.to_numpy(x)


# ------------------------------------------------------------------------------------------------
# Statistics
# ------------------------------------------------------------------------------------------------


def chunk_stats(
    method: str, kernel: str, params: GPParams, Z, X_chunk, y_chunk, jitter: float = DEFAULT_JITTER, Kuf=None, L=None
):
    """Sufficient statistics of one chunk: :class:`Stats` (``"sgpr"``, ``"dtc"``) or
    :class:`FITCStats` (``"fitc"``).

    Z: [m, d] inducing inputs; X_chunk: [n, d]; y_chunk: [n]; Kuf: None, or (RBF)
    ``cross_covariance(kernel, params, Z, X_chunk)`` [m, n], not modified. L: the lower Cholesky factor
    [m, m] (NumPy) of ``Kuu`` that the driver made and ships (``kernels.inducing_cholesky``); None: made here
    with ``inducing_cholesky(kernel, params, Z, jitter)``, the same bits as the driver's at the same ``jitter``
    and the default ``max_tries``. Cost: one [m, d + 2] x [d + 2, n] GEMM and ``m n`` exponentials (none with
    ``Kuf``), a triangular solve ``m^2 n``, ``2 m n`` for ``A y`` and one SYRK ``m^2 n``.
    """
    return chunk_stats_and_kuf(method, kernel, params, Z, X_chunk, y_chunk, jitter, Kuf=Kuf, L=L)[0]


def _factor(kernel, params, Z, jitter, L) -> np.ndarray:
    """The Cholesky factor of ``Kuu`` the statistics use: ``L`` as given (a host array), or made here."""
    if L is None:
        return kern.inducing_cholesky(kernel, params, backend.to_numpy(Z), jitter)[0]
    L = np.asarray(backend.to_numpy(L), dtype=np.float64)
    m = np.shape(Z)[0]
    if L.shape != (m, m):
        raise ValueError(f"L must be the [{m}, {m}] Cholesky factor of Kuu; got shape {L.shape}")
    return L


def _whitened(xp, A, y, lam=None):
    """``(A y [m], A A' [m, m])`` of ``A = L^-1 Kuf`` [m, n] (FITC, with ``lam``: ``A Lambda^-1 y`` and
    ``A Lambda^-1 A'``; ``A`` is overwritten), on the host."""
    if lam is None:
        return _h(A @ y), _h(_gram(xp, A))
    Ay = A @ (y / lam)  # [m]
    A /= xp.sqrt(lam)[None, :]  # [m, n]  A Lambda^-1/2
    return _h(Ay), _h(_gram(xp, A))


def chunk_stats_and_kuf(
    method: str,
    kernel: str,
    params: GPParams,
    Z,
    X_chunk,
    y_chunk,
    jitter: float = DEFAULT_JITTER,
    Kuf=None,
    out=None,
    L=None,
):
    """``(statistics, Kuf)``: :func:`chunk_stats` and the ``Kuf`` it used, for the gradient pass of the
    same evaluation to take back (``Kuf=``): [m, n] in Fortran order on the cache-blocked CPU path of
    :mod:`pgmflow.tasks.gp.fused` (SGPR and DTC with RBF; written into ``out``, a Fortran-ordered
    float64 [m, n] array, when given), in C order otherwise, or a given ``Kuf`` as it is."""
    return chunk_stats_kuf_and_a(method, kernel, params, Z, X_chunk, y_chunk, jitter, Kuf=Kuf, out=out, L=L)[:2]


def chunk_stats_kuf_and_a(
    method: str,
    kernel: str,
    params: GPParams,
    Z,
    X_chunk,
    y_chunk,
    jitter: float = DEFAULT_JITTER,
    Kuf=None,
    out=None,
    L=None,
    keep_a: bool = False,
    a_out=None,
):
    """``(statistics, Kuf, A)``: :func:`chunk_stats_and_kuf`, and, with ``keep_a`` (or ``a_out``, a
    Fortran-ordered float64 [m, n] array to write into) on the cache-blocked path in its whitened form, the
    chunk's ``A = L^-1 Kuf`` [m, n] (Fortran order) for the gradient pass to take back (``A=``); None
    otherwise (the plain form needs none, and the other paths do not use it)."""
    check_method(method)
    kern.check_kernel(kernel)
    xp = backend.array_module(X_chunk)
    L = _factor(kernel, params, Z, jitter, L)
    if kern.is_object(kernel):
        return (*_object_stats(xp, method, kernel, params, Z, X_chunk, y_chunk, L, Kuf), None)
    Zs, Xs, y = _inputs(xp, params, Z, X_chunk, y_chunk)
    n = int(Xs.shape[0])
    psi0 = n * math.exp(float(params.log_variance))  # sum diag Kff (stationary)
    if _blocked(xp, method, kernel, params):
        if Kuf is not None:
            _check_kuf(kernel, Kuf, Zs, Xs)
        Ay, AAT, Kuf, A = fused.rbf_stats(
            Zs, Xs, y, float(params.log_variance), L, Kuf=Kuf, out=out, a_out=a_out, keep_a=keep_a
        )
        return Stats(n, float(y @ y), float(psi0), Ay, AAT), Kuf, A
    Kuf, _ = _kuf(xp, kernel, params, Zs, Xs, with_grad=False, Kuf=Kuf)  # [m, n]
    if method in ("sgpr", "dtc"):
        return Stats(n, float(y @ y), float(psi0), *_plain_or_whitened_stats(xp, L, Kuf, y)), Kuf, None
    V, lam = _fitc_lambda(xp, params, L, Kuf)
    st = FITCStats(n, float(y @ (y / lam)), float(xp.sum(xp.log(lam))), *_whitened(xp, V, y, lam))
    return st, Kuf, None


# ------------------------------------------------------------------------------------------------
# Gradient pass
# ------------------------------------------------------------------------------------------------


def chunk_grad(method: str, kernel: str, params: GPParams, Z, X_chunk, y_chunk, adjoints, Kuf=None, A=None) -> Grad:
    """One chunk's gradient contribution, given the driver's ``adjoints`` (a
    ``pgmflow.tasks.gp.bounds.Adjoints`` of the same ``method``); ``Kuf`` as in :func:`chunk_stats`; ``A``: None,
    or the ``L^-1 Kuf`` that :func:`chunk_stats_kuf_and_a` kept with the same ``L`` (read by the cache-blocked
    path only; the same bits as solving for it again).

    SGPR / DTC: ``dF/dKuf = L^-T (2 W A) + a y'`` with ``A = L^-1 Kuf``, ``W = adjoints.dAAT``,
    ``a = adjoints.dpsi1y``, ``L = adjoints.L``, plus ``adjoints.dpsi0`` on ``diag Kff``. FITC adds, per row,
    ``g = dF/dLambda`` and its paths through ``Kuf`` (``-2 g Kuu^-1 k``), ``diag Kff``, the noise and ``Kuu``
    (``sum g w w'`` with ``w = Kuu^-1 k``). Adjoints without ``L`` (None): ``Kuu`` factored again with exactly
    ``adjoints.jitter``.
    """
    check_method(method)
    kern.check_kernel(kernel)
    if adjoints.method != method:
        raise ValueError(f"adjoints were made for method {adjoints.method!r}, not {method!r}")
    xp = backend.array_module(X_chunk)
    if kern.is_object(kernel):
        return _object_grad(xp, method, kernel, params, Z, X_chunk, y_chunk, adjoints, Kuf)
    Zs, Xs, y = _inputs(xp, params, Z, X_chunk, y_chunk)
    n = int(Xs.shape[0])
    s = math.exp(float(params.log_variance))
    noise = math.exp(float(params.log_noise))
    ls = xp.exp(xp.asarray(params.log_lengthscale, dtype=xp.float64))
    L = _adjoint_factor(kernel, params, Z, adjoints)  # [m, m] host
    a = xp.asarray(adjoints.dpsi1y, dtype=xp.float64)  # [m]
    if _blocked(xp, method, kernel, params):
        if Kuf is None:
            Kuf = fused.rbf_kuf(Zs, Xs, float(params.log_variance))
        else:
            _check_kuf(kernel, Kuf, Zs, Xs)
        GX, g1, sq, g_sum = fused.rbf_grad(adjoints.dAAT, a, Kuf, Xs, y, L, A=A)  # G x~, G 1, 1' G x~^2, sum G
        dlog_ls, dZ = kern._vjp_sums(np, ls, Zs, GX, g1, sq, True)
        d_diag = float(adjoints.dpsi0) * n  # through psi0 = n s
        return Grad(dlog_ls, -2.0 * g_sum + d_diag * s, 0.0, dZ, 0.0)
    Kuf, dKdu = _kuf(xp, kernel, params, Zs, Xs, with_grad=True, Kuf=Kuf)  # [m, n]

    if method in ("sgpr", "dtc"):
        dlog_noise = 0.0
        dKuu = 0.0  # (no Kuu path here: a scalar, not an m x m block of zeros to ship and add per chunk)
        d_diag = float(adjoints.dpsi0) * n  # through psi0 = n s
        R = _plain_or_whitened_adjoint(xp, L, adjoints.dAAT, Kuf)  # [m, n]  L^-T W L^-1 Kuf
        if kernel == "rbf":
            # G = dF/dKuf * dK/du = -(1/2) K * (2 R + a y'), formed in place
            G = xp.ascontiguousarray(-R)  # [m, n]
            _rank1_update(xp, G, -0.5 * a, y)
            G *= Kuf
            dlog_s = -2.0 * float(xp.sum(G))
        else:
            B = xp.ascontiguousarray(2.0 * R)  # [m, n]
            _rank1_update(xp, B, a, y)
            dlog_s = float(xp.sum(B * Kuf))
            G = B
            G *= dKdu
        del R
    else:
        V, lam = _fitc_lambda(xp, params, L, Kuf)
        W = _tri_solve(xp, L, V, trans=True)  # [m, n]  Kuu^-1 Kuf
        KP, WV = _whitened_adjoint(xp, L, adjoints.dAAT, Kuf, V)  # [m, n]  L^-T W L^-1 Kuf, W L^-1 Kuf
        quad = xp.sum(V * WV, axis=0)  # [n]  k' L^-T W L^-1 k
        del V, WV
        ak = a @ Kuf  # [n]
        inv_lam = 1.0 / lam
        g = (0.5 * y * y - quad - ak * y) * inv_lam * inv_lam - 0.5 * inv_lam  # [n]  dF/dLambda
        B = xp.ascontiguousarray(KP)
        B *= 2.0
        _rank1_update(xp, B, a, y)
        B *= inv_lam[None, :]
        Wg = W * g[None, :]  # [m, n]
        dKuu = _h(Wg @ W.T)  # [m, m]
        dKuu = 0.5 * (dKuu + dKuu.T)
        B -= 2.0 * Wg
        del W, Wg
        g_sum = float(xp.sum(g))
        d_diag = g_sum
        dlog_noise = noise * g_sum
        dlog_s = float(xp.sum(B * Kuf))
        G = B
        if kernel == "rbf":
            G *= Kuf
            G *= -0.5
        else:
            G *= dKdu
    dlog_ls, dZ, _ = kern._vjp_core(xp, ls, Zs, Xs, G, True, False)
    return Grad(_h(dlog_ls), dlog_s + d_diag * s, float(dlog_noise), _h(dZ), dKuu)


def _adjoint_factor(kernel, params, Z, adjoints) -> np.ndarray:
    """The Cholesky factor the statistics were made with: ``adjoints.L``, or (adjoints without it) ``Kuu``
    factored again with exactly ``adjoints.jitter``."""
    if adjoints.L is not None:
        return np.asarray(adjoints.L, dtype=np.float64)
    return _fixed_cholesky(kernel, params, Z, adjoints.jitter)


# ------------------------------------------------------------------------------------------------
# Kernel objects (pgmflow.tasks.gp.kernel_algebra): the same statistics, with K(Z, X), diag Kff and their
# adjoints from the object (no cache blocking, no lengthscale-scaled inputs: the object scales its own)
# ------------------------------------------------------------------------------------------------


def _object_inputs(xp, Z, X_chunk, y_chunk):
    Z = xp.asarray(Z, dtype=xp.float64)
    X = xp.asarray(X_chunk, dtype=xp.float64)
    y = xp.asarray(y_chunk, dtype=xp.float64).ravel()
    if X.ndim != 2 or Z.ndim != 2 or X.shape[1] != Z.shape[1]:
        raise ValueError(f"X_chunk [n, d] and Z [m, d] must be matrices of equal width; got {X.shape}, {Z.shape}")
    if y.shape != (X.shape[0],):
        raise ValueError(f"y_chunk must have shape ({X.shape[0]},); got {y.shape}")
    return Z, X, y


def _object_stats(xp, method, kernel, params, Z, X_chunk, y_chunk, L, Kuf):
    """:func:`chunk_stats_and_kuf` for a kernel object: ``psi0 = sum diag Kff`` from the object's diagonal."""
    Z, X, y = _object_inputs(xp, Z, X_chunk, y_chunk)
    n = int(X.shape[0])
    if Kuf is None:
        Kuf = kern.K(kernel, params, Z, X)  # [m, n]
    diag = kern.K_diag(kernel, params, X)  # [n]
    if method in ("sgpr", "dtc"):
        return Stats(n, float(y @ y), float(xp.sum(diag)), *_plain_or_whitened_stats(xp, L, Kuf, y)), Kuf
    V, lam = _fitc_lambda(xp, params, L, Kuf, diag)
    st = FITCStats(n, float(y @ (y / lam)), float(xp.sum(xp.log(lam))), *_whitened(xp, V, y, lam))
    return st, Kuf


def _object_grad(xp, method, kernel, params, Z, X_chunk, y_chunk, adjoints, Kuf) -> Grad:
    """:func:`chunk_grad` for a kernel object: ``dF/dKuf`` as for the named kernels, pushed through
    ``kernels.K_vjp``; the diagonal's adjoint (``dpsi0`` per row, FITC's ``g``) through ``K_diag_vjp``."""
    Z, X, y = _object_inputs(xp, Z, X_chunk, y_chunk)
    n = int(X.shape[0])
    L = _adjoint_factor(kernel, params, Z, adjoints)  # [m, m] host
    a = xp.asarray(adjoints.dpsi1y, dtype=xp.float64)  # [m]
    if Kuf is None:
        Kuf = kern.K(kernel, params, Z, X)  # [m, n]
    dlog_noise, dKuu = 0.0, 0.0
    if method in ("sgpr", "dtc"):
        R = _plain_or_whitened_adjoint(xp, L, adjoints.dAAT, Kuf)  # [m, n]
        B = xp.ascontiguousarray(2.0 * R)  # [m, n]  dF/dKuf
        _rank1_update(xp, B, a, y)
        ddiag = float(adjoints.dpsi0)
    else:
        diag = kern.K_diag(kernel, params, X)  # [n]
        V, lam = _fitc_lambda(xp, params, L, Kuf, diag)
        W = _tri_solve(xp, L, V, trans=True)  # [m, n]  Kuu^-1 Kuf
        KP, WV = _whitened_adjoint(xp, L, adjoints.dAAT, Kuf, V)  # [m, n]
        quad = xp.sum(V * WV, axis=0)  # [n]
        ak = a @ Kuf  # [n]
        inv_lam = 1.0 / lam
        g = (0.5 * y * y - quad - ak * y) * inv_lam * inv_lam - 0.5 * inv_lam  # [n]  dF/dLambda
        B = xp.ascontiguousarray(2.0 * KP)
        _rank1_update(xp, B, a, y)
        B *= inv_lam[None, :]
        Wg = W * g[None, :]  # [m, n]
        dKuu = _h(Wg @ W.T)  # [m, m]
        dKuu = 0.5 * (dKuu + dKuu.T)
        B -= 2.0 * Wg
        dlog_noise = math.exp(float(params.log_noise)) * float(xp.sum(g))
        ddiag = g
    kg = kern.K_vjp(kernel, params, Z, X, B, wrt_X1=True, wrt_X2=False)
    kd = kern.K_diag_vjp(kernel, params, X, ddiag if np.ndim(ddiag) else xp.full(n, ddiag))
    dth = _h(kg.log_lengthscale) + _h(kd.log_lengthscale)
    return Grad(dth, float(kg.log_variance) + float(kd.log_variance), float(dlog_noise), _h(kg.X1), dKuu)


def _rank1_update(xp, A, u, v):
    """``A += u v'`` in place, A [m, n] C-ordered (BLAS GER on the CPU)."""
    if xp is np and A.flags.c_contiguous:
        R = dger(1.0, v, u, a=A.T, overwrite_a=True)  # A.T is Fortran [n, m]: A.T += v u'
        if not np.shares_memory(R, A):  # BLAS worked on a copy
            A[...] = R.T
    else:
        A += u[:, None] * v[None, :]


def _fixed_cholesky(kernel, params, Z, jitter_abs: float) -> np.ndarray:
    """Cholesky of ``K(Z, Z) + jitter_abs I`` with exactly this jitter (as the driver used)."""
    Kuu = backend.to_numpy(kern.K(kernel, params, backend.to_numpy(Z)))
    Kuu[np.diag_indices_from(Kuu)] += jitter_abs
    try:
        return scipy.linalg.cholesky(Kuu, lower=True, check_finite=False)
    except np.linalg.LinAlgError as exc:
        raise kern.CholeskyError(
            f"Cholesky of Kuu ({Kuu.shape[0]}x{Kuu.shape[0]}) with the driver's jitter "
            f"{jitter_abs:.3g} failed in a chunk"
        ) from exc

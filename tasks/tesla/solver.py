"""One node's temporally smoothed L1 logistic regression path: TESLA, KELLER and the static baseline.

Node ``i`` of a binary (+-1) network is regressed on the other nodes at every time point
(Ahmed and Xing 2009, PNAS 106, eqs. 11-13). With ``z_d`` the sample ``x_d`` with its own entry replaced by 1 (so that
``theta^t[i]`` is node i's field, the paper's ``theta_ii``), the conditional log-likelihood of a
sample is ``log sigmoid(2 x_{d,i} theta^t . z_d)`` (eq. 11). The parameters ``theta^1..theta^T``
(``Theta``, [T, p]) minimise

    F(Theta) = sum_t sum_{d in W_t} w_{t,d} l(x_{d,i} theta^t . z_d)
               + lambda1 sum_t sum_{j != i} |theta^t_j|
               + lambda2 sum_{t>=2} ||theta^t - theta^{t-1}||_q^q,          l(m) = log(1 + exp(-2 m)),

where the data term is a weighted loss over a window ``W_t`` of samples:

* **TESLA** (eq. 13): ``W_t`` = the samples of time t, ``w = 1/N^t`` (the average loss ``l_avg``);
* **static** neighbourhood selection: TESLA with ``lambda2 = 0`` (each time point on its own);
* **KELLER** (eq. 12; Song, Kolar and Xing 2009): ``lambda2 = 0`` and ``W_t`` = the samples within
  ``truncate`` bandwidths of t, with normalised Gaussian kernel weights ``w_{t,d} ∝ K_h(t_d - t)``.

The problem is solved by FISTA (Beck and Teboulle 2009) with adaptive restart (O'Donoghue and
Candes 2015). ``L = max_t lambda_max(sum_d w_{t,d} a_d a_d^T)`` over ``a_d = [1, x_d]`` bounds the
gradient's Lipschitz constant (the node's design is a column subset of it, so one bound serves every
node; ``l'' <= 1``). The reference solver (``screen=False``) updates every coefficient with the fixed
step ``1/L``; the default (``screen=True``, :func:`_solve_block`) works on active sets of columns with
backtracked local steps ``1/L_k >= 1/L`` and certifies its result with one full step of the reference.
For ``q = 1`` the proximal step of L1 plus fused differences is exact: 1-D total variation denoising of each
coefficient path followed by soft-thresholding (``pgmflow.tasks.tesla.prox``).
For ``q = 2`` the smoothing term is differentiable and joins the gradient (``L += 8 lambda2``).
The node's field is smoothed but never L1-penalised (eq. 13 penalises ``theta_{-i}`` only).

Every sum runs in a fixed order in float64 without fastmath, so a solve is a pure function of its
inputs: the same numbers on any worker. The iterates that leave the solver are proximal outputs,
so coefficients that the L1 term removes are exactly zero.

:func:`path_gradient` is the batched loss gradient over many nodes at once with the same signature
on NumPy and CuPy arrays (the GPU path of the gradient computations); the numba solver is the CPU
path of the solve.
"""

from __future__ import annotations

import functools
import math
import sys
from typing import NamedTuple

import numpy as np

from pgmflow.tasks import backend
from pgmflow.tasks import fastexp as _fastexp
from pgmflow.tasks.tesla import prox as _prox
from pgmflow.tasks.tesla import ssnal as _ssnal

ALGORITHMS = ("auto", "fista", "ssnal")
FIELD_CAP = 10.0  # |field| reported where its optimum is infinite (P(x_i = observed) = 1 - 2e-9)


class Design(NamedTuple):
    """The data term of the path problem, shared by every node: samples, windows and weights.

    Rows of ``X`` are sorted by time. The loss at time t sums over rows ``lo[t] <= d < hi[t]`` with
    weights ``w[woff[t] + d - lo[t]]`` (a zero weight drops a row, e.g. a held-out sample).
    """

    X: np.ndarray  # int8 [N, p] samples, +-1, sorted by time
    tix: np.ndarray  # int64 [N] time index of each row
    lo: np.ndarray  # int64 [T] first row of the window of time t
    hi: np.ndarray  # int64 [T] one past the last row of the window of time t
    woff: np.ndarray  # int64 [T] offset of time t's weights in w
    w: np.ndarray  # float64 [sum_t (hi - lo)] row weights per window
    L: np.ndarray  # float64 [T] Lipschitz bound of time t's loss gradient (any node)
    kind: str  # "tesla" (own time point, weights 1/N^t) or "keller" (kernel window)
    node_of: int = -1  # the node whose missing values the weights leave out (node_design); -1: none

    @property
    def T(self) -> int:
        return int(self.lo.shape[0])

    @property
    def p(self) -> int:
        return int(self.X.shape[1])


class PathResult(NamedTuple):
    """One node's solved path for one (lambda1, lambda2)."""

    theta: np.ndarray  # float64 [T, p] theta^t; column ``node`` is the node's field
    n_iter: int  # FISTA iterations used
    converged: bool  # gradient-mapping norm fell below tol within max_iter
    loss: float  # the weighted data term at theta (what FISTA minimised, without penalties)
    objective: float  # F(theta), penalties included
    flops: int  # mat-vec floating-point operations spent (see ``solve_path``: 4 per weighted row and column)
    n_solves: int  # FISTA runs: 1 without screening, more when the KKT check added columns
    n_newton: int = 0  # SSNAL's semismooth Newton steps (0 where FISTA alone solved it)


def _time_rows(tix: np.ndarray, T: int) -> tuple[np.ndarray, np.ndarray]:
    starts = np.searchsorted(tix, np.arange(T), side="left").astype(np.int64)
    ends = np.searchsorted(tix, np.arange(T), side="right").astype(np.int64)
    return starts, ends


def _check_rows(X, tix, T):
    X = np.ascontiguousarray(X, dtype=np.int8)
    tix = np.ascontiguousarray(tix, dtype=np.int64)
    if X.ndim != 2 or tix.shape != (X.shape[0],):
        raise ValueError(f"X must be [N, p] and tix [N]; got {X.shape} and {tix.shape}")
    if tix.size and (np.any(np.diff(tix) < 0) or tix[0] < 0 or tix[-1] >= T):
        raise ValueError("tix must be sorted and within [0, T)")
    return X, tix


def _lipschitz(X, lo, hi, woff, w) -> np.ndarray:
    """lambda_max of sum_d w_d a_d a_d^T with a_d = [1, x_d], per time point."""
    T = lo.shape[0]
    out = np.zeros(T)
    for t in range(T):
        rows = slice(int(lo[t]), int(hi[t]))
        wt = w[int(woff[t]) : int(woff[t]) + int(hi[t] - lo[t])]
        if wt.size == 0 or not np.any(wt > 0):
            continue
        A = np.concatenate([np.ones((wt.size, 1)), X[rows].astype(np.float64)], axis=1)  # [n, p+1]
        G = (A * wt[:, None]).T @ A  # [p+1, p+1]
        out[t] = float(np.linalg.eigvalsh(G)[-1])
    return out


def tesla_design(X, tix, T: int, train=None) -> Design:
    """The TESLA / static data term: each time point's own samples, weights ``1/N^t``.

    ``train`` (bool [N], optional) keeps only those rows; a time point left without rows has no
    data term (its parameters follow from the smoothing).
    """
    X, tix = _check_rows(X, tix, T)
    lo, hi = _time_rows(tix, T)
    keep = np.ones(X.shape[0], bool) if train is None else np.asarray(train, bool)
    counts = np.bincount(tix[keep], minlength=T).astype(np.int64)  # training rows per time point
    w = np.zeros(X.shape[0])
    n_t = counts[tix]
    w[keep] = 1.0 / n_t[keep]
    woff = lo.copy()
    return Design(X, tix, lo, hi, woff, w, _lipschitz(X, lo, hi, woff, w), "tesla")


def keller_design(X, tix, T: int, bandwidth: float, truncate: float = 3.0, train=None) -> Design:
    """The KELLER data term: samples within ``truncate * bandwidth`` time points of t, weighted by a
    Gaussian kernel ``exp(-(t_d - t)^2 / (2 h^2))`` normalised to sum to one per time point."""
    if not bandwidth > 0:
        raise ValueError(f"bandwidth must be > 0, got {bandwidth}")
    X, tix = _check_rows(X, tix, T)
    keep = np.ones(X.shape[0], bool) if train is None else np.asarray(train, bool)
    reach = int(math.floor(truncate * bandwidth))
    lo_t, hi_t = _time_rows(tix, T)
    lo = np.empty(T, np.int64)
    hi = np.empty(T, np.int64)
    woff = np.empty(T, np.int64)
    chunks = []
    off = 0
    for t in range(T):
        a, b = max(0, t - reach), min(T - 1, t + reach)
        lo[t], hi[t] = lo_t[a], hi_t[b]
        dt = (tix[lo[t] : hi[t]] - t).astype(np.float64)
        k = np.exp(-0.5 * (dt / bandwidth) ** 2) * keep[lo[t] : hi[t]]
        s = k.sum()
        chunks.append(k / s if s > 0 else k)
        woff[t] = off
        off += int(hi[t] - lo[t])
    w = np.concatenate(chunks) if chunks else np.zeros(0)
    return Design(X, tix, lo, hi, woff, w, _lipschitz(X, lo, hi, woff, w), "keller")


def node_design(design: Design, node: int) -> Design:
    """The data term of node ``node``: ``design`` itself unless the node has missing values (0 in ``X``,
    e.g. a vote not cast). Rows where the node is missing leave its likelihood (weight 0; the others of
    each window are re-weighted to sum as before, so TESLA's ``l_avg`` averages the observed samples), and
    ``L[t]`` grows by the same factor (a bound still: dropping rows lowers the curvature). A missing value
    of another node contributes nothing to the node's margins (``x = 0``)."""
    if design.node_of == node:  # prepared for this node already (fit_node prepares once per path)
        return design
    if design.node_of >= 0:
        raise ValueError(f"a design prepared for node {design.node_of} cannot serve node {node}")
    y = design.X[:, node]
    if y.all():
        return design
    w = design.w.copy()
    L = design.L.copy()
    for t in range(design.T):
        a, b, o = int(design.lo[t]), int(design.hi[t]), int(design.woff[t])
        wt = w[o : o + b - a]
        total = wt.sum()
        wt[y[a:b] == 0] = 0.0
        kept = wt.sum()
        if kept > 0.0:
            wt *= total / kept
            L[t] *= total / kept
        else:
            L[t] = 0.0
    return design._replace(w=w, L=L, node_of=int(node))


# --- numba kernels ----------------------------------------------------------------------------------

# Plain module-level functions marked for numba; _kernels() compiles them (pgmflow.tasks.backend.compile_kernels)
# and rebinds their names to the dispatchers. The kernels they call from other modules, named here with their
# plain-Python meaning, are bound to those modules' dispatchers at the same time.
_cexp = _fastexp._capped_exp_nb  # exp(min(a, cap)) in place, the same bits on every machine
_tv = _prox._tv1d  # Condat's 1-D total-variation prox
_fz = _prox._fused_zero  # the one-pass zero test of the fused-lasso prox
_tvw = _prox._tv1d_warm  # the TV prox from a guessed jump set, verified


@backend.kernel(cache=True, nogil=True)
def _signed_margin(X, node, theta, t, d):
    """``(u, y)`` for sample d at time t: ``u = 2 y theta^t . z_d`` with ``z_d`` = x_d whose own
    entry is 1 (the field), ``y = x_{d,node}``; the sample's loss is ``log(1 + exp(-u))``."""
    m = 0.0
    for j in range(theta.shape[1]):
        m += theta[t, j] * X[d, j]
    yd = float(X[d, node])
    m += theta[t, node] * (1.0 - yd)  # z_d[node] = 1, not x_d[node]
    return 2.0 * yd * m, yd


@backend.kernel(cache=True, nogil=True)
def _softplus_neg(u):
    """log(1 + exp(-u)) without overflow."""
    if u > 0:
        return math.log1p(math.exp(-u))
    return -u + math.log1p(math.exp(u))


@backend.kernel(cache=True, nogil=True)
def _margins4(X, node, lo, woff, theta, t, u):
    """The margins of time points t..t+3 when each has exactly one row (TESLA with one sample per time
    point): four sums side by side over every column but the node's, in column order, then the field.
    A zero entry adds an exact zero, so each sum has the bits of the sum over the non-zero entries in
    :func:`_margins`; the four chains of additions overlap instead of waiting on one another."""
    p = theta.shape[1]
    x0, x1, x2, x3 = X[lo[t]], X[lo[t + 1]], X[lo[t + 2]], X[lo[t + 3]]
    th0, th1, th2, th3 = theta[t], theta[t + 1], theta[t + 2], theta[t + 3]
    s0 = 0.0
    s1 = 0.0
    s2 = 0.0
    s3 = 0.0
    for j in range(p):
        if j == node:
            continue
        s0 += th0[j] * x0[j]
        s1 += th1[j] * x1[j]
        s2 += th2[j] * x2[j]
        s3 += th3[j] * x3[j]
    u[woff[t]] = 2.0 * float(x0[node]) * (s0 + th0[node])
    u[woff[t + 1]] = 2.0 * float(x1[node]) * (s1 + th1[node])
    u[woff[t + 2]] = 2.0 * float(x2[node]) * (s2 + th2[node])
    u[woff[t + 3]] = 2.0 * float(x3[node]) * (s3 + th3[node])


@backend.kernel(cache=True, nogil=True)
def _step_terms(g, xn, y):
    """``(<g, xn - y>, |xn - y|^2)`` over C-ordered arrays of one shape, in four interleaved partial sums
    (a fixed order: the same bits on every machine; only the step search's test reads them)."""
    gf = g.reshape(-1)
    xf = xn.reshape(-1)
    yf = y.reshape(-1)
    n = gf.shape[0]
    a0 = a1 = a2 = a3 = 0.0
    b0 = b1 = b2 = b3 = 0.0
    n4 = n - n % 4
    for i in range(0, n4, 4):
        d0 = xf[i] - yf[i]
        d1 = xf[i + 1] - yf[i + 1]
        d2 = xf[i + 2] - yf[i + 2]
        d3 = xf[i + 3] - yf[i + 3]
        a0 += gf[i] * d0
        a1 += gf[i + 1] * d1
        a2 += gf[i + 2] * d2
        a3 += gf[i + 3] * d3
        b0 += d0 * d0
        b1 += d1 * d1
        b2 += d2 * d2
        b3 += d3 * d3
    for i in range(n4, n):
        d0 = xf[i] - yf[i]
        a0 += gf[i] * d0
        b0 += d0 * d0
    return (a0 + a1) + (a2 + a3), (b0 + b1) + (b2 + b3)


@backend.kernel(cache=True, nogil=True)
def _displacement(y, xn, x):
    """``(max |y - xn|, <y - xn, xn - x>)``: FISTA's stopping and restart tests, the inner product in
    four interleaved partial sums (a fixed order, as :func:`_step_terms`)."""
    yf = y.reshape(-1)
    nf = xn.reshape(-1)
    xf = x.reshape(-1)
    n = yf.shape[0]
    gmax = 0.0
    c0 = c1 = c2 = c3 = 0.0
    n4 = n - n % 4
    for i in range(0, n4, 4):
        e0 = yf[i] - nf[i]
        e1 = yf[i + 1] - nf[i + 1]
        e2 = yf[i + 2] - nf[i + 2]
        e3 = yf[i + 3] - nf[i + 3]
        gmax = max(gmax, max(max(abs(e0), abs(e1)), max(abs(e2), abs(e3))))
        c0 += e0 * (nf[i] - xf[i])
        c1 += e1 * (nf[i + 1] - xf[i + 1])
        c2 += e2 * (nf[i + 2] - xf[i + 2])
        c3 += e3 * (nf[i + 3] - xf[i + 3])
    for i in range(n4, n):
        e0 = yf[i] - nf[i]
        gmax = max(gmax, abs(e0))
        c0 += e0 * (nf[i] - xf[i])
    return gmax, (c0 + c1) + (c2 + c3)


@backend.kernel(cache=True, nogil=True)
def _margins(X, node, lo, hi, woff, theta, nz, u):
    """u[e] = 2 y_d theta^t . z_d for every (time point t, row d) term ``e = woff[t] + d - lo[t]``.

    Per time point over the non-zero entries of theta^t (listed once, without the node's own
    column, whose entry is the field: ``z_d[node] = 1``), two rows side by side; each margin sums
    its terms in column order, then adds the field. ``nz`` [p] int64 scratch."""
    T, p = theta.shape
    t4 = 0  # time points before t4 were done four at a time (runs of one-row windows)
    for t in range(T):
        if t < t4:
            continue
        if t + 3 < T and hi[t] - lo[t] == 1 and hi[t + 1] - lo[t + 1] == 1:
            if hi[t + 2] - lo[t + 2] == 1 and hi[t + 3] - lo[t + 3] == 1:
                _margins4(X, node, lo, woff, theta, t, u)
                t4 = t + 4
                continue
        nnz = 0
        for j in range(p):
            nz[nnz] = j
            nnz += 1 if (theta[t, j] != 0.0 and j != node) else 0
        a, b, off = lo[t], hi[t], woff[t] - lo[t]
        th_node = theta[t, node]
        d = a
        while d + 1 < b:
            x0 = X[d]
            x1 = X[d + 1]
            s0 = 0.0
            s1 = 0.0
            for k in range(nnz):
                j = nz[k]
                tj = theta[t, j]
                s0 += tj * x0[j]
                s1 += tj * x1[j]
            u[off + d] = 2.0 * float(x0[node]) * (s0 + th_node)
            u[off + d + 1] = 2.0 * float(x1[node]) * (s1 + th_node)
            d += 2
        if d < b:
            x0 = X[d]
            s0 = 0.0
            for k in range(nnz):
                j = nz[k]
                s0 += theta[t, j] * x0[j]
            u[off + d] = 2.0 * float(x0[node]) * (s0 + th_node)


@backend.kernel(cache=True, nogil=True)
def _exps(lo, hi, woff, u, ex):
    """ex[e] = exp(-|u[e]|) over the block's terms, by the vectorised exponential of
    ``pgmflow.tasks.fastexp`` (within 1 ulp of the C library's, the same bits on every machine)."""
    T = lo.shape[0]
    if T == 0:
        return
    a = woff[0]
    b = woff[T - 1] + hi[T - 1] - lo[T - 1]
    for e in range(a, b):
        ex[e] = -abs(u[e])
    _cexp(ex[a:b], 0.0)


@backend.kernel(cache=True, nogil=True)
def _loss_terms(lo, hi, woff, w, u, ex, buf):
    """sum_e w_e log(1 + exp(-u_e)) = w_e (log1p(e_e) + max(-u_e, 0)) with ``e = exp(-|u|)`` in
    (0, 1], over the block's terms in term order (``buf`` [len(w)] scratch).

    ``log1p(e) = 2 atanh(s)``, ``s = e / (2 + e)`` in [0, 1/3], by the series
    ``s (1 + s^2/3 + s^4/5 + ...)`` to the s^33 term (remainder below 2e-17 relative) in Horner
    form: a loop LLVM vectorises (the C library's log1p is a call per element), within a few ulp.
    Used by the step search, which compares losses of nearby points; reported losses use
    :func:`_loss_value`."""
    T = lo.shape[0]
    if T == 0:
        return 0.0
    a = woff[0]
    b = woff[T - 1] + hi[T - 1] - lo[T - 1]
    for e in range(a, b):
        x = ex[e]
        sv = x / (2.0 + x)
        s2 = sv * sv
        q = (
            (
                (
                    (
                        (
                            (
                                (
                                    (
                                        (
                                            (
                                                (
                                                    (
                                                        (
                                                            (((1.0 / 33.0) * s2 + 1.0 / 31.0) * s2 + 1.0 / 29.0) * s2
                                                            + 1.0 / 27.0
                                                        )
                                                        * s2
                                                        + 1.0 / 25.0
                                                    )
                                                    * s2
                                                    + 1.0 / 23.0
                                                )
                                                * s2
                                                + 1.0 / 21.0
                                            )
                                            * s2
                                            + 1.0 / 19.0
                                        )
                                        * s2
                                        + 1.0 / 17.0
                                    )
                                    * s2
                                    + 1.0 / 15.0
                                )
                                * s2
                                + 1.0 / 13.0
                            )
                            * s2
                            + 1.0 / 11.0
                        )
                        * s2
                        + 1.0 / 9.0
                    )
                    * s2
                    + 1.0 / 7.0
                )
                * s2
                + 1.0 / 5.0
            )
            * s2
            + 1.0 / 3.0
        ) * s2 + 1.0
        buf[e] = w[e] * (2.0 * sv * q + max(-u[e], 0.0))
    total = 0.0
    for e in range(a, b):
        total += buf[e]
    return total


@backend.kernel(cache=True, nogil=True)
def _accumulate(X, node, lo, hi, woff, w, u, ex, grad):
    """grad[t] = sum_d w l'(y m) y z_d from the margins ``u`` and ``ex = exp(-|u|)``:
    ``sigmoid(-u) = e / (1 + e)`` (u > 0) or ``1 / (1 + e)``, no overflow; each row's
    contribution added over all columns at once."""
    T, p = grad.shape
    for t in range(T):
        g = grad[t]
        for j in range(p):
            g[j] = 0.0
        a, b, off = lo[t], hi[t], woff[t] - lo[t]
        c_node = 0.0
        for d in range(a, b):
            wd = w[off + d]
            if wd == 0.0:
                continue
            xr = X[d]
            yd = float(xr[node])
            # l(m y) = log(1 + exp(-u)); its derivative in m is -2 y sigmoid(-u)
            e = ex[off + d]
            c = -2.0 * wd * yd * (e if u[off + d] > 0.0 else 1.0) / (1.0 + e)
            for j in range(p):
                g[j] += c * xr[j]
            c_node += c * (1.0 - yd)
        g[node] += c_node


@backend.kernel(cache=True, nogil=True)
def _grad(X, node, lo, hi, woff, w, theta, grad, nz, scratch):
    """grad[t] = sum_d w l'(y m) y z_d at theta (``nz`` [p] int64, ``scratch`` [2, len(w)]
    float64: the margins and their exponentials, left there for :func:`_loss_terms`)."""
    _margins(X, node, lo, hi, woff, theta, nz, scratch[0])
    _exps(lo, hi, woff, scratch[0], scratch[1])
    _accumulate(X, node, lo, hi, woff, w, scratch[0], scratch[1], grad)


@backend.kernel(cache=True, nogil=True)
def _smooth_value(y, lam2):
    """lambda2 sum_t ||theta^t - theta^{t-1}||^2 (q = 2)."""
    T, p = y.shape
    s = 0.0
    for t in range(1, T):
        for j in range(p):
            d = y[t, j] - y[t - 1, j]
            s += d * d
    return lam2 * s


@backend.kernel(cache=True, nogil=True)
def _smooth_grad(y, lam2, g):
    """g += the gradient of lambda2 sum_t ||theta^t - theta^{t-1}||^2 (q = 2) at y."""
    T, p = y.shape
    for t in range(T):
        for j in range(p):
            s = 0.0
            if t > 0:
                s += y[t, j] - y[t - 1, j]
            if t < T - 1:
                s -= y[t + 1, j] - y[t, j]
            g[t, j] += 2.0 * lam2 * s


@backend.kernel(cache=True, nogil=True)
def _prox_step(Y, G, step, lam1, lam2, penalized, out, state, ycol, xcol):
    """out[:, j] = soft(tv(Y[:, j] - step G[:, j], lam2), lam1 if penalized[j]) for every column
    (lam1, lam2 already scaled by the step): the exact fused-lasso prox (prox.py).

    ``state`` [p, T] int8 is kept by the caller across the iterations of a solve (zeros at the
    start): ``state[j, :T-1]`` the jump signs of column j's last TV solution (+1 up, -1 down, 0
    none after t), ``state[j, T-1]`` 1 if its last output was non-zero. Per column, cheapest
    first: a column that was zero takes the one-pass zero test (``prox._fused_zero``) and is 0 if
    it passes; else the TV solution from the last jump signs, verified against the optimality
    conditions (``prox._tv1d_warm``); else Condat's algorithm, whose jumps become the next guess.
    ``ycol``, ``xcol`` [T] scratch.
    """
    T, p = Y.shape
    for j in range(p):
        for t in range(T):
            ycol[t] = Y[t, j] - step * G[t, j]
        sj = state[j]
        pen = penalized[j] and lam1 > 0.0
        if pen and sj[T - 1] == 0 and _fz(ycol, lam1, lam2):
            for t in range(T):
                out[t, j] = 0.0
            continue
        if lam2 > 0.0 and T > 1:
            if not _tvw(ycol, lam2, sj, xcol):
                _tv(ycol, lam2, xcol)
                for t in range(T - 1):
                    dx = xcol[t + 1] - xcol[t]
                    sj[t] = 1 if dx > 0.0 else (-1 if dx < 0.0 else 0)
        else:
            for t in range(T):
                xcol[t] = ycol[t]
        nonzero = False
        for t in range(T):
            v = xcol[t]
            if pen:
                v = v - lam1 if v > lam1 else (v + lam1 if v < -lam1 else 0.0)
            out[t, j] = v
            nonzero |= v != 0.0
        sj[T - 1] = 1 if nonzero else 0


@backend.kernel(cache=True, nogil=True)
def _loss_value(X, node, lo, hi, woff, w, theta):
    total = 0.0
    for t in range(theta.shape[0]):
        for d in range(lo[t], hi[t]):
            wd = w[woff[t] + d - lo[t]]
            if wd != 0.0:
                total += wd * _softplus_neg(_signed_margin(X, node, theta, t, d)[0])
    return total


@backend.kernel(cache=True, nogil=True)
def _loglik_rows(X, tix, node, theta, out):
    """out[d] = log P(x_{d,node} | x_{d,-node}; theta^{t_d}) for every row."""
    for d in range(X.shape[0]):
        out[d] = -_softplus_neg(_signed_margin(X, node, theta, tix[d], d)[0])


@backend.kernel(cache=True, nogil=True)
def _certify(X, node, lo, hi, woff, w, lam1, lam2, q, L, penalized, theta, active, violators):
    """One prox-gradient step of the full problem from ``theta`` with step 1/L: returns the
    gradient-mapping norm ``L ||theta - step||_inf`` (the full solver's stopping test) and marks
    in ``violators`` the columns outside ``active`` that the step moves off zero (for a zero
    column this is the KKT condition: the fused-lasso prox of ``-g_j / L`` is 0 iff that of
    ``-g_j`` is, the penalty being positively homogeneous; so it does not depend on L)."""
    T, p = theta.shape
    g = np.empty_like(theta)
    xn = np.empty_like(theta)
    _grad(X, node, lo, hi, woff, w, theta, g, np.empty(p, np.int64), np.empty((2, w.shape[0])))
    if q == 2 and lam2 > 0.0:
        _smooth_grad(theta, lam2, g)
    step = 1.0 / L
    _prox_step(
        theta,
        g,
        step,
        step * lam1,
        step * lam2 if q == 1 else 0.0,
        penalized,
        xn,
        np.zeros((p, T), np.int8),
        np.empty(T),
        np.empty(T),
    )
    gmax = 0.0
    for j in range(p):
        hit = False
        for t in range(T):
            a = abs(theta[t, j] - xn[t, j])
            if a > gmax:
                gmax = a
            if xn[t, j] != 0.0:
                hit = True
        violators[j] = hit and not active[j]
    return gmax * L


@backend.kernel(cache=True, nogil=True)
def _fista(X, node, lo, hi, woff, w, lam1, lam2, q, L, penalized, theta, max_iter, tol, adaptive):
    """Minimise F from ``theta`` (overwritten with the solution). Returns (n_iter, converged,
    n_loss): iterations (one gradient each) and the loss evaluations of the step search.

    ``adaptive=False``: the fixed step 1/L. ``adaptive=True``: the step ``1/L_k`` with ``L_k <= L``
    found by backtracking on the descent lemma ``f(x+) <= f(y) + <g, x+ - y> + L_k/2 |x+ - y|^2``
    (Beck and Teboulle 2009), ``L_k`` shrunk before every iteration (halved until the first
    backtrack, then x0.9, never below 1e-9 L) and doubled on a failed test, never above L (where
    the test holds by the Lipschitz bound and is not evaluated). The global L bounds l'' by 1; near a solution
    most margins are large and the local curvature is often 10-30x smaller, so the steps are too.
    The margins are linear in theta, so those of the extrapolated point ``y = x+ + beta (x+ - x)``
    are combined from the ones the step search computed at x+ and x (one margin pass per
    iteration instead of two).

    Both stop at the first iterate with ``L |y - x+|_inf <= tol`` (raw displacement over the
    global L, whatever the step: a longer step only displaces more) and return x+. A caller
    that needs the full problem's test at the solution takes it afterwards (:func:`_certify`).
    """
    T, p = theta.shape
    x = theta.copy()
    y = theta.copy()
    xn = np.empty_like(theta)
    g = np.empty_like(theta)
    nz = np.empty(p, np.int64)
    scratch = np.empty((5, w.shape[0]))
    u_y, ex, buf, u_n, u_x = scratch[0], scratch[1], scratch[2], scratch[3], scratch[4]
    ta = woff[0] if T > 0 else 0  # the block's terms: [ta, tb)
    tb = woff[T - 1] + hi[T - 1] - lo[T - 1] if T > 0 else 0
    state = np.zeros((p, T), np.int8)
    ycol = np.empty(T)
    xcol = np.empty(T)
    l2p = lam2 if q == 1 else 0.0  # the prox's smoothing weight (q = 2 smooths in the gradient)
    smooth = q == 2 and lam2 > 0.0
    Lk = L
    shrink = 0.5
    tk = 1.0
    converged = False
    n_loss = 0
    it = 0
    for it in range(1, max_iter + 1):
        if it == 1 or not adaptive:
            _margins(X, node, lo, hi, woff, y, nz, u_y)
            if it == 1:
                for e in range(ta, tb):
                    u_x[e] = u_y[e]  # y = x at the start
        _exps(lo, hi, woff, u_y, ex)
        _accumulate(X, node, lo, hi, woff, w, u_y, ex, g)
        if smooth:
            _smooth_grad(y, lam2, g)
        fy = 0.0
        if adaptive:
            fy = _loss_terms(lo, hi, woff, w, u_y, ex, buf)
            if smooth:
                fy += _smooth_value(y, lam2)
            Lk = max(Lk * shrink, 1e-9 * L)  # (a floor against runaway steps on a flat loss)
        while True:
            step = 1.0 / Lk
            _prox_step(y, g, step, step * lam1, step * l2p, penalized, xn, state, ycol, xcol)
            if not adaptive:
                break
            _margins(X, node, lo, hi, woff, xn, nz, u_n)
            if Lk >= L:
                break
            gd, dd = _step_terms(g, xn, y)
            _exps(lo, hi, woff, u_n, ex)
            fx = _loss_terms(lo, hi, woff, w, u_n, ex, buf)
            if smooth:
                fx += _smooth_value(xn, lam2)
            n_loss += 1
            if fx <= fy + gd + 0.5 * Lk * dd + 1e-15 * abs(fy):
                break
            Lk = min(2.0 * Lk, L)
            shrink = 0.9
        # optimality: the displacement |y - x+|, and the restart test <y - x+, x+ - x> > 0
        gmax, ip = _displacement(y, xn, x)
        if gmax * L <= tol:
            for t in range(T):
                for j in range(p):
                    x[t, j] = xn[t, j]
            converged = True
            break
        if ip > 0.0:
            tk = 1.0
            for t in range(T):
                for j in range(p):
                    y[t, j] = xn[t, j]
                    x[t, j] = xn[t, j]
            if adaptive:
                for e in range(ta, tb):
                    u_y[e] = u_n[e]
                    u_x[e] = u_n[e]
        else:
            tn = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * tk * tk))
            beta = (tk - 1.0) / tn
            for t in range(T):
                for j in range(p):
                    y[t, j] = xn[t, j] + beta * (xn[t, j] - x[t, j])
                    x[t, j] = xn[t, j]
            if adaptive:
                for e in range(ta, tb):
                    u_y[e] = u_n[e] + beta * (u_n[e] - u_x[e])
                    u_x[e] = u_n[e]
            tk = tn
    for t in range(T):
        for j in range(p):
            theta[t, j] = x[t, j]
    return it, converged, n_loss


@functools.lru_cache(maxsize=None)
def _kernels():
    """Compile the kernels above (once per process; numba's on-disk cache serves later processes) after
    the ones they call from ``fastexp`` and ``prox``, which are bound to this module's names. Returns
    the FISTA dispatcher."""
    k = _prox._kernels()
    bind = {"_cexp": _fastexp._kernels()["_capped_exp_nb"], "_tv": k.tv1d, "_fz": k.fused_zero, "_tvw": k.tv1d_warm}
    return backend.compile_kernels(sys.modules[__name__], bind=bind)["_fista"]


def penalty(theta, node: int, lam1: float, lam2: float, q: int) -> float:
    """lambda1 sum |theta_{-node}| + lambda2 sum_t ||theta^t - theta^{t-1}||_q^q."""
    mask = np.ones(theta.shape[1], bool)
    mask[node] = False
    l1 = float(np.abs(theta[:, mask]).sum())
    diff = np.diff(theta, axis=0)
    smooth = float(np.abs(diff).sum()) if q == 1 else float((diff * diff).sum())
    return lam1 * l1 + lam2 * smooth


def _weighted_rows(design: Design, sl: slice) -> int:
    """Rows with a non-zero weight, summed over the windows of the time points ``sl`` (the R of the
    FLOP count)."""
    return sum(
        int(np.count_nonzero(design.w[int(design.woff[t]) : int(design.woff[t]) + int(design.hi[t] - design.lo[t])]))
        for t in range(*sl.indices(design.T))
    )


def _solve_block(
    design: Design,
    sl: slice,
    node: int,
    lam1: float,
    lam2: float,
    q: int,
    L: float,
    theta,
    max_iter: int,
    tol: float,
    screen: bool,
):
    """FISTA on the time points ``sl`` of ``theta`` [T', p] (overwritten): the full solver or the screened one.

    Without screening (the reference) every coefficient is updated at every iteration with the fixed
    step ``1/L``. With it, FISTA runs on an active set of columns A (a column's whole path enters or
    leaves at once: the TV term couples it over time; per time point when lambda2 = 0, where ``sl``
    is one time point), on the column subset ``X[:, A]`` with the same kernels, the other columns held
    at exactly 0, and with local steps:

    * steps: ``1 / L_k``, ``L_k <= L`` by backtracking on the descent lemma (``_fista``'s
      ``adaptive``): the global L bounds the loss curvature by its value at margin 0, the local one
      is often 10-30x smaller, and FISTA needs 3-7x fewer iterations.
    * start (the predicted support): the node's field, the columns non-zero in the warm start
      (the previous, larger lambda1 of the path) and the columns that violate the KKT conditions
      there at the new lambda1. The sequential strong rule (Tibshirani et al. 2012: keep
      ``c_j >= 2 lambda1 - lambda1_prev``) keeps every column on a grid that halves lambda1
      (threshold 0), so it is not used.
    * certificate (:func:`_certify`): after a converged solve, one prox-gradient step of the *full*
      problem with the full solver's step 1/L from the solution. Held columns it moves off zero
      violate the KKT conditions: they join A and FISTA re-solves, warm-started. With no violator,
      the solve ends iff the full solver's stopping test holds there (``L |theta - step|_inf <=
      tol``); otherwise FISTA resumes on A with its tolerance scaled down by the miss. So a screened
      solve returns a point that passes the full solver's test on every column; the tests compare
      the two solvers' optima (objective within 1e-9 relative, the same zeros).

    ``max_iter`` bounds the FISTA iterations of all solves together. Returns ``(n_iter, converged,
    flops, n_solves)`` with ``flops = 4 R k`` per iteration (a margin and a gradient accumulation,
    one multiply-add each per weighted row and active column; R rows, k columns), ``2 R k`` per
    loss evaluation of the step search (the margins) and ``4 R p`` per certificate.
    """
    fista = _kernels()
    X, p = design.X, theta.shape[1]
    lo, hi, woff = design.lo[sl], design.hi[sl], design.woff[sl]
    R = _weighted_rows(design, sl)
    penalized = np.ones(p, np.bool_)
    penalized[node] = False
    if not screen:
        n_iter, conv, _ = fista(
            X, node, lo, hi, woff, design.w, lam1, lam2, q, L, penalized, theta, max_iter, tol, False
        )
        return n_iter, conv, 4 * R * p * n_iter, 1
    active = ~penalized | np.any(theta != 0.0, axis=0)  # [p]
    violators = np.zeros(p, np.bool_)
    gap = _certify(X, node, lo, hi, woff, design.w, lam1, lam2, q, L, penalized, theta, active, violators)
    flops = 4 * R * p
    n_iter, n_solves, conv = 0, 0, gap <= tol and not violators.any()
    tol_a = tol
    while not conv:
        active |= violators
        A = np.flatnonzero(active)  # [k] active columns, increasing (the node among them)
        XA = np.ascontiguousarray(X[:, A])  # int8 [N, k]
        th = np.ascontiguousarray(theta[:, A])  # [T', k]
        k, conv, n_loss = fista(
            XA,
            int(np.searchsorted(A, node)),
            lo,
            hi,
            woff,
            design.w,
            lam1,
            lam2,
            q,
            L,
            penalized[A],
            th,
            max_iter - n_iter,
            tol_a,
            True,
        )
        theta[:, A] = th
        n_iter, n_solves, flops = n_iter + k, n_solves + 1, flops + 4 * R * A.size * k + 2 * R * A.size * n_loss
        if not conv:
            break
        gap = _certify(X, node, lo, hi, woff, design.w, lam1, lam2, q, L, penalized, theta, active, violators)
        flops += 4 * R * p
        conv = gap <= tol and not violators.any()
        if not violators.any() and gap > tol:
            tol_a *= 0.5 * tol / gap  # converged on A at its tolerance but short of the full test
    return n_iter, conv, flops, n_solves


def solve_path(
    design: Design,
    node: int,
    lam1: float,
    lam2: float = 0.0,
    q: int = 1,
    theta0=None,
    max_iter: int = 5000,
    tol: float = 1e-6,
    screen: bool = True,
    algorithm: str = "auto",
    ssnal_opts: _ssnal.Options | None = None,
) -> PathResult:
    """Solve node ``node``'s whole path over time for one (lambda1, lambda2) (one task of the TESLA
    workload).

    ``theta0`` ([T, p], optional) warm-starts the solver (e.g. the solution at the previous,
    larger lambda1 of a path). ``tol`` bounds the gradient-mapping norm ``L ||y - prox(y)||_inf``.
    ``screen`` runs FISTA on active sets of columns predicted from the warm start, with a KKT check
    on the rest and re-solves (:func:`_solve_block`); ``screen=False`` is the full
    solver, which updates every coefficient at every iteration. Both stop on the same test and
    reach the same optimum; ``PathResult.flops`` counts the mat-vec work of either.

    ``algorithm``: ``"fista"``; ``"ssnal"``, the semismooth Newton augmented Lagrangian solver
    (:mod:`pgmflow.tasks.tesla.ssnal`) for the fused penalty at one sample per time point (a ``ValueError``
    elsewhere), certified by the same test at ``tol / 10`` and continued by FISTA where it is not certified
    within its outer steps; ``"auto"``, SSNAL where it applies and FISTA elsewhere. ``ssnal_opts``: SSNAL's
    constants (:class:`pgmflow.tasks.tesla.ssnal.Options`; its defaults if None).
    """
    if q not in (1, 2):
        raise ValueError(f"q must be 1 or 2, got {q}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    if lam1 < 0 or lam2 < 0:
        raise ValueError(f"lambdas must be >= 0, got lambda1={lam1}, lambda2={lam2}")
    T, p = design.T, design.p
    if not 0 <= node < p:
        raise ValueError(f"node {node} out of range for p={p}")
    _kernels()
    design = node_design(design, int(node))
    theta = np.zeros((T, p)) if theta0 is None else np.array(theta0, dtype=np.float64, order="C", copy=True)
    if theta.shape != (T, p):
        raise ValueError(f"theta0 must be [{T}, {p}], got {theta.shape}")
    opts = (int(max_iter), float(tol), bool(screen))
    n_iter, converged, flops, n_solves, n_newton = 0, True, 0, 0, 0
    if lam2 == 0.0:
        # no coupling across time: T independent problems, each with its own step 1/L_t and its own
        # stopping test (the slowest time point no longer sets the pace of the others)
        for t in range(T):
            if design.L[t] <= 0.0:  # no data at t: the penalty alone is minimised by zero
                theta[t] = 0.0
                continue
            lo_t, hi_t = int(design.lo[t]), int(design.hi[t])
            wt = design.w[int(design.woff[t]) : int(design.woff[t]) + hi_t - lo_t]
            y_t = design.X[lo_t:hi_t, node][wt > 0]
            if np.all(y_t == y_t[0]):
                # the node takes one value in every weighted sample (always so with one sample per
                # time point): the loss falls towards 0 as the field grows, so the infimum has no edges
                # and an infinite field; report the field capped at +-FIELD_CAP
                theta[t] = 0.0
                theta[t, node] = FIELD_CAP * float(y_t[0])
                continue
            th_t = theta[t : t + 1].copy()
            k, c, f, s = _solve_block(
                design, slice(t, t + 1), int(node), float(lam1), 0.0, int(q), float(design.L[t]), th_t, *opts
            )
            theta[t] = th_t[0]
            n_iter, converged, flops, n_solves = n_iter + k, converged and c, flops + f, n_solves + s
    else:
        L = float(design.L.max()) if T else 0.0
        if q == 2:
            L += 8.0 * lam2
        if L <= 0.0:  # no data anywhere: the penalties alone are minimised by zero
            return PathResult(np.zeros((T, p)), 0, True, 0.0, 0.0, 0, 0)
        use_ssnal = algorithm != "fista" and _ssnal.applicable(design, q, lam2)
        if algorithm == "ssnal" and not use_ssnal:
            raise ValueError("algorithm 'ssnal' needs q = 1, lambda2 > 0 and at most one sample per time point")
        if use_ssnal:
            s = _ssnal.solve(design, int(node), float(lam1), float(lam2), theta, 0.1 * float(tol), _certify, ssnal_opts)
            n_newton, flops = s.n_newton, s.flops
        if not use_ssnal or not s.converged:  # FISTA alone, or on from SSNAL's last iterate
            n_iter, converged, f, n_solves = _solve_block(
                design, slice(0, T), int(node), float(lam1), float(lam2), int(q), L, theta, *opts
            )
            flops += f
    loss = float(_loss_value(design.X, int(node), design.lo, design.hi, design.woff, design.w, theta))
    objective = loss + penalty(theta, node, lam1, lam2, q)
    return PathResult(theta, int(n_iter), bool(converged), loss, objective, int(flops), int(n_solves), int(n_newton))


def objective(design: Design, node: int, theta, lam1: float, lam2: float = 0.0, q: int = 1) -> float:
    """F(theta) of node ``node``'s path problem: the weighted data term plus the penalties."""
    _kernels()
    theta = np.ascontiguousarray(theta, dtype=np.float64)
    loss = float(_loss_value(design.X, int(node), design.lo, design.hi, design.woff, design.w, theta))
    return loss + penalty(theta, node, lam1, lam2, q)


def row_loglik(X, tix, node: int, theta) -> np.ndarray:
    """log P(x_{d,node} | x_{d,-node}; theta^{t_d}) for every row d (float64 [N]; 0 where x_{d,node} is
    missing, coded 0)."""
    _kernels()
    X = np.ascontiguousarray(X, dtype=np.int8)
    tix = np.ascontiguousarray(tix, dtype=np.int64)
    out = np.empty(X.shape[0])
    _loglik_rows(X, tix, int(node), np.ascontiguousarray(theta, dtype=np.float64), out)
    out[X[:, node] == 0] = 0.0  # a missing value has no likelihood
    return out


# --- batched gradient: NumPy or CuPy, one signature ----------------------------------------------------


def path_gradient(Theta, X, tix, nodes, w, T: int):
    """The TESLA data-term gradient for many nodes at once, on NumPy or CuPy arrays alike.

    Theta: [B, T, p] parameters of the nodes ``nodes`` (int [B]); X: [N, p] samples (+-1, any
    numeric dtype) with time index ``tix`` [N]; w: [N] row weights (``1/N^t`` for TESLA, 0 drops a
    row). Returns ``(grad [B, T, p], loss [B])`` in the array module of ``Theta``: the same numbers
    as :func:`solve_path`'s gradient for ``Design.kind == "tesla"`` up to summation order.
    """
    xp = backend.array_module(Theta)
    B = Theta.shape[0]
    Xf = X.astype(Theta.dtype)  # [N, p]
    rows = xp.arange(B)
    Z = xp.broadcast_to(Xf, (B,) + Xf.shape).copy()  # [B, N, p]
    Z[rows, :, nodes] = 1.0  # the node's own column is its intercept
    y = Xf[:, nodes].T  # [B, N]
    m = xp.einsum("bnp,bnp->bn", Z, Theta[:, tix, :])  # [B, N]
    u = 2.0 * y * m
    loss_rows = xp.logaddexp(0.0, -u) * w[None, :]  # [B, N]
    c = (-2.0 * w)[None, :] * y / (1.0 + xp.exp(u))  # [B, N]
    contrib = Z * c[:, :, None]  # [B, N, p]
    grad = xp.zeros(Theta.shape, dtype=Theta.dtype)
    if xp is np:
        np.add.at(grad, (slice(None), tix), contrib)
    else:  # pragma: no cover - needs a GPU
        backend.cupyx().scatter_add(grad, (slice(None), tix), contrib)
    return grad, loss_rows.sum(axis=1)

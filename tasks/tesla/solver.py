"""One node's temporally smoothed L1 logistic regression path: TESLA, KELLER and the static baseline.

Node ``i`` of a binary (+-1) network is regressed on the other nodes at every time point
(seed 002, eqs. 11-13). With ``z_d`` the sample ``x_d`` with its own entry replaced by 1 (so that
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
Candes 2015) and the fixed step ``1/L``, ``L = max_t lambda_max(sum_d w_{t,d} a_d a_d^T)`` over
``a_d = [1, x_d]`` (the node's design is a column subset of it, so one bound serves every node;
``l'' <= 1``). For ``q = 1`` the proximal step of L1 plus fused differences is exact: 1-D total
variation denoising of each coefficient path followed by soft-thresholding (``pgmflow.tasks.tesla.prox``).
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
from typing import NamedTuple

import numpy as np

from pgmflow.tasks import backend
from pgmflow.tasks.tesla import prox as _prox


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
        wt = w[int(woff[t]): int(woff[t]) + int(hi[t] - lo[t])]
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
        dt = (tix[lo[t]:hi[t]] - t).astype(np.float64)
        k = np.exp(-0.5 * (dt / bandwidth) ** 2) * keep[lo[t]:hi[t]]
        s = k.sum()
        chunks.append(k / s if s > 0 else k)
        woff[t] = off
        off += int(hi[t] - lo[t])
    w = np.concatenate(chunks) if chunks else np.zeros(0)
    return Design(X, tix, lo, hi, woff, w, _lipschitz(X, lo, hi, woff, w), "keller")


# --- numba kernels ----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _kernels():
    # Callees bound to module globals (numba's disk cache hashes closure cells; see tasks/lda/estep.py).
    global _signed_margin, _softplus_neg, _grad_loss, _fista, _loglik_rows, _loss_value, _pfl, _tv, _kkt_stat
    nb = backend.numba()
    _pfl = _prox._kernels().prox_fused_lasso
    _tv = _prox._kernels().tv1d

    @nb.njit(cache=True, nogil=True)
    def _signed_margin(X, node, theta, t, d):
        """``(u, y)`` for sample d at time t: ``u = 2 y theta^t . z_d`` with ``z_d`` = x_d whose own
        entry is 1 (the field), ``y = x_{d,node}``; the sample's loss is ``log(1 + exp(-u))``."""
        m = 0.0
        for j in range(theta.shape[1]):
            m += theta[t, j] * X[d, j]
        yd = float(X[d, node])
        m += theta[t, node] * (1.0 - yd)  # z_d[node] = 1, not x_d[node]
        return 2.0 * yd * m, yd

    @nb.njit(cache=True, nogil=True)
    def _softplus_neg(u):
        """log(1 + exp(-u)) without overflow."""
        if u > 0:
            return math.log1p(math.exp(-u))
        return -u + math.log1p(math.exp(u))

    @nb.njit(cache=True, nogil=True)
    def _grad_loss(X, node, lo, hi, woff, w, theta, grad):
        """grad[t] = sum_d w l'(y m) y z_d at theta; returns the weighted loss.

        The margins sum only the non-zero entries of theta^t (listed once per time point), in
        column order: the same numbers as the full sum (adding a zero product leaves a sum as it is).
        """
        T, p = theta.shape
        total = 0.0
        nz = np.empty(p, np.int64)
        for t in range(T):
            nnz = 0
            for j in range(p):
                grad[t, j] = 0.0
                if theta[t, j] != 0.0:
                    nz[nnz] = j
                    nnz += 1
            for d in range(lo[t], hi[t]):
                wd = w[woff[t] + d - lo[t]]
                if wd == 0.0:
                    continue
                m = 0.0
                for k in range(nnz):
                    m += theta[t, nz[k]] * X[d, nz[k]]
                yd = float(X[d, node])
                m += theta[t, node] * (1.0 - yd)  # z_d[node] = 1, not x_d[node]
                u = 2.0 * yd * m
                # l(m y) = log(1 + exp(-u)); its derivative in m is -2 y sigmoid(-u)
                if u > 0:
                    e = math.exp(-u)
                    total += wd * math.log1p(e)
                    c = -2.0 * wd * yd * e / (1.0 + e)
                else:
                    e = math.exp(u)
                    total += wd * (-u + math.log1p(e))
                    c = -2.0 * wd * yd / (1.0 + e)
                for j in range(p):
                    grad[t, j] += c * X[d, j]
                grad[t, node] += c * (1.0 - yd)
        return total

    @nb.njit(cache=True, nogil=True)
    def _loss_value(X, node, lo, hi, woff, w, theta):
        total = 0.0
        for t in range(theta.shape[0]):
            for d in range(lo[t], hi[t]):
                wd = w[woff[t] + d - lo[t]]
                if wd != 0.0:
                    total += wd * _softplus_neg(_signed_margin(X, node, theta, t, d)[0])
        return total

    @nb.njit(cache=True, nogil=True)
    def _loglik_rows(X, tix, node, theta, out):
        """out[d] = log P(x_{d,node} | x_{d,-node}; theta^{t_d}) for every row."""
        for d in range(X.shape[0]):
            out[d] = -_softplus_neg(_signed_margin(X, node, theta, tix[d], d)[0])

    @nb.njit(cache=True, nogil=True)
    def _kkt_stat(g, lam2, q, c):
        """c[j] = max_t |tv(-g[:, j], lam2)_t| for q = 1 (else max_t |g[t, j]|) for g [T, p].

        A zero column j is optimal (the others fixed) iff ``c[j] <= lambda1``: 0 is the prox of the
        positively homogeneous fused-lasso penalty at ``-g_j`` iff the soft-thresholding at lambda1
        of ``tv(-g_j, lambda2)`` is zero (prox.py); then the full solver's prox-gradient step leaves
        the column at zero. With q = 2 the smoothing has zero gradient at a zero column.
        """
        T, p = g.shape
        v = np.empty(T)
        r = np.empty(T)
        for j in range(p):
            m = 0.0
            if q == 1 and lam2 > 0.0:
                for t in range(T):
                    v[t] = -g[t, j]
                _tv(v, lam2, r)
                for t in range(T):
                    if abs(r[t]) > m:
                        m = abs(r[t])
            else:
                for t in range(T):
                    if abs(g[t, j]) > m:
                        m = abs(g[t, j])
            c[j] = m

    @nb.njit(cache=True, nogil=True)
    def _fista(X, node, lo, hi, woff, w, lam1, lam2, q, L, penalized, theta, max_iter, tol):
        """Minimise F from ``theta`` (overwritten with the solution). Returns (n_iter, converged)."""
        T, p = theta.shape
        step = 1.0 / L
        x = theta.copy()
        y = theta.copy()
        xn = np.empty_like(theta)
        z = np.empty_like(theta)
        g = np.empty_like(theta)
        tk = 1.0
        converged = False
        it = 0
        for it in range(1, max_iter + 1):
            _grad_loss(X, node, lo, hi, woff, w, y, g)
            if q == 2 and lam2 > 0.0:
                for t in range(T):
                    for j in range(p):
                        s = 0.0
                        if t > 0:
                            s += y[t, j] - y[t - 1, j]
                        if t < T - 1:
                            s -= y[t + 1, j] - y[t, j]
                        g[t, j] += 2.0 * lam2 * s
            for t in range(T):
                for j in range(p):
                    z[t, j] = y[t, j] - step * g[t, j]
            if q == 1:
                _pfl(z, step * lam1, step * lam2, penalized, xn)
            else:
                _pfl(z, step * lam1, 0.0, penalized, xn)
            # optimality: the gradient mapping L (y - xn), and the restart test <y - xn, xn - x> > 0
            gmax = 0.0
            ip = 0.0
            for t in range(T):
                for j in range(p):
                    a = y[t, j] - xn[t, j]
                    if abs(a) > gmax:
                        gmax = abs(a)
                    ip += a * (xn[t, j] - x[t, j])
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
            else:
                tn = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * tk * tk))
                beta = (tk - 1.0) / tn
                for t in range(T):
                    for j in range(p):
                        y[t, j] = xn[t, j] + beta * (xn[t, j] - x[t, j])
                        x[t, j] = xn[t, j]
                tk = tn
        for t in range(T):
            for j in range(p):
                theta[t, j] = x[t, j]
        return it, converged

    return _fista


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
    return sum(int(np.count_nonzero(design.w[int(design.woff[t]): int(design.woff[t]) + int(design.hi[t] - design.lo[t])]))
               for t in range(*sl.indices(design.T)))


def _solve_block(design: Design, sl: slice, node: int, lam1: float, lam2: float, q: int, L: float, theta,
                 max_iter: int, tol: float, screen: bool):
    """FISTA on the time points ``sl`` of ``theta`` [T', p] (overwritten), with or without screening.

    Without screening every coefficient is updated at every iteration (the full solver). With it,
    FISTA runs on an active set of columns A (a column's whole path enters or leaves at once: the
    TV term couples it over time; per time point when lambda2 = 0, where ``sl`` is one time point),
    on the column subset ``X[:, A]`` with the same kernel, the other columns held at exactly 0:

    * start (the predicted support): the node's field, the columns non-zero in the warm start
      (the previous, larger lambda1 of the path) and the columns that violate the KKT conditions
      there at the new lambda1 (``c_j > lambda1``, :func:`_kkt_stat`). The sequential strong rule
      (Tibshirani et al. 2012: keep ``c_j >= 2 lambda1 - lambda1_prev``) keeps every column on a
      grid that halves lambda1 (threshold 0), so it is not used.
    * KKT check: after a converged solve, a held column j violates iff ``c_j > lambda1`` at the
      solution, i.e. iff the full solver's prox-gradient step would move it off zero; violators
      join A and FISTA re-solves, warm-started, until there is none. Then the full solver's
      stopping test holds at the solution (the held columns' gradient mapping is 0).

    ``max_iter`` bounds the FISTA iterations of all solves together. Returns ``(n_iter, converged,
    flops, n_solves)`` with ``flops = 4 R k`` per iteration (a margin and a gradient accumulation,
    one multiply-add each per weighted row and active column; R rows, k columns) and ``4 R p`` per
    KKT check.
    """
    fista = _kernels()
    X, T, p = design.X, theta.shape[0], theta.shape[1]
    lo, hi, woff = design.lo[sl], design.hi[sl], design.woff[sl]
    R = _weighted_rows(design, sl)
    penalized = np.ones(p, np.bool_)
    penalized[node] = False
    if not screen:
        n_iter, conv = fista(X, node, lo, hi, woff, design.w, lam1, lam2, q, L, penalized, theta, max_iter, tol)
        return n_iter, conv, 4 * R * p * n_iter, 1
    g = np.empty((T, p))
    c = np.empty(p)

    def violations():
        _grad_loss(X, node, lo, hi, woff, design.w, theta, g)
        _kkt_stat(g, lam2, q, c)
        return c > lam1

    active = ~penalized | np.any(theta != 0.0, axis=0) | violations()  # [p]
    flops = 4 * R * p
    n_iter, n_solves, conv = 0, 0, False
    while True:
        A = np.flatnonzero(active)  # [k] active columns, increasing (the node among them)
        XA = np.ascontiguousarray(X[:, A])  # int8 [N, k]
        th = np.ascontiguousarray(theta[:, A])  # [T', k]
        k, conv = fista(XA, int(np.searchsorted(A, node)), lo, hi, woff, design.w, lam1, lam2, q, L,
                        penalized[A], th, max_iter - n_iter, tol)
        theta[:, A] = th
        n_iter, n_solves, flops = n_iter + k, n_solves + 1, flops + 4 * R * A.size * k
        if not conv:
            break
        violators = ~active & violations()
        flops += 4 * R * p
        if not violators.any():
            break
        active |= violators
    return n_iter, conv, flops, n_solves


def solve_path(design: Design, node: int, lam1: float, lam2: float = 0.0, q: int = 1, theta0=None,
               max_iter: int = 5000, tol: float = 1e-6, screen: bool = True) -> PathResult:
    """Solve node ``node``'s whole path over time for one (lambda1, lambda2) (DESIGN.md's TESLA contract).

    ``theta0`` ([T, p], optional) warm-starts the solver (e.g. the solution at the previous,
    larger lambda1 of a path). ``tol`` bounds the gradient-mapping norm ``L ||y - prox(y)||_inf``.
    ``screen`` runs FISTA on active sets of columns predicted from the warm start, with a KKT check
    on the rest and re-solves (:func:`_solve_block`); ``screen=False`` is the full
    solver, which updates every coefficient at every iteration. Both stop on the same test and
    reach the same optimum; ``PathResult.flops`` counts the mat-vec work of either.
    """
    if q not in (1, 2):
        raise ValueError(f"q must be 1 or 2, got {q}")
    if lam1 < 0 or lam2 < 0:
        raise ValueError(f"lambdas must be >= 0, got lambda1={lam1}, lambda2={lam2}")
    T, p = design.T, design.p
    if not 0 <= node < p:
        raise ValueError(f"node {node} out of range for p={p}")
    _kernels()
    theta = np.zeros((T, p)) if theta0 is None else np.array(theta0, dtype=np.float64, order="C", copy=True)
    if theta.shape != (T, p):
        raise ValueError(f"theta0 must be [{T}, {p}], got {theta.shape}")
    opts = (int(max_iter), float(tol), bool(screen))
    n_iter, converged, flops, n_solves = 0, True, 0, 0
    if lam2 == 0.0:
        # no coupling across time: T independent problems, each with its own step 1/L_t and its own
        # stopping test (the slowest time point no longer sets the pace of the others)
        for t in range(T):
            if design.L[t] <= 0.0:  # no data at t: the penalty alone is minimised by zero
                theta[t] = 0.0
                continue
            lo_t, hi_t = int(design.lo[t]), int(design.hi[t])
            wt = design.w[int(design.woff[t]): int(design.woff[t]) + hi_t - lo_t]
            y_t = design.X[lo_t:hi_t, node][wt > 0]
            if np.all(y_t == y_t[0]):
                # the node takes one value in every weighted sample (always so with one sample per
                # time point): the loss falls towards 0 as the field grows, so the infimum has no edges
                # and an infinite field; report the field capped at +-FIELD_CAP
                theta[t] = 0.0
                theta[t, node] = FIELD_CAP * float(y_t[0])
                continue
            th_t = theta[t:t + 1].copy()
            k, c, f, s = _solve_block(design, slice(t, t + 1), int(node), float(lam1), 0.0, int(q),
                                      float(design.L[t]), th_t, *opts)
            theta[t] = th_t[0]
            n_iter, converged, flops, n_solves = n_iter + k, converged and c, flops + f, n_solves + s
    else:
        L = float(design.L.max()) if T else 0.0
        if q == 2:
            L += 8.0 * lam2
        if L <= 0.0:  # no data anywhere: the penalties alone are minimised by zero
            return PathResult(np.zeros((T, p)), 0, True, 0.0, 0.0, 0, 0)
        n_iter, converged, flops, n_solves = _solve_block(design, slice(0, T), int(node), float(lam1), float(lam2),
                                                          int(q), L, theta, *opts)
    loss = float(_loss_value(design.X, int(node), design.lo, design.hi, design.woff, design.w, theta))
    return PathResult(theta, int(n_iter), bool(converged), loss, loss + penalty(theta, node, lam1, lam2, q),
                      int(flops), int(n_solves))


def objective(design: Design, node: int, theta, lam1: float, lam2: float = 0.0, q: int = 1) -> float:
    """F(theta) of node ``node``'s path problem: the weighted data term plus the penalties."""
    _kernels()
    theta = np.ascontiguousarray(theta, dtype=np.float64)
    loss = float(_loss_value(design.X, int(node), design.lo, design.hi, design.woff, design.w, theta))
    return loss + penalty(theta, node, lam1, lam2, q)


def row_loglik(X, tix, node: int, theta) -> np.ndarray:
    """log P(x_{d,node} | x_{d,-node}; theta^{t_d}) for every row d (float64 [N])."""
    _kernels()
    X = np.ascontiguousarray(X, dtype=np.int8)
    tix = np.ascontiguousarray(tix, dtype=np.int64)
    out = np.empty(X.shape[0])
    _loglik_rows(X, tix, int(node), np.ascontiguousarray(theta, dtype=np.float64), out)
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

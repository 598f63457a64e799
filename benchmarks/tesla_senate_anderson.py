"""Issue 36: safeguarded Anderson acceleration (AA) of TESLA's proximal-gradient / FISTA solver, prototyped on the
109th Senate (T=645, p=100, one sample per time point) against the pipeline's solver (``solver.solve_path``).

    .venv/bin/python benchmarks/tesla_senate_anderson.py --nodes 0 44 99                 # AA-FISTA, K=5
    .venv/bin/python benchmarks/tesla_senate_anderson.py --nodes 0 44 99 --base pg       # AA-PG (Bertrand-Massias)
    .venv/bin/python benchmarks/tesla_senate_anderson.py --nodes 44 --base pg --memory 0 # plain PG, no AA

The method (Bertrand and Massias 2021, "Anderson acceleration of coordinate descent", offline type-II AA with the
objective as safeguard; the Gram matrix regularised as in Scieur, d'Aspremont and Bach 2016). The base iteration
is the pipeline's own (``solver._fista``'s kernels, bound read-only): a proximal-gradient step with the exact
fused-lasso prox (``solver._prox_step``) and the backtracked local step ``1/L_k <= 1/L``, either plain (``--base
pg``: x+ = T(x), the fixed-point map AA is built for) or FISTA with adaptive restart (``--base fista``). Every K
iterations the last K+1 iterates x_0..x_K give the differences U = [x_1 - x_0, ..., x_K - x_{K-1}]; with
``z = (U'U + reg tr(U'U)/K I)^{-1} 1`` and ``c = z / sum z`` the extrapolated point is ``x_e = sum_i c_i x_{i+1}``.
It replaces the current iterate (FISTA's momentum restarted) only if ``F(x_e) < F(x_K)``; otherwise the base
iteration continues untouched. ``--gate`` attempts the extrapolation only when the zero/jump pattern of the
iterates did not change over the window (AA on the iterates once the support has settled).

The solve is screened exactly as the pipeline's (``solver._solve_block``: active columns from the warm start and
the KKT certificate ``solver._certify``, re-solves with the added violators or a tighter inner tolerance), and it
stops on the same test: ``L |y - x+|_inf <= tol`` inside, then the full problem's gradient-mapping norm at the
global step 1/L (``_certify``) <= tol (1e-6). Both solvers are compared on objectives (relative difference,
sign), on the BIC-chosen grid point of each node (BIC as ``benchmarks/tesla_senate_newton.py``) and on the
neighbour sets there, not on coefficients (the optimum is flat: docs/tesla.md, issue 36).

CPU seconds are ``time.process_time`` of each solve, both solvers in one process, alternating per grid point,
each lambda1 path warm-started downwards from its own previous solution (as ``path_tasks.fit_node``).
``--memory 0`` reproduces ``solve_path`` bit for bit (the base iteration is FISTA's adaptive branch).

Measured (``benchmarks/results/tesla-senate109-cpu-2core-epyc-issue36-anderson.md``, nodes 0, 44, 99, 25 grid
points): AA does not cut the iterations. AA-FISTA takes 0.90-0.94x FISTA's iterations (i.e. more) and 0.59-0.68x
its speed in CPU time; restarting the momentum on a kept extrapolation, 0.26x; AA on plain proximal gradient
(offline or online) needs as many iterations as PG without it, ~5.9x FISTA's. Objectives within 8e-12 relative
where certified, the same BIC choices and neighbour sets there. ``--pattern A B`` shows why: FISTA's zero/jump
pattern settles only after 87-97 % of a slow solve's iterations, so AA has almost no smooth phase to accelerate.
Not adopted.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import math
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from pgmflow.tasks import backend  # noqa: E402
from pgmflow.tasks.tesla import solver  # noqa: E402

LAM1 = (0.32, 0.16, 0.08, 0.04, 0.02)
LAM2 = (2.0, 1.0, 0.5, 0.25, 0.125)

# the pipeline's kernels, bound to their compiled dispatchers by _kernels() (read-only reuse)
_margins = solver._margins
_exps = solver._exps
_accumulate = solver._accumulate
_loss_terms = solver._loss_terms
_prox_step = solver._prox_step
_step_terms = solver._step_terms
_displacement = solver._displacement


@backend.kernel(cache=True, nogil=True)
def _penalty(theta, lam1, lam2, penalized):
    """lambda1 sum |theta_{-node}| + lambda2 sum_t |theta^t - theta^{t-1}| (q = 1)."""
    T, p = theta.shape
    s1 = 0.0
    s2 = 0.0
    for t in range(T):
        for j in range(p):
            if penalized[j]:
                s1 += abs(theta[t, j])
            if t > 0:
                s2 += abs(theta[t, j] - theta[t - 1, j])
    return lam1 * s1 + lam2 * s2


@backend.kernel(cache=True, nogil=True)
def _pattern_changed(a, b):
    """Whether the zero pattern or the jump pattern (theta^t != theta^{t-1}) of a and b differ."""
    T, p = a.shape
    for t in range(T):
        for j in range(p):
            if (a[t, j] == 0.0) != (b[t, j] == 0.0):
                return True
            if t > 0 and (a[t, j] != a[t - 1, j]) != (b[t, j] != b[t - 1, j]):
                return True
    return False


@backend.kernel(cache=True, nogil=True)
def _extrapolate(hist, K, reg, xe, C, z, dk):
    """x_e = sum_i c_i hist[i+1], c = z / sum z, (U'U + reg tr/K I) z = 1, U_i = hist[i+1] - hist[i].

    One pass over the history for the Gram matrix, a Cholesky solve of the K x K system. Returns False (x_e
    not written) when the system is singular or the weights are not finite."""
    _, T, p = hist.shape
    for a in range(K):
        for b in range(K):
            C[a, b] = 0.0
    for t in range(T):
        for j in range(p):
            for i in range(K):
                dk[i] = hist[i + 1, t, j] - hist[i, t, j]
            for a in range(K):
                da = dk[a]
                for b in range(a, K):
                    C[a, b] += da * dk[b]
    tr = 0.0
    for a in range(K):
        tr += C[a, a]
    if not tr > 0.0:
        return False
    for a in range(K):
        C[a, a] += reg * tr / K
        for b in range(a):
            C[a, b] = C[b, a]
    # Cholesky C = R'R in place (upper triangle), then R'R z = 1
    for a in range(K):
        s = C[a, a]
        for k in range(a):
            s -= C[k, a] * C[k, a]
        if not s > 0.0:
            return False
        r = math.sqrt(s)
        C[a, a] = r
        for b in range(a + 1, K):
            s = C[a, b]
            for k in range(a):
                s -= C[k, a] * C[k, b]
            C[a, b] = s / r
    for a in range(K):
        s = 1.0
        for k in range(a):
            s -= C[k, a] * z[k]
        z[a] = s / C[a, a]
    for a in range(K - 1, -1, -1):
        s = z[a]
        for k in range(a + 1, K):
            s -= C[a, k] * z[k]
        z[a] = s / C[a, a]
    tot = 0.0
    for a in range(K):
        tot += z[a]
    if not (tot != 0.0 and math.isfinite(tot)):
        return False
    for a in range(K):
        z[a] /= tot
    for t in range(T):
        for j in range(p):
            v = 0.0
            for i in range(K):
                v += z[i] * hist[i + 1, t, j]
            xe[t, j] = v
    return True


@backend.kernel(cache=True, nogil=True)
def _aa_solve(
    X, node, lo, hi, woff, w, lam1, lam2, L, penalized, theta, max_iter, tol, accel, K, reg, gate, restart, stats
):
    """Minimise F (q = 1) from ``theta`` (overwritten) by backtracked proximal gradient (``accel`` False) or FISTA
    with adaptive restart (``accel`` True), with a safeguarded Anderson extrapolation every K iterations (K = 0:
    none). The base iteration and its stopping test are ``solver._fista``'s (adaptive branch). ``stats`` [4] int64
    += (AA attempts, AA accepted, attempts skipped by the pattern gate, loss evaluations of the step search).
    Returns (n_iter, converged)."""
    T, p = theta.shape
    x = theta.copy()
    y = theta.copy()
    xn = np.empty_like(theta)
    g = np.empty_like(theta)
    xe = np.empty_like(theta)
    Km = max(K, 1)
    hist = np.empty((Km + 1, T, p))
    C = np.empty((Km, Km))
    z = np.empty(Km)
    dk = np.empty(Km)
    nz = np.empty(p, np.int64)
    scratch = np.empty((6, w.shape[0]))
    u_y, ex, buf, u_n, u_x, u_e = scratch[0], scratch[1], scratch[2], scratch[3], scratch[4], scratch[5]
    ta = woff[0] if T > 0 else 0
    tb = woff[T - 1] + hi[T - 1] - lo[T - 1] if T > 0 else 0
    state = np.zeros((p, T), np.int8)
    ycol = np.empty(T)
    xcol = np.empty(T)
    Lk = L
    shrink = 0.5
    tk = 1.0
    converged = False
    _margins(X, node, lo, hi, woff, y, nz, u_y)
    for e in range(ta, tb):
        u_x[e] = u_y[e]
    hist[0, :, :] = x
    nh = 1
    changed = False
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007 (the count is returned)
        _exps(lo, hi, woff, u_y, ex)
        _accumulate(X, node, lo, hi, woff, w, u_y, ex, g)
        fy = _loss_terms(lo, hi, woff, w, u_y, ex, buf)
        Lk = max(Lk * shrink, 1e-9 * L)
        while True:
            step = 1.0 / Lk
            _prox_step(y, g, step, step * lam1, step * lam2, penalized, xn, state, ycol, xcol)
            _margins(X, node, lo, hi, woff, xn, nz, u_n)
            if Lk >= L:
                break
            gd, dd = _step_terms(g, xn, y)
            _exps(lo, hi, woff, u_n, ex)
            fx = _loss_terms(lo, hi, woff, w, u_n, ex, buf)
            stats[3] += 1
            if fx <= fy + gd + 0.5 * Lk * dd + 1e-15 * abs(fy):
                break
            Lk = min(2.0 * Lk, L)
            shrink = 0.9
        gmax, ip = _displacement(y, xn, x)
        if gmax * L <= tol:
            x[:, :] = xn
            converged = True
            break
        if K > 0:
            if gate and not changed:
                changed = _pattern_changed(xn, hist[nh - 1])
            hist[nh, :, :] = xn
            nh += 1
            if nh == K + 1:
                if gate and changed:
                    stats[2] += 1
                else:
                    stats[0] += 1
                    if _extrapolate(hist, K, reg, xe, C, z, dk):
                        _margins(X, node, lo, hi, woff, xe, nz, u_e)
                        _exps(lo, hi, woff, u_e, ex)
                        fe = _loss_terms(lo, hi, woff, w, u_e, ex, buf) + _penalty(xe, lam1, lam2, penalized)
                        _exps(lo, hi, woff, u_n, ex)
                        fn = _loss_terms(lo, hi, woff, w, u_n, ex, buf) + _penalty(xn, lam1, lam2, penalized)
                        if fe < fn:  # x_e takes the place of x+ in the base iteration
                            stats[1] += 1
                            xn[:, :] = xe
                            for e in range(ta, tb):
                                u_n[e] = u_e[e]
                            if restart:
                                ip = 1.0
                hist[0, :, :] = xn
                nh = 1
                changed = False
        if not accel or ip > 0.0:
            tk = 1.0
            y[:, :] = xn
            x[:, :] = xn
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
            for e in range(ta, tb):
                u_y[e] = u_n[e] + beta * (u_n[e] - u_x[e])
                u_x[e] = u_n[e]
            tk = tn
    theta[:, :] = x
    return it, converged


@backend.kernel(cache=True, nogil=True)
def _solve_spd(C, n, reg, z):
    """z = (C[:n, :n] + reg tr/n I)^{-1} 1 / sum(...) (the AA weights, summing to one) by Cholesky on a copy;
    False when singular or not finite."""
    A = np.empty((n, n))
    tr = 0.0
    for a in range(n):
        tr += C[a, a]
    if not tr > 0.0:
        return False
    for a in range(n):
        for b in range(n):
            A[a, b] = C[a, b]
        A[a, a] += reg * tr / n
    for a in range(n):
        s = A[a, a]
        for k in range(a):
            s -= A[k, a] * A[k, a]
        if not s > 0.0:
            return False
        r = math.sqrt(s)
        A[a, a] = r
        for b in range(a + 1, n):
            s = A[a, b]
            for k in range(a):
                s -= A[k, a] * A[k, b]
            A[a, b] = s / r
    for a in range(n):
        s = 1.0
        for k in range(a):
            s -= A[k, a] * z[k]
        z[a] = s / A[a, a]
    for a in range(n - 1, -1, -1):
        s = z[a]
        for k in range(a + 1, n):
            s -= A[a, k] * z[k]
        z[a] = s / A[a, a]
    tot = 0.0
    for a in range(n):
        tot += z[a]
    if not (tot != 0.0 and math.isfinite(tot)):
        return False
    for a in range(n):
        z[a] /= tot
    return True


@backend.kernel(cache=True, nogil=True)
def _aa_online(X, node, lo, hi, woff, w, lam1, lam2, L, penalized, theta, max_iter, tol, m, reg, stats):
    """Type-II Anderson acceleration at every iteration (Walker and Ni 2011) of the backtracked proximal-gradient
    map ``T(x) = prox(x - g(x) / L_k)``: with the last m+1 values ``T(x_i)`` and residuals ``r_i = T(x_i) - x_i``,
    ``c = argmin |sum c_i r_i|, sum c_i = 1`` (regularised Gram, kept up to date one row per iteration) and the
    candidate ``x_a = sum c_i T(x_i)``, taken as the next iterate iff ``F(x_a) < F(T(x_k))`` (else ``T(x_k)``).
    Stops as ``solver._fista`` (``L |x_k - T(x_k)|_inf <= tol``, returning ``T(x_k)``). ``stats`` as
    :func:`_aa_solve`'s. Returns (n_iter, converged)."""
    T, p = theta.shape
    x = theta.copy()
    xn = np.empty_like(theta)
    g = np.empty_like(theta)
    xa = np.empty_like(theta)
    M = m + 1
    G = np.empty((M, T, p))
    R = np.empty((M, T, p))
    C = np.zeros((M, M))
    Co = np.empty((M, M))
    z = np.empty(M)
    order = np.empty(M, np.int64)
    nz = np.empty(p, np.int64)
    scratch = np.empty((5, w.shape[0]))
    u_x, ex, buf, u_n, u_a = scratch[0], scratch[1], scratch[2], scratch[3], scratch[4]
    ta = woff[0] if T > 0 else 0
    tb = woff[T - 1] + hi[T - 1] - lo[T - 1] if T > 0 else 0
    state = np.zeros((p, T), np.int8)
    ycol = np.empty(T)
    xcol = np.empty(T)
    Lk = L
    shrink = 0.5
    converged = False
    _margins(X, node, lo, hi, woff, x, nz, u_x)
    filled = 0
    slot = 0
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007 (the count is returned)
        _exps(lo, hi, woff, u_x, ex)
        _accumulate(X, node, lo, hi, woff, w, u_x, ex, g)
        fy = _loss_terms(lo, hi, woff, w, u_x, ex, buf)
        Lk = max(Lk * shrink, 1e-9 * L)
        while True:
            step = 1.0 / Lk
            _prox_step(x, g, step, step * lam1, step * lam2, penalized, xn, state, ycol, xcol)
            _margins(X, node, lo, hi, woff, xn, nz, u_n)
            if Lk >= L:
                break
            gd, dd = _step_terms(g, xn, x)
            _exps(lo, hi, woff, u_n, ex)
            fx = _loss_terms(lo, hi, woff, w, u_n, ex, buf)
            stats[3] += 1
            if fx <= fy + gd + 0.5 * Lk * dd + 1e-15 * abs(fy):
                break
            Lk = min(2.0 * Lk, L)
            shrink = 0.9
        gmax, _ = _displacement(x, xn, x)
        if gmax * L <= tol:
            x[:, :] = xn
            converged = True
            break
        # history: T(x_k) and r_k into the ring, the new row of the Gram matrix
        for t in range(T):
            for j in range(p):
                G[slot, t, j] = xn[t, j]
                R[slot, t, j] = xn[t, j] - x[t, j]
        filled = min(filled + 1, M)
        for i in range(M):
            if i >= filled and i != slot:
                continue
            s = 0.0
            for t in range(T):
                for j in range(p):
                    s += R[slot, t, j] * R[i, t, j]
            C[slot, i] = s
            C[i, slot] = s
        took = False
        if filled >= 2:
            for a in range(filled):
                order[a] = (slot - a + M) % M
            for a in range(filled):
                for b in range(filled):
                    Co[a, b] = C[order[a], order[b]]
            stats[0] += 1
            if _solve_spd(Co, filled, reg, z):
                for t in range(T):
                    for j in range(p):
                        v = 0.0
                        for a in range(filled):
                            v += z[a] * G[order[a], t, j]
                        xa[t, j] = v
                _margins(X, node, lo, hi, woff, xa, nz, u_a)
                _exps(lo, hi, woff, u_a, ex)
                fa = _loss_terms(lo, hi, woff, w, u_a, ex, buf) + _penalty(xa, lam1, lam2, penalized)
                _exps(lo, hi, woff, u_n, ex)
                fn = _loss_terms(lo, hi, woff, w, u_n, ex, buf) + _penalty(xn, lam1, lam2, penalized)
                if fa < fn:
                    took = True
                    stats[1] += 1
                    x[:, :] = xa
                    for e in range(ta, tb):
                        u_x[e] = u_a[e]
        if not took:
            x[:, :] = xn
            for e in range(ta, tb):
                u_x[e] = u_n[e]
        slot = (slot + 1) % M
    theta[:, :] = x
    return it, converged


@functools.lru_cache(maxsize=None)
def _kernels():
    solver._kernels()  # compiles the solver's kernels and rebinds its globals to the dispatchers
    names = ("_margins", "_exps", "_accumulate", "_loss_terms", "_prox_step", "_step_terms", "_displacement")
    return backend.compile_kernels(sys.modules[__name__], bind={n: getattr(solver, n) for n in names})


class Result:
    def __init__(self, theta, n_iter, converged, objective, n_solves, stats):
        self.theta, self.n_iter, self.converged, self.objective = theta, n_iter, converged, objective
        self.n_solves, self.stats = n_solves, stats


def solve_aa(
    design,
    node,
    lam1,
    lam2,
    theta0=None,
    tol=1e-6,
    max_iter=5000,
    accel=True,
    K=5,
    reg=1e-10,
    gate=False,
    restart=True,
    online=False,
):
    """One grid point (lam2 > 0, q = 1), screened as ``solver._solve_block`` with :func:`_aa_solve` as the inner
    solver; returns a :class:`Result` whose ``converged`` means ``_certify``'s gap <= tol with no violator."""
    kern = _kernels()
    if lam2 <= 0:
        raise ValueError("the prototype covers lambda2 > 0 (the coupled path problem)")
    d = solver.node_design(design, int(node))
    T, p = d.T, d.p
    L = float(d.L.max())
    X, lo, hi, woff = d.X, d.lo, d.hi, d.woff
    theta = np.zeros((T, p)) if theta0 is None else np.array(theta0, dtype=np.float64, order="C", copy=True)
    penalized = np.ones(p, np.bool_)
    penalized[node] = False
    stats = np.zeros(4, np.int64)
    active = ~penalized | np.any(theta != 0.0, axis=0)
    violators = np.zeros(p, np.bool_)
    gap = solver._certify(X, node, lo, hi, woff, d.w, lam1, lam2, 1, L, penalized, theta, active, violators)
    n_iter, n_solves, conv = 0, 0, gap <= tol and not violators.any()
    tol_a = tol
    while not conv:
        active |= violators
        A = np.flatnonzero(active)
        XA = np.ascontiguousarray(X[:, A])
        th = np.ascontiguousarray(theta[:, A])
        args = (XA, int(np.searchsorted(A, node)), lo, hi, woff, d.w, float(lam1), float(lam2), L, penalized[A], th,
                max_iter - n_iter, tol_a)  # fmt: skip
        if online:
            k, conv = kern["_aa_online"](*args, int(K), float(reg), stats)
        else:
            k, conv = kern["_aa_solve"](*args, accel, int(K), float(reg), gate, restart, stats)
        theta[:, A] = th
        n_iter, n_solves = n_iter + k, n_solves + 1
        if not conv:
            break
        gap = solver._certify(X, node, lo, hi, woff, d.w, lam1, lam2, 1, L, penalized, theta, active, violators)
        conv = gap <= tol and not violators.any()
        if not violators.any() and gap > tol:
            tol_a *= 0.5 * tol / gap
    return Result(theta, n_iter, conv, solver.objective(d, node, theta, lam1, lam2), n_solves, stats)


def bic(loglik, df, T):
    return -2.0 * loglik + math.log(T) * df


def compare(design, nodes, T, **opts):
    from pgmflow.tasks.tesla import evaluate

    solver.solve_path(design, 0, 0.3, 0.1)  # compile / load both solvers' kernels before the clock
    solve_aa(design, 0, 0.3, 0.1, **opts)
    tot = {"f_cpu": 0.0, "a_cpu": 0.0, "f_it": 0, "a_it": 0, "att": 0, "acc": 0, "skip": 0}
    rels = []
    rows = []
    print("node lam2   lam1 | FISTA it  CPU s |    AA it  CPU s  tried kept | (F_AA - F_F)/F_F | nbrs F AA differ")
    for node in nodes:
        best = {"F": None, "A": None}
        nb = {}
        fcpu = acpu = 0.0
        fit_n = ait_n = 0
        for b, lam2 in enumerate(LAM2):
            thF = thA = None
            for a, lam1 in enumerate(LAM1):
                t0 = time.process_time()
                rF = solver.solve_path(design, node, lam1, lam2, theta0=thF)
                t1 = time.process_time()
                rA = solve_aa(design, node, lam1, lam2, theta0=thA, **opts)
                t2 = time.process_time()
                thF, thA = rF.theta, rA.theta
                cf, ca = t1 - t0, t2 - t1
                fcpu += cf
                acpu += ca
                fit_n += rF.n_iter
                ait_n += rA.n_iter
                tot["att"] += int(rA.stats[0])
                tot["acc"] += int(rA.stats[1])
                tot["skip"] += int(rA.stats[2])
                rel = (rA.objective - rF.objective) / abs(rF.objective)
                rels.append(rel)
                eF = np.any(np.delete(rF.theta, node, axis=1) != 0, axis=0)
                eA = np.any(np.delete(rA.theta, node, axis=1) != 0, axis=0)
                nb[(a, b)] = (eF, eA)
                for key, r in (("F", rF), ("A", rA)):
                    ll = float(solver.row_loglik(design.X, design.tix, node, r.theta)[design.X[:, node] != 0].sum())
                    sc = bic(ll, evaluate.path_df(r.theta, node), T)
                    if best[key] is None or sc < best[key][0]:
                        best[key] = (sc, a, b)
                line = (
                    f"{node:4d} {lam2:5.3f} {lam1:5.2f} | {rF.n_iter:8d} {cf:6.2f} | {rA.n_iter:8d} {ca:6.2f} "
                    f"{int(rA.stats[0]):6d} {int(rA.stats[1]):4d} | {rel:+.2e}"
                    f"{'' if rA.converged and rF.converged else ' (not certified)'} | {int(eF.sum()):3d} "
                    f"{int(eA.sum()):3d} {int((eF != eA).sum()):3d}"
                )
                rows.append(line)
                print(line, flush=True)
        (_, aF, bF), (_, aA, bA) = best["F"], best["A"]
        eF, eA = nb[(aF, bF)][0], nb[(aA, bA)][1]
        tot["f_cpu"] += fcpu
        tot["a_cpu"] += acpu
        tot["f_it"] += fit_n
        tot["a_it"] += ait_n
        print(
            f"node {node}: CPU s FISTA {fcpu:.1f} ({fit_n} it), AA {acpu:.1f} ({ait_n} it) ({fcpu / acpu:.2f}x); "
            f"BIC choice (lambda1, lambda2) FISTA ({LAM1[aF]}, {LAM2[bF]}), AA ({LAM1[aA]}, {LAM2[bA]}); "
            f"neighbours there {int(eF.sum())} and {int(eA.sum())}, differing {int((eF != eA).sum())}",
            flush=True,
        )
    rels = np.asarray(rels)
    print(
        f"all: FISTA {tot['f_it']} iterations, {tot['f_cpu']:.1f} CPU s; AA {tot['a_it']} iterations "
        f"({tot['att']} extrapolations tried, {tot['acc']} kept, {tot['skip']} gated off), {tot['a_cpu']:.1f} CPU s "
        f"({tot['f_cpu'] / tot['a_cpu']:.2f}x CPU, {tot['f_it'] / max(tot['a_it'], 1):.2f}x iterations); "
        f"(F_AA - F_F)/F_F max {rels.max():+.2e}, min {rels.min():+.2e}, "
        f"{int((rels > 0).sum())} above / {int((rels <= 0).sum())} at or below"
    )


def pattern_settling(design, node, a, b, step=100):
    """When does FISTA's zero/jump pattern reach its final one? From the path's warm start at grid point
    (LAM1[a], LAM2[b]), the solve truncated after k iterations against the converged one: zero entries and jumps
    (theta^t != theta^{t-1}) that differ, and the relative objective gap."""
    theta = None
    for lam1 in LAM1[:a]:
        theta = solver.solve_path(design, node, lam1, LAM2[b], theta0=theta).theta
    ref = solver.solve_path(design, node, LAM1[a], LAM2[b], theta0=theta)

    def pattern(th):
        return th == 0.0, np.diff(th, axis=0) != 0.0

    z0, j0 = pattern(ref.theta)
    print(
        f"node {node}, lambda1 {LAM1[a]}, lambda2 {LAM2[b]}: {ref.n_iter} FISTA iterations; final pattern "
        f"{int((~z0).sum())} non-zero entries, {int(j0.sum())} jumps"
    )
    print("    k | zeros differing | jumps differing | (F_k - F)/F")
    for k in range(step, ref.n_iter + step, step):
        r = solver.solve_path(design, node, LAM1[a], LAM2[b], theta0=theta, max_iter=k)
        z, j = pattern(r.theta)
        rel = (r.objective - ref.objective) / abs(ref.objective)
        print(f"{k:5d} | {int((z != z0).sum()):15d} | {int((j != j0).sum()):15d} | {rel:.2e}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[0, 44, 99])
    ap.add_argument("--base", choices=("fista", "pg"), default="fista", help="the iteration AA extrapolates")
    ap.add_argument("--memory", type=int, default=5, help="K: iterates per extrapolation (0: no AA)")
    ap.add_argument("--reg", type=float, default=1e-10, help="Gram regularisation, relative to its trace / K")
    ap.add_argument("--gate", action="store_true", help="extrapolate only when the zero/jump pattern held")
    ap.add_argument("--no-restart", action="store_true", help="keep FISTA's momentum when an extrapolation is kept")
    ap.add_argument("--online", action="store_true", help="type-II AA at every iteration of plain PG (--base ignored)")
    ap.add_argument(
        "--max-iter", type=int, default=5000, help="AA iterations per solve at most (FISTA: its default, 5000)"
    )
    ap.add_argument(
        "--pattern", type=int, nargs=2, default=None, metavar=("A", "B"),
        help="when FISTA's zero/jump pattern settles at grid point (LAM1[A], LAM2[B]) of --nodes",
    )  # fmt: skip
    ap.add_argument("--tol", type=float, default=1e-6, help="the AA solver's certificate tolerance (FISTA: 1e-6)")
    a = ap.parse_args()
    from pgmflow.tasks.tesla import rollcall

    src = (REPO / "tasks/tesla/solver.py").read_bytes() + (REPO / "tasks/tesla/prox.py").read_bytes()
    series, _, _ = rollcall.to_series(rollcall.read_pscl(), "rollcall")
    design = solver.tesla_design(series.X, series.tix, series.T)
    if a.pattern is not None:
        for node in a.nodes:
            pattern_settling(design, node, *a.pattern)
        return
    opts = {
        "accel": a.base == "fista",
        "K": a.memory,
        "reg": a.reg,
        "gate": a.gate,
        "restart": not a.no_restart,
        "online": a.online,
        "tol": a.tol,
        "max_iter": a.max_iter,
    }
    print(f"options {opts}; solver.py+prox.py sha1 {hashlib.sha1(src).hexdigest()[:12]}; load {os.getloadavg()}")
    compare(design, a.nodes, series.T, **opts)
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()

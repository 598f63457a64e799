"""Issue 36: a semismooth Newton augmented Lagrangian (SSNAL) solver for TESLA's per-node problem, prototyped on the
109th Senate (T=645, p=100, one sample per time point) against the pipeline's FISTA solver (``solver.solve_path``).

    .venv/bin/python benchmarks/tesla_senate_ssnal.py --hard 44            # node 44's five slow grid points
    .venv/bin/python benchmarks/tesla_senate_ssnal.py --nodes 0 44 99      # 3 nodes x 25 grid points

The method (Li, Sun and Toh, SIAM J. Optim. 28, 2018, "A highly efficient semismooth Newton augmented Lagrangian
method for solving Lasso problems", and Li, Sun and Toh 2018 on the fused lasso). The primal problem is
``min_theta h(A theta) + P(theta)``: ``(A theta)_t = theta^t . z_t`` the margin of time t's sample (``z_t`` = x_t
with the node's own entry 1), ``h(m) = sum_t w_t log(1 + exp(-2 y_t m_t))`` and ``P`` = lambda1 L1 (field
unpenalised) + lambda2 TV per column. Its dual is ``min_{u, Z} h*(u) + P*(Z)`` s.t. ``A'u + Z = 0`` with ``u``
[T] (one entry per sample; time points without a weighted sample have ``u_t = 0``) and ``h*`` the sum of the
logistic conjugates ``w_t (r log r + (1 - r) log(1 - r))``, ``r_t = -u_t y_t / (2 w_t)`` in (0, 1). The augmented
Lagrangian method on the dual, with multiplier ``theta`` and penalty ``sigma``, eliminates Z and solves in u

    phi(u) = h*(u) - <u, A q> - P(q) - |q - theta|^2 / (2 sigma),   q = Prox_{sigma P}(theta - sigma A'u),
    grad phi(u) = grad h*(u) - A q,

then sets ``theta <- q`` (a proximal point step on the primal) and doubles sigma (10, 20, ..., capped at 3,000).
The inner problem is strongly convex in u; it is solved by semismooth Newton from the last u (the first from
``u = grad h(A theta0)``) to ``|grad phi| <= eps_k = 10 * 0.2^k``. The generalized Hessian is ``diag(h*'') + sigma A
J A'`` with ``J`` the generalized Jacobian of the fused-lasso prox at the current point (per column: the average over
each non-zero segment of the prox's output, zero on its zero segments; every segment of the unpenalised field), so
``A J A' = B diag(1/|S|) B'`` with B the segments' columns of Z. The Newton system is solved by Jacobi-preconditioned
CG (relative residual <= min(0.01, |grad phi|^0.2); a mat-vec is two passes over the non-zero entries of q), or
exactly through the Woodbury identity and a Cholesky factor of a [segments, segments] matrix when there are at most
150 segments. The line search is a curved Armijo search on phi (sigma 0.3; safeguarded quadratic backtracking): a
step that would bring some ``r_t`` nearer 0 or 1 than 5 % of its distance is clipped there component-wise (the
logistic conjugate's domain); where phi's decrease falls below its rounding, a step that cuts ``|grad phi|`` by 30 %
without raising phi is taken. The prox is the repository's exact one (``prox._kernels()``, read-only: the one-pass
zero test, the warm TV from the last jump set, Condat's algorithm), applied per column of a [p, T] layout.

The solve stops on the pipeline's own test (``solver._certify``: the full problem's gradient-mapping norm at step 1/L,
<= tol), taken on the primal iterate after an outer step that moved it by at most ``3 tol sigma`` (the move over sigma
is the proximal term's part of that residual, and in practice equals the certificate to 2 digits). The default tol
is 1e-7, tighter than FISTA's 1e-6: at 1e-6 SSNAL's objectives lie up to 2e-9 relative above FISTA's, at 1e-7 within
1.1e-10, for ~5 % more time. Solves are compared on objectives (``solver.objective``), on the BIC choice per node and
on its neighbour set (BIC as ``benchmarks/tesla_senate_newton.py``). CPU seconds are ``time.process_time`` of each
solve, both solvers in one process, alternating per grid point; each solver warm-starts each lambda1 path downwards
from its own previous solution. ``--hard NODE`` solves the five grid points that are slow at node 44 from FISTA's
solution at the previous lambda1 (the warm start of the path) and from zero. ``SSNAL_TRACE=1`` prints every outer step.

Measured (``benchmarks/results/tesla-senate109-cpu-2core-epyc-issue36-ssnal.md``, 2-core EPYC): node 44's five slow
points 5.5x (warm) and 5.7x (cold) FISTA's speed in CPU time; nodes 0, 44, 99 x 25 grid points 3.09x (2.6x, 3.5x, 3.1x)
with objectives within 1.1e-10 relative of FISTA's (below at 45 of 75), the same BIC choices and neighbour sets there.
The gain is 5.2x where FISTA needs >= 1,000 iterations and 1.7x where it needs < 300: SSNAL needs ~100 prox
evaluations per solve wherever it is on the grid. Not wired into ``solve_path``.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from pgmflow.tasks import backend  # noqa: E402
from pgmflow.tasks.tesla import prox as _prox  # noqa: E402
from pgmflow.tasks.tesla import solver  # noqa: E402

_tv = _prox._tv1d  # bound to its dispatcher by _kernels()
_fz = _prox._fused_zero
_tvw = _prox._tv1d_warm

LAM1 = (0.32, 0.16, 0.08, 0.04, 0.02)
LAM2 = (2.0, 1.0, 0.5, 0.25, 0.125)
KEEP = 0.05  # a step keeps at least this fraction of each r_t's distance to 0 and to 1
HARD = ((0.16, 0.5), (0.16, 0.25), (0.08, 0.25), (0.08, 0.125), (0.04, 0.125))  # node 44's slow points


@backend.kernel(cache=True, nogil=True)
def _prox_cols(V, s1, s2, pen, Q, state, xcol):
    """Q[j] = soft(tv(V[j], s2), s1 if pen[j]) per row j of V, Q [p, T] (the fused-lasso prox by column).

    ``state`` [p, T] int8 as ``solver._prox_step``'s: the last jump signs of column j in ``state[j, :T-1]``, whether
    its last output was non-zero in ``state[j, T-1]``; a zero column takes the one-pass zero test first, else the
    TV from the last jump set (verified), else Condat's algorithm."""
    p, T = V.shape
    for j in range(p):
        y = V[j]
        x = Q[j]
        sj = state[j]
        pn = pen[j] and s1 > 0.0
        if pn and sj[T - 1] == 0 and _fz(y, s1, s2):
            for t in range(T):
                x[t] = 0.0
            continue
        if not _tvw(y, s2, sj, xcol):
            _tv(y, s2, xcol)
            for t in range(T - 1):
                dx = xcol[t + 1] - xcol[t]
                sj[t] = 1 if dx > 0.0 else (-1 if dx < 0.0 else 0)
        nz = False
        for t in range(T):
            v = xcol[t]
            if pn:
                v = v - s1 if v > s1 else (v + s1 if v < -s1 else 0.0)
            x[t] = v
            nz |= v != 0.0
        sj[T - 1] = 1 if nz else 0


@backend.kernel(cache=True, nogil=True)
def _phi(ZT, y, w, pen, lam1, lam2, sigma, th, u, V, Q, state, xcol):
    """V = th - sigma A'u, Q = prox(V); returns phi(u) = h*(u) - <u, A Q> - P(Q) - |Q - th|^2 / (2 sigma) (the form
    without the cancellation of sigma |A'u|^2 terms)."""
    p, T = ZT.shape
    hs = 0.0
    for t in range(T):
        if w[t] > 0.0:
            r = -u[t] * y[t] / (2.0 * w[t])
            hs += w[t] * (r * math.log(r) + (1.0 - r) * math.log1p(-r))
    for j in range(p):
        for t in range(T):
            V[j, t] = th[j, t] - sigma * ZT[j, t] * u[t]
    _prox_cols(V, sigma * lam1, sigma * lam2, pen, Q, state, xcol)
    uaq = 0.0
    dd = 0.0
    l1 = 0.0
    tv = 0.0
    for j in range(p):
        for t in range(T):
            q = Q[j, t]
            uaq += u[t] * ZT[j, t] * q
            e = q - th[j, t]
            dd += e * e
            if pen[j]:
                l1 += abs(q)
            if t > 0:
                tv += abs(q - Q[j, t - 1])
    return hs - uaq - lam1 * l1 - lam2 * tv - dd / (2.0 * sigma)


@backend.kernel(cache=True, nogil=True)
def _grad(ZT, y, w, Q, u, g, dg):
    """g = grad h*(u) - A Q (0 where w = 0), dg = h*''(u) (1 where w = 0); returns |g|."""
    p, T = ZT.shape
    for t in range(T):
        g[t] = 0.0
    for j in range(p):
        for t in range(T):
            g[t] -= ZT[j, t] * Q[j, t]
    gn = 0.0
    for t in range(T):
        if w[t] > 0.0:
            r = -u[t] * y[t] / (2.0 * w[t])
            g[t] += -0.5 * y[t] * (math.log(r) - math.log1p(-r))
            dg[t] = 1.0 / (4.0 * w[t] * r * (1.0 - r))
            gn += g[t] * g[t]
        else:
            g[t] = 0.0
            dg[t] = 1.0
    return math.sqrt(gn)


@backend.kernel(cache=True, nogil=True)
def _segments(Q, pen, sc, sa, sb):
    """The non-zero segments of Q [p, T] (maximal runs of one value; every run of an unpenalised column):
    column, first and last time point; returns their count."""
    p, T = Q.shape
    k = 0
    for j in range(p):
        a = 0
        for t in range(1, T + 1):
            if t == T or Q[j, t] != Q[j, t - 1]:
                if not (pen[j] and Q[j, a] == 0.0):
                    sc[k] = j
                    sa[k] = a
                    sb[k] = t - 1
                    k += 1
                a = t
    return k


@backend.kernel(cache=True, nogil=True)
def _matvec(ZT, dg, sigma, sc, sa, sb, nseg, v, out):
    """out = (diag(dg) + sigma A J A') v, J the prox's generalized Jacobian (segment averages)."""
    T = v.shape[0]
    for t in range(T):
        out[t] = dg[t] * v[t]
    for k in range(nseg):
        zj = ZT[sc[k]]
        a, b = sa[k], sb[k]
        s = 0.0
        for t in range(a, b + 1):
            s += zj[t] * v[t]
        c = sigma * s / (b - a + 1)
        for t in range(a, b + 1):
            out[t] += c * zj[t]


@backend.kernel(cache=True, nogil=True)
def _cg(ZT, dg, sigma, sc, sa, sb, nseg, g, d, rtol, max_cg):
    """d = -(diag(dg) + sigma A J A')^{-1} g by Jacobi-preconditioned CG to |r| <= rtol |g|; returns iterations."""
    T = g.shape[0]
    pre = np.empty(T)
    for t in range(T):
        pre[t] = dg[t]
    for k in range(nseg):
        zj = ZT[sc[k]]
        a, b = sa[k], sb[k]
        c = sigma / (b - a + 1)
        for t in range(a, b + 1):
            pre[t] += c * zj[t] * zj[t]
    r = np.empty(T)
    z = np.empty(T)
    pv = np.empty(T)
    Ap = np.empty(T)
    rz = 0.0
    r0 = 0.0
    for t in range(T):
        d[t] = 0.0
        r[t] = -g[t]
        z[t] = r[t] / pre[t]
        pv[t] = z[t]
        rz += r[t] * z[t]
        r0 += r[t] * r[t]
    it = 0
    while it < max_cg and r0 > 0.0:
        it += 1
        _matvec(ZT, dg, sigma, sc, sa, sb, nseg, pv, Ap)
        pAp = 0.0
        for t in range(T):
            pAp += pv[t] * Ap[t]
        if pAp <= 0.0:
            break
        al = rz / pAp
        rr = 0.0
        for t in range(T):
            d[t] += al * pv[t]
            r[t] -= al * Ap[t]
            rr += r[t] * r[t]
        if rr <= rtol * rtol * r0:
            break
        rzn = 0.0
        for t in range(T):
            z[t] = r[t] / pre[t]
            rzn += r[t] * z[t]
        be = rzn / rz
        rz = rzn
        for t in range(T):
            pv[t] = z[t] + be * pv[t]
    return it


@backend.kernel(cache=True, nogil=True)
def _direct(ZT, dg, sigma, sc, sa, sb, nseg, g, d):
    """d = -(diag(dg) + sigma B diag(1/|S|) B')^{-1} g exactly, by the Woodbury identity: with ``Dg = diag(dg)``,
    ``K = diag(|S| / sigma) + B' Dg^{-1} B`` [nseg, nseg] (entries where two segments overlap in time; cost the sum over
    t of the squared number of segments covering t) and its Cholesky factor (nseg^3 / 3),
    ``d = -Dg^{-1} (g - B K^{-1} B' Dg^{-1} g)``. For few segments (a smooth path) it beats CG."""
    T = g.shape[0]
    cnt = np.zeros(T + 1, np.int64)
    for k in range(nseg):
        for t in range(sa[k], sb[k] + 1):
            cnt[t + 1] += 1
    for t in range(T):
        cnt[t + 1] += cnt[t]
    cov = np.empty(cnt[T], np.int64)
    fill = cnt[:T].copy()
    for k in range(nseg):
        for t in range(sa[k], sb[k] + 1):
            cov[fill[t]] = k
            fill[t] += 1
    K = np.zeros((nseg, nseg))
    for k in range(nseg):
        K[k, k] = (sb[k] - sa[k] + 1) / sigma
    for t in range(T):
        it = 1.0 / dg[t]
        for i0 in range(cnt[t], cnt[t + 1]):
            a = cov[i0]
            za = ZT[sc[a], t] * it
            for i1 in range(cnt[t], i0 + 1):
                b = cov[i1]
                K[a, b] += za * ZT[sc[b], t]  # lower triangle (a >= b: segments are listed in order)
    # Cholesky K = C C' in place (lower triangle)
    for j in range(nseg):
        s = K[j, j]
        for k in range(j):
            s -= K[j, k] * K[j, k]
        if s <= 0.0:
            return False
        cj = math.sqrt(s)
        K[j, j] = cj
        for i in range(j + 1, nseg):
            s = K[i, j]
            for k in range(j):
                s -= K[i, k] * K[j, k]
            K[i, j] = s / cj
    # rhs = B' Dg^{-1} g; solve K x = rhs
    x = np.zeros(nseg)
    for k in range(nseg):
        zj = ZT[sc[k]]
        s = 0.0
        for t in range(sa[k], sb[k] + 1):
            s += zj[t] * g[t] / dg[t]
        x[k] = s
    for i in range(nseg):
        s = x[i]
        for k in range(i):
            s -= K[i, k] * x[k]
        x[i] = s / K[i, i]
    for i in range(nseg - 1, -1, -1):
        s = x[i]
        for k in range(i + 1, nseg):
            s -= K[k, i] * x[k]
        x[i] = s / K[i, i]
    for t in range(T):
        d[t] = g[t]
    for k in range(nseg):
        zj = ZT[sc[k]]
        for t in range(sa[k], sb[k] + 1):
            d[t] -= zj[t] * x[k]
    for t in range(T):
        d[t] = -d[t] / dg[t]
    return True


@backend.kernel(cache=True, nogil=True)
def _ssn(
    ZT,
    y,
    w,
    pen,
    lam1,
    lam2,
    sigma,
    th,
    u,
    Q,
    state,
    eps,
    max_it,
    max_cg,
    cg_rtol,
    max_direct,
    mu,
    gcut,
    max_back,
    stats,
):
    """Semismooth Newton on phi from u (overwritten) until |grad phi| <= eps; Q receives prox(th - sigma A'u).
    ``stats`` [5] += (Newton steps, CG iterations, prox evaluations, line-search backtracks, failed line searches);
    returns |grad phi|. A line search that finds no step within ``max_back`` halvings ends the inner solve."""
    p, T = ZT.shape
    V = np.empty((p, T))
    Vn = np.empty((p, T))
    Qn = np.empty((p, T))
    xcol = np.empty(T)
    g = np.empty(T)
    dg = np.empty(T)
    g2 = np.empty(T)
    dg2 = np.empty(T)
    d = np.empty(T)
    un = np.empty(T)
    sc = np.empty(p * T, np.int64)
    sa = np.empty(p * T, np.int64)
    sb = np.empty(p * T, np.int64)
    f = _phi(ZT, y, w, pen, lam1, lam2, sigma, th, u, V, Q, state, xcol)
    stats[2] += 1
    gn = _grad(ZT, y, w, Q, u, g, dg)
    it = 0
    while gn > eps and it < max_it:
        it += 1
        nseg = _segments(Q, pen, sc, sa, sb)
        if nseg > max_direct or not _direct(ZT, dg, sigma, sc, sa, sb, nseg, g, d):
            rtol = min(cg_rtol, gn**0.2)
            stats[1] += _cg(ZT, dg, sigma, sc, sa, sb, nseg, g, d, rtol, max_cg)
        gd = 0.0
        for t in range(T):
            gd += g[t] * d[t]
        if not gd < 0.0:  # not a descent direction (CG breakdown): the scaled steepest descent
            gd = 0.0
            for t in range(T):
                d[t] = -g[t] / dg[t]
                gd += g[t] * d[t]
        al = 1.0
        fn = f
        gnn = gn
        ok = False
        for _ in range(max_back + 1):
            # the step, each r_t = -u_t y_t / (2 w_t) kept within (KEEP r_t, 1 - KEEP (1 - r_t)): a step that
            # would leave the domain is clipped component-wise (a curved search); gs its first-order decrease
            gs = 0.0
            for t in range(T):
                ut = u[t] + al * d[t]
                if w[t] > 0.0:
                    c = -y[t] / (2.0 * w[t])  # r = c u
                    r = c * u[t]
                    rn = c * ut
                    if rn < KEEP * r:
                        ut = KEEP * r / c
                    elif rn > 1.0 - KEEP * (1.0 - r):
                        ut = (1.0 - KEEP * (1.0 - r)) / c
                un[t] = ut
                gs += g[t] * (ut - u[t])
            fn = _phi(ZT, y, w, pen, lam1, lam2, sigma, th, un, Vn, Qn, state, xcol)
            stats[2] += 1
            gnn = _grad(ZT, y, w, Qn, un, g2, dg2)
            # Armijo, or (where phi's decrease is below its rounding) phi not above its rounding and the gradient
            # cut by the factor gcut
            if fn <= f + mu * gs or (fn <= f + 1e-13 * abs(f) and gnn <= gcut * gn):
                ok = True
                break
            stats[3] += 1
            # the minimiser of the quadratic through f, its slope gs / al and fn, kept within [al / 10, al / 2]
            den = 2.0 * (fn - f - gs)
            aq = -gs * al / den if den > 0.0 else 0.5 * al
            al = min(max(aq, 0.1 * al), 0.5 * al)
            if -al * gd < 1e-15 * abs(f):  # the predicted decrease is below phi's rounding
                break
        if not ok:
            # no acceptable step (rounding or a bad model): leave u, and prox(th - sigma A'u) in Q, as they are;
            # the outer step goes on from here (state holds the last trial's jump sets: only a guess)
            _phi(ZT, y, w, pen, lam1, lam2, sigma, th, u, V, Q, state, xcol)
            stats[2] += 1
            stats[4] += 1
            gn = _grad(ZT, y, w, Q, u, g, dg)
            break
        for t in range(T):
            u[t] = un[t]
            g[t] = g2[t]
            dg[t] = dg2[t]
        for j in range(p):
            for t in range(T):
                Q[j, t] = Qn[j, t]
        f = fn
        gn = gnn
    stats[0] += it
    return gn


@functools.lru_cache(maxsize=None)
def _kernels():
    k = _prox._kernels()
    bind = {"_tv": k.tv1d, "_fz": k.fused_zero, "_tvw": k.tv1d_warm}
    return backend.compile_kernels(sys.modules[__name__], bind=bind)


class Result:
    """A solve: the path, outer steps, certificates taken, whether certified, F, the last certificate, and the
    inner work (Newton steps, CG iterations, prox evaluations, line-search backtracks, failed line searches)."""

    def __init__(self, theta, n_outer, n_cert, stats, converged, objective, gap):
        self.theta, self.n_outer, self.n_cert, self.converged = theta, n_outer, n_cert, converged
        self.objective, self.gap = objective, gap
        self.n_newton, self.n_cg, self.n_prox, self.n_back, self.n_fail = (int(s) for s in stats)


def solve_ssnal(
    design,
    node,
    lam1,
    lam2,
    theta0=None,
    tol=1e-7,
    sigma0=10.0,
    rho=2.0,
    sigma_max=3e3,
    eps0=10.0,
    eps_rate=0.2,
    max_outer=60,
    max_newton=200,
    max_cg=500,
    cg_rtol=0.01,
    max_direct=150,
    mu=0.3,
    gcut=0.7,
    max_back=30,
    skip=3.0,
):
    """SSNAL from ``theta0`` (zeros if None) until ``solver._certify``'s gap <= tol (one sample per time point,
    lam2 > 0), at most ``max_outer`` outer steps.

    Outer step k: the inner problem to ``|grad phi| <= max(eps0 eps_rate^k, 1e-13)`` (at most ``max_newton`` Newton
    steps, CG to ``cg_rtol`` or the direct solve up to ``max_direct`` segments, Armijo parameter ``mu``, the gradient
    test ``gcut``, ``max_back`` backtracks), then ``theta <- q``, the certificate if ``|theta_new - theta| / sigma <=
    skip tol``, ``sigma <- min(rho sigma, sigma_max)``."""
    k = _kernels()
    solver._kernels()
    d = solver.node_design(design, node)
    T, p = d.T, d.p
    if not np.all(d.hi - d.lo == 1) or lam2 <= 0:
        raise ValueError("the prototype needs one sample per time point and lambda2 > 0")
    w = d.w[d.woff].copy()
    Z = d.X[d.lo].astype(np.float64)
    y = Z[:, node].copy()
    Z[:, node] = 1.0
    Z[w == 0.0] = 0.0  # a sample without weight has no dual variable (u_t = 0) and no margin
    ZT = np.ascontiguousarray(Z.T)
    pen = np.ones(p, np.bool_)
    pen[node] = False
    L = float(d.L.max())
    theta = np.zeros((T, p)) if theta0 is None else np.array(theta0, dtype=np.float64, order="C", copy=True)
    # u = grad h(A theta0): r_t = sigmoid(-2 y_t m_t), u_t = -2 w_t y_t r_t
    m = np.einsum("tj,tj->t", Z, theta)
    r = 0.5 * (1.0 - np.tanh(y * m))  # sigmoid(-2 y m)
    r = np.clip(r, 1e-300, 1.0 - 1e-16)
    u = np.where(w > 0, -2.0 * w * y * r, 0.0)
    thT = np.ascontiguousarray(theta.T)
    Q = np.empty_like(thT)
    state = np.zeros((p, T), np.int8)
    stats = np.zeros(5)
    allc, viol = np.ones(p, np.bool_), np.zeros(p, np.bool_)
    sigma, sigma_max = float(sigma0), float(sigma_max)
    lam1, lam2, mu, gcut, cg_rtol = float(lam1), float(lam2), float(mu), float(gcut), float(cg_rtol)
    n_outer = 0
    n_cert = 1
    gap = solver._certify(d.X, node, d.lo, d.hi, d.woff, d.w, lam1, lam2, 1, L, pen, theta, allc, viol)
    while gap > tol and n_outer < max_outer:
        eps = max(eps0 * eps_rate**n_outer, 1e-13)
        k["_ssn"](
            ZT,
            y,
            w,
            pen,
            lam1,
            lam2,
            sigma,
            thT,
            u,
            Q,
            state,
            eps,
            max_newton,
            max_cg,
            cg_rtol,
            max_direct,
            mu,
            gcut,
            max_back,
            stats,
        )
        n_outer += 1
        move = float(np.abs(Q - thT).max()) / sigma  # the proximal term's part of the new point's optimality residual
        thT[:] = Q
        theta = np.ascontiguousarray(thT.T)
        if move <= skip * tol or n_outer == max_outer:
            gap = solver._certify(d.X, node, d.lo, d.hi, d.woff, d.w, lam1, lam2, 1, L, pen, theta, allc, viol)
            n_cert += 1
        if os.environ.get("SSNAL_TRACE"):
            print(
                f"  outer {n_outer} sigma {sigma:.3g} eps {eps:.1e} move {move:.2e} gap {gap:.2e} {stats}", flush=True
            )
        sigma = min(sigma * rho, sigma_max)
    obj = solver.objective(d, node, theta, lam1, lam2)
    return Result(theta, n_outer, n_cert, stats, gap <= tol, obj, gap)


def bic(loglik, df, T):
    return -2.0 * loglik + math.log(T) * df


def _warm(design, node, lam1, lam2):
    """FISTA's solution at the grid's previous (larger) lambda1 for this lambda2, or None."""
    a = LAM1.index(lam1)
    th = None
    for l1 in LAM1[:a]:
        th = solver.solve_path(design, node, l1, lam2, theta0=th).theta
    return th


def hard(design, node, reps, **opts):
    """Node ``node``'s five slow grid points, warm (from FISTA's previous lambda1) and cold, alternating."""
    solver.solve_path(design, 0, 0.3, 0.1)
    solve_ssnal(design, 0, 0.3, 0.1, **opts)
    print(
        "start lam1  lam2 | FISTA it   CPU s | SSNAL outer newton  cg prox back  CPU s | speed-up | (F_S - F_F)/|F_F|"
    )
    tot = {"warm": [0.0, 0.0], "cold": [0.0, 0.0]}
    for lam1, lam2 in HARD:
        th0 = _warm(design, node, lam1, lam2)
        for start, t0 in (("warm", th0), ("cold", None)):
            cf = cs = 0.0
            for _ in range(reps):
                c0 = time.process_time()
                rF = solver.solve_path(design, node, lam1, lam2, theta0=t0)
                c1 = time.process_time()
                rS = solve_ssnal(design, node, lam1, lam2, theta0=t0, **opts)
                c2 = time.process_time()
                cf += c1 - c0
                cs += c2 - c1
            cf /= reps
            cs /= reps
            tot[start][0] += cf
            tot[start][1] += cs
            rel = (rS.objective - rF.objective) / abs(rF.objective)
            print(
                f"{start:5s} {lam1:4.2f} {lam2:5.3f} | {rF.n_iter:8d} {cf:7.3f} | {rS.n_outer:11d} {rS.n_newton:6d} "
                f"{rS.n_cg:4d} {rS.n_prox:4d} {rS.n_back:4d} {cs:6.3f} | {cf / cs:7.2f}x | {rel:+.2e}"
                f"{'' if rS.converged else ' (not certified)'}",
                flush=True,
            )
    for start, (cf, cs) in tot.items():
        print(f"{start}: FISTA {cf:.2f} CPU s, SSNAL {cs:.2f} CPU s ({cf / cs:.2f}x)")


def compare(design, nodes, T, **opts):
    from pgmflow.tasks.tesla import evaluate

    solver.solve_path(design, 0, 0.3, 0.1)
    solve_ssnal(design, 0, 0.3, 0.1, **opts)
    tot = {"f_cpu": 0.0, "s_cpu": 0.0, "f_it": 0, "outer": 0, "newton": 0, "cg": 0, "prox": 0, "fail": 0, "cert": 0}
    rels = []
    print(
        "node lam2   lam1 | FISTA it  CPU s | SSNAL outer newton   cg prox  CPU s | (F_S - F_F)/|F_F| | nbrs F S diff"
    )
    for node in nodes:
        best = {"F": None, "S": None}
        nb = {}
        fc_node = sc_node = 0.0
        for b, lam2 in enumerate(LAM2):
            thF = thS = None
            for a, lam1 in enumerate(LAM1):
                t0 = time.process_time()
                rF = solver.solve_path(design, node, lam1, lam2, theta0=thF)
                t1 = time.process_time()
                rS = solve_ssnal(design, node, lam1, lam2, theta0=thS, **opts)
                t2 = time.process_time()
                thF, thS = rF.theta, rS.theta
                cf, cs = t1 - t0, t2 - t1
                tot["f_cpu"] += cf
                tot["s_cpu"] += cs
                fc_node += cf
                sc_node += cs
                tot["f_it"] += rF.n_iter
                tot["outer"] += rS.n_outer
                tot["newton"] += rS.n_newton
                tot["cg"] += rS.n_cg
                tot["prox"] += rS.n_prox
                tot["fail"] += rS.n_fail
                tot["cert"] += rS.n_cert
                rel = (rS.objective - rF.objective) / abs(rF.objective)
                rels.append(rel)
                eF = np.any(np.delete(rF.theta, node, axis=1) != 0, axis=0)
                eS = np.any(np.delete(rS.theta, node, axis=1) != 0, axis=0)
                nb[(a, b)] = (eF, eS)
                for key, r in (("F", rF), ("S", rS)):
                    ll = float(solver.row_loglik(design.X, design.tix, node, r.theta)[design.X[:, node] != 0].sum())
                    sc = bic(ll, evaluate.path_df(r.theta, node), T)
                    if best[key] is None or sc < best[key][0]:
                        best[key] = (sc, a, b)
                print(
                    f"{node:4d} {lam2:5.3f} {lam1:5.2f} | {rF.n_iter:8d} {cf:6.2f} | {rS.n_outer:11d} {rS.n_newton:6d} "
                    f"{rS.n_cg:4d} {rS.n_prox:4d} {cs:6.2f} | {rel:+.2e}{'' if rS.converged else ' (not certified)'} "
                    f"| {int(eF.sum()):3d} {int(eS.sum()):3d} {int((eF != eS).sum()):3d}",
                    flush=True,
                )
        (_, aF, bF), (_, aS, bS) = best["F"], best["S"]
        eF, eS = nb[(aF, bF)][0], nb[(aS, bS)][1]
        print(
            f"node {node}: CPU s FISTA {fc_node:.2f}, SSNAL {sc_node:.2f} ({fc_node / sc_node:.2f}x); "
            f"BIC choice (lambda1, lambda2) FISTA ({LAM1[aF]}, {LAM2[bF]}), SSNAL ({LAM1[aS]}, {LAM2[bS]}); "
            f"neighbours there {int(eF.sum())} and {int(eS.sum())}, differing {int((eF != eS).sum())}",
            flush=True,
        )
    rels = np.asarray(rels)
    print(
        f"all: FISTA {tot['f_it']} iterations, {tot['f_cpu']:.2f} CPU s; SSNAL {tot['outer']} outer steps, "
        f"{tot['newton']} Newton steps, {tot['cg']} CG iterations, {tot['prox']} prox evaluations, "
        f"{tot['cert']} certificates, {tot['fail']} failed line searches, "
        f"{tot['s_cpu']:.2f} CPU s ({tot['f_cpu'] / tot['s_cpu']:.2f}x); (F_S - F_F)/|F_F| max {rels.max():+.2e}, "
        f"min {rels.min():+.2e}, > 0 at {int((rels > 0).sum())} of {rels.size}"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=None)
    ap.add_argument("--hard", type=int, default=None, help="this node's five slow grid points, warm and cold")
    ap.add_argument("--reps", type=int, default=1, help="repetitions per solve in --hard (CPU times averaged)")
    ap.add_argument("--tol", type=float, default=1e-7, help="SSNAL's certificate tolerance (FISTA: 1e-6)")
    ap.add_argument("--sigma0", type=float, default=10.0, help="the first sigma")
    ap.add_argument("--rho", type=float, default=2.0, help="sigma's growth per outer step")
    ap.add_argument("--sigma-max", type=float, default=3e3, help="sigma's cap")
    ap.add_argument("--eps0", type=float, default=10.0, help="the first inner tolerance on |grad phi|")
    ap.add_argument("--eps-rate", type=float, default=0.2, help="the inner tolerance's factor per outer step")
    ap.add_argument("--cg-rtol", type=float, default=0.01, help="CG's relative residual at most")
    a = ap.parse_args()
    from pgmflow.tasks.tesla import rollcall

    series, _, _ = rollcall.to_series(rollcall.read_pscl(), "rollcall")
    design = solver.tesla_design(series.X, series.tix, series.T)
    opts = {
        "tol": a.tol,
        "sigma0": a.sigma0,
        "rho": a.rho,
        "sigma_max": a.sigma_max,
        "eps0": a.eps0,
        "eps_rate": a.eps_rate,
        "cg_rtol": a.cg_rtol,
    }
    print(f"options {opts}; load average {os.getloadavg()}")
    if a.hard is not None:
        hard(design, a.hard, a.reps, **opts)
    if a.nodes:
        compare(design, a.nodes, series.T, **opts)
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()

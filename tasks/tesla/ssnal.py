"""A semismooth Newton augmented Lagrangian (SSNAL) solver for TESLA's per-node problem with one sample per
time point (the 109th Senate's shape: T=645 roll calls, one vote each), the first stage of ``solver.solve_path``.

The method is Li, Sun and Toh's (SIAM J. Optim. 28, 2018, "A highly efficient semismooth Newton augmented
Lagrangian method for solving Lasso problems"; and their fused-lasso follow-up), applied to the dual of
``min_theta h(A theta) + P(theta)``: ``(A theta)_t = theta^t . z_t`` the margin of time t's sample (``z_t`` = x_t with
the node's own entry 1), ``h(m) = sum_t w_t log(1 + exp(-2 y_t m_t))`` and ``P`` = lambda1 L1 (the field unpenalised)
+ lambda2 TV per column. The dual is ``min_{u, Z} h*(u) + P*(Z)`` s.t. ``A'u + Z = 0`` with one ``u_t`` per sample
(a time point without a weighted sample has ``u_t = 0``) and ``h*`` the sum of the logistic conjugates
``w_t (r log r + (1 - r) log(1 - r))``, ``r_t = -u_t y_t / (2 w_t)`` in (0, 1). The augmented Lagrangian method on
the dual, with multiplier ``theta`` and penalty ``sigma``, eliminates Z and minimises in u

    phi(u) = h*(u) - <u, A q> - P(q) - |q - theta|^2 / (2 sigma),   q = Prox_{sigma P}(theta - sigma A'u),
    grad phi(u) = grad h*(u) - A q,

then sets ``theta <- q`` (a proximal point step on the primal) and grows sigma. The inner problem is strongly
convex in u and is solved by semismooth Newton to ``|grad phi| <= eps_k``. The generalized Hessian is
``diag(h*'') + sigma A J A'`` with ``J`` the generalized Jacobian of the fused-lasso prox (per column: the average
over each non-zero segment of the prox's output, zero on its zero segments; every segment of the unpenalised
field), so ``A J A' = B diag(1/|S|) B'`` with B the segments' columns of Z. The Newton system is solved exactly
(Woodbury, Cholesky of a [segments, segments] matrix) up to ``max_direct`` segments, else by Jacobi-preconditioned
CG. The line search is a curved Armijo search on phi, from the unit step (from twice the last accepted step when
that was shorter: 9 % fewer evaluations of phi on the Senate): a step that would bring some ``r_t`` nearer 0 or 1 than
``KEEP`` of its distance is clipped component-wise (the logistic conjugate's domain); where phi's decrease falls
below its rounding, a step that cuts ``|grad phi|`` by ``gcut`` without raising phi is taken. The prox is
``pgmflow.tasks.tesla.prox``'s exact one, applied per column of a [p, T] layout.

The solve stops on ``solver._certify``'s test (the full problem's gradient-mapping norm at step 1/L: the same
test FISTA stops on), taken after an outer step that moved theta by at most ``skip * tol * sigma``. A solve that
is not certified within ``max_outer`` outer steps leaves its last iterate in theta, and ``solve_path`` continues
from there with FISTA. Every sum runs in a fixed order in float64, so a solve is a pure function of its inputs.
Measured in ``benchmarks/tesla_senate_ssnal.py`` and ``benchmarks/tesla_senate.py`` (docs/tesla.md).
"""

from __future__ import annotations

import functools
import math
import sys
from typing import NamedTuple

import numpy as np

from pgmflow.tasks import backend
from pgmflow.tasks.tesla import prox as _prox

_tv = _prox._tv1d  # bound to its dispatcher by _kernels()
_fz = _prox._fused_zero
_tvw = _prox._tv1d_warm

KEEP = 0.05  # a step keeps at least this fraction of each r_t's distance to 0 and to 1


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
        if state[j, T - 1] == 0:
            # Q[j] = 0 (the prox's record): its terms of uaq, l1 and tv are exact zeros, left out (the same sums)
            zero = True
            for t in range(T):
                zero &= th[j, t] == 0.0
            if not zero:
                for t in range(T):
                    dd += th[j, t] * th[j, t]
            continue
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
def _grad(ZT, y, w, Q, state, u, g, dg):
    """g = grad h*(u) - A Q (0 where w = 0), dg = h*''(u) (1 where w = 0); returns |g|. ``state`` is the record of the
    prox that gave Q (``state[j, T-1] == 0``: Q[j] = 0, whose exact-zero terms are left out)."""
    p, T = ZT.shape
    for t in range(T):
        g[t] = 0.0
    for j in range(p):
        if state[j, T - 1] == 0:
            continue
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
    ``stats`` [6] += (Newton steps, CG iterations, prox evaluations, line-search backtracks, failed line searches,
    mat-vec FLOPs of the Newton systems: 4 per segment entry and CG iteration, the Woodbury build and factor);
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
    gn = _grad(ZT, y, w, Q, state, u, g, dg)
    it = 0
    al0 = 1.0
    while gn > eps and it < max_it:
        it += 1
        nseg = _segments(Q, pen, sc, sa, sb)
        slen = 0
        for k in range(nseg):
            slen += sb[k] - sa[k] + 1
        if nseg <= max_direct and _direct(ZT, dg, sigma, sc, sa, sb, nseg, g, d):
            stats[5] += 8 * slen + nseg * nseg * nseg // 3
        else:
            rtol = min(cg_rtol, gn**0.2)
            ncg = _cg(ZT, dg, sigma, sc, sa, sb, nseg, g, d, rtol, max_cg)
            stats[1] += ncg
            stats[5] += ncg * (4 * slen + 10 * T)
        gd = 0.0
        for t in range(T):
            gd += g[t] * d[t]
        if not gd < 0.0:  # not a descent direction (CG breakdown): the scaled steepest descent
            gd = 0.0
            for t in range(T):
                d[t] = -g[t] / dg[t]
                gd += g[t] * d[t]
        al = al0  # the unit step, or twice the last accepted one if that was shorter
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
            gnn = _grad(ZT, y, w, Qn, state, un, g2, dg2)
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
            gn = _grad(ZT, y, w, Q, state, u, g, dg)
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
        al0 = 1.0 if al == al0 else min(1.0, 2.0 * al)
    stats[0] += it
    return gn


@functools.lru_cache(maxsize=None)
def _kernels():
    """Compile the kernels above (once per process; numba's on-disk cache serves later processes) after the prox
    kernels they call, which are bound to this module's names. Returns the inner solver's dispatcher."""
    k = _prox._kernels()
    bind = {"_tv": k.tv1d, "_fz": k.fused_zero, "_tvw": k.tv1d_warm}
    return backend.compile_kernels(sys.modules[__name__], bind=bind)["_ssn"]


class Solve(NamedTuple):
    """What one SSNAL solve did."""

    converged: bool  # certified: solver._certify's gradient-mapping norm <= tol
    gap: float  # the last certificate taken
    n_outer: int  # augmented Lagrangian steps
    n_newton: int  # semismooth Newton steps over all outer steps
    n_cg: int  # CG iterations (Newton systems with more than max_direct segments)
    n_prox: int  # evaluations of phi (one fused-lasso prox of every column each)
    n_back: int  # line-search backtracks
    n_fail: int  # inner solves ended by a line search without an acceptable step (rounding near convergence)
    flops: int  # mat-vec FLOPs: 6 p T per phi evaluation and its gradient, the Newton systems', 4 N p per certificate


class Options(NamedTuple):
    """The method's constants (``benchmarks/tesla_senate_ssnal.py`` tuned them on the 109th Senate).

    sigma: ``sigma0``, times ``rho`` per outer step, at most ``sigma_max``. The inner tolerance of outer step k:
    ``max(eps0 eps_rate^k, 1e-13)``. CG to relative residual ``min(cg_rtol, |grad phi|^0.2)``, at most ``max_cg``
    iterations; the exact solve up to ``max_direct`` segments. Line search: Armijo parameter ``mu``, the gradient
    test ``gcut``, at most ``max_back`` backtracks. The certificate is taken once an outer step moves theta by at
    most ``skip * tol * sigma``."""

    sigma0: float = 10.0
    rho: float = 2.0
    sigma_max: float = 3e3
    eps0: float = 10.0
    eps_rate: float = 0.2
    max_outer: int = 60
    max_newton: int = 200
    max_cg: int = 500
    cg_rtol: float = 0.01
    max_direct: int = 150
    mu: float = 0.3
    gcut: float = 0.7
    max_back: int = 30
    skip: float = 3.0


def applicable(design, q: int, lam2: float) -> bool:
    """Whether SSNAL solves this problem: the fused (q = 1) penalty with lambda2 > 0 and at most one row per
    time point (a TESLA design at one sample per time point; KELLER and static are lambda2 = 0)."""
    return q == 1 and lam2 > 0.0 and design.kind == "tesla" and bool(np.all(design.hi - design.lo <= 1))


def solve(design, node: int, lam1: float, lam2: float, theta, tol: float, certify, opts: Options | None = None):
    """SSNAL on node ``node``'s problem from ``theta`` ([T, p], overwritten with the last iterate) until the gap of
    ``certify`` (``solver._certify``'s compiled kernel) <= ``tol`` or ``opts.max_outer`` outer steps. ``design`` is
    the node's own (``solver.node_design``) and :func:`applicable`; the certificate's L is FISTA's, ``max_t L_t``."""
    ssn = _kernels()
    opts = Options() if opts is None else opts
    T, p = design.T, design.p
    has = design.hi > design.lo  # [T] time points with a sample
    w = np.zeros(T)
    w[has] = design.w[design.woff[has]]
    Z = np.zeros((T, p))
    Z[has] = design.X[design.lo[has]]
    y = Z[:, node].copy()
    Z[:, node] = 1.0
    Z[w == 0.0] = 0.0  # a sample without weight has no dual variable (u_t = 0) and no margin
    ZT = np.ascontiguousarray(Z.T)
    pen = np.ones(p, np.bool_)
    pen[node] = False
    L = float(design.L.max())
    # u = grad h(A theta): r_t = sigmoid(-2 y_t m_t), u_t = -2 w_t y_t r_t
    m = np.einsum("tj,tj->t", Z, theta)
    r = np.clip(0.5 * (1.0 - np.tanh(y * m)), 1e-300, 1.0 - 1e-16)
    u = np.where(w > 0, -2.0 * w * y * r, 0.0)
    thT = np.ascontiguousarray(theta.T)
    Q = np.empty_like(thT)
    state = np.zeros((p, T), np.int8)
    stats = np.zeros(6)
    allc, viol = np.ones(p, np.bool_), np.zeros(p, np.bool_)
    n_rows = int(np.count_nonzero(w))
    args = (design.X, node, design.lo, design.hi, design.woff, design.w, float(lam1), float(lam2), 1, L, pen)
    gap = float(certify(*args, theta, allc, viol))
    flops = 4 * n_rows * p
    sigma = float(opts.sigma0)
    n_outer = 0
    while gap > tol and n_outer < opts.max_outer:
        eps = max(opts.eps0 * opts.eps_rate**n_outer, 1e-13)
        ssn(ZT, y, w, pen, float(lam1), float(lam2), sigma, thT, u, Q, state, eps, opts.max_newton, opts.max_cg,
            opts.cg_rtol, opts.max_direct, opts.mu, opts.gcut, opts.max_back, stats)  # fmt: skip
        n_outer += 1
        move = float(np.abs(Q - thT).max()) / sigma  # the proximal term's part of the new point's residual
        thT[:] = Q
        if move <= opts.skip * tol or n_outer == opts.max_outer:
            theta[:] = thT.T  # the [T, p] layout only where the certificate reads it
            gap = float(certify(*args, theta, allc, viol))
            flops += 4 * n_rows * p
        sigma = min(sigma * opts.rho, opts.sigma_max)
    theta[:] = thT.T
    n_newton, n_cg, n_prox, n_back, n_fail, f_newton = (int(s) for s in stats)
    flops += 6 * p * T * n_prox + f_newton
    return Solve(gap <= tol, gap, n_outer, n_newton, n_cg, n_prox, n_back, n_fail, int(flops))

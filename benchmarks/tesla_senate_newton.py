"""Issue 36: a proximal Newton solver for TESLA's per-node problem, prototyped on the 109th Senate (T=645, p=100,
one sample per time point) against the pipeline's FISTA solver (``solver.solve_path``).

    .venv/bin/python benchmarks/tesla_senate_newton.py --nodes 0 44 99
    .venv/bin/python benchmarks/tesla_senate_newton.py --check        # the weighted fused-lasso kernel

The method (newGLMNET's scheme, Yuan, Ho and Lin 2012, with the fused penalty). With one sample per time point the
loss at time t depends on theta^t only through the margin ``m_t = theta^t . z_t``; its Hessian is rank one,
``h_t z_t z_t'`` with ``h_t = 4 w_t sigmoid(u_t) sigmoid(-u_t)``. Each outer step replaces the loss by its quadratic
model at the current point and minimises the model plus ``lambda1 |.|_1 + lambda2 TV`` approximately by cyclic
block coordinate descent over the columns: a column's model is separable over time with weights ``h_t z_tj^2``, so
its block step is a weighted 1-D fused lasso, solved exactly by a dynamic programme (:func:`_wfl`: the derivative of
the forward message is piecewise linear; Johnson 2013, with the L1 kinks kept as one knot at 0). Columns that are
zero and pass the KKT zero test at the outer point (``prox._fused_zero`` of the negative gradient) are skipped.
The step is then line-searched on the true objective (Armijo, sigma 0.01). The outer loop stops on the pipeline's
own test (``solver._certify``: the gradient-mapping norm of one full prox-gradient step with step 1/L, <= tol),
so both solvers stop on the same criterion and are compared on objectives, BIC choices and neighbour sets
(the optimum is not unique: docs/tesla.md, issue 36).

``--segment`` adds after each step a Newton-CG step on the values of the fused segments (pattern held fixed:
:func:`_seg_newton`). Measured (``benchmarks/results/tesla-senate109-cpu-2core-epyc-issue36-newton.md``): 1.15x
without it, 1.99x with it at FISTA's tolerance (objectives up to 1e-9 relative above FISTA's), 1.76x at
``--tol 2e-7`` (objectives as good); not adopted.

CPU seconds are ``time.process_time`` of each lambda1 path (warm-started downwards, as ``path_tasks.fit_node``),
both solvers in the same process, alternating per path.
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

_fz = _prox._fused_zero  # bound to its dispatcher by _kernels()

LAM1 = (0.32, 0.16, 0.08, 0.04, 0.02)
LAM2 = (2.0, 1.0, 0.5, 0.25, 0.125)
EPS = 1e-9  # proximal damping added to every block weight: keeps the DP's slopes positive, moves no fixed point


@backend.kernel(cache=True, nogil=True)
def _wfl(W, B, lam1, lam2, x, kpos, kda, kdb, xm, xp):
    """x [n] = argmin sum_t (W_t x_t^2 / 2 + B_t x_t + lam1 |x_t|) + lam2 sum_t |x_t - x_{t-1}|, W_t > 0, lam2 > 0.

    Forward pass over the derivative of the message ``delta_t`` (increasing, piecewise linear, with jumps): a deque
    of knots (``kpos`` position, ``kda``/``kdb`` the slope and intercept added right of it; scratch of 4n + 4)
    between the leftmost piece (aL, bL) and the rightmost (aR, bR), and the L1 kinks of all time points as one knot
    at 0 of jump ``J0``. At t the crossings of -lam2 (from the left) and +lam2 (from the right) are ``xm[t]``,
    ``xp[t]``; the message is clipped to [-lam2, lam2] outside them. Back: ``x_t = clip(x_{t+1}, xm[t], xp[t])``.
    """
    n = W.shape[0]
    head = 2 * n + 2
    tail = head
    aL = 0.0
    bL = 0.0
    aR = 0.0
    bR = 0.0
    J0 = 0.0
    for t in range(n):
        aL += W[t]
        aR += W[t]
        bL += B[t] - lam1
        bR += B[t] + lam1
        J0 += 2.0 * lam1
        if t == n - 1:
            break
        # crossing of -lam2, scanning from the left
        c = -lam2
        a = aL
        b = bL
        while True:
            pk = kpos[head] if head < tail else np.inf
            usez = J0 != 0.0 and 0.0 <= pk
            pos = 0.0 if usez else pk
            if pos == np.inf:
                xv = (c - b) / a
                break
            if a * pos + b >= c:
                xv = min((c - b) / a, pos)
                break
            if usez:
                b += J0
                J0 = 0.0
            else:
                a += kda[head]
                b += kdb[head]
                head += 1
            if a * pos + b >= c:
                xv = pos
                break
        xm[t] = xv
        head -= 1
        kpos[head] = xv
        kda[head] = a
        kdb[head] = b - c
        aL = 0.0
        bL = c
        # crossing of +lam2, scanning from the right
        c = lam2
        a = aR
        b = bR
        while True:
            pk = kpos[tail - 1] if head < tail else -np.inf
            usez = J0 != 0.0 and 0.0 >= pk
            pos = 0.0 if usez else pk
            if pos == -np.inf:
                xv = (c - b) / a
                break
            if a * pos + b <= c:
                xv = max((c - b) / a, pos)
                break
            if usez:
                b -= J0
                J0 = 0.0
            else:
                tail -= 1
                a -= kda[tail]
                b -= kdb[tail]
            if a * pos + b <= c:
                xv = pos
                break
        xp[t] = xv
        kpos[tail] = xv
        kda[tail] = -a
        kdb[tail] = c - b
        tail += 1
        aR = 0.0
        bR = c
    # the last point: the crossing of 0 of the full derivative
    c = 0.0
    a = aL
    b = bL
    while True:
        pk = kpos[head] if head < tail else np.inf
        usez = J0 != 0.0 and 0.0 <= pk
        pos = 0.0 if usez else pk
        if pos == np.inf:
            xv = (c - b) / a
            break
        if a * pos + b >= c:
            xv = min((c - b) / a, pos)
            break
        if usez:
            b += J0
            J0 = 0.0
        else:
            a += kda[head]
            b += kdb[head]
            head += 1
        if a * pos + b >= c:
            xv = pos
            break
    x[n - 1] = xv
    for t in range(n - 2, -1, -1):
        xv = min(max(xv, xm[t]), xp[t])
        x[t] = xv


@backend.kernel(cache=True, nogil=True)
def _state(Z, y, w, theta, m, c, h):
    """Margins ``m_t = theta^t . z_t``, loss derivatives ``c_t = dl/dm`` and curvatures ``h_t``; returns the loss
    ``sum_t w_t log(1 + exp(-2 y_t m_t))``."""
    T, p = Z.shape
    loss = 0.0
    for t in range(T):
        s = 0.0
        for j in range(p):
            s += theta[t, j] * Z[t, j]
        m[t] = s
        u = 2.0 * y[t] * s
        if w[t] == 0.0:
            c[t] = 0.0
            h[t] = 0.0
            continue
        e = math.exp(-abs(u))
        if u > 0:
            sm = e / (1.0 + e)  # sigmoid(-u)
            loss += w[t] * math.log1p(e)
        else:
            sm = 1.0 / (1.0 + e)
            loss += w[t] * (-u + math.log1p(e))
        c[t] = -2.0 * y[t] * w[t] * sm
        h[t] = 4.0 * w[t] * sm * (1.0 - sm)
    return loss


@backend.kernel(cache=True, nogil=True)
def _loss_at(Z, y, w, theta):
    T, p = Z.shape
    loss = 0.0
    for t in range(T):
        if w[t] == 0.0:
            continue
        s = 0.0
        for j in range(p):
            s += theta[t, j] * Z[t, j]
        u = 2.0 * y[t] * s
        e = math.exp(-abs(u))
        loss += w[t] * (math.log1p(e) if u > 0 else -u + math.log1p(e))
    return loss


@backend.kernel(cache=True, nogil=True)
def _penalty(theta, lam1, lam2, penalized):
    T, p = theta.shape
    s1 = 0.0
    s2 = 0.0
    for j in range(p):
        for t in range(T):
            if penalized[j]:
                s1 += abs(theta[t, j])
            if t > 0:
                s2 += abs(theta[t, j] - theta[t - 1, j])
    return lam1 * s1 + lam2 * s2


@backend.kernel(cache=True, nogil=True)
def _active(ZT, c, lam1, lam2, penalized, theta, act, ycol):
    """act[j] = column j is non-zero or fails the zero test (KKT) at the gradient ``c_t z_tj``; returns the count."""
    p, T = ZT.shape
    k = 0
    for j in range(p):
        nz = not penalized[j]
        if not nz:
            for t in range(T):
                if theta[t, j] != 0.0:
                    nz = True
                    break
        if not nz:
            for t in range(T):
                ycol[t] = -c[t] * ZT[j, t]
            nz = not _fz(ycol, lam1, lam2)
        act[j] = nz
        k += 1 if nz else 0
    return k


@backend.kernel(cache=True, nogil=True)
def _inner(ZT, c, h, lam1, lam2, penalized, act, thT, s, max_sweeps, tol, scratch):
    """Cyclic block coordinate descent on the quadratic model over the active columns; ``thT`` [p, T] the
    iterate (by column), ``s`` [T] its margin change from the outer point. Stops when a sweep moves no
    coefficient by more than ``tol`` (scaled by sqrt of its curvature). Returns the sweeps."""
    p, T = ZT.shape
    W = scratch[0]
    B = scratch[1]
    xn = scratch[2]
    xm = scratch[3]
    xp = scratch[4]
    kpos = np.empty(4 * T + 4)
    kda = np.empty(4 * T + 4)
    kdb = np.empty(4 * T + 4)
    sweeps = 0
    while sweeps < max_sweeps:
        sweeps += 1
        dmax = 0.0
        for j in range(p):
            if not act[j]:
                continue
            zj = ZT[j]
            th = thT[j]
            for t in range(T):
                z = zj[t]
                wt = h[t] * z * z + EPS
                W[t] = wt
                B[t] = (c[t] + h[t] * s[t]) * z - wt * th[t]
            _wfl(W, B, lam1 if penalized[j] else 0.0, lam2, xn, kpos, kda, kdb, xm, xp)
            for t in range(T):
                d = xn[t] - th[t]
                if d != 0.0:
                    s[t] += zj[t] * d
                    th[t] = xn[t]
                    dmax = max(dmax, abs(d) * math.sqrt(W[t]))
        if dmax <= tol:
            break
    return sweeps


@backend.kernel(cache=True, nogil=True)
def _segments(theta, penalized, act, sc, sa, sb):
    """The fused segments of the active columns: maximal runs of one value, the zero runs of penalised columns
    left out (held at 0). ``sc``/``sa``/``sb`` [p T] receive each segment's column, first and last time point;
    returns their count."""
    T, p = theta.shape
    k = 0
    for j in range(p):
        if not act[j]:
            continue
        a = 0
        for t in range(1, T + 1):
            if t == T or theta[t, j] != theta[t - 1, j]:
                if not (penalized[j] and theta[a, j] == 0.0):
                    sc[k] = j
                    sa[k] = a
                    sb[k] = t - 1
                    k += 1
                a = t
    return k


@backend.kernel(cache=True, nogil=True)
def _hv(ZT, h, sc, sa, sb, nseg, v, md, out):
    """out = B' diag(h) B v over the segments (B: a segment's column of Z on its time points)."""
    T = h.shape[0]
    for t in range(T):
        md[t] = 0.0
    for k in range(nseg):
        zj = ZT[sc[k]]
        vk = v[k]
        for t in range(sa[k], sb[k] + 1):
            md[t] += zj[t] * vk
    for t in range(T):
        md[t] *= h[t]
    for k in range(nseg):
        zj = ZT[sc[k]]
        s = 0.0
        for t in range(sa[k], sb[k] + 1):
            s += zj[t] * md[t]
        out[k] = s


@backend.kernel(cache=True, nogil=True)
def _seg_newton(ZT, c, h, theta, penalized, lam1, lam2, sc, sa, sb, nseg, max_cg, rtol, mu, d):
    """The Newton direction on the segment values: ``(B' H B + mu D) d = -g`` by Jacobi-preconditioned CG
    (``g`` the objective's gradient on the pattern: loss, L1 with its signs, TV with its jump signs; ``D`` the
    Jacobi diagonal, ``mu`` 1e-8). Returns ``(cg iterations, g . d)``."""
    p, T = ZT.shape
    g = np.empty(nseg)
    dg = np.empty(nseg)
    for k in range(nseg):
        j = sc[k]
        zj = ZT[j]
        a, b = sa[k], sb[k]
        v = theta[a, j]
        s = 0.0
        q = 0.0
        for t in range(a, b + 1):
            s += c[t] * zj[t]
            q += h[t] * zj[t] * zj[t]
        if penalized[j]:
            s += lam1 * (b - a + 1) * (1.0 if v > 0 else -1.0)
        if a > 0:
            e = v - theta[a - 1, j]
            s += lam2 * (1.0 if e > 0 else -1.0)
        if b < T - 1:
            e = v - theta[b + 1, j]
            s += lam2 * (1.0 if e > 0 else -1.0)
        g[k] = s
        dg[k] = q + EPS
    r = np.empty(nseg)
    z = np.empty(nseg)
    pv = np.empty(nseg)
    Ap = np.empty(nseg)
    md = np.empty(T)
    rz = 0.0
    r0 = 0.0
    for k in range(nseg):
        d[k] = 0.0
        r[k] = -g[k]
        z[k] = r[k] / dg[k]
        pv[k] = z[k]
        rz += r[k] * z[k]
        r0 += r[k] * r[k]
    it = 0
    while it < max_cg:
        it += 1
        _hv(ZT, h, sc, sa, sb, nseg, pv, md, Ap)
        pAp = 0.0
        for k in range(nseg):
            Ap[k] += mu * dg[k] * pv[k]
            pAp += pv[k] * Ap[k]
        if pAp <= 0.0:
            break
        al = rz / pAp
        rr = 0.0
        for k in range(nseg):
            d[k] += al * pv[k]
            r[k] -= al * Ap[k]
            rr += r[k] * r[k]
        if rr <= rtol * rtol * r0:
            break
        rzn = 0.0
        for k in range(nseg):
            z[k] = r[k] / dg[k]
            rzn += r[k] * z[k]
        be = rzn / rz
        rz = rzn
        for k in range(nseg):
            pv[k] = z[k] + be * pv[k]
    gd = 0.0
    for k in range(nseg):
        gd += g[k] * d[k]
    return it, gd


@backend.kernel(cache=True, nogil=True)
def _seg_step(theta, penalized, sc, sa, sb, nseg, d, alpha, out):
    """out = theta moved by alpha d on the segments; a penalised segment whose sign would flip stops at 0."""
    T, p = theta.shape
    for t in range(T):
        for j in range(p):
            out[t, j] = theta[t, j]
    for k in range(nseg):
        j = sc[k]
        v = theta[sa[k], j]
        nv = v + alpha * d[k]
        if penalized[j] and nv * v < 0.0:
            nv = 0.0
        for t in range(sa[k], sb[k] + 1):
            out[t, j] = nv
    return 0


@functools.lru_cache(maxsize=None)
def _kernels():
    bind = {"_fz": _prox._kernels().fused_zero}
    return backend.compile_kernels(sys.modules[__name__], bind=bind)


def wfl(W, B, lam1, lam2):
    """Python entry to :func:`_wfl` (tests)."""
    k = _kernels()
    n = len(W)
    x = np.empty(n)
    k["_wfl"](
        np.asarray(W, float), np.asarray(B, float), float(lam1), float(lam2), x, *(np.empty(4 * n + 4) for _ in range(3)),
        np.empty(n), np.empty(n),
    )  # fmt: skip
    return x


class Result:
    def __init__(self, theta, n_outer, n_sweeps, converged, objective, gap, n_cg):
        self.theta, self.n_outer, self.n_sweeps, self.n_cg = theta, n_outer, n_sweeps, n_cg
        self.converged, self.objective, self.gap = converged, objective, gap


def solve_newton(
    design,
    node,
    lam1,
    lam2,
    theta0=None,
    tol=1e-6,
    max_outer=500,
    max_sweeps=50,
    inner_rel=0.1,
    segment=False,
    max_cg=100,
    cg_rtol=1e-3,
    mu=1e-3,
):
    """Proximal Newton from ``theta0`` until ``solver._certify``'s gap <= tol (one sample per time point, lam2 > 0)."""
    k = _kernels()
    solver._kernels()
    d = solver.node_design(design, node)
    T, p = d.T, d.p
    if not np.all(d.hi - d.lo == 1) or lam2 <= 0:
        raise ValueError("the prototype needs one sample per time point and lambda2 > 0")
    rows = d.lo
    Z = d.X[rows].astype(np.float64)
    y = Z[:, node].copy()
    Z[:, node] = 1.0
    ZT = np.ascontiguousarray(Z.T)
    w = d.w[d.woff].copy()
    pen = np.ones(p, np.bool_)
    pen[node] = False
    L = float(d.L.max())
    theta = np.zeros((T, p)) if theta0 is None else np.array(theta0, dtype=np.float64, order="C", copy=True)
    m, c, h = np.empty(T), np.empty(T), np.empty(T)
    act = np.zeros(p, np.bool_)
    scratch = np.empty((5, T))
    ycol = np.empty(T)
    allc, viol = np.ones(p, np.bool_), np.zeros(p, np.bool_)
    n_outer = n_sweeps = n_cg = 0
    sc, sa, sb = (np.empty(T * p, np.int64) for _ in range(3))
    gap = math.inf
    loss = k["_state"](Z, y, w, theta, m, c, h)
    pnow = k["_penalty"](theta, lam1, lam2, pen)
    while n_outer < max_outer:
        gap = solver._certify(d.X, node, d.lo, d.hi, d.woff, d.w, lam1, lam2, 1, L, pen, theta, allc, viol)
        if gap <= tol:
            break
        n_outer += 1
        k["_active"](ZT, c, lam1, lam2, pen, theta, act, ycol)
        thT = np.ascontiguousarray(theta.T)
        s = np.zeros(T)
        n_sweeps += k["_inner"](
            ZT, c, h, lam1, lam2, pen, act, thT, s, max_sweeps, inner_rel * gap / math.sqrt(L), scratch
        )
        D = thT.T - theta
        pnew = k["_penalty"](thT.T.copy(), lam1, lam2, pen)
        delta = float(c @ s) + pnew - pnow
        f0 = loss + pnow
        alpha = 1.0
        while True:
            cand = theta + alpha * D
            pc = k["_penalty"](cand, lam1, lam2, pen)
            fc = k["_loss_at"](Z, y, w, cand) + pc
            if fc <= f0 + 0.01 * alpha * delta or alpha < 1e-10:
                break
            alpha *= 0.5
        theta = cand
        loss = k["_state"](Z, y, w, theta, m, c, h)
        pnow = k["_penalty"](theta, lam1, lam2, pen)
        if segment:
            nseg = k["_segments"](theta, pen, allc, sc, sa, sb)
            dv = np.empty(nseg)
            it, gd = k["_seg_newton"](ZT, c, h, theta, pen, lam1, lam2, sc, sa, sb, nseg, max_cg, cg_rtol, mu, dv)
            n_cg += it
            if gd < 0.0:
                f0 = loss + pnow
                alpha = 1.0
                cand = np.empty_like(theta)
                while alpha > 1e-10:
                    k["_seg_step"](theta, pen, sc, sa, sb, nseg, dv, alpha, cand)
                    pc = k["_penalty"](cand, lam1, lam2, pen)
                    fc = k["_loss_at"](Z, y, w, cand) + pc
                    if fc <= f0 + 1e-4 * alpha * gd:
                        theta = cand
                        loss = k["_state"](Z, y, w, theta, m, c, h)
                        pnow = k["_penalty"](theta, lam1, lam2, pen)
                        break
                    alpha *= 0.5
    obj = solver.objective(d, node, theta, lam1, lam2)
    return Result(theta, n_outer, n_sweeps, gap <= tol, obj, gap, n_cg)


def check():
    """The DP against the unweighted prox (W = 1) and against a long FISTA run on random weighted instances."""
    rng = np.random.default_rng(0)
    worst = 0.0
    for _ in range(200):
        n = int(rng.integers(1, 40))
        B = rng.normal(size=n) * 2
        lam1, lam2 = rng.choice([0.0, 0.3, 1.0]), float(rng.choice([0.1, 0.5, 2.0]))
        x = wfl(np.ones(n), B, lam1, lam2)
        ref = np.sign(v := _prox.tv_denoise_1d(-B, lam2)) * np.maximum(np.abs(v) - lam1, 0)
        worst = max(worst, float(np.abs(x - ref).max()))
    print(f"W = 1 against soft(tv): max |difference| {worst:.2e}")

    def fobj(W, B, lam1, lam2, x):
        return float(0.5 * W @ x**2 + B @ x + lam1 * np.abs(x).sum() + lam2 * np.abs(np.diff(x)).sum())

    worst = 0.0
    for _ in range(40):
        n = int(rng.integers(2, 30))
        W = rng.uniform(0.01, 1.0, n) * (rng.random(n) < 0.8) + 1e-3
        B = rng.normal(size=n)
        lam1, lam2 = float(rng.choice([0.0, 0.2, 0.6])), float(rng.choice([0.1, 0.5, 1.5]))
        x = wfl(W, B, lam1, lam2)
        # reference: FISTA with the exact unweighted prox, step 1/max W
        Lw = W.max()
        z = np.zeros(n)
        yv = z.copy()
        tk = 1.0
        for _ in range(30000):
            g = W * yv + B
            v = _prox.tv_denoise_1d(yv - g / Lw, lam2 / Lw)
            zn = np.sign(v) * np.maximum(np.abs(v) - lam1 / Lw, 0)
            tn = 0.5 * (1 + math.sqrt(1 + 4 * tk * tk))
            yv = zn + (tk - 1) / tn * (zn - z)
            z, tk = zn, tn
        worst = max(worst, fobj(W, B, lam1, lam2, x) - fobj(W, B, lam1, lam2, z))
    print(f"weighted, against FISTA: max F(dp) - F(fista) {worst:.2e} (<= ~0 is right)")


def bic(loglik, df, T):
    return -2.0 * loglik + math.log(T) * df


def compare(design, nodes, T, **opts):
    from pgmflow.tasks.tesla import evaluate

    solver.solve_path(design, 0, 0.3, 0.1)
    solve_newton(design, 0, 0.3, 0.1, **opts)
    tot = {"f_cpu": 0.0, "n_cpu": 0.0, "f_it": 0, "n_outer": 0, "n_sweeps": 0, "n_cg": 0}
    worst_rel = -math.inf
    print("node lam2   lam1 | FISTA it  CPU s | Newton outer sweeps  CPU s | (F_N - F_F)/F_F | nbrs F N differ")
    for node in nodes:
        best = {"F": None, "N": None}
        nb = {}
        ncpu_node = fcpu_node = 0.0
        for b, lam2 in enumerate(LAM2):
            thF = thN = None
            fits = []
            for a, lam1 in enumerate(LAM1):
                t0 = time.process_time()
                rF = solver.solve_path(design, node, lam1, lam2, theta0=thF)
                t1 = time.process_time()
                rN = solve_newton(design, node, lam1, lam2, theta0=thN, **opts)
                t2 = time.process_time()
                thF, thN = rF.theta, rN.theta
                fits.append((a, lam1, rF, rN, t1 - t0, t2 - t1))
            for a, lam1, rF, rN, cf, cn in fits:
                tot["f_cpu"] += cf
                tot["n_cpu"] += cn
                fcpu_node += cf
                ncpu_node += cn
                tot["f_it"] += rF.n_iter
                tot["n_outer"] += rN.n_outer
                tot["n_sweeps"] += rN.n_sweeps
                tot["n_cg"] += rN.n_cg
                rel = (rN.objective - rF.objective) / abs(rF.objective)
                worst_rel = max(worst_rel, rel)
                eF = np.any(np.delete(rF.theta, node, axis=1) != 0, axis=0)
                eN = np.any(np.delete(rN.theta, node, axis=1) != 0, axis=0)
                nb[(a, b)] = (eF, eN)
                for key, r in (("F", rF), ("N", rN)):
                    ll = float(solver.row_loglik(design.X, design.tix, node, r.theta)[design.X[:, node] != 0].sum())
                    sc = bic(ll, evaluate.path_df(r.theta, node), T)
                    if best[key] is None or sc < best[key][0]:
                        best[key] = (sc, a, b)
                print(
                    f"{node:4d} {lam2:5.3f} {lam1:5.2f} | {rF.n_iter:8d} {cf:6.2f} | {rN.n_outer:12d} {rN.n_sweeps:6d} "
                    f"{cn:6.2f} | {rel:+.2e}{'' if rN.converged else ' (not certified)'} | {int(eF.sum()):3d} "
                    f"{int(eN.sum()):3d} {int((eF != eN).sum()):3d}",
                    flush=True,
                )
        (_, aF, bF), (_, aN, bN) = best["F"], best["N"]
        eF, eN = nb[(aF, bF)][0], nb[(aN, bN)][1]
        print(
            f"node {node}: CPU s FISTA {fcpu_node:.1f}, Newton {ncpu_node:.1f} ({fcpu_node / ncpu_node:.2f}x); "
            f"BIC choice (lambda1, lambda2) FISTA ({LAM1[aF]}, {LAM2[bF]}), Newton ({LAM1[aN]}, {LAM2[bN]}); "
            f"neighbours there {int(eF.sum())} and {int(eN.sum())}, differing {int((eF != eN).sum())}",
            flush=True,
        )
    print(
        f"all: FISTA {tot['f_it']} iterations, {tot['f_cpu']:.1f} CPU s; Newton {tot['n_outer']} outer steps, "
        f"{tot['n_sweeps']} sweeps, {tot['n_cg']} CG iterations, {tot['n_cpu']:.1f} CPU s ({tot['f_cpu'] / tot['n_cpu']:.2f}x); "
        f"worst (F_N - F_F)/F_F {worst_rel:+.2e}"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[0, 44, 99])
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--max-sweeps", type=int, default=50, help="inner sweeps per Newton step at most")
    ap.add_argument("--inner-rel", type=float, default=0.1, help="inner tolerance: this times the outer gap")
    ap.add_argument("--tol", type=float, default=1e-6, help="the Newton solver's certificate tolerance (FISTA: 1e-6)")
    ap.add_argument("--segment", action="store_true", help="a Newton-CG step on the segment values after each step")
    a = ap.parse_args()
    if a.check:
        check()
        return
    from pgmflow.tasks.tesla import rollcall

    series, _, _ = rollcall.to_series(rollcall.read_pscl(), "rollcall")
    design = solver.tesla_design(series.X, series.tix, series.T)
    opts = {"max_sweeps": a.max_sweeps, "inner_rel": a.inner_rel, "segment": a.segment, "tol": a.tol}
    print(f"options {opts}; load average {os.getloadavg()}")
    compare(design, a.nodes, series.T, **opts)
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()

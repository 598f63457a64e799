"""Issue 36: two levers measured on the 109th Senate (T=645, p=100, one sample per time point) and NOT adopted:
a working set of columns (the premise: most columns are zero at every t) and block coordinate descent over the
columns (a prototype kept here, with its kernel, so that the figures in
``benchmarks/results/tesla-senate109-cpu-2core-epyc-issue36-workingset.md`` can be reproduced).

    .venv/bin/python benchmarks/tesla_senate_bcd.py --active --nodes 0 44 99     # working-set premise
    .venv/bin/python benchmarks/tesla_senate_bcd.py --bcd --nodes 44               # BCD against FISTA
    .venv/bin/python benchmarks/tesla_senate_bcd.py --unique --nodes 44            # how unique the optimum is

``--active``: for every grid point of the nodes (the pipeline's warm-started lambda1 paths), how many of the
p - 1 = 99 coefficient columns are non-zero at some time point (what a column working set would have to keep),
and the share of non-zero coefficients. ``--bcd``: from the path's warm start at (lambda1 0.08, lambda2 0.125),
the objective gap after k sweeps of block coordinate descent (below), its CPU seconds, and FISTA's.
``--unique``: the same grid point solved by FISTA (the pipeline's solver) and by BCD run to the same certified
tolerance (the full solver's stopping test): objectives, largest coefficient difference, support differences.

Block coordinate descent (the prototype): the penalty is separable over columns and a column's loss curvature is
diagonal over time and at most ``c_j = max_t sum_d w_{t,d} z_{d,j}^2 <= 1`` (``l'' <= 1``), so
``theta_{.j} <- prox_{1/c_j}(theta_{.j} - g_{.j} / c_j)`` (exact fused-lasso prox) never raises the objective
(Tseng and Yun 2009). The margins and loss derivatives of the terms whose time point moved are updated after each
column (exponentials by ``fastexp``), so a sweep costs about one FISTA iteration.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from pgmflow.tasks import backend  # noqa: E402
from pgmflow.tasks import fastexp as _fastexp  # noqa: E402
from pgmflow.tasks.tesla import prox as _prox  # noqa: E402
from pgmflow.tasks.tesla import solver  # noqa: E402

# bound to the other modules' dispatchers by _kernels() (backend.compile_kernels)
_cexp = _fastexp._capped_exp_nb
_tv = _prox._tv1d
_fz = _prox._fused_zero
_tvw = _prox._tv1d_warm


@backend.kernel(cache=True, nogil=True)
def _curvature(XT, node, lo, hi, woff, w, c):
    """c[j] = max_t sum_{d in W_t} w_{t,d} z_{d,j}^2 (``XT`` [p, N] the samples by column)."""
    p = XT.shape[0]
    T = lo.shape[0]
    for j in range(p):
        cm = 0.0
        xj = XT[j]
        for t in range(T):
            off = woff[t] - lo[t]
            s = 0.0
            for d in range(lo[t], hi[t]):
                z = 1.0 if j == node else float(xj[d])
                s += w[off + d] * z * z
            cm = max(cm, s)
        c[j] = cm


@backend.kernel(cache=True, nogil=True)
def _derivs(n, w, u, r, tmp, idx):
    """``r_e = w_e sigmoid(-u_e)`` for the ``n`` terms listed in ``idx``, ``tmp[k] = -|u|`` of term ``idx[k]``
    (the loss derivative in the margin is ``-2 y_d r_e``); ``sigmoid(-u) = e / (1 + e)`` (u > 0) or
    ``1 / (1 + e)``, ``e = exp(-|u|)``."""
    _cexp(tmp[:n], 0.0)
    for k in range(n):
        e = idx[k]
        ex = tmp[k]
        r[e] = w[e] * (ex if u[e] > 0.0 else 1.0) / (1.0 + ex)


@backend.kernel(cache=True, nogil=True)
def _bcd(XT, yrow, node, lo, hi, woff, w, lam1, lam2, penalized, c, theta, max_sweeps, tol):
    """Sweep the columns of ``theta`` [T, p] (overwritten) until a sweep moves no coefficient by more
    than ``tol / c_j``; returns ``(sweeps, converged)``. ``XT`` [p, N] int8 the samples by column,
    ``yrow`` [N] float64 the node's values ``y_d``, ``c`` [p] the block curvature bounds."""
    T, p = theta.shape
    nt = w.shape[0]
    u = np.zeros(nt)  # signed margins 2 y_d theta^t . z_d
    r = np.zeros(nt)  # w_e sigmoid(-u_e): the loss derivative in m is -2 y_d r_e
    tmp = np.empty(nt)
    idx = np.empty(nt, np.int64)
    n = 0
    for t in range(T):
        off = woff[t] - lo[t]
        for d in range(lo[t], hi[t]):
            e = off + d
            if w[e] == 0.0:
                continue
            m = 0.0
            for j in range(p):
                z = 1.0 if j == node else float(XT[j, d])
                m += theta[t, j] * z
            u[e] = 2.0 * yrow[d] * m
            tmp[n] = -abs(u[e])
            idx[n] = e
            n += 1
    _derivs(n, w, u, r, tmp, idx)
    state = np.zeros((p, T), np.int8)  # per column: TV jump signs of its last prox, [T-1] its last output non-zero
    for j in range(p):
        nzj = False
        for t in range(T):
            nzj |= theta[t, j] != 0.0
        state[j, T - 1] = 1 if nzj else 0
    ycol = np.empty(T)
    xcol = np.empty(T)
    sweeps = 0
    converged = False
    while sweeps < max_sweeps:
        sweeps += 1
        dmax = 0.0
        for j in range(p):
            cj = c[j]
            if cj <= 0.0:
                continue  # no data in this column: only the penalty, met by its current value
            xj = XT[j]
            inv = 1.0 / cj
            for t in range(T):
                off = woff[t] - lo[t]
                g = 0.0
                if j == node:
                    for d in range(lo[t], hi[t]):
                        g -= 2.0 * yrow[d] * r[off + d]
                else:
                    for d in range(lo[t], hi[t]):
                        g -= 2.0 * yrow[d] * r[off + d] * xj[d]
                ycol[t] = theta[t, j] - inv * g
            sj = state[j]
            pen = penalized[j] and lam1 > 0.0
            l1 = inv * lam1
            l2 = inv * lam2
            if pen and sj[T - 1] == 0 and _fz(ycol, l1, l2):
                continue  # zero, and stays zero
            if l2 > 0.0 and T > 1:
                if not _tvw(ycol, l2, sj, xcol):
                    _tv(ycol, l2, xcol)
                    for t in range(T - 1):
                        dx = xcol[t + 1] - xcol[t]
                        sj[t] = 1 if dx > 0.0 else (-1 if dx < 0.0 else 0)
            else:
                for t in range(T):
                    xcol[t] = ycol[t]
            nonzero = False
            n = 0
            for t in range(T):
                v = xcol[t]
                if pen:
                    v = v - l1 if v > l1 else (v + l1 if v < -l1 else 0.0)
                nonzero |= v != 0.0
                delta = v - theta[t, j]
                if delta == 0.0:
                    continue
                dmax = max(dmax, cj * abs(delta))
                theta[t, j] = v
                off = woff[t] - lo[t]
                for d in range(lo[t], hi[t]):
                    e = off + d
                    if w[e] == 0.0:
                        continue
                    z = 1.0 if j == node else float(xj[d])
                    u[e] += 2.0 * yrow[d] * z * delta
                    tmp[n] = -abs(u[e])
                    idx[n] = e
                    n += 1
            sj[T - 1] = 1 if nonzero else 0
            if n > 0:
                _derivs(n, w, u, r, tmp, idx)
        if dmax <= tol:
            converged = True
            break
    return sweeps, converged


@functools.lru_cache(maxsize=None)
def _kernels():
    """Compile the kernels above (once per process) after those of ``fastexp`` and ``prox``. Returns
    ``(curvature, bcd)``."""
    k = _prox._kernels()
    bind = {"_cexp": _fastexp._kernels()["_capped_exp_nb"], "_tv": k.tv1d, "_fz": k.fused_zero, "_tvw": k.tv1d_warm}
    d = backend.compile_kernels(sys.modules[__name__], bind=bind)
    return d["_curvature"], d["_bcd"]


def columns(X, node: int, lo, hi, woff, w):
    """``(XT, yrow, c)``: the samples by column (int8 [p, N]), the node's values (float64 [N]) and the
    block curvature bounds ``c_j`` (float64 [p]) of node ``node``'s design."""
    curvature, _ = _kernels()
    XT = np.ascontiguousarray(X.T)
    c = np.zeros(X.shape[1])
    curvature(XT, int(node), lo, hi, woff, w, c)
    return XT, X[:, node].astype(np.float64), c


def sweep(XT, yrow, node, lo, hi, woff, w, lam1, lam2, penalized, c, theta, max_sweeps, tol):
    """Run :func:`_bcd` (compiled) on ``theta`` in place; returns ``(sweeps, converged)``."""
    _, bcd = _kernels()
    return bcd(
        XT, yrow, int(node), lo, hi, woff, w, float(lam1), float(lam2), penalized, c, theta, int(max_sweeps), float(tol)
    )


LAM1 = (0.32, 0.16, 0.08, 0.04, 0.02)
LAM2 = (2.0, 1.0, 0.5, 0.25, 0.125)


def solve_bcd(design, node, lam1, lam2, theta0, max_sweeps=20000, tol=1e-6):
    """BCD from ``theta0`` until the full solver's stopping test holds (``solver._certify``, step 1/L), with the
    sweeps' tolerance scaled down by each miss as ``solver._solve_block`` does. Returns (theta, sweeps, ok)."""
    solver._kernels()
    d = solver.node_design(design, node)
    XT, yrow, c = columns(d.X, node, d.lo, d.hi, d.woff, d.w)
    pen = np.ones(d.p, np.bool_)
    pen[node] = False
    theta = np.array(theta0, dtype=np.float64, order="C", copy=True)
    L = float(d.L.max())
    n, tol_a = 0, tol
    while n < max_sweeps:
        k, conv = sweep(XT, yrow, node, d.lo, d.hi, d.woff, d.w, lam1, lam2, pen, c, theta, max_sweeps - n, tol_a)
        n += k
        if not conv:
            break
        gap = solver._certify(
            d.X,
            node,
            d.lo,
            d.hi,
            d.woff,
            d.w,
            lam1,
            lam2,
            1,
            L,
            pen,
            theta,
            np.ones(d.p, np.bool_),
            np.zeros(d.p, np.bool_),
        )
        if gap <= tol:
            return theta, n, True
        tol_a *= 0.5 * tol / gap
    return theta, n, False


def warm_start(design, node, lam1, lam2):
    """The pipeline's warm start of grid point (lam1, lam2): the solution at the previous, larger lambda1."""
    theta = None
    for a in LAM1:
        if a <= lam1:
            break
        theta = solver.solve_path(design, node, a, lam2, theta0=theta).theta
    return np.zeros((design.T, design.p)) if theta is None else theta


def active(design, nodes):
    from pgmflow.tasks.tesla import path_tasks

    print("node lambda2: columns non-zero at some t (of 99) along lambda1 = " + ", ".join(map(str, LAM1)))
    cols, share = [], []
    its, dense, used, own = 0, 0, 0, 0  # iterations; at >= 75 columns; x the solver's columns; x the solution's
    for node in nodes:
        for lam2 in LAM2:
            fit = path_tasks.fit_node(design, node, np.asarray(LAM1), lam2)
            mask = np.ones(design.p, bool)
            mask[node] = False
            nz = [int(np.any(th[:, mask] != 0, axis=0).sum()) for th in fit.thetas]
            sh = [float((th[:, mask] != 0).mean()) for th in fit.thetas]
            cols += nz
            share += sh
            prev = ~mask  # the solver's set: the warm start's columns (and the field) joined by the solution's
            for th, k in zip(fit.thetas, fit.n_iter):
                cur = np.any(th != 0, axis=0) | ~mask
                its, used, own = its + int(k), used + int(k) * int((prev | cur).sum()), own + int(k) * int(cur.sum())
                dense += int(k) if cur.sum() - 1 >= 75 else 0
                prev = cur
            print(f"{node:4d} {lam2:6.3f}: {nz}  non-zero share {', '.join(f'{x:.3f}' for x in sh)}")
    print(
        f"all {len(cols)} grid points: columns kept median {int(np.median(cols))}, min {min(cols)}, max {max(cols)} "
        f"of 99; non-zero share median {np.median(share):.3f}"
    )
    print(
        f"{its} FISTA iterations, {dense / its:.0%} of them at grid points with >= 75 columns non-zero; "
        f"iteration-weighted columns (field included): the solver's set {used / its:.1f}, the solution's own {own / its:.1f}"
    )


def bcd_vs_fista(design, node, lam1=0.08, lam2=0.125):
    d = solver.node_design(design, node)
    theta0 = warm_start(design, node, lam1, lam2)
    t0 = time.process_time()
    ref = solver.solve_path(design, node, lam1, lam2, theta0=theta0)
    print(
        f"FISTA (pipeline solver): {ref.n_iter} iterations, {time.process_time() - t0:.2f} CPU s, F* = {ref.objective:.10f}"
    )
    XT, yrow, c = columns(d.X, node, d.lo, d.hi, d.woff, d.w)
    pen = np.ones(d.p, np.bool_)
    pen[node] = False
    for scale in (1.0, 0.3, 0.1):
        theta, done, cpu, out = theta0.copy(), 0, 0.0, []
        for k in (10, 50, 100, 200, 400):
            t0 = time.process_time()
            sweep(XT, yrow, node, d.lo, d.hi, d.woff, d.w, lam1, lam2, pen, c * scale, theta, k - done, 0.0)
            cpu += time.process_time() - t0
            done = k
            out.append(f"{k}: {solver.objective(d, node, theta, lam1, lam2) - ref.objective:.2e}")
        print(f"BCD, step 1/({scale} c_j): F - F* after sweeps {'; '.join(out)} ({cpu:.2f} CPU s for 400 sweeps)")


def unique(design, node, lam1=0.16, lam2=0.125):
    theta0 = warm_start(design, node, lam1, lam2)
    ref = solver.solve_path(design, node, lam1, lam2, theta0=theta0)
    t0 = time.process_time()
    th, n, ok = solve_bcd(design, node, lam1, lam2, theta0)
    cpu = time.process_time() - t0
    d = solver.node_design(design, node)
    f = solver.objective(d, node, th, lam1, lam2)
    edges = lambda a: np.any(np.delete(a, node, axis=1) != 0, axis=0)  # noqa: E731
    print(
        f"node {node}, lambda1 {lam1}, lambda2 {lam2}: FISTA F = {ref.objective:.12f} ({ref.n_iter} iterations); "
        f"BCD F = {f:.12f} ({n} sweeps, certified {ok}, {cpu:.2f} CPU s); relative difference "
        f"{abs(f - ref.objective) / ref.objective:.1e}; max |coefficient difference| {np.abs(th - ref.theta).max():.3f}; "
        f"(t, j) entries zero in one and not the other: {int(((th != 0) != (ref.theta != 0)).sum())} "
        f"(of {int((ref.theta != 0).sum())} non-zero in FISTA's); neighbours (any t) differing: "
        f"{int((edges(th) != edges(ref.theta)).sum())}"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[44])
    ap.add_argument("--active", action="store_true")
    ap.add_argument("--bcd", action="store_true")
    ap.add_argument("--unique", action="store_true")
    a = ap.parse_args()
    from pgmflow.tasks.tesla import rollcall

    series, _, _ = rollcall.to_series(rollcall.read_pscl(), "rollcall")
    design = solver.tesla_design(series.X, series.tix, series.T)
    for node in a.nodes:
        if a.bcd:
            bcd_vs_fista(design, node)
        if a.unique:
            unique(design, node)
    if a.active:
        active(design, a.nodes)


if __name__ == "__main__":
    main()

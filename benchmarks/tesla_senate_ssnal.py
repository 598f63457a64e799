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
solution at the previous lambda1 (the warm start of the path) and from zero.

Measured (``benchmarks/results/tesla-senate109-cpu-2core-epyc-issue36-ssnal.md``, 2-core EPYC): node 44's five slow
points 5.5x (warm) and 5.7x (cold) FISTA's speed in CPU time; nodes 0, 44, 99 x 25 grid points 3.09x (2.6x, 3.5x, 3.1x)
with objectives within 1.1e-10 relative of FISTA's (below at 45 of 75), the same BIC choices and neighbour sets there.
The gain is 5.2x where FISTA needs >= 1,000 iterations and 1.7x where it needs < 300: SSNAL needs ~100 prox
evaluations per solve wherever it is on the grid. The solver now lives in ``pgmflow.tasks.tesla.ssnal`` (the first stage of
``solver.solve_path``, ``algorithm="auto"``); this script times it alone, without FISTA's continuation.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from pgmflow.tasks.tesla import solver, ssnal  # noqa: E402

LAM1 = (0.32, 0.16, 0.08, 0.04, 0.02)
LAM2 = (2.0, 1.0, 0.5, 0.25, 0.125)
HARD = ((0.16, 0.5), (0.16, 0.25), (0.08, 0.25), (0.08, 0.125), (0.04, 0.125))  # node 44's slow points


class Result:
    """A solve: the path, whether certified, F, the last certificate and SSNAL's work (``ssnal.Solve``)."""

    def __init__(self, theta, s, objective):
        self.theta, self.converged, self.objective, self.gap = theta, s.converged, objective, s.gap
        self.n_outer, self.n_newton, self.n_cg, self.n_prox = s.n_outer, s.n_newton, s.n_cg, s.n_prox
        self.n_back, self.n_fail = s.n_back, s.n_fail


def solve_ssnal(design, node, lam1, lam2, theta0=None, tol=1e-7, **opts):
    """The pipeline's SSNAL (``pgmflow.tasks.tesla.ssnal.solve``) from ``theta0`` (zeros if None) to ``tol`` alone,
    without FISTA's continuation, with ``opts`` its ``Options``."""
    solver._kernels()
    d = solver.node_design(design, node)
    theta = np.zeros((d.T, d.p)) if theta0 is None else np.array(theta0, dtype=np.float64, order="C", copy=True)
    s = ssnal.solve(d, node, lam1, lam2, theta, tol, solver._certify, ssnal.Options(**opts))
    return Result(theta, s, solver.objective(d, node, theta, lam1, lam2))


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
    tot = {"f_cpu": 0.0, "s_cpu": 0.0, "f_it": 0, "outer": 0, "newton": 0, "cg": 0, "prox": 0, "fail": 0}
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
        f"{tot['fail']} failed line searches, "
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

"""TESLA on the 109th Senate (T=645, p=100, the 5 x 5 grid): what a looser FISTA tolerance buys (issue 36).

    .venv/bin/python benchmarks/tesla_senate_tol.py --nodes 0 44 99

For tol 1e-6 (the default), 1e-5 and 1e-4: FISTA iterations and CPU seconds (``time.process_time``: a shared
machine's load does not count) of the given nodes' 25 grid points; how many (grid point, time, coefficient)
zero patterns differ from tol 1e-6's and the largest coefficient difference; each node's BIC choice
(``-2 loglik + log(T) df`` over the grid) at each tolerance.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

LAM1 = (0.32, 0.16, 0.08, 0.04, 0.02)
LAM2 = (2.0, 1.0, 0.5, 0.25, 0.125)
TOLS = (1e-6, 1e-5, 1e-4)


def fit(design, nodes, tol):
    from pgmflow.tasks.tesla import path_tasks

    iters, cpu, thetas, scores = 0, 0.0, {}, {}
    for node in nodes:
        for b, lam2 in enumerate(LAM2):
            t0 = time.process_time()
            f = path_tasks.fit_node(design, node, np.asarray(LAM1), lam2, tol=tol)
            cpu += time.process_time() - t0
            iters += int(f.n_iter.sum())
            thetas[(node, b)] = f.thetas
            scores[(node, b)] = (f.loglik.copy(), f.df.copy())
    return iters, cpu, thetas, scores


def bic_choice(scores, node, T):
    """(lambda1 index, lambda2 index, df) of the node's smallest BIC over the grid."""
    best = None
    for b in range(len(LAM2)):
        ll, df = scores[(node, b)]
        for a in range(len(LAM1)):
            bic = -2 * ll[a] + math.log(T) * df[a]
            if best is None or bic < best[0]:
                best = (bic, a, b, int(df[a]))
    return best[1:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[0, 44, 99])
    a = ap.parse_args()
    from pgmflow.tasks.tesla import path_tasks, rollcall, solver

    series, _, _ = rollcall.to_series(rollcall.read_pscl(), "rollcall")
    design = solver.tesla_design(series.X, series.tix, series.T)
    path_tasks.fit_node(design, 0, [0.3], 0.1)  # compile / load the kernels before the clock
    res = {}
    for tol in TOLS:
        iters, cpu, thetas, scores = fit(design, a.nodes, tol)
        res[tol] = (thetas, scores)
        print(f"tol {tol:g}: {iters} FISTA iterations, {cpu:.1f} CPU s", flush=True)
    ref = res[TOLS[0]][0]
    for tol in TOLS[1:]:
        thetas, scores = res[tol]
        differ = sum(int(((ref[k] != 0) != (thetas[k] != 0)).sum()) for k in ref)
        total = sum(ref[k].size for k in ref)
        diff = max(float(np.abs(ref[k] - thetas[k]).max()) for k in ref)
        print(f"tol {tol:g} against {TOLS[0]:g}: {differ} of {total} zero patterns differ, max |difference| {diff:.3g}")
        for node in a.nodes:
            print(
                f"  node {node}: BIC choice (lambda1 index, lambda2 index, df) {bic_choice(res[TOLS[0]][1], node, series.T)}"
                f" at {TOLS[0]:g}, {bic_choice(scores, node, series.T)} at {tol:g}"
            )


if __name__ == "__main__":
    main()

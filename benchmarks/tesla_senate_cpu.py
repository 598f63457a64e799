"""TESLA's per-node solves on the 109th Senate (T=645, p=100, the 5 x 5 grid) in one process: CPU seconds
(``time.process_time``, so a shared machine's load does not count), FISTA iterations and CPU microseconds
per iteration, and the estimates, saved to compare two versions of the solver (issue 36).

    .venv/bin/python benchmarks/tesla_senate_cpu.py --nodes 0 44 --save after.npz [--compare before.npz]
    .venv/bin/python benchmarks/tesla_senate_cpu.py --nodes 44 --flatness

To time an older commit with the same script: ``git archive <commit> tasks pipelines | tar -x -C DIR`` and
point a copy of the editable install's link tree (``build/__editable__*/pgmflow``) at DIR, then run with
``PYTHONPATH`` set to that copy. ``--compare`` reports whether every path is bit-identical and the largest
difference. ``--flatness`` solves one grid point twice to the same tolerance, once warm-started as the path
does and once restarted from the iterate after 400 iterations, and prints how far apart the two answers are
(objective and coefficients): how much any change of the iterates may move the estimates.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

LAM1 = (0.32, 0.16, 0.08, 0.04, 0.02)
LAM2 = (2.0, 1.0, 0.5, 0.25, 0.125)


def fit_all(design, nodes):
    """{node_lam2index: thetas}, total iterations and CPU seconds of the fit tasks of ``nodes``."""
    from pgmflow.tasks.tesla import path_tasks

    path_tasks.fit_node(design, 0, [0.3], 0.1)  # compile / load the kernels before the clock
    out, iters, cpu = {}, 0, 0.0
    for node in nodes:
        for b, lam2 in enumerate(LAM2):
            t0 = time.process_time()
            fit = path_tasks.fit_node(design, node, np.asarray(LAM1), lam2)
            cpu += time.process_time() - t0
            iters += int(fit.n_iter.sum())
            out[f"{node}_{b}"] = fit.thetas
    return out, iters, cpu


def flatness(design, node, a=2, b=4, k=400):
    """Two solves of grid point (LAM1[a], LAM2[b]) to the same tolerance from different points."""
    from pgmflow.tasks.tesla import solver

    theta = None
    for lam1 in LAM1[:a]:
        theta = solver.solve_path(design, node, lam1, LAM2[b], theta0=theta).theta
    ref = solver.solve_path(design, node, LAM1[a], LAM2[b], theta0=theta)
    mid = solver.solve_path(design, node, LAM1[a], LAM2[b], theta0=theta, max_iter=k).theta
    again = solver.solve_path(design, node, LAM1[a], LAM2[b], theta0=mid)
    print(
        f"node {node}, lambda1 {LAM1[a]}, lambda2 {LAM2[b]}: {ref.n_iter} iterations warm-started, "
        f"{k} + {again.n_iter} restarted; objectives {ref.objective:.10f} and {again.objective:.10f} "
        f"(relative difference {abs(ref.objective - again.objective) / abs(ref.objective):.1e}); "
        f"max |coefficient difference| {np.abs(ref.theta - again.theta).max():.3f}"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[0, 44])
    ap.add_argument("--save", type=Path, default=None)
    ap.add_argument("--compare", type=Path, default=None)
    ap.add_argument("--flatness", action="store_true")
    a = ap.parse_args()
    from pgmflow.tasks.tesla import rollcall, solver

    series, _, _ = rollcall.to_series(rollcall.read_pscl(), "rollcall")
    design = solver.tesla_design(series.X, series.tix, series.T)
    if a.flatness:
        for node in a.nodes:
            flatness(design, node)
        return
    thetas, iters, cpu = fit_all(design, a.nodes)
    print(
        f"nodes {a.nodes}: {iters} FISTA iterations, {cpu:.2f} CPU s, {1e6 * cpu / iters:.0f} us per iteration "
        f"(solver {solver.__file__})"
    )
    if a.save:
        np.savez(a.save, **thetas)
    if a.compare:
        ref = np.load(a.compare)
        same = all(np.array_equal(ref[k], thetas[k]) for k in thetas)
        diff = max(float(np.abs(ref[k] - thetas[k]).max()) for k in thetas)
        print(f"against {a.compare}: bit-identical {same}, max |difference| {diff:.3g}")


if __name__ == "__main__":
    main()

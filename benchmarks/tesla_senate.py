"""TESLA on the 109th US Senate at one time point per roll call (issue 36): T=645, p=100, the 5 x 5 grid,
TESLA alone, on a LocalCluster of 2 workers, through the pipeline's own path tasks (``path_tasks.fit_node``).

    .venv/bin/python benchmarks/tesla_senate.py [--nodes K] [--only auto|fista] [--out FILE.md]

Runs the fit twice in one run on one machine: with ``solver=fista`` (FISTA alone: the solver before SSNAL) and
with ``solver=auto`` (the default: SSNAL certified by FISTA's test), then compares what each selects by BIC per node
(the grid point and the neighbour set). ``--only`` runs one of them.

Needs Debian's r-cran-pscl and the Python package rdata (the data are read where the package installs them).
Reports the wall time against the issue's target (2 minutes on 2 cores) and the time before (``--before``,
the same script run at the commit to compare, on the same machine), the FISTA iterations per path, the seconds
per task, the mat-vec FLOPs against the machine's 1-core rates measured in the same run (the limit), and where
one iteration's time goes (the gradient kernels against the fused prox, timed on one node's problem).
``--nodes K`` runs K of the 100 nodes (spread over 0..99) for a loaded machine; the report scales nothing.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import numpy as np  # noqa: E402
from _machine import blas_rates_1core, cpu_name, emit  # noqa: E402

LAM1 = (0.32, 0.16, 0.08, 0.04, 0.02)
LAM2 = (2.0, 1.0, 0.5, 0.25, 0.125)
TARGET = 120.0


def _warm():
    from pgmflow.tasks.tesla import path_tasks, solver

    X = np.where(np.random.default_rng(0).random((20, 4)) < 0.5, -1, 1).astype(np.int8)
    X[0, 1] = 0
    path_tasks.fit_node(solver.tesla_design(X, np.repeat(np.arange(5), 4), 5), 0, [0.1], 0.1)
    return True


def fit_timed(design, node, lam1s, lam2, algorithm="auto"):
    """``path_tasks.fit_node`` and the CPU seconds it took on its worker (``time.process_time``: the time
    the task ran, not the time it waited for a core on a shared machine)."""
    from pgmflow.tasks.tesla import path_tasks

    t0 = time.process_time()
    fit = path_tasks.fit_node(design, node, lam1s, lam2, algorithm=algorithm)
    return fit, time.process_time() - t0


def select_summary(node, timed):
    """The node's BIC choice by ``path_tasks.select_node`` on the worker, as the pipeline's select task makes it,
    and the counts of its fits: what the driver gathers (never the paths themselves, as in the pipeline)."""
    from pgmflow.tasks.tesla import path_tasks

    fits = sorted((f for f, _ in timed), key=lambda f: -f.lam2)
    c = path_tasks.select_node(fits)
    nb = np.flatnonzero(np.any(np.delete(c.theta, node, axis=1) != 0.0, axis=0))
    counts = [
        {
            "cpu": cpu,
            "iters": int(f.n_iter.sum()),
            "newton": int(f.n_newton.sum()) if f.n_newton is not None else 0,
            "flops": float(f.flops.sum()),
            "converged": bool(f.converged.all()),
        }
        for f, cpu in timed
    ]
    return ((c.i_lam2, c.i_lam1), set(np.where(nb >= node, nb + 1, nb).tolist())), counts


def fit_graph(series, nodes, algorithm, n_workers=2):
    """Seconds, the BIC choice per node and the counts of every (node, lambda2) fit: the pipeline's graph (a fit
    task per node and lambda2, a select task per node; the driver gathers the choices), each fit timed on its
    worker."""
    import dask
    from distributed import Client, LocalCluster

    from pgmflow.core.cluster import local_start
    from pgmflow.core.graph import Executor
    from pgmflow.tasks.tesla import solver

    for k in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[k] = "1"
    with (
        local_start(),  # as the pipeline's local clusters start: its malloc settings and Dask housekeeping intervals
        LocalCluster(n_workers=n_workers, threads_per_worker=1, dashboard_address=None, silence_logs=40) as cl,
        Client(cl) as client,
    ):
        client.run(_warm)
        ex = Executor(client)
        t0 = time.perf_counter()
        h = ex.scatter(solver.tesla_design(series.X, series.tix, series.T))
        tasks = [
            dask.delayed(select_summary, pure=True)(
                i,
                [
                    dask.delayed(fit_timed, pure=True)(
                        h, i, np.asarray(LAM1), l2, algorithm, dask_key_name=f"senate-{algorithm}-{i}-{a}"
                    )
                    for a, l2 in enumerate(LAM2)
                ],
                dask_key_name=f"senate-select-{algorithm}-{i}",
            )
            for i in nodes
        ]
        out = ex.gather(ex.compute(tasks))
        return time.perf_counter() - t0, dict(zip(nodes, out))


def kernel_split(series, node=0, lam1=0.04, lam2=0.5, reps=50):
    """Seconds per call of the gradient pass (margins, exps, accumulation) and of the fused prox on one node's
    full [T, p] problem at its solution (every column active, as the Senate's paths are)."""
    from pgmflow.tasks.tesla import solver

    d = solver.node_design(solver.tesla_design(series.X, series.tix, series.T), node)
    theta = solver.solve_path(d, node, lam1, lam2).theta
    solver._kernels()
    T, p = theta.shape
    g, out = np.empty_like(theta), np.empty_like(theta)
    nz, scratch = np.empty(p, np.int64), np.empty((2, d.w.size))
    pen = np.ones(p, np.bool_)
    pen[node] = False
    state = np.zeros((p, T), np.int8)
    args = (theta, g, 1.0 / d.L.max(), lam1 / d.L.max(), lam2 / d.L.max(), pen, out, state, np.empty(T), np.empty(T))
    solver._grad(d.X, node, d.lo, d.hi, d.woff, d.w, theta, g, nz, scratch)
    solver._prox_step(*args)
    t0 = time.perf_counter()
    for _ in range(reps):
        solver._grad(d.X, node, d.lo, d.hi, d.woff, d.w, theta, g, nz, scratch)
    tg = (time.perf_counter() - t0) / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        solver._prox_step(*args)
    return tg, (time.perf_counter() - t0) / reps


def solver_path():
    from pgmflow.tasks.tesla import solver

    return solver.__file__


def run(series, nodes, algorithm):
    secs, per_node = fit_graph(series, nodes, algorithm)
    counts = [c for i in nodes for c in per_node[i][1]]
    return {
        "secs": secs,
        "cpu": np.array([c["cpu"] for c in counts]),
        "iters": sum(c["iters"] for c in counts),
        "newton": sum(c["newton"] for c in counts),
        "flops": sum(c["flops"] for c in counts),
        "conv": all(c["converged"] for c in counts),
        "choices": {i: per_node[i][0] for i in nodes},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=0, help="only K nodes spread over 0..p-1 (0: all)")
    ap.add_argument("--only", choices=("auto", "fista"), default=None, help="run one solver only")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    from pgmflow.tasks.tesla import rollcall

    series, _, notes = rollcall.to_series(rollcall.read_pscl(), "rollcall")
    p = series.p
    nodes = list(range(p)) if not a.nodes else sorted({int(v) for v in np.linspace(0, p - 1, a.nodes).round()})
    rates = blas_rates_1core()
    load0 = os.getloadavg()[0]
    algos = ("fista", "auto") if a.only is None else (a.only,)
    res = {}
    loads = {}
    for algo in algos:
        l0 = os.getloadavg()[0]
        res[algo] = run(series, nodes, algo)
        loads[algo] = (l0, os.getloadavg()[0])
    tg, tp = kernel_split(series)
    scope = "all 100 nodes" if not a.nodes else f"{len(nodes)} of the {p} nodes: {nodes}"
    lines = [
        f"# TESLA on the 109th Senate, one time point per roll call: T={series.T}, p={p}, 5 x 5 grid, TESLA alone",
        "",
        f"Machine: {cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}; command: "
        f"`.venv/bin/python benchmarks/tesla_senate.py{f' --nodes {a.nodes}' if a.nodes else ''}"
        f"{f' --only {a.only}' if a.only else ''}`; load average {load0:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end (the machine is shared). Data: {'; '.join(notes)}.",
        f"Scope: {scope}; {len(nodes) * len(LAM2)} path tasks per solver (one per node and lambda2, each the lambda1 "
        f"path warm-started) on a LocalCluster of 2 single-threaded workers; solver: {solver_path()}.",
        "",
        "| solver | wall s on 2 workers | target | CPU s in the tasks (sum) | median CPU s per task | FISTA iterations "
        "| SSNAL Newton steps | GFLOP (mat-vec) | all converged | load average before, after |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for algo, r in res.items():
        lines.append(
            f"| {algo} | **{r['secs']:.1f}** | {TARGET:.0f} s (all 100 nodes) | {r['cpu'].sum():.0f} | "
            f"{np.median(r['cpu']):.2f} | {r['iters']} | {r['newton']} | {r['flops'] / 1e9:.1f} | {r['conv']} | "
            f"{loads[algo][0]:.1f}, {loads[algo][1]:.1f} |"
        )
    lines.append("")
    if len(res) == 2:
        f, s = res["fista"], res["auto"]
        same_point = sum(f["choices"][i][0] == s["choices"][i][0] for i in nodes)
        diff_nodes = [i for i in nodes if f["choices"][i][1] != s["choices"][i][1]]
        n_diff = sum(len(f["choices"][i][1] ^ s["choices"][i][1]) for i in nodes)
        n_edges = sum(len(f["choices"][i][1]) for i in nodes)
        lines += [
            f"- Speed-up of `auto` over `fista` in this run: wall {f['secs'] / s['secs']:.2f}x, CPU "
            f"{f['cpu'].sum() / s['cpu'].sum():.2f}x.",
            f"- BIC choices: the same grid point at {same_point} of {len(nodes)} nodes; neighbour sets differ at "
            f"{len(diff_nodes)} nodes {diff_nodes[:20]}, {n_diff} (node, neighbour) pairs in all against {n_edges} "
            "selected under `fista`.",
        ]
    lines += [
        f"- FISTA's kernels on one node's full problem (every column active): gradient pass {1e6 * tg:.0f} us, fused "
        f"prox {1e6 * tp:.0f} us per iteration (the prox is {100 * tp / (tg + tp):.0f} % of the two); the machine's "
        f"1-core dgemv {rates['dgemv']:.1f} GFLOP/s, at which each solver's mat-vec work takes "
        + ", ".join(f"{algo} {r['flops'] / 2 / rates['dgemv'] / 1e9:.1f} s" for algo, r in res.items())
        + " on 2 cores (the limit a FLOP count sets).",
    ]
    emit("\n".join(lines) + "\n", a.out)


if __name__ == "__main__":
    main()

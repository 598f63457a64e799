"""TESLA over a 5 x 5 lambda grid: pgmflow on 1 and 2 workers against scikit-learn, in the same run.

    .venv/bin/python benchmarks/tesla.py [--out benchmarks/results/tesla.md] [--quick]
    (peer: pip install scikit-learn, or pip install -e '.[bench]')

The data: a synthetic time-varying Ising network (``pgmflow.tasks.tesla.synthetic``) with p = 100 nodes,
T = 100 time points and 10 Gibbs samples per time point (100 edges at the start, rewired every 10
time points). The grid: lambda1 in {0.32, 0.16, 0.08, 0.04, 0.02} x lambda2 in {2, 1, 0.5, 0.25,
0.125}, i.e. 100 nodes x 25 grid points = 2,500 whole-path problems of 100 x 100 parameters,
chosen per node by BIC.

* pgmflow: the pipeline's own graph (``pgmflow.tesla.run.build_fits``: one task per node and
  lambda2 that solves the lambda1 path warm-started, one selection task per node) on a
  LocalCluster of 1 and of 2 worker processes (1 thread each), started and warmed up (numba
  kernels loaded) before the clock runs. Also timed: pgmflow's static baseline, the same
  per-time-point problems as the peer (100 nodes x 100 time points x 5 lambda1).
* scikit-learn: ``LogisticRegression(penalty="l1", solver="liblinear")`` per node, per time point and
  per lambda1 (50,000 fits, one process; liblinear has no multi-core mode), the "static" per-time
  L1 logistic regression. ``C = 1 / (lambda1 n_t)`` on features ``2 x`` maps our objective onto its own (the factor 2 of
  the logit). liblinear also penalises the intercept, which pgmflow does not; a
  check with ``solver="saga"`` (whose intercept is not penalised) on a sample of problems reports
  how far our static solutions are from scikit-learn's on the identical objective.

The target (issue 4): the whole grid finishes in under 10 minutes on a 2-core machine. The results
of 1 and 2 workers must be bit-identical; the script checks it.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
from _machine import blas_rates_1core, cpu_name, emit  # noqa: E402

from pgmflow.tasks.tesla import data as tdata  # noqa: E402
from pgmflow.tasks.tesla import synthetic  # noqa: E402

LAM1 = [0.32, 0.16, 0.08, 0.04, 0.02]
LAM2 = [2.0, 1.0, 0.5, 0.25, 0.125]
TARGET_SECONDS = 600.0


def make_data(a):
    net = synthetic.time_varying_ising(a.seed, p=a.p, T=a.T, samples_per_time=a.n, n_edges=a.p)
    return net, tdata.from_array(net.X)


def run_pgmflow(series, n_workers, methods, a, screen=True, grid=False, nodes=None):
    """Time the pipeline's graph (``build_fits``) per method on a fresh cluster; with ``grid``, also
    time the grid-check graph (:func:`grid_summary` per node and lambda2) for TESLA."""
    from distributed import Client, LocalCluster

    from pgmflow.core.graph import Executor
    from pgmflow.tesla.networks import NetworkData
    from pgmflow.tesla.plan import Estimation, Grid, Selection, SolverSettings
    from pgmflow.tesla.run import build_fits

    env = {"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    os.environ.update(env)
    with (
        LocalCluster(
            n_workers=n_workers, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=40
        ) as cluster,
        Client(cluster) as client,
    ):
        client.run(_warm)  # numba kernels loaded on every worker before the clock runs
        ex = Executor(client)
        out = {}
        for method in methods:
            est = Estimation(
                (method,),
                Grid(tuple(LAM1), tuple(LAM2), (2.0,)),
                SolverSettings(q=1, max_iter=5000, tol=1e-6, active_sets=screen),
                Selection("bic", 0.5, 0.0, np.zeros(series.X.shape[0], bool)),
            )
            data = NetworkData(series, None, "benchmark", np.zeros(0, np.int64), ())
            t0 = time.perf_counter()
            graph = build_fits(ex, f"bench{n_workers}{screen}", data, est)
            choices = ex.gather(ex.compute(graph[method]))
            out[method] = (
                time.perf_counter() - t0,
                np.stack([c.theta for c in choices]),
                sum(c.n_iter for c in choices),
                all(c.all_converged for c in choices),
                sum(c.flops for c in choices),
            )
            client.cancel(list(client.futures))
        if grid:
            out["grid"] = run_grid(ex, series, screen, nodes)
    return out


def grid_summary(design, node, lam2, screen):
    """Node ``node``'s lambda1 path at ``lam2`` (``fit_node``) reduced to what the check compares:
    F at every grid point [L1], the non-zero pattern (bits of bool [L1, T, p]), iterations, FLOPs."""
    from pgmflow.tasks.tesla import path_tasks, solver

    f = path_tasks.fit_node(design, node, np.asarray(LAM1), lam2, screen=screen)
    obj = np.array([solver.objective(design, node, f.thetas[k], LAM1[k], lam2) for k in range(len(LAM1))])
    return obj, np.packbits(f.thetas != 0.0), int(f.n_iter.sum()), int(f.flops.sum())


def run_grid(ex, series, screen, nodes=None):
    """The 5 x 5 TESLA grid as one task per (node, lambda2), each returning :func:`grid_summary`
    (``nodes``: these nodes only; default all)."""
    import dask

    from pgmflow.tasks.tesla import solver

    design = ex.scatter(solver.tesla_design(series.X, series.tix, len(series.n_per_time)))
    nodes = range(series.X.shape[1]) if nodes is None else nodes
    tasks = [
        dask.delayed(grid_summary, pure=True)(design, i, l2, screen, dask_key_name=f"grid-{screen}-{i}-{a}")
        for i in nodes
        for a, l2 in enumerate(LAM2)
    ]
    t0 = time.perf_counter()
    res = ex.gather(ex.compute(tasks))
    return (
        time.perf_counter() - t0,
        np.stack([r[0] for r in res]),
        np.stack([r[1] for r in res]),
        sum(r[2] for r in res),
        sum(r[3] for r in res),
    )


def _warm():
    from pgmflow.tasks.tesla import solver

    rng = np.random.default_rng(0)
    X = np.where(rng.random((20, 4)) < 0.5, -1, 1).astype(np.int8)
    d = solver.tesla_design(X, np.repeat(np.arange(5), 4), 5)
    solver.solve_path(d, 0, 0.1, 0.1)
    solver.row_loglik(d.X, d.tix, 0, np.zeros((5, 4)))
    return True


def run_sklearn(series, a, solver="liblinear", problems=None):
    """Per node, per time point, per lambda1. Returns (seconds, fits, skipped, coefs)."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    X, tix = series.X.astype(np.float64), series.tix
    T, p = len(series.n_per_time), X.shape[1]
    rows = [np.flatnonzero(tix == t) for t in range(T)]
    todo = problems if problems is not None else [(i, t) for i in range(p) for t in range(T)]
    fits = skipped = 0
    coefs = {}
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for i, t in todo:
            Xt = X[rows[t]]
            y = Xt[:, i]
            if np.all(y == y[0]):  # a node constant at this time point: liblinear refuses one class
                skipped += len(LAM1)
                continue
            F = np.delete(Xt, i, axis=1)
            for lam in LAM1:
                C = 1.0 / (lam * len(rows[t]))
                kw = dict(tol=1e-10, max_iter=100_000) if solver == "saga" else dict(tol=1e-6)
                m = LogisticRegression(penalty="l1", solver=solver, C=C, fit_intercept=True, **kw)
                m.fit(2.0 * F, y)
                fits += 1
                coefs[(i, t, lam)] = (m.coef_[0], m.intercept_[0])
    return time.perf_counter() - t0, fits, skipped, coefs


def limits_section(res, ref, rates, p, T, n_rows):
    """The solver comparison (screened vs full update) and the machine limit, as markdown."""
    from pgmflow.tasks.tesla import evaluate

    g_s, obj_s, nz_s, it_s, fl_s = res[2]["grid"]
    w2 = 2
    lines = ["", "## Active sets against the full-update solver, and the machine limit", ""]
    if ref is not None:
        g_r, obj_r, nz_r, it_r, fl_r = ref["grid"]
        rel = float(np.max(np.abs(obj_s - obj_r) / np.abs(obj_r)))
        above = float(np.max((obj_s - obj_r) / np.abs(obj_r)))  # > 0: ours is higher somewhere
        n_diff = int(np.unpackbits(nz_s ^ nz_r).sum())

        def edge_diff(m):
            # (edges in either solution, edges in one only) over every time point, AND and OR rules
            both = only = 0
            for r in ("and", "or"):
                a, b = evaluate.edge_sets(res[2][m][1], r), evaluate.edge_sets(ref[m][1], r)
                both += int((a | b).sum()) // 2
                only += int((a ^ b).sum()) // 2
            return both, only

        nan = float("nan")
        lines += [
            "The grid check graph: one task per (node, lambda2) solving the lambda1 path (``fit_node``) and "
            "returning F at every grid point and the non-zero pattern; the same graph for both solvers.",
            "",
            "| solver, 2 workers | TESLA grid check graph (s) | static, pipeline graph (s) | FISTA iterations (TESLA) | "
            "mat-vec GFLOP (TESLA) |",
            "| --- | --- | --- | --- | --- |",
            f"| full update (reference, `screen=False`) | {g_r:.1f} | {ref['static'][0] if 'static' in ref else nan:.1f} | "
            f"{it_r} | {fl_r / 1e9:.1f} |",
            f"| fast: active sets, local steps, certificate (`screen=True`; the pipeline's default) | {g_s:.1f} | "
            f"{res[2]['static'][0] if 'static' in res[2] else nan:.1f} | {it_s} | {fl_s / 1e9:.1f} |",
            "",
            f"- Speed-up of the fast solver over the reference, same run and machine: TESLA grid **{g_r / g_s:.2f}x** (FLOPs "
            f"{fl_r / fl_s:.2f}x fewer, iterations {it_r / it_s:.2f}x fewer: load-independent), static "
            f"{(ref['static'][0] / res[2]['static'][0]) if 'static' in ref else nan:.2f}x. (The reference runs this "
            "commit's kernels: the speed-up over the code before issue 18 is in the TESLA line above.)",
            f"- Same optimum on all {obj_s.size} (node, lambda1, lambda2) grid points: max relative difference of F "
            f"**{rel:.1e}** (target 1e-9), ours minus the reference's at most **{above:+.1e}** (negative: ours is "
            f"lower at every grid point); coefficients zero in one solution and not in the other, over every grid "
            f"point (the edges of every grid point): **{n_diff}** of {obj_s.size * T * p}.",
        ]
        for m, name in (("tesla", "TESLA"), ("static", "Static")):
            if m in ref:
                both, only = edge_diff(m)
                lines.append(
                    f"- {name}, selected (BIC) edges, AND and OR rules over all {T} time points: "
                    f"**{only}** of {both} edges in one solution only (0: the same edges). With 10 samples "
                    f"and {p - 1} candidates per time point the L1 optimum need not be unique, and the "
                    "reference stops at tol 1e-6 with some entries not yet exactly zero (docs/tesla.md)."
                )
    per_core = fl_s / g_s / w2 / 1e9
    lines += [
        f"- Machine limit: FLOPs counted per FISTA iteration as 4 R k (the margin and the gradient accumulation: "
        f"one multiply-add each per weighted row and active column; R = {n_rows} rows, k active columns) plus 4 R p per KKT check; the TV prox, exps and vector updates are not counted. Active-set grid: "
        f"{fl_s / 1e9:.1f} GFLOP in {g_s:.1f} s on {w2} workers = **{per_core:.2f} GFLOP/s per core**, "
        f"{100 * per_core / rates['dgemv']:.0f} % of this machine's 1-core dgemv ({rates['dgemv']:.1f} GFLOP/s on "
        f"[1000 x 100]; A^T y {rates['dgemv_t']:.1f}) and {100 * per_core / rates['dgemm']:.0f} % of its 1-core "
        f"dgemm ({rates['dgemm']:.1f} GFLOP/s), measured in the same run.",
    ]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--p", type=int, default=100)
    ap.add_argument("--T", type=int, default=100)
    ap.add_argument("--n", type=int, default=10, help="samples per time point")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="p=30: a smoke test of the script")
    ap.add_argument("--out", type=Path, default=None, help="write the report (markdown) here too")
    ap.add_argument(
        "--no-reference",
        dest="reference",
        action="store_false",
        help="skip the full-update solver (screen=False) on 2 workers",
    )
    ap.add_argument("--no-peer", dest="peer", action="store_false", help="skip scikit-learn")
    ap.add_argument(
        "--today",
        type=float,
        default=None,
        metavar="SECONDS",
        help="the TESLA grid on 2 workers with the code before this solver (run that commit's own "
        "benchmarks/tesla.py on the same machine), printed beside ours with the ratio",
    )
    ap.add_argument(
        "--sample-nodes",
        type=int,
        default=0,
        help="only the grid check graph (1 and 2 workers, and the reference), on this many nodes spread "
        "over 0..p-1: the whole 5 x 5 grid of each, for a machine too loaded for the full run",
    )
    a = ap.parse_args()
    if a.quick:
        a.p = 30
    t0 = time.perf_counter()
    net, series = make_data(a)
    gen_s = time.perf_counter() - t0
    T, p = len(series.n_per_time), series.X.shape[1]
    print(
        f"data: p={p}, T={T}, {a.n} samples per time point, {net.edges.sum() / 2 / T:.1f} true edges per time "
        f"point on average (generated in {gen_s:.1f} s)",
        flush=True,
    )

    rates = blas_rates_1core()
    print(
        f"machine: 1-core dgemv {rates['dgemv']:.1f} GFLOP/s ([1000 x 100] A x), dgemm {rates['dgemm']:.1f} GFLOP/s; "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    res = {}
    nodes = None
    if a.sample_nodes:
        nodes = sorted(set(np.linspace(0, p - 1, a.sample_nodes).round().astype(int).tolist()))
        print(f"sampled nodes: {nodes}", flush=True)
    methods = [] if nodes else ["tesla", "static"]
    for w in (1, 2):
        res[w] = run_pgmflow(series, w, methods, a, grid=w == 2 or bool(nodes), nodes=nodes)
        if nodes:
            print(
                f"pgmflow, {w} worker(s): TESLA grid check graph on {len(nodes)} nodes {res[w]['grid'][0]:.1f} s; "
                f"load average {os.getloadavg()[0]:.1f}",
                flush=True,
            )
        else:
            print(
                f"pgmflow, {w} worker(s): TESLA grid {res[w]['tesla'][0]:.1f} s, static {res[w]['static'][0]:.1f} s; "
                f"load average {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    if nodes:
        identical = all(np.array_equal(res[1]["grid"][k], res[2]["grid"][k]) for k in (1, 2, 3, 4))
    else:
        identical = all(np.array_equal(res[1][m][1], res[2][m][1]) for m in ("tesla", "static"))
    ref = None
    if a.reference:
        ref = run_pgmflow(series, 2, [] if nodes else ["tesla", "static"], a, screen=False, grid=True, nodes=nodes)
        print(
            f"reference (full-update solver), 2 workers: TESLA grid check graph {ref['grid'][0]:.1f} s; "
            f"load average {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    if nodes:
        text = (
            f"# TESLA grid, active sets against the full-update solver: p={p}, T={T}, {a.n} samples per time "
            f"point, 5 x 5 lambda grid, {len(nodes)} of the {p} nodes\n\nMachine: {cpu_name()}, "
            f"{os.cpu_count()} cores, Python {platform.python_version()}; command: `.venv/bin/python "
            f"benchmarks/tesla.py --sample-nodes {a.sample_nodes} --no-peer`; load average at the end "
            f"{os.getloadavg()[0]:.1f} (the machine is shared with other work).\n\nNodes: {nodes}.\n\n"
            f"- Results (F at every grid point, non-zero patterns, iterations, FLOPs) on 1 and 2 workers "
            f"bit-identical: **{identical}**; 1 worker {res[1]['grid'][0]:.1f} s, 2 workers "
            f"{res[2]['grid'][0]:.1f} s.\n" + limits_section(res, ref, rates, p, T, series.X.shape[0])
        )
        emit(text, a.out)
        return

    sk_s, sk_fits, sk_skipped = float("nan"), 0, 0
    if a.peer:
        sk_s, sk_fits, sk_skipped, _ = run_sklearn(series, a)
        print(
            f"scikit-learn liblinear: {sk_fits} fits ({sk_skipped} skipped: constant node) in {sk_s:.1f} s", flush=True
        )

    # same objective check: our static solutions against scikit-learn's saga on a sample of problems
    from pgmflow.tasks.tesla import solver as S

    rng = np.random.default_rng(1)
    sample = [(int(rng.integers(p)), int(rng.integers(T))) for _ in range(20)]
    coefs = run_sklearn(series, a, solver="saga", problems=sample)[3] if a.peer else {}
    worst_obj, worst_coef = -np.inf, 0.0
    for (i, t, lam), (coef, icpt) in coefs.items():
        rows = series.tix == t
        d = S.tesla_design(series.X[rows], np.zeros(int(rows.sum()), np.int64), 1)
        th = S.solve_path(d, i, lam, 0.0, tol=1e-10, max_iter=200_000).theta[0]
        ours = np.concatenate([th[:i], th[i + 1 :]])
        F = 2.0 * np.delete(series.X[rows].astype(np.float64), i, axis=1)
        y = series.X[rows][:, i].astype(np.float64)

        def objective(beta, b):
            return float(np.mean(np.logaddexp(0.0, -y * (F @ beta + b))) + lam * np.abs(beta).sum())

        f_sk, f_ours = objective(coef, icpt), objective(ours, 2.0 * th[i])
        worst_obj = max(worst_obj, (f_ours - f_sk) / abs(f_sk))
        worst_coef = max(worst_coef, float(np.max(np.abs(ours - coef))))

    cpu = cpu_name()
    out = io.StringIO()
    out.write(f"# TESLA benchmark: p={p}, T={T}, {a.n} samples per time point, 5 x 5 lambda grid\n\n")
    out.write(
        f"Machine: {cpu}, {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"command: `.venv/bin/python benchmarks/tesla.py{' --quick' if a.quick else ''}`\n\n"
    )
    out.write("| what | problems | wall time (s) | ratio to scikit-learn |\n| --- | --- | --- | --- |\n")
    out.write(f"| scikit-learn liblinear, static per time point (peer) | {sk_fits} fits | {sk_s:.1f} | 1.00 |\n")
    for w in (1, 2):
        ts, th, it_s, conv_s, _ = res[w]["static"]
        out.write(
            f"| pgmflow static per time point, {w} worker(s) | {p} x {T} x {len(LAM1)} | {ts:.1f} | "
            f"{sk_s / ts:.2f}x faster |\n"
        )
    for w in (1, 2):
        tt, th, it_t, conv_t, _ = res[w]["tesla"]
        out.write(
            f"| pgmflow TESLA whole grid (25 points, BIC), {w} worker(s) | {p} x 25 paths | {tt:.1f} | "
            f"{sk_s / tt:.2f}x |\n"
        )
    t2 = res[2]["tesla"][0]
    out.write(
        f"\n- Target: the whole TESLA grid in under {TARGET_SECONDS:.0f} s on 2 workers: **{t2:.1f} s, "
        f"{'met' if t2 < TARGET_SECONDS else 'NOT met'}**; speed-up 1 -> 2 workers "
        f"{res[1]['tesla'][0] / t2:.2f}x.\n"
    )
    out.write(f"- Results on 1 and 2 workers bit-identical: **{identical}**.\n")
    if a.today:
        out.write(
            f"- Issue 18's target, the TESLA grid on 2 workers at least 4x faster than before: before "
            f"{a.today:.1f} s (`--today`), now {t2:.1f} s: **{a.today / t2:.2f}x**, "
            f"{'met' if a.today / t2 >= 4.0 else 'NOT met'}.\n"
        )
    out.write(limits_section(res, ref, rates, p, T, series.X.shape[0]))
    out.write(
        f"- FISTA iterations over the TESLA grid: {res[2]['tesla'][2]}; all converged to tol 1e-6: "
        f"{res[2]['tesla'][3]}.\n"
    )
    out.write(
        f"- Same objective as scikit-learn (saga, intercept not penalised, tol 1e-10) on {len(coefs)} "
        f"(node, time, lambda1) problems: our objective exceeds saga's by at most {worst_obj:.1e} (relative; "
        f"negative: ours is lower); largest coefficient difference {worst_coef:.1e} (with 10 samples and "
        f"{p - 1} features the L1 solution need not be unique).\n"
    )
    out.write(
        f"- scikit-learn skipped {sk_skipped} (node, time, lambda1) problems where the node is constant "
        f"at that time point (liblinear needs two classes); pgmflow solves them (the field absorbs it).\n"
    )
    text = out.getvalue()
    emit(text, a.out)


if __name__ == "__main__":
    main()

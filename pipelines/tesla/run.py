"""TESLA: time-varying network structure learning, farmed per node and per grid point.

The graph: the data terms (one per method, and per KELLER bandwidth) go to the cluster once; then
for every method, node and lambda2 (or bandwidth) a fit task solves that node's whole lambda1 path
(warm-started from the largest lambda1), and one selection task per node and method keeps one grid
point by BIC or held-out log-likelihood. The driver gathers only the chosen paths, in node order,
and builds the edge sets (AND and OR rules), the recovery scores against the truth when there is one,
the figures and the artifacts. Every task is a pure function of its inputs, so the estimates are
bit-identical on any number of workers.
"""

from __future__ import annotations

import time

import dask
import numpy as np

from pgmflow.core import datasets
from pgmflow.core.partial import PartialResults
from pgmflow.core.progress import Progress
from pgmflow.tasks.tesla import path_tasks, solver
from pgmflow.tesla import report
from pgmflow.tesla.networks import NetworkData
from pgmflow.tesla.plan import Estimation, TeslaPlan


def build_fits(ex, tok: str, data: NetworkData, est: Estimation, skip=frozenset()) -> dict:
    """Delayed selection tasks: ``{method: [NodeChoice delayed per node]}`` (None for the ``(method,
    node)`` pairs in ``skip``: finished before a resume). ``est.solver.active_sets=False`` runs the full
    solver (no strong rule / active set; the benchmark's reference)."""
    series, grid, sv, sel = data.series, est.grid, est.solver, est.selection
    X, tix, T = series.X, series.tix, len(series.n_per_time)
    heldout = sel.criterion == "heldout"
    train = ~sel.heldout
    full = solver.tesla_design(X, tix, T)
    designs = {}  # (method, a) -> (fit design handle, refit design handle or None)
    fit_tesla = solver.tesla_design(X, tix, T, train=train) if heldout else full
    h_full = ex.scatter(full)
    h_fit = ex.scatter(fit_tesla) if fit_tesla is not full else h_full
    if "tesla" in est.methods:
        for a in range(len(grid.lambda2)):
            designs[("tesla", a)] = (h_fit, h_full)
    if "static" in est.methods:
        designs[("static", 0)] = (h_fit, h_full)
    if "keller" in est.methods:
        for a, h in enumerate(grid.bandwidths):
            kf = solver.keller_design(X, tix, T, h)
            hk = ex.scatter(kf)
            hkt = ex.scatter(solver.keller_design(X, tix, T, h, train=train)) if heldout else hk
            designs[("keller", a)] = (hkt, hk)
    iso = set(int(i) for i in data.isolated)
    p = series.X.shape[1]
    out = {}
    for m in est.methods:
        n_a = len(grid.second_axis(m))
        choices = []
        for i in range(p):
            if (m, i) in skip:
                choices.append(None)
                continue
            fits = []
            for a in range(n_a):
                dfit, _ = designs[(m, a)]
                l2 = grid.lambda2[a] if m == "tesla" else 0.0
                bw = grid.bandwidths[a] if m == "keller" else 0.0
                fits.append(
                    dask.delayed(path_tasks.fit_node, pure=True)(
                        dfit,
                        i,
                        np.asarray(grid.lambda1_of(m)),
                        l2,
                        method=m,
                        q=sv.q,
                        train=train,
                        bandwidth=bw,
                        isolated=i in iso,
                        max_iter=sv.max_iter,
                        tol=sv.tol,
                        screen=sv.active_sets,
                        algorithm=sv.algorithm,
                        dask_key_name=f"tesla-fit-{tok}-{m}-n{i}-a{a}",
                    )
                )
            refits = [designs[(m, a)][1] for a in range(n_a)] if heldout else None
            choices.append(
                dask.delayed(path_tasks.select_node, pure=True)(
                    fits,
                    sel.criterion,
                    refit_designs=refits,
                    q=sv.q,
                    max_iter=sv.max_iter,
                    tol=sv.tol,
                    gamma=sel.ebic_gamma,
                    screen=sv.active_sets,
                    algorithm=sv.algorithm,
                    dask_key_name=f"tesla-select-{tok}-{m}-n{i}",
                )
            )
        out[m] = choices
    return out


def run(ctx, plan: TeslaPlan) -> dict:
    """One TESLA run from its plan (:func:`pgmflow.tesla.validate.check_tesla`)."""
    data, est, tracker = plan.data, plan.estimation, ctx.tracker
    series, grid = data.series, est.grid
    T, p, N = len(series.n_per_time), series.X.shape[1], series.X.shape[0]
    methods = list(est.methods)
    criterion, rule = est.selection.criterion, plan.report.rule
    for line in data.notes:
        ctx.say(line)
    n_fit = est.n_path_tasks(p)
    ctx.say(
        f"{data.source}: T={T} time points, p={p} nodes, {N} samples; methods {', '.join(methods)}; "
        f"grid {len(grid.lambda1)} lambda1 x {len(grid.lambda2)} lambda2 ({len(grid.bandwidths)} KELLER "
        f"bandwidths){_own_lambda1(grid, methods)}; {n_fit} path tasks, selection by {criterion}"
    )
    tracker.set_tags(
        {
            "pgmflow.tesla.source": data.source[:250],
            "pgmflow.tesla.methods": ",".join(methods),
            "pgmflow.tesla.criterion": criterion,
            "pgmflow.tesla.rule": rule,
        }
    )
    generated = plan.network.kind == "synthetic"
    datasets.log_input(
        tracker,
        "network samples",
        {k: getattr(series, k) for k in ("X", "tix", "times", "node_names")},
        context="training",
        path=None if generated else data.source,
        generator="pgmflow.tasks.tesla.synthetic.time_varying_ising",
        parameters={**plan.network.parameters(), "seed": plan.seed},
    )  # MLflow dataset tracking
    tracker.log_metrics(
        {"time_points": T, "nodes": p, "samples": N, "isolated_nodes": int(data.isolated.size), "path_tasks": n_fit},
        step=0,
    )

    t0 = time.monotonic()
    choices = _solve(ctx, plan)
    seconds = time.monotonic() - t0
    return report.finish(ctx, plan, choices, seconds)


def _own_lambda1(grid, methods) -> str:
    """The methods that have their own lambda1 grid, for the run's first line ("" when all share it)."""
    own = [f"{m} {len(grid.lambda1_of(m))} lambda1" for m in methods if grid.lambda1_of(m) is not grid.lambda1]
    return f"; {', '.join(own)}" if own else ""


def _unit(m: str, i: int) -> str:
    return f"{m}/n{i}"


def _solve(ctx, plan: TeslaPlan) -> dict:
    """``{method: [NodeChoice per node]}``. Each node's selection (its whole grid of path solves) is saved
    as it completes (``partial/tesla_nodes_*.npz``); a resumed run reads them back and solves only the
    nodes that were not finished."""
    methods = plan.estimation.methods
    p = plan.data.series.X.shape[1]
    units = [(m, i) for m in methods for i in range(p)]
    saved = PartialResults(
        ctx.tracker, "tesla_nodes", path_tasks.NodeChoice, ctx.resumed, every=plan.checkpoint_seconds
    )
    done = {u for u in units if _unit(*u) in saved}
    if ctx.resumed:
        ctx.say(saved.describe(len(units), "node selections"))
    graph = build_fits(ctx.executor, ctx.token, plan.data, plan.estimation, skip=done)
    todo = [u for u in units if u not in done]
    flat = [graph[m][i] for m, i in todo]
    bar = Progress(len(units), "tesla", "node fits", enabled=ctx.progress)
    bar.update(len(done))

    def finished(j, choice):
        saved.add(_unit(*todo[j]), choice)
        bar.update(1)

    handles = ctx.executor.compute(flat, watch=range(len(flat)), on_result=finished)
    ctx.executor.release(handles)
    saved.close()
    bar.close()
    if ctx.resumed:
        ctx.tracker.set_tags(
            {"pgmflow.resume.tesla_nodes_saved": len(done), "pgmflow.resume.tesla_nodes_run": len(todo)}
        )
    return {m: [saved.done[_unit(m, i)] for i in range(p)] for m in methods}

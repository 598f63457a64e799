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

from pgmflow.pipelines.core import datasets
from pgmflow.pipelines.core.partial import PartialResults
from pgmflow.pipelines.core.progress import Progress
from pgmflow.pipelines.tesla import networks, report
from pgmflow.tasks.tesla import path_tasks, solver


def _grids(tcfg, T):
    lam1 = [float(v) for v in tcfg["lambda1"]]
    lam2 = [float(v) for v in tcfg["lambda2"]]
    bw = [float(v) for v in tcfg["bandwidth"]]
    return lam1, lam2, bw


def build_fits(ex, tok, series, methods, lam1, lam2, bandwidths, q, criterion, heldout, isolated, max_iter, tol,
               gamma=0.5, skip=frozenset(), screen=True):
    """Delayed selection tasks: ``{method: [NodeChoice delayed per node]}`` (None for the ``(method,
    node)`` pairs in ``skip``: finished before a resume). ``screen=False`` runs the full solver (no
    strong rule / active set; the benchmark's reference)."""
    X, tix, T = series.X, series.tix, len(series.n_per_time)
    train = ~heldout
    full = solver.tesla_design(X, tix, T)
    designs = {}  # (method, a) -> (fit design handle, refit design handle or None)
    fit_tesla = solver.tesla_design(X, tix, T, train=train) if criterion == "heldout" else full
    h_full = ex.scatter(full)
    h_fit = ex.scatter(fit_tesla) if fit_tesla is not full else h_full
    if "tesla" in methods:
        for a in range(len(lam2)):
            designs[("tesla", a)] = (h_fit, h_full)
    if "static" in methods:
        designs[("static", 0)] = (h_fit, h_full)
    if "keller" in methods:
        for a, h in enumerate(bandwidths):
            kf = solver.keller_design(X, tix, T, h)
            hk = ex.scatter(kf)
            hkt = ex.scatter(solver.keller_design(X, tix, T, h, train=train)) if criterion == "heldout" else hk
            designs[("keller", a)] = (hkt, hk)
    iso = set(int(i) for i in isolated)
    p = series.X.shape[1]
    out = {}
    for m in methods:
        n_a = len(lam2) if m == "tesla" else (len(bandwidths) if m == "keller" else 1)
        choices = []
        for i in range(p):
            if (m, i) in skip:
                choices.append(None)
                continue
            fits = []
            for a in range(n_a):
                dfit, _ = designs[(m, a)]
                l2 = lam2[a] if m == "tesla" else 0.0
                bw = bandwidths[a] if m == "keller" else 0.0
                fits.append(dask.delayed(path_tasks.fit_node, pure=True)(
                    dfit, i, np.asarray(lam1), l2, method=m, q=q, train=train, bandwidth=bw, isolated=i in iso,
                    max_iter=max_iter, tol=tol, screen=screen, dask_key_name=f"tesla-fit-{tok}-{m}-n{i}-a{a}"))
            refits = [designs[(m, a)][1] for a in range(n_a)] if criterion == "heldout" else None
            choices.append(dask.delayed(path_tasks.select_node, pure=True)(
                fits, criterion, refit_designs=refits, q=q, max_iter=max_iter, tol=tol, gamma=gamma, screen=screen,
                dask_key_name=f"tesla-select-{tok}-{m}-n{i}"))
        out[m] = choices
    return out


def run(ctx, plan) -> dict:
    cfg = ctx.cfg
    tcfg = cfg["tesla"]
    seed = int(cfg["seed"])
    tracker = ctx.tracker
    data = networks.resolve(cfg)
    series = data.series
    T, p, N = len(series.n_per_time), series.X.shape[1], series.X.shape[0]
    methods = list(tcfg["methods"])
    lam1, lam2, bandwidths = _grids(tcfg, T)
    q = int(cfg["model"]["q"])
    criterion = str(tcfg["criterion"])
    rule = str(tcfg["rule"])
    max_iter, tol = int(tcfg["max_iter"]), float(tcfg["tol"])
    heldout = path_tasks.heldout_rows(N, seed, float(tcfg["heldout_fraction"])) if criterion == "heldout" \
        else np.zeros(N, bool)
    for line in data.notes:
        ctx.say(line)
    n_fit = sum(p * (len(lam2) if m == "tesla" else len(bandwidths) if m == "keller" else 1) for m in methods)
    ctx.say(f"{data.source}: T={T} time points, p={p} nodes, {N} samples; methods {', '.join(methods)}; "
          f"grid {len(lam1)} lambda1 x {len(lam2)} lambda2 ({len(bandwidths)} KELLER bandwidths); {n_fit} path "
            f"tasks, selection by {criterion}")
    tracker.set_tags({"pgmflow.tesla.source": data.source[:250], "pgmflow.tesla.methods": ",".join(methods),
                      "pgmflow.tesla.criterion": criterion, "pgmflow.tesla.rule": rule})
    datasets.log_input(tracker, "network samples", {k: getattr(series, k) for k in ("X", "tix", "times", "node_names")},
                       context="training", path=None if cfg["network"]["kind"] == "synthetic" else data.source,
                       generator="pgmflow.tasks.tesla.synthetic.time_varying_ising",
                       parameters={**cfg["network"], "seed": seed})  # MLflow dataset tracking, with a digest
    tracker.log_metrics({"time_points": T, "nodes": p, "samples": N, "isolated_nodes": int(data.isolated.size),
                         "path_tasks": n_fit}, step=0)

    t0 = time.monotonic()
    choices = _solve(ctx, tcfg, series, methods, lam1, lam2, bandwidths, q, criterion, heldout, data.isolated,
                     max_iter, tol)
    seconds = time.monotonic() - t0
    return report.finish(ctx, cfg, data, methods, choices, lam1, lam2, bandwidths, rule, seconds)


def _unit(m: str, i: int) -> str:
    return f"{m}/n{i}"


def _solve(ctx, tcfg, series, methods, lam1, lam2, bandwidths, q, criterion, heldout, isolated, max_iter, tol):
    """``{method: [NodeChoice per node]}``. Each node's selection (its whole grid of path solves) is saved
    as it completes (``partial/tesla_nodes_*.npz``); a resumed run reads them back and solves only the
    nodes that were not finished."""
    p = series.X.shape[1]
    units = [(m, i) for m in methods for i in range(p)]
    saved = PartialResults(ctx.tracker, "tesla_nodes", path_tasks.NodeChoice, ctx.resumed,
                           every=float(tcfg.get("checkpoint_seconds", 10.0)))
    done = {u for u in units if _unit(*u) in saved}
    if ctx.resumed:
        ctx.say(saved.describe(len(units), "node selections"))
    graph = build_fits(ctx.executor, ctx.token, series, methods, lam1, lam2, bandwidths, q, criterion, heldout,
                       isolated, max_iter, tol, float(tcfg.get("ebic_gamma", 0.5)), skip=done,
                       screen=bool(tcfg.get("active_sets", True)))
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
        ctx.tracker.set_tags({"pgmflow.resume.tesla_nodes_saved": len(done), "pgmflow.resume.tesla_nodes_run": len(todo)})
    return {m: [saved.done[_unit(m, i)] for i in range(p)] for m in methods}

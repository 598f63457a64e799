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

import io
import json
import tempfile
import time
from pathlib import Path

import dask
import numpy as np

from pipelines import networks
from pipelines.progress import Progress
from tasks.tesla import evaluate, path_tasks, solver


def _grids(tcfg, T):
    lam1 = [float(v) for v in tcfg["lambda1"]]
    lam2 = [float(v) for v in tcfg["lambda2"]]
    bw = [float(v) for v in tcfg["bandwidth"]]
    return lam1, lam2, bw


def build_fits(ex, tok, series, methods, lam1, lam2, bandwidths, q, criterion, heldout, isolated, max_iter, tol,
               gamma=0.5):
    """Delayed selection tasks: ``{method: [NodeChoice delayed per node]}``, and the designs' sizes."""
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
            fits = []
            for a in range(n_a):
                dfit, _ = designs[(m, a)]
                l2 = lam2[a] if m == "tesla" else 0.0
                bw = bandwidths[a] if m == "keller" else 0.0
                fits.append(dask.delayed(path_tasks.fit_node, pure=True)(
                    dfit, i, np.asarray(lam1), l2, method=m, q=q, train=train, bandwidth=bw, isolated=i in iso,
                    max_iter=max_iter, tol=tol, dask_key_name=f"tesla-fit-{tok}-{m}-n{i}-a{a}"))
            refits = [designs[(m, a)][1] for a in range(n_a)] if criterion == "heldout" else None
            choices.append(dask.delayed(path_tasks.select_node, pure=True)(
                fits, criterion, refit_designs=refits, q=q, max_iter=max_iter, tol=tol, gamma=gamma,
                dask_key_name=f"tesla-select-{tok}-{m}-n{i}"))
        out[m] = choices
    return out


def run(ctx) -> dict:
    cfg = ctx.cfg
    tcfg = cfg["tesla"]
    seed = int(cfg["seed"])
    tracker, ex = ctx.tracker, ctx.executor
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
    tok = tracker.run_id[:12]
    for line in data.notes:
        print(f"pgmflow: {line}", flush=True)
    n_fit = sum(p * (len(lam2) if m == "tesla" else len(bandwidths) if m == "keller" else 1) for m in methods)
    print(f"pgmflow: {data.source}: T={T} time points, p={p} nodes, {N} samples; methods {', '.join(methods)}; "
          f"grid {len(lam1)} lambda1 x {len(lam2)} lambda2 ({len(bandwidths)} KELLER bandwidths); {n_fit} path "
          f"tasks, selection by {criterion}", flush=True)
    tracker.set_tags({"pgmflow.tesla.source": data.source[:250], "pgmflow.tesla.methods": ",".join(methods),
                      "pgmflow.tesla.criterion": criterion, "pgmflow.tesla.rule": rule})
    tracker.log_metrics({"time_points": T, "nodes": p, "samples": N, "isolated_nodes": int(data.isolated.size),
                         "path_tasks": n_fit}, step=0)

    t0 = time.monotonic()
    graph = build_fits(ex, tok, series, methods, lam1, lam2, bandwidths, q, criterion, heldout, data.isolated,
                       max_iter, tol, float(tcfg.get("ebic_gamma", 0.5)))
    flat = [d for m in methods for d in graph[m]]
    bar = Progress(len(flat), "tesla", "node fits", enabled=ctx.progress)
    handles = ex.compute(flat, watch=range(len(flat)), on_done=lambda i: bar.update(1))
    results = ex.gather(handles)
    bar.close()
    seconds = time.monotonic() - t0
    choices = {}
    k = 0
    for m in methods:
        choices[m] = results[k:k + p]
        k += p
    return _finish(ctx, cfg, data, methods, choices, lam1, lam2, bandwidths, rule, seconds)


def _finish(ctx, cfg, data, methods, choices, lam1, lam2, bandwidths, rule, seconds) -> dict:
    from pipelines import figures

    tracker = ctx.tracker
    tcfg = cfg["tesla"]
    series = data.series
    T, p = len(series.n_per_time), series.X.shape[1]
    result = {"seconds": seconds, "time_points": T, "nodes": p, "samples": int(series.X.shape[0]),
              "isolated_nodes": [series.node_names[i] for i in data.isolated]}
    thetas, adj, recov, counts = {}, {}, {}, {}
    for m in methods:
        th = np.stack([c.theta for c in choices[m]])  # [p, T, p]
        thetas[m] = th
        for r in evaluate.RULES:
            adj[(m, r)] = evaluate.edge_sets(th, r)
        counts[m] = evaluate.edge_counts(adj[(m, rule)])
        result[f"{m}_edges_mean"] = float(counts[m].mean())
        result[f"{m}_iterations"] = int(sum(c.n_iter for c in choices[m]))
        result[f"{m}_all_converged"] = bool(all(c.all_converged for c in choices[m]))
        if data.truth is not None:
            for r in evaluate.RULES:
                rec = evaluate.recovery(adj[(m, r)], data.truth)
                recov[(m, r)] = rec
                sfx = "" if r == rule else f"_{r}"
                result[f"{m}_f1{sfx}"] = rec.mean_f1
                result[f"{m}_precision{sfx}"] = rec.mean_precision
                result[f"{m}_recall{sfx}"] = rec.mean_recall
    if data.truth is not None:
        result["true_edges_mean"] = float(evaluate.edge_counts(data.truth).mean())
    primary = methods[0]
    if data.truth is not None:
        result["objective"] = result[f"{primary}_f1"]
        result["objective_name"] = f"{primary}_f1 (mean over time, {rule} rule; higher is better)"
        result["objective_direction"] = "maximize"
    else:
        result["objective"] = float(np.nansum([np.nanmin(c.scores) for c in choices[primary] if not c.isolated]))
        result["objective_name"] = f"{primary} summed {tcfg['criterion']} score of the chosen grid points (lower is better)"
    final = {k: v for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    tracker.log_metrics({f"final_{k}": v for k, v in final.items()}, step=T)
    for t in range(T):
        row = {f"edges_{m}": float(counts[m][t]) for m in methods}
        if data.truth is not None:
            row["edges_true"] = float(evaluate.edge_counts(data.truth[t:t + 1])[0])
            row.update({f"f1_{m}": float(recov[(m, rule)].f1[t]) for m in methods})
        tracker.log_metrics(row, step=t)
    tracker.flush()
    with tempfile.TemporaryDirectory() as tmp:
        arrays = {"node_names": np.asarray(series.node_names), "times": np.asarray(series.times)}
        for m in methods:
            arrays[f"theta_{m}"] = thetas[m]
            arrays[f"lambda1_{m}"] = np.array([c.lam1 for c in choices[m]])
            arrays[f"lambda2_{m}"] = np.array([c.lam2 for c in choices[m]])
            arrays[f"bandwidth_{m}"] = np.array([c.bandwidth for c in choices[m]])
            arrays[f"scores_{m}"] = np.stack([c.scores for c in choices[m]])
            for r in evaluate.RULES:
                arrays[f"edges_{r}_{m}"] = adj[(m, r)]
        if data.truth is not None:
            arrays["edges_true"] = data.truth
        path = Path(tmp) / "estimates.npz"
        np.savez_compressed(path, **arrays)
        tracker.log_artifact(path)
    tracker.log_text(_selection_csv(methods, choices, series.node_names), "tables/selection.csv")
    tracker.log_dict(result, "results.json")
    if tcfg.get("figures", True):
        snaps = tcfg.get("snapshot_times")
        snaps = [int(s) for s in snaps] if snaps else sorted(set(np.linspace(0, T - 1, min(4, T)).round().astype(int)))
        figs = figures.tesla_figures(methods, {m: adj[(m, rule)] for m in methods}, thetas, data.truth,
                                     {m: recov[(m, rule)] for m in methods} if data.truth is not None else None,
                                     snaps, series.node_names, rule, choices, lam1, lam2, bandwidths)
        for name, fig in figs.items():
            tracker.log_figure(fig, f"figures/{name}.png")
            figures.close(fig)
    _print_summary(result, methods, data.truth is not None, rule)
    return result


def _selection_csv(methods, choices, names) -> str:
    out = io.StringIO()
    out.write("method,node,name,lambda1,lambda2,bandwidth,iterations,converged,isolated\n")
    for m in methods:
        for c in choices[m]:
            nm = str(names[c.node]).replace('"', '""')
            out.write(f'{m},{c.node},"{nm}",{c.lam1:g},{c.lam2:g},{c.bandwidth:g},{c.n_iter},'
                      f'{str(c.all_converged).lower()},{str(c.isolated).lower()}\n')
    return out.getvalue()


def _print_summary(result, methods, has_truth, rule):
    lines = [f"pgmflow: tesla finished in {result['seconds']:.1f} s"]
    if has_truth:
        lines.append(f"  {'method':8s} {'F1':>6s} {'prec':>6s} {'recall':>6s} {'edges/t':>8s}   ({rule} rule; "
                     f"true edges/t {result['true_edges_mean']:.1f})")
        for m in methods:
            lines.append(f"  {m:8s} {result[f'{m}_f1']:6.3f} {result[f'{m}_precision']:6.3f} "
                         f"{result[f'{m}_recall']:6.3f} {result[f'{m}_edges_mean']:8.1f}")
    else:
        for m in methods:
            lines.append(f"  {m:8s} edges per time point {result[f'{m}_edges_mean']:.1f}")
    for m in methods:
        if not result[f"{m}_all_converged"]:
            lines.append(f"  warning: some {m} solves stopped at tesla.max_iter before tesla.tol; raise tesla.max_iter")
    print("\n".join(lines), flush=True)
    json.dumps(result)  # results must stay JSON-serialisable (logged as results.json)

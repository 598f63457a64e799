"""The end of a TESLA run: edge sets (AND / OR rules), recovery against the truth when there is one,
per-time metrics, the estimates, the selection table, results and figures."""

from __future__ import annotations

import io
import json

import numpy as np

from pgmflow.core import artifacts
from pgmflow.tasks.tesla import evaluate
from pgmflow.tesla.edges import Estimates, edge_sets
from pgmflow.tesla.plan import TeslaPlan


def _objective(plan: TeslaPlan, result, choices) -> dict:
    """The run's objective: the first method's F1 against the truth, else its summed selection score."""
    primary, rule = plan.estimation.methods[0], plan.report.rule
    if plan.data.truth is not None:
        return {
            "objective": result[f"{primary}_f1"],
            "objective_name": f"{primary}_f1 (mean over time, {rule} rule; higher is better)",
            "objective_direction": "maximize",
        }
    return {
        "objective": float(np.nansum([np.nanmin(c.scores) for c in choices[primary] if not c.isolated])),
        "objective_name": f"{primary} summed {plan.estimation.selection.criterion} score of the chosen grid "
        "points (lower is better)",
    }


def finish(ctx, plan: TeslaPlan, choices, seconds: float) -> dict:
    """Log the run's metrics, estimates, selection table, results and figures; return the results.
    choices: ``{method: [NodeChoice per node]}``. seconds: the time the path solves took."""
    tracker, data, methods, rule = ctx.tracker, plan.data, list(plan.estimation.methods), plan.report.rule
    series = data.series
    T = len(series.n_per_time)
    result = {
        "seconds": seconds,
        "time_points": T,
        "nodes": series.X.shape[1],
        "samples": int(series.X.shape[0]),
        "isolated_nodes": [series.node_names[i] for i in data.isolated],
    }
    est = edge_sets(plan, choices, result)
    result.update(_objective(plan, result, choices))
    artifacts.log_final_metrics(tracker, result, step=T, flush=False)
    for t in range(T):
        row = {f"edges_{m}": float(est.counts[m][t]) for m in methods}
        if data.truth is not None:
            row["edges_true"] = float(evaluate.edge_counts(data.truth[t : t + 1])[0])
            row.update({f"f1_{m}": float(est.recovery[(m, rule)].f1[t]) for m in methods})
        tracker.log_metrics(row, step=t)
    tracker.flush()
    artifacts.log_npz(tracker, "estimates.npz", _estimate_arrays(data, methods, choices, est), compressed=True)
    tracker.log_text(_selection_csv(methods, choices, series.node_names), "tables/selection.csv")
    artifacts.log_results(tracker, result)
    if plan.report.figures:
        from pgmflow.tesla import figures

        artifacts.log_figures(tracker, figures.tesla_figures(plan, est, choices))
    _print_summary(ctx.say, result, methods, data.truth is not None, rule)
    return result


def _estimate_arrays(data, methods, choices, est: Estimates) -> dict:
    arrays = {"node_names": np.asarray(data.series.node_names), "times": np.asarray(data.series.times)}
    for m in methods:
        arrays[f"theta_{m}"] = est.thetas[m]
        arrays[f"lambda1_{m}"] = np.array([c.lam1 for c in choices[m]])
        arrays[f"lambda2_{m}"] = np.array([c.lam2 for c in choices[m]])
        arrays[f"bandwidth_{m}"] = np.array([c.bandwidth for c in choices[m]])
        arrays[f"scores_{m}"] = np.stack([c.scores for c in choices[m]])
        for r in evaluate.RULES:
            arrays[f"edges_{r}_{m}"] = est.edges[(m, r)]
    if data.truth is not None:
        arrays["edges_true"] = data.truth
    return arrays


def _selection_csv(methods, choices, names) -> str:
    out = io.StringIO()
    out.write("method,node,name,lambda1,lambda2,bandwidth,iterations,converged,isolated\n")
    for m in methods:
        for c in choices[m]:
            nm = str(names[c.node]).replace('"', '""')
            out.write(
                f'{m},{c.node},"{nm}",{c.lam1:g},{c.lam2:g},{c.bandwidth:g},{c.n_iter},'
                f"{str(c.all_converged).lower()},{str(c.isolated).lower()}\n"
            )
    return out.getvalue()


def _print_summary(say, result, methods, has_truth, rule):
    lines = [f"pgmflow: tesla finished in {result['seconds']:.1f} s"]
    if has_truth:
        lines.append(
            f"  {'method':8s} {'F1':>6s} {'prec':>6s} {'recall':>6s} {'edges/t':>8s}   ({rule} rule; "
            f"true edges/t {result['true_edges_mean']:.1f})"
        )
        for m in methods:
            lines.append(
                f"  {m:8s} {result[f'{m}_f1']:6.3f} {result[f'{m}_precision']:6.3f} "
                f"{result[f'{m}_recall']:6.3f} {result[f'{m}_edges_mean']:8.1f}"
            )
    else:
        for m in methods:
            lines.append(f"  {m:8s} edges per time point {result[f'{m}_edges_mean']:.1f}")
    for m in methods:
        if not result[f"{m}_all_converged"]:
            lines.append(f"  warning: some {m} solves stopped at tesla.max_iter before tesla.tol; raise tesla.max_iter")
    say("\n".join(lines), prefix="", summary=True)
    json.dumps(result)  # results must stay JSON-serialisable (logged as results.json)

"""The edges a TESLA run reports: each node's chosen neighbourhood estimate combined into edge sets by
the AND and the OR rule (Meinshausen & Buehlmann 2006; Ahmed & Xing 2009), and their recovery of
the true edges when those are known. Used by the report and the figures."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pgmflow.tasks.tesla import evaluate
from pgmflow.tesla.plan import TeslaPlan


class Estimates(NamedTuple):
    """The chosen estimates of every method and their edge sets: a node's neighbourhood estimates are
    combined into edges by the AND or the OR rule (Meinshausen & Buehlmann 2006; Ahmed & Xing 2009)."""

    thetas: dict  # method -> float64 [p, T, p] the chosen paths, node by node
    edges: dict  # (method, rule) -> bool [T, p, p] the edge sets under each rule
    recovery: dict  # (method, rule) -> evaluate.Recovery against the truth (empty without one)
    counts: dict  # method -> edges per time point [T] under the plan's rule


def edge_sets(plan: TeslaPlan, choices, result: dict) -> Estimates:
    """Edge sets of every method under both rules, counts per time, and recovery against the truth
    (``choices``: ``{method: [NodeChoice per node]}``); the summary numbers go into ``result``."""
    truth, rule = plan.data.truth, plan.report.rule
    thetas, adj, recov, counts = {}, {}, {}, {}
    for m in plan.estimation.methods:
        th = np.stack([c.theta for c in choices[m]])  # [p, T, p]
        thetas[m] = th
        for r in evaluate.RULES:
            adj[(m, r)] = evaluate.edge_sets(th, r)
        counts[m] = evaluate.edge_counts(adj[(m, rule)])
        result[f"{m}_edges_mean"] = float(counts[m].mean())
        result[f"{m}_iterations"] = int(sum(c.n_iter for c in choices[m]))
        result[f"{m}_all_converged"] = bool(all(c.all_converged for c in choices[m]))
        result[f"{m}_grid_edge_nodes"] = grid_edge_nodes(
            plan.estimation.grid.lambda1, plan.estimation.grid.second_axis(m), choices[m]
        )
        if plan.data.groups is not None:
            share = within_group_share(adj[(m, rule)], plan.data.groups)
            result[f"{m}_within_group_share"] = float(np.nanmean(share)) if np.isfinite(share).any() else float("nan")
        if truth is not None:
            for r in evaluate.RULES:
                rec = evaluate.recovery(adj[(m, r)], truth)
                recov[(m, r)] = rec
                sfx = "" if r == rule else f"_{r}"
                result[f"{m}_f1{sfx}"] = rec.mean_f1
                result[f"{m}_precision{sfx}"] = rec.mean_precision
                result[f"{m}_recall{sfx}"] = rec.mean_recall
    if truth is not None:
        result["true_edges_mean"] = float(evaluate.edge_counts(truth).mean())
    return Estimates(thetas, adj, recov, counts)


def grid_edge_nodes(lambda1, second, choices) -> int:
    """How many (fitted) nodes chose a grid point on an edge of the grid: the largest or smallest lambda1,
    or the largest or smallest lambda2 (bandwidth) when that axis has more than one value. A selection on
    an edge says the grid may not contain the criterion's optimum."""
    l1, l2 = np.asarray(lambda1), np.asarray(second)
    n = 0
    for c in choices:
        if c.isolated:
            continue
        on1 = c.lam1 in (l1.max(), l1.min()) and l1.size > 1
        v2 = c.bandwidth if c.method == "keller" else c.lam2
        on2 = l2.size > 1 and v2 in (l2.max(), l2.min())
        n += bool(on1 or on2)
    return n


def within_group_share(adj, groups) -> np.ndarray:
    """float [T]: the share of each time point's edges that join two nodes of the same group (a legislator's
    party); NaN where there is no edge. adj: bool [T, p, p] symmetric."""
    g = np.asarray(groups)
    same = g[:, None] == g[None, :]
    iu = np.triu_indices(g.size, 1)
    e = adj[:, iu[0], iu[1]]
    total = e.sum(axis=1)
    within = (e & same[iu][None, :]).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, within / np.maximum(total, 1), np.nan)

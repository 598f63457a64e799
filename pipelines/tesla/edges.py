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

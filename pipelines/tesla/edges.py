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
        grid = plan.estimation.grid
        edge, flat = grid_edges(grid.lambda1_of(m), grid.second_axis(m), choices[m])
        result[f"{m}_grid_edge_nodes"] = edge
        result[f"{m}_grid_edge_nodes_flat"] = flat
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


KELLER_TRUNCATE = 3.0  # solver.keller_design's kernel truncation, in bandwidths (a test pins the two together)


def grid_edge_nodes(lambda1, second, choices) -> int:
    """How many (fitted) nodes chose a grid point on an edge of the grid: the largest or smallest lambda1
    (``lambda1``: the method's own grid), or the largest or smallest lambda2 (bandwidth) when that axis has
    more than one value. A selection on an edge says the grid may not contain the criterion's optimum."""
    return grid_edges(lambda1, second, choices)[0]


def grid_edges(lambda1, second, choices) -> tuple[int, int]:
    """``(on an edge, flat beyond it)``: the nodes counted by :func:`grid_edge_nodes`, and how many of them
    sit only on edges past which the fit cannot change, so that no wider grid would choose differently:

    * the largest lambda1 with no edge at any time point: every larger lambda1 keeps the neighbourhood
      empty (the zero edge weights stay optimal; the field is not L1-penalised) and gives the same fit;
    * TESLA's largest lambda2 with the path constant in time (every coefficient and the field one value
      over all time points): every larger lambda2 keeps it optimal (``model.q=1``; with ``q=2`` a path
      is never exactly constant, so that node counts as an edge);
    * KELLER's smallest bandwidth when it is below ``1 / KELLER_TRUNCATE``: the kernel then reaches no other
      time point, so every smaller bandwidth gives the same design (static's).

    The difference of the two is the count of nodes for which the grid may be too narrow."""
    l1, l2 = np.asarray(lambda1), np.asarray(second)
    edge = flat = 0
    for c in choices:
        if c.isolated:
            continue
        v2 = c.bandwidth if c.method == "keller" else c.lam2
        top1 = l1.size > 1 and c.lam1 == l1.max()
        low1 = l1.size > 1 and c.lam1 == l1.min()
        top2 = l2.size > 1 and v2 == l2.max()
        low2 = l2.size > 1 and v2 == l2.min()
        if not (top1 or low1 or top2 or low2):
            continue
        edge += 1
        theta = np.asarray(c.theta)
        others = np.delete(theta, c.node, axis=1)
        flat += (
            not low1  # a smaller lambda1 may fit better: never flat
            and (not top1 or not others.any())
            and (not top2 or (c.method == "tesla" and bool((theta == theta[:1]).all())))
            and (not low2 or (c.method == "keller" and KELLER_TRUNCATE * v2 < 1))
        )
    return edge, flat


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

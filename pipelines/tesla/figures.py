"""TESLA figures logged to MLflow: edge counts, recovery, snapshots, selection."""

from __future__ import annotations

import numpy as np

from pgmflow.core.plotting import plt
from pgmflow.tesla.edges import Estimates
from pgmflow.tesla.plan import Grid, TeslaPlan


def tesla_figures(plan: TeslaPlan, est: Estimates, choices) -> dict:
    """Figures of a TESLA run: network snapshots at chosen time points (one fixed networkx layout,
    so rewiring shows), edges over time, F1 over time (with a known truth), and the chosen grid
    points per node. est: the edge sets and recovery (:class:`~pgmflow.tesla.edges.Estimates`);
    choices: ``{method: [NodeChoice per node]}``."""
    methods, rule, truth = list(plan.estimation.methods), plan.report.rule, plan.data.truth
    adj = {m: est.edges[(m, rule)] for m in methods}
    series, groups = plan.data.series, plan.data.groups
    snaps = plan.report.snapshot_times
    figs = {
        "network_snapshots": _snapshots(methods, adj, truth, snaps, series.node_names, rule, groups, series.times),
        "edges_over_time": _edges_over_time(methods, adj, truth, rule),
    }
    if groups is not None:
        figs["within_group_share"] = _within_group(methods, adj, groups, rule, series.times)
        figs["changing_edges"] = _changing_edges(adj[methods[0]], series.node_names, methods[0], rule, series.times)
    if truth is not None:
        figs["f1_over_time"] = _f1_over_time(methods, {m: est.recovery[(m, rule)] for m in methods}, rule)
    figs["chosen_grid_points"] = _chosen_grid_points(methods, choices, plan.estimation.grid)
    return figs


GROUP_COLOURS = {"D": "tab:blue", "R": "tab:red", "Indep": "tab:green"}


def _colours(groups, p):
    """A colour per node: its group's (party: D blue, R red, independent green; others from a cycle)."""
    if groups is None:
        return "tab:blue"
    cycle = ["tab:purple", "tab:orange", "tab:brown", "tab:gray", "tab:olive", "tab:cyan"]
    other = {g: cycle[k % len(cycle)] for k, g in enumerate(sorted(set(groups) - set(GROUP_COLOURS)))}
    return [GROUP_COLOURS.get(g, other.get(g)) for g in groups]


def _snapshots(methods, adj, truth, snaps, names, rule, groups=None, times=None):
    import networkx as nx

    T, p = next(iter(adj.values())).shape[:2]
    base = nx.Graph()
    base.add_nodes_from(range(p))
    union = np.zeros((p, p), bool)
    for a in adj.values():
        union |= a.any(axis=0)
    if truth is not None:
        union |= truth.any(axis=0)
    base.add_edges_from(zip(*np.nonzero(np.triu(union, 1))))
    pos = nx.circular_layout(base) if p <= 30 else nx.spring_layout(base, seed=0)
    rows = ([("truth", truth)] if truth is not None else []) + [(m, adj[m]) for m in methods]
    fig, axes = plt.subplots(len(rows), len(snaps), figsize=(3.2 * len(snaps), 3.2 * len(rows)), squeeze=False)
    labels = {i: str(names[i]) for i in range(p)} if p <= 30 else None
    for r, (label, a) in enumerate(rows):
        for c, t in enumerate(snaps):
            ax = axes[r, c]
            g = nx.Graph()
            g.add_nodes_from(range(p))
            e = list(zip(*np.nonzero(np.triu(a[t], 1))))
            g.add_edges_from(e)
            if truth is not None and label != "truth":
                colors = ["tab:green" if truth[t, i, j] else "tab:red" for i, j in e]
                missed = list(zip(*np.nonzero(np.triu(truth[t] & ~a[t], 1))))
                nx.draw_networkx_edges(g, pos, edgelist=missed, ax=ax, style="dashed", edge_color="0.75")
            else:
                colors = ["0.2"] * len(e)
            nx.draw_networkx_edges(g, pos, edgelist=e, ax=ax, edge_color=colors, width=1.5)
            nx.draw_networkx_nodes(g, pos, ax=ax, node_size=60 if p <= 30 else 15, node_color=_colours(groups, p))
            if labels:
                nx.draw_networkx_labels(g, pos, labels=labels, ax=ax, font_size=6, font_color="white")
            ax.set_axis_off()
            if r == 0:
                ax.set_title(f"t = {t}" if times is None else f"t = {t}: {times[t]}", fontsize=9)
            if c == 0:
                ax.text(-0.05, 0.5, label, transform=ax.transAxes, rotation=90, va="center", ha="right", fontsize=11)
    fig.suptitle(
        f"network snapshots ({rule} rule; green: true edge found, red: false edge, dashed: missed)"
        if truth is not None
        else f"network snapshots ({rule} rule)",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def _edges_over_time(methods, adj, truth, rule):
    p = next(iter(adj.values())).shape[1]
    fig, ax = plt.subplots(figsize=(7, 4))
    iu = np.triu_indices(p, 1)
    if truth is not None:
        ax.plot(truth[:, iu[0], iu[1]].sum(axis=1), "k--", label="truth")
    for m in methods:
        ax.plot(adj[m][:, iu[0], iu[1]].sum(axis=1), label=m)
    ax.set_xlabel("time point")
    ax.set_ylabel("edges")
    ax.set_title(f"edges over time ({rule} rule)")
    ax.legend()
    ax.grid(alpha=0.3)
    return fig


def _f1_over_time(methods, recov, rule):
    fig, ax = plt.subplots(figsize=(7, 4))
    for m in methods:
        ax.plot(recov[m].f1, label=f"{m} (mean {recov[m].mean_f1:.3f})")
    ax.set_xlabel("time point")
    ax.set_ylabel("F1 of edge recovery")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"F1 over time ({rule} rule)")
    ax.legend()
    ax.grid(alpha=0.3)
    return fig


def _chosen_grid_points(methods, choices, grid: Grid):
    fig, axes = plt.subplots(1, len(methods), figsize=(4 * len(methods), 3.5), squeeze=False)
    for ax, m in zip(axes[0], methods):
        lam1, second = grid.lambda1_of(m), grid.second_axis(m)  # each method's own lambda1 grid
        counts = np.zeros((len(second), len(lam1)))
        for ch in choices[m]:
            if not ch.isolated:
                counts[ch.i_lam2, ch.i_lam1] += 1
        im = ax.imshow(counts, aspect="auto", cmap="Blues", origin="lower")
        ax.set_xticks(range(len(lam1)))
        ax.set_xticklabels([f"{v:g}" for v in lam1], rotation=45, fontsize=7)
        ax.set_yticks(range(len(second)))
        ax.set_yticklabels([f"{v:g}" for v in second], fontsize=7)
        ax.set_xlabel("lambda1")
        ax.set_ylabel({"tesla": "lambda2", "keller": "bandwidth"}.get(m, ""))
        ax.set_title(f"{m}: grid points chosen (nodes)", fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.05)
    fig.tight_layout()
    return fig


def _within_group(methods, adj, groups, rule, times):
    """The share of each time point's edges inside one group (party), per method."""
    from pgmflow.tesla.edges import within_group_share

    fig, ax = plt.subplots(figsize=(7, 4))
    for m in methods:
        ax.plot(within_group_share(adj[m], groups), label=m, lw=1)
    _time_ticks(ax, times)
    ax.set_ylabel("within-party share of edges")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"within-party vs across-party edges ({rule} rule)")
    ax.legend()
    ax.grid(alpha=0.3)
    return fig


def _changing_edges(adj, names, method, rule, times, top=12):
    """The edges that switch on or off most often over time, as a raster (rows: edges, black: present)."""
    T, p = adj.shape[:2]
    iu = np.triu_indices(p, 1)
    e = adj[:, iu[0], iu[1]]  # [T, pairs]
    flips = np.abs(np.diff(e.astype(np.int8), axis=0)).sum(axis=0)
    order = np.argsort(-flips, kind="stable")[: min(top, flips.size)]
    order = order[flips[order] > 0]
    fig, ax = plt.subplots(figsize=(8, 0.35 * max(len(order), 1) + 1.5))
    if len(order):
        ax.imshow(e[:, order].T, aspect="auto", cmap="Greys", interpolation="nearest")
    ax.set_yticks(range(len(order)))
    ax.set_yticklabels([f"{names[iu[0][k]]} - {names[iu[1][k]]} ({flips[k]})" for k in order], fontsize=6)
    _time_ticks(ax, times)
    ax.set_title(f"{method}: the edges that change most ({rule} rule; switches in brackets)", fontsize=9)
    fig.tight_layout()
    return fig


def _time_ticks(ax, times):
    T = len(times)
    ticks = sorted(set(np.linspace(0, T - 1, min(6, T)).round().astype(int).tolist()))
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(times[t])[:10] for t in ticks], rotation=30, fontsize=7)
    ax.set_xlabel("time point")

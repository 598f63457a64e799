"""Figures logged to MLflow (matplotlib, Agg backend; never shown on screen)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from tasks.tempering import schedule  # noqa: E402


def close(fig):
    plt.close(fig)


def _levels_to_show(K, n=6):
    return sorted(set(np.linspace(0, K - 1, min(n, K)).round().astype(int).tolist()))


def tempering_figures(target, betas, traces, history, results) -> dict:
    """energy_traces, swap_acceptance (with the barrier Lambda(b)), round_trips, log_z."""
    figs = {}
    ising = target.kind == "ising"
    b = np.asarray(betas[0])
    tr = traces[0]
    K = len(b)

    # 1. energy (or log-likelihood) traces per temperature, last round, chain 0
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for k in _levels_to_show(K):
        y = tr.energy[:, k] / target.n_sites if ising else tr.loglik[:, k]
        if ising:
            beta = b[k] * target.beta_model
            lab = f"T = {1 / beta:.3g}" if beta > 0 else "T = inf (reference)"
        else:
            lab = f"b = {b[k]:.3g}"
        ax.plot(tr.scans, y, lw=0.8, label=lab)
    ax.set_xlabel("scan")
    ax.set_ylabel("energy per site" if ising else "log-likelihood l(x)")
    ax.set_title("Traces per temperature (last round, chain 0)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    figs["energy_traces"] = fig

    # 2. swap acceptance per adjacent pair and the communication barrier Lambda(b)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for c, (bc, t) in enumerate(zip(betas, traces)):
        acc = t.accept_prob.mean(axis=0)
        mid = 0.5 * (bc[1:] + bc[:-1])
        axes[0].plot(mid, acc, "o-", ms=3, label=f"chain {c}")
        lam, cum = schedule.communication_barrier(bc, 1 - acc)
        axes[1].plot(bc, cum, "o-", ms=3, label=f"chain {c}: Λ = {lam:.2f}")
    axes[0].set_xlabel("b (annealing parameter; T = T_target / b)" if ising else "b (annealing parameter)")
    axes[0].set_ylabel("swap acceptance of pair (k, k+1)")
    axes[0].set_ylim(0, 1.02)
    axes[0].set_title("Swap acceptance (equalised by the adaptive ladder)")
    axes[1].set_xlabel("b")
    axes[1].set_ylabel("cumulative barrier Λ(b)")
    axes[1].set_title("Communication barrier")
    for ax in axes:
        ax.legend(fontsize=8)
    fig.tight_layout()
    figs["swap_acceptance"] = fig

    # 3. round trips: index process of a few replicas, and cumulative trips per round
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    R = tr.levels.shape[1]
    for r in _levels_to_show(R, 4):
        axes[0].step(tr.scans, tr.levels[:, r], where="post", lw=0.8, label=f"replica {r}")
    axes[0].set_xlabel("scan")
    axes[0].set_ylabel("level")
    axes[0].set_title("Index process (last round, chain 0)")
    axes[0].legend(fontsize=8)
    rounds = [h["round"] for h in history]
    axes[1].plot(rounds, [h["round_trips"] for h in history], "o-")
    axes[1].set_xlabel("round")
    axes[1].set_ylabel("round trips (cumulative, all chains)")
    axes[1].set_title(f"Round trips: {results['round_trips']} in total")
    fig.tight_layout()
    figs["round_trips"] = fig

    # 4. autocorrelation of the energy (log-likelihood) and |m| at a few levels, last round
    from tasks.tempering import diagnostics

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    series = [("energy" if ising else "log-likelihood", tr.energy if ising else tr.loglik),
              ("|magnetisation|" if ising else "|x|", tr.abs_m)]
    max_lag = max(1, min(200, tr.scans.shape[0] // 4))
    for ax, (name, data) in zip(axes, series):
        for k in _levels_to_show(K, 5):
            rho = diagnostics.autocorrelation(data[:, k], max_lag=max_lag)
            ess = float(diagnostics.effective_sample_size(data[:, k]))
            ax.plot(np.arange(rho.shape[-1]), rho, lw=1, label=f"level {k} (b={b[k]:.2g}), ESS {ess:.0f}")
        ax.axhline(0, color="k", lw=0.5)
        ax.set_xlabel("lag (scans)")
        ax.set_ylabel(f"autocorrelation of {name}")
        ax.legend(fontsize=7)
    fig.suptitle(f"Autocorrelation (last round, chain 0, {tr.scans.shape[0]} scans)")
    fig.tight_layout()
    figs["autocorrelation"] = fig

    # 5. log Z estimates per round, with the exact value where known
    has_exact = "log_z_exact" in results
    fig, axes = plt.subplots(1, 2 if has_exact else 1, figsize=(12 if has_exact else 7, 4.2), squeeze=False)
    ax = axes[0, 0]
    ests = np.array([h["log_z_ss"] for h in history])
    ses = np.array([h["log_z_ss_se"] for h in history])
    ax.errorbar(rounds, ests, yerr=2 * ses, fmt="o-", capsize=3, label="stepping stone ± 2 SE")
    ti = np.array([h["log_z_ti"] for h in history])
    ax.plot(rounds, ti, "s--", ms=4, label="thermodynamic integration")
    if "log_z_exact" in results:
        ax.axhline(results["log_z_exact"], color="k", lw=1, label=f"exact ({results['exact_log_z_source']})")
    ax.set_xlabel("round (estimates use that round's samples)")
    ax.set_ylabel("log Z")
    ax.set_title("log Z estimates")
    ax.legend(fontsize=8)
    if has_exact:
        ax2 = axes[0, 1]
        last = slice(max(0, len(rounds) - 6), None)
        r_last = np.asarray(rounds)[last]
        ax2.errorbar(r_last, ests[last] - results["log_z_exact"], yerr=2 * ses[last], fmt="o-", capsize=3,
                     label="stepping stone - exact ± 2 SE")
        ax2.plot(r_last, ti[last] - results["log_z_exact"], "s--", ms=4, label="thermodynamic integration - exact")
        ax2.axhline(0, color="k", lw=1)
        ax2.set_xlabel("round")
        ax2.set_ylabel("error in log Z")
        ax2.set_title(f"Error against the exact value (final: {results['log_z_ss_error_sigmas']:+.2f} SE)")
        ax2.legend(fontsize=8)
    fig.tight_layout()
    figs["log_z"] = fig
    return figs


def svi_figures(history, lam, names, vocab, coherence) -> dict:
    """Figures of an SVI run for LDA: held-out perplexity against documents seen, the top words of
    each topic, and a topic-word heatmap over the leading words of every topic."""
    import matplotlib.pyplot as plt

    figs = {}
    if history:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([h["docs_seen"] for h in history], [h["perplexity"] for h in history], "o-")
        ax.set_xlabel("documents seen")
        ax.set_ylabel("held-out perplexity (document completion)")
        ax.set_title("SVI for LDA: held-out perplexity")
        ax.grid(alpha=0.3)
        figs["perplexity"] = fig
    K = lam.shape[0]
    n_show = min(8, len(names[0]) if names else 0)
    fig, ax = plt.subplots(figsize=(min(14, 2 + 1.2 * n_show), 0.35 * K + 1))
    ax.axis("off")
    for k in range(K):
        ax.text(0.0, 1 - (k + 0.5) / K, f"{k:>3d}  ({coherence[k]:6.1f})  " + "  ".join(names[k][:n_show]),
                family="monospace", fontsize=9, va="center", transform=ax.transAxes)
    ax.set_title("top words per topic (UMass coherence)")
    figs["top_words"] = fig
    beta = lam / lam.sum(axis=1, keepdims=True)
    lead = []
    for k in range(K):
        for w in np.argsort(-beta[k])[:3]:
            if w not in lead:
                lead.append(int(w))
    lead = lead[:60]
    fig, ax = plt.subplots(figsize=(min(16, 2 + 0.25 * len(lead)), 0.3 * K + 2))
    im = ax.imshow(beta[:, lead], aspect="auto", cmap="viridis")
    ax.set_xticks(range(len(lead)))
    ax.set_xticklabels([vocab[w] if vocab else str(w) for w in lead], rotation=90, fontsize=7)
    ax.set_ylabel("topic")
    ax.set_title("topic-word probabilities of each topic's leading words")
    fig.colorbar(im, ax=ax, fraction=0.03)
    fig.tight_layout()
    figs["topic_word_heatmap"] = fig
    return figs


def tesla_figures(methods, adj, thetas, truth, recov, snaps, names, rule, choices, lam1, lam2, bandwidths) -> dict:
    """Figures of a TESLA run: network snapshots at chosen time points (one fixed networkx layout,
    so rewiring shows), edges over time, F1 over time (with a known truth), and the chosen grid
    points per node."""
    import networkx as nx

    figs = {}
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
            nx.draw_networkx_nodes(g, pos, ax=ax, node_size=60 if p <= 30 else 15, node_color="tab:blue")
            if labels:
                nx.draw_networkx_labels(g, pos, labels=labels, ax=ax, font_size=6, font_color="white")
            ax.set_axis_off()
            if r == 0:
                ax.set_title(f"t = {t}", fontsize=10)
            if c == 0:
                ax.text(-0.05, 0.5, label, transform=ax.transAxes, rotation=90, va="center", ha="right", fontsize=11)
    fig.suptitle(f"network snapshots ({rule} rule; green: true edge found, red: false edge, dashed: missed)"
                 if truth is not None else f"network snapshots ({rule} rule)", fontsize=10)
    fig.tight_layout()
    figs["network_snapshots"] = fig

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
    figs["edges_over_time"] = fig

    if recov is not None:
        fig, ax = plt.subplots(figsize=(7, 4))
        for m in methods:
            ax.plot(recov[m].f1, label=f"{m} (mean {recov[m].mean_f1:.3f})")
        ax.set_xlabel("time point")
        ax.set_ylabel("F1 of edge recovery")
        ax.set_ylim(0, 1.02)
        ax.set_title(f"F1 over time ({rule} rule)")
        ax.legend()
        ax.grid(alpha=0.3)
        figs["f1_over_time"] = fig

    fig, axes = plt.subplots(1, len(methods), figsize=(4 * len(methods), 3.5), squeeze=False)
    for ax, m in zip(axes[0], methods):
        counts = np.zeros((max(len(lam2), len(bandwidths), 1), len(lam1)))
        for ch in choices[m]:
            if not ch.isolated:
                counts[ch.i_lam2, ch.i_lam1] += 1
        second = lam2 if m == "tesla" else (bandwidths if m == "keller" else [0.0])
        counts = counts[:len(second)]
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
    figs["chosen_grid_points"] = fig
    return figs


def bounds_figure(betas, curves: dict, exact, tempering, tempering_se, title: str = "") -> "plt.Figure":
    """log Z per spin against beta: MF lower bound, TRW upper bound, Bethe, the exact value where
    known, and the tempering estimate with a +-2 SE band."""
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(7, 7), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    b = np.asarray(betas, dtype=np.float64)
    style = {"mf": ("tab:blue", "mean field (lower bound)"), "bethe": ("tab:green", "Bethe (loopy BP)"),
             "trw": ("tab:red", "TRW (upper bound)")}
    for key, (color, label) in style.items():
        if key in curves:
            ax.plot(b, curves[key], "-o", ms=3, color=color, label=label)
    ref = None
    if exact is not None and any(v is not None for v in exact):
        ex = np.array([np.nan if v is None else v for v in exact], dtype=np.float64)
        ax.plot(b, ex, "k--", label="exact")
        ref = ex
    if tempering is not None:
        t = np.asarray(tempering, dtype=np.float64)
        s = np.asarray(tempering_se, dtype=np.float64)
        ax.fill_between(b, t - 2 * s, t + 2 * s, color="0.6", alpha=0.5, label="tempering ±2 SE")
        ax.plot(b, t, "k.", ms=4, label="tempering (stepping stone)")
        ref = t
    ax.set_ylabel("log Z per spin")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax.set_title(title or "variational bounds on log Z")
    if ref is not None:
        for key, (color, label) in style.items():
            if key in curves:
                ax2.plot(b, np.asarray(curves[key]) - ref, "-o", ms=3, color=color, label=label)
        if tempering is not None:
            ax2.fill_between(b, -2 * s, 2 * s, color="0.6", alpha=0.5)
        ax2.axhline(0.0, color="k", lw=0.8)
        ax2.set_ylabel("minus " + ("tempering" if tempering is not None else "exact"))
        ax2.grid(alpha=0.3)
    ax2.set_xlabel("beta (inverse temperature)")
    fig.tight_layout()
    return fig

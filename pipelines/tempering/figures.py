"""Tempering figures logged to MLflow: traces, swap acceptance and the barrier, round trips, log Z."""

from __future__ import annotations

import numpy as np

from pgmflow.core.plotting import plt
from pgmflow.tasks.tempering import schedule


def _levels_to_show(K, n=6):
    return sorted(set(np.linspace(0, K - 1, min(n, K)).round().astype(int).tolist()))


def tempering_figures(target, betas, traces, history, results, legs=None) -> dict:
    """energy_traces, swap_acceptance (with the barrier Lambda(b)), round_trips, autocorrelation, log_z;
    with two legs (reference=stabilized; ``legs``: the leg of each level, per chain) the swap
    acceptance and barrier per leg, and ``legs``: each leg's barrier, round trips and swap acceptance
    per round."""
    makers = {
        "energy_traces": _energy_traces,
        "swap_acceptance": _swap_acceptance,
        "round_trips": _round_trips,
        "autocorrelation": _autocorrelation,
        "log_z": _log_z,
    }
    if legs is not None and any(lg is not None and int(np.max(lg)) > 0 for lg in legs):
        from pgmflow.tempering.figures_legs import leg_curves, legs_figure

        makers["swap_acceptance"] = lambda target, b, tr, h, r: swap_acceptance_figure(
            leg_curves(b, tr, legs),
            "b (annealing parameter of the leg; 0 = its reference, 1 = the target)",
            "Swap acceptance per leg",
        )
        makers["legs"] = legs_figure
    return {name: make(target, betas, traces, history, results) for name, make in makers.items()}


def _energy_traces(target, betas, traces, history, results):
    """Energy (or log-likelihood) traces per temperature, last round, chain 0."""
    b = np.asarray(betas[0])
    tr = traces[0]
    K = len(b)

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for k in _levels_to_show(K):
        ax.plot(tr.scans, target.trace_values(tr, k), lw=0.8, label=target.level_label(b[k]))
    ax.set_xlabel("scan")
    ax.set_ylabel(target.trace_ylabel)
    ax.set_title("Traces per temperature (last round, chain 0)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


def swap_acceptance_figure(curves, xlabel: str, title: str):
    """Swap acceptance per adjacent pair and the cumulative barrier Lambda(b), one curve per ladder.

    curves: (b [n] increasing ladder, acceptance [n-1] of each adjacent pair, label, line style).
    """
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for b, acc, label, style in curves:
        axes[0].plot(0.5 * (b[1:] + b[:-1]), acc, style, ms=3, label=label)
        lam, cum = schedule.communication_barrier(b, 1 - acc)
        axes[1].plot(b, cum, style, ms=3, label=f"{label}: Λ = {lam:.2f}")
    axes[0].set_xlabel(xlabel)
    axes[0].set_ylabel("swap acceptance of pair (k, k+1)")
    axes[0].set_ylim(0, 1.02)
    axes[0].set_title(title)
    axes[1].set_xlabel("b")
    axes[1].set_ylabel("cumulative barrier Λ(b)")
    axes[1].set_title("Communication barrier" + (" per leg" if "leg" in title else ""))
    for ax in axes:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _swap_acceptance(target, betas, traces, history, results):
    """Swap acceptance per adjacent pair and the communication barrier Lambda(b)."""
    curves = [
        (np.asarray(bc), t.accept_prob.mean(axis=0), f"chain {c}", "o-") for c, (bc, t) in enumerate(zip(betas, traces))
    ]
    return swap_acceptance_figure(curves, target.ladder_xlabel, "Swap acceptance (equalised by the adaptive ladder)")


def _round_trips(target, betas, traces, history, results):
    """Round trips: index process of a few replicas, and cumulative trips per round."""
    tr = traces[0]
    rounds = [h["round"] for h in history]

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
    return fig


def _autocorrelation(target, betas, traces, history, results):
    """Autocorrelation of the energy (log-likelihood) and |m| at a few levels, last round."""
    b = np.asarray(betas[0])
    tr = traces[0]
    K = len(b)

    from pgmflow.tasks.tempering import diagnostics

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    series = [(target.observable_name, target.observable(tr)), (target.magnitude_name, tr.abs_m)]
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
    return fig


def _log_z(target, betas, traces, history, results):
    """Log Z estimates per round, with the exact value where known."""
    rounds = [h["round"] for h in history]

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
        ax2.errorbar(
            r_last,
            ests[last] - results["log_z_exact"],
            yerr=2 * ses[last],
            fmt="o-",
            capsize=3,
            label="stepping stone - exact ± 2 SE",
        )
        ax2.plot(r_last, ti[last] - results["log_z_exact"], "s--", ms=4, label="thermodynamic integration - exact")
        ax2.axhline(0, color="k", lw=1)
        ax2.set_xlabel("round")
        ax2.set_ylabel("error in log Z")
        ax2.set_title(f"Error against the exact value (final: {results['log_z_ss_error_sigmas']:+.2f} SE)")
        ax2.legend(fontsize=8)
    fig.tight_layout()
    return fig

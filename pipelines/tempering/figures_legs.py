"""Figures of a two-leg chain (tempering.reference=stabilized): each leg's swap acceptance and
barrier Lambda(b) over its own ladder, and per-round barrier, round trips and swap acceptance per leg."""

from __future__ import annotations

import numpy as np

from pgmflow.pipelines.core.plotting import plt
from pgmflow.tasks.tempering import schedule, variational


def swap_acceptance_legs(target, betas, traces, history, results, legs):
    """Swap acceptance per adjacent pair and the cumulative barrier, each leg on its own ladder."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for c, (bc, t) in enumerate(zip(betas, traces)):
        acc = t.accept_prob.mean(axis=0)
        for name, lv, pairs in zip(variational.LEG_NAMES, variational.leg_levels(legs), variational.leg_pairs(legs)):
            b = np.asarray(bc)[lv]
            style = "o-" if name == "fixed" else "s--"
            axes[0].plot(0.5 * (b[1:] + b[:-1]), acc[pairs], style, ms=3, label=f"chain {c}, {name} leg")
            lam, cum = schedule.communication_barrier(b, 1 - acc[pairs])
            axes[1].plot(b, cum, style, ms=3, label=f"chain {c}, {name} leg: Λ = {lam:.2f}")
    axes[0].set_xlabel("b (annealing parameter of the leg; 0 = its reference, 1 = the target)")
    axes[0].set_ylabel("swap acceptance of pair (k, k+1)")
    axes[0].set_ylim(0, 1.02)
    axes[0].set_title("Swap acceptance per leg")
    axes[1].set_xlabel("b")
    axes[1].set_ylabel("cumulative barrier Λ(b)")
    axes[1].set_title("Communication barrier per leg")
    for ax in axes:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def legs_figure(target, betas, traces, history, results):
    """Per round: each leg's barrier, its own round trips (cumulative) and its mean swap acceptance."""
    rounds = [h["round"] for h in history]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.0))
    for name, style in zip(variational.LEG_NAMES, ("o-", "s--")):
        for ax, key in zip(axes, ("barrier", "round_trips", "swap_accept")):
            vals = [h.get(f"{key}_{name}", np.nan) for h in history]
            ax.plot(rounds, vals, style, ms=4, label=f"{name} leg")
    for ax, title in zip(axes, ("barrier Λ per leg", "round trips per leg (cumulative)", "mean swap acceptance")):
        ax.set_xlabel("round")
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.suptitle("Stabilized variational PT: the fixed and the variational leg")
    fig.tight_layout()
    return fig

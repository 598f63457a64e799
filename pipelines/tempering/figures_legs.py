"""Figures of a two-leg chain (tempering.reference=stabilized): each leg's swap acceptance and
barrier Lambda(b) over its own ladder, and per-round barrier, round trips and swap acceptance per leg."""

from __future__ import annotations

import numpy as np

from pgmflow.core.plotting import plt
from pgmflow.tasks.tempering import variational


def leg_curves(betas, traces, legs) -> list:
    """Each chain's legs as curves for ``figures.swap_acceptance_figure``: (b of the leg's ladder, its
    pairs' mean swap acceptance, label, style), each leg on its own ladder (``legs``: per chain)."""
    curves = []
    for c, (bc, t, lg) in enumerate(zip(betas, traces, legs)):
        acc = t.accept_prob.mean(axis=0)
        for name, lv, pairs in zip(variational.LEG_NAMES, variational.leg_levels(lg), variational.leg_pairs(lg)):
            curves.append(
                (
                    np.asarray(bc)[lv],
                    acc[pairs],
                    f"chain {c}, {name} leg ({len(lv)} levels)",
                    "o-" if name == "fixed" else "s--",
                )
            )
    return curves


def legs_figure(target, betas, traces, history, results):
    """Per round: each leg's barrier, its round trips (cumulative; with the whole chain's, counted as
    Pigeons.jl does: from either reference to the target and back to either reference), its number of
    levels (the split follows the barriers) and its mean swap acceptance."""
    rounds = [h["round"] for h in history]
    fig, axes = plt.subplots(1, 4, figsize=(17, 4.0))
    keys = ("barrier", "round_trips", "n_levels", "swap_accept")
    for name, style in zip(variational.LEG_NAMES, ("o-", "s--")):
        for ax, key in zip(axes, keys):
            ax.plot(rounds, [h.get(f"{key}_{name}", np.nan) for h in history], style, ms=4, label=f"{name} leg")
    axes[1].plot(rounds, [h["round_trips"] for h in history], "k^:", ms=4, label="whole chain (either reference)")
    titles = ("barrier Λ per leg", "round trips (cumulative)", "levels per leg", "mean swap acceptance")
    for ax, title in zip(axes, titles):
        ax.set_xlabel("round")
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.suptitle("Stabilized variational PT: the fixed and the variational leg")
    fig.tight_layout()
    return fig

"""The figure of log Z bounds against beta, logged to MLflow."""

from __future__ import annotations

import numpy as np

from pgmflow.core.plotting import plt


def bounds_figure(betas, curves: dict, exact, tempering, tempering_se, title: str = "") -> plt.Figure:
    """log Z per spin against beta: MF lower bound, TRW upper bound, Bethe, the exact value where
    known, and the tempering estimate with a +-2 SE band."""
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(7, 7), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    b = np.asarray(betas, dtype=np.float64)
    style = {
        "mf": ("tab:blue", "mean field (lower bound)"),
        "bethe": ("tab:green", "Bethe (loopy BP)"),
        "trw": ("tab:red", "TRW (upper bound)"),
    }
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

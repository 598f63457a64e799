"""The forecast figure of a one-input fit scored on rows beyond its training range (``gp_data.forecast_from``
of the CO2 record, or a ``gp_data.test_path``): the data, the predictive mean and its 95 % band from the
start of the training rows to past the last scored row, and where training ends."""

from __future__ import annotations

import numpy as np

from pgmflow.core.plotting import plt
from pgmflow.tasks.gp.chunks import predict_f

POINTS = 1200  # grid points of the figure
BEYOND = 0.05  # the grid runs this share of the whole span past the last row


def forecast_figure(pred, data, test_rows) -> plt.Figure:
    """Predictive mean and 95 % band (``y``: latent variance plus the noise) in original units over the
    training rows of ``data`` (one input) and the scored rows ``test_rows``, from ``pred`` (a
    ``pgmflow.tasks.gp.chunks.Predictor``)."""
    std = data.standardizer
    x_tr, y_tr = data.X[:, 0], data.y
    x_te, y_te = test_rows.X[:, 0], test_rows.y
    lo, hi = float(min(x_tr.min(), x_te.min())), float(max(x_tr.max(), x_te.max()))
    grid = np.linspace(lo, hi + BEYOND * (hi - lo), POINTS)
    mean_f, var_f = predict_f(pred, std.apply_X(grid[:, None]))
    mean = std.invert_mean(mean_f)
    sd = np.sqrt(std.invert_var(np.asarray(var_f) + pred.params.noise))
    fig, ax = plt.subplots(figsize=(10, 4.5))
    ax.plot(x_tr, y_tr, ".", ms=1.5, color="0.35", label="training rows")
    ax.plot(x_te, y_te, ".", ms=1.5, color="tab:red", label="held-out rows (forecast)")
    ax.plot(grid, mean, color="tab:blue", lw=1.0, label="predictive mean")
    ax.fill_between(grid, mean - 1.96 * sd, mean + 1.96 * sd, color="tab:blue", alpha=0.25, label="95 % band")
    ax.axvline(float(x_tr.max()), color="k", ls="--", lw=0.8, label="end of training")
    ax.set_xlabel(str(data.input_names[0]))
    ax.set_ylabel(str(data.target_name))
    ax.set_title(f"forecast past the end of training ({pred.method}, {pred.kernel})", fontsize=9)
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig

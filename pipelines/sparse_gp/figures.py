"""Figures of a sparse-GP run, logged to MLflow (matplotlib, Agg backend; never shown on screen):
the training bound against iteration, predictions with +-2 sigma bands on a 1-D slice, and the
lengthscales."""

from __future__ import annotations

import numpy as np

from pgmflow.core.plotting import plt

BOUND_NAMES = {
    "sgpr": "SGPR lower bound (Titsias 2009)",
    "dtc": "DTC log marginal likelihood",
    "fitc": "FITC log marginal likelihood",
    "svgp": "SVGP ELBO (full data)",
    "exact": "exact log marginal likelihood",
}


def bound_figure(method, trace, minibatch_trace=None) -> plt.Figure:
    """The training objective against iteration (SVGP: the full-data ELBO at evaluation steps and the
    minibatch estimates)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    if minibatch_trace:
        s = np.array([k for k, _ in minibatch_trace])
        v = np.array([v for _, v in minibatch_trace])
        ax.plot(s, v, color="0.75", lw=0.7, label="minibatch estimate")
    k = np.array([t[0] for t in trace])
    v = np.array([t[1] for t in trace])
    ax.plot(k, v, "o-", ms=3, color="tab:blue", label=BOUND_NAMES.get(method, method))
    if v.size > 1:  # zoom on the fit, not on a poor starting point
        lo, hi = float(np.min(v[1:])), float(np.max(v))
        pad = 0.1 * (hi - lo) if hi > lo else 1.0
        ax.set_ylim(lo - pad, hi + pad)
    ax.set_xlabel("step (minibatch)" if method == "svgp" else "L-BFGS iteration")
    ax.set_ylabel("objective (standardised units)")
    ax.set_title(f"{method}: training objective")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def slice_figure(method, xs, mean, var_y, var_f, input_name, target_name, others: str) -> plt.Figure:
    """Predictive mean with +-2 sigma bands of a new y (and of the latent f) while one input varies."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    sd_y, sd_f = np.sqrt(var_y), np.sqrt(var_f)
    ax.fill_between(xs, mean - 2 * sd_y, mean + 2 * sd_y, color="tab:blue", alpha=0.18, label="±2σ, new y")
    ax.fill_between(xs, mean - 2 * sd_f, mean + 2 * sd_f, color="tab:blue", alpha=0.35, label="±2σ, latent f")
    ax.plot(xs, mean, color="tab:blue", lw=1.5, label="predictive mean")
    ax.set_xlabel(str(input_name))
    ax.set_ylabel(str(target_name))
    ax.set_title(f"{method}: prediction along {input_name} ({others})", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def lengthscale_figure(names, lengthscales) -> plt.Figure:
    """One bar per input: its lengthscale in the input's original units (log axis; long = less relevant)."""
    names = [str(n) for n in names]
    d = len(names)
    fig, ax = plt.subplots(figsize=(max(5.0, min(16.0, 0.45 * d + 3)), 4))
    ax.bar(np.arange(d), lengthscales, color="tab:green")
    ax.set_xticks(np.arange(d))
    ax.set_xticklabels(names, rotation=45 if d > 8 else 0, ha="right" if d > 8 else "center", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("lengthscale (original input units)")
    ax.set_title("ARD lengthscales (shorter: the output varies faster along that input)")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return fig


def gp_figures(method, fit, sl, data, lengthscales) -> dict:
    """``{"bound": ..., "slice": ..., "lengthscales": ...}`` of a finished fit
    (``pgmflow.sparse_gp.fit.FitResult``), its slice (``pgmflow.sparse_gp.run.Slice``, with the
    latent mean and variance), the data (``GPData``) and the lengthscales in original units."""
    std, names, j, median = data.standardizer, data.input_names, sl.j, sl.median
    d = len(names)
    var_f = np.asarray(sl.var)
    others = (
        "the only input"
        if d == 1
        else (
            "other inputs at their training medians"
            if d > 4
            else ", ".join(f"{names[i]}={median[i]:.3g}" for i in range(d) if i != j)
        )
    )
    return {
        "bound": bound_figure(method, fit.trace, fit.minibatch_trace),
        "slice": slice_figure(
            method,
            sl.xs,
            std.invert_mean(sl.mean),
            std.invert_var(var_f + fit.predictor.params.noise),
            std.invert_var(var_f),
            names[j],
            data.target_name,
            others,
        ),
        "lengthscales": lengthscale_figure(names, lengthscales),
    }


def reliability_figure(rel, link: str) -> plt.Figure:
    """Bernoulli: the observed frequency of class 1 against the mean predicted probability, per bin of the
    predicted probability (``rel`` [3, bins]: rows, summed probabilities, positives; held-out rows), with
    the rows per bin below."""
    rows, psum, pos = (np.asarray(r, dtype=np.float64) for r in rel)
    bins = rows.shape[0]
    edges = np.linspace(0.0, 1.0, bins + 1)
    has = rows > 0
    fig, (ax, axn) = plt.subplots(2, 1, figsize=(5.5, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    ax.plot([0, 1], [0, 1], color="0.6", lw=1, ls="--", label="perfectly calibrated")
    ax.plot(psum[has] / rows[has], pos[has] / rows[has], "o-", color="tab:blue", label=f"SVGP, Bernoulli ({link})")
    ax.set_ylabel("observed frequency of class 1")
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"reliability on {int(rows.sum())} held-out rows", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    axn.bar(0.5 * (edges[:-1] + edges[1:]), rows, width=0.9 / bins, color="tab:blue", alpha=0.6)
    axn.set_xlabel("predicted probability of class 1")
    axn.set_ylabel("rows")
    axn.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return fig


def likelihood_figures(lik, params, sl, data, reliability=None) -> dict:
    """A non-Gaussian likelihood's figures: ``slice`` (replacing the Gaussian one) in what is observed --
    the class-1 probability with the band ``link^-1(mu +- 2 sd)`` (Bernoulli), the rate with ``exp(mu +- 2
    sd)`` (Poisson), the median and the 5 % and 95 % predictive quantiles of a new y (Student-t) -- and
    (Bernoulli, with held-out rows) ``reliability``."""
    from pgmflow.tasks.gp import likelihoods as glik

    std, names, j = data.standardizer, data.input_names, sl.j
    mu, var = np.asarray(sl.mean), np.asarray(sl.var)
    sd = np.sqrt(var)
    if lik.name == "bernoulli":
        inv = glik.class_probability
        mid = inv(lik, mu, var)
        lo, hi = inv(lik, mu - 2 * sd, 0 * var), inv(lik, mu + 2 * sd, 0 * var)
        what, band = "P(class 1)", "link⁻¹(μ ± 2σ) of the latent f"
    elif lik.name == "poisson":
        mid, lo, hi = np.exp(mu + var / 2), np.exp(mu - 2 * sd), np.exp(mu + 2 * sd)
        what, band = "rate E[exp f]", "exp(μ ± 2σ) of the latent f"
    else:
        q = glik.predictive_quantiles(lik, mu, var, (0.05, 0.5, 0.95), params.log_noise)
        lo, mid, hi = (std.invert_mean(q[:, i]) for i in range(3))
        what, band = f"median of a new {data.target_name}", "5 % - 95 % predictive quantiles"
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.fill_between(sl.xs, lo, hi, color="tab:blue", alpha=0.25, label=band)
    ax.plot(sl.xs, mid, color="tab:blue", lw=1.5, label=what)
    ax.set_xlabel(str(names[j]))
    ax.set_ylabel(str(data.target_name))
    ax.set_title(f"svgp, {lik.name} likelihood: prediction along {names[j]} (others at training medians)", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out = {"slice": fig}
    if reliability is not None and lik.name == "bernoulli":
        out["reliability"] = reliability_figure(reliability, lik.link)
    return out

"""Held-out log-likelihood of a pairwise binary MRF, with PT's log Z and the variational bracket.

Model (``pgmflow.tasks.bounds.mrf``): ``log P(x) = h.x + sum_{i<j} J_ij x_i x_j - log Z``. For held-out samples
``x_1..x_N`` the average log-likelihood is ``mean_n [h.x_n + sum_{i<j} J_ij x_ni x_nj] - log Z``. Its parts:

* ``log Z`` from parallel tempering, with PT's standard error (``se_log_z``);
* the sampling error of the mean over the N held-out samples (``se_samples``: the samples' own spread);
* the guaranteed bracket from the bounds: mean field is below log Z and TRW above it, so the log-likelihood
  lies in ``[mean - TRW, mean - MF]`` whatever PT says.

The *sandwich check*: a PT log Z outside ``[MF - 3 SE, TRW + 3 SE]`` (SE: PT's) cannot be right (the
bounds are guaranteed); it is reported as a failure (a mixing problem or a bug), never hidden.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pgmflow.tasks.bounds import mrf as _mrf


class HeldOut(NamedTuple):
    """The held-out log-likelihood of one model (per sample, in nats)."""

    log_lik: float  # mean_n log-potential(x_n) - log Z (PT's log Z)
    se_log_z: float  # PT's standard error of log Z (the same on the log-likelihood)
    se_samples: float  # standard error of the mean log-potential over the held-out samples
    lower: float  # mean log-potential - TRW: a guaranteed lower bound on the log-likelihood
    upper: float  # mean log-potential - MF: a guaranteed upper bound
    sandwich_ok: bool  # MF - 3 SE <= log Z (PT) <= TRW + 3 SE
    n_samples: int


def mean_log_potential(model: _mrf.PairwiseMRF, X) -> tuple[float, float]:
    """``mean_n [h.x_n + sum_e J_e x_ni x_nj]`` over samples ``X`` [N, n] of +-1 spins, and its standard error."""
    X = np.asarray(X)
    if X.ndim != 2 or X.shape[1] != model.n or X.shape[0] < 1:
        raise ValueError(f"X must have shape [N >= 1, {model.n}], got {X.shape}")
    if not np.all((X == 1) | (X == -1)):
        raise ValueError("X must hold +-1 spins")
    v = _mrf.energy_terms(model, X)  # [N]
    se = float(v.std(ddof=1) / np.sqrt(v.size)) if v.size > 1 else float("nan")
    return float(v.mean()), se


def sandwich_ok(log_z: float, se: float, mf: float, trw: float) -> bool:
    """Whether PT's log Z lies in ``[MF - 3 SE, TRW + 3 SE]`` (False also for a non-finite estimate)."""
    return bool(np.isfinite(log_z) and mf - 3.0 * se <= log_z <= trw + 3.0 * se)


def heldout_log_likelihood(model: _mrf.PairwiseMRF, X, log_z: float, se_log_z: float, mf: float, trw: float) -> HeldOut:
    """The held-out log-likelihood of ``model`` on samples ``X`` [N, n] (see the module docstring).

    log_z, se_log_z: PT's estimate of log Z and its SE; mf, trw: the mean-field and TRW bounds on log Z."""
    if not mf <= trw:
        raise ValueError(f"the bounds are not ordered: MF {mf} > TRW {trw}")
    mean, se = mean_log_potential(model, X)
    return HeldOut(
        log_lik=mean - float(log_z),
        se_log_z=float(se_log_z),
        se_samples=se,
        lower=mean - float(trw),
        upper=mean - float(mf),
        sandwich_ok=sandwich_ok(float(log_z), float(se_log_z), float(mf), float(trw)),
        n_samples=int(np.asarray(X).shape[0]),
    )

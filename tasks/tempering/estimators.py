"""Normalising-constant estimators from the per-level traces of a tempering run.

Inputs everywhere: ``betas`` float [K], strictly increasing (usually ``0 = b_0 < ... <
b_{K-1} = 1``), and ``loglik`` float [K, T], the log-likelihood ``l(x) = log gamma(x) - log
ref(x)`` of the state at level k after each of T scans (autocorrelated MCMC output). With
``Z(b) = int ref(x) exp(b l(x)) dx`` both estimators target

    log Z(b_{K-1}) / Z(b_0)     (= log Z_target - log Z_ref on the full ladder).

Standard errors treat levels as independent and account for autocorrelation within a level
through the effective sample size (``diagnostics.effective_sample_size``). Replicas of PT that
swap do correlate the levels slightly; the se ignores that.

- :func:`stepping_stone`: Xie, Lewis, Fan, Kuo, Chen (2011, Syst. Biol.) stepping-stone sampling
  (the "ratio of normalising constants" telescoping product); forward direction by default.
- :func:`thermodynamic_integration`: Gelman and Meng (1998, Stat. Sci.) path sampling /
  Ogata (1989) thermodynamic integration, trapezoid rule over the ladder.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pgmflow.tasks.tempering.diagnostics import effective_sample_size
from pgmflow.tasks.tempering.schedule import check_betas

__all__ = [
    "LogZEstimate",
    "LevelSummary",
    "stepping_stone",
    "stepping_stone_both",
    "thermodynamic_integration",
    "per_level_summary",
]


class LogZEstimate(NamedTuple):
    """An estimate of ``log Z(b_{K-1}) / Z(b_0)`` and its Monte Carlo standard error.

    Fields:
        estimate: float, the log ratio of normalising constants.
        se: float, Monte Carlo standard error (delta method, ESS-corrected; excludes any
            discretisation bias of the ladder).
    """

    estimate: float
    se: float


class LevelSummary(NamedTuple):
    """Per-level summary of a trace [K, T] (every field float64 [K]).

    Fields:
        mean: sample mean over the T draws.
        var: sample variance (ddof=1).
        ess: effective sample size (Geyer's initial monotone sequence).
        mcse: Monte Carlo standard error of the mean, ``sqrt(var / ess)``.
    """

    mean: np.ndarray
    var: np.ndarray
    ess: np.ndarray
    mcse: np.ndarray


def _check_inputs(betas, loglik) -> tuple[np.ndarray, np.ndarray]:
    b = check_betas(betas)
    ll = np.asarray(loglik, dtype=np.float64)
    if ll.ndim != 2 or ll.shape[0] != b.shape[0]:
        raise ValueError(f"loglik must have shape [K, T] with K = len(betas) = {b.shape[0]}; got {ll.shape}")
    if ll.shape[1] < 2:
        raise ValueError(f"loglik needs at least 2 draws per level; got T = {ll.shape[1]}")
    if not np.all(np.isfinite(ll)):
        bad = sorted(set(np.argwhere(~np.isfinite(ll))[:, 0].tolist()))
        raise ValueError(f"loglik has non-finite values at levels {bad}")
    return b, ll


def _log_mean_exp_with_se(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """log mean_t exp(a_{k,t}) and its delta-method se, per row of a [M, T].

    With weights ``w = exp(a - max a)`` (shifted for stability; the shift cancels in the se),
    ``var(log mean w) ≈ var(w) / (ESS(w) * mean(w)^2)``.
    """
    shift = np.max(a, axis=1, keepdims=True)  # [M, 1]
    w = np.exp(a - shift)  # [M, T], max 1 per row
    mean_w = np.mean(w, axis=1)  # [M]
    log_r = shift[:, 0] + np.log(mean_w)
    var_w = np.var(w, axis=1, ddof=1)
    ess_w = effective_sample_size(w)
    var_log_r = var_w / (ess_w * mean_w**2)
    return log_r, var_log_r


def stepping_stone(betas, loglik, direction: str = "forward") -> LogZEstimate:
    """Stepping-stone estimate of ``log Z(b_{K-1}) / Z(b_0)`` (Xie et al. 2011).

    forward (default): ``sum_{k=0}^{K-2} log mean_t exp((b_{k+1}-b_k) l_{k,t})``, each ratio
        ``Z(b_{k+1}) / Z(b_k) = E_{pi_{b_k}}[exp((b_{k+1}-b_k) l)]`` from the draws of level k
        (levels 0..K-2; the target level's draws are unused).
    reverse: ``-sum_{k=0}^{K-2} log mean_t exp(-(b_{k+1}-b_k) l_{k+1,t})``, each ratio
        ``Z(b_k) / Z(b_{k+1}) = E_{pi_{b_{k+1}}}[exp(-(b_{k+1}-b_k) l)]`` from level k+1.

    Both are computed with log-sum-exp. The se is the delta method per level with the ESS of
    the importance weights, levels summed as independent. Each ratio estimate is consistent;
    the log introduces a bias of order se^2 / 2 (downward for forward, upward for reverse), so
    a forward/reverse gap much larger than the se signals too few levels or too few draws.

    Args:
        betas: float [K], strictly increasing.
        loglik: float [K, T], finite.
        direction: "forward" or "reverse".

    Returns:
        LogZEstimate(estimate, se).
    """
    b, ll = _check_inputs(betas, loglik)
    delta = np.diff(b)  # [K-1]
    if direction == "forward":
        log_r, var = _log_mean_exp_with_se(delta[:, None] * ll[:-1])  # [K-1]
        estimate = np.sum(log_r)
    elif direction == "reverse":
        log_r, var = _log_mean_exp_with_se(-delta[:, None] * ll[1:])  # [K-1]
        estimate = -np.sum(log_r)
    else:
        raise ValueError(f"direction must be 'forward' or 'reverse'; got {direction!r}")
    return LogZEstimate(float(estimate), float(np.sqrt(np.sum(var))))


def stepping_stone_both(betas, loglik) -> tuple[LogZEstimate, LogZEstimate]:
    """Forward and reverse stepping-stone estimates, ``(forward, reverse)``.

    See :func:`stepping_stone`; forward is the default single estimate elsewhere.
    """
    return (
        stepping_stone(betas, loglik, direction="forward"),
        stepping_stone(betas, loglik, direction="reverse"),
    )


def thermodynamic_integration(betas, loglik) -> LogZEstimate:
    """Thermodynamic integration (path sampling) estimate of ``log Z(b_{K-1}) / Z(b_0)``.

    ``d/db log Z(b) = E_{pi_b}[l]``, so ``log Z(1)/Z(0) = int_0^1 E_{pi_b}[l] db``; the integral
    is the trapezoid rule ``sum_k c_k mean_t l_{k,t}`` with weights ``c_0 = (b_1 - b_0)/2``,
    ``c_k = (b_{k+1} - b_{k-1})/2``, ``c_{K-1} = (b_{K-1} - b_{K-2})/2``.

    se^2 = sum_k c_k^2 var_k / ESS_k (levels independent). The se is the Monte Carlo error
    only: the trapezoid discretisation bias (of order max_k (b_{k+1}-b_k)^2 times the
    curvature of ``E_b[l]``) is NOT in it; refine the ladder or compare with
    :func:`stepping_stone`, which has no discretisation bias.

    Args:
        betas: float [K], strictly increasing.
        loglik: float [K, T], finite.

    Returns:
        LogZEstimate(estimate, se).
    """
    b, ll = _check_inputs(betas, loglik)
    db = np.diff(b)  # [K-1]
    c = np.zeros_like(b)  # [K], trapezoid weights
    c[:-1] += db / 2.0
    c[1:] += db / 2.0
    s = per_level_summary(ll)
    estimate = np.sum(c * s.mean)
    se = np.sqrt(np.sum(c**2 * s.var / s.ess))
    return LogZEstimate(float(estimate), float(se))


def per_level_summary(trace) -> LevelSummary:
    """Mean, variance, ESS and Monte Carlo standard error of each level of a trace.

    Args:
        trace: float [K, T] (any per-level trace: loglik, energies, magnetisation, ...), T >= 2.

    Returns:
        LevelSummary of float64 [K] arrays. A constant level has var 0, ess T and mcse 0.
    """
    x = np.asarray(trace, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] < 2:
        raise ValueError(f"trace must have shape [K, T] with T >= 2; got shape {x.shape}")
    mean = np.mean(x, axis=1)
    var = np.var(x, axis=1, ddof=1)
    constant = np.max(x, axis=1) == np.min(x, axis=1)
    var = np.where(constant, 0.0, var)
    ess = effective_sample_size(x)
    mcse = np.sqrt(var / ess)
    return LevelSummary(mean=mean, var=var, ess=ess, mcse=mcse)


def series_se(phi: np.ndarray) -> float:
    """SE of the mean of one (autocorrelated) series: sqrt(var / ESS)."""
    var = float(np.var(phi))
    if var == 0.0:
        return 0.0
    return float(np.sqrt(var / float(effective_sample_size(phi))))


def stepping_stone_joint(betas, loglik) -> LogZEstimate:
    """Stepping stone, mean of forward and reverse, with a *joint* standard error.

    The estimate is ``(forward + reverse) / 2`` (see :func:`stepping_stone`; their first-order
    biases of about -se^2/2 and +se^2/2 cancel). Its SE comes from the delta method applied to the
    whole estimator at once: to first order the error is the mean over scans of the influence
    series ``phi_t = sum_k w_{k,t} / mean(w_k) / 2 - sum_k v_{k+1,t} / mean(v_{k+1}) / 2`` (forward
    weights ``w = exp(delta_k l_k)``, reverse weights ``v = exp(-delta_k l_{k+1})``), so
    ``se = sqrt(var(phi) / ESS(phi))``. Unlike summing per-level variances as independent, this
    accounts for the correlation between levels at the same scan and across lags, which parallel
    tempering creates (swaps move one state through neighbouring levels).

    Args: betas float [K]; loglik float [K, T] (scan-aligned: column t is one scan of the chain).
    Returns: LogZEstimate(estimate, se).
    """
    est, phi = stepping_stone_influence(betas, loglik)
    return LogZEstimate(est, series_se(phi))


def stepping_stone_influence(betas, loglik) -> tuple[float, np.ndarray]:
    """The estimate of :func:`stepping_stone_joint` and its influence series ``phi`` [T] (the
    first-order error of the estimate is ``mean_t phi_t``); used to combine estimators that share
    scans (the two legs of a stabilized chain) with a joint SE."""
    b, ll = _check_inputs(betas, loglik)
    fwd = stepping_stone(b, ll, "forward").estimate
    rev = stepping_stone(b, ll, "reverse").estimate
    delta = np.diff(b)[:, None]  # [K-1, 1]
    a = delta * ll[:-1]
    w = np.exp(a - a.max(axis=1, keepdims=True))  # [K-1, T]
    c = -delta * ll[1:]
    v = np.exp(c - c.max(axis=1, keepdims=True))  # [K-1, T]
    phi = 0.5 * (w / w.mean(axis=1, keepdims=True)).sum(axis=0) - 0.5 * (v / v.mean(axis=1, keepdims=True)).sum(axis=0)
    return 0.5 * (fwd + rev), phi


def thermodynamic_integration_joint(betas, loglik) -> LogZEstimate:
    """Thermodynamic integration (trapezoid rule) with a joint SE: the SE of the mean over scans of
    ``phi_t = sum_k c_k l_{k,t}`` (``c_k`` the trapezoid weights), which keeps the correlations
    between levels. The discretisation bias is not in the SE."""
    est, phi = thermodynamic_integration_influence(betas, loglik)
    return LogZEstimate(est, series_se(phi))


def thermodynamic_integration_influence(betas, loglik) -> tuple[float, np.ndarray]:
    """The estimate of :func:`thermodynamic_integration_joint` and its series ``sum_k c_k l_{k,t}`` [T]."""
    b, ll = _check_inputs(betas, loglik)
    est = thermodynamic_integration(b, ll).estimate
    d = np.diff(b)
    c = np.zeros_like(b)
    c[:-1] += 0.5 * d
    c[1:] += 0.5 * d
    return est, (c[:, None] * ll).sum(axis=0)

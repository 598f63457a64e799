"""MCMC and parallel-tempering diagnostics: pure functions over plain arrays.

Contents

- :func:`autocorrelation`: normalised autocorrelation along the last axis (FFT).
- :func:`effective_sample_size` / :func:`integrated_autocorrelation_time`: Geyer's (1992)
  initial monotone positive-sequence estimator, as in Stan (Stan Reference Manual, "Effective
  sample size"; the "sample size inflation factor" of the lecture notes is ``tau = T / ESS``).
- :func:`split_rhat`: split-R-hat (Gelman et al., BDA3, sec. 11.4), optionally the rank-normalised
  version of Vehtari, Gelman, Simpson, Carpenter, Buerkner (2021, Bayesian Analysis).
- :func:`round_trip_init` / :func:`round_trip_update`: streaming count of round trips of replicas
  through the ladder (Syed, Bouchard-Cote, Deligiannidis, Doucet 2021, JRSSB: a round
  trip is a walk of a replica's level index from 0 to K-1 and back to 0; with two references,
  Pigeons.jl's: from either reference to the target and back to either reference) and of
  tempered restarts (reference -> target).
- :func:`swap_rejection_from_acceptance`: mean swap rejection probability of each adjacent pair,
  the ``r(b_k, b_{k+1})`` that Syed et al. (2021) use to estimate the communication
  barrier (see :mod:`pgmflow.tasks.tempering.schedule`).

Conventions: the time (draw / scan) axis is the *last* axis unless a docstring says otherwise;
all outputs are float64 (counts int64); inputs are never modified.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import scipy.fft
import scipy.special
import scipy.stats

__all__ = [
    "autocorrelation",
    "effective_sample_size",
    "integrated_autocorrelation_time",
    "split_rhat",
    "RoundTripState",
    "round_trip_init",
    "round_trip_update",
    "end_levels",
    "swap_rejection_from_acceptance",
]


# ----------------------------------------------------------------------------------------------
# Autocorrelation and effective sample size
# ----------------------------------------------------------------------------------------------


def _as_series(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 0:
        raise ValueError("x must have at least one axis (time is the last axis); got a scalar")
    if x.shape[-1] < 1:
        raise ValueError(f"x must have at least one draw along its last axis; got shape {x.shape}")
    return x


def autocorrelation(x, max_lag: int | None = None) -> np.ndarray:
    """Normalised autocorrelation ``rho_t`` of each series along the last axis.

    Uses the biased (divide-by-T) autocovariance ``c_t = (1/T) sum_{s<T-t} (x_s - m)(x_{s+t} - m)``
    computed by FFT with zero padding, and ``rho_t = c_t / c_0`` (the positive-definite form
    Geyer's estimator assumes).

    Args:
        x: float [..., T].
        max_lag: largest lag returned, 0 <= max_lag <= T-1 (default T-1).

    Returns:
        float64 [..., max_lag+1] with ``rho_0 = 1``. A constant series (all draws equal) gets
        1 at lag 0 and 0 elsewhere; a series containing NaN gets NaN everywhere.
    """
    x = _as_series(x)
    T = x.shape[-1]
    if max_lag is None:
        max_lag = T - 1
    max_lag = int(max_lag)
    if not 0 <= max_lag <= T - 1:
        raise ValueError(f"max_lag must be in [0, T-1] = [0, {T - 1}]; got {max_lag}")

    # Exactly constant series: decided on the raw values, not on x - mean (which may leave
    # rounding residue of order 1e-17 and a meaningless correlation of 1 at every lag).
    constant = np.max(x, axis=-1) == np.min(x, axis=-1)  # [...]
    xc = x - np.mean(x, axis=-1, keepdims=True)
    n_fft = scipy.fft.next_fast_len(2 * T, real=True)
    f = scipy.fft.rfft(xc, n=n_fft, axis=-1)
    acov = scipy.fft.irfft(f.real**2 + f.imag**2, n=n_fft, axis=-1)[..., : max_lag + 1] / T
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = acov / acov[..., :1]
    rho[..., 0] = np.where(np.isnan(acov[..., 0]), np.nan, 1.0)
    unit = np.zeros(max_lag + 1)
    unit[0] = 1.0
    rho = np.where(constant[..., None], unit, rho)
    return rho


def effective_sample_size(x) -> np.ndarray:
    """Effective sample size of each series along the last axis (single chain per series).

    Geyer's (1992) initial monotone positive-sequence estimator, as in Stan: with the
    autocorrelations ``rho_t`` of :func:`autocorrelation` and pair sums
    ``P_k = rho_{2k} + rho_{2k+1}``, keep the initial run of strictly positive ``P_k`` (``P_0``
    always), make it non-increasing (``P_k <- min(P_0..P_k)``), and set

        tau = -1 + 2 * sum_k P_k,        ESS = T / tau.

    Cap (documented, as Stan's ``tau >= 1/log10(S)``): for antithetic series ``tau`` may fall
    below 1; it is floored at ``min(1, 1/log10(T))``, so ``ESS <= max(T, T * log10(T))``.
    A constant series gives ``ESS = T``; a series containing NaN gives NaN.

    Args:
        x: float [..., T].

    Returns:
        float64 [...].
    """
    x = _as_series(x)
    T = x.shape[-1]
    rho = autocorrelation(x)  # [..., T]
    if T % 2:
        rho = np.concatenate([rho, np.zeros(rho.shape[:-1] + (1,))], axis=-1)
    pairs = rho[..., 0::2] + rho[..., 1::2]  # [..., ceil(T/2)]
    positive = pairs > 0
    positive[..., 0] = True
    keep = np.logical_and.accumulate(positive, axis=-1)
    monotone = np.minimum.accumulate(pairs, axis=-1)
    tau = -1.0 + 2.0 * np.sum(np.where(keep, monotone, 0.0), axis=-1)
    tau_floor = min(1.0, 1.0 / np.log10(T)) if T > 1 else 1.0
    tau = np.maximum(tau, tau_floor)
    tau = np.where(np.isnan(rho[..., 0]), np.nan, tau)
    return T / tau


def integrated_autocorrelation_time(x) -> np.ndarray:
    """Integrated autocorrelation time ``tau = T / ESS`` (the sample size inflation factor).

    Args:
        x: float [..., T].

    Returns:
        float64 [...]; 1 for iid draws, ``(1+rho)/(1-rho)`` for an AR(1) with coefficient rho.
    """
    x = _as_series(x)
    return x.shape[-1] / effective_sample_size(x)


# ----------------------------------------------------------------------------------------------
# Split R-hat
# ----------------------------------------------------------------------------------------------


def _split_chains(chains: np.ndarray) -> np.ndarray:
    """[..., C, T] -> [..., 2C, T//2]; the middle draw is dropped when T is odd (as Stan)."""
    T = chains.shape[-1]
    n = T // 2
    first = chains[..., :n]
    second = chains[..., T - n :]
    return np.concatenate([first, second], axis=-2)


def _rhat_classic(split: np.ndarray) -> np.ndarray:
    """BDA3 potential scale reduction of [..., M, n] (M chains of n draws each)."""
    n = split.shape[-1]
    means = np.mean(split, axis=-1)  # [..., M]
    W = np.mean(np.var(split, axis=-1, ddof=1), axis=-1)  # [...]
    B_over_n = np.var(means, axis=-1, ddof=1)  # [...]
    var_plus = (n - 1) / n * W + B_over_n
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.sqrt(var_plus / W)
    # W == 0: all chains constant; equal constants -> 1, different constants -> inf.
    r = np.where(W == 0, np.where(B_over_n == 0, 1.0, np.inf), r)
    return np.where(np.isnan(W) | np.isnan(B_over_n), np.nan, r)


def _rank_normalise(split: np.ndarray) -> np.ndarray:
    """Rank normalisation of Vehtari et al. (2021), jointly over all chains of a group.

    z = Phi^{-1}((r - 3/8) / (S + 1/4)) with r the average rank among all S = M * n draws.
    """
    shape = split.shape
    flat = split.reshape(shape[:-2] + (shape[-2] * shape[-1],))
    S = flat.shape[-1]
    ranks = scipy.stats.rankdata(flat, method="average", axis=-1)
    z = scipy.special.ndtri((ranks - 0.375) / (S + 0.25))
    return z.reshape(shape)


def split_rhat(chains, rank_normalize: bool = False) -> np.ndarray:
    """Split-R-hat of each group of chains.

    Each chain is split into halves (the middle draw dropped when T is odd), giving M = 2C
    chains of n = T//2 draws, and the BDA3 (Gelman et al. 2013, sec. 11.4) statistic is

        W = mean_j s_j^2,  B/n = var_j(mean_j),  var+ = (n-1)/n W + B/n,  R = sqrt(var+ / W).

    With ``rank_normalize=False`` (default) this is the classic split-R-hat of BDA3. With
    ``rank_normalize=True`` it is Vehtari et al. (2021): the maximum of the
    split-R-hat of the rank-normalised draws ("bulk") and of the rank-normalised folded draws
    ``|x - median|`` ("tail").

    Args:
        chains: float [..., C, T], C >= 1 chains of T draws (one chain is split in two).
        rank_normalize: use the rank-normalised variant of Vehtari et al. (2021).

    Returns:
        float64 [...]. NaN when T < 4 or when any draw is NaN; 1 when every draw of a group is
        equal; inf when each split chain is constant but they differ.
    """
    chains = np.asarray(chains, dtype=np.float64)
    if chains.ndim < 2:
        raise ValueError(f"chains must have shape [..., C, T]; got shape {chains.shape}")
    if chains.shape[-2] < 1:
        raise ValueError(f"chains must hold at least one chain (C >= 1); got shape {chains.shape}")
    T = chains.shape[-1]
    if T < 4:
        return np.full(chains.shape[:-2], np.nan)
    split = _split_chains(chains)  # [..., 2C, n]
    has_nan = np.any(np.isnan(split), axis=(-2, -1))
    if not rank_normalize:
        return _rhat_classic(split)
    safe = np.where(has_nan[..., None, None], 0.0, split)
    bulk = _rhat_classic(_rank_normalise(safe))
    med = np.median(safe, axis=(-2, -1), keepdims=True)
    tail = _rhat_classic(_rank_normalise(np.abs(safe - med)))
    return np.where(has_nan, np.nan, np.maximum(bulk, tail))


# ----------------------------------------------------------------------------------------------
# Round trips
# ----------------------------------------------------------------------------------------------


class RoundTripState(NamedTuple):
    """Streaming round-trip counter for R replicas (Syed et al. 2021; Pigeons.jl's ``RoundTripRecorder``).

    A replica's walk over the levels is reduced to its visits to the *reference* levels and the
    *target* levels (by default level 0 and level K-1; a two-leg chain has two of each, see
    :func:`round_trip_update`).

    Fields:
        phase: int64 [R], where each replica is in its current trip:
            0 = has not visited a reference level yet (a trip must start at a reference, so visits
                to a target level before that are ignored);
            1 = its last visit to an end was a reference level (on the way to the target);
            2 = has reached a target level since its last visit to a reference (on the way back).
        trips: int64 [R], completed round trips reference -> target -> reference of each replica.
        restarts: int64 [R], *tempered restarts* of each replica: arrivals at a target level
            coming from a reference (the 1 -> 2 transitions; Surjanovic et al. 2022, Pigeons'
            ``n_tempered_restarts``). ``trips <= restarts <= trips + 1``.
    """

    phase: np.ndarray
    trips: np.ndarray
    restarts: np.ndarray | None = None


def round_trip_init(n_replicas: int) -> RoundTripState:
    """Empty round-trip state: every replica in phase 0 with 0 trips and 0 restarts.

    Returns:
        RoundTripState with ``phase``, ``trips`` and ``restarts`` int64 [n_replicas] of zeros.
    """
    n_replicas = int(n_replicas)
    if n_replicas < 1:
        raise ValueError(f"n_replicas must be >= 1; got {n_replicas}")
    z = np.zeros(n_replicas, dtype=np.int64)
    return RoundTripState(phase=z, trips=z.copy(), restarts=z.copy())


def end_levels(n_levels: int, references=(0,), targets=None) -> np.ndarray:
    """The end code of each level for :func:`round_trip_update`: int8 [K] with 0 at the reference
    levels, 1 at the target levels (default: the last level) and -1 elsewhere.

    A one-leg ladder: references (0,), targets (K-1,). A two-leg (stabilized) chain of Pigeons.jl's
    ``VariationalDEO``: references (0, K-1) (the fixed and the variational reference) and targets the
    two levels at b = 1 where the legs join.
    """
    K = int(n_levels)
    ends = np.full(K, -1, dtype=np.int8)
    ends[np.asarray(targets if targets is not None else (K - 1,), dtype=np.int64)] = 1
    ref = np.asarray(references, dtype=np.int64)
    if np.any(ends[ref] == 1):
        raise ValueError(
            f"a level cannot be both a reference and a target: references {ref.tolist()}, "
            f"targets {np.flatnonzero(ends == 1).tolist()}"
        )
    ends[ref] = 0
    return ends


def round_trip_update(state: RoundTripState, level_trace, n_levels: int, ends=None) -> RoundTripState:
    """Advance the round-trip counter over a chunk of scans.

    A round trip of a replica is completed at the first scan at which it is at a reference level
    after having been at a target level after having been at a reference level (Pigeons.jl's
    definition; with the default ends: 0 -> K-1 -> 0). Only visits to the ends matter, so the count
    is the number of "target -> reference" transitions in each replica's sequence of end visits
    (target visits before its first reference visit ignored), and the restarts are the
    "reference -> target" transitions. Streaming: updating on consecutive chunks gives exactly the
    counts of one update on their concatenation.

    Args:
        state: RoundTripState for R replicas (not modified).
        level_trace: int [T, R], the level (0..K-1) of each replica at each scan, in time order.
            T may be 0.
        n_levels: K >= 2.
        ends: int8 [K] from :func:`end_levels` (default: reference level 0, target level K-1).

    Returns:
        a new RoundTripState.
    """
    K = int(n_levels)
    if K < 2:
        raise ValueError(f"n_levels must be >= 2 for round trips; got {n_levels}")
    code = end_levels(K) if ends is None else np.asarray(ends, dtype=np.int8)
    if code.shape != (K,):
        raise ValueError(f"ends must have shape [n_levels] = [{K}]; got {code.shape}")
    phase = np.asarray(state.phase, dtype=np.int64)
    trips = np.asarray(state.trips, dtype=np.int64)
    R = phase.shape[0]
    restarts = np.zeros(R, dtype=np.int64) if state.restarts is None else np.asarray(state.restarts, dtype=np.int64)
    levels = np.asarray(level_trace)
    if levels.ndim != 2 or levels.shape[1] != R:
        raise ValueError(f"level_trace must have shape [T, R] with R = {R} replicas; got shape {levels.shape}")
    if levels.size and not np.issubdtype(levels.dtype, np.integer):
        if not np.all(np.isfinite(levels)) or np.any(levels != np.round(levels)):
            raise ValueError("level_trace must hold integer levels")
        levels = levels.astype(np.int64)
    if levels.size and (levels.min() < 0 or levels.max() > K - 1):
        raise ValueError(
            f"level_trace values must lie in [0, n_levels-1] = [0, {K - 1}]; got range [{levels.min()}, {levels.max()}]"
        )
    if np.any((phase < 0) | (phase > 2)):
        raise ValueError("state.phase must hold values in {0, 1, 2}")
    T = levels.shape[0]
    if T == 0:
        return RoundTripState(phase=phase.copy(), trips=trips.copy(), restarts=restarts.copy())

    # end visits: -1 = interior level, 0 = a reference level, 1 = a target level
    ends_v = code[levels]  # [T, R]
    # targets before the first reference visit of a replica still in phase 0 do not start a trip
    seen_bottom = np.logical_or.accumulate(ends_v == 0, axis=0) | (phase != 0)[None, :]
    ends_v = np.where((ends_v == 1) & ~seen_bottom, np.int8(-1), ends_v)

    # forward-fill the last end visited, seeded by the state (-1, 0, 1 for phase 0, 1, 2)
    ext = np.concatenate([(phase - 1).astype(np.int8)[None, :], ends_v], axis=0)  # [T+1, R]
    idx = np.where(ext >= 0, np.arange(T + 1)[:, None], 0)
    idx = np.maximum.accumulate(idx, axis=0)
    last_end = np.take_along_axis(ext, idx, axis=0)  # [T+1, R], last end up to each row
    completed = (ends_v == 0) & (last_end[:-1] == 1)  # [T, R]
    restarted = (ends_v == 1) & (last_end[:-1] == 0)  # [T, R]
    return RoundTripState(
        phase=last_end[-1].astype(np.int64) + 1,
        trips=trips + np.sum(completed, axis=0, dtype=np.int64),
        restarts=restarts + np.sum(restarted, axis=0, dtype=np.int64),
    )


# ----------------------------------------------------------------------------------------------
# Swap statistics
# ----------------------------------------------------------------------------------------------


def swap_rejection_from_acceptance(accept_prob) -> np.ndarray:
    """Mean swap rejection probability of each adjacent pair, ``r_k = 1 - mean_t alpha_{t,k}``.

    Averaging the acceptance *probabilities*
    ``alpha = min(1, exp((b_{k+1}-b_k)(l(x_k)-l(x_{k+1}))))`` rather than the accept/reject
    indicators is the Rao-Blackwellised estimate Syed et al. (2021) use for the communication
    barrier.

    Args:
        accept_prob: float [T, K-1], the acceptance probability of pair (k, k+1) at scan t, NaN
            where that pair was not proposed at that scan (e.g. the odd pairs at an even scan of
            non-reversible PT).

    Returns:
        float64 [K-1]; NaN for a pair never proposed (schedule adaptation rejects NaN, so a
        caller must handle it).
    """
    a = np.asarray(accept_prob, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"accept_prob must have shape [T, K-1]; got shape {a.shape}")
    finite = a[~np.isnan(a)]
    if np.any(np.isinf(finite)) or np.any((finite < 0.0) | (finite > 1.0)):
        raise ValueError(
            "accept_prob must hold probabilities in [0, 1] (or NaN for pairs not proposed); "
            f"got range [{finite.min()}, {finite.max()}]"
        )
    counts = np.sum(~np.isnan(a), axis=0)
    sums = np.nansum(a, axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_accept = sums / counts
    return np.where(counts > 0, 1.0 - mean_accept, np.nan)

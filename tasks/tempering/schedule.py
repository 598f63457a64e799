"""Tempering schedules (annealing ladders) and their adaptation from swap statistics.

The ladder is ``0 = b_0 < b_1 < ... < b_{K-1} = 1`` on the path ``pi_b ∝ ref * exp(b * l)``
(see :mod:`pgmflow.tasks.tempering.targets`). Adaptation follows Syed, Bouchard-Cote, Deligiannidis,
Doucet (2021, JRSSB) "Non-reversible parallel tempering: a scalable highly parallel MCMC
scheme" (also Pigeons.jl, ``communication_barriers`` / ``optimal_schedule``):

- the mean swap rejection probability of pair (k, k+1) estimates the increment of the
  *cumulative communication barrier* ``Lambda(b) = int_0^b lambda(b') db'``:
  ``r(b_k, b_{k+1}) ≈ Lambda(b_{k+1}) - Lambda(b_k)``;
- the *global communication barrier* is ``Lambda = Lambda(1) ≈ sum_k r_k``;
- the optimal ladder of n levels equalises the rejection rates:
  ``b_i = Lambda^{-1}(Lambda * i / (n - 1))`` with ``Lambda(.)`` a monotone interpolant
  (Fritsch-Carlson in Pigeons, scipy's PCHIP here) through ``(b_k, sum_{j<k} r_j)``.

Everything is deterministic: the same inputs give the same bits.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.interpolate
import scipy.optimize

__all__ = [
    "REJECTION_FLOOR",
    "initial_schedule",
    "communication_barrier",
    "adapt_schedule",
    "optimal_n_levels",
    "round_trip_rate",
]

#: Rejection rates below this are raised to it before the barrier is interpolated, so that the
#: interpolant is strictly increasing (hence invertible) across pairs that never reject. The
#: barrier it adds, REJECTION_FLOOR * (K-1), is negligible for any ladder in practice.
REJECTION_FLOOR = 1e-10


def check_betas(betas, name: str = "betas", endpoints: bool = False) -> np.ndarray:
    """Validate a ladder: float64 [K], K >= 2, finite, strictly increasing.

    With ``endpoints=True`` also require ``b_0 == 0`` and ``b_{K-1} == 1`` exactly. Raises
    ValueError naming the problem; returns the ladder as a new float64 array.
    """
    b = np.array(betas, dtype=np.float64)
    if b.ndim != 1 or b.shape[0] < 2:
        raise ValueError(f"{name} must be a 1-D array of K >= 2 levels; got shape {b.shape}")
    if not np.all(np.isfinite(b)):
        raise ValueError(f"{name} must be finite; got {b.tolist()}")
    if not np.all(np.diff(b) > 0):
        raise ValueError(f"{name} must be strictly increasing; got {b.tolist()}")
    if endpoints and (b[0] != 0.0 or b[-1] != 1.0):
        raise ValueError(f"{name} must start at exactly 0 and end at exactly 1; got {b[0]} .. {b[-1]}")
    return b


def _check_rejection(rejection, n_levels: int) -> np.ndarray:
    r = np.array(rejection, dtype=np.float64)
    if r.shape != (n_levels - 1,):
        raise ValueError(
            f"rejection must have shape [K-1] = [{n_levels - 1}] (one rate per adjacent pair); got shape {r.shape}"
        )
    if np.any(np.isnan(r)):
        bad = np.flatnonzero(np.isnan(r)).tolist()
        raise ValueError(
            f"rejection is NaN for pairs {bad} (pairs never proposed?); estimate them before adapting the schedule"
        )
    if np.any((r < 0.0) | (r > 1.0)):
        raise ValueError(f"rejection rates must lie in [0, 1]; got {r.tolist()}")
    return r


def initial_schedule(n_levels: int, kind: str = "linear", power: float = 3.0) -> np.ndarray:
    """A first ladder before any adaptation.

    Args:
        n_levels: K >= 2.
        kind: "linear" (``b_k = k/(K-1)``) or "power" (``b_k = (k/(K-1))^power``; power > 1 puts
            more levels near the reference, where the path usually changes fastest; power = 1/0.3
            is the Beta(0.3, 1)-quantile ladder of Xie et al. 2011 for stepping stone).
        power: exponent of the "power" ladder (> 0); ignored for "linear".

    Returns:
        float64 [K], ``b_0 = 0``, ``b_{K-1} = 1`` exactly, strictly increasing.
    """
    K = int(n_levels)
    if K < 2:
        raise ValueError(f"n_levels must be >= 2; got {n_levels}")
    u = np.arange(K, dtype=np.float64) / (K - 1)
    u[-1] = 1.0
    if kind == "linear":
        b = u
    elif kind == "power":
        if not (np.isfinite(power) and power > 0):
            raise ValueError(f"power must be a finite number > 0; got {power}")
        b = u**power
    else:
        raise ValueError(f"kind must be 'linear' or 'power'; got {kind!r}")
    b[0], b[-1] = 0.0, 1.0
    if not np.all(np.diff(b) > 0):
        raise ValueError(
            f"the {kind} ladder with n_levels={K}, power={power} is not strictly increasing in "
            "float64 (levels underflow); use a smaller power or fewer levels"
        )
    return b


def communication_barrier(betas, rejection) -> tuple[float, np.ndarray]:
    """Global and cumulative communication barrier at the ladder (Syed et al. 2021).

    Args:
        betas: float [K], strictly increasing.
        rejection: float [K-1], mean swap rejection probability of each adjacent pair (k, k+1),
            in [0, 1] (e.g. from ``diagnostics.swap_rejection_from_acceptance``).

    Returns:
        (Lambda, cumulative): Lambda = sum_k rejection[k] (float); cumulative float64 [K] with
        ``cumulative[0] = 0`` and ``cumulative[k] = sum_{j<k} rejection[j]`` (the estimate of
        ``Lambda(b_k)``).
    """
    b = check_betas(betas)
    r = _check_rejection(rejection, b.shape[0])
    cumulative = np.concatenate([[0.0], np.cumsum(r)])
    return float(cumulative[-1]), cumulative


def adapt_schedule(betas, rejection, n_levels: int | None = None) -> np.ndarray:
    """Ladder that equalises the swap rejection rates (Syed et al. 2021, schedule optimisation).

    Fits the monotone cubic (PCHIP) interpolant ``Lambda(b)`` through ``(b_k, cumulative_k)``
    (rejections below :data:`REJECTION_FLOOR` raised to it, so ``Lambda`` is strictly
    increasing) and returns ``b_i = Lambda^{-1}(Lambda(1) * i / (n-1))``, each root found by
    Brent's method inside the knot interval that brackets it.

    Args:
        betas: float [K], ``b_0 = 0``, ``b_{K-1} = 1``, strictly increasing.
        rejection: float [K-1] in [0, 1], mean rejection of each adjacent pair; NaN is an error.
        n_levels: n >= 2 levels of the new ladder (default K).

    Returns:
        float64 [n], endpoints exactly 0 and 1, strictly increasing. When every rejection rate
        is equal and n = K, the ladder comes back unchanged (to root-finding precision, ~1e-15).
    """
    b = check_betas(betas, endpoints=True)
    r = _check_rejection(rejection, b.shape[0])
    n = b.shape[0] if n_levels is None else int(n_levels)
    if n < 2:
        raise ValueError(f"n_levels must be >= 2; got {n_levels}")

    cumulative = np.concatenate([[0.0], np.cumsum(np.maximum(r, REJECTION_FLOOR))])  # [K]
    barrier = scipy.interpolate.PchipInterpolator(b, cumulative, extrapolate=False)
    total = cumulative[-1]
    targets = total * np.arange(n, dtype=np.float64) / (n - 1)  # [n]

    new = np.empty(n, dtype=np.float64)
    new[0], new[-1] = 0.0, 1.0
    for i in range(1, n - 1):
        y = targets[i]
        # knot interval [b_j, b_{j+1}] with cumulative_j <= y < cumulative_{j+1}
        j = int(np.searchsorted(cumulative, y, side="right")) - 1
        j = min(max(j, 0), b.shape[0] - 2)
        if y == cumulative[j]:
            new[i] = b[j]
            continue
        lo, hi = b[j], b[j + 1]
        new[i] = scipy.optimize.brentq(
            lambda x: float(barrier(x)) - y,
            lo,
            hi,
            xtol=1e-15,
            rtol=4 * np.finfo(float).eps,
            maxiter=200,
        )
    if not np.all(np.diff(new) > 0):  # pragma: no cover - guarded by the floor above
        raise RuntimeError(f"adapted ladder is not strictly increasing: {new.tolist()}")
    return new


def optimal_n_levels(Lambda: float) -> int:
    """Suggested number of levels for a global barrier Lambda: ``max(2, ceil(2 Lambda) + 1)``.

    Informational rule of thumb (Syed et al. 2021; the Pigeons.jl docs): with about
    2 Lambda adjacent pairs each rejects about half of its swaps, and the round trip rate of
    non-reversible PT is within a constant factor of its ``N -> inf`` limit ``1/(2 + 2 Lambda)``.
    """
    Lambda = float(Lambda)
    if not (np.isfinite(Lambda) and Lambda >= 0):
        raise ValueError(f"Lambda must be a finite number >= 0; got {Lambda}")
    return max(2, math.ceil(2.0 * Lambda) + 1)


def round_trip_rate(rejection) -> float:
    """Round trips per scan of one replica in non-reversible PT, ``1 / (2 + 2 sum_k r_k/(1-r_k))``.

    Syed et al. (2021), round-trip-rate theorem for non-reversible PT; exact under their
    efficient-local-exploration assumption. Compare with the measured rate, total trips of
    ``diagnostics.round_trip_update`` divided by (scans * replicas). A pair with r_k = 1 gives 0.

    Args:
        rejection: float [K-1] in [0, 1].

    Returns:
        float.
    """
    r = np.array(rejection, dtype=np.float64)
    if r.ndim != 1 or np.any(np.isnan(r)) or np.any((r < 0) | (r > 1)):
        raise ValueError(f"rejection must be a 1-D array of rates in [0, 1]; got {r.tolist()}")
    if np.any(r == 1.0):
        return 0.0
    return float(1.0 / (2.0 + 2.0 * np.sum(r / (1.0 - r))))

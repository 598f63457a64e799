"""Variational references and two-leg (stabilized) paths for parallel tempering.

Surjanovic, Syed, Bouchard-Côté and Campbell (NeurIPS 2022), "Parallel tempering with a variational
reference": the reference end of the path ``pi_b ∝ q^(1-b) gamma^b`` is a member ``q`` of an
exponential family fitted, between rounds, to the samples of the target end. pgmflow fits ``q`` by
*moment matching* (the forward-KL fit ``argmin_q KL(pi || q)`` of a Gaussian family: the mean and
(co)variance of the target-end draws of the previous round), which is what the paper's round-based
scheme does for Gaussian families; it does not optimise the paper's other objectives.

Every reference here is normalised (``log Z_q = 0``) and has an exact sampler written as a map
``from_standard(z)`` of iid standard normals ``z [n, d]``, so the explorer draws the replica at
``b = 0`` exactly from the same numbers it uses for any reference.

Row independence: every per-row result (log density, gradient, sample) is computed with explicit
elementwise products and sums over the last axis, never BLAS matrix products, so a row's bits do not
depend on how many rows are evaluated together (bit-identical results for any blocking of replicas).

*Legs* (the stabilized scheme of the paper, Pigeons' ``StabilizedPT``): a chain of ``N = K0 + K1``
levels; levels ``0 .. K0-1`` are the fixed leg (``b`` from 0 to 1, reference ``refs[0]``) and levels
``K0 .. N-1`` the variational leg (``b`` from 1 back to 0, reference ``refs[1]``). Levels ``K0-1``
and ``K0`` both sample the target, so their swap is always accepted: the legs are joined at the
target end. A single-leg chain has ``legs = 0`` everywhere (``reference=fixed`` or ``variational``).
The split ``K0 : K1`` may change between rounds (:func:`stabilized_split`); round trips of a two-leg
chain are counted as Pigeons does (:func:`round_trip_ends`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

FAMILIES = ("diagonal", "full")
_LOG_2PI = math.log(2.0 * math.pi)


def _rowsum(a: np.ndarray) -> np.ndarray:
    return np.sum(a, axis=-1)


class DiagonalGaussian(NamedTuple):
    """Normalised ``N(mean, diag(std^2))``. mean, std: float64 [d]."""

    mean: np.ndarray
    std: np.ndarray

    @property
    def dim(self) -> int:
        return int(self.mean.shape[0])

    def log_density(self, x: np.ndarray) -> np.ndarray:
        """x [n, d] -> [n]."""
        z = (x - self.mean) / self.std
        return -0.5 * _rowsum(z * z) - _rowsum(np.log(self.std)) - 0.5 * self.dim * _LOG_2PI

    def grad_log_density(self, x: np.ndarray) -> np.ndarray:
        return -(x - self.mean) / self.std**2

    def from_standard(self, z: np.ndarray) -> np.ndarray:
        """Exact draws from iid standard normals z [n, d]."""
        return self.mean + self.std * z

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.from_standard(rng.standard_normal((n, self.dim)))


class FullGaussian(NamedTuple):
    """Normalised ``N(mean, L L^T)``. mean [d]; chol: lower-triangular [d, d]; chol_inv = L^-1 [d, d]."""

    mean: np.ndarray
    chol: np.ndarray
    chol_inv: np.ndarray

    @property
    def dim(self) -> int:
        return int(self.mean.shape[0])

    def _white(self, x):
        # w = L^-1 (x - mean), row by row: [n, d]
        return _rowsum(self.chol_inv[None, :, :] * (x - self.mean)[:, None, :])

    def log_density(self, x: np.ndarray) -> np.ndarray:
        w = self._white(x)
        return -0.5 * _rowsum(w * w) - float(np.sum(np.log(np.diag(self.chol)))) - 0.5 * self.dim * _LOG_2PI

    def grad_log_density(self, x: np.ndarray) -> np.ndarray:
        # -Sigma^-1 (x - mean) = -L^-T w: [n, d]
        w = self._white(x)
        return -_rowsum(self.chol_inv.T[None, :, :] * w[:, None, :])

    def from_standard(self, z: np.ndarray) -> np.ndarray:
        return self.mean + _rowsum(self.chol[None, :, :] * z[:, None, :])

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.from_standard(rng.standard_normal((n, self.dim)))


def full_gaussian(mean, cov) -> FullGaussian:
    """A :class:`FullGaussian` from its mean [d] and covariance [d, d] (symmetric positive definite)."""
    L = np.linalg.cholesky(np.asarray(cov, dtype=np.float64))
    L_inv = np.linalg.solve(L, np.eye(L.shape[0]))
    return FullGaussian(mean=np.asarray(mean, dtype=np.float64).copy(), chol=L, chol_inv=np.tril(L_inv))


class FitInfo(NamedTuple):
    """What a fit used: n draws, the family actually fitted (``full`` falls back to ``diagonal`` when
    n < 4 d), and the smallest variance (after the floor)."""

    n: int
    family: str
    min_var: float


def fit_gaussian(samples, family: str = "diagonal", var_floor: float = 1e-8):
    """Moment matching: the Gaussian of ``family`` with the draws' mean and (co)variance.

    samples: float [n, d], target-end draws of the previous round (n >= 2).
    family: ``diagonal`` (variances only) or ``full`` (the whole covariance; with fewer than ``4 d``
        draws the estimate is too noisy and the diagonal family is fitted instead).
    var_floor: variances are raised to at least this (relative to the largest), so q stays proper.
    Returns ``(reference, FitInfo)``.
    """
    x = np.asarray(samples, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 2:
        raise ValueError(f"samples must have shape [n >= 2, d]; got {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("samples hold NaN or inf")
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}; got {family!r}")
    n, d = x.shape
    mean = x.mean(axis=0)
    xc = x - mean
    var = (xc * xc).sum(axis=0) / (n - 1)
    floor = var_floor * max(float(var.max()), 1e-300)
    var = np.maximum(var, max(floor, 1e-300))
    if family == "full" and n >= 4 * d:
        cov = (xc.T @ xc) / (n - 1)
        cov[np.diag_indices(d)] = np.maximum(np.diag(cov), var)
        cov += floor * np.eye(d)
        try:
            return full_gaussian(mean, cov), FitInfo(n=n, family="full", min_var=float(np.diag(cov).min()))
        except np.linalg.LinAlgError:
            pass
    return DiagonalGaussian(mean=mean, std=np.sqrt(var)), FitInfo(n=n, family="diagonal", min_var=float(var.min()))


class Path(NamedTuple):
    """The references of a chain's legs and the leg of each level.

    legs: int64 [N], leg of each level (0: fixed reference, 1: variational); references: tuple of
    normalised references, one per leg (``log_density``, ``grad_log_density``, ``from_standard``).
    """

    legs: np.ndarray
    references: tuple


def leg_levels(legs) -> list:
    """The levels of each leg, ordered from its reference end (b = 0) to its target end (b = 1):
    leg 0 ascends (levels 0 .. K0-1); leg 1 descends (levels N-1 .. K0). Returns [int64 arrays]."""
    legs = np.asarray(legs, dtype=np.int64)
    out = [np.flatnonzero(legs == 0)]
    if legs.max() >= 1:
        out.append(np.flatnonzero(legs == 1)[::-1])
    return out


def leg_pairs(legs) -> list:
    """Index of each adjacent pair of each leg in the global pair numbering (pair k joins levels k and
    k+1), ordered as :func:`leg_levels`: [int64 arrays of length K_leg - 1]."""
    return [np.minimum(lv[:-1], lv[1:]) for lv in leg_levels(legs)]


def stabilized_betas(b_fixed, b_var) -> np.ndarray:
    """The global ladder [K0 + K1] of a two-leg chain: the fixed leg's b ascending, then the
    variational leg's b descending (both legs' ladders run from 0 to 1)."""
    return np.concatenate([np.asarray(b_fixed, dtype=np.float64), np.asarray(b_var, dtype=np.float64)[::-1]])


def stabilized_split(barriers, n_levels: int) -> tuple[int, int]:
    """Levels of each leg of a two-leg chain of ``n_levels`` levels, from the legs' barriers.

    The two legs form one path from the fixed reference through the target to the variational
    reference, whose barrier is ``Λ_0 + Λ_1`` (the pair joining the legs never rejects). The
    ladder that equalises the swap rejection along that whole path (Syed et al. 2021's optimal
    schedule, applied to the joined path) gives each leg a number of pairs proportional to its
    barrier: ``(K_0 - 1) : (K_1 - 1) = Λ_0 : Λ_1`` with ``K_0 + K_1 = N`` (N - 2 pairs to share; the
    joining pair is free). This is also Pigeons.jl's advice (``n_chains`` about 2 Λ and
    ``n_chains_variational`` about 2 Λ_var) under a fixed total. Each leg keeps at least 2 levels
    (its reference and the target).

    barriers: [Λ_0, Λ_1] (fixed leg, variational leg), >= 0; n_levels: N >= 4. Returns (K_0, K_1).
    """
    N = int(n_levels)
    if N < 4:
        raise ValueError(f"a two-leg chain needs n_levels >= 4 (2 per leg); got {n_levels}")
    lam = np.maximum(np.asarray(barriers, dtype=np.float64), 0.0)
    if lam.shape != (2,) or not np.all(np.isfinite(lam)):
        raise ValueError(f"barriers must be two finite numbers >= 0; got {barriers!r}")
    share = 0.5 if lam.sum() == 0 else float(lam[0] / lam.sum())
    k0 = 1 + int(np.floor((N - 2) * share + 0.5))
    k0 = min(max(k0, 2), N - 2)
    return k0, N - k0


def leg_sizes_to_legs(k0: int, k1: int) -> np.ndarray:
    """The leg of each level of a two-leg chain with K_0 fixed-leg and K_1 variational-leg levels:
    int64 [K_0 + K_1], ``[0] * K_0 + [1] * K_1``."""
    return np.concatenate([np.zeros(int(k0), dtype=np.int64), np.ones(int(k1), dtype=np.int64)])


def round_trip_ends(legs) -> np.ndarray:
    """The reference and target levels of a chain for ``diagnostics.round_trip_update``: int8 [N].

    One leg: reference level 0, target level N-1. Two legs (Pigeons.jl's ``VariationalDEO``): both
    ends of the chain are references (level 0, the fixed reference; level N-1, the variational
    one), and the target levels are the two levels at b = 1 where the legs join (K_0 - 1 and K_0).
    So a round trip is a walk from either reference to the target and back to either reference, and
    a tempered restart is an arrival at the target from either reference.
    """
    from pgmflow.tasks.tempering.diagnostics import end_levels

    legs = np.asarray(legs, dtype=np.int64)
    N = legs.shape[0]
    if legs.max() == 0:
        return end_levels(N)
    k0 = int((legs == 0).sum())
    return end_levels(N, references=(0, N - 1), targets=(k0 - 1, k0))


def leg_level_map(legs, leg: int) -> np.ndarray:
    """Map global levels to positions along one leg, the other leg folded onto this leg's target
    end: a replica of the other leg counts as at the target. int64 [N] -> [0, K_leg - 1]. Used to
    count a leg's own round trips (reference -> target -> reference of that leg)."""
    lv = leg_levels(legs)[leg]
    pos = np.full(len(legs), lv.shape[0] - 1, dtype=np.int64)
    pos[lv] = np.arange(lv.shape[0])
    return pos


def combine_leg_estimates(estimates, influences, agree_sigmas: float = 3.0) -> tuple[float, float, np.ndarray]:
    """The legs' log Z estimates combined, with a joint standard error.

    estimates: per-leg log Z estimates; influences: per-leg influence series [T] (the first-order
    error series of each leg's estimator over the same scans; see ``estimators``).

    When the legs agree (``|a - b| <= agree_sigmas * sqrt(se_a^2 + se_b^2)``) the combination has
    inverse-variance weights ``w_g ∝ 1 / se_g^2`` and the SE of the series ``sum_g w_g phi_g`` (with its
    ESS), which keeps the correlation between the legs (they share the target end). When they do not,
    one leg has failed -- typically the fixed leg, whose stepping stones miss mass that its swaps
    never carried across a pair, so that its SE is too small as well -- and the estimate is the leg
    with the smaller SE alone (weight 1): a poor leg cannot pull the result. Returns
    ``(estimate, se, weights)``.
    """
    from pgmflow.tasks.tempering.estimators import series_se

    est = np.asarray(estimates, dtype=np.float64)
    ses = np.array([series_se(p) for p in influences])
    if len(est) == 2 and abs(est[0] - est[1]) > agree_sigmas * np.sqrt(np.sum(ses**2)):
        w = np.zeros(2)
        w[int(np.argmin(ses))] = 1.0
    elif np.all(ses > 0):
        w = 1.0 / ses**2
    else:
        w = (ses == 0).astype(np.float64)
    w = w / w.sum()
    phi = sum(wg * np.asarray(p) for wg, p in zip(w, influences))
    return float(np.sum(w * est)), series_se(phi), w


LEG_NAMES = ("fixed", "variational")


def leg_estimates(betas, legs, loglik, rejection) -> dict:
    """log Z and the barrier of each leg of a two-leg chain, and their combination.

    betas: float [N] global ladder; legs: int [N]; loglik: float [N, T], each level's log-likelihood
    against its own leg's reference (``RoundTrace.loglik.T``); rejection: float [N-1] mean swap
    rejection of each pair. Each leg runs from its (normalised) reference to the target, so each
    estimates ``log Z`` alone (stepping stone, forward/reverse mean, and thermodynamic integration);
    the combination is :func:`combine_leg_estimates` (inverse-variance weights, joint SE). The barrier
    is the sum of the legs' barriers (the pair joining the legs never rejects).

    Returns {"legs": [per-leg dicts: log_z_ss, log_z_ss_se, log_z_ti, log_z_ti_se, barrier,
    swap_accept], "log_z_ss", "log_z_ss_se", "log_z_ti", "log_z_ti_se", "barrier", "weights"}.
    """
    from pgmflow.tasks.tempering import estimators
    from pgmflow.tasks.tempering.schedule import communication_barrier

    betas = np.asarray(betas, dtype=np.float64)
    ll = np.asarray(loglik, dtype=np.float64)
    rej = np.asarray(rejection, dtype=np.float64)
    per, phis_ss, phis_ti = [], [], []
    for lv, pairs in zip(leg_levels(legs), leg_pairs(legs)):
        ss, phi_ss = estimators.stepping_stone_influence(betas[lv], ll[lv])
        ti, phi_ti = estimators.thermodynamic_integration_influence(betas[lv], ll[lv])
        lam, _ = communication_barrier(betas[lv], rej[pairs])
        per.append(
            {
                "log_z_ss": float(ss),
                "log_z_ss_se": estimators.series_se(phi_ss),
                "log_z_ti": float(ti),
                "log_z_ti_se": estimators.series_se(phi_ti),
                "barrier": float(lam),
                "swap_accept": float(1.0 - rej[pairs].mean()),
            }
        )
        phis_ss.append(phi_ss)
        phis_ti.append(phi_ti)
    ss, ss_se, w = combine_leg_estimates([p["log_z_ss"] for p in per], phis_ss)
    ti, ti_se, _ = combine_leg_estimates([p["log_z_ti"] for p in per], phis_ti)
    return {
        "legs": per,
        "log_z_ss": ss,
        "log_z_ss_se": ss_se,
        "log_z_ti": ti,
        "log_z_ti_se": ti_se,
        "barrier": float(sum(p["barrier"] for p in per)),
        "weights": w.tolist(),
    }

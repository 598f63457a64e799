"""Targets of parallel tempering and the annealing path between reference and target.

Every target defines a normalised *reference* distribution ``ref`` (uniform spins for Ising, an
isotropic Gaussian for continuous targets) and a *log-likelihood* ``l(x) = log gamma(x) - log ref(x)``
where ``gamma`` is the unnormalised target. Level ``b`` in [0, 1] of the ladder samples

    pi_b(x) ∝ ref(x) exp(b l(x)),

so ``pi_0 = ref`` and ``pi_1 ∝ gamma``; ``log Z_target = log Z_ref + log (Z_1 / Z_0)``.
(Syed et al. 2021 write the same path as ``pi_0^(1-beta) pi^beta``; our ``b`` is their ``beta``.)

For the Ising model at inverse temperature ``beta_model = 1/T`` with a uniform reference,
``l(s) = -beta_model E(s)`` and level ``b`` is the Boltzmann distribution at inverse temperature
``b * beta_model``: the ladder *is* a ladder of temperatures ``T / b``.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from pgmflow.tasks import rng as _rng


class IsingTarget(NamedTuple):
    """2D Ising model on an L x L periodic lattice at temperature ``T`` (k_B = 1).

    Energy ``E(s) = -sum_<ij> J_abs * bond_ij * s_i s_j - h * sum_i s_i``.

    Fields:
        L: lattice side (even, >= 2).
        J_abs: coupling magnitude |J| (> 0).
        h: external field.
        beta_model: target inverse temperature 1/T.
        bonds_h: int8 [L, L], sign of the bond between (i, j) and (i, (j+1) % L).
        bonds_v: int8 [L, L], sign of the bond between (i, j) and ((i+1) % L, j).
        couplings: "ferromagnetic" | "antiferromagnetic" | "spin_glass" (+-J, quenched).
    """

    L: int
    J_abs: float
    h: float
    beta_model: float
    bonds_h: np.ndarray
    bonds_v: np.ndarray
    couplings: str

    @property
    def kind(self) -> str:
        return "ising"

    @property
    def n_sites(self) -> int:
        return self.L * self.L

    @property
    def log_z_reference(self) -> float:
        """log of the number of configurations, N log 2 (the uniform reference is normalised)."""
        return self.n_sites * math.log(2.0)


def make_ising(
    L: int, T: float, J: float = 1.0, h: float = 0.0, couplings: str = "ferromagnetic", disorder_seed: int = 0
) -> IsingTarget:
    """Build an :class:`IsingTarget`; ``J`` may be negative (antiferromagnet)."""
    L = int(L)
    if couplings == "ferromagnetic" or couplings == "antiferromagnetic":
        sign = 1 if (J >= 0) == (couplings == "ferromagnetic") else -1
        bonds_h = np.full((L, L), sign, dtype=np.int8)
        bonds_v = np.full((L, L), sign, dtype=np.int8)
    elif couplings == "spin_glass":
        g = _rng.generator(disorder_seed, _rng.STAGE_DISORDER)
        bonds_h = np.where(g.random((L, L)) < 0.5, 1, -1).astype(np.int8)
        bonds_v = np.where(g.random((L, L)) < 0.5, 1, -1).astype(np.int8)
        if J < 0:
            bonds_h, bonds_v = -bonds_h, -bonds_v
    else:
        raise ValueError(f"unknown couplings {couplings!r}")
    return IsingTarget(
        L=L,
        J_abs=abs(float(J)),
        h=float(h),
        beta_model=1.0 / float(T),
        bonds_h=bonds_h,
        bonds_v=bonds_v,
        couplings=couplings,
    )


def continuous_target(cls):
    """Class decorator of the continuous targets: NamedTuples with a normalised ``reference`` field
    (``log_density``, ``dim``) and ``log_gamma``. Adds the properties every such target shares:
    ``kind`` ("continuous"), ``dim`` (the reference's) and ``log_z_reference`` (0: the reference is
    normalised, so ``log Z`` of the target is ``log (Z_1 / Z_0)`` of the path)."""
    cls.kind = property(lambda self: "continuous", doc="continuous state space R^d")
    cls.dim = property(lambda self: int(self.reference.dim), doc="dimension d (the reference's)")
    cls.log_z_reference = property(lambda self: 0.0, doc="log Z of the normalised reference: 0")
    return cls


class GaussianReference(NamedTuple):
    """Normalised isotropic Gaussian reference N(0, scale^2 I_d)."""

    dim: int
    scale: float

    def log_density(self, x: np.ndarray) -> np.ndarray:
        """x [n, d] -> [n]."""
        d = self.dim
        return -0.5 * np.sum(x * x, axis=-1) / self.scale**2 - 0.5 * d * math.log(2 * math.pi * self.scale**2)

    def grad_log_density(self, x: np.ndarray) -> np.ndarray:
        """x [n, d] -> [n, d]."""
        return -x / self.scale**2

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.scale * rng.standard_normal((n, self.dim))

    def from_standard(self, z: np.ndarray) -> np.ndarray:
        """Exact draws from iid standard normals z [n, d]."""
        return self.scale * z


@continuous_target
class GaussianMixtureTarget(NamedTuple):
    """Unnormalised mixture ``gamma(x) = sum_k w_k exp(-|x - mu_k|^2 / (2 sigma_k^2))``.

    Its normaliser is known: ``Z = sum_k w_k (2 pi sigma_k^2)^(d/2)``.

    Fields: means [K, d]; sigmas [K]; weights [K] (positive, need not sum to one);
    reference: the Gaussian reference of the path.
    """

    means: np.ndarray
    sigmas: np.ndarray
    weights: np.ndarray
    reference: GaussianReference

    @property
    def exact_log_z(self) -> float:
        d = self.dim
        terms = np.log(self.weights) + 0.5 * d * np.log(2 * np.pi * self.sigmas**2)
        m = terms.max()
        return float(m + np.log(np.exp(terms - m).sum()))

    def _log_components(self, x):
        # [n, K]
        sq = ((x[:, None, :] - self.means[None, :, :]) ** 2).sum(-1)
        return np.log(self.weights)[None, :] - 0.5 * sq / self.sigmas[None, :] ** 2

    def log_gamma(self, x: np.ndarray) -> np.ndarray:
        """x [n, d] -> log gamma(x) [n]."""
        lc = self._log_components(x)
        m = lc.max(axis=1, keepdims=True)
        return (m + np.log(np.exp(lc - m).sum(axis=1, keepdims=True)))[:, 0]

    def grad_log_gamma(self, x: np.ndarray) -> np.ndarray:
        """x [n, d] -> [n, d]: sum_k r_k(x) (mu_k - x) / sigma_k^2 with responsibilities r."""
        lc = self._log_components(x)
        r = np.exp(lc - lc.max(axis=1, keepdims=True))
        r /= r.sum(axis=1, keepdims=True)  # [n, K]
        w = r / self.sigmas[None, :] ** 2  # [n, K]
        # Explicit sums, not BLAS: the result of each row must not depend on how many rows are
        # evaluated together (bit-identical results for any blocking of the replicas).
        return (w[:, :, None] * (self.means[None, :, :] - x[:, None, :])).sum(axis=1)


def make_gaussian_mixture(
    dim: int,
    n_components: int,
    separation: float,
    sigma: float,
    reference_scale: float,
    target_seed: int = 0,
    weights: list | None = None,
) -> GaussianMixtureTarget:
    """Mixture with means at random directions, ``separation`` from the origin (seeded)."""
    g = _rng.generator(target_seed, _rng.STAGE_TARGET)
    dirs = g.standard_normal((n_components, dim))
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    means = separation * dirs
    w = np.ones(n_components) if weights is None else np.asarray(weights, dtype=float)
    return GaussianMixtureTarget(
        means=means,
        sigmas=np.full(n_components, float(sigma)),
        weights=w,
        reference=GaussianReference(dim=int(dim), scale=float(reference_scale)),
    )


def load_callable(path: str) -> Callable:
    """Import ``"package.module:function"`` (or ``package.module.function``)."""
    if ":" in path:
        mod_name, _, attr = path.partition(":")
    else:
        mod_name, _, attr = path.rpartition(".")
    if not mod_name or not attr:
        raise ValueError(f"{path!r} is not of the form 'package.module:function'")
    obj = importlib.import_module(mod_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{path!r} is not callable")
    return obj


@continuous_target
class CustomTarget(NamedTuple):
    """A user log-density given as an importable callable ``f(x [n, d]) -> [n]`` (unnormalised).

    Fields: log_density: import path; grad_log_density: import path or "" (then HMC is unavailable);
    reference: the Gaussian reference of the path (choose it to cover the target's mass).
    """

    log_density: str
    grad_log_density: str
    reference: GaussianReference

    @property
    def exact_log_z(self):
        return None

    def log_gamma(self, x: np.ndarray) -> np.ndarray:
        out = np.asarray(load_callable(self.log_density)(x), dtype=np.float64).reshape(-1)
        if out.shape[0] != x.shape[0]:
            raise ValueError(
                f"log-density {self.log_density} returned shape {out.shape} for input {x.shape}; "
                f"expected ({x.shape[0]},)"
            )
        return out

    def grad_log_gamma(self, x: np.ndarray) -> np.ndarray:
        if not self.grad_log_density:
            raise ValueError("HMC needs model.grad_log_density for a custom target")
        return np.asarray(load_callable(self.grad_log_density)(x), dtype=np.float64).reshape(x.shape)


def continuous_loglik(target, x: np.ndarray) -> np.ndarray:
    """l(x) = log gamma(x) - log ref(x), x [n, d] -> [n]."""
    return target.log_gamma(x) - target.reference.log_density(x)


def continuous_grad_log_pi(target, x: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Gradient of log pi_b(x) = (1 - b) log ref(x) + b log gamma(x); x [n, d], b [n] -> [n, d]."""
    b = b[:, None]
    return (1.0 - b) * target.reference.grad_log_density(x) + b * target.grad_log_gamma(x)


def continuous_log_pi(target, x: np.ndarray, b: np.ndarray) -> np.ndarray:
    """log pi_b(x) up to a constant; x [n, d], b [n] -> [n]."""
    ref = target.reference.log_density(x)
    return ref + b * (target.log_gamma(x) - ref)

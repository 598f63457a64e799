"""A correlated Gaussian target with a known normaliser: far from the fixed reference on purpose.

``gamma(x) = exp(-|L^-1 (x - mean)|^2 / 2)``, so ``Z = (2 pi)^(d/2) det L``. The covariance is
``D R D``: per-coordinate scales ``D`` spaced geometrically from ``scale_min`` to ``scale_max``, and an
equicorrelation matrix ``R = (1 - rho) I + rho 1 1^T``; every coordinate of the mean is ``shift``.
With a reference ``N(0, s^2 I)`` the path from reference to target has to move the mass by
``shift * sqrt(d)`` and shrink and tilt it: a high barrier Lambda for the fixed reference, and almost
none for a Gaussian reference fitted to the target (the test case of variational PT).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from pgmflow.tasks.tempering.targets import GaussianReference, continuous_target


@continuous_target
class CorrelatedGaussianTarget(NamedTuple):
    """mean [d]; chol [d, d] lower triangular; chol_inv = L^-1 [d, d]; reference: the fixed reference."""

    mean: np.ndarray
    chol: np.ndarray
    chol_inv: np.ndarray
    reference: GaussianReference

    @property
    def exact_log_z(self) -> float:
        return 0.5 * self.dim * math.log(2 * math.pi) + float(np.sum(np.log(np.diag(self.chol))))

    def _white(self, x):
        # L^-1 (x - mean) row by row (no BLAS: a row's bits do not depend on the batch): [n, d]
        return np.sum(self.chol_inv[None, :, :] * (x - self.mean)[:, None, :], axis=-1)

    def log_gamma(self, x: np.ndarray) -> np.ndarray:
        w = self._white(x)
        return -0.5 * np.sum(w * w, axis=-1)

    def grad_log_gamma(self, x: np.ndarray) -> np.ndarray:
        w = self._white(x)
        return -np.sum(self.chol_inv.T[None, :, :] * w[:, None, :], axis=-1)


def make_correlated_gaussian(
    dim: int, shift: float, scale_min: float, scale_max: float, correlation: float, reference_scale: float
) -> CorrelatedGaussianTarget:
    d = int(dim)
    if not -1.0 / max(d - 1, 1) < correlation < 1.0:
        raise ValueError(f"correlation must lie in (-1/(d-1), 1) for a positive definite matrix; got {correlation}")
    scales = np.geomspace(scale_min, scale_max, d) if d > 1 else np.array([scale_min])
    R = (1.0 - correlation) * np.eye(d) + correlation * np.ones((d, d))
    cov = scales[:, None] * R * scales[None, :]
    L = np.linalg.cholesky(cov)
    return CorrelatedGaussianTarget(
        mean=np.full(d, float(shift)),
        chol=L,
        chol_inv=np.tril(np.linalg.solve(L, np.eye(d))),
        reference=GaussianReference(dim=d, scale=float(reference_scale)),
    )

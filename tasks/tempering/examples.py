"""Example user log-densities for ``model=custom`` (and the docs): plain functions of x [n, d]."""

from __future__ import annotations

import numpy as np


def double_well(x: np.ndarray) -> np.ndarray:
    """Unnormalised double well in each coordinate: -sum_i (x_i^2 - 1)^2 / 0.1, x [n, d] -> [n]."""
    return -np.sum((x * x - 1.0) ** 2, axis=1) / 0.1


def double_well_grad(x: np.ndarray) -> np.ndarray:
    """Gradient of :func:`double_well`, x [n, d] -> [n, d]."""
    return -4.0 * x * (x * x - 1.0) / 0.1


def returns_nan(x: np.ndarray) -> np.ndarray:
    """A broken log-density (for tests of the preflight check)."""
    return np.full(x.shape[0], np.nan)

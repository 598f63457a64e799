"""Log-densities used by the tests (importable by worker processes)."""

import numpy as np


def nan_far_out(x):
    """Standard normal near the origin, NaN beyond |x| > 6 (passes preflight, fails mid-run)."""
    r2 = np.sum(x * x, axis=1)
    out = -0.5 * r2
    out[r2 > 36.0] = np.nan
    return out


def gaussian_3(x):
    """exp(-|x - 1|^2 / (2 * 0.7^2)) in any dimension; log Z = d/2 log(2 pi 0.49)."""
    return -0.5 * np.sum((x - 1.0) ** 2, axis=1) / 0.49

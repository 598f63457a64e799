"""Shared by the sparse-GP task tests: a small regression problem, and an empty Kuf store around every test."""

import numpy as np
import pytest

from pgmflow.tasks.gp import kernels as kern
from pgmflow.tasks.gp import kuf_cache


def make_problem(n: int, d: int = 3, m: int = 12, seed: int = 5):
    """``(X [n, d], y [n], Z [m, d], params)``: Gaussian inputs, ``y = sin(x_0) + 0.1 noise``."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(n)
    Z = rng.standard_normal((m, d))
    return X, y, Z, kern.make_params([0.7, 1.2, 2.0][:d] + [1.0] * max(d - 3, 0), 1.4, 0.05)


@pytest.fixture(autouse=True)
def empty_kuf_store(monkeypatch):
    """No Kuf or free buffer left by another test, and the default budget."""
    monkeypatch.delenv(kuf_cache.KUF_CACHE_ENV, raising=False)
    kuf_cache.clear()
    yield
    kuf_cache.clear()

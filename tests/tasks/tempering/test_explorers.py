"""Continuous explorers sample pi_b exactly: for a Gaussian target and Gaussian reference every
level is Gaussian with known mean and variance."""

import numpy as np
import pytest

from pgmflow.tasks.tempering import explorers, targets


@pytest.mark.parametrize("method,n_steps,step", [("rwm", 60, 0.8), ("hmc", 15, 0.25)])
@pytest.mark.parametrize("b", [0.0, 0.3, 1.0])
def test_gaussian_level_moments(method, n_steps, step, b):
    d, R = 2, 400
    mu, sigma, s = 1.5, 0.6, 2.0
    t = targets.GaussianMixtureTarget(
        means=np.full((1, d), mu),
        sigmas=np.array([sigma]),
        weights=np.array([1.0]),
        reference=targets.GaussianReference(d, s),
    )
    prec = (1 - b) / s**2 + b / sigma**2
    mean = (b * mu / sigma**2) / prec
    x = t.reference.sample(np.random.default_rng(0), R)
    ids = np.arange(R)
    for scan in range(4):
        x, info = explorers.explore_continuous(
            t, x, np.full(R, b), np.full(R, step), ids, 3, 0, scan, n_steps, method, n_leapfrog=8
        )
    assert np.all(np.isfinite(x))
    np.testing.assert_allclose(x.mean(0), mean, atol=5 * np.sqrt(1 / prec / R))
    np.testing.assert_allclose(x.var(0), 1 / prec, rtol=0.25)
    if b > 0:
        assert 0.05 < info.accept.mean() < 1.0
    np.testing.assert_allclose(info.loglik, targets.continuous_loglik(t, x))


def test_gradient_of_mixture_matches_finite_differences():
    t = targets.make_gaussian_mixture(3, 4, 2.0, 0.8, 3.0, target_seed=1)
    x = np.random.default_rng(1).normal(size=(5, 3))
    g = t.grad_log_gamma(x)
    eps = 1e-6
    for j in range(3):
        e = np.zeros(3)
        e[j] = eps
        fd = (t.log_gamma(x + e) - t.log_gamma(x - e)) / (2 * eps)
        np.testing.assert_allclose(g[:, j], fd, rtol=1e-6, atol=1e-8)


def test_mixture_normaliser():
    t = targets.make_gaussian_mixture(2, 3, 5.0, 0.5, 8.0, weights=[1.0, 2.0, 3.0])
    # numerical integral on a grid
    g = np.linspace(-10, 10, 801)
    X, Y = np.meshgrid(g, g)
    pts = np.stack([X.ravel(), Y.ravel()], 1)
    z = np.exp(t.log_gamma(pts)).sum() * (g[1] - g[0]) ** 2
    assert np.log(z) == pytest.approx(t.exact_log_z, rel=1e-6)


def test_nan_proposal_is_reported():
    t = targets.CustomTarget("tests.pipelines.densities:nan_far_out", "", targets.GaussianReference(1, 1.0))
    x = np.zeros((2, 1))
    with pytest.raises(FloatingPointError, match="returned NaN"):
        explorers.explore_continuous(
            t, x, np.array([0.5, 1.0]), np.array([100.0, 100.0]), np.arange(2), 0, 0, 0, 20, "rwm"
        )

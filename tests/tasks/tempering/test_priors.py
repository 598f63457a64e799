"""Named priors on the unconstrained space: normalised densities (with the log-Jacobian), exact
samplers, gradients, the bijections; the conjugate evidence of the Gaussian linear model."""

import numpy as np
import pytest
from scipy import integrate, stats

from pgmflow.tasks.tempering import likelihoods
from pgmflow.tasks.tempering.bayes import BayesTarget
from pgmflow.tasks.tempering.priors import PriorBlock, PriorReference

BLOCKS = [
    PriorBlock("normal", 1, loc=1.0, scale=2.0),
    PriorBlock("half_normal", 1, scale=1.5),
    PriorBlock("log_normal", 1, loc=0.3, scale=0.5),
    PriorBlock("uniform", 1, low=-1.0, high=3.0),
]
THETA = [
    stats.norm(1.0, 2.0),
    stats.halfnorm(scale=1.5),
    stats.lognorm(s=0.5, scale=np.exp(0.3)),
    stats.uniform(-1.0, 4.0),
]


@pytest.mark.parametrize("i", range(4))
def test_prior_is_normalised_samples_exactly_and_has_its_gradient(i):
    ref = PriorReference((BLOCKS[i],))
    dens = lambda u: float(np.exp(ref.log_density(np.array([[u]])))[0])  # noqa: E731
    assert integrate.quad(dens, -40, 40, limit=400)[0] == pytest.approx(1.0, abs=1e-6)
    u = ref.sample(np.random.default_rng(i), 20000)
    theta, dtheta = ref.transform(u)
    assert stats.kstest(theta[:, 0], THETA[i].cdf).pvalue > 1e-3
    grid = np.linspace(-2, 2, 9)[:, None]
    h = 1e-6
    num = (ref.log_density(grid + h) - ref.log_density(grid - h)) / (2 * h)
    np.testing.assert_allclose(ref.grad_log_density(grid)[:, 0], num, rtol=1e-5, atol=1e-6)
    # the density on u is the density of theta times |dtheta/du|
    t, dt = ref.transform(grid)
    np.testing.assert_allclose(ref.log_density(grid), THETA[i].logpdf(t[:, 0]) + np.log(dt[:, 0]), rtol=1e-9)


def test_conjugate_evidence_matches_quadrature_and_the_target_gradient():
    g = np.random.default_rng(0)
    X = g.standard_normal((15, 1))
    y = 0.7 * X[:, 0] + 0.5 * g.standard_normal(15)
    data = {"X": X, "y": y}
    blocks = (PriorBlock("normal", 1, loc=0.2, scale=0.8),)
    exact = likelihoods.gaussian_linear.exact_log_evidence(blocks, data, noise_std=0.5)
    t = BayesTarget(
        PriorReference(blocks),
        data,
        "pgmflow.tasks.tempering.likelihoods:gaussian_linear",
        "pgmflow.tasks.tempering.likelihoods:gaussian_linear_grad",
        {"noise_std": 0.5},
    )
    assert t.exact_log_z == exact
    f = lambda w: float(np.exp(t.log_gamma(np.array([[w]])) - exact)[0])  # noqa: E731
    assert integrate.quad(f, -10, 10, points=[0.7], limit=200)[0] == pytest.approx(1.0, abs=1e-6)
    u = np.linspace(-1, 2, 5)[:, None]
    h = 1e-6
    num = (t.log_gamma(u + h) - t.log_gamma(u - h)) / (2 * h)
    np.testing.assert_allclose(t.grad_log_gamma(u)[:, 0], num, rtol=1e-5)

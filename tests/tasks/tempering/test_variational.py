"""Variational references: normalised densities, exact samplers, moment matching, row independence,
the legs of a stabilized chain and the combination of the legs' estimates."""

import numpy as np
import pytest
from scipy import stats

from pgmflow.tasks.tempering import variational as V


def _cov(d, seed=0):
    A = np.random.default_rng(seed).standard_normal((d, d))
    return A @ A.T / d + 0.5 * np.eye(d)


def test_full_and_diagonal_densities_match_scipy():
    d = 5
    mean, cov = np.arange(d, dtype=float), _cov(d)
    x = np.random.default_rng(1).standard_normal((7, d))
    q = V.full_gaussian(mean, cov)
    np.testing.assert_allclose(q.log_density(x), stats.multivariate_normal(mean, cov).logpdf(x), rtol=1e-10)
    g = V.DiagonalGaussian(mean=mean, std=np.sqrt(np.diag(cov)))
    np.testing.assert_allclose(
        g.log_density(x), stats.multivariate_normal(mean, np.diag(np.diag(cov))).logpdf(x), rtol=1e-10
    )
    # gradients by central differences
    for ref in (q, g):
        h = 1e-6
        num = np.stack([(ref.log_density(x + h * e) - ref.log_density(x - h * e)) / (2 * h) for e in np.eye(d)], 1)
        np.testing.assert_allclose(ref.grad_log_density(x), num, rtol=1e-5, atol=1e-6)


def test_moment_matching_recovers_the_gaussian_and_rows_do_not_depend_on_the_batch():
    d = 4
    mean, cov = np.array([3.0, -1.0, 0.5, 2.0]), _cov(d, 2)
    x = np.random.default_rng(3).multivariate_normal(mean, cov, size=20000)
    q, info = V.fit_gaussian(x, "full")
    assert info.family == "full" and info.n == 20000
    np.testing.assert_allclose(q.mean, mean, atol=0.05)
    np.testing.assert_allclose(q.chol @ q.chol.T, cov, atol=0.05)
    z = np.random.default_rng(4).standard_normal((9, d))
    for f in (q.log_density, q.grad_log_density, q.from_standard):
        batch = f(z)
        rows = np.concatenate([f(z[i : i + 1]) for i in range(9)])
        np.testing.assert_array_equal(batch, rows)
    # too few draws for a full covariance: the diagonal family
    q2, info2 = V.fit_gaussian(x[:10], "full")
    assert info2.family == "diagonal" and isinstance(q2, V.DiagonalGaussian)


def test_from_standard_draws_exactly():
    q = V.full_gaussian([1.0, 2.0], [[1.0, 0.8], [0.8, 2.0]])
    x = q.sample(np.random.default_rng(5), 40000)
    np.testing.assert_allclose(np.cov(x.T), [[1.0, 0.8], [0.8, 2.0]], atol=0.05)


def test_legs_of_a_stabilized_chain():
    legs = np.array([0, 0, 0, 1, 1])
    betas = V.stabilized_betas([0.0, 0.5, 1.0], [0.0, 1.0])
    np.testing.assert_array_equal(betas, [0.0, 0.5, 1.0, 1.0, 0.0])
    lv = V.leg_levels(legs)
    np.testing.assert_array_equal(lv[0], [0, 1, 2])
    np.testing.assert_array_equal(lv[1], [4, 3])
    np.testing.assert_array_equal(betas[lv[1]], [0.0, 1.0])
    np.testing.assert_array_equal(V.leg_pairs(legs)[1], [3])
    np.testing.assert_array_equal(V.leg_level_map(legs, 1), [1, 1, 1, 1, 0])


def test_combined_estimate_uses_both_legs_when_they_agree_and_the_better_one_when_not():
    g = np.random.default_rng(6)
    a, b = g.standard_normal(4000), 2 * g.standard_normal(4000)
    est, se, w = V.combine_leg_estimates([1.0, 1.01], [a, b])
    assert w[0] == pytest.approx(0.8, abs=0.03) and se < np.std(a) / np.sqrt(4000)
    est, se, w = V.combine_leg_estimates([-80.0, 1.0], [b, a])
    assert est == 1.0 and list(w) == [0.0, 1.0]


def test_two_leg_estimates_on_exact_gaussian_paths():
    """A Gaussian path N(0,1)^(1-b) N(m,1)^b has l(x) = m x - m^2/2 and log Z = 0; both legs estimate
    log Z from exact draws of every level, and the joined pair has no rejection."""
    g = np.random.default_rng(7)
    m, T = 1.0, 4000
    bf, bv = np.linspace(0, 1, 5), np.linspace(0, 1, 3)
    betas, legs = V.stabilized_betas(bf, bv), np.array([0] * 5 + [1] * 3)
    ll = np.empty((8, T))
    for k, b in enumerate(betas):
        if legs[k] == 0:  # reference N(0, 1): pi_b = N(b m, 1)
            x = b * m + g.standard_normal(T)
            ll[k] = m * x - 0.5 * m * m
        else:  # variational reference N(0.9 m, 1): pi_b = N((0.9 + 0.1 b) m, 1)
            x = (0.9 + 0.1 * b) * m + g.standard_normal(T)
            ll[k] = -0.5 * (x - m) ** 2 + 0.5 * (x - 0.9 * m) ** 2
    rej = np.full(7, 0.3)
    rej[4] = 0.0
    out = V.leg_estimates(betas, legs, ll, rej)
    for leg in out["legs"]:
        assert abs(leg["log_z_ss"]) < 4 * leg["log_z_ss_se"]
    assert abs(out["log_z_ss"]) < 4 * out["log_z_ss_se"]
    assert out["legs"][1]["log_z_ss_se"] < out["legs"][0]["log_z_ss_se"]  # the closer reference
    assert out["barrier"] == pytest.approx(0.3 * 6)

"""The exact GP against scikit-learn's GaussianProcessRegressor (log marginal likelihood, fitted
hyperparameters, predictions) and its gradient against finite differences."""

import numpy as np
import pytest

from pgmflow.tasks.gp import exact
from pgmflow.tasks.gp import kernels as kern

sklearn_gp = pytest.importorskip("sklearn.gaussian_process")
from sklearn.gaussian_process.kernels import RBF, ConstantKernel, Matern, WhiteKernel  # noqa: E402


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    X = rng.random((40, 2))
    y = np.sin(4 * X[:, 0]) + X[:, 1] ** 2 + 0.1 * rng.standard_normal(40)
    return X, y


def _sk_theta(p):  # sklearn's theta of ConstantKernel * RBF(ARD) + WhiteKernel
    return np.concatenate([[p.log_variance], p.log_lengthscale, [p.log_noise]])


@pytest.mark.parametrize("kernel,nu", [("rbf", None), ("matern32", 1.5), ("matern52", 2.5)])
def test_log_marginal_likelihood_matches_sklearn(data, kernel, nu):
    X, y = data
    base = RBF([1.0, 1.0]) if nu is None else Matern([1.0, 1.0], nu=nu)
    gpr = sklearn_gp.GaussianProcessRegressor(
        ConstantKernel(1.0) * base + WhiteKernel(0.1), alpha=1e-15, normalize_y=False, optimizer=None
    ).fit(X, y)
    for p in (kern.make_params([0.3, 0.7], 1.4, 0.02), kern.make_params([1.5, 0.2], 0.3, 0.5)):
        want = gpr.log_marginal_likelihood(_sk_theta(p))
        assert exact.log_marginal_likelihood(kernel, p, X, y) == pytest.approx(want, rel=1e-8)


def test_fitted_hyperparameters_and_predictions_match_sklearn(data):
    X, y = data
    k = ConstantKernel(1.0) * RBF([1.0, 1.0]) + WhiteKernel(0.1)
    gpr = sklearn_gp.GaussianProcessRegressor(k, alpha=1e-12, normalize_y=False, n_restarts_optimizer=0).fit(X, y)
    fit = exact.fit("rbf", X, y, kern.make_params([1.0, 1.0], 1.0, 0.1))
    theta = np.exp(_sk_theta(fit.params))
    np.testing.assert_allclose(theta, np.exp(gpr.kernel_.theta), rtol=1e-3)
    assert fit.lml >= gpr.log_marginal_likelihood_value_ - 1e-7
    Xs = np.random.default_rng(1).random((6, 2))
    mean_sk, std_sk = gpr.predict(Xs, return_std=True)  # of y: includes the white noise
    mean, var = exact.predict("rbf", fit.params, X, y, Xs)
    np.testing.assert_allclose(mean, mean_sk, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(var + fit.params.noise, std_sk**2, rtol=1e-3)


def test_restarts_keep_the_best_start(data):
    X, y = data
    fit = exact.fit(
        "matern52", X, y, kern.make_params([5.0, 5.0], 0.1, 1.0), n_restarts=2, rng=np.random.default_rng(0)
    )
    assert fit.lmls.shape == (3,) and fit.lml == pytest.approx(np.max(fit.lmls))
    assert fit.lml == pytest.approx(exact.log_marginal_likelihood("matern52", fit.params, X, y), rel=1e-12)
    with pytest.raises(ValueError, match="rng"):
        exact.fit("rbf", X, y, fit.params, n_restarts=1)


@pytest.mark.parametrize("kernel", kern.KERNELS)
def test_gradient_matches_finite_differences(data, kernel):
    X, y = data
    p = kern.make_params([0.4, 0.9], 1.2, 0.05)
    _, g = exact.value_and_grad(kernel, p, X, y)
    th = kern.pack(p)
    fd = np.zeros_like(th)
    for i in range(th.size):
        e = np.zeros_like(th)
        e[i] = 1e-6
        fd[i] = (
            exact.log_marginal_likelihood(kernel, kern.unpack(th + e, 2)[0], X, y)
            - exact.log_marginal_likelihood(kernel, kern.unpack(th - e, 2)[0], X, y)
        ) / 2e-6
    np.testing.assert_allclose(kern.pack(g), fd, rtol=1e-6, atol=1e-6)


def test_full_covariance_diagonal_is_the_variance(data):
    X, y = data
    p = kern.make_params([0.4, 0.9], 1.2, 0.05)
    Xs = X[:4] + 0.01
    m1, v = exact.predict("rbf", p, X, y, Xs)
    m2, C = exact.predict("rbf", p, X, y, Xs, full_cov=True)
    np.testing.assert_allclose(m1, m2)
    np.testing.assert_allclose(np.diagonal(C), v, rtol=1e-10, atol=1e-14)
    assert np.array_equal(C, C.T)

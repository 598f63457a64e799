"""SVGP likelihoods (pgmflow.tasks.gp.likelihoods): variational expectations against finite differences
and against closed forms, predictions against known answers, and the SVGP ELBO, its gradient and the
natural-gradient step with a non-conjugate likelihood."""

import math

import numpy as np
import pytest
import scipy.special as sp
import scipy.stats as st

from pgmflow.tasks.gp import kernels as kern
from pgmflow.tasks.gp import likelihoods as lk
from pgmflow.tasks.gp import svgp

LIKS = [
    lk.Likelihood("gaussian"),
    lk.Likelihood("bernoulli", link="probit"),
    lk.Likelihood("bernoulli", link="logit"),
    lk.Likelihood("poisson"),
    lk.Likelihood("student_t", dof=4.0),
    lk.Likelihood("student_t", dof=2.5),
]


def _targets(lik, rng, n):
    if lik.name == "bernoulli":
        return (rng.random(n) < 0.5).astype(float)
    if lik.name == "poisson":
        return rng.poisson(2.0, n).astype(float)
    return 2.0 * rng.standard_normal(n)


@pytest.mark.parametrize("lik", LIKS, ids=lambda x: f"{x.name}-{x.link}-{x.dof}")
def test_variational_expectation_derivatives_match_finite_differences(lik):
    rng = np.random.default_rng(3)
    n = 12
    y = _targets(lik, rng, n)
    mu = 0.8 * rng.standard_normal(n)
    var = 0.05 + rng.random(n)
    ln = -0.4
    e, g, h, dln = lk.variational_expectations(lik, y, mu, var, ln)
    assert e.shape == g.shape == h.shape == dln.shape == (n,)
    eps = 1e-6
    fd_mu = (
        lk.variational_expectations(lik, y, mu + eps, var, ln)[0]
        - lk.variational_expectations(lik, y, mu - eps, var, ln)[0]
    ) / (2 * eps)
    fd_var = (
        lk.variational_expectations(lik, y, mu, var + eps, ln)[0]
        - lk.variational_expectations(lik, y, mu, var - eps, ln)[0]
    ) / (2 * eps)
    fd_ln = (
        lk.variational_expectations(lik, y, mu, var, ln + eps)[0]
        - lk.variational_expectations(lik, y, mu, var, ln - eps)[0]
    ) / (2 * eps)
    np.testing.assert_allclose(g, fd_mu, rtol=1e-6, atol=1e-7)
    # h by Price's theorem: the derivative of the rule up to the rule's error (20 points)
    np.testing.assert_allclose(h, fd_var, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dln, fd_ln, rtol=1e-6, atol=1e-7)
    if lik.name in ("bernoulli", "poisson", "gaussian"):
        assert np.all(h < 0)  # log-concave


def test_log_density_derivatives_match_finite_differences():
    rng = np.random.default_rng(8)
    f = rng.standard_normal(20) * 2
    eps = 1e-6
    for lik in LIKS:
        y = _targets(lik, rng, 20)
        lp, d1, d2, dln = lk.log_density(lik, y, f, 0.3, derivatives=True)
        np.testing.assert_allclose(lp, lk.log_density(lik, y, f, 0.3), rtol=0, atol=0)
        up, dn = lk.log_density(lik, y, f + eps, 0.3, True), lk.log_density(lik, y, f - eps, 0.3, True)
        np.testing.assert_allclose(d1, (up[0] - dn[0]) / (2 * eps), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(d2, (up[1] - dn[1]) / (2 * eps), rtol=1e-6, atol=1e-7)


def test_known_densities():
    y, f = np.array([0.0, 1.0, 1.0]), np.array([0.3, -0.2, 1.5])
    np.testing.assert_allclose(
        lk.log_density(lk.Likelihood("bernoulli", "probit"), y, f), np.log(st.norm.cdf([-0.3, -0.2, 1.5])), rtol=1e-13
    )
    np.testing.assert_allclose(
        lk.log_density(lk.Likelihood("bernoulli", "logit"), y, f), np.log(sp.expit([-0.3, -0.2, 1.5])), rtol=1e-13
    )
    c = np.array([0.0, 3.0, 7.0])
    np.testing.assert_allclose(
        lk.log_density(lk.Likelihood("poisson"), c, f), st.poisson.logpmf(c, np.exp(f)), rtol=1e-13
    )
    t = lk.Likelihood("student_t", dof=3.0)
    np.testing.assert_allclose(
        lk.log_density(t, c, f, math.log(0.7**2)), st.t.logpdf(c, 3.0, loc=f, scale=0.7), rtol=1e-12
    )


def test_poisson_closed_form_equals_quadrature():
    rng = np.random.default_rng(1)
    lik = lk.Likelihood("poisson", quadrature_points=40)
    y = rng.poisson(3.0, 30).astype(float)
    mu, var = rng.standard_normal(30), 0.01 + 0.5 * rng.random(30)
    closed = lk.variational_expectations(lik, y, mu, var)
    quad = lk.variational_expectations_quadrature(lik, y, mu, var)
    for a, b in zip(closed, quad):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-12)


def test_gaussian_closed_form_equals_quadrature():
    rng = np.random.default_rng(2)
    lik = lk.Likelihood("gaussian")
    y, mu, var = rng.standard_normal(10), rng.standard_normal(10), 0.1 + rng.random(10)
    for a, b in zip(
        lk.variational_expectations(lik, y, mu, var, -1.0),
        lk.variational_expectations_quadrature(lik, y, mu, var, -1.0),
    ):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_probit_predictive_closed_form_equals_quadrature():
    rng = np.random.default_rng(4)
    mu, var = 2 * rng.standard_normal(25), 0.01 + 3 * rng.random(25)
    x, w = lk.gauss_hermite(60)
    quad = st.norm.cdf(mu[:, None] + np.sqrt(2 * var)[:, None] * x) @ w
    probit = lk.Likelihood("bernoulli", "probit")
    np.testing.assert_allclose(lk.class_probability(probit, mu, var), quad, rtol=1e-10, atol=1e-12)
    # the quadrature path of predictive_log_density agrees with the closed form too
    y = (rng.random(25) < 0.5).astype(float)
    closed = lk.predictive_log_density(probit, y, mu, var)
    quad_lpd = sp.logsumexp(
        st.norm.logcdf((2 * y - 1)[:, None] * (mu[:, None] + np.sqrt(2 * var)[:, None] * x)) + np.log(w), axis=1
    )
    np.testing.assert_allclose(closed, quad_lpd, rtol=1e-9, atol=1e-12)


def test_predictions_known_answers():
    mu, var = np.array([0.0, 1.0]), np.array([0.0, 0.5])
    logit = lk.Likelihood("bernoulli", "logit")
    p, v = lk.predict_y(logit, mu, var)
    assert p[0] == pytest.approx(0.5, abs=1e-15)
    assert 0.5 < p[1] < sp.expit(1.0)  # the latent variance pulls it towards 1/2
    np.testing.assert_allclose(v, p * (1 - p))
    rate, cv = lk.predict_y(lk.Likelihood("poisson"), mu, var)
    np.testing.assert_allclose(rate, np.exp(mu + var / 2))
    assert cv[0] == pytest.approx(1.0)
    t = lk.Likelihood("student_t", dof=5.0)
    q = lk.predictive_quantiles(t, np.array([1.0]), np.array([0.0]), (0.05, 0.5, 0.95), math.log(0.25))
    np.testing.assert_allclose(q[0], 1.0 + 0.5 * st.t.ppf([0.05, 0.5, 0.95], 5.0), rtol=1e-9, atol=1e-12)
    # with latent variance: the quantile's CDF value is the probability asked for
    q2 = lk.predictive_quantiles(t, np.array([0.0]), np.array([1.0]), (0.9,), math.log(0.25))[0, 0]
    x, w = lk.gauss_hermite(t.quadrature_points)  # the mixture the quantiles are of
    assert st.t.cdf((q2 - math.sqrt(2) * x) / 0.5, 5.0) @ w == pytest.approx(0.9, abs=1e-12)
    x, w = lk.gauss_hermite(200)  # ... and of the true predictive, to the 20-point rule's error
    assert st.t.cdf((q2 - math.sqrt(2) * x) / 0.5, 5.0) @ w == pytest.approx(0.9, abs=1e-4)
    g = lk.Likelihood("gaussian")
    np.testing.assert_allclose(lk.predictive_quantiles(g, mu, var, (0.5,), 0.0)[:, 0], mu)


def test_poisson_predictive_density_and_deviance():
    lik = lk.Likelihood("poisson", quadrature_points=30)
    y, mu = np.array([0.0, 2.0, 5.0]), np.log(np.array([0.5, 2.0, 4.0]))
    lpd = lk.predictive_log_density(lik, y, mu, np.full(3, 1e-14))
    np.testing.assert_allclose(lpd, st.poisson.logpmf(y, np.exp(mu)), rtol=1e-10)
    n, sse, nlpd, dev = lk.test_sums(lik, y, mu, np.zeros(3))
    r = np.exp(mu)
    want = 2 * np.sum(sp.xlogy(y, y / r) - (y - r))
    assert n == 3 and dev == pytest.approx(want, rel=1e-12)
    assert nlpd == pytest.approx(-np.sum(st.poisson.logpmf(y, r)), rel=1e-10)


def test_bernoulli_test_sums_and_metrics():
    lik = lk.Likelihood("bernoulli", "probit")
    y = np.array([1.0, 0.0, 1.0, 0.0])
    mu, var = np.array([2.0, -1.0, -0.5, 0.3]), np.array([0.1, 0.2, 0.3, 0.4])
    n, sse, nlpd, correct = lk.test_sums(lik, y, mu, var)
    p = st.norm.cdf(mu / np.sqrt(1 + var))
    assert (n, correct) == (4, 2.0)
    assert sse == pytest.approx(np.sum((p - y) ** 2), rel=1e-13)
    assert nlpd == pytest.approx(-np.sum(np.log(np.where(y == 1, p, 1 - p))), rel=1e-12)
    m = lk.test_metrics(lik, (n, sse, nlpd, correct))
    assert m["test_accuracy"] == 0.5 and m["test_log_loss"] == m["test_nlpd"] == pytest.approx(nlpd / 4)
    assert m["test_brier"] == pytest.approx(sse / 4)


def test_check_targets():
    b, p = lk.Likelihood("bernoulli"), lk.Likelihood("poisson")
    assert lk.check_targets(b, [0, 1, 1.0]) is None
    assert "row 2" in lk.check_targets(b, [0, 1, 2])
    assert "-1" in lk.check_targets(b, [0, -1])
    assert lk.check_targets(p, [0, 3, 10]) is None
    assert "row 1" in lk.check_targets(p, [0, -1])
    assert "2.5" in lk.check_targets(p, [2.5])
    assert lk.check_targets(lk.Likelihood("student_t"), [-3.2, 1e9]) is None


# ------------------------------------------------------------------------------------------------
# SVGP with a likelihood
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def classification():
    rng = np.random.default_rng(11)
    n, d, m = 50, 2, 7
    X = rng.standard_normal((n, d))
    y = (np.sin(2 * X[:, 0]) + X[:, 1] + 0.3 * rng.standard_normal(n) > 0).astype(float)
    Z = rng.standard_normal((m, d))
    p = kern.make_params([0.9, 1.4], 1.7, 0.3)
    A = rng.standard_normal((m, m))
    q0 = svgp.svgp_init(m, 0.4 * rng.standard_normal(m), 0.3 * A @ A.T / m + 0.2 * np.eye(m))
    return X, y, Z, p, q0


@pytest.mark.parametrize("lik", LIKS[1:], ids=lambda x: f"{x.name}-{x.link}-{x.dof}")
def test_svgp_gradient_with_likelihood_matches_finite_differences(classification, lik):
    X, y, Z, p, q0 = classification
    if lik.name == "poisson":
        y = np.random.default_rng(0).poisson(np.exp(0.5 * X[:, 0])).astype(float)
    elif lik.name == "student_t":
        y = np.sin(X[:, 0]) + 0.2 * np.random.default_rng(0).standard_t(3.0, len(y))
    n = 120  # a minibatch of 50 out of 120 rows
    v, dp, dZ = svgp.svgp_elbo_and_grad("rbf", p, Z, q0, X, y, n, likelihood=lik)
    th = kern.pack(p, Z)
    grad = kern.pack(dp, dZ)
    d, m = X.shape[1], Z.shape[0]
    eps = 1e-6
    rng = np.random.default_rng(5)
    for i in list(range(d + 2)) + list(rng.choice(np.arange(d + 2, th.size), 6, replace=False)):
        e = np.zeros_like(th)
        e[i] = eps
        fp = svgp.svgp_elbo("rbf", *kern.unpack(th + e, d, m), q0, X, y, n, likelihood=lik)
        fm = svgp.svgp_elbo("rbf", *kern.unpack(th - e, d, m), q0, X, y, n, likelihood=lik)
        assert grad[i] == pytest.approx((fp - fm) / (2 * eps), rel=1e-5, abs=1e-5), i
    if not lik.has_param:
        assert dp.log_noise == 0.0


def test_gaussian_likelihood_object_gives_the_same_bits_as_none(classification):
    X, y, Z, p, q0 = classification
    g = lk.Likelihood("gaussian")
    a = svgp.svgp_elbo_and_grad("rbf", p, Z, q0, X, y, 80)
    b = svgp.svgp_elbo_and_grad("rbf", p, Z, q0, X, y, 80, likelihood=g)
    assert a[0] == b[0]
    np.testing.assert_array_equal(kern.pack(a[1], a[2]), kern.pack(b[1], b[2]))
    s1 = svgp.natgrad_step("rbf", p, Z, q0, X, y, 80, 0.3)
    s2 = svgp.natgrad_step("rbf", p, Z, q0, X, y, 80, 0.3, likelihood=g)
    np.testing.assert_array_equal(s1.theta1, s2.theta1)
    np.testing.assert_array_equal(s1.theta2, s2.theta2)


def test_nonconjugate_natgrad_on_gaussian_derivatives_equals_the_conjugate_step(classification):
    """The general step (module docstring) with the Gaussian's g, h is the conjugate step."""
    X, y, Z, p, q0 = classification
    yc = np.sin(X[:, 0])
    L, _ = kern.inducing_cholesky("rbf", p, Z)
    A = np.linalg.solve(L, kern.K("rbf", p, Z, X))
    general = svgp._natgrad_step_nonconjugate("rbf", p, q0, X, yc, 90, 0.4, A, lk.Likelihood("gaussian"))
    conj = svgp.natgrad_step("rbf", p, Z, q0, X, yc, 90, 0.4)
    np.testing.assert_allclose(general.theta1, conj.theta1, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(general.theta2, conj.theta2, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("link", lk.LINKS)
def test_bernoulli_natgrad_fixed_point_maximises_the_elbo_over_q(classification, link):
    """Full-batch steps with rho = 1 converge (the likelihood is log-concave); at the fixed point the
    ELBO's gradient w.r.t. q(v)'s mean vanishes and every perturbation of q lowers the ELBO."""
    X, y, Z, p, _ = classification
    lik = lk.Likelihood("bernoulli", link)
    n, m = len(y), len(Z)
    s = svgp.svgp_init(m)
    elbos = []
    for _ in range(40):
        s = svgp.natgrad_step("rbf", p, Z, s, X, y, n, 1.0, likelihood=lik)
        elbos.append(svgp.svgp_elbo("rbf", p, Z, s, X, y, n, likelihood=lik))
    assert elbos[-1] == pytest.approx(elbos[-2], rel=1e-10)
    assert elbos[-1] >= elbos[0]
    best = elbos[-1]
    mean_v, cov_v = np.linalg.solve(-2 * s.theta2, s.theta1), np.linalg.inv(-2 * s.theta2)
    rng = np.random.default_rng(0)
    for _ in range(5):
        dm = 1e-3 * rng.standard_normal(m)
        B = 1e-3 * rng.standard_normal((m, m))
        other = svgp.svgp_init(m, mean_v + dm, cov_v + B @ B.T)
        assert svgp.svgp_elbo("rbf", p, Z, other, X, y, n, likelihood=lik) < best


def test_student_t_natgrad_step_halves_rho_to_stay_positive_definite():
    rng = np.random.default_rng(2)
    n, m = 30, 5
    X = rng.standard_normal((n, 1))
    y = np.sin(X[:, 0])
    y[:5] += 40.0  # outliers: h > 0 there
    Z = np.linspace(-2, 2, m)[:, None]
    p = kern.make_params([0.5], 1.0, 1e-3)
    lik = lk.Likelihood("student_t", dof=1.5)
    s = svgp.svgp_init(m)
    for _ in range(30):
        s = svgp.natgrad_step("rbf", p, Z, s, X, y, 3000, 1.0, likelihood=lik)
        np.linalg.cholesky(-2 * s.theta2)  # positive definite throughout
    assert np.all(np.isfinite(s.theta1))

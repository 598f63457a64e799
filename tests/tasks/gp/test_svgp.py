"""SVGP (Hensman et al. 2013): one full-batch natural-gradient step with rho = 1 lands on SGPR's
optimal q(u), where the ELBO equals the SGPR bound and the predictions agree; gradients against
finite differences; minibatch natgrad + Adam reaches SGPR's optimum; placement-free minibatches."""

import numpy as np
import pytest

from pgmflow.tasks import rng as trng
from pgmflow.tasks.gp import bounds, data, inducing, stats, svgp
from pgmflow.tasks.gp import kernels as kern


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(21)
    n, d, m = 60, 2, 8
    X = rng.random((n, d))
    y = np.sin(4 * X[:, 0]) + X[:, 1] + 0.1 * rng.standard_normal(n)
    Z = rng.random((m, d))
    p = kern.make_params([0.5, 0.8], 1.3, 0.05)
    # an arbitrary starting q(u), far from the optimum
    A = rng.standard_normal((m, m))
    q0 = svgp.svgp_state_from_q_u("rbf", p, Z, 0.5 * rng.standard_normal(m), 0.2 * A @ A.T / m + 0.05 * np.eye(m))
    return X, y, Z, p, q0


@pytest.mark.parametrize("kernel", kern.KERNELS)
def test_full_batch_step_with_rho_one_is_the_sgpr_optimum(problem, kernel):
    X, y, Z, p, q0 = problem
    n, m = len(y), len(Z)
    st = svgp.natgrad_step(kernel, p, Z, q0, X, y, n, rho=1.0)
    assert st.count == q0.count + 1
    mu, S = svgp.svgp_q_u(kernel, p, Z, st)
    Kuu = kern.K(kernel, p, Z) + kern.DEFAULT_JITTER * p.variance * np.eye(m)
    Kuf = kern.K(kernel, p, Z, X)
    Sigma = np.linalg.inv(Kuu + Kuf @ Kuf.T / p.noise)
    np.testing.assert_allclose(mu, Kuu @ Sigma @ Kuf @ y / p.noise, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(S, Kuu @ Sigma @ Kuu, rtol=1e-8, atol=1e-10)

    st_sgpr = stats.chunk_stats("sgpr", kernel, p, Z, X, y)
    bound, _ = bounds.objective("sgpr", kernel, p, Z, st_sgpr)
    assert svgp.svgp_elbo(kernel, p, Z, st, X, y, n) == pytest.approx(bound, rel=1e-8)
    # any other q(u) gives a smaller ELBO
    assert svgp.svgp_elbo(kernel, p, Z, q0, X, y, n) < bound

    Xs = np.random.default_rng(4).random((5, 2))
    m1, v1 = svgp.svgp_predict(kernel, p, Z, st, Xs)
    m2, v2 = bounds.predict("sgpr", kernel, p, Z, st_sgpr, Xs)
    np.testing.assert_allclose(m1, m2, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(v1, v2, rtol=1e-7, atol=1e-10)
    m3, C = svgp.svgp_predict(kernel, p, Z, st, Xs, full_cov=True)
    np.testing.assert_allclose(m3, m1, rtol=1e-14)
    np.testing.assert_allclose(np.diagonal(C), v1, rtol=1e-10, atol=1e-12)


def test_natgrad_step_interpolates_natural_parameters(problem):
    X, y, Z, p, q0 = problem
    n = len(y)
    full = svgp.natgrad_step("rbf", p, Z, q0, X, y, n, rho=1.0)
    half = svgp.natgrad_step("rbf", p, Z, q0, X, y, n, rho=0.3)
    np.testing.assert_allclose(half.theta1, 0.7 * q0.theta1 + 0.3 * full.theta1, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(half.theta2, 0.7 * q0.theta2 + 0.3 * full.theta2, rtol=1e-12, atol=1e-12)


def test_minibatch_elbo_is_unbiased_over_a_partition(problem):
    X, y, Z, p, q0 = problem
    n = len(y)
    parts = np.array_split(np.arange(n), 4)
    full = svgp.svgp_elbo("rbf", p, Z, q0, X, y, n)
    # average of the per-part estimates (each rescaled by n/b) equals the full-batch ELBO
    est = [svgp.svgp_elbo("rbf", p, Z, q0, X[i], y[i], n) * len(i) / n for i in parts]
    # sum_k (b_k/n) [(n/b_k) ell_k - KL] = sum_k ell_k - KL
    assert sum(est) == pytest.approx(full, rel=1e-12)


@pytest.mark.parametrize("kernel", kern.KERNELS)
def test_elbo_gradient_matches_finite_differences(problem, kernel):
    X, y, Z, p, q0 = problem
    n, d, m = len(y), Z.shape[1], Z.shape[0]
    idx = np.arange(5, 25)
    _, dp, dZ = svgp.svgp_elbo_and_grad(kernel, p, Z, q0, X[idx], y[idx], n)
    g = kern.pack(dp, dZ)
    th = kern.pack(p, Z)
    fd = np.zeros_like(th)
    for i in range(th.size):
        e = np.zeros_like(th)
        e[i] = 1e-5
        pp, Zp = kern.unpack(th + e, d, m)
        pm, Zm = kern.unpack(th - e, d, m)
        fd[i] = (
            svgp.svgp_elbo(kernel, pp, Zp, q0, X[idx], y[idx], n)
            - svgp.svgp_elbo(kernel, pm, Zm, q0, X[idx], y[idx], n)
        ) / 2e-5
    err = np.abs(fd - g) / (np.abs(g) + 1e-3 * np.max(np.abs(g)))
    assert np.max(err) < 1e-5


def test_minibatch_natgrad_and_adam_reach_the_sgpr_optimum():
    X, y = data.sine_1d(0, 500, 0.2)
    X, y = data.Standardizer.fit(X, y).apply(X, y)
    n, m = len(y), 15
    Z = inducing.kmeans_pp(trng.generator(0, trng.STAGE_GP, inducing.GP_STREAM_INDUCING), X, m)
    p0 = kern.make_params([1.0], 1.0, 0.5)
    best = bounds.fit("sgpr", "rbf", p0, Z, X, y, optimize_inducing=False)
    assert best.success
    p, st, ad = p0, svgp.svgp_init(m), svgp.adam_init(kern.pack(p0))
    start = svgp.svgp_elbo("rbf", p, Z, st, X, y, n)
    for t in range(350):
        idx = svgp.minibatch_indices(0, t, n, 100)
        rho, lr = (0.5, 0.05) if t < 250 else (1.0 / (t - 248), 0.002)  # then average q(u) over batches
        st = svgp.natgrad_step("rbf", p, Z, st, X[idx], y[idx], n, rho)
        _, dp, _ = svgp.svgp_elbo_and_grad("rbf", p, Z, st, X[idx], y[idx], n)
        ad, step = svgp.adam_update(ad, -kern.pack(dp), lr=lr)
        p, _ = kern.unpack(kern.pack(p) + step, 1)
    final = svgp.svgp_elbo("rbf", p, Z, st, X, y, n)
    assert start < best.value - 100
    assert final <= best.value + 1e-6
    assert final > best.value - 0.02 * abs(best.value)
    assert p.lengthscale[0] == pytest.approx(best.params.lengthscale[0], rel=0.05)


def test_minibatch_indices_come_from_identity():
    a = svgp.minibatch_indices(3, 7, 1000, 64)
    assert a.dtype == np.int64 and a.shape == (64,)
    assert np.all(np.diff(a) > 0) and a[0] >= 0 and a[-1] < 1000
    np.testing.assert_array_equal(a, svgp.minibatch_indices(3, 7, 1000, 64))
    assert not np.array_equal(a, svgp.minibatch_indices(3, 8, 1000, 64))
    g = trng.generator(3, trng.STAGE_GP, svgp.GP_STREAM_MINIBATCH, 7)
    np.testing.assert_array_equal(a, np.sort(g.choice(1000, 64, replace=False)))
    with pytest.raises(ValueError, match="batch_size"):
        svgp.minibatch_indices(3, 7, 10, 11)


def test_adam_minimises_a_quadratic():
    target = np.array([1.0, -2.0, 3.0])
    x = np.zeros(3)
    st = svgp.adam_init(x)
    for _ in range(2000):
        st, step = svgp.adam_update(st, 2 * (x - target), lr=0.05)
        x = x + step
    assert st.count == 2000
    np.testing.assert_allclose(x, target, atol=1e-3)
    # the first step has size lr in every coordinate (bias correction)
    _, s1 = svgp.adam_update(svgp.adam_init(x), np.array([1e-3, -5.0, 0.0]), lr=0.1)
    np.testing.assert_allclose(s1, [-0.1, 0.1, 0.0], rtol=1e-4)


def test_prior_state_round_trips_through_q_u(problem):
    _, _, Z, p, q0 = problem
    st = svgp.svgp_init(len(Z))
    mu, S = svgp.svgp_q_u("rbf", p, Z, st)
    Kuu = kern.K("rbf", p, Z) + kern.DEFAULT_JITTER * p.variance * np.eye(len(Z))
    np.testing.assert_allclose(S, Kuu, rtol=1e-12, atol=1e-14)  # q(u) = p(u)
    assert not np.any(mu)
    st2 = svgp.svgp_state_from_q_u("rbf", p, Z, *svgp.svgp_q_u("rbf", p, Z, q0))
    np.testing.assert_allclose(st2.theta1, q0.theta1, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(st2.theta2, q0.theta2, rtol=1e-7, atol=1e-9)

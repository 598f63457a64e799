"""Every method takes a kernel object (issue 37): the gradients of the SGPR, DTC and FITC objectives (chunked
statistics, the driver's adjoints, the chunk gradients, the Kuu path), of the SVGP ELBO and of the exact log
marginal likelihood, against central finite differences in float64, w.r.t. the kernel's hyperparameters, the
global scale, the noise and the inducing inputs; the chunked statistics against one chunk; a base object
against the named kernel through a whole objective; and the SGPR bound with Z = X against the exact GP."""

import numpy as np
import pytest

from pgmflow.tasks.gp import bounds, exact, stats, svgp
from pgmflow.tasks.gp import kernel_algebra as ka
from pgmflow.tasks.gp import kernels as kern


def _kernel(d):
    return ka.parse("long:rbf + seasonal:periodic[0] * decay:rbf + medium:rq + lin:linear[1] + white", d)


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(11)
    n, d, m = 40, 2, 7
    X = rng.random((n, d)) * 3
    y = np.sin(2 * X[:, 0]) + 0.3 * X[:, 1] + 0.1 * rng.standard_normal(n)
    Z = rng.random((m, d)) * 3
    k = _kernel(d)
    th = rng.uniform(-0.5, 0.3, k.n_params)
    th[-1] = np.log(0.05)  # a small white variance
    return X, y, Z, k, kern.GPParams(th, 0.2, np.log(0.1))


def _fd(f, x, h=1e-6):
    g = np.zeros_like(x)
    for i in range(x.size):
        xp, xm = x.copy(), x.copy()
        xp[i] += h
        xm[i] -= h
        g[i] = (f(xp) - f(xm)) / (2 * h)
    return g


@pytest.mark.parametrize("method", ["sgpr", "dtc", "fitc"])
def test_collapsed_objectives_gradients_match_finite_differences(problem, method):
    X, y, Z, k, p = problem
    P = k.n_params
    theta = kern.pack(p, Z)
    d, m = X.shape[1], Z.shape[0]

    def f(t):
        pp, ZZ = kern.unpack(t, d, m, P)
        return bounds.value_and_grad(method, k, pp, ZZ, X, y, chunk_size=15, jitter=1e-6)[0]

    _, dp, dZ = bounds.value_and_grad(method, k, p, Z, X, y, chunk_size=15, jitter=1e-6)
    np.testing.assert_allclose(kern.pack(dp, dZ), _fd(f, theta), rtol=2e-5, atol=2e-5)


def test_chunked_statistics_add_up_to_one_chunk(problem):
    """Summed in chunk order they agree with one chunk to rounding (not to the bit: another summation order);
    the same chunking gives the same bits whatever runs it (tests/pipelines/sparse_gp/test_sparse_gp_kernels.py)."""
    X, y, Z, k, p = problem
    for method in ("sgpr", "fitc"):
        one = stats.chunk_stats(method, k, p, Z, X, y)
        parts = stats.sum_in_order(stats.chunk_stats(method, k, p, Z, X[a:b], y[a:b]) for a, b in [(0, 13), (13, 40)])
        for u, v in zip(one, parts):
            np.testing.assert_allclose(u, v, rtol=1e-12, atol=1e-12)


def test_svgp_elbo_gradient_matches_finite_differences(problem):
    X, y, Z, k, p = problem
    rng = np.random.default_rng(2)
    m = Z.shape[0]
    A = rng.standard_normal((m, m))
    st = svgp.svgp_init(m, 0.3 * rng.standard_normal(m), 0.1 * A @ A.T / m + 0.1 * np.eye(m))
    P, d, n = k.n_params, X.shape[1], 100
    theta = kern.pack(p, Z)

    def f(t):
        pp, ZZ = kern.unpack(t, d, m, P)
        return svgp.svgp_elbo(k, pp, ZZ, st, X, y, n)

    _, dp, dZ = svgp.svgp_elbo_and_grad(k, p, Z, st, X, y, n)
    np.testing.assert_allclose(kern.pack(dp, dZ), _fd(f, theta), rtol=2e-5, atol=2e-5)


def test_exact_gradient_matches_finite_differences_and_sgpr_with_z_at_x_is_exact(problem):
    X, y, _, k, p = problem
    P = k.n_params
    _, g = exact.value_and_grad(k, p, X, y)
    np.testing.assert_allclose(
        kern.pack(g), _fd(lambda t: exact.log_marginal_likelihood(k, kern.unpack(t, 2, 0, P)[0], X, y), kern.pack(p))
    )
    # inducing inputs at the data: SGPR's bound is the exact log marginal likelihood (up to the jitter); the white
    # kernel is not low-rank, so this holds without it
    kw = ka.parse("long:rbf + seasonal:periodic[0] * decay:rbf + medium:rq", 2)
    pw = kern.GPParams(p.log_lengthscale[: kw.n_params], p.log_variance, p.log_noise)
    v = bounds.value_and_grad("sgpr", kw, pw, X, X, y, chunk_size=15, jitter=1e-10)[0]
    np.testing.assert_allclose(v, exact.log_marginal_likelihood(kw, pw, X, y), rtol=1e-6)


@pytest.mark.parametrize("method", ["sgpr", "fitc"])
def test_a_base_object_gives_the_named_kernels_objective(problem, method):
    X, y, Z, _, _ = problem
    p = kern.make_params([0.7, 1.3], 1.5, 0.1)
    po = kern.GPParams(np.concatenate([[p.log_variance], p.log_lengthscale]), 0.0, p.log_noise)
    v, dp, dZ = bounds.value_and_grad(method, "matern52", p, Z, X, y, chunk_size=15)
    # the same absolute jitter: relative to the global scale (1) for an object, to s for the named kernel
    vo, dpo, dZo = bounds.value_and_grad(method, ka.base("matern52", 2), po, Z, X, y, chunk_size=15, jitter=1.5e-6)
    np.testing.assert_allclose(vo, v, rtol=1e-10)
    np.testing.assert_allclose(dpo.log_lengthscale[1:], dp.log_lengthscale, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(dZo, dZ, rtol=1e-7, atol=1e-9)

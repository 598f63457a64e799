"""SGPR / DTC / FITC from chunk statistics: chunking invariance, analytic gradients against
finite differences, the Z = X known answer, predictions, and the ordering DTC >= SGPR."""

import numpy as np
import pytest

from pgmflow.tasks.gp import bounds, exact, stats
from pgmflow.tasks.gp import kernels as kern

METHODS = stats.METHODS


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(11)
    n, d, m = 37, 3, 6
    X = rng.random((n, d))
    y = np.sin(3 * X[:, 0]) + X[:, 1] * X[:, 2] + 0.1 * rng.standard_normal(n)
    Z = rng.random((m, d))
    p = kern.make_params([0.5, 0.8, 1.1], 1.3, 0.05)
    return X, y, Z, p


def _stats(method, kernel, p, Z, X, y, chunk_size, jitter=kern.DEFAULT_JITTER):
    return stats.sum_in_order(
        stats.chunk_stats(method, kernel, p, Z, X[a:b], y[a:b], jitter)
        for a, b in stats.chunk_bounds(len(y), chunk_size)
    )


def test_chunk_bounds_and_sum_helpers():
    assert stats.chunk_bounds(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert stats.chunk_bounds(0, 4) == []
    with pytest.raises(ValueError, match="chunk_size"):
        stats.chunk_bounds(10, 0)
    a = stats.Stats(2, 1.0, 2.0, np.ones(2), np.eye(2))
    b = stats.Stats(3, 0.5, 1.0, np.arange(2.0), 2 * np.eye(2))
    s = a + b
    assert isinstance(s, stats.Stats) and s.n == 5 and s.yy == 1.5
    np.testing.assert_array_equal(s.AAT, 3 * np.eye(2))
    assert sum([a, b]).psi0 == 3.0  # sum() starts from 0
    with pytest.raises(ValueError):
        stats.sum_in_order([])


@pytest.mark.parametrize("method", METHODS)
def test_statistics_do_not_depend_on_chunking(problem, method):
    X, y, Z, p = problem
    ref = _stats(method, "matern52", p, Z, X, y, len(y))
    for cs in (1, 5, 16):
        st = _stats(method, "matern52", p, Z, X, y, cs)
        assert st.n == ref.n
        for a, b in zip(st, ref):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13 * np.max(np.abs(ref.AAT)))
        again = _stats(method, "matern52", p, Z, X, y, cs)
        for a, b in zip(st, again):  # same chunking: identical bits
            assert np.array_equal(a, b)
    assert np.array_equal(ref.AAT, ref.AAT.T)
    v1, g1, z1 = bounds.value_and_grad(method, "rbf", p, Z, X, y, chunk_size=7)
    v2, g2, z2 = bounds.value_and_grad(method, "rbf", p, Z, X, y, chunk_size=100)
    scale = abs(ref.yy) / p.noise if method != "fitc" else abs(ref.yy)  # size of the cancelling terms
    assert v1 == pytest.approx(v2, rel=1e-12, abs=1e-13 * scale)
    np.testing.assert_allclose(kern.pack(g1, z1), kern.pack(g2, z2), rtol=1e-9, atol=1e-10)


def _value(method, kernel, p, Z, X, y):
    return bounds.objective(method, kernel, p, Z, _stats(method, kernel, p, Z, X, y, 10))[0]


@pytest.mark.parametrize("kernel", kern.KERNELS)
@pytest.mark.parametrize("method", METHODS)
def test_gradients_match_central_finite_differences(problem, method, kernel):
    X, y, Z, p = problem
    d, m = Z.shape[1], Z.shape[0]
    _, dp, dZ = bounds.value_and_grad(method, kernel, p, Z, X, y, chunk_size=10)
    g = kern.pack(dp, dZ)
    th = kern.pack(p, Z)
    h = 1e-5
    fd = np.zeros_like(th)
    for i in range(th.size):
        e = np.zeros_like(th)
        e[i] = h
        pp, Zp = kern.unpack(th + e, d, m)
        pm, Zm = kern.unpack(th - e, d, m)
        fd[i] = (_value(method, kernel, pp, Zp, X, y) - _value(method, kernel, pm, Zm, X, y)) / (2 * h)
    # every block (log lengthscales, log variance, log noise, Z) is checked
    err = np.abs(fd - g) / (np.abs(g) + 1e-3 * np.max(np.abs(g)))
    assert np.max(err) < 1e-5, (method, kernel, np.max(err))
    assert np.all(np.abs(g[: d + 2]) > 0)


@pytest.mark.parametrize("kernel", kern.KERNELS)
def test_inducing_inputs_at_the_data_give_the_exact_marginal_likelihood(kernel):
    rng = np.random.default_rng(5)
    n = 30
    X = rng.random((n, 2))
    y = np.cos(4 * X[:, 0]) - X[:, 1] + 0.1 * rng.standard_normal(n)
    p = kern.make_params([0.25, 0.4], 1.5, 0.05)
    want = exact.log_marginal_likelihood(kernel, p, X, y)
    Xs = rng.random((7, 2))
    mean_e, var_e = exact.predict(kernel, p, X, y, Xs)
    for method in METHODS:
        st = _stats(method, kernel, p, X, X, y, 8, jitter=1e-8)
        value, _ = bounds.objective(method, kernel, p, X, st, jitter=1e-8)
        assert value == pytest.approx(want, rel=1e-6), method
        mean, var = bounds.predict(method, kernel, p, X, st, Xs, jitter=1e-8)
        np.testing.assert_allclose(mean, mean_e, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(var, var_e, rtol=1e-4, atol=1e-6)


def test_sgpr_lower_bounds_dtc_and_the_exact_likelihood(problem):
    X, y, Z, p = problem
    ex = exact.log_marginal_likelihood("rbf", p, X, y)
    sgpr, _ = bounds.objective("sgpr", "rbf", p, Z, _stats("sgpr", "rbf", p, Z, X, y, 10))
    dtc, _ = bounds.objective("dtc", "rbf", p, Z, _stats("dtc", "rbf", p, Z, X, y, 10))
    assert sgpr < ex
    assert sgpr < dtc
    # the gap between SGPR and DTC is exactly tr(Kff - Qff) / (2 sigma^2)
    Kuu = kern.K("rbf", p, Z) + 1e-6 * p.variance * np.eye(len(Z))
    Kuf = kern.K("rbf", p, Z, X)
    trace = np.trace(kern.K("rbf", p, X)) - np.trace(Kuf.T @ np.linalg.solve(Kuu, Kuf))
    assert dtc - sgpr == pytest.approx(trace / (2 * p.noise), rel=1e-8)


@pytest.mark.parametrize("method", METHODS)
def test_predictions_match_dense_formulas(problem, method):
    X, y, Z, p = problem
    st = _stats(method, "matern32", p, Z, X, y, 9)
    Xs = np.random.default_rng(2).random((5, 3))
    mean, var = bounds.predict(method, "matern32", p, Z, st, Xs)
    mean_f, cov_f = bounds.predict(method, "matern32", p, Z, st, Xs, full_cov=True)
    Kuu = kern.K("matern32", p, Z) + 1e-6 * p.variance * np.eye(len(Z))
    Kuf = kern.K("matern32", p, Z, X)
    Ksu = kern.K("matern32", p, Xs, Z)
    if method == "fitc":
        lam = p.variance - np.sum(Kuf * np.linalg.solve(Kuu, Kuf), axis=0) + p.noise
        Sigma = np.linalg.inv(Kuu + (Kuf / lam) @ Kuf.T)
        mean_d = Ksu @ Sigma @ Kuf @ (y / lam)
    else:
        Sigma = np.linalg.inv(Kuu + Kuf @ Kuf.T / p.noise)
        mean_d = Ksu @ Sigma @ Kuf @ y / p.noise
    cov_d = kern.K("matern32", p, Xs) - Ksu @ np.linalg.solve(Kuu, Ksu.T) + Ksu @ Sigma @ Ksu.T
    np.testing.assert_allclose(mean, mean_d, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(var, np.diagonal(cov_d), rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(cov_f, cov_d, rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(mean_f, mean, rtol=1e-14)


def test_duplicate_inducing_inputs_raise_the_jitter_instead_of_failing(problem):
    X, y, Z, p = problem
    Zd = np.vstack([Z, Z[:2]])  # K(Z, Z) exactly singular: no Cholesky without jitter
    st = _stats("sgpr", "rbf", p, Zd, X, y, 10, jitter=0.0)
    value, adj = bounds.objective("sgpr", "rbf", p, Zd, st, jitter=0.0)
    assert np.isfinite(value)
    assert adj.jitter == pytest.approx(1e-8 * p.variance)  # the first retry of stable_cholesky


def test_bad_arguments_are_refused(problem):
    X, y, Z, p = problem
    with pytest.raises(ValueError, match="sgpr, dtc, fitc"):
        stats.chunk_stats("vfe", "rbf", p, Z, X, y)
    st = _stats("sgpr", "rbf", p, Z, X, y, 10)
    with pytest.raises(TypeError, match="FITCStats"):
        bounds.objective("fitc", "rbf", p, Z, st)
    _, adj = bounds.objective("sgpr", "rbf", p, Z, st)
    with pytest.raises(ValueError, match="adjoints"):
        stats.chunk_grad("dtc", "rbf", p, Z, X, y, adj)
    with pytest.raises(ValueError, match="y_chunk"):
        stats.chunk_stats("sgpr", "rbf", p, Z, X, y[:-1])


@pytest.mark.parametrize("method", ["sgpr", "dtc", "fitc"])
def test_objective_without_dkuu_gives_every_other_output_bit_for_bit(problem, method):
    X, y, Z, p = problem
    st = stats.chunk_stats(method, "rbf", p, Z, X, y)
    v1, a1 = bounds.objective(method, "rbf", p, Z, st)
    v2, a2 = bounds.objective(method, "rbf", p, Z, st, with_dkuu=False)
    assert a2.dKuu is None and a1.dKuu is not None and v1 == v2
    for f in a1._fields:
        if f != "dKuu":
            assert np.array_equal(getattr(a1, f), getattr(a2, f)), f


def test_dense_inducing_inputs_factor_at_the_jitter_kuu_needs():
    """Issue 37: with the inducing inputs at 150 closely spaced inputs and a long lengthscale, Kuu factors at a
    relative jitter of 1e-12 but ``I + L^-1 (Kuf Kfu) L^-T / sigma^2`` (the statistics before issue 37) is
    indefinite in rounding; ``I + A A' / sigma^2`` from ``A = L^-1 Kuf`` factors, the jitter does not grow, and
    every method with Z = X gives the exact log marginal likelihood."""
    rng = np.random.default_rng(3)
    X = np.linspace(0.0, 1.0, 150)[:, None]
    y = np.sin(6 * X[:, 0]) + 0.01 * rng.standard_normal(150)
    p = kern.make_params(0.5, 1.0, 1e-4)
    L, jit = kern.inducing_cholesky("rbf", p, X, 1e-12)
    assert jit == pytest.approx(1e-12)
    K = kern.K("rbf", p, X, X)
    old = np.eye(150) + np.linalg.solve(L, np.linalg.solve(L, K @ K).T) / p.noise  # L^-1 psi2 L^-T
    assert np.linalg.eigvalsh(0.5 * (old + old.T))[0] < 0  # what the old statistics gave
    want = exact.log_marginal_likelihood("rbf", p, X, y)
    for method in METHODS:
        st = _stats(method, "rbf", p, X, X, y, 40, jitter=1e-12)
        value, adj = bounds.objective(method, "rbf", p, X, st, jitter=1e-12)
        assert adj.jitter == pytest.approx(1e-12 * p.variance), method  # no growth
        assert value == pytest.approx(want, rel=1e-5, abs=1e-3), method


@pytest.mark.parametrize("method", METHODS)
def test_gradients_with_inducing_inputs_at_the_data_match_finite_differences(problem, method):
    """The analytic gradient (the chunks' ``L^-T``-whitened adjoint and the driver's path through ``L``) against
    central differences where ``Kuu`` is badly conditioned: the inducing inputs at a third of the data, relative
    jitter 1e-8, a lengthscale twice the inputs' range."""
    X, y, _, _ = problem
    Z = X[::3].copy()
    p = kern.make_params([2.0, 2.5, 3.0], 1.3, 0.05)
    d, m = Z.shape[1], Z.shape[0]
    jitter = 1e-8
    assert np.linalg.cond(kern.K("rbf", p, Z)) > 1e6

    def value(t):
        q, Zq = kern.unpack(t, d, m)
        return bounds.value_and_grad(method, "rbf", q, Zq, X, y, chunk_size=10, jitter=jitter)[0]

    _, dp, dZ = bounds.value_and_grad(method, "rbf", p, Z, X, y, chunk_size=10, jitter=jitter)
    g = kern.pack(dp, dZ)
    th = kern.pack(p, Z)
    h = 1e-6
    fd = np.array([(value(th + h * e) - value(th - h * e)) / (2 * h) for e in np.eye(th.size)])
    err = np.abs(fd - g) / (np.abs(g) + 1e-3 * np.max(np.abs(g)))
    assert np.max(err) < 1e-4, (method, np.max(err))

"""Kernels against per-pair formulas, their adjoints against finite differences, pack/unpack,
stable_cholesky, the Cholesky adjoint, and (GPU) the CuPy path against NumPy."""

import math

import numpy as np
import pytest

from pgmflow.tasks.gp import kernels as kern


def _pair(kernel, ls, s, x, z):
    r = math.sqrt(float(np.sum(((x - z) / ls) ** 2)))
    if kernel == "rbf":
        return s * math.exp(-0.5 * r * r)
    if kernel == "matern32":
        return s * (1 + math.sqrt(3) * r) * math.exp(-math.sqrt(3) * r)
    return s * (1 + math.sqrt(5) * r + 5 * r * r / 3) * math.exp(-math.sqrt(5) * r)


@pytest.fixture
def setup():
    rng = np.random.default_rng(3)
    X1 = rng.standard_normal((9, 3))
    X2 = rng.standard_normal((6, 3))
    X2[2] = X1[4]  # a coinciding pair: r = 0 exactly
    p = kern.make_params([0.7, 1.3, 2.1], 1.7, 0.1)
    return rng, X1, X2, p


@pytest.mark.parametrize("kernel", kern.KERNELS)
def test_kernel_values_match_per_pair_formula(setup, kernel):
    _, X1, X2, p = setup
    ls, s = p.lengthscale, p.variance
    want = np.array([[_pair(kernel, ls, s, a, b) for b in X2] for a in X1])
    np.testing.assert_allclose(kern.K(kernel, p, X1, X2), want, rtol=1e-12, atol=1e-14)
    want_sym = np.array([[_pair(kernel, ls, s, a, b) for b in X1] for a in X1])
    Ks = kern.K(kernel, p, X1)
    np.testing.assert_allclose(Ks, want_sym, rtol=1e-12, atol=1e-14)
    assert np.array_equal(Ks, Ks.T)
    np.testing.assert_array_equal(np.diagonal(Ks), np.full(9, s))
    np.testing.assert_array_equal(kern.K_diag(kernel, p, X1), np.full(9, s))


def test_unknown_kernel_names_the_allowed_ones(setup):
    _, X1, X2, p = setup
    with pytest.raises(ValueError, match="rbf, matern32, matern52"):
        kern.K("laplace", p, X1, X2)
    with pytest.raises(ValueError, match="lengthscales"):
        kern.K("rbf", kern.make_params([1.0, 1.0], 1.0, 1.0), X1, X2)


def test_pack_unpack_round_trip():
    p = kern.make_params([0.5, 2.0], 3.0, 0.25)
    Z = np.arange(6.0).reshape(3, 2)
    th = kern.pack(p, Z)
    assert th.shape == (kern.n_packed(2, 3),) == (10,)
    p2, Z2 = kern.unpack(th, 2, 3)
    np.testing.assert_array_equal(p2.log_lengthscale, p.log_lengthscale)
    assert (p2.log_variance, p2.log_noise) == (p.log_variance, p.log_noise)
    np.testing.assert_array_equal(Z2, Z)
    p3, Z3 = kern.unpack(kern.pack(p), 2)
    assert Z3 is None and p3.noise == pytest.approx(0.25)
    with pytest.raises(ValueError, match="shape"):
        kern.unpack(th, 2, 2)


def _fd(f, x, h=1e-6):
    x = np.array(x, dtype=np.float64)
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = h
        g[i] = (f(x + e) - f(x - e)) / (2 * h)
    return g


@pytest.mark.parametrize("kernel", kern.KERNELS)
def test_K_vjp_matches_finite_differences(setup, kernel):
    rng, X1, X2, p = setup
    B = rng.standard_normal((9, 6))
    g = kern.K_vjp(kernel, p, X1, X2, B, wrt_X1=True, wrt_X2=True)

    def with_params(ll, lv):
        return float(np.sum(B * kern.K(kernel, kern.GPParams(ll, lv, p.log_noise), X1, X2)))

    np.testing.assert_allclose(
        g.log_lengthscale, _fd(lambda v: with_params(v, p.log_variance), p.log_lengthscale), rtol=1e-6, atol=1e-8
    )
    assert g.log_variance == pytest.approx(with_params(p.log_lengthscale, p.log_variance), rel=1e-12)
    np.testing.assert_allclose(
        g.X1, _fd(lambda v: float(np.sum(B * kern.K(kernel, p, v, X2))), X1), rtol=1e-6, atol=1e-8
    )
    np.testing.assert_allclose(
        g.X2, _fd(lambda v: float(np.sum(B * kern.K(kernel, p, X1, v))), X2), rtol=1e-6, atol=1e-8
    )
    assert np.all(np.isfinite(g.X2))


@pytest.mark.parametrize("kernel", kern.KERNELS)
def test_K_sym_vjp_matches_finite_differences(setup, kernel):
    rng, X1, _, p = setup
    B = rng.standard_normal((9, 9))
    B = B + B.T
    g = kern.K_sym_vjp(kernel, p, X1, B, wrt_X=True)
    np.testing.assert_allclose(g.X1, _fd(lambda v: float(np.sum(B * kern.K(kernel, p, v))), X1), rtol=1e-6, atol=1e-8)
    ll = _fd(lambda v: float(np.sum(B * kern.K(kernel, kern.GPParams(v, p.log_variance, 0.0), X1))), p.log_lengthscale)
    np.testing.assert_allclose(g.log_lengthscale, ll, rtol=1e-6, atol=1e-8)
    g2 = kern.K_sym_vjp(kernel, p, X1, B, wrt_X=False)
    np.testing.assert_allclose(g2.log_lengthscale, g.log_lengthscale, rtol=1e-12)
    assert g2.X1 is None
    gd = kern.K_diag_vjp(kernel, p, X1, np.arange(9.0))
    assert gd.log_variance == pytest.approx(36.0 * p.variance) and not np.any(gd.log_lengthscale)


def test_stable_cholesky_retries_on_near_singular_matrix():
    rng = np.random.default_rng(0)
    V = rng.standard_normal((12, 3))
    A = V @ V.T  # rank 3: not positive definite in floating point
    A[0, 0] -= 1e-7  # and slightly indefinite, so that the first jitter (1e-8 * mean diag) is too small
    L, jit = kern.stable_cholesky(A)
    base = 1e-8 * np.mean(np.diagonal(A))
    assert jit > base
    assert jit / base in (10.0, 100.0, 1000.0, 1e4, 1e5)
    np.testing.assert_allclose(L @ L.T, A + jit * np.eye(12), atol=1e-10)
    L0, j0 = kern.stable_cholesky(np.eye(4) * 2.0, jitter0=0.0)
    assert j0 == 0.0 and np.allclose(L0, np.sqrt(2.0) * np.eye(4))


def test_stable_cholesky_raises_after_max_tries():
    A = np.diag([1.0, 1.0, -1.0])
    with pytest.raises(kern.CholeskyError, match="after 4 tries") as exc:
        kern.stable_cholesky(A, max_tries=4)
    assert isinstance(exc.value, ValueError)
    with pytest.raises(kern.CholeskyError, match="NaN"):
        kern.stable_cholesky(np.array([[1.0, np.nan], [np.nan, 1.0]]))


def test_inducing_cholesky_jitter_is_relative_to_scale():
    Z = np.linspace(0, 1, 5)[:, None]
    p = kern.make_params([0.3], 4.0, 0.1)
    L, jit = kern.inducing_cholesky("rbf", p, Z, jitter=1e-6)
    assert jit == pytest.approx(4e-6)
    np.testing.assert_allclose(L @ L.T, kern.K("rbf", p, Z) + jit * np.eye(5), atol=1e-12)


def test_cholesky_backward_matches_finite_differences():
    rng = np.random.default_rng(1)
    V = rng.standard_normal((5, 5))
    A = V @ V.T + 5 * np.eye(5)
    W = np.tril(rng.standard_normal((5, 5)))

    def f(S):
        S = 0.5 * (S + S.T)
        return float(np.sum(W * np.linalg.cholesky(S)))

    Abar = kern.cholesky_backward(np.linalg.cholesky(A), W)
    fd = _fd(f, A)  # derivative w.r.t. each entry of the symmetrised argument
    np.testing.assert_allclose(Abar, fd, rtol=1e-6, atol=1e-8)
    assert np.allclose(Abar, Abar.T)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", kern.KERNELS)
def test_cupy_kernels_and_chunk_stats_match_numpy(setup, kernel):
    from pgmflow.tasks import backend
    from pgmflow.tasks.gp import bounds, stats

    cp = backend.cupy()
    rng, X1, X2, p = setup
    np.testing.assert_allclose(
        backend.to_numpy(kern.K(kernel, p, cp.asarray(X1), cp.asarray(X2))),
        kern.K(kernel, p, X1, X2),
        rtol=1e-10,
        atol=1e-12,
    )
    np.testing.assert_allclose(
        backend.to_numpy(kern.K(kernel, p, cp.asarray(X1))), kern.K(kernel, p, X1), rtol=1e-10, atol=1e-12
    )
    B = rng.standard_normal((9, 6))
    gc = kern.K_vjp(kernel, p, cp.asarray(X1), cp.asarray(X2), cp.asarray(B), wrt_X1=True)
    gn = kern.K_vjp(kernel, p, X1, X2, B, wrt_X1=True)
    np.testing.assert_allclose(backend.to_numpy(gc.X1), gn.X1, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(backend.to_numpy(gc.log_lengthscale), gn.log_lengthscale, rtol=1e-9, atol=1e-11)
    y = rng.standard_normal(9)
    for method in ("sgpr", "fitc"):
        sn = stats.chunk_stats(method, kernel, p, X2, X1, y)
        sc = stats.chunk_stats(method, kernel, p, X2, cp.asarray(X1), cp.asarray(y))
        for a, b in zip(sn, sc):
            np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-11)
        _, adj = bounds.objective(method, kernel, p, X2, sn)
        gn = stats.chunk_grad(method, kernel, p, X2, X1, y, adj)
        gc = stats.chunk_grad(method, kernel, p, X2, cp.asarray(X1), cp.asarray(y), adj)
        for a, b in zip(gn, gc):
            np.testing.assert_allclose(b, a, rtol=1e-8, atol=1e-10)

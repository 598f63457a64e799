"""Kernel objects (issue 37): values against per-pair formulas, every adjoint against central finite
differences in float64 (w.r.t. the hyperparameters and the inputs), for every base kernel, sums,
products and active dims; hashability; and the agreement with the named kernels' own code."""

import math

import numpy as np
import pytest

from pgmflow.tasks.gp import kernel_algebra as ka
from pgmflow.tasks.gp import kernels as kern

D = 3


def _pair(kind, th, x, z, same):
    s = math.exp(th[0])
    if kind in ("rbf", "matern12", "matern32", "matern52", "rq"):
        ls = np.exp(th[1 : 1 + D])
        u = float(np.sum(((x - z) / ls) ** 2))
        r = math.sqrt(u)
        return {
            "rbf": s * math.exp(-0.5 * u),
            "matern12": s * math.exp(-r),
            "matern32": s * (1 + math.sqrt(3) * r) * math.exp(-math.sqrt(3) * r),
            "matern52": s * (1 + math.sqrt(5) * r + 5 * u / 3) * math.exp(-math.sqrt(5) * r),
            "rq": s * (1 + u / (2 * math.exp(th[-1]))) ** (-math.exp(th[-1])),
        }[kind]
    if kind == "periodic":
        ell, p = math.exp(th[1]), math.exp(th[2])
        return s * math.exp(-2 * sum(math.sin(math.pi * (a - b) / p) ** 2 for a, b in zip(x, z)) / ell**2)
    if kind == "linear":
        return s * float(x @ z)
    if kind == "constant":
        return s
    return s if same else 0.0  # white


def _theta(k, seed=1):
    return np.random.default_rng(seed).uniform(-0.6, 0.6, k.n_params)


@pytest.fixture
def data():
    rng = np.random.default_rng(7)
    X1 = rng.standard_normal((7, D))
    X2 = rng.standard_normal((5, D))
    return X1, X2, rng


@pytest.mark.parametrize("kind", list(ka.BASE_KINDS))
def test_base_values_match_per_pair_formulas(data, kind):
    X1, X2, _ = data
    k = ka.base(kind, D)
    th = _theta(k)
    want = np.array([[_pair(kind, th, a, b, False) for b in X2] for a in X1])
    np.testing.assert_allclose(k.K(th, X1, X2), want, rtol=1e-12, atol=1e-14)
    Ks = k.K(th, X1)
    want_sym = np.array([[_pair(kind, th, a, b, i == j) for j, b in enumerate(X1)] for i, a in enumerate(X1)])
    np.testing.assert_allclose(Ks, want_sym, rtol=1e-12, atol=1e-14)
    assert np.array_equal(Ks, Ks.T)
    np.testing.assert_allclose(k.K_diag(th, X1), np.diagonal(Ks), rtol=1e-14)


def _kernels():
    rbf, per, rq, white = (ka.base(k, D) for k in ("rbf", "periodic", "rq", "white"))
    return {
        **{kind: ka.base(kind, D) for kind in ka.BASE_KINDS},
        "sum": rbf + ka.base("matern32", D, name="m") + ka.base("linear", D),
        "product": ka.base("periodic", D) * ka.base("rbf", D, name="decay"),
        "rw_co2": ka.base("rbf", D, name="long")
        + per * ka.base("rbf", D, name="decay")
        + rq
        + ka.base("rbf", D, name="short")
        + white,
        "active_dims": ka.base("rbf", D, dims=[0, 2]) * ka.base("periodic", D, dims=[1], name="p")
        + ka.base("linear", D, dims=[1]),
        "sum_of_products": (rbf + ka.base("constant", D)) * ka.base("matern52", D, dims=[2]),
    }


KERNELS = _kernels()


def _fd(f, x, h=1e-6):
    x = np.array(x, dtype=np.float64)
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += h
        xm[i] -= h
        g[i] = (f(xp) - f(xm)) / (2 * h)
    return g


@pytest.mark.parametrize("name", list(KERNELS))
def test_cross_adjoints_match_finite_differences(data, name):
    X1, X2, rng = data
    k = KERNELS[name]
    th = _theta(k, 2)
    dK = rng.standard_normal((X1.shape[0], X2.shape[0]))
    dth, dX1, dX2 = k.vjp(th, X1, X2, dK, True, True)
    np.testing.assert_allclose(dth, _fd(lambda t: np.sum(dK * k.K(t, X1, X2)), th), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(dX1, _fd(lambda x: np.sum(dK * k.K(th, x, X2)), X1), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(dX2, _fd(lambda x: np.sum(dK * k.K(th, X1, x)), X2), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", list(KERNELS))
def test_symmetric_and_diagonal_adjoints_match_finite_differences(data, name):
    X1, _, rng = data
    k = KERNELS[name]
    th = _theta(k, 3)
    A = rng.standard_normal((X1.shape[0], X1.shape[0]))
    dK = A + A.T
    dth, dX, none = k.vjp(th, X1, None, dK, True, True)
    assert none is None
    np.testing.assert_allclose(dth, _fd(lambda t: np.sum(dK * k.K(t, X1)), th), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(dX, _fd(lambda x: np.sum(dK * k.K(th, x)), X1), rtol=1e-6, atol=1e-7)
    dd = rng.standard_normal(X1.shape[0])
    np.testing.assert_allclose(
        k.diag_vjp(th, X1, dd), _fd(lambda t: np.sum(dd * k.K_diag(t, X1)), th), rtol=1e-6, atol=1e-7
    )


@pytest.mark.parametrize("name", ["rw_co2", "active_dims", "rq", "periodic"])
def test_scaled_object_through_the_kernels_module(data, name):
    """``kernels.K_vjp`` / ``K_sym_vjp`` / ``K_diag_vjp`` with an object: theta in ``log_lengthscale``,
    a global scale in ``log_variance``; finite differences over both."""
    X1, X2, rng = data
    k = KERNELS[name]
    th = _theta(k, 4)
    p = kern.GPParams(th, 0.3, -2.0)
    dK = rng.standard_normal((X1.shape[0], X2.shape[0]))
    g = kern.K_vjp(k, p, X1, X2, dK, wrt_X1=True, wrt_X2=True)

    def val(t, lv=0.3):
        return np.sum(dK * kern.K(k, kern.GPParams(t, lv, -2.0), X1, X2))

    np.testing.assert_allclose(g.log_lengthscale, _fd(val, th), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(g.log_variance, _fd(lambda v: val(th, v[0]), [0.3])[0], rtol=1e-6)
    dd = rng.standard_normal(X1.shape[0])
    gd = kern.K_diag_vjp(k, p, X1, dd)
    np.testing.assert_allclose(
        gd.log_lengthscale, _fd(lambda t: np.sum(dd * kern.K_diag(k, kern.GPParams(t, 0.3, 0.0), X1)), th), rtol=1e-6
    )
    np.testing.assert_allclose(gd.log_variance, float(np.sum(dd * kern.K_diag(k, p, X1))), rtol=1e-14)


@pytest.mark.parametrize("kind", ["rbf", "matern32", "matern52"])
def test_objects_agree_with_the_named_kernels(data, kind):
    """A base object with unit scale equals the named kernel's matrices and adjoints (to rounding)."""
    X1, X2, rng = data
    p = kern.make_params([0.7, 1.3, 2.1], 1.7, 0.1)
    k = ka.base(kind, D)
    po = kern.GPParams(np.concatenate([[p.log_variance], p.log_lengthscale]), 0.0, p.log_noise)
    np.testing.assert_allclose(kern.K(k, po, X1, X2), kern.K(kind, p, X1, X2), rtol=1e-12)
    dK = rng.standard_normal((7, 5))
    a, b = kern.K_vjp(k, po, X1, X2, dK, True, True), kern.K_vjp(kind, p, X1, X2, dK, True, True)
    np.testing.assert_allclose(a.log_lengthscale[1:], b.log_lengthscale, rtol=1e-10)
    np.testing.assert_allclose(a.X1, b.X1, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(a.X2, b.X2, rtol=1e-10, atol=1e-12)


def test_objects_are_immutable_hashable_and_compose():
    a = ka.base("rbf", 2) + ka.base("periodic", 2) * ka.base("rbf", 2, name="decay")
    b = ka.base("rbf", 2) + ka.base("periodic", 2) * ka.base("rbf", 2, name="decay")
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != ka.base("rbf", 2) + ka.base("periodic", 2)
    with pytest.raises(AttributeError):
        a.terms = ()
    assert a.spec == "rbf + periodic * decay:rbf"
    assert a.n_params == 3 + 3 + 3
    assert a.param_names()[:3] == ["rbf.variance", "rbf.lengthscale[0]", "rbf.lengthscale[1]"]
    # sums and products flatten
    c = ka.base("rbf", 1) + ka.base("white", 1) + ka.base("constant", 1)
    assert isinstance(c, ka.Sum) and len(c.terms) == 3
    with pytest.raises(ValueError, match="active dims"):
        ka.base("rbf", 2, dims=[2])
    with pytest.raises(ValueError, match="unknown kernel"):
        ka.base("laplace", 2)


def _gpu():
    from pgmflow.tasks import backend

    ok = backend.gpu_status()[0]
    return backend.cupy() if ok else pytest.skip("needs a CUDA GPU with CuPy")


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["rw_co2", "active_dims", "sum_of_products", "matern12", "linear"])
def test_cupy_objects_match_numpy_and_finite_differences(data, name):
    """The CuPy path of a kernel object (``backend.array_module``): values and adjoints as on NumPy, and the
    composed chunk statistics and gradients (SGPR, FITC) of ``pgmflow.tasks.gp.stats``."""
    from pgmflow.tasks import backend
    from pgmflow.tasks.gp import bounds, stats

    cp = _gpu()
    X1, X2, rng = data
    k = KERNELS[name]
    th = _theta(k, 5)
    G1, G2 = cp.asarray(X1), cp.asarray(X2)
    np.testing.assert_allclose(backend.to_numpy(k.K(th, G1, G2)), k.K(th, X1, X2), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(backend.to_numpy(k.K(th, G1)), k.K(th, X1), rtol=1e-10, atol=1e-12)
    dK = rng.standard_normal((7, 5))
    gc, gn = k.vjp(th, G1, G2, cp.asarray(dK), True, True), k.vjp(th, X1, X2, dK, True, True)
    np.testing.assert_allclose(gc[0], gn[0], rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(backend.to_numpy(gc[1]), gn[1], rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(backend.to_numpy(gc[2]), gn[2], rtol=1e-9, atol=1e-11)
    y = rng.standard_normal(7)
    p = kern.GPParams(th, 0.0, math.log(0.1))
    for method in ("sgpr", "fitc"):
        sn = stats.chunk_stats(method, k, p, X2, X1, y)
        sc = stats.chunk_stats(method, k, p, X2, G1, cp.asarray(y))
        for a, b in zip(sn, sc):
            np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-11)
        _, adj = bounds.objective(method, k, p, X2, sn)
        gn = stats.chunk_grad(method, k, p, X2, X1, y, adj)
        gc = stats.chunk_grad(method, k, p, X2, G1, cp.asarray(y), adj)
        for a, b in zip(gn, gc):
            # GPU and CPU BLAS round differently; the gradient entries cancel (a linear term: ~1e-8 relative)
            np.testing.assert_allclose(backend.to_numpy(b), backend.to_numpy(a), rtol=1e-7, atol=1e-9)

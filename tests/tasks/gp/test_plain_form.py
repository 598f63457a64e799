"""The two forms of the SGPR / DTC chunk passes (``pgmflow.tasks.gp.fused.plain_inverse``): the plain one
(``Kuf Kfu`` and ``Kuf y`` whitened once per chunk with an explicit ``L^-1``; the gradient's ``L^-T W L^-1``
formed once) where ``Kuu`` is well conditioned, the whitened one (triangular solves against every block of
``Kuf``) where it is not. Both must give the same bound and gradient to rounding on every kernel path (the
cache-blocked RBF, the whole-chunk named kernels, kernel objects), the choice must follow the conditioning, and a
badly conditioned ``Kuu`` must keep the whitened form (the CO2 record with ``Z = X`` is where the plain form
broke: ``tests/pipelines/sparse_gp`` and ``benchmarks/gp_sgpr_conditioning.py``)."""

import math

import numpy as np
import pytest
import scipy.linalg

from pgmflow.tasks.gp import bounds, fused, stats
from pgmflow.tasks.gp import kernel_algebra as ka
from pgmflow.tasks.gp import kernels as kern
from tests.tasks.gp.conftest import make_problem


def _forms(monkeypatch, method, kernel, p, Z, X, y, chunk_size):
    """``{form: (value, packed gradient, stats)}`` of one multi-chunk evaluation in each form."""
    out = {}
    for form, cap in (("plain", math.inf), ("whitened", 0.0)):
        monkeypatch.setattr(fused, "PLAIN_MAX_COND", cap)
        v, dp, dZ = bounds.value_and_grad(method, kernel, p, Z, X, y, chunk_size=chunk_size)
        L = kern.inducing_cholesky(kernel, p, Z)[0]
        st = stats.chunk_stats(method, kernel, p, Z, X[:chunk_size], y[:chunk_size], L=L)
        out[form] = (v, kern.pack(dp, dZ), st)
    return out


def _object_kernel(d):
    return ka.parse("long:rbf + seasonal:periodic[0] * decay:rbf + medium:rq + white", d)


@pytest.mark.parametrize("method", ["sgpr", "dtc"])
@pytest.mark.parametrize("kernel", ["rbf", "matern32", "object"])
def test_both_forms_give_the_same_bound_gradient_and_statistics(monkeypatch, method, kernel):
    X, y, Z, p = make_problem(fused.BLOCK + 700, m=15, seed=8)
    if kernel == "object":
        kernel = _object_kernel(X.shape[1])
        rng = np.random.default_rng(4)
        th = rng.uniform(-0.4, 0.3, kernel.n_params)
        th[-1] = np.log(0.05)
        p = kern.GPParams(th, 0.2, np.log(0.1))
    L = kern.inducing_cholesky(kernel, p, Z)[0]
    assert fused.plain_inverse(L) is not None or kernel != "rbf"  # the default choice here is the plain form
    f = _forms(monkeypatch, method, kernel, p, Z, X, y, chunk_size=700)
    (v1, g1, s1), (v2, g2, s2) = f["plain"], f["whitened"]
    assert v1 == pytest.approx(v2, abs=1e-12 * X.shape[0])  # (the bound is a sum of n-sized terms that cancel)
    np.testing.assert_allclose(g1, g2, rtol=1e-8, atol=1e-9 * np.abs(g2).max())
    np.testing.assert_allclose(s1.AAT, s2.AAT, rtol=1e-10, atol=1e-12 * np.abs(s2.AAT).max())
    np.testing.assert_allclose(s1.Ay, s2.Ay, rtol=1e-10, atol=1e-12 * np.abs(s2.Ay).max())
    assert np.array_equal(s1.AAT, s1.AAT.T)  # exactly symmetric in the plain form too
    assert np.all(np.linalg.eigvalsh(np.eye(Z.shape[0]) + s1.AAT / 0.05) > 0.99)


def test_plain_inverse_is_the_inverse_of_a_well_conditioned_factor_and_none_for_a_bad_one():
    X, y, Z, p = make_problem(50, m=10, seed=2)
    L = kern.inducing_cholesky("rbf", p, Z)[0]
    Linv = fused.plain_inverse(L)
    assert Linv is not None and Linv.flags.f_contiguous
    np.testing.assert_allclose(Linv @ L, np.eye(10), atol=1e-12)
    assert np.array_equal(np.triu(Linv, 1), np.zeros((10, 10)))
    # inducing inputs as dense as data (Z = X on a fine grid, a long lengthscale): cond(Kuu) near 1 / jitter
    Zd = np.linspace(0.0, 1.0, 60)[:, None]
    pd = kern.make_params([1.0], 1.0, 0.01)
    Ld = kern.inducing_cholesky("rbf", pd, Zd)[0]
    assert fused.plain_inverse(Ld) is None
    # the criterion is the condition number, not the size: a well-separated set of the same size is plain
    Zs = np.linspace(0.0, 60.0, 60)[:, None]
    assert fused.plain_inverse(kern.inducing_cholesky("rbf", pd, Zs)[0]) is not None


def test_a_badly_conditioned_kuu_keeps_the_whitened_form_bit_for_bit(monkeypatch):
    """At the default threshold a badly conditioned ``Kuu`` gives exactly the whitened form's bits (and a
    well-conditioned one exactly the plain form's): the choice is made, and made from ``L``."""
    rng = np.random.default_rng(0)
    X = np.sort(rng.random((400, 1)), axis=0)
    y = np.sin(6 * X[:, 0]) + 0.05 * rng.standard_normal(400)
    p = kern.make_params([0.5], 1.0, 0.01)
    for Z, want in ((X[::8].copy(), "whitened"), (np.linspace(0, 1, 4)[:, None], "plain")):
        L = kern.inducing_cholesky("rbf", p, Z)[0]
        default = bounds.value_and_grad("sgpr", "rbf", p, Z, X, y, chunk_size=150)
        monkeypatch.setattr(fused, "PLAIN_MAX_COND", math.inf if want == "plain" else 0.0)
        forced = bounds.value_and_grad("sgpr", "rbf", p, Z, X, y, chunk_size=150)
        monkeypatch.undo()
        assert (fused.plain_inverse(L) is None) == (want == "whitened")
        assert default[0] == forced[0]
        assert np.array_equal(kern.pack(*default[1:]), kern.pack(*forced[1:]))


def _solve_ld(L, B, trans=False):
    """``L^-1 B`` (``trans``: ``L^-T B``) by substitution in NumPy's extended precision (64-bit significands)."""
    Ld = L.astype(np.longdouble)
    X = np.array(B, dtype=np.longdouble)
    m = L.shape[0]
    rows = range(m - 1, -1, -1) if trans else range(m)
    for i in rows:
        done = Ld[i + 1 :, i] @ X[i + 1 :] if trans else Ld[i, :i] @ X[:i]
        X[i] = (X[i] - done) / Ld[i, i]
    return X


@pytest.mark.parametrize("rel_jitter", [1e-10, 1e-6])
def test_the_gradient_contractions_keep_their_accuracy_with_z_equal_to_x(rel_jitter):
    """With the inducing inputs at the data (``cond_1(L)`` 1e5..1e8), the whitened form's gradient
    contractions through ``fused.rbf_grad`` (``R = M L^-1 Kuf`` with ``M = L^-T W`` formed once) are as close to
    an extended-precision reference as two triangular solves per block (``R = L^-T (W (L^-1 Kuf))``), or within
    1e-10 of the contraction's scale ``sum |G|`` (at ``cond_1(L)`` 5e7 the sum's error is 2e-12 of it, 1e3 times
    the two solves'), and within 1e-8 of it in the sums; ``L^-T W L^-1`` formed explicitly is off by orders of
    magnitude more (why the plain form is kept for a well-conditioned ``Kuu`` only)."""
    rng = np.random.default_rng(1)
    n = 240
    X = np.sort(rng.random((n, 1)), axis=0)
    y = np.zeros(n)
    p = kern.make_params([0.3], 1.0, 0.01)
    L = kern.inducing_cholesky("rbf", p, X, rel_jitter)[0]
    assert fused.plain_inverse(L) is None
    K = kern.K("rbf", p, X, X)
    A = _solve_ld(L, K).astype(np.float64)
    W = -0.5 * np.linalg.inv(np.eye(n) + A @ A.T / 0.01) / 0.01  # dF/dAAT's shape: -(B^-1) / (2 sigma^2)
    W = 0.5 * (W + W.T)
    Xs = X / 0.3
    x2 = Xs[:, 0] ** 2

    def contractions(R):  # (sum G, 1' G x~^2, G 1) of G = -R * Kuf (a = 0)
        G = -np.asarray(R, dtype=np.longdouble) * K.astype(np.longdouble)
        return G.sum(), (G @ x2.astype(np.longdouble)).sum(), G.sum(axis=1)

    ref = contractions(_solve_ld(L, W.astype(np.longdouble) @ _solve_ld(L, K), trans=True))
    two_solves = contractions(
        scipy.linalg.solve_triangular(L, W @ scipy.linalg.solve_triangular(L, K, lower=True), lower=True, trans="T")
    )
    GX, g1, sq, g_sum = fused.rbf_grad(W, np.zeros(n), K, Xs, y, L)
    ours = (g_sum, sq[0], g1)
    scale = float(np.abs(-_solve_ld(L, W @ A, trans=True) * K).sum())
    for got, base, want in zip(ours, two_solves, ref):
        err = float(np.max(np.abs(np.asarray(got, dtype=np.longdouble) - want)))
        err_base = float(np.max(np.abs(base - want)))
        assert err <= 2.0 * err_base + 1e-10 * scale, (err, err_base)
    assert abs(g_sum - float(ref[0])) < 1e-8 * scale
    Linv = scipy.linalg.lapack.dtrtri(L, lower=1)[0]
    explicit = contractions((Linv.T @ W @ Linv) @ K)
    assert abs(float(explicit[0] - ref[0])) > 100 * abs(g_sum - float(ref[0]))

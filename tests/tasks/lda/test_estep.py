"""The LDA E-step kernel against a plain NumPy/SciPy implementation, and the SVI global step."""

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.special import digamma as sp_digamma

from pgmflow.tasks.lda import estep, svi


def _corpus(D=60, V=300, K=6, seed=0):
    rng = np.random.default_rng(seed)
    X = sp.random(D, V, density=0.05, random_state=seed, format="csr")
    X.data = np.ceil(X.data * 4)
    lam = rng.gamma(2.0, 1.0, (K, V)) + 0.1
    return X, lam


def test_digamma_matches_scipy():
    x = np.concatenate([np.geomspace(1e-6, 1e6, 2000), [0.5, 1.0, 6.0, 5.999999]])
    np.testing.assert_allclose(estep.digamma(x), sp_digamma(x), rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kernel_matches_numpy_reference(seed):
    X, lam = _corpus(seed=seed)
    cols = np.unique(X.indices).astype(np.int64)
    eeb = svi.exp_elog_beta(lam, cols)
    alpha = np.full(lam.shape[0], 0.3)
    docs = np.arange(X.shape[0])
    a = estep.estep(X.indptr, X.indices, X.data, docs, cols, eeb, alpha, max_iter=200, tol=1e-6)
    b = estep.estep_numpy(X.indptr, X.indices, X.data, docs, cols, eeb, alpha, max_iter=200, tol=1e-6)
    np.testing.assert_allclose(a.gamma, b.gamma, rtol=1e-7)  # digamma series vs scipy: ~1e-11
    np.testing.assert_allclose(a.sstats, b.sstats, rtol=1e-7, atol=1e-10)
    assert a.doc_bound == pytest.approx(b.doc_bound, rel=1e-9)
    assert a.iterations == b.iterations
    assert a.n_tokens == X.sum()
    # the statistics distribute every token over topics: each column sums to the word's count
    np.testing.assert_allclose(a.sstats.sum(axis=1), np.asarray(X.sum(axis=0)).ravel()[cols], rtol=1e-10)


def test_fixed_point_and_bound_optimality():
    """At convergence gamma = alpha + sum_n c_n phi_n, and the bound is maximal in gamma."""
    X, lam = _corpus(D=5, seed=3)
    cols = np.unique(X.indices).astype(np.int64)
    eeb = svi.exp_elog_beta(lam, cols)
    alpha = np.full(lam.shape[0], 0.2)
    r = estep.estep(X.indptr, X.indices, X.data, np.array([2]), cols, eeb, alpha, max_iter=5000, tol=1e-12)
    g = r.gamma[0]
    np.testing.assert_allclose(g.sum(), alpha.sum() + X[2].sum(), rtol=1e-10)

    def bound_at(gamma):
        w, c = X[2].indices, X[2].data
        B = eeb[np.searchsorted(cols, w)]
        ea = np.exp(sp_digamma(gamma) - sp_digamma(gamma.sum()))
        from scipy.special import gammaln

        el = sp_digamma(gamma) - sp_digamma(gamma.sum())
        return (
            c @ np.log(B @ ea)
            + np.sum((alpha - gamma) * el)
            + np.sum(gammaln(gamma) - gammaln(alpha))
            + gammaln(alpha.sum())
            - gammaln(gamma.sum())
        )

    assert bound_at(g) == pytest.approx(r.doc_bound, rel=1e-10)
    rng = np.random.default_rng(0)
    for _ in range(20):
        assert bound_at(g * np.exp(0.05 * rng.standard_normal(g.size))) <= r.doc_bound + 1e-9


def test_documents_are_independent_of_the_batch():
    """A document's statistics do not depend on which other documents or columns share its batch (the
    basis of bit-identical sums across worker counts)."""
    X, lam = _corpus(D=40, seed=4)
    alpha = np.full(lam.shape[0], 0.1)
    all_cols = np.arange(X.shape[1], dtype=np.int64)
    eeb_all = svi.exp_elog_beta(lam, all_cols)
    full = estep.estep(X.indptr, X.indices, X.data, np.arange(40), all_cols, eeb_all, alpha)
    parts = np.zeros_like(full.sstats)
    for docs in (np.arange(0, 13), np.arange(13, 40)):
        cols = np.unique(np.concatenate([X[d].indices for d in docs])).astype(np.int64)
        r = estep.estep(X.indptr, X.indices, X.data, docs, cols, eeb_all[cols], alpha)
        np.testing.assert_array_equal(r.gamma, full.gamma[docs])
        parts[cols] += r.sstats
    np.testing.assert_allclose(parts, full.sstats, rtol=1e-14, atol=0)


def test_words_outside_cols_are_refused():
    X, lam = _corpus(D=4)
    cols = np.unique(X.indices)[1:].astype(np.int64)
    with pytest.raises(ValueError, match="not in cols"):
        estep.estep(X.indptr, X.indices, X.data, np.arange(4), cols, np.ones((cols.size, 6)), np.ones(6))


def test_svi_update_is_the_natural_gradient_step():
    s = svi.init(3, 10, seed=1)
    assert s.lam.shape == (3, 10) and s.count == 0
    np.testing.assert_array_equal(s.lam, svi.init(3, 10, seed=1).lam)
    sst = np.arange(30.0).reshape(3, 10)
    new, info = svi.update(s, sst, batch_docs=5, n_docs=100, eta=0.1, tau0=4.0, kappa=0.6)
    rho = (4.0 + 0) ** -0.6
    np.testing.assert_allclose(new.lam, (1 - rho) * s.lam + rho * (0.1 + 20.0 * sst))
    assert info.rho == pytest.approx(rho) and new.count == 1 and new.docs_seen == 5
    new2, info2 = svi.update(new, sst, 5, 100, 0.1, 4.0, 0.6)
    assert info2.rho == pytest.approx(5.0**-0.6)


def test_topic_term_bound_is_zero_at_the_prior():
    lam = np.full((4, 7), 0.3)
    assert svi.topic_term_bound(lam, 0.3) == pytest.approx(0.0, abs=1e-10)
    assert svi.topic_term_bound(lam * 5, 0.3) < 0


@pytest.mark.slow
def test_serial_and_parallel_kernels_give_the_same_bits():
    """Workers with one numba thread run the serial kernel, others the parallel one: same bits."""
    X, lam = _corpus(D=80, seed=5)
    cols = np.unique(X.indices).astype(np.int64)
    eeb = svi.exp_elog_beta(lam, cols)
    k = estep._kernels()
    loc = np.searchsorted(cols, X.indices).astype(np.int64)
    args = (X.indptr.astype(np.int64), loc, X.data.astype(np.float64), eeb, np.full(6, 0.2), 100, 1e-3)
    a, b = k["estep_serial"](*args), k["estep_parallel"](*args)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("chunk", [1 << 24, 64])
def test_array_version_matches_the_kernel(chunk):
    """estep_xp is the GPU path; with xp=numpy it runs here and must agree with the numba kernel
    (to rounding: its sums run in another order), including the iteration counts."""
    X, lam = _corpus(D=70, seed=6)
    cols = np.unique(X.indices).astype(np.int64)
    eeb = svi.exp_elog_beta(lam, cols)
    alpha = np.full(6, 0.2)
    a = estep.estep(X.indptr, X.indices, X.data, np.arange(70), cols, eeb, alpha, max_iter=100, tol=1e-4)
    loc = np.searchsorted(cols, X.indices).astype(np.int64)
    b = estep.estep_xp(
        X.indptr.astype(np.int64), loc, X.data.astype(np.float64), eeb, alpha, 100, 1e-4, np, chunk_elements=chunk
    )
    # digamma: SciPy's here, the kernel's own series there (~1e-11 apart), amplified by iterating
    np.testing.assert_allclose(b.gamma, a.gamma, rtol=1e-7)
    np.testing.assert_allclose(b.sstats, a.sstats, rtol=1e-7, atol=1e-10)
    assert b.doc_bound == pytest.approx(a.doc_bound, rel=1e-9)
    assert b.iterations == a.iterations and b.n_tokens == a.n_tokens


@pytest.mark.gpu
def test_cupy_estep_matches_numpy():
    X, lam = _corpus(D=200, seed=7)
    cols = np.unique(X.indices).astype(np.int64)
    eeb = svi.exp_elog_beta(lam, cols)
    alpha = np.full(6, 0.2)
    args = (X.indptr, X.indices, X.data, np.arange(200), cols, eeb, alpha, 100, 1e-4)
    a = estep.estep(*args)
    b = estep.estep(*args, array_backend="cupy")
    np.testing.assert_allclose(b.gamma, a.gamma, rtol=1e-7)
    np.testing.assert_allclose(b.sstats, a.sstats, rtol=1e-7, atol=1e-10)
    assert b.iterations == a.iterations

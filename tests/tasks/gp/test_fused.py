"""The cache-blocked SGPR/DTC passes (pgmflow.tasks.gp.fused) against the whole-chunk formulas, on
chunks of one block, of exactly one block, and of several blocks with a ragged last one; the
gradient they give against finite differences across blocks; the Kuf layouts give the same bits;
and the Kuf store's buffers (handed back by the gradient task, reused by the next statistics task)."""

import math

import numpy as np
import pytest

from pgmflow.tasks import fastexp
from pgmflow.tasks.gp import bounds, chunks, fused, kuf_cache, stats
from pgmflow.tasks.gp import kernels as kern
from tests.tasks.gp.conftest import make_problem


def _problem(n, m=7):
    return make_problem(n, m=m, seed=3)


@pytest.fixture(params=["plain", "whitened"])
def form(request, monkeypatch):
    """Each pass in both of its forms (``fused.plain_inverse``): the plain one (``Kuf Kfu`` whitened once per
    chunk) and the whitened one (a triangular solve per block), whatever the problem's conditioning."""
    monkeypatch.setattr(fused, "PLAIN_MAX_COND", math.inf if request.param == "plain" else 0.0)
    return request.param


@pytest.mark.parametrize("n", [5, fused.BLOCK, 2 * fused.BLOCK + 333])
def test_blocked_passes_equal_the_whole_chunk_formulas(n, form):
    X, y, Z, p = _problem(n)
    ls = np.exp(p.log_lengthscale)
    Zs, Xs = Z / ls, X / ls
    K = kern.K("rbf", p, Z, X)  # [m, n], kernels' own path
    L, _ = kern.inducing_cholesky("rbf", p, Z)
    Ay, AAT, Kb, A_kept = fused.rbf_stats(Zs, Xs, y, float(p.log_variance), L, keep_a=True)
    assert (A_kept is None) == (form == "plain")
    assert Kb.shape == K.shape and Kb.flags.f_contiguous
    np.testing.assert_allclose(Kb, K, rtol=1e-14, atol=1e-300)
    A = np.linalg.solve(L, K)  # [m, n]  L^-1 Kuf
    np.testing.assert_allclose(AAT, A @ A.T, rtol=1e-10, atol=1e-12 * np.abs(AAT).max())
    np.testing.assert_allclose(Ay, A @ y, rtol=1e-10, atol=1e-12 * np.abs(Ay).max())
    assert np.array_equal(AAT, AAT.T)  # exactly symmetric
    rng = np.random.default_rng(1)
    W = rng.standard_normal((Z.shape[0],) * 2)
    W = W + W.T
    a = rng.standard_normal(Z.shape[0])
    GX, g1, sq, g_sum = fused.rbf_grad(W, a, Kb, Xs, y, L)
    if A_kept is not None:  # the kept A gives the bits of solving for it again, and is what it says
        np.testing.assert_allclose(A_kept, A, rtol=1e-10, atol=1e-12 * np.abs(A).max())
        for got, want in zip(fused.rbf_grad(W, a, Kb, Xs, y, L, A=A_kept), (GX, g1, sq, g_sum)):
            assert np.array_equal(got, want)
    P = np.linalg.solve(L.T, W @ np.linalg.solve(L, K))  # L^-T W L^-1 Kuf
    G = -(P + 0.5 * np.outer(a, y)) * K
    T = G @ kern._augment(np, Xs)  # [G x~, G x~^2, G 1]
    d = X.shape[1]
    tol = 1e-10 * np.abs(G).sum()
    np.testing.assert_allclose(GX, T[:, :d], rtol=1e-10, atol=tol)
    np.testing.assert_allclose(g1, T[:, 2 * d], rtol=1e-10, atol=tol)
    np.testing.assert_allclose(sq, T[:, d : 2 * d].sum(axis=0), rtol=1e-10, atol=tol * np.abs(Xs).max() ** 2)
    assert math.isclose(g_sum, G.sum(), rel_tol=1e-10, abs_tol=1e-10 * np.abs(G).sum())


@pytest.mark.parametrize("method", ["sgpr", "dtc"])
def test_blocked_gradient_matches_finite_differences_across_blocks(method, form):
    X, y, Z, p = _problem(fused.BLOCK + 150, m=5)
    theta = kern.pack(p, Z)
    d, m = X.shape[1], Z.shape[0]

    def value_grad(t):
        q, Zq = kern.unpack(t, d, m)
        st = stats.chunk_stats(method, "rbf", q, Zq, X, y)
        v, adj = bounds.objective(method, "rbf", q, Zq, st)
        dq, dZ = bounds.finish_grad(method, "rbf", q, Zq, adj, stats.chunk_grad(method, "rbf", q, Zq, X, y, adj))
        return v, kern.pack(dq, dZ)

    _, g = value_grad(theta)
    rng = np.random.default_rng(7)
    for _ in range(3):
        u = rng.standard_normal(theta.size)
        u /= np.linalg.norm(u)
        h = 1e-5
        fd = (value_grad(theta + h * u)[0] - value_grad(theta - h * u)[0]) / (2 * h)
        assert math.isclose(fd, g @ u, rel_tol=2e-6, abs_tol=1e-6 * np.abs(g).sum()), (fd, g @ u)


@pytest.mark.parametrize("method", ["sgpr", "dtc"])
def test_any_layout_of_a_given_kuf_gives_the_same_bits(method):
    X, y, Z, p = _problem(fused.BLOCK + 40)
    K = stats.cross_covariance("rbf", p, Z, X)
    assert K.flags.f_contiguous
    st, K2 = stats.chunk_stats_and_kuf(method, "rbf", p, Z, X, y)
    assert np.array_equal(K, K2)
    ls = np.exp(p.log_lengthscale)
    KC = fused.rbf_kuf(Z / ls, X / ls, float(p.log_variance), order="C")  # what FITC's passes take
    assert KC.flags.c_contiguous and np.array_equal(KC, K)
    C = np.ascontiguousarray(K)
    C.flags.writeable = False
    for given in (K, C):
        assert all(np.array_equal(u, v) for u, v in zip(st, stats.chunk_stats(method, "rbf", p, Z, X, y, Kuf=given)))
    _, adj = bounds.objective(method, "rbf", p, Z, st)
    g = stats.chunk_grad(method, "rbf", p, Z, X, y, adj)
    for given in (K, C):
        assert all(
            np.array_equal(np.asarray(u), np.asarray(v))
            for u, v in zip(g, stats.chunk_grad(method, "rbf", p, Z, X, y, adj, Kuf=given))
        )
    # FITC takes the same Kuf, in C order, whichever layout it is given
    fst = stats.chunk_stats("fitc", "rbf", p, Z, X, y)
    assert all(np.array_equal(u, v) for u, v in zip(fst, stats.chunk_stats("fitc", "rbf", p, Z, X, y, Kuf=K)))


def test_out_buffer_is_checked_and_a_huge_scale_takes_the_whole_chunk_path():
    X, y, Z, p = _problem(50)
    ls = np.exp(p.log_lengthscale)
    with pytest.raises(ValueError, match="Fortran-ordered"):
        fused.rbf_kuf(Z / ls, X / ls, 0.3, out=np.empty((Z.shape[0], 50)))  # C order
    with pytest.raises(ValueError, match="shape"):
        fused.rbf_kuf(Z / ls, X / ls, 0.3, out=np.empty((Z.shape[0], 49), order="F"))
    out = np.empty((Z.shape[0], 50), order="F")
    assert fused.rbf_kuf(Z / ls, X / ls, 0.3, out=out) is out
    big = p._replace(log_variance=fastexp.MAX_CAP + 1.0)  # e^701: NumPy's exp on the whole chunk
    st, K = stats.chunk_stats_and_kuf("sgpr", "rbf", big, Z, X, y)
    assert K.flags.c_contiguous and np.all(np.isfinite(st.Ay))


def test_the_gradient_task_hands_kuf_back_and_the_next_statistics_task_reuses_it():
    X, y, Z, p = _problem(300)
    c = chunks.Chunk(X, y, X[:0], y[:0])
    st = chunks.chunk_stats_task("sgpr", "rbf", p, Z, c, None, "numpy")
    stored = next(iter(kuf_cache._store.values()))
    assert not stored.flags.writeable
    _, adj = bounds.objective("sgpr", "rbf", p, Z, st)
    g = chunks.chunk_grad_task("sgpr", "rbf", p, Z, c, adj, "numpy")
    assert kuf_cache.nbytes() == 0 and kuf_cache.free_bytes() == stored.nbytes
    assert stored.flags.writeable
    st2 = chunks.chunk_stats_task("sgpr", "rbf", p, Z, c, None, "numpy")
    assert kuf_cache.free_bytes() == 0 and next(iter(kuf_cache._store.values())) is stored  # written over
    assert all(np.array_equal(u, v) for u, v in zip(st, st2))
    assert all(
        np.array_equal(np.asarray(u), np.asarray(v))
        for u, v in zip(g, chunks.chunk_grad_task("sgpr", "rbf", p, Z, c, adj, "numpy"))
    )


def test_buffers_are_only_whole_arrays_within_the_budget(monkeypatch):
    a = np.zeros((4, 5), order="F")
    kuf_cache.recycle(a)
    assert kuf_cache.buffer((4, 5), "C") is None  # another layout
    assert kuf_cache.buffer((4, 5)) is a and kuf_cache.buffer((4, 5)) is None
    kuf_cache.recycle(a[:, :2])  # a view: not ours to hand out
    kuf_cache.recycle(np.zeros(3, dtype=np.float32))
    assert kuf_cache.free_bytes() == 0
    kept = np.zeros((10, 100))
    assert kuf_cache.put(b"k", kept)
    kuf_cache.recycle(kept)  # still in the store: refused
    assert kuf_cache.free_bytes() == 0
    monkeypatch.setenv(kuf_cache.KUF_CACHE_ENV, str(2 * 8000 / 2**20))  # room for two 1000-entry matrices
    kuf_cache.recycle(np.zeros((10, 100)))
    kuf_cache.recycle(np.zeros((10, 100)))  # over the budget with the stored one: dropped
    assert kuf_cache.free_bytes() == 8000
    assert kuf_cache.put(b"j", np.ones((10, 100)))  # a free buffer goes before a stored entry
    assert kuf_cache.free_bytes() == 0 and kuf_cache.nbytes() == 16000

"""Kuf kept between the two passes of an evaluation (pgmflow.tasks.gp.kuf_cache) and the CPU exp of the
RBF cross matrices (pgmflow.tasks.fastexp): a stored Kuf, a hit and a miss give the same bits; the
store keys on everything Kuf depends on and keeps to its budget; the exp is within 1 ulp of NumPy's."""

import numpy as np
import pytest

from pgmflow.tasks import fastexp
from pgmflow.tasks.gp import bounds, chunks, kuf_cache, stats
from pgmflow.tasks.gp import kernels as kern
from tests.tasks.gp.conftest import make_problem


@pytest.fixture
def problem():
    return make_problem(300)


def _same(a, b):
    return all(np.array_equal(np.asarray(u), np.asarray(v)) for u, v in zip(a, b, strict=True))


@pytest.mark.parametrize("method", stats.METHODS)
def test_a_given_kuf_gives_the_same_bits(problem, method):
    X, y, Z, p = problem
    K = stats.cross_covariance("rbf", p, Z, X)
    K.flags.writeable = False  # as the store keeps it: neither pass writes to it
    st = stats.chunk_stats(method, "rbf", p, Z, X, y)
    assert _same(st, stats.chunk_stats(method, "rbf", p, Z, X, y, Kuf=K))
    _, adj = bounds.objective(method, "rbf", p, Z, st)
    assert _same(
        stats.chunk_grad(method, "rbf", p, Z, X, y, adj), stats.chunk_grad(method, "rbf", p, Z, X, y, adj, Kuf=K)
    )


def test_a_given_kuf_is_refused_where_it_cannot_serve(problem):
    X, y, Z, p = problem
    with pytest.raises(ValueError, match="rbf kernel only"):
        stats.chunk_stats("sgpr", "matern32", p, Z, X, y, Kuf=kern.K("matern32", p, Z, X))
    with pytest.raises(ValueError, match="shape"):
        stats.chunk_stats("sgpr", "rbf", p, Z, X, y, Kuf=stats.cross_covariance("rbf", p, Z, X[:-1]))


@pytest.mark.parametrize("method", ["sgpr", "fitc"])
def test_chunk_tasks_give_the_same_bits_on_a_hit_and_a_miss(problem, method):
    X, y, Z, p = problem
    c = chunks.Chunk(X, y, X[:0], y[:0])
    st = chunks.chunk_stats_task(method, "rbf", p, Z, c, None, "numpy")
    assert kuf_cache.nbytes() == Z.shape[0] * X.shape[0] * 8
    _, adj = bounds.objective(method, "rbf", p, Z, st)
    before = kuf_cache.counts()
    hit = chunks.chunk_grad_task(method, "rbf", p, Z, c, adj, "numpy")
    assert kuf_cache.nbytes() == 0  # taken by the gradient task
    miss = chunks.chunk_grad_task(method, "rbf", p, Z, c, adj, "numpy")
    after = kuf_cache.counts()
    assert (after["hits"] - before["hits"], after["misses"] - before["misses"]) == (1, 1)
    assert _same(hit, miss)
    assert _same(hit, stats.chunk_grad(method, "rbf", p, Z, X, y, adj))
    assert _same(st, stats.chunk_stats(method, "rbf", p, Z, X, y, 1e-6))


def test_other_kernels_and_a_store_turned_off_keep_nothing(problem, monkeypatch):
    X, y, Z, p = problem
    c = chunks.Chunk(X, y, X[:0], y[:0])
    chunks.chunk_stats_task("sgpr", "matern52", p, Z, c, None, "numpy")
    assert kuf_cache.nbytes() == 0
    monkeypatch.setenv(kuf_cache.KUF_CACHE_ENV, "0")
    chunks.chunk_stats_task("sgpr", "rbf", p, Z, c, None, "numpy")
    assert kuf_cache.nbytes() == 0
    monkeypatch.setenv(kuf_cache.KUF_CACHE_ENV, "lots")
    with pytest.raises(ValueError, match=kuf_cache.KUF_CACHE_ENV):
        kuf_cache.budget_bytes()


def test_the_key_follows_what_kuf_depends_on(problem):
    X, y, Z, p = problem
    k = kuf_cache.key("rbf", p, Z, X)
    assert k == kuf_cache.key("rbf", p._replace(log_noise=p.log_noise + 1.0), Z, X.copy())  # not the noise
    Z2, X2 = Z.copy(), X.copy()
    Z2[3, 1] += 1e-12
    X2[-1, 0] = np.nextafter(X2[-1, 0], 1.0)
    others = [
        kuf_cache.key("matern32", p, Z, X),
        kuf_cache.key("rbf", p._replace(log_variance=0.3), Z, X),
        kuf_cache.key("rbf", p._replace(log_lengthscale=p.log_lengthscale + [0, 0, 1e-9]), Z, X),
        kuf_cache.key("rbf", p, Z2, X),
        kuf_cache.key("rbf", p, Z, X2),
        kuf_cache.key("rbf", p, Z, X[:-1]),
    ]
    assert len({k, *others}) == 7


def test_the_store_keeps_to_its_budget_dropping_the_oldest(monkeypatch):
    monkeypatch.setenv(kuf_cache.KUF_CACHE_ENV, str(3 * 8000 / 2**20))  # room for three 1000-entry matrices
    for i in range(5):
        assert kuf_cache.put(bytes([i]), np.full((10, 100), float(i)))
    assert kuf_cache.nbytes() == 3 * 8000
    assert kuf_cache.take(bytes([0])) is None and kuf_cache.take(bytes([1])) is None
    kept = kuf_cache.take(bytes([2]))
    assert kept is not None and kept[0, 0] == 2.0 and not kept.flags.writeable
    assert not kuf_cache.put(b"big", np.zeros((10, 400)))  # larger than the whole budget: not kept
    assert kuf_cache.nbytes() == 2 * 8000


@pytest.mark.parametrize("fma", [False, True])
def test_capped_exp_is_within_one_ulp_of_numpy(fma):
    rng = np.random.default_rng(0)
    E = np.concatenate(
        [
            np.linspace(-708.0, 700.0, 200_001),
            -40.0 * rng.random(100_000),
            [0.0, -0.5 * np.log(2.0), 0.5 * np.log(2.0), 3.0, 5.0],
        ]
    ).reshape(-1, 7)
    want = np.exp(np.minimum(E, 4.0))
    got = fastexp.capped_exp(E.copy(), 4.0, fma=fma)
    assert np.max(np.abs(got - want) / np.spacing(want)) <= 1.0
    edge = fastexp.capped_exp(np.array([-708.5, -1e4, -np.inf, np.nan, np.inf]), 1.0, fma=fma)
    assert np.array_equal(edge[:3], np.zeros(3)) and np.isnan(edge[3])
    assert abs(edge[4] - np.exp(1.0)) <= np.spacing(np.exp(1.0))  # +inf is capped


def test_capped_exp_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="C-contiguous"):
        fastexp.capped_exp(np.zeros((4, 4))[:, ::2], 0.0)
    with pytest.raises(ValueError, match="above"):
        fastexp.capped_exp(np.zeros(3), 701.0)


def test_rbf_cross_matrices_use_numpy_above_the_cap(problem):
    X, _, Z, p = problem
    big = p._replace(log_variance=705.0)  # a scale beyond capped_exp's range: NumPy's exp
    K = kern.K("rbf", big, Z, X)
    Xs, Zs = X / p.lengthscale, Z / p.lengthscale
    U = np.sum(Zs * Zs, 1)[:, None] + np.sum(Xs * Xs, 1)[None, :] - 2 * Zs @ Xs.T
    np.testing.assert_allclose(np.log(K), 705.0 - 0.5 * np.maximum(U, 0), rtol=1e-13)
    np.testing.assert_allclose(kern.K("rbf", p, Z, X), np.exp(np.log(p.variance) - 0.5 * np.maximum(U, 0)), rtol=1e-12)

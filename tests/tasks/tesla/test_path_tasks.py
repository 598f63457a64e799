"""pgmflow.tasks.tesla.path_tasks: warm-started lambda1 paths, per-node model selection, the held-out split."""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest

from pgmflow.tasks.tesla import data as D
from pgmflow.tasks.tesla import evaluate as E
from pgmflow.tasks.tesla import path_tasks as P
from pgmflow.tasks.tesla import solver as S
from pgmflow.tasks.tesla import synthetic

TOL = 1e-9
LAM1 = np.array([0.02, 0.2, 0.05, 0.1])  # deliberately not sorted


@functools.cache
def _series():
    net = synthetic.time_varying_ising(6, p=5, T=8, samples_per_time=40, rewire_every=4, ramp=2, field=0.1)
    return D.from_array(net.X)


@pytest.fixture(scope="module")
def series():
    return _series()


def _loglik_rows(X, tix, node, theta):
    """log sigmoid(2 y m) per row, from the formula."""
    Z = X.astype(float)
    y = Z[:, node].copy()
    Z[:, node] = 1.0
    m = np.einsum("np,np->n", Z, theta[tix])
    return -np.logaddexp(0.0, -2.0 * y * m)


# --- fit_node -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("q,lam2", [(1, 0.05), (2, 0.2), (1, 0.0)])
def test_warm_path_equals_cold_solves(series, q, lam2):
    des = S.tesla_design(series.X, series.tix, series.T)
    node = 1
    fit = P.fit_node(des, node, LAM1, lam2, q=q, tol=TOL)
    assert fit.thetas.shape == (LAM1.size, series.T, series.p)
    assert np.array_equal(fit.lam1, LAM1) and fit.lam2 == lam2 and fit.node == node
    assert fit.converged.all() and np.all(fit.n_iter > 0) and not fit.isolated
    for k, l1 in enumerate(LAM1):
        cold = S.solve_path(des, node, float(l1), lam2, q, tol=TOL)
        np.testing.assert_allclose(fit.thetas[k], cold.theta, rtol=0, atol=1e-5)
    # sparser at larger lambda1 (the grid is not monotone in storage order)
    nnz = [(np.delete(fit.thetas[k], node, axis=1) != 0).sum() for k in range(LAM1.size)]
    order = np.argsort(LAM1)
    assert nnz[order[0]] > nnz[order[-1]]


def test_warm_start_chain_is_largest_lambda1_first(series, monkeypatch):
    """Each solve starts from the previous (larger lambda1) solution; the first one from zero."""
    des = S.tesla_design(series.X, series.tix, series.T)
    calls = []
    real = S.solve_path

    def spy(design, node, lam1, lam2=0.0, q=1, theta0=None, **kw):
        calls.append((lam1, None if theta0 is None else np.array(theta0)))
        return real(design, node, lam1, lam2, q, theta0=theta0, **kw)

    monkeypatch.setattr(S, "solve_path", spy)
    fit = P.fit_node(des, 0, LAM1, 0.05)
    assert [c[0] for c in calls] == sorted(LAM1.tolist(), reverse=True)
    assert calls[0][1] is None
    by_lam = {float(l): fit.thetas[k] for k, l in enumerate(LAM1)}
    for (prev, _), (_, theta0) in itertools.pairwise(calls):
        assert np.array_equal(theta0, by_lam[prev])


def test_fit_node_statistics(series):
    rng = np.random.default_rng(0)
    train = rng.random(series.N) < 0.75
    des = S.keller_design(series.X, series.tix, series.T, 1.2, train=train)
    node = 3
    fit = P.fit_node(des, node, LAM1, method="keller", bandwidth=1.2, train=train, tol=TOL)
    assert fit.method == "keller" and fit.bandwidth == 1.2 and fit.lam2 == 0.0
    assert fit.n_train == int(train.sum())
    for k in range(LAM1.size):
        ll = _loglik_rows(series.X, series.tix, node, fit.thetas[k])
        assert fit.loglik[k] == pytest.approx(ll[train].sum(), rel=1e-12)
        assert fit.heldout_loglik[k] == pytest.approx(ll[~train].sum(), rel=1e-12)
        assert fit.df[k] == E.path_df(fit.thetas[k], node)
    assert fit.df.dtype == np.int64 and fit.n_iter.dtype == np.int64 and fit.converged.dtype == bool
    # more lambda1, worse training fit
    order = np.argsort(LAM1)
    assert np.all(np.diff(fit.loglik[order]) < 0)
    # without held-out rows there is no held-out log-likelihood
    full = P.fit_node(S.keller_design(series.X, series.tix, series.T, 1.2), node, LAM1, method="keller")
    assert np.all(np.isnan(full.heldout_loglik)) and full.n_train == series.N


def test_fit_node_is_bit_reproducible(series):
    des = S.tesla_design(series.X, series.tix, series.T)
    a = P.fit_node(des, 2, LAM1, 0.1, q=1)
    b = P.fit_node(des, 2, LAM1, 0.1, q=1)
    for name in P.NodeFit._fields:
        if name == "seconds":
            continue
        va, vb = getattr(a, name), getattr(b, name)
        if isinstance(va, np.ndarray):
            assert va.dtype == vb.dtype and va.tobytes() == vb.tobytes(), name
        else:
            assert va == vb, name


def test_fit_node_validation(series):
    des = S.tesla_design(series.X, series.tix, series.T)
    with pytest.raises(ValueError):
        P.fit_node(des, 0, [0.1, -0.1], 0.1)
    with pytest.raises(ValueError):
        P.fit_node(des, 0, [0.1], -0.1)
    with pytest.raises(ValueError):
        P.fit_node(des, 0, [0.1], 0.1, q=3)
    with pytest.raises(ValueError):
        P.fit_node(des, series.p, [0.1], 0.1)
    with pytest.raises(ValueError, match="theta0"):
        S.solve_path(des, 0, 0.1, 0.1, theta0=np.zeros((series.p, series.T)))


def test_isolated_node(series):
    des = S.tesla_design(series.X, series.tix, series.T)
    fits = [P.fit_node(des, 4, LAM1, l2, isolated=True) for l2 in (0.01, 0.1)]
    for f in fits:
        assert f.isolated and np.all(f.thetas == 0.0) and np.all(f.n_iter == 0)
    for crit in P.CRITERIA:
        c = P.select_node(fits, crit, refit_designs=[des, des])
        assert c.isolated and c.node == 4 and c.n_iter == 0 and c.all_converged
        assert c.theta.shape == (series.T, series.p) and np.all(c.theta == 0.0)
        assert c.scores.shape == (2, LAM1.size) and np.all(np.isnan(c.scores))


# --- select_node ----------------------------------------------------------------------------------------


def _hand_fit(loglik, df, n_train, lam2, thetas=None, heldout=None, n_iter=None, converged=None):
    n1 = len(loglik)
    T, p = 3, 4
    if thetas is None:
        thetas = np.arange(n1 * T * p, dtype=float).reshape(n1, T, p) + 100 * lam2
    return P.NodeFit(
        1,
        "tesla",
        np.array([0.3, 0.2, 0.1]),
        lam2,
        0.0,
        thetas,
        np.asarray(loglik, float),
        np.full(n1, np.nan) if heldout is None else np.asarray(heldout, float),
        np.asarray(df, np.int64),
        np.full(n1, 10, np.int64) if n_iter is None else np.asarray(n_iter),
        np.ones(n1, bool) if converged is None else np.asarray(converged, bool),
        False,
        n_train,
        0.0,
        np.zeros(n1, np.int64),
    )


def test_select_bic_argmin_on_a_2x3_grid():
    n = 100
    fits = [
        _hand_fit([-60.0, -50.0, -45.0], [2, 4, 9], n, 0.01),
        _hand_fit([-58.0, -47.0, -44.0], [2, 3, 9], n, 0.1, n_iter=[1, 2, 3], converged=[True, False, True]),
    ]
    ln = np.log(n)
    expect = np.array([[120 + 2 * ln, 100 + 4 * ln, 90 + 9 * ln], [116 + 2 * ln, 94 + 3 * ln, 88 + 9 * ln]])
    c = P.select_node(fits, "bic")
    np.testing.assert_allclose(c.scores, expect, rtol=1e-14)
    assert (c.i_lam2, c.i_lam1) == (1, 1) == np.unravel_index(np.argmin(expect), expect.shape)
    assert c.lam1 == 0.2 and c.lam2 == 0.1 and c.criterion == "bic" and not c.isolated
    assert np.array_equal(c.theta, fits[1].thetas[1]) and c.theta is not fits[1].thetas[1]
    c.theta[:] = -1  # the choice owns its theta
    assert fits[1].thetas[1, 0, 0] != -1
    assert c.n_iter == 30 + 6 and not c.all_converged


def test_select_bic_ties_keep_the_first_grid_point():
    n = 50
    # every score equal -> (0, 0)
    fits = [_hand_fit([-10.0] * 3, [1] * 3, n, 0.01), _hand_fit([-10.0] * 3, [1] * 3, n, 0.1)]
    c = P.select_node(fits, "bic")
    assert (c.i_lam2, c.i_lam1) == (0, 0)
    # a tie between (0, 2) and (1, 0): the first in (lambda2, lambda1) order wins
    fits = [_hand_fit([-10.0, -10.0, -8.0], [3, 3, 1], n, 0.01), _hand_fit([-8.0, -10.0, -10.0], [1, 3, 3], n, 0.1)]
    assert fits[0].df[2] == fits[1].df[0]
    c = P.select_node(fits, "bic")
    assert (c.i_lam2, c.i_lam1) == (0, 2)
    assert np.array_equal(c.theta, fits[0].thetas[2])


def test_select_bic_from_real_fits(series):
    des = S.tesla_design(series.X, series.tix, series.T)
    node = 0
    fits = [P.fit_node(des, node, LAM1[:3], l2, tol=TOL) for l2 in (0.02, 0.2)]
    c = P.select_node(fits, "bic")
    scores = np.empty((2, 3))
    for a, f in enumerate(fits):
        for k in range(3):
            ll = _loglik_rows(series.X, series.tix, node, f.thetas[k]).sum()
            scores[a, k] = -2 * ll + np.log(series.N) * E.path_df(f.thetas[k], node)
    np.testing.assert_allclose(c.scores, scores, rtol=1e-10)
    assert (c.i_lam2, c.i_lam1) == np.unravel_index(np.argmin(scores), scores.shape)
    assert c.n_iter == sum(int(f.n_iter.sum()) for f in fits)


def test_select_heldout_refits_with_the_chosen_design(series):
    """KELLER at two bandwidths: the refit must use refit_designs[a] and the chosen lambda1."""
    train = ~P.heldout_rows(series.N, 3, 0.25)
    assert 0 < train.sum() < series.N
    node, hs = 2, (0.7, 2.5)
    fit_designs = [S.keller_design(series.X, series.tix, series.T, h, train=train) for h in hs]
    refit_designs = [S.keller_design(series.X, series.tix, series.T, h) for h in hs]
    fits = [
        P.fit_node(d, node, LAM1[:3], method="keller", bandwidth=h, train=train, tol=TOL)
        for d, h in zip(fit_designs, hs)
    ]
    for f in fits:
        assert np.all(np.isfinite(f.heldout_loglik))

    # natural choice: the largest held-out log-likelihood, recomputed here
    held = np.array(
        [[_loglik_rows(series.X, series.tix, node, f.thetas[k])[~train].sum() for k in range(3)] for f in fits]
    )
    c = P.select_node(fits, "heldout", refit_designs=refit_designs, tol=TOL)
    np.testing.assert_allclose(c.scores, -held, rtol=1e-10)
    a, k = np.unravel_index(np.argmax(held), held.shape)
    assert (c.i_lam2, c.i_lam1, c.bandwidth) == (a, k, hs[a]) and c.criterion == "heldout"
    ref = S.solve_path(refit_designs[a], node, float(LAM1[k]), 0.0, 1, tol=TOL).theta
    np.testing.assert_allclose(c.theta, ref, rtol=0, atol=1e-5)
    assert c.n_iter > sum(int(f.n_iter.sum()) for f in fits)  # the refit's iterations count too

    # forced choice of the second bandwidth and the last lambda1: the refit differs from one on design 0
    rigged = [
        fits[0]._replace(heldout_loglik=np.array([-50.0, -40.0, -30.0])),
        fits[1]._replace(heldout_loglik=np.array([-30.0, -25.0, -20.0])),
    ]
    c = P.select_node(rigged, "heldout", refit_designs=refit_designs, tol=TOL)
    assert (c.i_lam2, c.i_lam1) == (1, 2)
    ref1 = S.solve_path(refit_designs[1], node, float(LAM1[2]), 0.0, 1, tol=TOL).theta
    ref0 = S.solve_path(refit_designs[0], node, float(LAM1[2]), 0.0, 1, tol=TOL).theta
    np.testing.assert_allclose(c.theta, ref1, rtol=0, atol=1e-5)
    assert np.abs(ref1 - ref0).max() > 1e-2
    assert np.abs(c.theta - fits[1].thetas[2]).max() > 1e-3  # refitted, not the training solution


def test_select_heldout_refits_at_the_chosen_lambda2(series):
    train = ~P.heldout_rows(series.N, 11, 0.3)
    node, lam2s = 4, (0.01, 1.0)
    des_train = S.tesla_design(series.X, series.tix, series.T, train=train)
    full = S.tesla_design(series.X, series.tix, series.T)
    fits = [P.fit_node(des_train, node, LAM1[:3], l2, train=train, tol=TOL) for l2 in lam2s]
    rigged = [
        fits[0]._replace(heldout_loglik=np.array([-9.0, -9.0, -9.0])),
        fits[1]._replace(heldout_loglik=np.array([-9.0, -1.0, -1.0])),
    ]  # tie at (1, 1) and (1, 2)
    c = P.select_node(rigged, "heldout", refit_designs=[full, full], tol=TOL)
    assert (c.i_lam2, c.i_lam1, c.lam2, c.lam1) == (1, 1, 1.0, float(LAM1[1]))
    ref = S.solve_path(full, node, float(LAM1[1]), 1.0, 1, tol=TOL).theta
    wrong = S.solve_path(full, node, float(LAM1[1]), 0.01, 1, tol=TOL).theta
    np.testing.assert_allclose(c.theta, ref, rtol=0, atol=1e-5)
    assert np.abs(ref - wrong).max() > 1e-2
    # q=2 is passed to the refit
    c2 = P.select_node(rigged, "heldout", refit_designs=[full, full], q=2, tol=TOL)
    ref2 = S.solve_path(full, node, float(LAM1[1]), 1.0, 2, theta0=fits[1].thetas[1], tol=TOL).theta
    np.testing.assert_allclose(c2.theta, ref2, rtol=0, atol=1e-5)


def test_select_node_errors():
    fits = [_hand_fit([-1.0] * 3, [1] * 3, 10, 0.1)]
    with pytest.raises(ValueError, match="criterion"):
        P.select_node(fits, "aic")
    with pytest.raises(ValueError, match="refit_designs"):
        P.select_node(fits, "heldout")
    with pytest.raises(ValueError, match="refit_designs"):
        P.select_node(fits, "heldout", refit_designs=[])


# --- heldout_rows -----------------------------------------------------------------------------------------------


def test_heldout_rows():
    n = 20000
    a = P.heldout_rows(n, 7, 0.2)
    assert a.dtype == bool and a.shape == (n,)
    assert np.array_equal(a, P.heldout_rows(n, 7, 0.2))  # a function of the seed alone
    assert not np.array_equal(a, P.heldout_rows(n, 8, 0.2))
    sd = np.sqrt(0.2 * 0.8 / n)
    assert abs(a.mean() - 0.2) < 5 * sd
    b = P.heldout_rows(n, 7, 0.5)
    assert abs(b.mean() - 0.5) < 5 * np.sqrt(0.25 / n)
    assert np.all(b[a])  # same uniforms: a larger fraction holds out a superset
    assert np.array_equal(P.heldout_rows(100, 7, 0.2), a[:100])  # a prefix does not depend on n
    assert not P.heldout_rows(n, 7, 0.0).any()
    assert P.heldout_rows(0, 7, 0.3).shape == (0,)


def test_ebic_adds_the_candidate_charge_and_picks_sparser_points():
    assert E.ebic(-10.0, 3, 100, 19, 0.0) == E.bic(-10.0, 3, 100)
    assert E.ebic(-10.0, 3, 100, 19, 0.5) == pytest.approx(20.0 + 3 * (np.log(100) + np.log(19)))
    # a grid where BIC prefers the denser point and EBIC's extra charge flips the choice
    T, p = 2, 20
    thetas = np.zeros((2, T, p))
    fit = P.NodeFit(
        0,
        "tesla",
        np.array([0.2, 0.1]),
        0.5,
        0.0,
        thetas,
        np.array([-60.0, -50.0]),
        np.full(2, np.nan),
        np.array([2, 4], np.int64),
        np.zeros(2, np.int64),
        np.ones(2, bool),
        False,
        100,
        0.0,
        np.zeros(2, np.int64),
    )
    assert P.select_node([fit], "bic").i_lam1 == 1  # BIC 129.2 vs 118.4
    assert P.select_node([fit], "ebic", gamma=1.0).i_lam1 == 0  # EBIC 141.0 vs 142.0

"""pgmflow.tasks.tesla.solver against the optimality conditions of the path problem, computed here in plain NumPy.

Notation (the module docstring of solver.py): for node i, ``z_d`` is ``x_d`` with entry i replaced
by 1, ``y_d = x_{d,i}``, the loss of a row is ``l(y_d theta^t . z_d)`` with ``l(m) = log(1 + exp(-2 m))``
and

    F(Theta) = sum_t sum_d W[t, d] l(...) + lambda1 sum_t sum_{j != i} |theta^t_j|
               + lambda2 sum_{t>=2} ||theta^t - theta^{t-1}||_q^q.

Every reference quantity below (the weights W [T, N], the loss, its gradient, F, the Lipschitz bound)
is built here from that formula, never from the module's kernels. Only the exact fused-lasso prox
(``prox.prox_fused_lasso``, tested on its own in test_prox.py) is shared.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from pgmflow.tasks.tesla import data as D
from pgmflow.tasks.tesla import prox, synthetic
from pgmflow.tasks.tesla import solver as S

TOL = 1e-10  # solver tolerance on the gradient mapping for the optimality tests
MAXIT = 200_000

# --- independent reference implementation ------------------------------------------------------------


def weights_tesla(tix, T, train=None):
    """W [T, N]: 1/N_train^t on the training rows of time t."""
    keep = np.ones(tix.size, bool) if train is None else np.asarray(train, bool)
    W = np.zeros((T, tix.size))
    for t in range(T):
        m = (tix == t) & keep
        if m.any():
            W[t, m] = 1.0 / m.sum()
    return W


def weights_keller(tix, T, h, truncate=3.0, train=None):
    """W [T, N]: Gaussian kernel in time, cut at truncate * h, normalised per time point."""
    keep = np.ones(tix.size, bool) if train is None else np.asarray(train, bool)
    W = np.zeros((T, tix.size))
    for t in range(T):
        dt = (tix - t).astype(float)
        k = np.where((np.abs(dt) <= truncate * h) & keep, np.exp(-(dt**2) / (2.0 * h * h)), 0.0)
        if k.sum() > 0:
            W[t] = k / k.sum()
    return W


def dense_weights(design):
    """The design's weights expanded to W [T, N] (rows outside a window get 0)."""
    W = np.zeros((design.T, design.X.shape[0]))
    for t in range(design.T):
        lo, hi, off = int(design.lo[t]), int(design.hi[t]), int(design.woff[t])
        W[t, lo:hi] = design.w[off : off + hi - lo]
    return W


def zy(X, i):
    Z = X.astype(np.float64)
    y = Z[:, i].copy()
    Z[:, i] = 1.0
    return Z, y


def loss_grad(W, X, i, theta):
    """(sum_t sum_d W l, d/dTheta) from the formula."""
    Z, y = zy(X, i)
    U = 2.0 * y[None, :] * (theta @ Z.T)  # [T, N]
    loss = float((W * np.logaddexp(0.0, -U)).sum())
    C = W * (-2.0 * y[None, :]) / (1.0 + np.exp(U))  # dl/dm for every (t, d)
    return loss, C @ Z


def penalty(theta, i, l1, l2, q):
    mask = np.arange(theta.shape[1]) != i
    d = np.diff(theta, axis=0)
    return l1 * np.abs(theta[:, mask]).sum() + l2 * (np.abs(d).sum() if q == 1 else (d * d).sum())


def objective(W, X, i, theta, l1, l2, q):
    return loss_grad(W, X, i, theta)[0] + penalty(theta, i, l1, l2, q)


def lipschitz(W, X, l2=0.0, q=1):
    """max_t lambda_max(sum_d W[t, d] a_d a_d^T), a_d = [1, x_d]; + 8 lambda2 for q = 2."""
    A = np.hstack([np.ones((X.shape[0], 1)), X.astype(np.float64)])
    L = max(np.linalg.eigvalsh((A * w[:, None]).T @ A)[-1] for w in W)
    return L + (8.0 * l2 if q == 2 else 0.0)


def smooth_grad(W, X, i, theta, l2, q):
    g = loss_grad(W, X, i, theta)[1]
    if q == 2 and l2 > 0:
        d = np.diff(theta, axis=0)
        g[1:] += 2.0 * l2 * d
        g[:-1] -= 2.0 * l2 * d
    return g


def pg_map(W, X, i, theta, l1, l2, q, L):
    """The proximal-gradient map with step 1/L."""
    pen = np.arange(theta.shape[1]) != i
    z = theta - smooth_grad(W, X, i, theta, l2, q) / L
    return prox.prox_fused_lasso(z, l1 / L, l2 / L if q == 1 else 0.0, pen)


def ista(W, X, i, theta0, l1, l2, q, max_iter=300_000, tol=1e-13):
    """Plain (non-accelerated) proximal gradient with the fixed step 1/L."""
    L = lipschitz(W, X, l2, q)
    th = np.array(theta0, dtype=np.float64)
    for _ in range(max_iter):
        new = pg_map(W, X, i, th, l1, l2, q, L)
        if np.abs(new - th).max() * L < tol:
            return new
        th = new
    raise AssertionError("reference ISTA did not converge")


# --- data ----------------------------------------------------------------------------------------------


@functools.cache
def _series():
    net = synthetic.time_varying_ising(4, p=6, T=10, samples_per_time=40, rewire_every=5, ramp=2, field=0.2)
    s = D.from_array(net.X)
    # every node's design Z_t has full column rank at every time point: the static problem is strictly
    # convex, so its solution (and the comparison with ISTA) is unique
    for i in range(s.p):
        for t in range(s.T):
            assert np.linalg.matrix_rank(zy(s.X[s.tix == t], i)[0]) == s.p
    return s


@pytest.fixture(scope="module")
def series():
    return _series()


H = 1.5  # KELLER bandwidth of the optimality tests

# (design kind, q, lambda1, lambda2)
CASES = [
    ("tesla", 1, 0.05, 0.1),
    ("tesla", 1, 0.02, 0.02),
    ("tesla", 2, 0.05, 0.3),
    ("static", 1, 0.05, 0.0),
    ("keller", 1, 0.05, 0.0),
    ("keller", 2, 0.03, 0.2),
]


def _design_and_weights(series, kind, train=None):
    if kind == "keller":
        return (
            S.keller_design(series.X, series.tix, series.T, H, train=train),
            weights_keller(series.tix, series.T, H, train=train),
        )
    return S.tesla_design(series.X, series.tix, series.T, train=train), weights_tesla(series.tix, series.T, train)


# --- designs --------------------------------------------------------------------------------------------


def test_tesla_design_weights_and_lipschitz(series):
    des = S.tesla_design(series.X, series.tix, series.T)
    assert des.kind == "tesla" and des.T == series.T and des.p == series.p
    W = weights_tesla(series.tix, series.T)
    np.testing.assert_allclose(dense_weights(des), W, rtol=1e-15, atol=0)
    np.testing.assert_allclose(des.L.max(), lipschitz(W, series.X), rtol=1e-12)
    rng = np.random.default_rng(1)
    train = rng.random(series.N) < 0.7
    des = S.tesla_design(series.X, series.tix, series.T, train=train)
    W = weights_tesla(series.tix, series.T, train)
    np.testing.assert_allclose(dense_weights(des), W, rtol=1e-15, atol=0)
    assert np.all(des.w[~train] == 0.0)
    np.testing.assert_allclose(des.L.max(), lipschitz(W, series.X), rtol=1e-12)


@pytest.mark.parametrize("h,truncate", [(1.5, 3.0), (1.3, 2.0), (0.4, 3.0), (4.0, 3.0)])
def test_keller_design_weights(series, h, truncate):
    T, tix = series.T, series.tix
    rng = np.random.default_rng(2)
    train = rng.random(series.N) < 0.75
    for tr in (None, train):
        des = S.keller_design(series.X, tix, T, h, truncate=truncate, train=tr)
        assert des.kind == "keller"
        W = dense_weights(des)
        # each time point's weights sum to one over its window
        np.testing.assert_allclose(W.sum(axis=1), 1.0, rtol=1e-13)
        for t in range(T):
            far = np.abs(tix - t) > truncate * h
            assert np.all(W[t, far] == 0.0)
            # the window holds exactly the rows within floor(truncate * h) time points
            inside = np.flatnonzero(~far)
            assert des.lo[t] == inside[0] and des.hi[t] == inside[-1] + 1
            if tr is not None:
                assert np.all(W[t, ~tr] == 0.0)
                assert np.all(W[t, tr & ~far] > 0.0)
        np.testing.assert_allclose(W, weights_keller(tix, T, h, truncate, tr), rtol=1e-13, atol=0)
        np.testing.assert_allclose(des.L.max(), lipschitz(W, series.X), rtol=1e-12)


def test_design_validation(series):
    with pytest.raises(ValueError):
        S.keller_design(series.X, series.tix, series.T, 0.0)
    with pytest.raises(ValueError):
        S.tesla_design(series.X, series.tix[::-1], series.T)  # not sorted
    with pytest.raises(ValueError):
        S.tesla_design(series.X, series.tix, series.T - 1)  # tix out of range
    with pytest.raises(ValueError):
        S.tesla_design(series.X, series.tix[:-1], series.T)  # length mismatch


# --- optimality ------------------------------------------------------------------------------------------


@functools.cache
def _solved(kind, q, l1, l2, node):
    s = _series()
    des, W = _design_and_weights(s, kind)
    res = S.solve_path(des, node, l1, l2, q, tol=TOL, max_iter=MAXIT)
    assert res.converged
    return res, W


@pytest.mark.parametrize("node", [0, 3])
@pytest.mark.parametrize("kind,q,l1,l2", CASES)
def test_fixed_point_of_prox_gradient_map(series, kind, q, l1, l2, node):
    res, W = _solved(kind, q, l1, l2, node)
    L = lipschitz(W, series.X, l2, q)
    th = res.theta
    assert np.all(np.isfinite(th))
    resid = L * np.abs(pg_map(W, series.X, node, th, l1, l2, q, L) - th).max()
    assert resid < 1e-8, resid
    # the reported loss and objective are the data term and F at theta
    loss = loss_grad(W, series.X, node, th)[0]
    F = objective(W, series.X, node, th, l1, l2, q)
    assert res.loss == pytest.approx(loss, rel=1e-12)
    assert res.objective == pytest.approx(F, rel=1e-12)
    # not a trivial solution: some edges are used
    mask = np.arange(series.p) != node
    assert np.any(th[:, mask] != 0.0)


@pytest.mark.parametrize("node", [0, 3])
@pytest.mark.parametrize("kind,q,l1,l2", CASES)
def test_objective_is_locally_minimal(series, kind, q, l1, l2, node):
    res, W = _solved(kind, q, l1, l2, node)
    th = res.theta
    F0 = objective(W, series.X, node, th, l1, l2, q)
    rng = np.random.default_rng(100 + node)
    slack = 1e-11 * (1.0 + abs(F0))
    for eps in (1e-3, 1e-2, 1e-1):
        for k in range(60):
            d = rng.standard_normal(th.shape)
            if k % 2:  # stay on the non-zero coefficients: tests the smooth part of the conditions
                d *= th != 0.0
            d /= np.linalg.norm(d)
            F1 = objective(W, series.X, node, th + eps * d, l1, l2, q)
            assert F1 >= F0 - slack, (eps, k, F0 - F1)


@pytest.mark.parametrize("node", [0, 3])
@pytest.mark.parametrize("kind,q,l1,l2", CASES)
def test_matches_plain_ista(series, kind, q, l1, l2, node):
    res, W = _solved(kind, q, l1, l2, node)
    start = np.random.default_rng(7).normal(scale=0.5, size=res.theta.shape)
    ref = ista(W, series.X, node, start, l1, l2, q)
    np.testing.assert_allclose(res.theta, ref, rtol=0, atol=1e-6)
    # different starting points of the module's solver agree too
    des = _design_and_weights(series, kind)[0]
    warm = S.solve_path(des, node, l1, l2, q, theta0=start, tol=TOL, max_iter=MAXIT)
    np.testing.assert_allclose(warm.theta, res.theta, rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind,q,l1,l2", CASES)
def test_zeros_are_exact(series, kind, q, l1, l2):
    res, _ = _solved(kind, q, l1, l2, 0)
    th = res.theta
    assert np.any(th == 0.0)
    small = np.abs(th) < 1e-9
    assert np.all(th[small] == 0.0), th[small & (th != 0.0)]


# --- limits -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind,q,l2", [("tesla", 1, 0.0), ("tesla", 1, 0.2), ("tesla", 2, 0.2), ("keller", 1, 0.0)])
def test_huge_lambda1_zeroes_every_edge_but_not_the_field(series, kind, q, l2):
    des, W = _design_and_weights(series, kind)
    node = 2
    res = S.solve_path(des, node, 50.0, l2, q, tol=TOL, max_iter=MAXIT)
    mask = np.arange(series.p) != node
    assert np.all(res.theta[:, mask] == 0.0)
    ybar = W @ series.X[:, node].astype(float)  # [T] the node's weighted mean per window
    if l2 == 0.0:  # the field is never thresholded: non-zero wherever the node is not balanced (t = 3 is)
        assert np.all((res.theta[:, node] != 0.0) == (np.abs(ybar) > 1e-12))
    else:
        assert np.all(res.theta[:, node] != 0.0)
    L = lipschitz(W, series.X, l2, q)
    assert L * np.abs(pg_map(W, series.X, node, res.theta, 50.0, l2, q, L) - res.theta).max() < 1e-8
    if l2 == 0.0:  # each field is the per-window logistic intercept: sum_d W y_d tanh... = 0 -> atanh of the mean
        y = series.X[:, node].astype(float)
        for t in range(series.T):
            # sum_d W[t, d] (y_d - tanh(f)) = 0  <=>  f = atanh(weighted mean of y)
            assert res.theta[t, node] == pytest.approx(np.arctanh(W[t] @ y), abs=1e-9)


def test_node_field_is_never_thresholded():
    """Node 1 is +1 in 17 of 20 samples at every time point: its field is atanh(0.7) > 0 whatever lambda1."""
    rng = np.random.default_rng(11)
    T, n, p, node = 6, 20, 5, 1
    X = rng.choice(np.array([-1, 1], np.int8), size=(T, n, p))
    for t in range(T):
        col = np.ones(n, np.int8)
        col[rng.choice(n, 3, replace=False)] = -1
        X[t, :, node] = col
    s = D.from_array(X)
    des = S.tesla_design(s.X, s.tix, s.T)
    for lam1, lam2, q in [(10.0, 0.0, 1), (10.0, 0.5, 1), (1e3, 1.0, 2), (0.05, 0.0, 1)]:
        res = S.solve_path(des, node, lam1, lam2, q, tol=TOL, max_iter=MAXIT)
        assert res.converged
        assert np.all(res.theta[:, node] > 0.3)
        if lam1 >= 10.0:  # every edge removed: the field alone fits the 70 % mean
            assert np.all(np.delete(res.theta, node, axis=1) == 0.0)
            np.testing.assert_allclose(res.theta[:, node], np.arctanh(0.7), rtol=0, atol=1e-9)


def test_huge_lambda2_gives_constant_paths_equal_to_the_pooled_fit(series):
    node, lam1 = 1, 0.03
    des = S.tesla_design(series.X, series.tix, series.T)
    res = S.solve_path(des, node, lam1, 1e3, 1, tol=TOL, max_iter=MAXIT)
    th = res.theta
    assert np.all(np.ptp(th, axis=0) <= 1e-8), np.ptp(th, axis=0)
    # equal N^t: tying every theta^t makes F = T * (pooled average loss + lambda1 |theta_-i|)
    pooled = S.tesla_design(series.X, np.zeros(series.N, np.int64), 1)
    one = S.solve_path(pooled, node, lam1, 0.0, 1, tol=TOL, max_iter=MAXIT)
    np.testing.assert_allclose(th, np.repeat(one.theta, series.T, axis=0), rtol=0, atol=1e-6)
    assert np.any(one.theta != 0.0)


@pytest.mark.parametrize("kind,q,l2", [("tesla", 1, 0.0), ("tesla", 2, 0.0), ("keller", 1, 0.0)])
def test_static_equals_separate_time_points(series, kind, q, l2):
    """With lambda2 = 0 the path problem separates: theta^t is the fit on time t's window alone."""
    node, lam1 = 4, 0.04
    des, _ = _design_and_weights(series, kind)
    full = S.solve_path(des, node, lam1, l2, q, tol=TOL, max_iter=MAXIT)
    for t in range(series.T):
        if kind == "tesla":
            rows = series.tix == t
            one = S.tesla_design(series.X[rows], np.zeros(int(rows.sum()), np.int64), 1)
        else:  # KELLER: the window's rows with their kernel weights, as one time point
            lo, hi, off = int(des.lo[t]), int(des.hi[t]), int(des.woff[t])
            w = des.w[off : off + hi - lo].copy()
            one = S.Design(
                series.X[lo:hi],
                np.zeros(hi - lo, np.int64),
                np.array([0]),
                np.array([hi - lo]),
                np.array([0]),
                w,
                des.L[t : t + 1].copy(),
                "keller",
            )
        sep = S.solve_path(one, node, lam1, 0.0, q, tol=TOL, max_iter=MAXIT)
        np.testing.assert_allclose(full.theta[t], sep.theta[0], rtol=0, atol=1e-7)


# --- held-out rows and empty time points --------------------------------------------------------------------


@pytest.mark.parametrize("where", ["interior", "last"])  # "last": lo[T-1] == N in the dropped-rows design
def test_train_mask_equals_dropping_the_rows(series, where):
    """A design with train= is the design built from the training rows alone (weights 1/N_train^t)."""
    rng = np.random.default_rng(5)
    keep = rng.random(series.N) < 0.8
    keep[series.tix == (4 if where == "interior" else series.T - 1)] = False
    a = S.tesla_design(series.X, series.tix, series.T, train=keep)
    b = S.tesla_design(series.X[keep], series.tix[keep], series.T)
    for q, l2 in [(1, 0.1), (2, 0.2)]:
        ra = S.solve_path(a, 0, 0.03, l2, q, tol=TOL, max_iter=MAXIT)
        rb = S.solve_path(b, 0, 0.03, l2, q, tol=TOL, max_iter=MAXIT)
        np.testing.assert_allclose(ra.theta, rb.theta, rtol=0, atol=1e-7)
        assert ra.loss == pytest.approx(rb.loss, rel=1e-10)


def test_time_point_without_training_rows(series):
    node, lam1, lam2 = 0, 0.03, 0.2
    T = series.T
    keep = np.ones(series.N, bool)
    keep[series.tix == 4] = False
    keep[series.tix == T - 1] = False
    des = S.tesla_design(series.X, series.tix, T, train=keep)
    W = weights_tesla(series.tix, T, keep)
    assert np.all(des.w[~keep] == 0.0) and des.L[4] == 0.0 and des.L[T - 1] == 0.0
    # the data term ignores those time points entirely
    rng = np.random.default_rng(3)
    th = rng.standard_normal((T, series.p))
    th2 = th.copy()
    th2[4] += 5.0
    th2[T - 1] -= 3.0
    assert loss_grad(W, series.X, node, th)[0] == pytest.approx(loss_grad(W, series.X, node, th2)[0], rel=1e-14)

    # q = 2: an empty time point minimises lam1 |x| + lam2 ((x - a)^2 + (b - x)^2)
    # -> soft((a + b) / 2, lam1 / (4 lam2)); the last one lam1 |x| + lam2 (x - a)^2 -> soft(a, lam1 / (2 lam2));
    # the field is never thresholded
    res = S.solve_path(des, node, lam1, lam2, 2, tol=TOL, max_iter=MAXIT)
    th = res.theta
    assert res.converged and np.all(np.isfinite(th))
    L = lipschitz(W, series.X, lam2, 2)
    assert L * np.abs(pg_map(W, series.X, node, th, lam1, lam2, 2, L) - th).max() < 1e-8
    soft = lambda v, c: np.sign(v) * np.maximum(np.abs(v) - c, 0.0)
    pen = np.arange(series.p) != node
    mid = 0.5 * (th[3] + th[5])
    np.testing.assert_allclose(th[4, pen], soft(mid[pen], lam1 / (4 * lam2)), atol=1e-7)
    np.testing.assert_allclose(th[4, node], mid[node], atol=1e-7)
    np.testing.assert_allclose(th[T - 1, pen], soft(th[T - 2, pen], lam1 / (2 * lam2)), atol=1e-7)
    np.testing.assert_allclose(th[T - 1, node], th[T - 2, node], atol=1e-7)
    assert th[4, node] != 0.0

    # q = 1: the path is finite and interpolates (the empty time point lies between its neighbours)
    res = S.solve_path(des, node, lam1, lam2, 1, tol=TOL, max_iter=MAXIT)
    th = res.theta
    assert res.converged and np.all(np.isfinite(th))
    L = lipschitz(W, series.X)
    assert L * np.abs(pg_map(W, series.X, node, th, lam1, lam2, 1, L) - th).max() < 1e-8
    lo, hi = np.minimum(th[3], th[5]), np.maximum(th[3], th[5])
    assert np.all(th[4] >= lo - 1e-9) and np.all(th[4] <= hi + 1e-9)

    # lambda2 = 0: nothing ties the empty time point to the data; it stays finite (zero from a cold start)
    res = S.solve_path(des, node, lam1, 0.0, 1, tol=TOL, max_iter=MAXIT)
    assert res.converged and np.all(np.isfinite(res.theta))
    assert np.all(res.theta[4] == 0.0) and np.all(res.theta[T - 1] == 0.0)


def test_no_data_at_all_returns_zeros(series):
    des = S.tesla_design(series.X, series.tix, series.T, train=np.zeros(series.N, bool))
    res = S.solve_path(des, 0, 0.1, 0.0, 1)
    assert res.converged and res.n_iter == 0 and np.all(res.theta == 0.0)


# --- solve_path contract ---------------------------------------------------------------------------------------


def test_solve_path_is_deterministic_and_does_not_touch_theta0(series):
    des = S.keller_design(series.X, series.tix, series.T, 2.0)
    theta0 = np.random.default_rng(0).normal(size=(series.T, series.p))
    keep = theta0.copy()
    a = S.solve_path(des, 2, 0.04, 0.05, 1, theta0=theta0)
    b = S.solve_path(des, 2, 0.04, 0.05, 1, theta0=theta0)
    assert np.array_equal(theta0, keep)
    assert a.theta.tobytes() == b.theta.tobytes()
    assert (a.n_iter, a.converged, a.loss, a.objective) == (b.n_iter, b.converged, b.loss, b.objective)


def test_max_iter_reports_not_converged(series):
    des = S.tesla_design(series.X, series.tix, series.T)
    res = S.solve_path(des, 0, 0.01, 0.01, 1, max_iter=3)
    assert res.n_iter == 3 and not res.converged
    res = S.solve_path(des, 0, 0.01, 0.01, 1)
    assert res.converged and res.n_iter < 5000


def test_solve_path_validation(series):
    des = S.tesla_design(series.X, series.tix, series.T)
    with pytest.raises(ValueError, match="q"):
        S.solve_path(des, 0, 0.1, 0.1, q=3)
    with pytest.raises(ValueError):
        S.solve_path(des, 0, -0.1, 0.1)
    with pytest.raises(ValueError):
        S.solve_path(des, 0, 0.1, -1e-3)
    with pytest.raises(ValueError, match="theta0"):
        S.solve_path(des, 0, 0.1, 0.1, theta0=np.zeros((series.T, series.p + 1)))
    with pytest.raises(ValueError, match="theta0"):
        S.solve_path(des, 0, 0.1, 0.1, theta0=np.zeros((series.T - 1, series.p)))
    with pytest.raises(ValueError):
        S.solve_path(des, series.p, 0.1, 0.1)
    with pytest.raises(ValueError):
        S.solve_path(des, -1, 0.1, 0.1)


# --- row_loglik and path_gradient -------------------------------------------------------------------------------


def test_row_loglik_matches_formula(series):
    rng = np.random.default_rng(9)
    theta = rng.normal(scale=1.5, size=(series.T, series.p))
    theta[0, 0] = 40.0  # large margins: stable in both tails
    theta[1, 0] = -40.0
    for node in (0, 5):
        Z, y = zy(series.X, node)
        m = np.einsum("np,np->n", Z, theta[series.tix])
        ref = -np.logaddexp(0.0, -2.0 * y * m)
        out = S.row_loglik(series.X, series.tix, node, theta)
        assert out.shape == (series.N,) and out.dtype == np.float64
        np.testing.assert_allclose(out, ref, rtol=1e-13, atol=1e-300)
        assert np.all(out <= 0.0)
    # theta^t belongs to time t only
    th2 = theta.copy()
    th2[3] += np.array([0.3, 0.7, 1.1, 1.9, 3.1, 6.1])  # no signed sum of these is 0: every row of t=3 moves
    diff = S.row_loglik(series.X, series.tix, 0, th2) != S.row_loglik(series.X, series.tix, 0, theta)
    assert np.array_equal(diff, series.tix == 3)


@pytest.mark.parametrize("held_out", [False, True])
def test_path_gradient_numpy(series, held_out):
    T = series.T
    train = np.random.default_rng(4).random(series.N) < 0.7 if held_out else None
    des = S.tesla_design(series.X, series.tix, T, train=train)
    W = weights_tesla(series.tix, T, train)
    nodes = np.array([0, 3, 5, 3])
    rng = np.random.default_rng(8)
    Theta = rng.normal(scale=0.8, size=(nodes.size, T, series.p))
    grad, loss = S.path_gradient(Theta, series.X, series.tix, nodes, des.w, T)
    assert grad.shape == Theta.shape and loss.shape == (nodes.size,)
    S._kernels()
    for b, i in enumerate(nodes):
        ref_loss, ref_grad = loss_grad(W, series.X, int(i), Theta[b])
        np.testing.assert_allclose(grad[b], ref_grad, rtol=1e-12, atol=1e-14)
        assert loss[b] == pytest.approx(ref_loss, rel=1e-12)
        mod = S._loss_value(des.X, int(i), des.lo, des.hi, des.woff, des.w, np.ascontiguousarray(Theta[b]))
        assert loss[b] == pytest.approx(mod, rel=1e-12)
    # the same numbers with float samples and int32 node indices
    g2, l2 = S.path_gradient(Theta, series.X.astype(np.float64), series.tix, nodes.astype(np.int32), des.w, T)
    np.testing.assert_allclose(g2, grad, rtol=1e-14, atol=1e-16)
    np.testing.assert_allclose(l2, loss, rtol=1e-14)


@pytest.mark.gpu
def test_path_gradient_cupy_matches_numpy(series):
    cp = pytest.importorskip("cupy")
    T = series.T
    des = S.tesla_design(series.X, series.tix, T)
    nodes = np.array([1, 2, 4])
    Theta = np.random.default_rng(12).normal(size=(nodes.size, T, series.p))
    g, l = S.path_gradient(Theta, series.X, series.tix, nodes, des.w, T)
    gg, ll = S.path_gradient(
        cp.asarray(Theta), cp.asarray(series.X), cp.asarray(series.tix), cp.asarray(nodes), cp.asarray(des.w), T
    )
    np.testing.assert_allclose(cp.asnumpy(gg), g, rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(cp.asnumpy(ll), l, rtol=1e-12)


def test_static_with_one_value_per_time_point_caps_the_field_and_has_no_edges():
    """One sample per time point: the field alone drives the loss to zero, so the infimum has no
    edges and an infinite field; the solver reports the field at +-FIELD_CAP, converged, at once."""
    rng = np.random.default_rng(4)
    X = np.where(rng.random((12, 5)) < 0.5, -1, 1).astype(np.int8)
    d = S.tesla_design(X, np.arange(12), 12)
    for node in range(5):
        r = S.solve_path(d, node, 0.01, 0.0)
        assert r.converged and r.n_iter == 0
        mask = np.arange(5) != node
        assert np.all(r.theta[:, mask] == 0.0)
        np.testing.assert_array_equal(r.theta[:, node], S.FIELD_CAP * X[:, node])
    # with two samples that disagree the field is finite again and the solver iterates
    X2 = np.concatenate([X, -X])
    tix = np.concatenate([np.arange(12), np.arange(12)])
    order = np.argsort(tix, kind="stable")
    d2 = S.tesla_design(X2[order], tix[order], 12)
    r2 = S.solve_path(d2, 0, 0.01, 0.0)
    assert r2.converged and r2.n_iter > 0 and np.all(np.abs(r2.theta[:, 0]) < S.FIELD_CAP)


def _margins_sparse_reference(X, node, theta):
    """The margins as the sparse per-row sum did it (one row per time point): the non-zero entries of
    theta^t but the node's in column order, then the field."""
    u = np.empty(X.shape[0])
    for t in range(X.shape[0]):
        s = 0.0
        for j in range(X.shape[1]):
            if j != node and theta[t, j] != 0.0:
                s += theta[t, j] * float(X[t, j])
        u[t] = 2.0 * float(X[t, node]) * (s + theta[t, node])
    return u


@pytest.mark.parametrize("T", [1, 4, 7, 13])
def test_margins_of_one_row_time_points_have_the_sparse_sums_bits(T):
    """One sample per time point (the Senate's shape): the margins taken four time points at a time over
    every column equal, bit for bit, the sums over the non-zero entries (missing values, 0 in X, included)."""
    rng = np.random.default_rng(T)
    p, node = 9, 4
    X = rng.choice(np.array([-1, 0, 1], np.int8), size=(T, p), p=[0.45, 0.1, 0.45])
    X[:, node] = np.where(X[:, node] == 0, 1, X[:, node])
    design = S.tesla_design(X, np.arange(T), T)
    theta = rng.standard_normal((T, p)) * (rng.random((T, p)) < 0.6)
    theta[0, :] = -0.0  # signed zeros add nothing either
    S._kernels()
    u = np.empty(T)
    S._margins(design.X, node, design.lo, design.hi, design.woff, theta, np.empty(p, np.int64), u)
    ref = _margins_sparse_reference(design.X, node, theta)
    assert np.array_equal(u.view(np.int64), ref.view(np.int64))


@pytest.mark.parametrize("n", [1, 3, 8, 645 * 7 + 2])
def test_fista_reductions_match_numpy(n):
    """The step-search terms and the displacement (max, inner product) of the FISTA loop, taken in four
    interleaved partial sums, against NumPy's."""
    rng = np.random.default_rng(n)
    g, xn, y, x = (rng.standard_normal((n, 1)) for _ in range(4))
    S._kernels()
    gd, dd = S._step_terms(g, xn, y)
    np.testing.assert_allclose([gd, dd], [np.sum(g * (xn - y)), np.sum((xn - y) ** 2)], rtol=1e-12, atol=1e-12)
    gmax, ip = S._displacement(y, xn, x)
    assert gmax == np.abs(y - xn).max()
    np.testing.assert_allclose(ip, np.sum((y - xn) * (xn - x)), rtol=1e-12, atol=1e-12)

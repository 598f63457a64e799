"""The solvers against independent ones (issue 36): KELLER at one (node, time) against scikit-learn's L1
logistic regression with sample weights (saga), and TESLA's whole-path problem against a generic conic
solver (cvxpy with Clarabel, as the original MATLAB code used CVX). Objectives are compared (a conic
solver's solution is not exactly sparse); both peers are in the ``dev`` extra."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from pgmflow.tasks.tesla import solver


def _samples(seed, T, n, p):
    rng = np.random.default_rng(seed)
    X = np.where(rng.random((T * n, p)) < 0.5, -1, 1).astype(np.int8)
    X[:, 1] = np.where(rng.random(T * n) < 0.8, X[:, 0], -X[:, 0])  # a strong edge 0 - 1
    return X, np.repeat(np.arange(T), n)


def _keller_objective(design, node, t, theta_t, lam1):
    """sum_d w_{t,d} log(1 + exp(-2 y_d theta . z_d)) + lam1 |theta_{-node}|_1 at one time point."""
    a, b, o = int(design.lo[t]), int(design.hi[t]), int(design.woff[t])
    Z = design.X[a:b].astype(np.float64)
    y = Z[:, node].copy()
    Z[:, node] = 1.0
    w = design.w[o : o + b - a]
    loss = float(np.sum(w * np.logaddexp(0.0, -2.0 * y * (Z @ theta_t))))
    return loss + lam1 * float(np.abs(np.delete(theta_t, node)).sum())


@pytest.mark.parametrize(
    "seed,node,t,lam1,bandwidth",
    [(0, 0, 5, 0.05, 2.0), (1, 1, 0, 0.02, 3.0), (2, 3, 11, 0.1, 1.5), (3, 2, 7, 0.01, 2.5)],
)
def test_keller_matches_sklearn_saga(seed, node, t, lam1, bandwidth):
    """KELLER at (node, t) is sklearn's L1 logistic regression on the window's rows with the kernel weights
    as sample weights, C = 2 / lambda1, coefficients 2 theta, the intercept (2 x the field) unpenalised."""
    from sklearn.linear_model import LogisticRegression

    X, tix = _samples(seed, T=12, n=4, p=6)
    design = solver.keller_design(X, tix, 12, bandwidth)
    ours = solver.solve_path(design, node, lam1, 0.0, tol=1e-12, max_iter=200_000).theta[t]
    a, b, o = int(design.lo[t]), int(design.hi[t]), int(design.woff[t])
    F = np.delete(X[a:b].astype(np.float64), node, axis=1)
    y = X[a:b, node]
    m = LogisticRegression(l1_ratio=1.0, solver="saga", C=2.0 / lam1, tol=1e-14, max_iter=1_000_000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # saga's convergence warning at its own tolerance
        m.fit(F, y, sample_weight=design.w[o : o + b - a])
    theirs = np.insert(m.coef_[0] / 2.0, node, m.intercept_[0] / 2.0)
    f_ours = _keller_objective(design, node, t, ours, lam1)
    f_theirs = _keller_objective(design, node, t, theirs, lam1)
    assert abs(f_ours - f_theirs) <= 1e-8 * abs(f_theirs), (f_ours, f_theirs)
    assert np.count_nonzero(np.delete(ours, node)) > 0  # a problem with edges, not the trivial optimum


def _cvxpy_tesla(design, node, lam1, lam2):
    """The TESLA path problem (solver module docstring, q = 1) as a conic program, solved by Clarabel."""
    import cvxpy as cp

    T, p = design.T, design.p
    Z = design.X.astype(np.float64)
    y = Z[:, node].copy()
    Z[:, node] = 1.0
    theta = cp.Variable((T, p))
    rows = np.arange(design.X.shape[0])
    margins = cp.sum(cp.multiply(Z, theta[design.tix[rows], :]), axis=1)  # theta^{t_d} . z_d
    loss = cp.sum(cp.multiply(design.w, cp.logistic(-2.0 * cp.multiply(y, margins))))
    mask = np.ones(p)
    mask[node] = 0.0
    pen = lam1 * cp.sum(cp.abs(theta) @ mask) + lam2 * cp.sum(cp.abs(theta[1:, :] - theta[:-1, :]))
    prob = cp.Problem(cp.Minimize(loss + pen))
    prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11, max_iter=500)
    return np.asarray(theta.value)


@pytest.mark.parametrize(
    "seed,T,n,p,node,lam1,lam2,algorithm",
    [
        (0, 20, 2, 6, 0, 0.05, 0.2, "fista"),
        (1, 30, 1, 8, 1, 0.02, 0.5, "fista"),
        (1, 30, 1, 8, 1, 0.02, 0.5, "ssnal"),  # one sample per time point: SSNAL's problem (the Senate's shape)
        (3, 40, 1, 6, 2, 0.01, 0.15, "ssnal"),
        (2, 15, 3, 10, 4, 0.03, 0.1, "fista"),
    ],
)
def test_tesla_matches_cvxpy_clarabel(seed, T, n, p, node, lam1, lam2, algorithm):
    """TESLA's per-node problem (fused L1 + TV, the field unpenalised): the same objective as an
    independent conic solve, within 1e-6 relative, and ours is not above it by more; by FISTA and by SSNAL."""
    pytest.importorskip("cvxpy")
    X, tix = _samples(seed, T, n, p)
    design = solver.tesla_design(X, tix, T)
    res = solver.solve_path(design, node, lam1, lam2, tol=1e-10, max_iter=200_000, algorithm=algorithm)
    assert res.converged and (res.n_newton > 0) == (algorithm == "ssnal")
    theirs = _cvxpy_tesla(design, node, lam1, lam2)
    f_theirs = solver.objective(design, node, theirs, lam1, lam2)
    assert abs(res.objective - f_theirs) <= 1e-6 * abs(f_theirs), (res.objective, f_theirs)
    assert res.objective <= f_theirs + 1e-6 * abs(f_theirs)
    assert np.count_nonzero(np.delete(res.theta, node, axis=1)) > 0


def test_missing_values_leave_the_likelihood():
    """A node's missing values (0) drop those rows from its own likelihood: the same optimum as the data
    without those rows; as a neighbour's value, 0 contributes nothing to the margin."""
    X, tix = _samples(5, T=10, n=4, p=5)
    gone = np.array([1, 6, 7, 22, 30])
    Xm = X.copy()
    Xm[gone, 2] = 0
    keep = np.setdiff1d(np.arange(X.shape[0]), gone)
    full = solver.solve_path(solver.tesla_design(Xm, tix, 10), 2, 0.03, 0.2, tol=1e-10, max_iter=100_000)
    rows = solver.solve_path(solver.tesla_design(X[keep], tix[keep], 10), 2, 0.03, 0.2, tol=1e-10, max_iter=100_000)
    assert full.objective == pytest.approx(rows.objective, rel=1e-9)
    assert np.allclose(full.theta, rows.theta, atol=1e-6)
    ll = solver.row_loglik(Xm, tix, 2, full.theta)
    assert np.all(ll[gone] == 0.0) and np.all(ll[keep] < 0.0)

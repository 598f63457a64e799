"""The semismooth Newton augmented Lagrangian solver (``tasks/tesla/ssnal.py``, issue 36): the same optimum as
FISTA's full-update reference, certified by FISTA's own test, chosen by ``algorithm="auto"`` exactly where it
applies, continued by FISTA where it is not certified, and a pure function of its inputs."""

from __future__ import annotations

import numpy as np
import pytest

from pgmflow.tasks.tesla import solver, ssnal


def _one_per_time(seed, T, p, missing=0, empty=()):
    """One +-1 sample per time point with a strong, drifting edge 0 - 1; ``missing`` values of node 2 coded 0;
    the time points in ``empty`` without a sample."""
    rng = np.random.default_rng(seed)
    X = np.where(rng.random((T, p)) < 0.5, -1, 1).astype(np.int8)
    flip = np.where(np.arange(T) < T // 2, 0.85, 0.25)  # the edge's sign changes half-way
    X[:, 1] = np.where(rng.random(T) < flip, X[:, 0], -X[:, 0])
    if missing:
        X[rng.choice(T, missing, replace=False), 2] = 0
    keep = np.setdiff1d(np.arange(T), np.asarray(empty, np.int64))
    return X[keep], keep.astype(np.int64)


def _reference(design, node, lam1, lam2):
    """FISTA's full-update reference solver to a tight tolerance."""
    r = solver.solve_path(design, node, lam1, lam2, tol=1e-11, max_iter=400_000, screen=False, algorithm="fista")
    assert r.converged
    return r


@pytest.mark.parametrize(
    "seed,T,p,node,lam1,lam2,missing,empty",
    [
        (0, 40, 6, 0, 0.02, 0.3, 0, ()),
        (1, 60, 8, 1, 0.01, 0.1, 0, ()),
        (2, 50, 7, 2, 0.015, 0.5, 6, ()),  # the node's own missing votes: weight 0, no dual variable
        (3, 45, 6, 3, 0.02, 0.2, 4, (0, 7, 8, 44)),  # time points without a sample, one at each end
    ],
)
def test_ssnal_reaches_the_reference_optimum_certified(seed, T, p, node, lam1, lam2, missing, empty):
    X, tix = _one_per_time(seed, T, p, missing, empty)
    design = solver.tesla_design(X, tix, T)
    ref = _reference(design, node, lam1, lam2)
    res = solver.solve_path(design, node, lam1, lam2, tol=1e-8, algorithm="ssnal")
    assert res.converged and res.n_newton > 0
    assert res.n_iter == 0  # certified by SSNAL alone: FISTA did not continue
    assert abs(res.objective - ref.objective) <= 1e-9 * abs(ref.objective), (res.objective, ref.objective)
    assert np.count_nonzero(np.delete(res.theta, node, axis=1)) > 0  # edges, not the trivial optimum
    # its point passes FISTA's own stopping test (the certificate) at the requested tolerance
    d = solver.node_design(design, node)
    pen = np.ones(p, np.bool_)
    pen[node] = False
    gap = solver._certify(
        d.X, node, d.lo, d.hi, d.woff, d.w, lam1, lam2, 1, float(d.L.max()), pen, res.theta.copy(),
        np.ones(p, np.bool_), np.zeros(p, np.bool_),
    )  # fmt: skip
    assert gap <= 1e-9


def test_warm_started_path_matches_fista_path():
    """A lambda1 path warm-started downwards (as ``path_tasks.fit_node`` solves it): each point's objective within
    1e-9 relative of FISTA's at the default tolerance, and never certified worse than FISTA's test."""
    X, tix = _one_per_time(4, 80, 8)
    design = solver.tesla_design(X, tix, 80)
    thF = thS = None
    for lam1 in (0.08, 0.04, 0.02, 0.01):
        rF = solver.solve_path(design, 1, lam1, 0.25, theta0=thF, algorithm="fista")
        rS = solver.solve_path(design, 1, lam1, 0.25, theta0=thS, algorithm="auto")
        thF, thS = rF.theta, rS.theta
        assert rS.converged and rS.n_newton > 0 and rS.n_iter == 0
        assert abs(rS.objective - rF.objective) <= 1e-9 * abs(rF.objective)


def test_auto_chooses_ssnal_exactly_where_it_applies():
    X1, tix1 = _one_per_time(5, 30, 5)
    one = solver.tesla_design(X1, tix1, 30)
    rng = np.random.default_rng(5)
    X2 = np.where(rng.random((60, 5)) < 0.5, -1, 1).astype(np.int8)
    two = solver.tesla_design(X2, np.repeat(np.arange(30), 2), 30)  # two samples per time point
    assert solver.solve_path(one, 0, 0.02, 0.3).n_newton > 0
    for design, lam2, q in ((two, 0.3, 1), (one, 0.3, 2)):
        r = solver.solve_path(design, 0, 0.02, lam2, q)
        assert r.n_newton == 0 and r.n_iter > 0 and r.converged
    # lambda2 = 0 at one sample per time point: no finite optimum, the field capped, nothing solved
    assert solver.solve_path(one, 0, 0.02, 0.0).n_newton == 0
    kel = solver.keller_design(X1, tix1, 30, 2.0)
    assert not ssnal.applicable(kel, 1, 0.3)
    with pytest.raises(ValueError, match="one sample per time point"):
        solver.solve_path(two, 0, 0.02, 0.3, algorithm="ssnal")
    with pytest.raises(ValueError, match="algorithm must be one of"):
        solver.solve_path(one, 0, 0.02, 0.3, algorithm="newton")


def test_fista_continues_an_uncertified_ssnal_solve():
    """With one outer step SSNAL cannot certify: FISTA goes on from its point to the same optimum."""
    X, tix = _one_per_time(6, 50, 6)
    design = solver.tesla_design(X, tix, 50)
    ref = _reference(design, 0, 0.02, 0.2)
    res = solver.solve_path(design, 0, 0.02, 0.2, tol=1e-9, ssnal_opts=ssnal.Options(max_outer=1))
    assert res.n_newton > 0 and res.n_iter > 0 and res.converged
    assert abs(res.objective - ref.objective) <= 1e-9 * abs(ref.objective)


def test_ssnal_is_a_pure_function_of_its_inputs():
    X, tix = _one_per_time(7, 60, 7, missing=5)
    design = solver.tesla_design(X, tix, 60)
    a = solver.solve_path(design, 2, 0.01, 0.2)
    b = solver.solve_path(design, 2, 0.01, 0.2)
    assert a.n_newton > 0
    assert np.array_equal(a.theta, b.theta) and a.objective == b.objective and a.flops == b.flops


def test_a_node_design_is_prepared_once_and_serves_only_its_node():
    """``solver.node_design`` (the node's missing votes out of its weights) records the node: preparing again is
    the same object, the path solves from the prepared design give the same bits as from the shared one (what
    ``path_tasks.fit_node`` relies on, preparing once per path), and another node is refused."""
    X, tix = _one_per_time(2, 50, 7, missing=6)
    design = solver.tesla_design(X, tix, 50)
    d = solver.node_design(design, 2)
    assert d.node_of == 2 and solver.node_design(d, 2) is d
    assert not np.array_equal(d.w, design.w)  # the missing votes' weights are 0 in the prepared design
    for lam1 in (0.04, 0.015):
        a = solver.solve_path(design, 2, lam1, 0.5)
        b = solver.solve_path(d, 2, lam1, 0.5)
        assert np.array_equal(a.theta, b.theta) and a.objective == b.objective
    with pytest.raises(ValueError, match="prepared for node 2 cannot serve node 3"):
        solver.node_design(d, 3)
    assert solver.node_design(design, 0) is design  # a node without missing values: the shared design itself

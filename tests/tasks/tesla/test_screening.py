"""Active sets in pgmflow.tasks.tesla.solver: the screened solver reaches the full solver's optimum.

``solve_path(..., screen=True)`` runs FISTA on an active set of columns (the field, the warm start's
support, the KKT violators at the warm start) and adds the columns that violate the KKT conditions
until none does; ``screen=False`` updates every coefficient at every iteration. Both must give the same
objective (1e-9 relative) and the same non-zero pattern (the edges), up to borderline entries that
both solvers put within 1e-8 of zero.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

from pgmflow.tasks.tesla import data as D
from pgmflow.tasks.tesla import path_tasks as P
from pgmflow.tasks.tesla import solver as S
from pgmflow.tasks.tesla import synthetic

TOL = 1e-10
LAM1 = [0.2, 0.1, 0.05, 0.025]


@functools.cache
def _series(seed=3):
    # p = 16 candidates and 40 samples per time point: the static problems have a unique solution
    # (with fewer samples than candidates the L1 optimum need not be unique, and two solvers may
    # return different minimisers of the same objective)
    net = synthetic.time_varying_ising(seed, p=16, T=6, samples_per_time=40, rewire_every=3, ramp=2, field=0.1)
    return D.from_array(net.X)


def _design(kind):
    s = _series()
    if kind == "keller":
        return S.keller_design(s.X, s.tix, s.T, 1.5)
    return S.tesla_design(s.X, s.tix, s.T)


TINY = 1e-8  # |theta| below this is within the solvers' accuracy at tol 1e-10 (a borderline zero)


def _same_support(a, b):
    """The same zeros, except entries both solvers put within TINY of 0 (a coefficient whose KKT
    slack is 0 up to the tolerance can come out as 0 or as 1e-10)."""
    differ = (a != 0.0) != (b != 0.0)
    assert np.all(np.abs(a[differ]) < TINY) and np.all(np.abs(b[differ]) < TINY)
    assert differ.sum() <= max(1, differ.size // 1000)


def _same_optimum(full, scr):
    rel = abs(scr.objective - full.objective) / abs(full.objective)
    assert rel <= 1e-9, rel
    _same_support(full.theta, scr.theta)
    assert full.converged and scr.converged


@pytest.mark.parametrize(
    "kind,q,lam2", [("tesla", 1, 0.1), ("tesla", 1, 1.0), ("tesla", 2, 0.3), ("static", 1, 0.0), ("keller", 1, 0.0)]
)
@pytest.mark.parametrize("node", [0, 7])
def test_screened_path_equals_full_solver(kind, q, lam2, node):
    des = _design(kind)
    full = P.fit_node(des, node, LAM1, lam2, q=q, tol=TOL, screen=False)
    scr = P.fit_node(des, node, LAM1, lam2, q=q, tol=TOL, screen=True)
    for k, l1 in enumerate(LAM1):
        pen = S.penalty(full.thetas[k], node, l1, lam2, q)
        f_full = S.solve_path(des, node, l1, lam2, q, theta0=full.thetas[k], tol=TOL, screen=False, max_iter=1)
        f_scr = S.solve_path(des, node, l1, lam2, q, theta0=scr.thetas[k], tol=TOL, screen=False, max_iter=1)
        assert f_full.objective == pytest.approx(f_full.loss + pen)
        rel = abs(f_scr.objective - f_full.objective) / abs(f_full.objective)
        assert rel <= 1e-9, (l1, rel)
        _same_support(full.thetas[k], scr.thetas[k])
    assert scr.converged.all() and full.converged.all()


def test_flop_counts():
    """The full solver: 4 R p per iteration. Screened, on a sparse solution (large lambda1): the
    start and final KKT checks (4 R p each) plus 4 R k per iteration on k < p columns."""
    des = _design("tesla")
    R = int(np.count_nonzero(des.w))
    res = S.solve_path(des, 2, 0.05, 0.1, tol=1e-8, screen=False)
    assert res.n_solves == 1 and res.flops == 4 * R * des.p * res.n_iter
    full = S.solve_path(des, 2, 0.3, 1.0, tol=1e-8, screen=False)
    scr = S.solve_path(des, 2, 0.3, 1.0, tol=1e-8, screen=True)
    k = int(np.any(scr.theta != 0.0, axis=0).sum())
    assert k < des.p // 2 and scr.n_solves == 1
    assert 4 * R * k * scr.n_iter + 8 * R * des.p <= scr.flops < full.flops


@pytest.mark.parametrize("kind,lam2", [("tesla", 0.1), ("static", 0.0)])
def test_kkt_violators_force_re_solves(kind, lam2):
    """Started cold, the first active set is the columns violating the KKT conditions at zero; at
    lambda1 = 0.05 some columns only violate once the first ones are fitted, so the solver
    must re-solve, and still reaches the full solver's optimum."""
    des = _design(kind)
    n_solves = 0
    for node in range(des.p):
        full = S.solve_path(des, node, 0.05, lam2, tol=TOL, screen=False)
        scr = S.solve_path(des, node, 0.05, lam2, tol=TOL, screen=True)
        _same_optimum(full, scr)
        n_solves = max(n_solves, scr.n_solves - (des.T if lam2 == 0.0 else 1))
    assert n_solves >= 1  # some node needed at least one re-solve (beyond one solve per block)


def test_a_stale_warm_start_is_repaired_by_the_kkt_check():
    """Warm-started from the solution at a much larger lambda1, the predicted support (its support
    and the KKT violators there) misses columns that only violate once others are fitted: the KKT
    check adds them and the solver re-solves, to the full solver's optimum."""
    des = _design("tesla")
    n_solves = []
    for node in range(des.p):
        warm = S.solve_path(des, node, 0.4, 0.1, tol=TOL).theta  # nearly empty support
        full = S.solve_path(des, node, 0.02, 0.1, tol=TOL, screen=False)
        scr = S.solve_path(des, node, 0.02, 0.1, theta0=warm, tol=TOL, screen=True)
        _same_optimum(full, scr)
        n_solves.append(scr.n_solves)
    assert max(n_solves) >= 2


def test_max_iter_bounds_all_solves_together():
    des = _design("tesla")
    res = S.solve_path(des, 0, 0.02, 0.1, tol=1e-12, max_iter=7)
    assert res.n_iter <= 7 and not res.converged


def _known_design(T):
    """Per time point: node 0 equals x_1 in every sample, x_2 is balanced against both."""
    block = np.array([[1, 1, 1], [-1, -1, 1], [1, 1, -1], [-1, -1, -1]], np.int8)  # [n, p] (y, x1, x2)
    X = np.tile(block, (T, 1))
    return S.tesla_design(X, np.repeat(np.arange(T), 4), T)


@pytest.mark.parametrize("screen", [True, False])
@pytest.mark.parametrize("T,lam2", [(1, 0.0), (3, 0.3)])
def test_known_answer(screen, T, lam2):
    """Every sample has y x_1 = 1, so with the field 0 (by symmetry) the loss is log(1 + exp(-2 b));
    the optimum of log(1 + exp(-2 b)) + lambda1 |b| is b = log(2 / lambda1 - 1) / 2 for lambda1 < 1
    (2 sigmoid(-2 b) = lambda1), the same at every time point (no TV cost), and 0 for lambda1 >= 1.
    x_2 is orthogonal to the residual: its coefficient is exactly 0."""
    des = _known_design(T)
    res = S.solve_path(des, 0, 0.5, lam2, tol=1e-12, screen=screen)
    expect = np.zeros((T, 3))
    expect[:, 1] = 0.5 * math.log(3.0)
    np.testing.assert_allclose(res.theta, expect, rtol=0, atol=1e-10)
    assert np.all(res.theta[:, 2] == 0.0)
    assert res.objective == pytest.approx(T * (math.log1p(1.0 / 3.0) + 0.25 * math.log(3.0)), rel=1e-12)
    empty = S.solve_path(des, 0, 1.0, lam2, tol=1e-12, screen=screen)
    assert np.all(empty.theta == 0.0)


@functools.cache
def _wide_design():
    """p > n per time point, as in the benchmark (10 samples, 39 candidates): the regime where the
    global step 1/L is far too short near the solution."""
    net = synthetic.time_varying_ising(5, p=40, T=20, samples_per_time=10, n_edges=40)
    s = D.from_array(net.X)
    return S.tesla_design(s.X, s.tix, s.T)


@pytest.mark.parametrize("lam2", [0.1, 1.0])
def test_local_steps_cut_iterations_and_reach_the_same_optimum(lam2):
    """The fast solver's backtracked steps: at least 2x fewer FISTA iterations than the fixed step
    over a warm-started path (iteration counts are deterministic), the same objective (1e-9) and zeros,
    and every solution passes the full solver's stopping test (one more full step moves nothing by
    more than tol / L)."""
    des = _wide_design()
    lam1s = [0.2, 0.1, 0.05, 0.025]
    node = 3
    full = P.fit_node(des, node, lam1s, lam2, tol=1e-8, screen=False)
    fast = P.fit_node(des, node, lam1s, lam2, tol=1e-8, screen=True)
    assert fast.converged.all() and full.converged.all()
    assert 2 * fast.n_iter.sum() <= full.n_iter.sum(), (fast.n_iter, full.n_iter)
    for k, l1 in enumerate(lam1s):
        f_fast = S.objective(des, node, fast.thetas[k], l1, lam2)
        f_full = S.objective(des, node, full.thetas[k], l1, lam2)
        assert f_fast <= f_full * (1 + 1e-9)
        assert abs(f_fast - f_full) <= 1e-9 * abs(f_full)
        _same_support(full.thetas[k], fast.thetas[k])
        step = S.solve_path(des, node, l1, lam2, theta0=fast.thetas[k], tol=0.0, screen=False, max_iter=1)
        assert float(des.L.max()) * np.abs(step.theta - fast.thetas[k]).max() <= 1e-8 * 1.000001


def test_local_steps_stay_finite_when_the_optimum_is_at_infinity():
    """lambda1 = 0 on separable samples (node 0 equals x_1 everywhere): the loss falls towards 0 as
    the coefficient grows, so neither solver converges; the backtracked steps grow (their floor
    1e-9 L bounds them) but every iterate stays finite, and further along than the fixed step's."""
    des = _known_design(3)
    fast = S.solve_path(des, 0, 0.0, 0.1, tol=1e-12, max_iter=3000, screen=True)
    full = S.solve_path(des, 0, 0.0, 0.1, tol=1e-12, max_iter=3000, screen=False)
    assert not fast.converged and not full.converged
    assert np.isfinite(fast.theta).all() and np.isfinite(fast.objective)
    assert 0.0 < fast.objective < full.objective

"""pgmflow.tasks.tesla.synthetic: ground-truth graphs, smooth rewiring, reproducible samples."""

from __future__ import annotations

import time

import numpy as np
import pytest

from pgmflow.tasks.tesla import gibbs as G
from pgmflow.tasks.tesla import synthetic as S

KW = {"rewire_every": 10, "n_rewire": 2, "max_degree": 4, "ramp": 5}


def _windows(T, rewire_every, ramp):
    """bool [T]: time points inside a ramp window [t0, t0 + ramp - 1]."""
    w = np.zeros(T, dtype=bool)
    for t0 in S.rewire_points(T, rewire_every):
        w[t0 : t0 + ramp] = True
    return w


@pytest.mark.parametrize(
    "seed,p,T,kw",
    [
        (0, 20, 100, KW),
        (1, 30, 60, {"n_edges": 35, "rewire_every": 7, "n_rewire": 4, "max_degree": 3, "ramp": 7}),
        (2, 12, 40, {"n_edges": 10, "rewire_every": 5, "n_rewire": 3, "max_degree": 2, "ramp": 1}),
    ],
)
def test_ground_truth_structure(seed, p, T, kw):
    J, h = S.ground_truth(seed, p, T, **kw)
    n_edges = kw.get("n_edges", p)
    assert J.shape == (T, p, p) and J.dtype == np.float64 and h.shape == (T, p)
    assert np.array_equal(J, J.transpose(0, 2, 1))
    assert np.all(np.diagonal(J, axis1=1, axis2=2) == 0)
    E = S.edge_sets(J)
    assert E.dtype == bool and np.array_equal(E, J != 0)
    assert E.sum(axis=2).max() <= kw["max_degree"]
    n = E.sum(axis=(1, 2)) // 2
    win = _windows(T, kw["rewire_every"], kw["ramp"])
    assert np.all(n[~win] == n_edges)
    assert np.all(n[win] <= n_edges + kw["n_rewire"])
    # weights change only inside ramp windows
    changed = np.any(J[1:] != J[:-1], axis=(1, 2))
    assert np.all(win[1:][changed])
    # outside windows: |weights| within [low, high]
    full = np.abs(J[~win][E[~win]])
    assert full.min() >= 0.5 and full.max() <= 1.0
    # at each rewiring point exactly n_rewire edges appear and n_rewire disappear (after the ramp)
    for t0 in S.rewire_points(T, kw["rewire_every"]):
        before, after = E[t0 - 1], E[min(t0 + kw["ramp"] - 1, T - 1)]
        if t0 + kw["ramp"] - 1 < T:
            assert np.sum(before & ~after) // 2 == kw["n_rewire"]
            assert np.sum(after & ~before) // 2 == kw["n_rewire"]
    assert np.all(h == 0)


def test_ramps_are_linear_monotone_and_end_at_exactly_zero():
    T, ramp = 60, 5
    J, _ = S.ground_truth(3, 15, T, rewire_every=10, n_rewire=3, ramp=ramp)
    iu = np.triu_indices(15, 1)
    W = J[:, iu[0], iu[1]]  # [T, pairs]
    n_up = n_down = 0
    for t0 in S.rewire_points(T, 10):
        seg = W[t0 - 1 : t0 + ramp]  # from the last time before the ramp to its end
        for k in np.flatnonzero(np.any(seg != seg[0], axis=0)):
            a = np.abs(seg[:, k])
            d = np.diff(a)
            assert np.all(d >= 0) or np.all(d <= 0)  # monotone
            assert np.allclose(d, d[0])  # linear: equal steps
            if a[0] == 0:  # appearing: 0 -> w over `ramp` points
                n_up += 1
                assert a[-1] >= 0.5 and np.isclose(a[1], a[-1] / ramp)
            else:  # disappearing: w -> exactly 0
                n_down += 1
                assert a[-1] == 0.0 and a[-2] > 0
                assert np.all(W[t0 + ramp - 1 : t0 + 10, k] == 0)
    assert n_up == n_down == 3 * 5


def test_prefix_property_and_seed_dependence():
    a, _ = S.ground_truth(5, 20, 100)
    b, _ = S.ground_truth(5, 20, 47)
    assert np.array_equal(a[:47], b)
    c, _ = S.ground_truth(6, 20, 100)
    assert not np.array_equal(a, c)


def test_field_is_constant():
    _, h = S.ground_truth(0, 5, 7, n_edges=3, field=0.25)
    assert np.all(h == 0.25) and h.shape == (7, 5)
    vec = np.arange(5) / 10
    _, h = S.ground_truth(0, 5, 7, n_edges=3, field=vec)
    assert np.array_equal(h, np.tile(vec, (7, 1)))


def test_samples_reproduce_and_time_points_are_independent():
    kw = {"samples_per_time": 4, "burn_in": 30, "rewire_every": 5, "ramp": 3}
    a = S.time_varying_ising(11, 10, 12, **kw)
    b = S.time_varying_ising(11, 10, 12, **kw)
    for x, y in zip(a, b):
        assert np.array_equal(x, y)
    assert a.X.shape == (12, 4, 10) and a.X.dtype == np.int8
    assert set(np.unique(a.X)) <= {-1, 1}
    assert np.array_equal(a.edges, a.J != 0)
    for t in (7, 0, 11):  # any time point alone, in any order
        x = S.sample_time_point(11, t, a.h[t], a.J[t], 4, burn_in=30)
        assert np.array_equal(x, a.X[t])
    c = S.time_varying_ising(12, 10, 12, **kw)
    assert not np.array_equal(a.X, c.X)


def test_thinned_single_chain():
    a = S.time_varying_ising(1, 8, 5, 6, burn_in=20, thin=3)
    b = S.time_varying_ising(1, 8, 5, 6, burn_in=20, thin=3)
    assert a.X.shape == (5, 6, 8) and np.array_equal(a.X, b.X)
    assert not np.array_equal(a.X, S.time_varying_ising(1, 8, 5, 6, burn_in=20).X)


def test_strong_couplings_give_correlations_of_the_right_sign():
    # (a frustrated loop can flip the sign of a marginal correlation even in the exact model; this
    # seed has none at the strongly coupled pairs, the next test compares with exact moments)
    p, T, n = 12, 15, 3000
    net = S.time_varying_ising(
        21, p, T, n, rewire_every=5, n_rewire=2, ramp=2, weight_low=0.7, weight_high=1.0, burn_in=100
    )
    checked = 0
    for t in range(T):
        X = net.X[t].astype(np.float64)
        C = X.T @ X / n - np.outer(X.mean(0), X.mean(0))
        i, j = np.nonzero(np.triu(np.abs(net.J[t]) >= 0.7))
        assert np.all(np.sign(C[i, j]) == np.sign(net.J[t, i, j])), t
        assert np.all(np.abs(C[i, j]) > 0.2)
        checked += i.size
    assert checked >= T * (p - 2)


def test_samples_match_exact_moments_at_every_time_point():
    p, T, n = 10, 12, 4000
    net = S.time_varying_ising(5, p, T, n, rewire_every=4, n_rewire=2, ramp=3, burn_in=60, field=0.1)
    iu = np.triu_indices(p, 1)
    for t in range(T):
        ex = G.exact_moments(net.h[t], net.J[t])
        X = net.X[t].astype(np.float64)
        se1 = np.sqrt((1 - ex.mean**2) / n)
        assert np.all(np.abs(X.mean(0) - ex.mean) < 5 * se1), t
        se2 = np.sqrt(np.maximum(1 - ex.second[iu] ** 2, 1e-3) / n)
        assert np.all(np.abs((X.T @ X / n)[iu] - ex.second[iu]) < 5 * se2), t


def test_p100_t100_is_fast():
    S.time_varying_ising(0, 5, 2, 1, burn_in=1)  # compile / load the kernel
    t = time.perf_counter()
    net = S.time_varying_ising(0, p=100, T=100, samples_per_time=10)
    elapsed = time.perf_counter() - t
    assert net.X.shape == (100, 10, 100)
    assert elapsed < 10.0, elapsed


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"p": 1}, "p must be"),
        ({"n_edges": 100}, "n_edges"),
        ({"ramp": 11}, "ramp"),
        ({"ramp": 0}, "ramp"),
        ({"n_rewire": 30}, "n_rewire"),
        ({"weight_low": 1.5}, "weight_low"),
        ({"rewire_every": 0}, "rewire_every"),
    ],
)
def test_bad_parameters(kw, match):
    args = {"seed": 0, "p": 20, "T": 30}
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        S.ground_truth(**args)


def test_impossible_rewiring_is_reported():
    # a perfect matching with max_degree 1 leaves no room for new edges while the old ones ramp down
    with pytest.raises(ValueError, match="could not place"):
        S.ground_truth(0, 6, 20, n_edges=3, max_degree=1, n_rewire=1)


def test_abrupt_switch_frees_the_degree_at_once():
    J, _ = S.ground_truth(0, 6, 20, n_edges=3, max_degree=1, n_rewire=2, ramp=1)
    E = S.edge_sets(J)
    assert E.sum(axis=2).max() == 1 and np.all(E.sum(axis=(1, 2)) // 2 == 3)
    assert np.any(E[10] != E[9]) and np.array_equal(E[10], E[19])

"""pgmflow.tasks.tesla.evaluate: AND/OR edge sets, recovery scores, path degrees of freedom and the BIC."""

from __future__ import annotations

import numpy as np
import pytest

from pgmflow.tasks.tesla import evaluate as E


def _thetas_3_nodes():
    """thetas [p=3, T=2, p=3] with hand-picked neighbourhoods.

    t=0: 0 -> {1, 2}, 1 -> {0}, 2 -> {} : AND {0-1}, OR {0-1, 0-2}
    t=1: 0 -> {}, 1 -> {2}, 2 -> {1, 0}: AND {1-2}, OR {1-2, 0-2}
    The diagonal (fields) is non-zero everywhere and must never count as an edge.
    """
    th = np.zeros((3, 2, 3))
    th[:, :, :] = 0.0
    for i in range(3):
        th[i, :, i] = 0.5 + i  # fields
    th[0, 0, 1], th[0, 0, 2] = 0.3, -0.2
    th[1, 0, 0] = 1e-300  # tiny but non-zero: counts
    th[1, 1, 2] = -0.7
    th[2, 1, 1], th[2, 1, 0] = 0.1, 0.4
    return th


def _adj(T, p, edges_per_t):
    a = np.zeros((T, p, p), bool)
    for t, edges in enumerate(edges_per_t):
        for i, j in edges:
            a[t, i, j] = a[t, j, i] = True
    return a


def test_neighbourhoods_and_rules():
    th = _thetas_3_nodes()
    nb = E.neighbourhoods(th)
    assert nb.shape == (2, 3, 3) and nb.dtype == bool
    expect = np.zeros((2, 3, 3), bool)
    expect[0, 0, 1] = expect[0, 0, 2] = expect[0, 1, 0] = True
    expect[1, 1, 2] = expect[1, 2, 1] = expect[1, 2, 0] = True
    assert np.array_equal(nb, expect)
    a = E.edge_sets(th, "and")
    o = E.edge_sets(th, "or")
    assert np.array_equal(a, _adj(2, 3, [[(0, 1)], [(1, 2)]]))
    assert np.array_equal(o, _adj(2, 3, [[(0, 1), (0, 2)], [(1, 2), (0, 2)]]))
    assert np.array_equal(E.edge_sets(th), a)  # AND is the default
    for adj in (a, o):
        assert np.array_equal(adj, adj.transpose(0, 2, 1))
        assert not adj[:, np.arange(3), np.arange(3)].any()
    assert np.array_equal(E.edge_counts(a), [1, 1])
    assert np.array_equal(E.edge_counts(o), [2, 2])
    assert np.all(a <= o)


def test_edge_sets_errors():
    with pytest.raises(ValueError):
        E.edge_sets(_thetas_3_nodes(), "xor")
    with pytest.raises(ValueError):
        E.neighbourhoods(np.zeros((3, 2, 4)))


def test_edge_counts():
    adj = _adj(3, 5, [[], [(0, 1), (3, 4), (1, 4)], [(i, j) for i in range(5) for j in range(i + 1, 5)]])
    c = E.edge_counts(adj)
    assert c.dtype == np.int64 and np.array_equal(c, [0, 3, 10])
    loops = adj.copy()
    loops[:, np.arange(5), np.arange(5)] = True  # self-loops are not edges
    assert np.array_equal(E.edge_counts(loops), [0, 3, 10])


def test_recovery_known_answers():
    T, p = 4, 4
    truth = _adj(T, p, [[(0, 1), (2, 3)], [(0, 1), (2, 3)], [], [(0, 2)]])
    # t0 perfect, t1 half right (one hit, one false positive), t2 empty truth with one false positive,
    # t3 empty estimate
    est = _adj(T, p, [[(0, 1), (2, 3)], [(0, 1), (1, 3)], [(0, 3)], []])
    r = E.recovery(est, truth)
    assert np.array_equal(r.n_true, [2, 2, 0, 1])
    assert np.array_equal(r.n_est, [2, 2, 1, 0])
    assert np.array_equal(r.n_hit, [2, 1, 0, 0])
    np.testing.assert_allclose(r.precision, [1.0, 0.5, 0.0, 1.0])
    np.testing.assert_allclose(r.recall, [1.0, 0.5, 1.0, 0.0])
    np.testing.assert_allclose(r.f1, [1.0, 0.5, 0.0, 0.0])
    assert r.mean_f1 == pytest.approx(0.375)
    assert r.mean_precision == pytest.approx(0.625)
    assert r.mean_recall == pytest.approx(0.625)


def test_recovery_perfect_and_empty():
    rng = np.random.default_rng(0)
    T, p = 5, 6
    u = rng.random((T, p, p)) < 0.3
    truth = np.triu(u, 1)
    truth = truth | truth.transpose(0, 2, 1)
    assert truth.any()
    r = E.recovery(truth, truth)
    assert np.all(r.precision == 1) and np.all(r.recall == 1) and np.all(r.f1 == 1)
    empty = np.zeros_like(truth)
    r = E.recovery(empty, truth)
    has = E.edge_counts(truth) > 0
    assert np.all(r.precision == 1.0)  # no false positives
    assert np.all(r.recall[has] == 0.0) and np.all(r.f1[has] == 0.0)
    r = E.recovery(empty, empty)  # nothing to find and nothing found
    assert np.all(r.precision == 1) and np.all(r.recall == 1) and np.all(r.f1 == 1)
    # only the upper triangle counts: a one-sided (asymmetric) entry below the diagonal is ignored
    lower = np.zeros_like(truth)
    lower[:, 3, 1] = True
    assert np.all(E.recovery(lower, empty).n_est == 0)
    with pytest.raises(ValueError):
        E.recovery(truth[:, :5, :5], truth)


def test_recovery_f1_is_harmonic_mean():
    rng = np.random.default_rng(1)
    T, p = 20, 7

    def sym(a):
        a = np.triu(a, 1)
        return a | a.transpose(0, 2, 1)

    truth = sym(rng.random((T, p, p)) < 0.3)
    est = sym(rng.random((T, p, p)) < 0.3)
    r = E.recovery(est, truth)
    iu = np.triu_indices(p, 1)
    for t in range(T):
        e, g = est[t][iu], truth[t][iu]
        hit = (e & g).sum()
        P = hit / e.sum() if e.sum() else 1.0
        R = hit / g.sum() if g.sum() else 1.0
        F = 2 * P * R / (P + R) if P + R else 0.0
        assert (r.precision[t], r.recall[t], r.f1[t]) == pytest.approx((P, R, F))


def test_path_df_counts_runs():
    # node 1's path, T=6, p=4: column 1 is the field
    th = np.array(
        [
            [0.0, 0.5, 1.0, 0.0],
            [0.2, 0.5, 1.0, 0.0],
            [0.2, 0.0, 1.0, 0.0],
            [0.0, 0.0, 2.0, 0.0],
            [0.2, 0.5, 2.0, 0.0],
            [0.2, 0.5, 1.0, 0.0],
        ]
    )
    # col 0: runs of non-zero {0.2,0.2} and {0.2,0.2} -> 2 (a zero gap splits equal values)
    # col 1 (field): runs 0.5,0.5 | 0,0 | 0.5,0.5 -> 3 (a zero field run counts too)
    # col 2: 1,1,1 | 2,2 | 1 -> 3
    # col 3: never non-zero -> 0
    assert E.path_df(th, 1) == 8
    # the same path seen as node 3's: column 3 (all zero) is one field run; column 1 now has 2 runs
    assert E.path_df(th, 3) == 2 + 2 + 3 + 1
    # every value distinct (no fusion, as q=2 / KELLER / static produce) counts every non-zero entry
    rng = np.random.default_rng(2)
    dense = rng.normal(size=(5, 4))
    dense[1, 2] = dense[3, 0] = 0.0
    assert E.path_df(dense, 0) == 20 - 2 + 1  # the zero at [3, 0] is in the field column and still counts
    assert E.path_df(np.zeros((7, 3)), 2) == 1
    assert E.path_df(np.full((1, 3), 0.3), 0) == 3


def test_bic():
    assert E.bic(-10.0, 3, 100) == pytest.approx(20.0 + 3 * np.log(100))
    assert E.bic(-2.5, 0, 7) == pytest.approx(5.0)
    assert E.bic(0.0, 4, 1) == 0.0
    assert isinstance(E.bic(-1.0, 1, 10), float)
    # more parameters cost more; a better fit costs less
    assert E.bic(-10.0, 4, 50) > E.bic(-10.0, 3, 50)
    assert E.bic(-9.0, 3, 50) < E.bic(-10.0, 3, 50)

"""Loopy BP (pgmflow.tasks.bounds.bp, pgmflow.tasks.bounds.messages): exact on trees and forests, the lattice array
path reproduces the numba kernel, schedule arguments and non-convergence."""

from __future__ import annotations

import numpy as np
import pytest

from pgmflow.tasks.bounds import bp, messages
from pgmflow.tasks.bounds import mrf as M
from pgmflow.tasks.bounds.exact import exact_marginals


def random_tree(rng, n, forest=False):
    """Random labelled tree (random attachment, relabelled); ``forest`` drops a few edges."""
    parent = [int(rng.integers(0, i)) for i in range(1, n)]
    perm = rng.permutation(n)
    edges = np.array([[perm[i], perm[p]] for i, p in zip(range(1, n), parent)], dtype=np.int64).reshape(-1, 2)
    if forest and len(edges) > 2:
        edges = edges[rng.random(len(edges)) > 0.3]
    return edges


def with_params(rng, edges, n, jmax, hmax):
    return M.make_mrf(rng.uniform(-hmax, hmax, n), edges, rng.uniform(-jmax, jmax, len(edges)))


def tree_diameter(mrf):
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import shortest_path

    g = coo_matrix((np.ones(mrf.E), (mrf.edges[:, 0], mrf.edges[:, 1])), shape=(mrf.n, mrf.n))
    d = shortest_path(g, directed=False, unweighted=True)
    return int(np.max(d[np.isfinite(d)]))


def test_bp_exact_on_random_trees_chains_and_forests():
    rng = np.random.default_rng(20240601)
    models = []
    for _ in range(60):
        n = int(rng.integers(2, 16))
        models.append(with_params(rng, random_tree(rng, n), n, rng.uniform(0.1, 2.0), rng.uniform(0, 1.5)))
    for n in (2, 3, 5, 9, 15):  # chains
        models.append(with_params(rng, np.stack([np.arange(n - 1), np.arange(1, n)], 1), n, 1.5, 1.0))
    for _ in range(15):  # forests (several components, isolated nodes)
        n = int(rng.integers(4, 14))
        models.append(with_params(rng, random_tree(rng, n, forest=True), n, 1.5, 1.0))
    models.append(M.make_mrf(rng.uniform(-1, 1, 5), np.zeros((0, 2)), []))  # no edges
    for mrf in models:
        r = bp.loopy_bp(mrf)
        ex = exact_marginals(mrf)
        assert r.converged, (mrf.n, mrf.E, r.n_iter)
        assert abs(r.log_z_bethe - ex.log_z) < 1e-9, (r.log_z_bethe, ex.log_z)
        np.testing.assert_allclose(r.mean, ex.mean, rtol=0, atol=1e-9)
        np.testing.assert_allclose(r.pair_mean, ex.pair_mean, rtol=0, atol=1e-9)
        assert r.mean.shape == (mrf.n,) and r.pair_mean.shape == (mrf.E,)


def test_undamped_bp_on_a_tree_is_exact_after_diameter_sweeps():
    rng = np.random.default_rng(7)
    for _ in range(10):
        n = int(rng.integers(3, 15))
        mrf = with_params(rng, random_tree(rng, n), n, 1.5, 1.0)
        d = tree_diameter(mrf)
        r = bp.loopy_bp(mrf, damping=1.0)
        assert r.converged and r.n_iter <= d + 1, (r.n_iter, d)
        # after exactly `diameter` synchronous sweeps the messages are the exact ones
        r = bp.loopy_bp(mrf, damping=1.0, max_iter=d, tol=0.0, starts=(0.0,))
        assert abs(r.log_z_bethe - exact_marginals(mrf).log_z) < 1e-12


def test_bp_on_a_loopy_graph_is_not_exact_but_close_at_weak_coupling():
    mrf = M.ising_lattice(4, 4, beta=0.2, h=0.1, periodic=True)
    r = bp.loopy_bp(mrf)
    ex = exact_marginals(mrf)
    assert r.converged
    assert 1e-3 < abs(r.log_z_bethe - ex.log_z) < 0.1  # measured 0.045 (16 nodes, loops of length 4)
    np.testing.assert_allclose(r.mean, ex.mean, atol=0.01)  # measured 0.0026


def test_non_convergence_is_a_flag_not_an_error():
    mrf = M.ising_lattice(4, 4, beta=0.5, h=0.3, periodic=True)
    r = bp.loopy_bp(mrf, max_iter=3)
    assert r.n_iter == 3 and not r.converged and np.isfinite(r.log_z_bethe)
    r = bp.loopy_bp(mrf, max_iter=0, starts=(0.0,))
    assert r.n_iter == 0 and not r.converged
    np.testing.assert_array_equal(r.mean, np.tanh(mrf.h))


@pytest.mark.parametrize(
    "kw, word",
    [
        ({"damping": 0.0}, "damping"),
        ({"damping": 1.5}, "damping"),
        ({"max_iter": -1}, "max_iter"),
        ({"tol": -1.0}, "tol"),
    ],
)
def test_bad_schedule_is_refused(kw, word):
    with pytest.raises(M.MRFError, match=f"^{word}: .*; fix: "):
        bp.loopy_bp(M.ising_lattice(3, 3), **kw)


def _lattice_model(rng, L, W, periodic):
    base = M.ising_lattice(L, W, periodic=periodic)
    return M.PairwiseMRF(rng.uniform(-0.8, 0.8, base.n), base.edges, rng.uniform(-1.2, 1.2, base.E))


def csr_from_lattice(mrf, L, W, lm):
    """The lattice messages laid out like run_messages' CSR vector."""
    adj = M.adjacency(mrf)
    row = np.repeat(np.arange(mrf.n), np.diff(adj.indptr))
    r, c = np.divmod(row, W)
    rj, cj = np.divmod(adj.nbr, W)
    out = np.full(row.size, np.nan)
    for arr, sel in (
        (lm.u_right, (rj == r) & (cj == (c + 1) % W)),
        (lm.u_left, (rj == r) & (cj == (c - 1) % W)),
        (lm.u_down, (cj == c) & (rj == (r + 1) % L)),
        (lm.u_up, (cj == c) & (rj == (r - 1) % L)),
    ):
        out[sel] = np.asarray(arr)[r[sel], c[sel]]
    return out


@pytest.mark.parametrize(
    "L, W, periodic", [(3, 3, True), (4, 5, True), (6, 3, True), (4, 6, False), (1, 5, False), (3, 3, False)]
)
def test_lattice_array_path_reproduces_the_numba_kernel(L, W, periodic):
    rng = np.random.default_rng(L * 100 + W + periodic)
    mrf = _lattice_model(rng, L, W, periodic)
    h, Jr, Jd, _, _ = messages.lattice_arrays(mrf, L, W, periodic)
    ones = np.ones((L, W))
    for it in (1, 2, 17):
        a = messages.run_messages(mrf, np.ones(mrf.E), 0.5, it, 0.0)
        b = messages.lattice_messages_xp(h, Jr, Jd, ones, ones, periodic, 0.5, it, 0.0)
        assert a.n_iter == b.n_iter == it
        np.testing.assert_allclose(csr_from_lattice(mrf, L, W, b), a.u, rtol=0, atol=1e-12)
    r = bp.loopy_bp(mrf, starts=(0.0,))  # the array path starts from zero messages
    q = bp.loopy_bp_lattice(h, Jr, Jd, periodic=periodic)
    assert r.converged and q.converged and abs(r.n_iter - q.n_iter) <= 1
    assert abs(r.log_z_bethe - q.log_z) < 1e-10
    np.testing.assert_allclose(q.mean.reshape(-1), r.mean, atol=1e-11)
    idx_r, idx_d = messages.lattice_edge_index(L, W, periodic)
    np.testing.assert_allclose(q.pair_right[idx_r >= 0], r.pair_mean[idx_r[idx_r >= 0]], atol=1e-11)
    np.testing.assert_allclose(q.pair_down[idx_d >= 0], r.pair_mean[idx_d[idx_d >= 0]], atol=1e-11)


def test_lattice_path_refuses_double_bonds_and_bad_shapes():
    with pytest.raises(M.MRFError, match="^lattice: periodic 2 x 4"):
        bp.loopy_bp_lattice(np.zeros((2, 4)), np.zeros((2, 4)), np.zeros((2, 4)))
    with pytest.raises(M.MRFError, match="^Jr: has shape"):
        bp.loopy_bp_lattice(np.zeros((3, 4)), np.zeros((4, 3)), np.zeros((3, 4)))
    with pytest.raises(M.MRFError, match="^model: "):
        messages.lattice_arrays(M.ising_lattice(3, 4, periodic=False), 3, 4, True)
